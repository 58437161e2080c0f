#include "analysis/batch_dim.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "analysis/dim_spec.h"
#include "analysis/ir/hyperparameters.h"
#include "analysis/ir/status_macros.h"
#include "analysis/op_rules.h"
#include "analysis/op_schemas.h"
#include "analysis/view_rules.h"

namespace fxdp {

using ir::Argument;
using ir::Graph;
using ir::Node;
using ir::NodeId;
using ir::TensorType;
using ir::ValueRef;

bool Placement::operator==(const Placement& o) const {
  if (kind != o.kind) return false;
  if (kind == Kind::kShard) return dim == o.dim;
  if (kind == Kind::kPartial) return reduce == o.reduce;
  return true;
}

std::string Placement::ToString() const {
  switch (kind) {
    case Kind::kReplicate: return "R";
    case Kind::kShard: return absl::StrCat("S(", dim, ")");
    case Kind::kPartial: return reduce == ReduceOp::kAvg ? "P(avg)" : "P(sum)";
  }
  return "?";
}

namespace {

const ValueInfo kReplicated{};

ValueInfo Shard(int32_t dim, int64_t outer, bool scaled) {
  ValueInfo v;
  v.placement = Placement::Shard(dim);
  v.outer = outer;
  v.mean_scaled = scaled;
  return v;
}

ValueInfo Partial(bool avg) {
  ValueInfo v;
  v.placement = Placement::Partial(avg ? ReduceOp::kAvg : ReduceOp::kSum);
  v.mean_scaled = avg;
  return v;
}

bool IsSpecial(const ValueInfo& v) {
  return v.placement.is_partial() || (v.placement.is_shard() && v.mean_scaled);
}

// An operand of the node being analysed: a tensor argument.
struct Operand {
  int arg;         // positional index; 64 + k for keyword argument k.
  int elem;        // index in a list argument, else -1.
  ValueRef ref;
  const TensorType* type;
  ValueInfo info;  // as this use reads it.
};

// Where the batch sits in one output dim of a view (see Locate).
struct BatchLoc {
  enum Kind : int8_t { kNone, kWhole, kBroken } kind = kNone;
  int64_t outer = 1;
  int64_t inner = 1;
};

std::string TargetString(const Node& n) { return n.target.ToString(); }

}  // namespace

class BatchDimAnalyzer {
 public:
  BatchDimAnalyzer(const Graph& g, const AnalyzeOptions& options) : g_(g), options_(options) {}

  absl::StatusOr<BatchDimAnalysis> Run() {
    if (options_.world_size < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("world size must be >= 1, got ", options_.world_size));
    }
    a_.world_size_ = options_.world_size;
    a_.sync_batchnorm_ = options_.sync_batchnorm;
    a_.value_offset_.resize(g_.size() + 1);
    int32_t off = 0;
    for (int32_t i = 0; i < g_.size(); ++i) {
      a_.value_offset_[i] = off;
      off += static_cast<int32_t>(g_.nodes()[i].outputs.size());
    }
    a_.value_offset_[g_.size()] = off;
    a_.reduced_.assign(off, 0);
    SeedReductions();
    FXDP_RETURN_IF_ERROR(FindBatchSize());
    // Each pass may discover values that must be all-reduced or factories
    // that must be built sharded; both sets only grow, so this converges.
    constexpr int kMaxPasses = 32;
    for (int pass = 0;; ++pass) {
      changed_ = false;
      FXDP_RETURN_IF_ERROR(Pass());
      if (!changed_) break;
      if (pass + 1 == kMaxPasses) {
        return absl::InternalError("batch-dim analysis did not converge");
      }
    }
    Finish();
    return std::move(a_);
  }

 private:
  // ---- setup -------------------------------------------------------------

  int32_t Offset(ValueRef r) const { return a_.value_offset_[r.node.value] + r.output; }

  void SeedReductions() {
    // Gradients and non-loss outputs are all-reduced when they come out partial.
    for (int32_t i = 0; i < g_.size(); ++i) {
      const Node& n = g_.nodes()[i];
      if (!n.grad_of.empty() && !n.outputs.empty()) a_.reduced_[Offset({NodeId{i}, 0})] = 1;
    }
  }

