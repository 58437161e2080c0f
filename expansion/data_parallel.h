// Data-parallel expansion: rewrites an analysed single-device training step
// into the graph each of N ranks runs.
//
//   * Batch inputs become the rank's contiguous slice along their batch dim
//     (balanced: the first B % N ranks get one extra sample); with
//     micro-batches (x.chunk(k)), its slice of each micro-batch, concatenated
//     (ir::RankRows; the rank graphs' metadata ir::kMicroBatchKey says so).
//   * Every value sharded on the batch gets its local shape, and every
//     argument that spells a global batch-sized extent (view/reshape/expand
//     sizes, factory sizes, select/slice_backward input sizes) the local one.
//     Scalar literals are kept: the analysis' placements already account for
//     them (batch_dim.h).
//   * Partial gradients are flattened into buckets in the order backward
//     produces them (DDP's caps: the first bucket 1 MiB, then 25 MiB, and the
//     last one split again from its end: ExpandOptions::last_bucket_mb), scaled
//     by the rank's weight (1/N, or B_r/B for an uneven split of a mean) and
//     summed with `_c10d_functional::all_reduce` right after the bucket's last
//     gradient is produced; `_c10d_functional::wait_tensor` sits right before
//     the first use of any of its gradients, so communication overlaps the rest
//     of backward. Sum-then-scale works on Gloo, which has no AVG.
//   * The loss output becomes the global loss (all-reduced); the rank-local
//     loss is an extra OTHER output named "local_loss".
//   * Then the graph is reordered for overlap (expansion/schedule.h): every
//     all_reduce starts as soon as its input can be computed, and the
//     optimizer updates of each bucket run before the next bucket is waited
//     on (ExpandOptions::overlap_schedule).
//   * Replicated values a sharded use reads by rows are sliced locally.
//   * With ExpandOptions::sync_batchnorm, batch norm in training is rewritten
//     to normalise with the global batch's statistics (sync_batchnorm.h).
//   * Each rank's graph is checked against the ops' shape rules
//     (expansion/shape_check.h): a size left global is an error here.
//
// The result is a standard torch graph: torch.fx can run it under a process
// group whose name is ExpandOptions::group_name.
#ifndef FXDP_EXPANSION_DATA_PARALLEL_H_
#define FXDP_EXPANSION_DATA_PARALLEL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "analysis/batch_dim.h"
#include "analysis/ir/batch_split.h"
#include "analysis/ir/graph.h"

