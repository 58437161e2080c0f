// FULLY_SHARD (ZeRO-3, FSDP2's fully_shard) as a graph rewrite: the plan.
//
// Each rank holds a flat shard (analysis/ir/flat_shard.h) of every PARAMETER and
// of every OPTIMIZER_STATE tensor tied to a parameter with the same numel
// ("optim.<param>.exp_avg", "...exp_avg_sq", "...momentum_buffer"). Buffers,
// scalar optimizer state (step), hyper-parameters and constants stay whole;
// inputs are batch-sharded as in REPLICATE.
//
// The step's nodes fall in three phases:
//   forward    ancestors of the loss (and of the other non-state outputs and
//              updated buffers): they read the all-gathered parameters;
//   backward   the other ancestors of the gradients: they read parameters
//              all-gathered again (the forward copy is freed after its last
//              forward use; views of a parameter forward made, such as
//              t(weight), are recomputed from the new copy);
//   optimizer  the rest: they run on the [s] shards. Elementwise ops
//              (OpFamily kPointwise/kLike) with 0-d operands work as they are
//              and keep the padding zero (0 -> 0 for SGD, momentum, Adam,
//              AdamW with weight decay), elementwise _foreach_ ops too, and
//              2-norms of shards (clip_grad_norm_) become partial: squared,
//              all-reduced, square-rooted. Any other op on sharded state is
//              refused naming the node.
//
// Units: parameters in the order forward first reads them, packed until a
// unit reaches bucket_cap_mb (DDP's cap; one dtype per unit). Before a unit's
// first forward use its shards are concatenated, all_gather_into_tensor'ed and
// waited on, and every parameter is cut out of the [N, sum s_i] result; the
// next unit's all-gather is started right then (prefetch, one unit ahead).
// Backward does the same in the order it first reads the units. Gradients are
// packed in REPLICATE's buckets (production order, DDP's caps), each padded to
// N * s_i, laid out [N, sum s_i], scaled as REPLICATE scales them (1/N or
// B_r/B) and reduce_scatter_tensor'ed; the wait sits before the optimizer's
// first use, and expansion/schedule.h overlaps the reduce-scatters with the
// rest of backward and the optimizer as it does all-reduces.
#ifndef FXDP_EXPANSION_FULLY_SHARD_H_
#define FXDP_EXPANSION_FULLY_SHARD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "analysis/batch_dim.h"
#include "analysis/ir/graph.h"
#include "expansion/data_parallel.h"

namespace fxdp {

enum class ShardPhase : uint8_t { kInput, kForward, kBackward, kOptimizer };

// One gather: a unit's parameters, all-gathered before `position` (a node of
// the input graph) for `phase`; `params` are the placeholders cut out of it
// (the ones that phase reads).
struct GatherEvent {
  int32_t unit = 0;
  ShardPhase phase = ShardPhase::kForward;
  int32_t position = 0;
  std::vector<int32_t> params;  // placeholder node indices, in unit order.
};

struct FullyShardPlan {
  int32_t world_size = 1;
  // Placeholder node index -> its shard; sharded_state lists them in order.
  absl::flat_hash_map<int32_t, ShardedState> sharded;
  std::vector<ShardedState> sharded_state;
  std::vector<ShardPhase> phase;  // per node of the input graph
  // Forward nodes computed from parameters only (views and casts of a
  // weight): backward reads its own copies, recomputed from its gather.
  std::vector<bool> param_derived;
  // Per optimizer node: for each output the optimizer computes on shards, the
  // numel of the whole tensor it is a shard of (-1: not a shard); empty for
  // nodes that do not run on shards.
  std::vector<std::vector<int64_t>> out_shards;
  // Optimizer nodes that take 2-norms of shards (clip_grad_norm_'s
  // linalg_vector_norm, _foreach_norm): their results are this rank's part,
  // squared, all-reduced and square-rooted into the whole tensors' norms.
  std::vector<bool> partial_norm;
  // Optimizer views of a shard (t, view, reshape, ...): the rank graph reads
  // the shard itself; `perm` holds, for transposed ones, which dim of the
  // whole tensor each of its dims is.
  std::vector<bool> alias;
  absl::flat_hash_map<ir::ValueRef, std::vector<int32_t>> perm;
  // Units: placeholder node indices, in forward first-use order.
  std::vector<std::vector<int32_t>> units;
  std::vector<int64_t> unit_bytes;  // gathered (N * s) bytes of each unit
  // Forward gathers, then backward gathers, in the order they are waited on.
  std::vector<GatherEvent> gathers;
};

// INVALID_ARGUMENT naming the node for what the rewrite cannot do (a
// non-elementwise op on sharded state, forward or backward reading sharded
// optimizer state or a gradient, ...).
absl::StatusOr<FullyShardPlan> PlanFullyShard(const ir::Graph& g, const BatchDimAnalysis& a,
                                              const ExpandOptions& o);

// Whether an optimizer-phase node of this op can run on flat shards as it is.
bool RunsOnShards(const ir::Node& n);

}  // namespace fxdp

#endif  // FXDP_EXPANSION_FULLY_SHARD_H_
