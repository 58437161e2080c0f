// A replicated operand that a sharded use needs sharded: built sharded or sliced.
#include "analysis/batch_dim/analyzer.h"

#include <cstdint>
#include <utility>
#include <vector>
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "analysis/view_rules.h"
#include "util/status_macros.h"

namespace fxdp {

using ir::Argument;
using ir::Graph;
using ir::Node;
using ir::NodeId;
using ir::TensorType;
using ir::ValueRef;

// A replicated operand whose dim `dim` spans the batch of a sharded use.
// A factory-like value (zeros, ones_like, expand of a replicated value, and
// chains of those) is built sharded; anything else is sliced by the
// expansion (no communication).
void BatchDimAnalyzer::NeedShard(const Operand& o, int32_t dim, int64_t outer, NodeId user) {
  if (o.type->shape[dim] <= 1) return;  // broadcast (or empty: no rows to split).
  std::vector<std::pair<int32_t, Upgrade>> marks;
  if (TryUpgrade(o.ref, dim, outer, user, marks, 0)) {
    for (auto& [node, up] : marks) {
      if (upgrades_.emplace(node, up).second) MarkChanged(user);
    }
    return;
  }
  a_.sharded_reads_.push_back(ShardedRead{o.ref, dim, outer, user});
}

bool BatchDimAnalyzer::TryUpgrade(ValueRef r, int32_t dim, int64_t outer, NodeId user,
                                  std::vector<std::pair<int32_t, Upgrade>>& marks, int depth) {
  if (depth > 64 || r.output != 0) return false;
  const Node& n = g_.node(r.node);
  if (!n.is_call() || n.outputs.size() != 1) return false;
  if (!a_.values_[Offset(r)].placement.is_replicate()) return false;
  const TensorType* t = TypeOf(r);
  if (t == nullptr || dim >= t->rank()) return false;
  if (upgrades_.contains(r.node.value)) return true;
  if (IsViewOp(n.target)) return TryUpgradeView(r, n, dim, outer, user, marks, depth);
  return TryUpgradeByRule(r, n, dim, outer, user, marks, depth);
}

bool BatchDimAnalyzer::TryUpgradeView(ValueRef r, const Node& n, int32_t dim, int64_t outer,
                                      NodeId user, std::vector<std::pair<int32_t, Upgrade>>& marks,
                                      int depth) {
  const Upgrade up{dim, outer, user};
  const ValueRef* in = n.args.empty() ? nullptr : n.args[0].get_if<ValueRef>();
  const TensorType* it = in ? TypeOf(*in) : nullptr;
  if (it == nullptr) return false;
  auto map = ComputeViewDimMap(n.target, it->shape, n.args, n.kwargs);
  if (!map.ok() || dim >= static_cast<int32_t>(map->size())) return false;
  const DimSpec& spec = (*map)[dim];
  if (spec.is(DimSpec::Kind::kInputDim)) {
    // The dim comes from the input unchanged: build the input sharded.
    const int32_t in_dim = static_cast<int32_t>(spec.input_dim());
    if (it->shape[in_dim] != 1 && !TryUpgrade(*in, in_dim, outer, user, marks, depth + 1)) {
      return false;
    }
  } else if (!(spec.is(DimSpec::Kind::kBroadcast) || spec.is(DimSpec::Kind::kNewDim)) ||
             !FindViewOpFacts(n.target)->expands) {
    // Only an expand's sizes spell a new dim's size, which the expansion rewrites.
    return false;
  }
  marks.emplace_back(r.node.value, up);
  return true;
}

bool BatchDimAnalyzer::TryUpgradeByRule(ValueRef r, const Node& n, int32_t dim, int64_t outer,
                                        NodeId user,
                                        std::vector<std::pair<int32_t, Upgrade>>& marks,
                                        int depth) {
  const Upgrade up{dim, outer, user};
  const TensorType* t = TypeOf(r);
  const OpRule* rule = FindOpRule(n.target);
  if (rule == nullptr) return false;
  switch (rule->family) {
    case OpFamily::kFactory: {
      // zeros/ones/full/empty/rand*(size, ...): the expansion rewrites the
      // Sizes. arange(n) and friends are sliced instead (their values matter).
      const OpParam* sizes = rule->param(ParamRole::kSizes);
      if (sizes == nullptr || sizes->index >= static_cast<int>(n.args.size()) ||
          !n.args[sizes->index].is_list()) {
        return false;
      }
      marks.emplace_back(r.node.value, up);
      return true;
    }
    case OpFamily::kNewFactory: marks.emplace_back(r.node.value, up); return true;
    case OpFamily::kLike: {
      // ones_like(self) takes self's shape: self must be built sharded too.
      const ValueRef* self = n.args.empty() ? nullptr : n.args[0].get_if<ValueRef>();
      if (self == nullptr || !TryUpgrade(*self, dim, outer, user, marks, depth + 1)) return false;
      marks.emplace_back(r.node.value, up);
      return true;
    }
    case OpFamily::kAlongDim:
    case OpFamily::kLastDims: {
      // cumsum(ones([B, S]), 1), triu(...): rows stay rows unless the op works along them.
      const int64_t rank = t->rank();
      const bool along =
          rule->family == OpFamily::kAlongDim
              ? NormDim(IntArg(n, rule->param(ParamRole::kDim)).value_or(-1), rank) == dim
              : dim >= rank - rule->param(ParamRole::kLastDims)->value;
      const ValueRef* self = n.args.empty() ? nullptr : n.args[0].get_if<ValueRef>();
      if (along || self == nullptr || TypeOf(*self) == nullptr || TypeOf(*self)->rank() != rank ||
          !TryUpgrade(*self, dim, outer, user, marks, depth + 1)) {
        return false;
      }
      marks.emplace_back(r.node.value, up);
      return true;
    }
    case OpFamily::kEmbedding: {
      // embedding(weight, indices): output dims before the last are the indices'.
      const ValueRef* idx = n.args.size() < 2 ? nullptr : n.args[1].get_if<ValueRef>();
      if (idx == nullptr || TypeOf(*idx) == nullptr || dim >= TypeOf(*idx)->rank() ||
          !TryUpgrade(*idx, dim, outer, user, marks, depth + 1)) {
        return false;
      }
      marks.emplace_back(r.node.value, up);
      return true;
    }
    case OpFamily::kPointwise: {
      for (const Operand& o : Operands(n)) {
        const int32_t in_dim = dim - static_cast<int32_t>(t->rank() - o.type->rank());
        if (in_dim < 0 || o.type->shape[in_dim] == 1) continue;
        if (!TryUpgrade(o.ref, in_dim, outer, user, marks, depth + 1)) return false;
      }
      marks.emplace_back(r.node.value, up);
      return true;
    }
    default: return false;
  }
}

}  // namespace fxdp
