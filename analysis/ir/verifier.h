// The graph verifier. Graph::Create runs it on every graph, so a Graph that
// exists is well formed; passes may also run it on what they build.
//
// Each failure is INVALID_ARGUMENT with a message that names the node
// ("node 'addmm' (#7)") and says what was expected and what was found.
#ifndef FXDP_ANALYSIS_IR_VERIFIER_H_
#define FXDP_ANALYSIS_IR_VERIFIER_H_

#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "analysis/ir/graph.h"

namespace fxdp::ir {

// Limits on graph size, checked before anything is allocated per node.
inline constexpr int64_t kMaxNodes = int64_t{1} << 24;
inline constexpr int64_t kMaxArgsPerNode = int64_t{1} << 20;
inline constexpr int kMaxListDepth = 16;

// Checks, in order: header (format version), per node: name, kind-specific
// fields, targets, argument references (defined earlier, output in range,
// list nesting), output types; then graph-level roles: unique names and
// state names, exactly one OUTPUT node and it is last, output specs match
// the returned values, updated state matches its placeholder's type,
// gradient marks name parameters once and match their shape.
// `name_index`, when given, receives name -> node for every node (views into
// `nodes`' names), so Graph::Create hashes each name once.
absl::Status VerifyGraph(const GraphHeader& header, const std::vector<Node>& nodes,
                         absl::flat_hash_map<absl::string_view, NodeId>* name_index = nullptr);

}  // namespace fxdp::ir

#endif  // FXDP_ANALYSIS_IR_VERIFIER_H_
