// Synchronized batch norm (ExpandOptions::sync_batchnorm): the per-rank
// rewrite of batch norm in training so that N ranks normalise with the
// statistics of the global batch, as torch's SyncBatchNorm under DDP, and
// train exactly like one device.
//
// A batch-norm forward whose input is batch-sharded (the analysis' kSyncStats)
// becomes, per channel c over every dim but 1 (n = the global batch's
// elements per channel, known at compile time, so uneven splits need no
// counts on the wire):
//
//   mean   = all_reduce(sum(x)) / n
//   xmu    = x - mean
//   var    = all_reduce(sum(xmu * xmu)) / n          (two passes, as the CPU kernel)
//   invstd = rsqrt(var + eps)
//   out    = xmu * (invstd * weight) + bias
//   running_mean' = (1 - m) * running_mean + m * mean
//   running_var'  = (1 - m) * running_var  + m * all_reduce(...) / (n - 1)
//
// and native_batch_norm_backward (train=true) becomes SyncBatchNorm's
// backward: the local sums sum(dy) and sum(dy * xmu) are all-reduced in one
// collective for grad_input, while grad_weight = sum(dy * xmu) * invstd and
// grad_bias = sum(dy) stay the rank's partial sums (reduced with the other
// gradients in buckets, as DDP reduces SyncBatchNorm's):
//
//   grad_input = (dy - S(dy) f - xmu * invstd^2 * S(dy xmu) f) * invstd * weight
//
// where S is the all-reduced sum and f = 1/n. When dy descends from a mean
// over the local batch (the analysis' mean_scaled: rank r holds B/B_r times
// its slice) and the split is uneven, each rank's sums are weighted by B_r/B
// before the sum and f = B / (B_r n), so every rank's grad_input keeps dy's
// scale; with an even split the unweighted sum already has it.
//
// Every op used is an ordinary aten op that runs on CPU and CUDA (sum, sub,
// mul, div, rsqrt, add, cat, slice, view); the collectives are
// _c10d_functional::all_reduce(sum) + wait_tensor, emitted by the expansion.
#ifndef FXDP_EXPANSION_SYNC_BATCHNORM_H_
#define FXDP_EXPANSION_SYNC_BATCHNORM_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "analysis/ir/graph.h"

namespace fxdp {

// What a rewrite needs from the expansion: appending nodes to the rank graph.
class RankGraphBuilder {
 public:
  virtual ~RankGraphBuilder() = default;
  // Appends a call with one tensor output (name: `base`, made unique).
  virtual ir::ValueRef Add(absl::string_view base, absl::string_view target,
                           absl::string_view overload, std::vector<ir::Argument> args,
                           ir::TensorType type) = 0;
  // all_reduce(sum) of `v` (multiplied by `weight` first unless it is 1) and
  // its wait; `purpose` names it in the expansion report.
  virtual ir::ValueRef AllReduceSum(ir::ValueRef v, const ir::TensorType& t, double weight,
                                    const std::string& purpose) = 0;
};

enum class SyncBatchNormRole : int8_t { kNone, kForward, kBackward };

// kForward for the batch-norm forward ops, kBackward for
// native_batch_norm_backward, else kNone. Whether a node is rewritten also
// depends on the analysis (a batch-sharded input, training).
SyncBatchNormRole SyncBatchNormRoleOf(const ir::Node& n);

// Whether a native_batch_norm_backward node is in training mode (`train`).
bool BatchNormBackwardTrains(const ir::Node& n);

// One batch-norm node to rewrite on one rank.
struct SyncBatchNormSite {
  const ir::Node* node = nullptr;      // the single-device node
  std::vector<ir::Argument> args;      // its arguments, mapped into the rank graph
  std::vector<ir::ValueType> outputs;  // its output types on this rank (local shapes)
  ir::TensorType input;                // the normalised input's type on this rank
  int64_t global_count = 0;            // elements per channel in the global batch
  // Backward: the all-reduce weight of the local sums and the factor that
  // turns the all-reduced sums into this rank's means (see above).
  double grad_weight = 1.0;
  double grad_factor = 0.0;
};

// The rewrite of `site`: one value per output of the original node (nullopt
// for outputs that are not tensors). INVALID_ARGUMENT naming the node for an
// op whose running statistics are updated in place, missing arguments, or an
// input whose dtype differs from the statistics'.
absl::StatusOr<std::vector<std::optional<ir::ValueRef>>> EmitSyncBatchNorm(
    const SyncBatchNormSite& site, RankGraphBuilder& builder);

}  // namespace fxdp

#endif  // FXDP_EXPANSION_SYNC_BATCHNORM_H_
