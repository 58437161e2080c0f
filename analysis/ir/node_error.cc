#include "analysis/ir/node_error.h"

#include "absl/strings/str_cat.h"

namespace fxdp::ir {

std::string NodeLabel(absl::string_view name, absl::string_view op) {
  return absl::StrCat("node '", name, "' (", op, ")");
}

std::string NodeLabel(const Node& n) {
  std::string s = n.is_call() ? NodeLabel(n.name, n.target.ToString())
                              : NodeLabel(n.name, NodeKindName(n.kind));
  if (!n.source.empty()) absl::StrAppend(&s, " [", n.source, "]");
  return s;
}

absl::Status NodeError(const Node& n, absl::string_view what, absl::StatusCode code) {
  return absl::Status(code, absl::StrCat(NodeLabel(n), ": ", what));
}

absl::Status NodeError(absl::string_view name, absl::string_view op, absl::string_view what,
                       absl::StatusCode code) {
  return absl::Status(code, absl::StrCat(NodeLabel(name, op), ": ", what));
}

}  // namespace fxdp::ir
