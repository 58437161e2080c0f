// Layer and batch norm, convolution/pooling/attention kernels and their backwards.
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

absl::Status BatchDimAnalyzer::LayerNorm(NodeId id, const Node& n, const OpRule& rule) {
  std::vector<Operand> ops = Operands(n);
  Special s;
  FXDP_ASSIGN_OR_RETURN(const Operand* x, ShardedOperand(id, n, rule, ops, 0, &s));
  if (x == nullptr) return absl::OkStatus();
  auto shape = DimsArg(n, rule.param(ParamRole::kNormalizedShape)).value_or(std::vector<int64_t>{});
  const int32_t d = x->info.placement.dim;
  if (d >= x->type->rank() - static_cast<int64_t>(shape.size())) {
    return Error(n, absl::StrFormat("normalises over the last %d dims, which include the "
                                    "batch dim %d",
                                    shape.size(), d));
  }
  SetCombined(id, Combined{d, x->info.outer, 0}, s);
  return absl::OkStatus();
}

// native_layer_norm_backward, native_batch_norm_backward, convolution_backward:
// (grad_input, grad_weight, grad_bias) from (grad_output, input, ...).
absl::Status BatchDimAnalyzer::NormOrConvBackward(NodeId id, const Node& n, const OpRule& rule) {
  std::vector<Operand> ops = Operands(n);
  Special s;
  FXDP_ASSIGN_OR_RETURN(
      std::optional<Combined> batch,
      GradAndInputBatch(id, n, rule, ops, OutType(n) ? OutType(n)->rank() : 0, &s));
  if (!batch) return absl::OkStatus();
  const Combined& c = *batch;
  if (rule.family == OpFamily::kBatchNormBackward && c.dim == 1) {
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

absl::Status BatchDimAnalyzer::BatchNorm(NodeId id, const Node& n, const OpRule& rule) {
  std::vector<Operand> ops = Operands(n);
  Special s;
  FXDP_ASSIGN_OR_RETURN(const Operand* x, ShardedOperand(id, n, rule, ops, 0, &s));
  if (x == nullptr) return absl::OkStatus();
  const int32_t d = x->info.placement.dim;
  if (d == 1) return Error(n, "holds the batch on dim 1, the channel dim of batch norm");
  // No training parameter: an inference-only kernel.
  const OpParam* training_arg = rule.param(ParamRole::kTraining);
  const bool training = training_arg != nullptr && BoolArg(n, training_arg).value_or(true);
  NodeInfo& info = a_.nodes_[id.value];
  info.arg = 0;
  SetOut(id, 0, Shard(d, x->info.outer, false));
  if (training && options_.sync_batchnorm) {
    // The statistics (and the running statistics updated from them) are
    // the global batch's: the expansion all-reduces them.
    info.detail = Detail::kSyncStats;
    a_.notes_.push_back(absl::StrCat(
        n.name, " (", TargetString(n),
        "): batch norm normalises with the global batch "
        "statistics (sync_batchnorm: all-reduced in forward and backward, as SyncBatchNorm); "
        "running statistics are updated from them"));
  } else if (training) {
    info.detail = Detail::kLocalStats;
    for (int k = 1; k < static_cast<int>(n.outputs.size()); ++k) {
      ValueInfo stats;
      stats.rank_local = true;
      SetOut(id, k, stats);
    }
    a_.notes_.push_back(
        absl::StrCat(n.name, " (", TargetString(n),
                     "): batch norm normalises with each rank's local batch "
                     "statistics, as DDP does; running statistics are updated from them"));
  } else {
    info.detail = Detail::kFromArg;
  }
  return absl::OkStatus();
}

absl::Status BatchDimAnalyzer::Spatial(NodeId id, const Node& n, const OpRule& rule) {
  std::vector<Operand> ops = Operands(n);
  FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule.linear, ops));
  Combined c;
  for (const Operand& o : ops) {
    if (!o.info.placement.is_shard()) continue;
    if (o.info.placement.dim != 0) {
      return Error(n, absl::StrFormat("arg %d (%s) holds the batch on dim %d; spatial ops "
                                      "(convolution, pooling) need it on dim 0",
                                      o.arg, g_.node(o.ref.node).name, o.info.placement.dim));
    }
    if (c.dim >= 0 && c.outer != o.info.outer) {
      return Error(n, absl::StrFormat("operands fold the batch differently into dim 0: arg %d "
                                      "(%s) in %d blocks, arg %d (%s) in %d blocks",
                                      c.arg, OperandName(ops, c.arg), c.outer, o.arg,
                                      g_.node(o.ref.node).name, o.info.outer));
    }
    if (c.dim < 0) c = {0, o.info.outer, o.arg};
  }
  if (c.dim >= 0) {
    FXDP_RETURN_IF_ERROR(RequireReplicatedArgs(n, ops, rule));
    // Every other operand is batched on dim 0 (an attention mask expanded to
    // the batch, pooling indices): a replicated one is built sharded or sliced.
    for (const Operand& o : ops) {
      if (!o.info.placement.is_replicate() || o.type->rank() == 0) continue;
      if (rule.replicated(o.arg)) continue;
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

}  // namespace fxdp
