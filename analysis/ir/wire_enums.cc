#include "analysis/ir/wire_enums.h"

#include <utility>

#include "proto/fxdp/v1/graph.pb.h"

namespace fxdp::ir {
namespace {

template <typename E, size_t N>
std::optional<E> FromWire(const std::pair<int, E> (&table)[N], int v) {
  for (const auto& [wire, e] : table) {
    if (wire == v) return e;
  }
  return std::nullopt;
}

template <typename E, size_t N>
int ToWire(const std::pair<int, E> (&table)[N], E e) {
  for (const auto& [wire, x] : table) {
    if (x == e) return wire;
  }
  return 0;
}

constexpr std::pair<int, NodeKind> kNodeKinds[] = {
    {v1::PLACEHOLDER, NodeKind::kPlaceholder},
    {v1::CALL_FUNCTION, NodeKind::kCallFunction},
    {v1::GET_ATTR, NodeKind::kGetAttr},
    {v1::OUTPUT, NodeKind::kOutput},
};

constexpr std::pair<int, PlaceholderRole> kPlaceholderRoles[] = {
    {v1::PARAMETER, PlaceholderRole::kParameter},
    {v1::BUFFER, PlaceholderRole::kBuffer},
    {v1::OPTIMIZER_STATE, PlaceholderRole::kOptimizerState},
    {v1::INPUT, PlaceholderRole::kInput},
    {v1::CONSTANT, PlaceholderRole::kConstant},
    {v1::HYPERPARAMETER, PlaceholderRole::kHyperparameter},
};

constexpr std::pair<int, OutputRole> kOutputRoles[] = {
    {v1::UPDATED_PARAMETER, OutputRole::kUpdatedParameter},
    {v1::UPDATED_BUFFER, OutputRole::kUpdatedBuffer},
    {v1::UPDATED_OPTIMIZER_STATE, OutputRole::kUpdatedOptimizerState},
    {v1::LOSS, OutputRole::kLoss},
    {v1::OTHER, OutputRole::kOther},
};

}  // namespace

std::optional<NodeKind> NodeKindFromWire(int v) { return FromWire(kNodeKinds, v); }
int NodeKindToWire(NodeKind k) { return ToWire(kNodeKinds, k); }
std::optional<PlaceholderRole> PlaceholderRoleFromWire(int v) {
  return FromWire(kPlaceholderRoles, v);
}
int PlaceholderRoleToWire(PlaceholderRole r) { return ToWire(kPlaceholderRoles, r); }
std::optional<OutputRole> OutputRoleFromWire(int v) { return FromWire(kOutputRoles, v); }
int OutputRoleToWire(OutputRole r) { return ToWire(kOutputRoles, r); }

}  // namespace fxdp::ir