  absl::Status FindBatchSize() {
    const Node* first = nullptr;
    for (const Node& n : g_.nodes()) {
      if (!n.is_placeholder() || n.placeholder.role != ir::PlaceholderRole::kInput) continue;
      const int32_t bd = n.placeholder.batch_dim;
      if (bd < 0) continue;
      if (n.outputs.empty() || !n.outputs[0].is_tensor()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "input ", n.name, " has batch_dim ", bd, " but is not a tensor"));
      }
      const TensorType& t = n.outputs[0].tensor;
      if (bd >= t.rank()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "input %s: batch_dim %d is out of range for a tensor of rank %d (shape %s)",
            n.name, bd, t.rank(), t.ToString()));
      }
      const int64_t b = t.shape[bd];
      if (b < 1) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "input %s: batch dim %d has size %d; a batch needs at least one sample", n.name,
            bd, b));
      }
      if (first == nullptr) {
        first = &n;
        a_.batch_size_ = b;
      } else if (b != a_.batch_size_) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "inputs disagree on the batch size: %s has %d along its batch dim %d, %s has %d along "
            "its batch dim %d",
            first->name, a_.batch_size_, first->placeholder.batch_dim, n.name, b, bd));
      }
    }
    return FindMicroBatches();
  }

  // The split size when `n` splits its arg 0 along `dim` into equal pieces
  // (split.Tensor(x, s, dim), split_with_sizes(x, [s, s, ...], dim)), else 0.
  static int64_t EqualSplitSize(const Node& n, int64_t dim, int64_t rank) {
    if (n.kind != ir::NodeKind::kCallFunction || n.args.size() < 2) return 0;
    const Argument* d = ArgAt(n, 2, "dim");
    const int64_t got = d == nullptr ? 0 : d->get_if<int64_t>() ? *d->get_if<int64_t>() : -1;
    if (NormDim(got, rank) != dim) return 0;
    if (n.target.name == "aten::split" && n.target.overload == "Tensor") {
      const int64_t* s = n.args[1].get_if<int64_t>();
      return s == nullptr ? 0 : *s;
    }
    if (n.target.name == "aten::split_with_sizes" && n.args[1].is_list()) {
      int64_t size = 0;
      for (const Argument& a : n.args[1].as<Argument::List>()) {
        const int64_t* s = a.get_if<int64_t>();
        if (s == nullptr || (size != 0 && *s != size)) return 0;
        size = *s;
      }
      return size;
    }
    return 0;
  }

  // Gradient accumulation (x.chunk(k) in a loop over micro-batches): when
  // every use of every batched input splits it along its batch dim into equal
  // micro-batches of one size s < B, each micro-batch is the batch the rest of
  // the graph sees. The analysis then runs with B = s: an input (B = k * s
  // rows) is S(d) whose local extent is k * s_r, each split piece is S(d) with
  // s_r rows, and rank r splits its own k * s_r rows into k micro-batches, as
  // DDP with no_sync() does (the expansion requires k | B_r).
  absl::Status FindMicroBatches() {
    if (a_.batch_size_ <= 1) return absl::OkStatus();
    const ir::UseMap uses = ir::ComputeUses(g_);
    int64_t size = 0;
    for (int32_t i = 0; i < g_.size(); ++i) {
      const Node& n = g_.nodes()[i];
      if (!n.is_placeholder() || n.placeholder.role != ir::PlaceholderRole::kInput ||
          n.placeholder.batch_dim < 0 || uses[i].empty())
        continue;
      for (const ir::Use& u : uses[i][0]) {
        const Node& user = g_.node(u.user);
        const int64_t s = u.arg_index == 0 ? EqualSplitSize(user, n.placeholder.batch_dim,
                                                            n.outputs[0].tensor.rank())
                                           : 0;
        if (s <= 0 || s >= a_.batch_size_ || a_.batch_size_ % s != 0 || (size != 0 && s != size))
          return absl::OkStatus();
        size = s;
      }
    }
    if (size == 0) return absl::OkStatus();
    a_.micro_batches_ = a_.batch_size_ / size;
    a_.batch_size_ = size;
    return absl::OkStatus();
  }

  // ---- one pass ----------------------------------------------------------

  absl::Status Pass() {
    a_.values_.assign(a_.value_offset_.back(), ValueInfo{});
    a_.nodes_.assign(g_.size(), NodeInfo{});
    a_.sharded_reads_.clear();
    a_.notes_.clear();
    fallback_ops_.clear();
    fallback_order_.clear();
    for (int32_t i = 0; i < g_.size(); ++i) {
      const NodeId id{i};
      const Node& n = g_.nodes()[i];
      FXDP_RETURN_IF_ERROR(Visit(id, n));
    }
    return absl::OkStatus();
  }

  absl::Status Visit(NodeId id, const Node& n) {
    switch (n.kind) {
      case ir::NodeKind::kPlaceholder: return VisitPlaceholder(id, n);
      case ir::NodeKind::kOutput: return VisitOutput(id, n);
      case ir::NodeKind::kGetAttr:
        a_.nodes_[id.value].decision = Decision::kState;
        return absl::OkStatus();
      case ir::NodeKind::kCallFunction: break;
    }
    NodeInfo& info = a_.nodes_[id.value];
    if (auto it = upgrades_.find(id.value); it != upgrades_.end()) {
      info.decision = Decision::kShapedByUse;
      info.rule = static_cast<int16_t>(OpRuleIndex(FindOpRule(n.target)));
      info.shaped_by = it->second.user;
      SetOut(id, 0, Shard(it->second.dim, it->second.outer, false));
      return absl::OkStatus();
    }
    if (n.is_getitem()) {
      const ValueRef src = n.args[0].as<ValueRef>();
      info.decision = Decision::kGetItem;
      SetOut(id, 0, Read(src));
      return absl::OkStatus();
    }
    if (IsViewOp(n.target)) {
      FXDP_RETURN_IF_ERROR(VisitView(id, n));
    } else if (const OpRule* rule = FindOpRule(n.target); rule == nullptr) {
      FXDP_RETURN_IF_ERROR(VisitFallback(id, n));
    } else {
      info.decision = Decision::kRule;
      info.rule = static_cast<int16_t>(OpRuleIndex(rule));
      FXDP_RETURN_IF_ERROR(VisitRule(id, n, *rule));
    }
    PropagateRankLocal(id, n);
    return absl::OkStatus();
  }

  // A replicated result computed from a rank-local operand is rank-local.
  void PropagateRankLocal(NodeId id, const Node& n) {
    bool local = false;
    n.ForEachInput([&](ValueRef r) {
      if (g_.type(r).is_tensor() && Read(r).rank_local) local = true;
    });
    if (!local) return;
    const int32_t base = a_.value_offset_[id.value];
    for (int32_t k = 0; k < a_.num_outputs(id); ++k) {
      ValueInfo& v = a_.values_[base + k];
      if (n.outputs[k].is_tensor() && v.placement.is_replicate()) v.rank_local = true;
    }
  }

  absl::Status VisitPlaceholder(NodeId id, const Node& n) {
    NodeInfo& info = a_.nodes_[id.value];
    if (n.placeholder.role != ir::PlaceholderRole::kInput) {
      info.decision = Decision::kState;
      return absl::OkStatus();
    }
    info.decision = Decision::kInput;
    if (n.placeholder.batch_dim >= 0) SetOut(id, 0, Shard(n.placeholder.batch_dim, 1, false));
    return absl::OkStatus();
  }

  absl::Status VisitOutput(NodeId id, const Node& n) {
    a_.nodes_[id.value].decision = Decision::kOutput;
    // args[0] lists the outputs, aligned with output_specs.
    if (n.args.empty() || !n.args[0].is_list()) return absl::OkStatus();
    const auto& list = n.args[0].as<Argument::List>();
    for (size_t k = 0; k < list.size(); ++k) {
      const ValueRef* r = list[k].get_if<ValueRef>();
      if (r == nullptr) continue;
      const bool loss = k < n.output_specs.size() &&
                        n.output_specs[k].role == ir::OutputRole::kLoss;
      if (loss) continue;
      RequireWhole(*r, id);
      const ir::OutputRole role =
          k < n.output_specs.size() ? n.output_specs[k].role : ir::OutputRole::kOther;
      if (ir::UpdatedRole(role).has_value() && a_.values_[Offset(*r)].placement.is_shard()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "output %d (%s '%s') is %s: the updated state depends on batch rows (%s), so "
            "ranks would hold different parts of it; data parallelism needs it replicated",
            k, ir::OutputRoleName(role), n.output_specs[k].state_name,
            a_.values_[Offset(*r)].placement.ToString(), g_.node(r->node).name));
      }
    }
    return absl::OkStatus();
  }

  // ---- reading values ----------------------------------------------------

  void SetOut(NodeId id, int k, const ValueInfo& v) {
    if (k >= static_cast<int>(g_.node(id).outputs.size())) return;
    if (!g_.node(id).outputs[k].is_tensor()) return;
    a_.values_[a_.value_offset_[id.value] + k] = v;
  }

  void SetAllOut(NodeId id, const ValueInfo& v) {
    const int n = static_cast<int>(g_.node(id).outputs.size());
    for (int k = 0; k < n; ++k) SetOut(id, k, v);
  }

  // The value as a use reads it: replicated once all-reduced.
  ValueInfo Read(ValueRef r) const {
    const ValueInfo& v = a_.values_[Offset(r)];
    if (v.placement.is_partial() && a_.reduced_[Offset(r)]) return kReplicated;
    return v;
  }

  // A use needs the whole value: a partial value is all-reduced first.
  void RequireWhole(ValueRef r, NodeId user) {
    const int32_t off = Offset(r);
    if (!a_.values_[off].placement.is_partial() || a_.reduced_[off]) return;
    a_.reduced_[off] = 1;
    changed_ = true;
  }

  const TensorType* TypeOf(ValueRef r) const {
    const ir::ValueType& t = g_.type(r);
    return t.is_tensor() ? &t.tensor : nullptr;
  }

  void AddOperand(std::vector<Operand>& ops, int arg, int elem, const Argument& a) const {
    const ValueRef* r = a.get_if<ValueRef>();
    if (r == nullptr) return;
    const TensorType* t = TypeOf(*r);
    if (t == nullptr) return;
    ops.push_back(Operand{arg, elem, *r, t, Read(*r)});
  }

  // Tensor operands of `n`, lists flattened, keyword arguments numbered 64+.
  std::vector<Operand> Operands(const Node& n) const {
    std::vector<Operand> ops;
    ops.reserve(4);
    for (size_t i = 0; i < n.args.size(); ++i) {
      const Argument& a = n.args[i];
      if (const auto* l = a.get_if<Argument::List>()) {
        for (size_t e = 0; e < l->size(); ++e) AddOperand(ops, int(i), int(e), (*l)[e]);
      } else {
        AddOperand(ops, int(i), -1, a);
      }
    }
    for (size_t k = 0; k < n.kwargs.size(); ++k) AddOperand(ops, 64 + int(k), -1, n.kwargs[k].value);
    return ops;
  }

  // ---- linearity: partial and mean-scaled operands -------------------------

  struct Special {
    bool partial = false;
    bool scaled = false;  // partial: avg; shard: mean-scaled.
  };

  // A fresh zero tensor (zeros, new_zeros, zeros_like): adding a partial
  // value to it keeps the sum partial.
  bool IsZeros(ValueRef r) const {
    const Node& n = g_.node(r.node);
    return n.is_call() && (n.target.name == "aten::zeros" || n.target.name == "aten::new_zeros" ||
                           n.target.name == "aten::zeros_like");
  }

  static bool InMask(const OpRule& rule, int arg) {
    return arg < 8 && ((rule.linear_args >> arg) & 1);
  }

  absl::Status ScaledError(NodeId id, const Node& n, const Operand& o, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "node %s (%s): arg %d (%s) is a batch value scaled by a mean over the local batch "
        "(it descends from a mean-reduced loss); %s. Reduce the loss by sum, or keep this op "
        "out of the backward path",
        n.name, TargetString(n), o.arg, g_.node(o.ref.node).name, why));
  }

  // Applies the op's linearity to its operands. Partial operands that may not
  // flow through are all-reduced (and read replicated from then on); a
  // mean-scaled operand the op is not linear in is an error.
  absl::StatusOr<Special> Linear(NodeId id, const Node& n, const OpRule& rule,
                                 std::vector<Operand>& ops, int exempt_arg = -1) {
    Special s;
    int specials = 0;
    for (Operand& o : ops) {
      if (!IsSpecial(o.info) || o.arg == exempt_arg) continue;
      if (!InMask(rule, o.arg) || rule.linearity == Linearity::kNone) {
        if (o.info.placement.is_partial()) {
          RequireWhole(o.ref, id);
          o.info = kReplicated;
          continue;
        }
        return ScaledError(id, n, o, "the op is not linear in it");
      }
      ++specials;
    }
    if (specials == 0) return s;
    // Partial operands next to anything they cannot be combined with are reduced.
    bool any_partial = false, any_scaled_shard = false, other_linear = false;
    bool other_shard = false;
    bool avg = false, sum = false;
    for (const Operand& o : ops) {
      if (o.arg == exempt_arg) continue;
      if (o.info.placement.is_partial()) {
        any_partial = true;
        (o.info.mean_scaled ? avg : sum) = true;
      } else if (IsSpecial(o.info)) {
        any_scaled_shard = true;
      } else {
        if (InMask(rule, o.arg) && !IsZeros(o.ref)) other_linear = true;
        if (o.info.placement.is_shard()) other_shard = true;
      }
    }
    bool reduce_partials = false;
    if (any_partial) {
      if (any_scaled_shard || (avg && sum)) reduce_partials = true;
      if (rule.linearity == Linearity::kAdditive && other_linear) reduce_partials = true;
      if (rule.linearity == Linearity::kMultilinear) {
        int n_partial = 0;
        for (const Operand& o : ops) n_partial += o.info.placement.is_partial() && o.arg != exempt_arg;
        if (n_partial > 1 || other_shard) reduce_partials = true;
      }
    }
    if (reduce_partials) {
      for (Operand& o : ops) {
        if (o.info.placement.is_partial() && o.arg != exempt_arg) {
          RequireWhole(o.ref, id);
          o.info = kReplicated;
        }
      }
      any_partial = false;
    }
    if (any_scaled_shard) {
      int n_scaled = 0;
      for (const Operand& o : ops) {
        if (o.arg == exempt_arg || !IsSpecial(o.info)) continue;
        ++n_scaled;
        if (rule.linearity == Linearity::kMultilinear && n_scaled > 1) {
          return ScaledError(id, n, o, "it is multiplied by another mean-scaled value");
        }
      }
      if (rule.linearity == Linearity::kAdditive) {
        for (const Operand& o : ops) {
          if (o.arg != exempt_arg && InMask(rule, o.arg) && !IsSpecial(o.info) &&
              o.type->numel() > 0 && !IsZeros(o.ref)) {
            return ScaledError(id, n, o, "it is added to a value that is not mean-scaled");
          }
        }
      }
      s.scaled = true;
    }
    if (any_partial) {
      s.partial = true;
      s.scaled = avg;
    }
    return s;
  }

  // ---- sharding a replicated operand for a sharded use -----------------------

  struct Upgrade {
    int32_t dim;
    int64_t outer;
    NodeId user;
  };

  // A replicated operand whose dim `dim` spans the batch of a sharded use.
  // A factory-like value (zeros, ones_like, expand of a replicated value, and
  // chains of those) is built sharded; anything else is sliced by the
  // expansion (no communication).
  void NeedShard(const Operand& o, int32_t dim, int64_t outer, NodeId user) {
    if (o.type->shape[dim] <= 1) return;  // broadcast (or empty: no rows to split).
    std::vector<std::pair<int32_t, Upgrade>> marks;
    if (TryUpgrade(o.ref, dim, outer, user, marks, 0)) {
      for (auto& [node, up] : marks) {
        if (upgrades_.emplace(node, up).second) changed_ = true;
      }
      return;
    }
    a_.sharded_reads_.push_back(ShardedRead{o.ref, dim, outer, user});
  }

  bool TryUpgrade(ValueRef r, int32_t dim, int64_t outer, NodeId user,
                  std::vector<std::pair<int32_t, Upgrade>>& marks, int depth) {
    if (depth > 64 || r.output != 0) return false;
    const Node& n = g_.node(r.node);
    if (!n.is_call() || n.outputs.size() != 1) return false;
    if (!a_.values_[Offset(r)].placement.is_replicate()) return false;
    const TensorType* t = TypeOf(r);
    if (t == nullptr || dim >= t->rank()) return false;
    const Upgrade up{dim, outer, user};
    if (upgrades_.contains(r.node.value)) return true;
    if (IsViewOp(n.target)) {
      const ValueRef* in = n.args.empty() ? nullptr : n.args[0].get_if<ValueRef>();
      const TensorType* it = in ? TypeOf(*in) : nullptr;
      if (it == nullptr) return false;
      auto map = ComputeViewDimMap(n.target, it->shape, n.args, n.kwargs);
      if (!map.ok() || dim >= static_cast<int32_t>(map->size())) return false;
      const DimSpec& spec = (*map)[dim];
      if (spec.is(DimSpec::Kind::kInputDim)) {
        // The dim comes from the input unchanged: build the input sharded.
        const int32_t in_dim = static_cast<int32_t>(spec.input_dim());
        if (it->shape[in_dim] != 1 &&
            !TryUpgrade(*in, in_dim, outer, user, marks, depth + 1)) {
          return false;
        }
      } else if (!(spec.is(DimSpec::Kind::kBroadcast) || spec.is(DimSpec::Kind::kNewDim)) ||
                 (n.target.name != "aten::expand" && n.target.name != "aten::broadcast_to")) {
        // Only expand spells a new dim's size, which the expansion rewrites.
        return false;
      }
      marks.emplace_back(r.node.value, up);
      return true;
    }
    const OpRule* rule = FindOpRule(n.target);
    if (rule == nullptr) return false;
    switch (rule->family) {
      case OpFamily::kFactory:
        // zeros/ones/full/empty/rand*(size, ...): the expansion rewrites the
        // size. arange(n) and friends are sliced instead (their values matter).
        if (n.args.empty() || !n.args[0].is_list()) return false;
        marks.emplace_back(r.node.value, up);
        return true;
      case OpFamily::kNewFactory:
        marks.emplace_back(r.node.value, up);
        return true;
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
        const bool along = rule->family == OpFamily::kAlongDim
                               ? NormDim(IntArg(n, rule->a, "dim").value_or(-1), rank) == dim
                               : dim >= rank - rule->a;
        const ValueRef* self = n.args.empty() ? nullptr : n.args[0].get_if<ValueRef>();
        if (along || self == nullptr || TypeOf(*self) == nullptr ||
            TypeOf(*self)->rank() != rank ||
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
      default:
        return false;
    }
  }

  // ---- view ops ------------------------------------------------------------

  // Where the batch (input dim `d`, outer/inner factors) ends up in the dim
  // `spec` describes. `size` receives the spec's size.
  BatchLoc Locate(const DimSpec& spec, const std::vector<int64_t>& in_shape, int64_t d,
                  int64_t outer, int64_t inner, int64_t* size) const {
    const int64_t b = a_.batch_size_;
    switch (spec.kind()) {
      case DimSpec::Kind::kSingleton: *size = 1; return {};
      case DimSpec::Kind::kNewDim: *size = spec.size(); return {};
      case DimSpec::Kind::kInputDim:
        *size = in_shape[spec.input_dim()];
        if (spec.input_dim() == d) return {BatchLoc::kWhole, outer, inner};
        return {};
      case DimSpec::Kind::kBroadcast: {
        int64_t s = 0;
        BatchLoc l = Locate(spec.inputs()[0], in_shape, d, outer, inner, &s);
        *size = spec.size();
        if (l.kind == BatchLoc::kNone) return l;
        return b == 1 ? BatchLoc{} : BatchLoc{BatchLoc::kBroken};
      }
      case DimSpec::Kind::kRepeat: {
        int64_t s = 0;
        BatchLoc l = Locate(spec.inputs()[0], in_shape, d, outer, inner, &s);
        *size = s * spec.size();
        if (l.kind == BatchLoc::kNone) return l;
        return BatchLoc{BatchLoc::kBroken};
      }
      case DimSpec::Kind::kFlatten: {
        std::vector<int64_t> sizes;
        int found = -1;
        BatchLoc member;
        for (const DimSpec& m : spec.inputs()) {
          int64_t s = 0;
          BatchLoc l = Locate(m, in_shape, d, outer, inner, &s);
          if (l.kind == BatchLoc::kBroken) return l;
          if (l.kind == BatchLoc::kWhole) {
            found = static_cast<int>(sizes.size());
            member = l;
          }
          sizes.push_back(s);
        }
        int64_t total = 1;
        for (int64_t s : sizes) total *= s;
        *size = total;
        if (found < 0) return {};
        for (int i = 0; i < found; ++i) member.outer *= sizes[i];
        for (size_t i = found + 1; i < sizes.size(); ++i) member.inner *= sizes[i];
        return member;
      }
      case DimSpec::Kind::kSplit: {
        int64_t s = 0;
        BatchLoc l = Locate(spec.inputs()[0], in_shape, d, outer, inner, &s);
        const auto& group = spec.group_shape();
        const int64_t id = spec.split_id();
        *size = group[id];
        if (l.kind != BatchLoc::kWhole) return l;
        int64_t lo = 1;
        for (int64_t i = 0; i < id; ++i) lo *= group[i];
        const int64_t hi = lo * group[id];
        // The batch occupies radix span (outer, outer*B]; this piece (lo, hi].
        const int64_t blo = l.outer, bhi = l.outer * b;
        if (bhi <= lo || hi <= blo) return {};
        if (blo % lo == 0 && hi % bhi == 0) return {BatchLoc::kWhole, blo / lo, hi / bhi};
        return BatchLoc{BatchLoc::kBroken};
      }
    }
    return {};
  }

  absl::Status VisitView(NodeId id, const Node& n) {
    NodeInfo& info = a_.nodes_[id.value];
    info.decision = Decision::kView;
    const ValueRef* in = n.args.empty() ? nullptr : n.args[0].get_if<ValueRef>();
    const TensorType* it = in ? TypeOf(*in) : nullptr;
    if (it == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("node %s (%s): arg 0 must be a tensor", n.name, TargetString(n)));
    }
    const ValueInfo src = Read(*in);
    if (!src.placement.is_shard()) {
      // Views are linear: replicated stays replicated, partial stays partial.
      SetAllOut(id, src);
      info.detail = src.placement.is_partial() ? Detail::kPartialLinear : Detail::kNoBatch;
      return absl::OkStatus();
    }
    auto map = ComputeViewDimMap(n.target, it->shape, n.args, n.kwargs);
    if (!map.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("node ", n.name, ": ", map.status().message()));
    }
    const int64_t d = src.placement.dim;
    const int64_t n_in = it->shape[d];
    const int64_t inner = n_in / (src.outer * a_.batch_size_);
    int found = -1;
    BatchLoc loc;
    for (size_t k = 0; k < map->size(); ++k) {
      int64_t size = 0;
      BatchLoc l = Locate((*map)[k], it->shape, d, src.outer, inner, &size);
      if (l.kind == BatchLoc::kBroken) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "node %s (%s): the view %s splits or repeats the batch (size %d, in input dim %d "
            "of %s) across output dim %d; the batch cannot stay split over ranks",
            n.name, TargetString(n), DimMapToString(*map), a_.batch_size_, d, it->ToString(),
            k));
      }
      if (l.kind == BatchLoc::kWhole && found < 0) {
        found = static_cast<int>(k);
        loc = l;
      }
    }
    if (found < 0) {
      if (a_.batch_size_ == 1) {
        SetAllOut(id, kReplicated);
        return absl::OkStatus();
      }
      return absl::InvalidArgumentError(absl::StrFormat(
          "node %s (%s): the view %s drops the batch dim %d of %s", n.name, TargetString(n),
          DimMapToString(*map), d, it->ToString()));
    }
    info.detail = Detail::kFromArg;
    info.arg = 0;
    SetAllOut(id, Shard(found, loc.outer, src.mean_scaled));
    return absl::OkStatus();
  }

  // ---- rules -----------------------------------------------------------------

  static int64_t NormDim(int64_t d, int64_t rank) {
    const int64_t r = std::max<int64_t>(rank, 1);
    return d < 0 ? d + r : d;
  }

  // Positional arg `i`, or keyword `name`, or nullptr.
  static const Argument* ArgAt(const Node& n, int i, absl::string_view name) {
    if (i >= 0 && i < static_cast<int>(n.args.size())) return &n.args[i];
    if (!name.empty()) return n.kwarg(name);
    return nullptr;
  }

  static std::optional<int64_t> IntArg(const Node& n, int i, absl::string_view name) {
    const Argument* a = ArgAt(n, i, name);
    if (a == nullptr) return std::nullopt;
    if (const auto* v = a->get_if<int64_t>()) return *v;
    if (const auto* s = a->get_if<ir::Scalar>()) {
      if (const auto* v = std::get_if<int64_t>(&s->value)) return *v;
    }
    return std::nullopt;
  }

  static std::optional<bool> BoolArg(const Node& n, int i, absl::string_view name) {
    const Argument* a = ArgAt(n, i, name);
    if (a == nullptr) return std::nullopt;
    if (const auto* v = a->get_if<bool>()) return *v;
    return std::nullopt;
  }

  // Dims listed by an int or int-list argument; nullopt when absent or None.
  static std::optional<std::vector<int64_t>> DimsArg(const Node& n, int i,
                                                     absl::string_view name) {
    const Argument* a = ArgAt(n, i, name);
    if (a == nullptr || a->is_none()) return std::nullopt;
    std::vector<int64_t> dims;
    if (const auto* v = a->get_if<int64_t>()) {
      dims.push_back(*v);
    } else if (const auto* l = a->get_if<Argument::List>()) {
      for (const Argument& e : *l) {
        if (const auto* v = e.get_if<int64_t>()) dims.push_back(*v);
      }
    }
    return dims;
  }

  absl::Status Error(const Node& n, const std::string& what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("node ", n.name, " (", TargetString(n), "): ", what));
  }

  const TensorType* OutType(const Node& n, int k = 0) const {
    if (k >= static_cast<int>(n.outputs.size()) || !n.outputs[k].is_tensor()) return nullptr;
    return &n.outputs[k].tensor;
  }

  struct Combined {
    int32_t dim = -1;      // output dim holding the batch, or -1.
    int64_t outer = 1;
    int arg = -1;          // operand that decided.
  };

  // Broadcasting combination: every sharded operand must put the batch on the
  // same output dim; replicated operands spanning that dim are sharded too.
  absl::StatusOr<Combined> Broadcast(NodeId id, const Node& n, const std::vector<Operand>& ops,
                                     int64_t out_rank, bool broadcast = true) {
    Combined c;
    for (const Operand& o : ops) {
      if (!o.info.placement.is_shard()) continue;
      const int32_t d = o.info.placement.dim +
                        (broadcast ? static_cast<int32_t>(out_rank - o.type->rank()) : 0);
      if (c.dim < 0) {
        c = {d, o.info.outer, o.arg};
      } else if (c.dim != d || c.outer != o.info.outer) {
        return Error(n, absl::StrFormat(
            "operands put the batch on different dims: arg %d (%s) on output dim %d, "
            "arg %d (%s) on output dim %d",
            c.arg, OperandName(ops, c.arg), c.dim, o.arg, g_.node(o.ref.node).name, d));
      }
    }
    if (c.dim >= 0) {
      for (const Operand& o : ops) {
        if (!o.info.placement.is_replicate()) continue;
        const int32_t d = c.dim - (broadcast ? static_cast<int32_t>(out_rank - o.type->rank()) : 0);
        if (d >= 0 && d < o.type->rank()) NeedShard(o, d, c.outer, id);
      }
    }
    return c;
  }

  std::string OperandName(const std::vector<Operand>& ops, int arg) const {
    for (const Operand& o : ops) {
      if (o.arg == arg) return g_.node(o.ref.node).name;
    }
    return "?";
  }

  // Sets every tensor output from a combination.
  void SetCombined(NodeId id, const Combined& c, const Special& s) {
    NodeInfo& info = a_.nodes_[id.value];
    if (c.dim >= 0) {
      info.detail = Detail::kFromArg;
      info.arg = static_cast<int8_t>(std::min(c.arg, 127));
      SetAllOut(id, Shard(c.dim, c.outer, s.scaled));
    } else if (s.partial) {
      info.detail = Detail::kPartialLinear;
      SetAllOut(id, Partial(s.scaled));
    } else {
      info.detail = Detail::kNoBatch;
      SetAllOut(id, kReplicated);
    }
  }

  absl::Status Pointwise(NodeId id, const Node& n, const OpRule& rule, int64_t out_rank,
                         bool broadcast = true) {
    std::vector<Operand> ops = Operands(n);
    OpRule r = rule;
    // masked_fill(x, mask, 0) and constant_pad_nd(x, pad, 0) are linear in x.
    const bool pad = n.target.name == "aten::constant_pad_nd";
    if ((n.target.name == "aten::masked_fill" && n.target.overload == "Scalar") || pad) {
      const Argument* v = ArgAt(n, 2, "value");
      bool zero = pad && v == nullptr;
      if (v != nullptr) {
        if (const auto* s = v->get_if<ir::Scalar>()) {
          if (const auto* i = std::get_if<int64_t>(&s->value)) zero = *i == 0;
          if (const auto* f = std::get_if<double>(&s->value)) zero = *f == 0.0;
        } else if (const auto* i = v->get_if<int64_t>()) {
          zero = *i == 0;
        } else if (const auto* f = v->get_if<double>()) {
          zero = *f == 0.0;
        }
      }
      if (zero) {
        r.linearity = Linearity::kMultilinear;
        r.linear_args = 1;
      }
    }
    FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, r, ops));
    FXDP_ASSIGN_OR_RETURN(Combined c, Broadcast(id, n, ops, out_rank, broadcast));
    if (c.dim >= 0 && s.partial) {
      return Error(n, "combines a partial value with a batch-sharded one");
    }
    SetCombined(id, c, s);
    return absl::OkStatus();
  }

  absl::Status VisitRule(NodeId id, const Node& n, const OpRule& rule) {
    const TensorType* out = OutType(n);
    const int64_t out_rank = out ? out->rank() : 0;
    NodeInfo& info = a_.nodes_[id.value];
    switch (rule.family) {
      case OpFamily::kPointwise:
        return Pointwise(id, n, rule, out_rank);

      case OpFamily::kLike: {
        std::vector<Operand> ops = Operands(n);
        const Operand* self = ops.empty() ? nullptr : &ops[0];
        if (self != nullptr && self->info.placement.is_shard()) {
          info.detail = Detail::kFromArg;
          info.arg = 0;
          SetAllOut(id, Shard(self->info.placement.dim, self->info.outer, false));
        } else {
          info.detail = Detail::kNoBatch;
        }
        return absl::OkStatus();
      }

      case OpFamily::kNewFactory:
      case OpFamily::kFactory:
      case OpFamily::kNoTensor:
        info.detail = Detail::kNoBatch;
        return absl::OkStatus();

      case OpFamily::kMatmul: return Matmul(id, n, rule);
      case OpFamily::kReduce: return Reduce(id, n, rule);

      case OpFamily::kAlongDim:
      case OpFamily::kLastDims:
      case OpFamily::kDimsList:
      case OpFamily::kPad: {
        FXDP_RETURN_IF_ERROR(Pointwise(id, n, rule, out_rank, /*broadcast=*/false));
        const ValueInfo& v = a_.values_[a_.value_offset_[id.value]];
        if (!v.placement.is_shard()) return absl::OkStatus();
        const int64_t d = v.placement.dim;
        if (rule.family == OpFamily::kAlongDim) {
          const int64_t dim = NormDim(IntArg(n, rule.a, "dim").value_or(-1), out_rank);
          if (dim == d) {
            return Error(n, absl::StrFormat("works along dim %d, which holds the batch; it "
                                            "needs the whole batch on every rank", dim));
          }
        } else if (rule.family == OpFamily::kLastDims || rule.family == OpFamily::kPad) {
          int64_t last = rule.a;
          if (rule.family == OpFamily::kPad) {
            auto pad = DimsArg(n, 1, "pad");
            last = pad ? static_cast<int64_t>(pad->size() / 2) : 0;
          }
          if (d >= out_rank - last) {
            return Error(n, absl::StrFormat("works on the last %d dims, which include the batch "
                                            "dim %d", last, d));
          }
        } else {
          auto dims = DimsArg(n, rule.a, "dims").value_or(std::vector<int64_t>{});
          for (int64_t x : dims) {
            if (NormDim(x, out_rank) == d) {
              return Error(n, absl::StrFormat("works on dim %d, which holds the batch", d));
            }
          }
        }
        return absl::OkStatus();
      }

      case OpFamily::kLayerNorm: return LayerNorm(id, n, rule);
      case OpFamily::kLayerNormBackward:
      case OpFamily::kBatchNormBackward:
      case OpFamily::kConvBackward:
        return NormOrConvBackward(id, n, rule);
      case OpFamily::kBatchNorm: return BatchNorm(id, n, rule);
      case OpFamily::kSpatial: return Spatial(id, n, rule);
      case OpFamily::kEmbedding: return Embedding(id, n, rule);
      case OpFamily::kEmbeddingBackward: return EmbeddingBackward(id, n, rule);
      case OpFamily::kLoss:
      case OpFamily::kNllLoss:
        return Loss(id, n, rule);
      case OpFamily::kLossBackward:
      case OpFamily::kNllLossBackward:
        return LossBackward(id, n, rule);
      case OpFamily::kCat:
      case OpFamily::kStack:
        return CatStack(id, n, rule);
      case OpFamily::kSplit:
      case OpFamily::kSlice:
      case OpFamily::kSelect:
      case OpFamily::kIndexWithDim:
      case OpFamily::kSliceBackward:
        return DimOp(id, n, rule);
      case OpFamily::kIndex: return Index(id, n, rule);
      case OpFamily::kScatterInto: return ScatterInto(id, n, rule);
      case OpFamily::kAsStrided:
      case OpFamily::kAsStridedScatter:
        return AsStrided(id, n, rule);
      case OpFamily::kIndexPut: return IndexPut(id, n, rule);
      case OpFamily::kForeach: return Foreach(id, n, rule);
    }
    return absl::OkStatus();
  }

  // -- matmul --------------------------------------------------------------

  absl::Status Matmul(NodeId id, const Node& n, const OpRule& rule) {
    std::vector<Operand> ops = Operands(n);
    const TensorType* out = OutType(n);
    if (out == nullptr) return Error(n, "expected a tensor output");
    // Labels: letters for named dims, 1000+i for broadcast dims.
    std::vector<std::vector<int>> labels;  // per operand, by operand position.
    std::vector<int> out_labels;
    std::vector<int> operand_args;
    bool bias = false;
    auto letters = [](absl::string_view s) {
      std::vector<int> v;
      for (char ch : s) v.push_back(ch);
      return v;
    };
    auto ell = [](int64_t k, int64_t total) {
      std::vector<int> v;
      for (int64_t i = total - k; i < total; ++i) v.push_back(1000 + static_cast<int>(i));
      return v;
    };
    auto cat = [](std::vector<int> a, const std::vector<int>& b) {
      a.insert(a.end(), b.begin(), b.end());
      return a;
    };
    auto rank_of = [&](int arg) -> int64_t {
      for (const Operand& o : ops) {
        if (o.arg == arg) return o.type->rank();
      }
      return -1;
    };
    if (rule.spec == "linear") {
      const int64_t r = rank_of(0);
      if (r < 1) return Error(n, "arg 0 must be a tensor of rank >= 1");
      labels = {cat(ell(r - 1, r - 1), letters("k")), letters("nk"), letters("n")};
      out_labels = cat(ell(r - 1, r - 1), letters("n"));
      operand_args = {0, 1, 2};
      bias = true;
    } else if (rule.spec == "matmul") {
      const int64_t ra = rank_of(0), rb = rank_of(1);
      if (ra < 1 || rb < 1) return Error(n, "args 0 and 1 must be tensors of rank >= 1");
      const int64_t e = std::max<int64_t>({ra - 2, rb - 2, 0});
      if (ra == 1 && rb == 1) {
        labels = {letters("k"), letters("k")};
      } else if (rb == 1) {
        labels = {cat(ell(ra - 2, e), letters("ik")), letters("k")};
        out_labels = cat(ell(ra - 2, e), letters("i"));
      } else if (ra == 1) {
        labels = {letters("k"), cat(ell(rb - 2, e), letters("kj"))};
        out_labels = cat(ell(rb - 2, e), letters("j"));
      } else {
        labels = {cat(ell(ra - 2, e), letters("ik")), cat(ell(rb - 2, e), letters("kj"))};
        out_labels = cat(ell(e, e), letters("ij"));
      }
      operand_args = {0, 1};
    } else {
      absl::string_view spec = rule.spec;
      if (absl::ConsumePrefix(&spec, "+")) bias = true;
      const size_t arrow = spec.find("->");
      std::vector<absl::string_view> ins = absl::StrSplit(spec.substr(0, arrow), ',');
      for (absl::string_view s : ins) labels.push_back(letters(s));
      out_labels = letters(spec.substr(arrow + 2));
      for (size_t i = 0; i < labels.size(); ++i) operand_args.push_back(static_cast<int>(i));
    }
    // Operand dim -> label (a bias is right-aligned against its labels).
    auto label_of = [&](const Operand& o, int64_t dim) -> int {
      for (size_t i = 0; i < operand_args.size(); ++i) {
        if (operand_args[i] != o.arg) continue;
        const auto& l = labels[i];
        const int64_t shift = static_cast<int64_t>(l.size()) - o.type->rank();
        if (shift < 0 || dim + shift >= static_cast<int64_t>(l.size())) return -1;
        return l[dim + shift];
      }
      return -1;
    };
    FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule, ops));
    int batch_label = -1;
    int64_t outer = 1;
    int decided = -1;
    for (const Operand& o : ops) {
      if (!o.info.placement.is_shard()) continue;
      const int l = label_of(o, o.info.placement.dim);
      if (l < 0) return Error(n, absl::StrFormat("arg %d has an unexpected rank %d", o.arg,
                                                o.type->rank()));
      if (batch_label < 0) {
        batch_label = l;
        outer = o.info.outer;
        decided = o.arg;
      } else if (batch_label != l || outer != o.info.outer) {
        return Error(n, absl::StrFormat(
            "operands put the batch on different dims of the product (arg %d and arg %d)",
            decided, o.arg));
      }
    }
    NodeInfo& info = a_.nodes_[id.value];
    if (batch_label < 0) {
      SetCombined(id, Combined{}, s);
      return absl::OkStatus();
    }
    // Replicated operands that span the batch label are sharded too.
    for (const Operand& o : ops) {
      if (!o.info.placement.is_replicate()) continue;
      for (int64_t d = 0; d < o.type->rank(); ++d) {
        if (label_of(o, d) == batch_label) NeedShard(o, static_cast<int32_t>(d), outer, id);
      }
    }
    auto pos = std::find(out_labels.begin(), out_labels.end(), batch_label);
    info.arg = static_cast<int8_t>(decided);
    if (pos != out_labels.end()) {
      info.detail = Detail::kFromArg;
      SetAllOut(id, Shard(static_cast<int32_t>(pos - out_labels.begin()), outer, s.scaled));
      return absl::OkStatus();
    }
    if (bias) {
      for (const Operand& o : ops) {
        if (o.arg == operand_args[0] && rule.spec != "linear") {
          return Error(n, "adds a bias to a product that contracts the batch; the bias would "
                          "be counted once per rank");
        }
        if (rule.spec == "linear" && o.arg == 2) {
          return Error(n, "adds a bias to a product that contracts the batch; the bias would "
                          "be counted once per rank");
        }
      }
    }
    info.detail = Detail::kContracted;
    SetAllOut(id, Partial(s.scaled));
    return absl::OkStatus();
  }

  // -- reductions ------------------------------------------------------------

  absl::Status Reduce(NodeId id, const Node& n, const OpRule& rule) {
    std::vector<Operand> ops = Operands(n);
    FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule, ops));
    NodeInfo& info = a_.nodes_[id.value];
    const Operand* self = nullptr;
    for (const Operand& o : ops) {
      if (o.arg == 0) self = &o;
    }
    if (self == nullptr) return Error(n, "arg 0 must be a tensor");
    if (!self->info.placement.is_shard()) {
      SetCombined(id, Combined{}, s);
      return absl::OkStatus();
    }
    const int64_t rank = self->type->rank();
    std::vector<int64_t> dims;
    if (rule.a >= 0) {
      dims = DimsArg(n, rule.a, "dim").value_or(std::vector<int64_t>{});
    }
    bool all = dims.empty();
    std::vector<bool> reduced(std::max<int64_t>(rank, 1), all);
    for (int64_t d : dims) {
      const int64_t nd = NormDim(d, rank);
      if (nd < 0 || nd >= std::max<int64_t>(rank, 1)) {
        return Error(n, absl::StrFormat("dim %d is out of range for rank %d", d, rank));
      }
      reduced[nd] = true;
    }
    const bool keepdim = rule.b >= 0 && BoolArg(n, rule.b, "keepdim").value_or(false);
    const int32_t d = self->info.placement.dim;
    const auto kind = static_cast<ReduceKind>(rule.c);
    info.arg = 0;
    if (!reduced[d]) {
      int32_t nd = d;
      if (!keepdim) {
        for (int32_t i = 0; i < d; ++i) nd -= reduced[i] ? 1 : 0;
      }
      info.detail = Detail::kFromArg;
      SetAllOut(id, Shard(nd, self->info.outer, s.scaled));
      return absl::OkStatus();
    }
    if (kind == ReduceKind::kOther) {
      return Error(n, absl::StrFormat(
          "reduces the batch dim %d, which is not a sum or mean of per-rank results; it "
          "needs the whole batch on every rank",
          d));
    }
    if (kind == ReduceKind::kMean && s.scaled) {
      return ScaledError(id, n, *self, "a second mean over the batch would scale it twice");
    }
    info.detail = Detail::kReducedBatch;
    SetAllOut(id, Partial(kind == ReduceKind::kMean || s.scaled));
    return absl::OkStatus();
  }

  // -- norms, convolutions, pooling ---------------------------------------------

  const Operand* Find(const std::vector<Operand>& ops, int arg) const {
    for (const Operand& o : ops) {
      if (o.arg == arg) return &o;
    }
    return nullptr;
  }

  absl::Status RequireReplicatedArgs(const Node& n, const std::vector<Operand>& ops,
                                     std::initializer_list<int> args) const {
    for (int a : args) {
      const Operand* o = Find(ops, a);
      if (o != nullptr && o->info.placement.is_shard()) {
        return Error(n, absl::StrFormat("arg %d (%s) is sharded on the batch; this op needs it "
                                        "replicated (a weight, bias or running statistic)",
                                        a, g_.node(o->ref.node).name));
      }
    }
    return absl::OkStatus();
  }

  absl::Status LayerNorm(NodeId id, const Node& n, const OpRule& rule) {
    std::vector<Operand> ops = Operands(n);
    FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule, ops));
    FXDP_RETURN_IF_ERROR(RequireReplicatedArgs(n, ops, {2, 3}));
    const Operand* x = Find(ops, 0);
    if (x == nullptr || !x->info.placement.is_shard()) {
      SetCombined(id, Combined{}, s);
      return absl::OkStatus();
    }
    auto shape = DimsArg(n, 1, "normalized_shape").value_or(std::vector<int64_t>{});
    const int32_t d = x->info.placement.dim;
    if (d >= x->type->rank() - static_cast<int64_t>(shape.size())) {
      return Error(n, absl::StrFormat("normalises over the last %d dims, which include the "
                                      "batch dim %d", shape.size(), d));
    }
    SetCombined(id, Combined{d, x->info.outer, 0}, s);
    return absl::OkStatus();
  }

  // native_layer_norm_backward, native_batch_norm_backward, convolution_backward:
  // (grad_input, grad_weight, grad_bias) from (grad_output, input, ...).
  absl::Status NormOrConvBackward(NodeId id, const Node& n, const OpRule& rule) {
    std::vector<Operand> ops = Operands(n);
    FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule, ops));
    const Operand* g = Find(ops, 0);
    const Operand* x = Find(ops, 1);
    const bool sharded = (g && g->info.placement.is_shard()) || (x && x->info.placement.is_shard());
    if (!sharded) {
      SetCombined(id, Combined{}, s);
      return absl::OkStatus();
    }
    if (rule.family == OpFamily::kConvBackward) {
      FXDP_RETURN_IF_ERROR(RequireReplicatedArgs(n, ops, {rule.b >= 0 ? rule.b : 2}));
    } else if (rule.family == OpFamily::kLayerNormBackward) {
      FXDP_RETURN_IF_ERROR(RequireReplicatedArgs(n, ops, {5, 6}));
    } else {
      FXDP_RETURN_IF_ERROR(RequireReplicatedArgs(n, ops, {2, 3, 4}));
    }
    // grad_output and input hold the batch on the same dim.
    std::vector<Operand> batched;
    for (const Operand& o : ops) {
      if (o.arg == 0 || o.arg == 1) batched.push_back(o);
    }
    FXDP_ASSIGN_OR_RETURN(Combined c, Broadcast(id, n, batched, OutType(n) ? OutType(n)->rank() : 0,
                                                /*broadcast=*/false));
    if (rule.family != OpFamily::kLayerNormBackward && c.dim != 0 && c.dim >= 0 &&
        rule.family == OpFamily::kBatchNormBackward && c.dim == 1) {
      return Error(n, "holds the batch on dim 1, the channel dim of batch norm");
    }
    NodeInfo& info = a_.nodes_[id.value];
    info.detail = Detail::kFromArg;
    info.arg = static_cast<int8_t>(c.arg);
    SetOut(id, 0, Shard(c.dim, c.outer, s.scaled));
    SetOut(id, 1, Partial(s.scaled));
    SetOut(id, 2, Partial(s.scaled));
    return absl::OkStatus();
  }

  absl::Status BatchNorm(NodeId id, const Node& n, const OpRule& rule) {
    std::vector<Operand> ops = Operands(n);
    FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule, ops));
    FXDP_RETURN_IF_ERROR(RequireReplicatedArgs(n, ops, {1, 2, 3, 4}));
    const Operand* x = Find(ops, 0);
    if (x == nullptr || !x->info.placement.is_shard()) {
      SetCombined(id, Combined{}, s);
      return absl::OkStatus();
    }
    const int32_t d = x->info.placement.dim;
    if (d == 1) return Error(n, "holds the batch on dim 1, the channel dim of batch norm");
    const bool training = rule.a >= 0 && BoolArg(n, rule.a, "training").value_or(true);
    NodeInfo& info = a_.nodes_[id.value];
    info.arg = 0;
    SetOut(id, 0, Shard(d, x->info.outer, false));
    if (training && options_.sync_batchnorm) {
      // The statistics (and the running statistics updated from them) are
      // the global batch's: the expansion all-reduces them.
      info.detail = Detail::kSyncStats;
      a_.notes_.push_back(absl::StrCat(
          n.name, " (", TargetString(n), "): batch norm normalises with the global batch "
          "statistics (sync_batchnorm: all-reduced in forward and backward, as SyncBatchNorm); "
          "running statistics are updated from them"));
    } else if (training) {
      info.detail = Detail::kLocalStats;
      for (int k = 1; k < static_cast<int>(n.outputs.size()); ++k) {
        ValueInfo stats;
        stats.rank_local = true;
        SetOut(id, k, stats);
      }
      a_.notes_.push_back(absl::StrCat(
          n.name, " (", TargetString(n), "): batch norm normalises with each rank's local batch "
          "statistics, as DDP does; running statistics are updated from them"));
    } else {
      info.detail = Detail::kFromArg;
    }
    return absl::OkStatus();
  }

  absl::Status Spatial(NodeId id, const Node& n, const OpRule& rule) {
    std::vector<Operand> ops = Operands(n);
    FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule, ops));
    Combined c;
    for (const Operand& o : ops) {
      if (!o.info.placement.is_shard()) continue;
      if (o.info.placement.dim != 0) {
        return Error(n, absl::StrFormat("arg %d (%s) holds the batch on dim %d; spatial ops "
                                        "(convolution, pooling) need it on dim 0",
                                        o.arg, g_.node(o.ref.node).name, o.info.placement.dim));
      }
      if (c.dim >= 0 && c.outer != o.info.outer) {
        return Error(n, "operands fold the batch differently into dim 0");
      }
      if (c.dim < 0) c = {0, o.info.outer, o.arg};
    }
    if (c.dim >= 0) {
      if (rule.b >= 0) FXDP_RETURN_IF_ERROR(RequireReplicatedArgs(n, ops, {rule.b, rule.b + 1}));
      // Every other operand is batched on dim 0 (an attention mask expanded to
      // the batch, pooling indices): a replicated one is built sharded or sliced.
      for (const Operand& o : ops) {
        if (!o.info.placement.is_replicate() || o.type->rank() == 0) continue;
        if (rule.b >= 0 && (o.arg == rule.b || o.arg == rule.b + 1)) continue;
        NeedShard(o, 0, c.outer, id);
      }
    }
    SetCombined(id, c, s);
    if (c.dim >= 0) {
      // Side outputs that are not batch-major (attention kernels' RNG state,
      // cumulative sequence lengths, 0-d scalars) are replicated.
      const Operand* src = Find(ops, c.arg);
      const int64_t extent = src != nullptr ? src->type->shape[0] : -1;
      for (int k = 0; k < static_cast<int>(n.outputs.size()); ++k) {
        const TensorType* t = OutType(n, k);
        if (t != nullptr && (t->rank() == 0 || t->shape[0] != extent)) SetOut(id, k, kReplicated);
      }
    }
    return absl::OkStatus();
  }

  absl::Status Embedding(NodeId id, const Node& n, const OpRule& rule) {
    std::vector<Operand> ops = Operands(n);
    FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule, ops));
    FXDP_RETURN_IF_ERROR(RequireReplicatedArgs(n, ops, {0}));
    const Operand* idx = Find(ops, 1);
    if (idx == nullptr || !idx->info.placement.is_shard()) {
      SetCombined(id, Combined{}, s);
      return absl::OkStatus();
    }
    SetCombined(id, Combined{idx->info.placement.dim, idx->info.outer, 1}, s);
    return absl::OkStatus();
  }

  absl::Status EmbeddingBackward(NodeId id, const Node& n, const OpRule& rule) {
    std::vector<Operand> ops = Operands(n);
    FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule, ops));
    const Operand* g = Find(ops, 0);
    const Operand* idx = Find(ops, 1);
    const bool sharded = (g && g->info.placement.is_shard()) || (idx && idx->info.placement.is_shard());
    if (!sharded) {
      SetCombined(id, Combined{}, s);
      return absl::OkStatus();
    }
    // grad_output is [*indices.shape, embedding_dim]: both hold the batch on
    // the same leading dim, so a replicated one is built sharded or sliced.
    std::vector<Operand> batched;
    for (const Operand& o : ops) {
      if (o.arg == 0 || o.arg == 1) batched.push_back(o);
    }
    FXDP_RETURN_IF_ERROR(
        Broadcast(id, n, batched, g ? g->type->rank() : 0, /*broadcast=*/false).status());
    if (BoolArg(n, 4, "scale_grad_by_freq").value_or(false)) {
      a_.notes_.push_back(absl::StrCat(n.name, ": scale_grad_by_freq counts token frequencies "
                                       "in each rank's local batch"));
    }
    NodeInfo& info = a_.nodes_[id.value];
    info.detail = Detail::kContracted;
    info.arg = 0;
    SetAllOut(id, Partial(s.scaled));
    return absl::OkStatus();
  }

  // -- losses --------------------------------------------------------------------

  int64_t ReductionArg(const Node& n, const OpRule& rule) const {
    return IntArg(n, rule.a, "reduction").value_or(1);
  }

  absl::Status Loss(NodeId id, const Node& n, const OpRule& rule) {
    std::vector<Operand> ops = Operands(n);
    FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule, ops));
    std::vector<Operand> batched;
    for (const Operand& o : ops) {
      if (o.arg <= 1) batched.push_back(o);
    }
    const bool nll = rule.family == OpFamily::kNllLoss;
    const Operand* self = Find(ops, 0);
    const int64_t self_rank = self ? self->type->rank() : 0;
    // nll: target has the class dim removed; align on the leading (batch) dims.
    FXDP_ASSIGN_OR_RETURN(Combined c, Broadcast(id, n, batched, self_rank, /*broadcast=*/!nll));
    if (nll && c.dim >= 0 && self_rank >= 2 && c.dim != 0) {
      return Error(n, absl::StrFormat("holds the batch on dim %d; nll_loss needs it on dim 0 "
                                      "(dim 1 is the class dim)",
                                      c.dim));
    }
    const int64_t reduction = ReductionArg(n, rule);
    NodeInfo& info = a_.nodes_[id.value];
    if (c.dim < 0) {
      SetCombined(id, c, s);
      return absl::OkStatus();
    }
    info.arg = static_cast<int8_t>(c.arg);
    if (reduction == 0) {
      info.detail = Detail::kFromArg;
      SetOut(id, 0, Shard(c.dim, c.outer, false));
    } else {
      info.detail = Detail::kLossReduced;
      SetOut(id, 0, Partial(reduction == 1));
    }
    if (nll) SetOut(id, 1, Partial(false));  // total_weight: a local count.
    return absl::OkStatus();
  }

  absl::Status LossBackward(NodeId id, const Node& n, const OpRule& rule) {
    std::vector<Operand> ops = Operands(n);
    const bool nll = rule.family == OpFamily::kNllLossBackward;
    FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule, ops, nll ? rule.b : -1));
    std::vector<Operand> batched;
    for (const Operand& o : ops) {
      if (o.arg <= 2) batched.push_back(o);
    }
    const Operand* self = Find(ops, 1);
    const int64_t self_rank = self ? self->type->rank() : 0;
    std::vector<Operand> aligned;  // grad_output (when per-sample) and self.
    for (const Operand& o : batched) {
      if (o.arg != 2 || !nll) aligned.push_back(o);
    }
    FXDP_ASSIGN_OR_RETURN(Combined c, Broadcast(id, n, aligned, self_rank, /*broadcast=*/true));
    if (nll) {
      const Operand* target = Find(ops, 2);
      if (target != nullptr && target->info.placement.is_shard() && c.dim >= 0 &&
          target->info.placement.dim != c.dim) {
        return Error(n, "target and self hold the batch on different dims");
      }
      if (c.dim < 0 && target != nullptr && target->info.placement.is_shard()) {
        c = {target->info.placement.dim, target->info.outer, 2};
      }
      // self is [N, C] (or [N, C, d...]), target [N] ([N, d...]): a
      // replicated target spanning the batch is built sharded or sliced.
      if (c.dim == 0 && target != nullptr && target->info.placement.is_replicate() &&
          target->type->rank() > 0) {
        NeedShard(*target, 0, c.outer, id);
      }
    }
    if (c.dim < 0) {
      SetCombined(id, c, s);
      return absl::OkStatus();
    }
    const int64_t reduction = ReductionArg(n, rule);
    bool scaled = s.scaled;
    if (reduction == 1) {
      if (scaled) {
        return ScaledError(id, n, *Find(ops, 0), "the mean reduction would scale it twice");
      }
      scaled = true;
    }
    Special t = s;
    t.scaled = scaled;
    SetCombined(id, c, t);
    return absl::OkStatus();
  }

  // -- cat / stack / split / slice / select / index ----------------------------------

  absl::Status CatStack(NodeId id, const Node& n, const OpRule& rule) {
    std::vector<Operand> ops = Operands(n);
    FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule, ops));
    const TensorType* out = OutType(n);
    const int64_t out_rank = out ? out->rank() : 0;
    const bool stack = rule.family == OpFamily::kStack;
    const int64_t dim = NormDim(IntArg(n, rule.a, "dim").value_or(0), out_rank);
    // Operands of a stack gain the new dim `dim`.
    std::vector<Operand> moved = ops;
    Combined c;
    for (Operand& o : moved) {
      if (!o.info.placement.is_shard()) continue;
      int32_t d = o.info.placement.dim;
      if (stack && d >= dim) ++d;
      if (!stack && o.type->rank() == 1 && o.type->shape[0] == 0) continue;
      if (c.dim < 0) {
        c = {d, o.info.outer, o.arg};
      } else if (c.dim != d || c.outer != o.info.outer) {
        return Error(n, "operands hold the batch on different dims");
      }
    }
    if (c.dim >= 0) {
      if (!stack && c.dim == dim) {
        return Error(n, absl::StrFormat("concatenates along dim %d, which holds the batch; the "
                                        "result's rows would interleave across ranks",
                                        dim));
      }
      for (const Operand& o : ops) {
        if (!o.info.placement.is_replicate()) continue;
        // cat skips 1-D empty tensors (a legacy empty cache): nothing to shard.
        if (!stack && o.type->rank() == 1 && o.type->shape[0] == 0) continue;
        const int32_t d = stack && c.dim > dim ? c.dim - 1 : c.dim;
        if (d < o.type->rank()) NeedShard(o, d, c.outer, id);
      }
    }
    SetCombined(id, c, s);
    return absl::OkStatus();
  }

  absl::Status DimOp(NodeId id, const Node& n, const OpRule& rule) {
    std::vector<Operand> ops = Operands(n);
    FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule, ops));
    const Operand* self = Find(ops, 0);
    if (self == nullptr) return Error(n, "arg 0 must be a tensor");
    const bool index_select = n.target.name == "aten::index_select";
    if (rule.family == OpFamily::kIndexWithDim && !index_select) {
      // gather / scatter: every tensor operand has self's rank.
      FXDP_ASSIGN_OR_RETURN(Combined c, Broadcast(id, n, ops, self->type->rank(), false));
      if (c.dim >= 0 && c.dim == NormDim(IntArg(n, rule.a, "dim").value_or(0), self->type->rank())) {
        return Error(n, absl::StrFormat("indexes along dim %d, which holds the batch", c.dim));
      }
      SetCombined(id, c, s);
      return absl::OkStatus();
    }
    for (const Operand& o : ops) {
      if (o.arg != 0 && o.info.placement.is_shard()) {
        return Error(n, absl::StrFormat("arg %d (%s) is sharded on the batch; only arg 0 may be",
                                        o.arg, g_.node(o.ref.node).name));
      }
    }
    if (!self->info.placement.is_shard()) {
      SetCombined(id, Combined{}, s);
      return absl::OkStatus();
    }
    const int64_t in_rank = self->type->rank();
    const int32_t d = self->info.placement.dim;
    const TensorType* out = OutType(n);
    const int64_t out_rank = out ? out->rank() : in_rank;
    // select_backward / slice_backward work in the output's coordinates.
    const int64_t dim_rank = rule.family == OpFamily::kSliceBackward ? out_rank : in_rank;
    const int64_t dim = NormDim(IntArg(n, rule.a, "dim").value_or(0), dim_rank);
    int32_t nd = d;
    switch (rule.family) {
      case OpFamily::kSplit:
        if (dim == d && a_.micro_batches_ > 1 && self->ref.node.value >= 0 &&
            g_.node(self->ref.node).is_placeholder() && rule.b == 0) {
          break;  // a micro-batch of an input (FindMicroBatches): it holds the batch on dim d
        }
        if (dim == d && rule.b == 0 && EqualSplitSize(n, dim, in_rank) >= self->type->shape[d]) {
          break;  // one piece, the whole value (x.chunk(1)): an identity
        }
        if (dim == d) {
          return Error(n, absl::StrFormat("splits along dim %d, which holds the batch", d));
        }
        if (rule.b == 1 && d > dim) --nd;
        break;
      case OpFamily::kSelect:
        if (dim == d) {
          return Error(n, absl::StrFormat("selects one entry of dim %d, which holds the batch; "
                                          "it lives on one rank only", d));
        }
        if (d > dim) --nd;
        break;
      case OpFamily::kIndexWithDim:
        if (dim == d) {
          return Error(n, absl::StrFormat("indexes along dim %d, which holds the batch", d));
        }
        break;
      case OpFamily::kSlice: {
        if (dim != d) break;
        const int64_t size = self->type->shape[d];
        bool full;
        if (rule.c == 1) {  // narrow(self, dim, start, length)
          full = IntArg(n, 2, "start").value_or(-1) == 0 &&
                 IntArg(n, 3, "length").value_or(-1) == size;
        } else {
          const int64_t start = IntArg(n, 2, "start").value_or(0);
          const int64_t end = IntArg(n, 3, "end").value_or(std::numeric_limits<int64_t>::max());
          const int64_t step = IntArg(n, 4, "step").value_or(1);
          full = start == 0 && end >= size && step == 1;
        }
        if (!full) {
          return Error(n, absl::StrFormat("takes part of dim %d, which holds the batch; a "
                                          "slice of the batch is not a slice of each rank's part",
                                          d));
        }
        break;
      }
      case OpFamily::kSliceBackward: {
        if (rule.c == 1) {  // select_backward: the selected dim is re-inserted.
          if (d >= dim) ++nd;
        } else if (dim == d) {
          return Error(n, absl::StrFormat("scatters a slice into dim %d, which holds the batch",
                                          d));
        }
        break;
      }
      default:
        break;
    }
    NodeInfo& info = a_.nodes_[id.value];
    info.detail = Detail::kFromArg;
    info.arg = 0;
    SetAllOut(id, Shard(nd, self->info.outer, s.scaled));
    return absl::OkStatus();
  }

  // slice_scatter / select_scatter: self and src hold the batch on the same
  // dim (src's is one lower past a selected dim); it must not be the scattered dim.
  absl::Status ScatterInto(NodeId id, const Node& n, const OpRule& rule) {
    std::vector<Operand> ops = Operands(n);
    FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule, ops));
    const Operand* self = Find(ops, 0);
    const Operand* src = Find(ops, 1);
    if (self == nullptr || src == nullptr) return Error(n, "args 0 and 1 must be tensors");
    const int64_t rank = self->type->rank();
    const int64_t dim = NormDim(IntArg(n, rule.a, "dim").value_or(0), rank);
    const bool dropped = rule.c == 1;
    // src dim -> self dim, and back.
    auto to_self = [&](int32_t d) { return dropped && d >= dim ? d + 1 : d; };
    auto to_src = [&](int32_t d) { return dropped && d > dim ? d - 1 : d; };
    Combined c;
    if (self->info.placement.is_shard()) c = {self->info.placement.dim, self->info.outer, 0};
    if (src->info.placement.is_shard()) {
      const int32_t d = to_self(src->info.placement.dim);
      if (c.dim >= 0 && (c.dim != d || c.outer != src->info.outer)) {
        return Error(n, absl::StrFormat("self holds the batch on dim %d, src on dim %d (dim %d "
                                        "of self)", c.dim, src->info.placement.dim, d));
      }
      if (c.dim < 0) c = {d, src->info.outer, 1};
    }
    if (c.dim < 0) {
      SetCombined(id, c, s);
      return absl::OkStatus();
    }
    if (c.dim == dim) {
      return Error(n, absl::StrFormat("scatters into dim %d, which holds the batch", dim));
    }
    if (self->info.placement.is_replicate()) NeedShard(*self, c.dim, c.outer, id);
    if (src->info.placement.is_replicate()) NeedShard(*src, to_src(c.dim), c.outer, id);
    SetCombined(id, c, s);
    return absl::OkStatus();
  }

  // The number of storage elements one sample spans in a tensor whose batch
  // is dim `d` (outer 1): stride[d] * size[d] / B, when every other dim stays
  // inside one sample (the batch is the outermost dim in memory); else -1.
  int64_t SampleSpan(const std::vector<int64_t>& size, const std::vector<int64_t>& stride,
                     int64_t offset, int64_t d) const {
    const int64_t b = a_.batch_size_;
    if (d < 0 || d >= static_cast<int64_t>(size.size()) || size.size() != stride.size() ||
        size[d] % b != 0) {
      return -1;
    }
    const int64_t per = size[d] / b;
    const int64_t span = stride[d] * per;
    int64_t reach = offset + stride[d] * (per - 1);
    for (size_t j = 0; j < size.size(); ++j) {
      if (static_cast<int64_t>(j) != d && size[j] > 1) reach += stride[j] * (size[j] - 1);
    }
    return span > 0 && reach < span ? span : -1;
  }

  // The dim of a view (size, stride, offset) that steps over samples of
  // `span` elements, or -1.
  int64_t ViewBatchDim(const std::vector<int64_t>& size, const std::vector<int64_t>& stride,
                       int64_t offset, int64_t span) const {
    for (size_t k = 0; k < size.size(); ++k) {
      if (SampleSpan(size, stride, offset, static_cast<int64_t>(k)) == span) {
        return static_cast<int64_t>(k);
      }
    }
    return -1;
  }

  // as_strided(self, size, stride, offset) and as_strided_scatter(self, src,
  // size, stride, offset) over a storage that holds whole samples one after
  // another: the view's batch dim is the one whose stride steps over samples.
  absl::Status AsStrided(NodeId id, const Node& n, const OpRule& rule) {
    std::vector<Operand> ops = Operands(n);
    FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule, ops));
    const bool scatter = rule.family == OpFamily::kAsStridedScatter;
    const int sa = scatter ? 2 : 1;
    const Operand* self = Find(ops, 0);
    const Operand* src = scatter ? Find(ops, 1) : nullptr;
    if (self == nullptr || (scatter && src == nullptr)) return Error(n, "expects tensor operands");
    const bool sharded = self->info.placement.is_shard() || (src && src->info.placement.is_shard());
    if (!sharded) {
      SetCombined(id, Combined{}, s);
      return absl::OkStatus();
    }
    auto size = DimsArg(n, sa, "size");
    auto stride = DimsArg(n, sa + 1, "stride");
    const int64_t offset = IntArg(n, sa + 2, "storage_offset").value_or(self->type->storage_offset);
    if (!size || !stride || size->size() != stride->size()) {
      return Error(n, "expects int lists for size and stride");
    }
    const TensorType& st = *self->type;
    int64_t span = -1;
    if (self->info.placement.is_shard()) {
      if (self->info.outer != 1) return Error(n, "the batch is folded inside a dim of its input");
      span = SampleSpan(st.shape, st.stride, st.storage_offset, self->info.placement.dim);
      if (span < 0) {
        return Error(n, absl::StrFormat("its input %s does not store the batch (dim %d) "
                                        "outermost; its storage cannot be split by samples",
                                        st.ToString(), self->info.placement.dim));
      }
    } else {
      span = SampleSpan(*size, *stride, offset, src->info.placement.dim);
    }
    const int64_t k = span < 0 ? -1 : ViewBatchDim(*size, *stride, offset, span);
    if (k < 0) {
      return Error(n, absl::StrFormat("the view (size [%s], stride [%s], offset %d) mixes "
                                      "samples of %d elements: it cannot be split by samples",
                                      absl::StrJoin(*size, ", "), absl::StrJoin(*stride, ", "),
                                      offset, span));
    }
    if (!scatter) {
      NodeInfo& info = a_.nodes_[id.value];
      info.detail = Detail::kFromArg;
      info.arg = 0;
      SetAllOut(id, Shard(static_cast<int32_t>(k), 1, s.scaled));
      return absl::OkStatus();
    }
    // The view must carry src's batch on k; self's storage the same samples.
    if (src->info.placement.is_shard() && src->info.placement.dim != k) {
      return Error(n, absl::StrFormat("src holds the batch on dim %d, the view on dim %d",
                                      src->info.placement.dim, k));
    }
    if (src->info.placement.is_replicate()) NeedShard(*src, static_cast<int32_t>(k), 1, id);
    int64_t d = self->info.placement.is_shard() ? self->info.placement.dim : -1;
    if (d < 0) {
      for (int64_t j = 0; j < st.rank() && d < 0; ++j) {
        if (SampleSpan(st.shape, st.stride, st.storage_offset, j) == span) d = j;
      }
      if (d < 0) {
        return Error(n, absl::StrFormat("self %s has no dim that steps over samples of %d "
                                        "elements", st.ToString(), span));
      }
      NeedShard(*self, static_cast<int32_t>(d), 1, id);
    }
    NodeInfo& info = a_.nodes_[id.value];
    info.detail = Detail::kFromArg;
    info.arg = self->info.placement.is_shard() ? 0 : 1;
    SetAllOut(id, Shard(static_cast<int32_t>(d), 1, s.scaled));
    return absl::OkStatus();
  }

  // arange(B) (start 0, step 1): the positions of the batch's samples.
  bool IsBatchPositions(const Argument& a) const {
    const ValueRef* r = a.get_if<ValueRef>();
    if (r == nullptr || r->output != 0) return false;
    const Node& n = g_.node(r->node);
    const TensorType* t = TypeOf(*r);
    if (!n.is_call() || n.target.name != "aten::arange" || t == nullptr || t->rank() != 1 ||
        t->shape[0] != a_.batch_size_) {
      return false;
    }
    const bool ranged = n.target.overload == "start" || n.target.overload == "start_step";
    const int64_t start = ranged ? IntArg(n, 0, "start").value_or(-1) : 0;
    const int64_t end = IntArg(n, ranged ? 1 : 0, "end").value_or(-1);
    const int64_t step = n.target.overload == "start_step" ? IntArg(n, 2, "step").value_or(-1) : 1;
    return start == 0 && end == a_.batch_size_ && step == 1;
  }

  // Whether every use of `r` indexes dim `pos` of an index or index_put, so
  // that arange(B) can become arange(B_r): each rank indexes its own rows.
  bool OnlyIndexesDim(ValueRef r, int64_t pos) const {
    bool ok = true;
    for (const Node& u : g_.nodes()) {
      bool uses = false;
      u.ForEachInput([&](ValueRef x) { uses |= x == r; });
      if (!uses) continue;
      const OpRule* rule = u.is_call() ? FindOpRule(u.target) : nullptr;
      if (rule == nullptr || (rule->family != OpFamily::kIndex && rule->family != OpFamily::kIndexPut)) {
        return false;
      }
      const Argument* idx = ArgAt(u, 1, "indices");
      const Argument::List* list = idx ? idx->get_if<Argument::List>() : nullptr;
      if (list == nullptr) return false;
      for (size_t i = 0; i < list->size(); ++i) {
        const ValueRef* x = (*list)[i].get_if<ValueRef>();
        if (x != nullptr && *x == r && static_cast<int64_t>(i) != pos) ok = false;
      }
      if (const ValueRef* self = u.args.empty() ? nullptr : u.args[0].get_if<ValueRef>()) {
        if (*self == r) return false;
      }
    }
    return ok;
  }

  // Indexing the batch dim `pos` by arange(B) and other 1-D indices
  // (`x[arange(B), last_token]`): each rank indexes its own rows with
  // arange(B_r), the other indices are its batch rows. Returns the dim of the
  // indexed result that holds the batch, or -1 when the pattern does not apply.
  int64_t BatchPositionsIndex(NodeId id, const Node& n, const std::vector<Operand>& ops,
                              const Argument::List& list, int64_t pos) {
    if (pos < 0 || pos >= static_cast<int64_t>(list.size()) || !IsBatchPositions(list[pos])) return -1;
    const ValueRef positions = list[pos].as<ValueRef>();
    if (!OnlyIndexesDim(positions, pos)) return -1;
    std::vector<int64_t> indexed;
    for (size_t i = 0; i < list.size(); ++i) {
      if (list[i].is_none()) continue;
      indexed.push_back(static_cast<int64_t>(i));
      const TensorType* t = list[i].get_if<ValueRef>() ? TypeOf(list[i].as<ValueRef>()) : nullptr;
      if (t == nullptr || t->rank() != 1) return -1;
    }
    for (const Operand& o : ops) {
      if (o.arg != 1 || o.elem == pos) continue;
      if (o.info.placement.is_shard() && (o.info.placement.dim != 0 || o.info.outer != 1)) return -1;
      if (o.info.placement.is_replicate()) NeedShard(o, 0, 1, id);
    }
    if (upgrades_.emplace(positions.node.value, Upgrade{0, 1, id}).second) changed_ = true;
    const bool adjacent = indexed.back() - indexed.front() + 1 == static_cast<int64_t>(indexed.size());
    return adjacent ? indexed.front() : 0;
  }

  // index_put(self, indices, values, accumulate): a parameter's gradient
  // scattered into a zero table (no batch operand; partial values flow through
  // a zero self); the backward of x[..., idx] with the batch in self and values
  // on a dim that is not indexed; or the backward of x[arange(B), idx]
  // (BatchPositionsIndex).
  absl::Status IndexPut(NodeId id, const Node& n, const OpRule& rule) {
    std::vector<Operand> ops = Operands(n);
    FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule, ops));
    const Operand* self = Find(ops, 0);
    const Argument* idx = ArgAt(n, 1, "indices");
    const Argument::List* list = idx ? idx->get_if<Argument::List>() : nullptr;
    if (self == nullptr || list == nullptr) return Error(n, "expects self and a list of indices");
    bool sharded = false;
    for (const Operand& o : ops) sharded |= o.info.placement.is_shard();
    // arange(B) indexes the batch only next to a batch-sharded self or index (a
    // same-sized arange over another dim is positions of that dim).
    int64_t pos = -1;
    for (size_t i = 0; i < list->size() && pos < 0; ++i) {
      if (!IsBatchPositions((*list)[i])) continue;
      bool batch = self->info.placement.is_shard() && self->info.placement.dim == static_cast<int32_t>(i);
      for (const Operand& o : ops) {
        batch |= o.arg == 1 && o.elem != static_cast<int>(i) && o.info.placement.is_shard();
      }
      if (batch) pos = static_cast<int64_t>(i);
    }
    if (!sharded && pos < 0) {
      SetCombined(id, Combined{}, s);
      return absl::OkStatus();
    }
    // The indexed result's layout (as Index): [self dims before the indexed ones, the
    // indices' broadcast dims, the rest]; non-adjacent indexed dims put the broadcast first.
    std::vector<int64_t> indexed;
    int64_t bcast_rank = 0;
    for (size_t i = 0; i < list->size(); ++i) {
      if ((*list)[i].is_none()) continue;
      indexed.push_back(static_cast<int64_t>(i));
      for (const Operand& o : ops) {
        if (o.arg != 1 || o.elem != static_cast<int>(i)) continue;
        bcast_rank = std::max<int64_t>(bcast_rank, o.type->rank());
        if (o.info.placement.is_shard() && pos < 0) {
          return Error(n, absl::StrFormat("index %d (%s) is sharded on the batch; index_put "
                                          "supports a batch in self and values only",
                                          i, g_.node(o.ref.node).name));
        }
      }
    }
    if (indexed.empty()) return Error(n, "expects at least one index");
    const bool adjacent = indexed.back() - indexed.front() + 1 == static_cast<int64_t>(indexed.size());
    const int64_t n_indexed = static_cast<int64_t>(indexed.size());
    const int64_t res_rank = self->type->rank() - n_indexed + bcast_rank;
    auto is_indexed = [&](int64_t d) {
      return std::find(indexed.begin(), indexed.end(), d) != indexed.end();
    };
    auto self_to_res = [&](int64_t d) -> int64_t {  // d not indexed
      if (adjacent) return d < indexed.front() ? d : d - n_indexed + bcast_rank;
      int64_t before = 0;
      for (int64_t i = 0; i < d; ++i) before += is_indexed(i) ? 0 : 1;
      return bcast_rank + before;
    };
    const Operand* v = Find(ops, 2);
    int64_t nd = -1, d = -1;
    if (pos >= 0) {
      nd = BatchPositionsIndex(id, n, ops, *list, pos);
      d = pos;
      if (nd < 0) {
        return Error(n, "indexes the batch dim with arange(B) whose values are also used "
                        "elsewhere; each rank can only index its own rows");
      }
    } else if (self->info.placement.is_shard()) {
      d = self->info.placement.dim;
      if (is_indexed(d)) return Error(n, absl::StrFormat("indexes dim %d, which holds the batch", d));
      nd = self_to_res(d);
    } else if (v != nullptr && v->info.placement.is_shard()) {
      nd = v->info.placement.dim + (res_rank - v->type->rank());
      for (int64_t j = 0; j < self->type->rank() && d < 0; ++j) {
        if (!is_indexed(j) && self_to_res(j) == nd) d = j;
      }
      if (d < 0) {
        return Error(n, absl::StrFormat("values hold the batch on dim %d, which lands in the "
                                        "indices' broadcast dims of self", v->info.placement.dim));
      }
    }
    if (d < 0) return Error(n, "cannot place the batch of its operands in self");
    if (self->info.placement.is_shard() && self->info.placement.dim != d) {
      return Error(n, absl::StrFormat("self holds the batch on dim %d, the indexed rows need it "
                                      "on dim %d", self->info.placement.dim, d));
    }
    if (self->info.placement.is_replicate()) NeedShard(*self, static_cast<int32_t>(d), 1, id);
    if (v != nullptr) {
      const int64_t vd = nd - (res_rank - v->type->rank());
      if (v->info.placement.is_shard() && v->info.placement.dim != vd) {
        return Error(n, absl::StrFormat("values hold the batch on dim %d, the indexed rows on dim %d",
                                        v->info.placement.dim, vd));
      }
      if (v->info.placement.is_replicate() && vd >= 0) NeedShard(*v, static_cast<int32_t>(vd), 1, id);
    }
    NodeInfo& info = a_.nodes_[id.value];
    info.detail = Detail::kFromArg;
    info.arg = 0;
    SetAllOut(id, Shard(static_cast<int32_t>(d), 1, s.scaled));
    return absl::OkStatus();
  }

  absl::Status Index(NodeId id, const Node& n, const OpRule& rule) {
    std::vector<Operand> ops = Operands(n);
    FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule, ops));
    const Operand* self = Find(ops, 0);
    if (self == nullptr) return Error(n, "arg 0 must be a tensor");
    const Argument* idx = ArgAt(n, 1, "indices");
    const Argument::List* list = idx ? idx->get_if<Argument::List>() : nullptr;
    if (list == nullptr) return Error(n, "arg 1 must be a list of indices");
    std::vector<int64_t> indexed;
    int64_t bcast_rank = 0;
    const Operand* sharded_index = nullptr;
    for (size_t i = 0; i < list->size(); ++i) {
      if ((*list)[i].is_none()) continue;
      indexed.push_back(static_cast<int64_t>(i));
      for (const Operand& o : ops) {
        if (o.arg == 1 && o.elem == static_cast<int>(i)) {
          bcast_rank = std::max<int64_t>(bcast_rank, o.type->rank());
          if (o.info.placement.is_shard()) sharded_index = &o;
        }
      }
    }
    const bool adjacent =
        indexed.empty() || indexed.back() - indexed.front() + 1 == static_cast<int64_t>(indexed.size());
    if (self->info.placement.is_shard() && self->info.outer == 1) {
      const int64_t nd = BatchPositionsIndex(id, n, ops, *list, self->info.placement.dim);
      if (nd >= 0) {
        NodeInfo& info = a_.nodes_[id.value];
        info.detail = Detail::kFromArg;
        info.arg = 0;
        SetAllOut(id, Shard(static_cast<int32_t>(nd), 1, s.scaled));
        return absl::OkStatus();
      }
    }
    if (self->info.placement.is_shard()) {
      if (sharded_index != nullptr) {
        return Error(n, "indexes a batch-sharded tensor with a batch-sharded index");
      }
      const int32_t d = self->info.placement.dim;
      if (std::find(indexed.begin(), indexed.end(), d) != indexed.end()) {
        return Error(n, absl::StrFormat("indexes dim %d, which holds the batch", d));
      }
      int64_t nd;
      if (adjacent && !indexed.empty() && d < indexed.front()) {
        nd = d;
      } else if (adjacent) {
        nd = d - static_cast<int64_t>(indexed.size()) + bcast_rank;
      } else {
        int64_t before = 0;
        for (int64_t i = 0; i < d; ++i) {
          if (std::find(indexed.begin(), indexed.end(), i) == indexed.end()) ++before;
        }
        nd = bcast_rank + before;
      }
      NodeInfo& info = a_.nodes_[id.value];
      info.detail = Detail::kFromArg;
      info.arg = 0;
      SetAllOut(id, Shard(static_cast<int32_t>(nd), self->info.outer, s.scaled));
      return absl::OkStatus();
    }
    if (sharded_index != nullptr) {
      const int64_t k = sharded_index->info.placement.dim +
                        (bcast_rank - sharded_index->type->rank());
      const int64_t nd = adjacent ? indexed.front() + k : k;
      NodeInfo& info = a_.nodes_[id.value];
      info.detail = Detail::kFromArg;
      info.arg = 1;
      SetAllOut(id, Shard(static_cast<int32_t>(nd), sharded_index->info.outer, false));
      return absl::OkStatus();
    }
    SetCombined(id, Combined{}, s);
    return absl::OkStatus();
  }

  // -- foreach ---------------------------------------------------------------------

  absl::Status Foreach(NodeId id, const Node& n, const OpRule& rule) {
    std::vector<Operand> ops = Operands(n);
    const int n_out = static_cast<int>(n.outputs.size());
    NodeInfo& info = a_.nodes_[id.value];
    info.detail = Detail::kNoBatch;
    for (int k = 0; k < n_out; ++k) {
      if (!n.outputs[k].is_tensor()) continue;
      std::vector<Operand> elem;
      for (const Operand& o : ops) {
        if (o.elem < 0 || o.elem == k) elem.push_back(o);
      }
      FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule, elem));
      FXDP_ASSIGN_OR_RETURN(Combined c, Broadcast(id, n, elem, n.outputs[k].tensor.rank()));
      if (c.dim >= 0) {
        info.detail = Detail::kFromArg;
        SetOut(id, k, Shard(c.dim, c.outer, s.scaled));
      } else if (s.partial) {
        SetOut(id, k, Partial(s.scaled));
      }
    }
    return absl::OkStatus();
  }

  // -- fallback --------------------------------------------------------------------

  absl::Status VisitFallback(NodeId id, const Node& n) {
    NodeInfo& info = a_.nodes_[id.value];
    info.decision = Decision::kFallback;
    std::vector<Operand> ops = Operands(n);
    int64_t batch_extent = -1;
    int64_t outer = 1;
    bool partial = false, avg = false;
    for (const Operand& o : ops) {
      if (o.info.placement.is_partial()) {
        partial = true;
        avg |= o.info.mean_scaled;
      }
      if (o.info.placement.is_shard() && batch_extent < 0) {
        batch_extent = o.type->shape[o.info.placement.dim];
        outer = o.info.outer;
        info.arg = static_cast<int8_t>(std::min(o.arg, 127));
      }
    }
    for (const Operand& o : ops) {
      if (o.info.placement.is_partial()) RequireWhole(o.ref, id);
    }
    (void)partial;
    (void)avg;
    std::string what = "replicated (no operand carries the batch)";
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      if (!n.outputs[k].is_tensor() || batch_extent < 0) continue;
      const auto& shape = n.outputs[k].tensor.shape;
      auto it = std::find(shape.begin(), shape.end(), batch_extent);
      if (it != shape.end()) {
        SetOut(id, static_cast<int>(k), Shard(static_cast<int32_t>(it - shape.begin()), outer, false));
        what = absl::StrFormat("batch dim matched by size %d", batch_extent);
      }
    }
    auto [entry, inserted] = fallback_ops_.try_emplace(TargetString(n), 0, id, what);
    if (inserted) fallback_order_.push_back(entry->first);
    ++std::get<0>(entry->second);
    return absl::OkStatus();
  }

  // ---- results -------------------------------------------------------------------

  void Finish() {
    // Reductions, in graph order, with their first use (one scan, no use lists).
    std::vector<int32_t> first_use(a_.values_.size(), -1);
    for (int32_t i = 0; i < g_.size(); ++i) {
      g_.nodes()[i].ForEachInput([&](ValueRef r) {
        const int32_t off = Offset(r);
        if (a_.reduced_[off] && first_use[off] < 0) first_use[off] = i;
      });
    }
    for (int32_t i = 0; i < g_.size(); ++i) {
      const Node& n = g_.nodes()[i];
      for (int32_t k = 0; k < static_cast<int32_t>(n.outputs.size()); ++k) {
        const ValueRef r{NodeId{i}, k};
        const int32_t off = Offset(r);
        const ValueInfo& v = a_.values_[off];
        if (!a_.reduced_[off]) continue;
        if (!v.placement.is_partial()) {
          a_.reduced_[off] = 0;
          continue;
        }
        Reduction red;
        red.value = r;
        red.op = v.placement.reduce;
        red.grad_of = k == 0 ? n.grad_of : std::string();
        red.first_use = NodeId{first_use[off]};
        a_.reductions_.push_back(std::move(red));
      }
    }
    for (const std::string& op : fallback_order_) {
      const auto& [count, first, what] = fallback_ops_.at(op);
      a_.warnings_.push_back(absl::StrFormat(
          "no batch-dim rule for %s (%d node%s, first %s): fell back to size matching: %s", op,
          count, count == 1 ? "" : "s", g_.node(first).name, what));
    }
    const std::vector<std::string> hyper = ir::HyperparameterNames(g_);
    if (!hyper.empty()) {
      a_.notes_.push_back(absl::StrCat(
          "hyper-parameters (R: the same value on every rank, fed per step by a schedule): ",
          absl::StrJoin(hyper, ", ")));
    }
  }

  const Graph& g_;
  const AnalyzeOptions options_;
  BatchDimAnalysis a_;
  bool changed_ = false;
  absl::flat_hash_map<int32_t, Upgrade> upgrades_;
  absl::flat_hash_map<std::string, std::tuple<int, NodeId, std::string>> fallback_ops_;
  std::vector<std::string> fallback_order_;
};

absl::StatusOr<BatchDimAnalysis> AnalyzeBatchDims(const Graph& graph,
                                                  const AnalyzeOptions& options) {
  // A graph the workers cannot run is refused here, at compile time, naming the node.
  FXDP_RETURN_IF_ERROR(CheckOpSchemas(graph));
  return BatchDimAnalyzer(graph, options).Run();
}

const ValueInfo& BatchDimAnalysis::primary(NodeId n) const {
  if (num_outputs(n) == 0) return kReplicated;
  return values_[value_offset_[n.value]];
}

Placement BatchDimAnalysis::ReadPlacement(ValueRef r) const {
  const ValueInfo& v = value(r);
  if (v.placement.is_partial() && reduced_[value_offset_[r.node.value] + r.output]) {
    return Placement::Replicate();
  }
  return v.placement;
}

bool BatchDimAnalysis::IsReduced(ValueRef r) const {
  return reduced_[value_offset_[r.node.value] + r.output] != 0;
}

}  // namespace fxdp
