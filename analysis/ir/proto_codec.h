// GraphDef (wire format, proto/fxdp/v1/graph.proto) <-> Graph.
//
// Decoding rejects unknown fields, unknown enum values, missing required
// sub-messages and future format versions, then runs the verifier. For every
// graph it accepts, EncodeGraph(DecodeGraph(def)) serializes to the same
// bytes as `def` (the encoding is canonical: no maps, fields in order).
// DecodeGraphBytes reads the bytes directly (wire_decoder.h) and gives the
// same graph or the same error as parsing them into a GraphDef first.
// A graph with symbolic sizes (graph.proto GraphDef.symbols) is refused:
// instantiate.h turns it into a static graph at given input shapes.
#ifndef FXDP_ANALYSIS_IR_PROTO_CODEC_H_
#define FXDP_ANALYSIS_IR_PROTO_CODEC_H_

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "analysis/ir/graph.h"
#include "google/protobuf/arena.h"
#include "proto/fxdp/v1/graph.pb.h"

namespace fxdp::ir {

// Serialized graphs larger than this are refused before parsing.
inline constexpr int64_t kMaxGraphBytes = int64_t{1} << 30;

absl::StatusOr<Graph> DecodeGraph(const v1::GraphDef& def);
// Decodes serialized GraphDef bytes (bounded by kMaxGraphBytes) straight into
// the IR (wire_decoder.h), with no intermediate message; same result, same
// errors as DecodeGraphBytesViaMessage, which it asks to word any error.
absl::StatusOr<Graph> DecodeGraphBytes(absl::string_view bytes);
// The reference path: protobuf parses the bytes into a v1::GraphDef (in an
// arena, recursion limit wire::kRecursionLimit), then DecodeGraph. Slower and
// holds the message (~1 KB/node) next to the IR; the differential test's oracle.
absl::StatusOr<Graph> DecodeGraphBytesViaMessage(absl::string_view bytes);

// The protobuf parse DecodeGraphBytesViaMessage makes (bounded by
// kMaxGraphBytes, recursion limit wire::kRecursionLimit), into a message on
// `arena`: for readers of a GraphDef's symbolic sizes (instantiate.h).
absl::StatusOr<v1::GraphDef*> ParseGraphDefBytes(absl::string_view bytes,
                                                 google::protobuf::Arena* arena);

v1::GraphDef EncodeGraph(const Graph& g);
std::string EncodeGraphBytes(const Graph& g);

// Reads/writes a binary GraphDef file.
absl::StatusOr<Graph> ReadGraphFile(const std::string& path);
absl::Status WriteGraphFile(const Graph& g, const std::string& path);
absl::StatusOr<std::string> ReadFileBytes(const std::string& path);

}  // namespace fxdp::ir

#endif  // FXDP_ANALYSIS_IR_PROTO_CODEC_H_
