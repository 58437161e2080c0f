// graph.proto's NodeKind, PlaceholderRole and OutputRole against the IR's
// enums (graph.h): one table each, read by both decoders (proto_codec.cc,
// wire_decoder.cc) and the encoder. A wire value that is unknown or unset (0)
// has no IR value: nullopt.
#ifndef FXDP_ANALYSIS_IR_WIRE_ENUMS_H_
#define FXDP_ANALYSIS_IR_WIRE_ENUMS_H_

#include <optional>

#include "analysis/ir/graph.h"

namespace fxdp::ir {

std::optional<NodeKind> NodeKindFromWire(int v);
int NodeKindToWire(NodeKind k);
std::optional<PlaceholderRole> PlaceholderRoleFromWire(int v);
int PlaceholderRoleToWire(PlaceholderRole r);
std::optional<OutputRole> OutputRoleFromWire(int v);
int OutputRoleToWire(OutputRole r);

}  // namespace fxdp::ir

#endif  // FXDP_ANALYSIS_IR_WIRE_ENUMS_H_
