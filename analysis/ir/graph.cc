#include "analysis/ir/graph.h"

#include <array>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "analysis/ir/verifier.h"
#include "util/status_macros.h"

namespace fxdp::ir {
namespace {

constexpr std::array<absl::string_view, 4> kNodeKindNames = {"placeholder", "call_function",
                                                             "get_attr", "output"};
constexpr std::array<absl::string_view, 6> kPlaceholderRoleNames = {
    "PARAMETER", "BUFFER", "OPTIMIZER_STATE", "INPUT", "CONSTANT", "HYPERPARAMETER"};
constexpr std::array<absl::string_view, 5> kOutputRoleNames = {
    "UPDATED_PARAMETER", "UPDATED_BUFFER", "UPDATED_OPTIMIZER_STATE", "LOSS", "OTHER"};

template <typename E, size_t N>
absl::StatusOr<E> EnumFromName(const std::array<absl::string_view, N>& names, absl::string_view s,
                               absl::string_view what) {
  for (size_t i = 0; i < N; ++i)
    if (names[i] == s) return static_cast<E>(i);
  return absl::InvalidArgumentError(absl::StrCat("unknown ", what, " '", s, "'"));
}

}  // namespace

absl::string_view NodeKindName(NodeKind k) { return kNodeKindNames[static_cast<int>(k)]; }
absl::string_view PlaceholderRoleName(PlaceholderRole r) {
  return kPlaceholderRoleNames[static_cast<int>(r)];
}
absl::StatusOr<PlaceholderRole> PlaceholderRoleFromName(absl::string_view s) {
  return EnumFromName<PlaceholderRole>(kPlaceholderRoleNames, s, "placeholder role");
}
absl::string_view OutputRoleName(OutputRole r) { return kOutputRoleNames[static_cast<int>(r)]; }
absl::StatusOr<OutputRole> OutputRoleFromName(absl::string_view s) {
  return EnumFromName<OutputRole>(kOutputRoleNames, s, "output role");
}
std::optional<PlaceholderRole> UpdatedRole(OutputRole r) {
  switch (r) {
    case OutputRole::kUpdatedParameter: return PlaceholderRole::kParameter;
    case OutputRole::kUpdatedBuffer: return PlaceholderRole::kBuffer;
    case OutputRole::kUpdatedOptimizerState: return PlaceholderRole::kOptimizerState;
    default: return std::nullopt;
  }
}

namespace {
bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }
}  // namespace

bool Scalar::operator==(const Scalar& o) const {
  if (value.index() != o.value.index()) return false;
  if (auto* d = std::get_if<double>(&value)) return SameBits(*d, std::get<double>(o.value));
  if (auto* c = std::get_if<std::complex<double>>(&value)) {
    const auto& oc = std::get<std::complex<double>>(o.value);
    return SameBits(c->real(), oc.real()) && SameBits(c->imag(), oc.imag());
  }
  return value == o.value;
}

bool Argument::operator==(const Argument& o) const {
  if (value_.index() != o.value_.index()) return false;
  if (auto* d = get_if<double>()) return SameBits(*d, o.as<double>());
  return value_ == o.value_;
}

std::string Target::ToString() const {
  return overload.empty() ? name : absl::StrCat(name, ".", overload);
}

const Argument* Node::kwarg(absl::string_view key) const {
  for (const KeywordArgument& k : kwargs)
    if (k.name == key) return &k.value;
  return nullptr;
}

bool Node::operator==(const Node& o) const {
  return name == o.name && kind == o.kind && target == o.target && args == o.args &&
         kwargs == o.kwargs && outputs == o.outputs && placeholder == o.placeholder &&
         output_specs == o.output_specs && grad_of == o.grad_of && source == o.source;
}

absl::StatusOr<Graph> Graph::Create(GraphHeader header, std::vector<Node> nodes) {
  Graph g;
  g.header_ = std::move(header);
  g.nodes_ = std::move(nodes);
  FXDP_RETURN_IF_ERROR(VerifyGraph(g.header_, g.nodes_, &g.by_name_));
  return g;
}

void Graph::Index() {
  by_name_.clear();
  by_name_.reserve(nodes_.size());
  for (int32_t i = 0; i < size(); ++i) by_name_.emplace(nodes_[i].name, NodeId{i});
}

std::optional<NodeId> Graph::FindNode(absl::string_view name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

std::optional<NodeId> Graph::FindState(absl::string_view state_name) const {
  for (int32_t i = 0; i < size(); ++i)
    if (nodes_[i].is_placeholder() && nodes_[i].placeholder.state_name == state_name)
      return NodeId{i};
  return std::nullopt;
}

UseMap ComputeUses(const Graph& g) {
  UseMap uses(g.size());
  for (int32_t i = 0; i < g.size(); ++i) uses[i].resize(g.nodes()[i].outputs.size());
  for (int32_t i = 0; i < g.size(); ++i) {
    const Node& n = g.nodes()[i];
    int32_t pos = 0;
    auto visit = [&](const Argument& a) {
      a.ForEachRef(
          [&](const ValueRef& r) { uses[r.node.value][r.output].push_back({NodeId{i}, pos}); });
      ++pos;
    };
    for (const Argument& a : n.args) visit(a);
    for (const KeywordArgument& k : n.kwargs) visit(k.value);
  }
  return uses;
}

}  // namespace fxdp::ir