namespace fxdp {

// How state is held across ranks (torch's ShardingStrategy / fully_shard).
//   kReplicate   every rank holds every parameter, buffer and optimizer-state
//                tensor whole; gradients are all-reduced (DDP).
//   kFullyShard  every rank holds a flat 1/N shard (analysis/ir/flat_shard.h) of
//                each parameter, its gradient and its optimizer state;
//                parameters are all-gathered before use and gradients
//                reduce-scattered (ZeRO-3, FSDP's FULL_SHARD, FSDP2's
//                fully_shard). See expansion/fully_shard.h, docs/fully_shard.md.
enum class DataParallelStyle { kReplicate, kFullyShard };
// "replicate", "fully_shard".
absl::string_view DataParallelStyleName(DataParallelStyle s);
// Case-insensitive "replicate" / "fully_shard" (also "full_shard", "FULLY_SHARD");
// INVALID_ARGUMENT naming the accepted values otherwise.
absl::StatusOr<DataParallelStyle> ParseDataParallelStyle(absl::string_view s);

struct ExpandOptions {
  int32_t world_size = 1;
  DataParallelStyle style = DataParallelStyle::kReplicate;
  double bucket_cap_mb = 25.0;   // DDP's bucket_cap_mb.
  double first_bucket_mb = 1.0;  // DDP's first bucket.
  std::string group_name = "0";  // the default process group's name in torch.
  // Not DDP's: the bucket backward fills last (DDP's caps let it grow to
  // bucket_cap_mb) is split again from its end, with DDP's closing rule (a
  // bucket closes once it reaches its cap) and caps of last_bucket_mb,
  // 2x, 4x, ... (at most bucket_cap_mb); the front piece left over is a
  // bucket if it holds at least half its cap, else it joins the next one.
  // The last all-reduce, which nothing in backward hides, is then small and
  // hidden behind the updates of the buckets before it; the others start
  // earlier. A last bucket under last_bucket_mb is left alone. 0: DDP's
  // buckets unchanged.
  double last_bucket_mb = 1.0;
  // Reorder the expanded graph for overlap (expansion/schedule.h): every
  // all_reduce starts as soon as its input exists, and the optimizer updates
  // of bucket k run before bucket k+1 is waited on, while it is in flight.
  bool overlap_schedule = true;
  // Batch norm in training uses the global batch's statistics, all-reduced in
  // forward and backward (expansion/sync_batchnorm.h), so BatchNorm models
  // train exactly like one device; the analysis must have been run with
  // AnalyzeOptions::sync_batchnorm too. Default: local statistics, as DDP.
  bool sync_batchnorm = false;
  // Called with the number of rank graphs about to be built (1 when every
  // rank runs the same graph, else world_size) before any is: a status that
  // is not OK ends the expansion with it (a server's cost limits). Unset:
  // no check.
  std::function<absl::Status(int32_t rank_graphs)> before_rank_graphs;
};

// Rank r's contiguous slice of the global batch (analysis/ir/batch_split.h).
using ir::RankSlice;

struct Bucket {
  int32_t index = 0;
  std::vector<std::string> gradients;  // parameter names, in production order.
  int64_t bytes = 0;
  ReduceOp op = ReduceOp::kSum;
  std::string start_after;     // node after which the all-reduce starts (global graph).
  std::string wait_before;     // node before which it is waited on.
  int32_t start_position = 0;  // node index in the global graph.
  int32_t wait_position = 0;
};

struct Collective {
  std::string node;     // all_reduce node name in the expanded graph.
  std::string purpose;  // "bucket 0", "loss", "reduce <value>".
  int64_t bytes = 0;
  int32_t position = 0;  // index in rank 0's expanded graph.
  // The op without its namespace: "all_reduce", "all_gather_into_tensor" or
  // "reduce_scatter_tensor".
  std::string op = "all_reduce";
};

// One state tensor FULLY_SHARD keeps as flat shards (analysis/ir/flat_shard.h):
// each rank's placeholder for it is 1-D with shard_numel elements.
struct ShardedState {
  std::string state_name;
  ir::PlaceholderRole role = ir::PlaceholderRole::kParameter;  // PARAMETER or OPTIMIZER_STATE
  std::vector<int64_t> shape;                                  // the full tensor's.
  ir::DType dtype = ir::DType::kFloat32;
  int64_t shard_numel = 0;  // s = ceil(numel / N).
};

struct ExpansionReport {
  int32_t world_size = 1;
  DataParallelStyle style = DataParallelStyle::kReplicate;
  // FULLY_SHARD: the sharded state, in placeholder order (empty for REPLICATE).
  std::vector<ShardedState> sharded_state;
  // The batch size B, and each rank's slice of it; with micro-batches, of one
  // micro-batch (the step's batch is micro_batches * B rows) and rank r holds
  // rank_rows[r] of the step's batch (ir::RankRows: its slice of each).
  int64_t batch_size = 0;
  std::vector<RankSlice> slices;
  int64_t micro_batches = 1;
  std::vector<std::vector<RankSlice>> rank_rows;  // empty without micro-batches
  std::vector<Bucket> buckets;
  std::vector<Collective> collectives;  // rank 0's.
  int64_t bytes_per_step = 0;           // all-reduced bytes per rank per step (all_reduce only).
  int64_t bytes_gathered_per_step = 0;  // all_gather_into_tensor's output bytes per rank per step.
  int64_t bytes_reduce_scattered_per_step = 0;  // reduce_scatter_tensor's input bytes.
  int32_t sharded_reads = 0;
  // Batch-norm statistics in training: "none" (no such node), "local" (each
  // rank's, as DDP) or "global" (sync_batchnorm).
  std::string batch_norm = "none";
  std::vector<std::string> notes;

  std::string ToJson() const;
  std::string ToTable() const;
};

struct Expansion {
  // The distinct rank graphs: one shared by every rank when `identical`, else
  // one per rank. Read rank r's through graph(r).
  std::vector<ir::Graph> distinct_graphs;
  // Whether every rank's graph is the same (B % N == 0 and no rank-specific
  // slices): then it is built and stored once.
  bool identical = false;
  // FULLY_SHARD: the state each rank holds as a flat shard (the same list as
  // report.sharded_state); everything else is whole on every rank.
  std::vector<ShardedState> sharded_state;
  ExpansionReport report;

  int32_t world_size() const { return report.world_size; }
  // Rank r's graph, 0 <= r < world_size().
  const ir::Graph& graph(int32_t rank) const {
    return distinct_graphs[identical ? 0 : static_cast<size_t>(rank)];
  }
};

// INVALID_ARGUMENT for: world size < 1 or larger than the batch, a graph
// without a batched input, a graph without gradients marked (grad_of),
// placements the expansion cannot realise.
absl::StatusOr<Expansion> ExpandDataParallel(const ir::Graph& graph,
                                             const BatchDimAnalysis& analysis,
                                             const ExpandOptions& options);

// The balanced split of `batch` samples over `world` ranks.
using ir::SplitBatch;

}  // namespace fxdp

#endif  // FXDP_EXPANSION_DATA_PARALLEL_H_
