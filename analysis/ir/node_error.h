// How every error names a graph node: "node 'NAME' (OP): what", OP being
// the call target ("aten::add.Tensor") or, for other nodes, their kind
// ("placeholder", "get_attr", "output"). Decoding, verification, analysis,
// expansion and the interpreter all use these, so one grep finds a node.
#ifndef FXDP_ANALYSIS_IR_NODE_ERROR_H_
#define FXDP_ANALYSIS_IR_NODE_ERROR_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "analysis/ir/graph.h"

namespace fxdp::ir {

// "node 'add_3' (aten::add.Tensor)"
std::string NodeLabel(absl::string_view name, absl::string_view op);
// The same, then the user's line when the tracer recorded it (Node::source):
// "node 'mm' (aten::mm) [train.py:42 in layers.0.mlp: h = self.fc1(x)]".
std::string NodeLabel(const Node& n);

// A status whose message is "node 'NAME' (OP) [SOURCE]: what" (NodeLabel).
absl::Status NodeError(const Node& n, absl::string_view what,
                       absl::StatusCode code = absl::StatusCode::kInvalidArgument);
absl::Status NodeError(absl::string_view name, absl::string_view op, absl::string_view what,
                       absl::StatusCode code = absl::StatusCode::kInvalidArgument);

}  // namespace fxdp::ir

#endif  // FXDP_ANALYSIS_IR_NODE_ERROR_H_
