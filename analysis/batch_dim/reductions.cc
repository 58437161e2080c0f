// Reductions, histograms, losses and loss backwards.
#include "analysis/batch_dim/analyzer.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "util/status_macros.h"

namespace fxdp {

using ir::Argument;
using ir::Graph;
using ir::Node;
using ir::NodeId;
using ir::TensorType;
using ir::ValueRef;

absl::Status BatchDimAnalyzer::Reduce(NodeId id, const Node& n, const OpRule& rule) {
  std::vector<Operand> ops = Operands(n);
  FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule.linear, ops));
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
  // No dims (absent, None or []): every dim.
  const std::vector<int64_t> dims =
      DimsArg(n, rule.param(ParamRole::kDims)).value_or(std::vector<int64_t>{});
  bool all = dims.empty();
  std::vector<bool> reduced(std::max<int64_t>(rank, 1), all);
  for (int64_t d : dims) {
    const int64_t nd = NormDim(d, rank);
    if (nd < 0 || nd >= std::max<int64_t>(rank, 1)) {
      return Error(n, absl::StrFormat("dim %d is out of range for rank %d", d, rank));
    }
    reduced[nd] = true;
  }
  const bool keepdim = BoolArg(n, rule.param(ParamRole::kKeepDim)).value_or(false);
  const int32_t d = self->info.placement.dim;
  const OpParam* reduces = rule.param(ParamRole::kReduces);
  const auto kind = reduces ? static_cast<ReduceKind>(reduces->value) : ReduceKind::kOther;
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
    return Error(n,
                 absl::StrFormat(
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

// histc(self, bins, min, max): counts over every element, so a batch-sharded
// self gives each rank its rows' counts, a partial sum. Exact only when the
// bins do not depend on the data: the range is given (min < max).
// (bincount's output size is the data's largest value + 1: tracing refuses it.)
absl::Status BatchDimAnalyzer::Histogram(NodeId id, const Node& n, const OpRule& rule) {
  std::vector<Operand> ops = Operands(n);
  FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule.linear, ops));
  const Operand* self = Find(ops, 0);
  if (self == nullptr) return Error(n, "arg 0 must be a tensor");
  if (!self->info.placement.is_shard()) {
    SetCombined(id, Combined{}, s);
    return absl::OkStatus();
  }
  if (const OpParam* lo = rule.param(ParamRole::kBinRange)) {
    const double min = NumberArg(n, lo->index, "min").value_or(0);
    const double max = NumberArg(n, lo->index + 1, "max").value_or(0);
    if (!(min < max)) {
      return Error(
          n,
          absl::StrFormat(
              "counts batch rows into bins over [min, max] = [%g, %g], i.e. the range of the data, "
              "which differs between ranks; pass the range (torch.histc(x, bins, min=lo, max=hi))",
              min, max));
    }
  }
  NodeInfo& info = a_.nodes_[id.value];
  info.detail = Detail::kReducedBatch;
  info.arg = 0;
  SetAllOut(id, Partial(s.scaled));
  return absl::OkStatus();
}

int64_t BatchDimAnalyzer::ReductionArg(const Node& n, const OpRule& rule) const {
  return IntArg(n, rule.param(ParamRole::kReduction)).value_or(1);
}

absl::Status BatchDimAnalyzer::Loss(NodeId id, const Node& n, const OpRule& rule) {
  std::vector<Operand> ops = Operands(n);
  FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule.linear, ops));
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

absl::Status BatchDimAnalyzer::LossBackward(NodeId id, const Node& n, const OpRule& rule) {
  std::vector<Operand> ops = Operands(n);
  const bool nll = rule.family == OpFamily::kNllLossBackward;
  const OpParam* total_weight = rule.param(ParamRole::kTotalWeight);
  FXDP_ASSIGN_OR_RETURN(Special s,
                        Linear(id, n, rule.linear, ops, total_weight ? total_weight->index : -1));
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
      // self whole on every rank (logits computed from all-gathered values, e.g. every bag of
      // a flat input): each rank reads the rows of its targets, as the forward does (Broadcast);
      // a per-sample grad_output (reduction='none') has the target's shape.
      for (const Operand& o : aligned) {
        if (!o.info.placement.is_replicate() || o.type->rank() == 0) continue;
        const int64_t d = o.arg == 1 && c.dim > 0 ? c.dim + 1 : c.dim;
        if (d < o.type->rank()) NeedShard(o, static_cast<int32_t>(d), c.outer, id);
      }
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

}  // namespace fxdp
