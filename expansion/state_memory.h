// What one rank holds under a data-parallel style, before it runs: the bytes
// of its training state, read off its expanded graph, and how `fxdp analyze
// --style` shows the state the style shards.
//
// Per rank (the rank graph's placeholders are the rank's own: flat [s]
// shards of the sharded state under FULLY_SHARD):
//   parameters       PARAMETER placeholders
//   gradients        one per trainable parameter (a node's grad_of names it,
//                    or its placeholder requires_grad), the size the rank
//                    keeps it: whole under REPLICATE, its shard under
//                    FULLY_SHARD
//   optimizer state  OPTIMIZER_STATE placeholders
//   other state      BUFFER, HYPERPARAMETER and CONSTANT placeholders
//   gathered         FULLY_SHARD: 2 x the largest all_gather_into_tensor
//                    output (a unit, whole, and its prefetched successor)
//   bucket           the largest all_reduce / reduce_scatter_tensor input
//                    (a gradient bucket, whole while it is reduced)
// The total is a lower bound of the step's peak: activations and the
// temporaries of each op come on top. The server refuses a job whose total
// exceeds a worker's registered memory (server/jobs/memory_admission.h).
#ifndef FXDP_EXPANSION_STATE_MEMORY_H_
#define FXDP_EXPANSION_STATE_MEMORY_H_

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "analysis/batch_dim.h"
#include "analysis/ir/graph.h"
#include "expansion/data_parallel.h"

namespace fxdp {

struct StateMemory {
  int32_t world_size = 1;
  DataParallelStyle style = DataParallelStyle::kReplicate;
  int64_t parameter_bytes = 0;
  int64_t gradient_bytes = 0;
  int64_t optimizer_state_bytes = 0;
  int64_t other_state_bytes = 0;
  int64_t largest_unit_bytes = 0;  // FULLY_SHARD: the largest gathered unit
  int64_t gathered_bytes = 0;      // 2 x largest_unit_bytes (0 for REPLICATE)
  int64_t largest_bucket_bytes = 0;

  // Saturating at INT64_MAX, as every sum here: a graph may declare many
  // tensors of up to 2^48 elements (ir::kMaxTensorElements), whose bytes
  // overflow an int64 (the total came out negative and passed admission).
  int64_t total_bytes() const {
    int64_t t = 0;
    for (int64_t b : {parameter_bytes, gradient_bytes, optimizer_state_bytes, other_state_bytes,
                      gathered_bytes, largest_bucket_bytes}) {
      t = AddBytes(t, b);
    }
    return t;
  }
  // a + b for byte counts >= 0, saturating at INT64_MAX.
  static int64_t AddBytes(int64_t a, int64_t b) {
    return a > std::numeric_limits<int64_t>::max() - b ? std::numeric_limits<int64_t>::max()
                                                       : a + b;
  }
};

// The state `rank_graph` (one rank's expanded graph, or the single-device
// graph with world 1) holds.
StateMemory RankStateMemory(const ir::Graph& rank_graph, DataParallelStyle style, int32_t world);

// The largest (by total) over the expansion's rank graphs.
StateMemory ExpansionStateMemory(const Expansion& e);

// "12.3 MiB (12901234 bytes)".
std::string FormatBytes(int64_t bytes);

// The summary `fxdp analyze --style` prints after the analysis:
//   state per rank (fully_shard, 2 ranks): 1.2 MiB (1234567 bytes)
//     parameters ...
std::string StateMemoryToTable(const StateMemory& m);

// Why a FULLY_SHARD state tensor is S(0) of its flat shard (the expansion
// report and `fxdp analyze --style fully_shard` say it).
std::string ShardedStateReason(const ShardedState& s);

// `fxdp analyze --style S`: the analysis seen through the expansion for S.
struct StyledAnalysis {
  DataParallelStyle style = DataParallelStyle::kReplicate;
  std::vector<ShardedState> sharded_state;
  // Sharded placeholders: node index -> (placement, reason).
  PlacementOverrides overrides;
  StateMemory memory;
};

// Expands `graph` with `options` (the analysis `a` was made with the same
// world size and sync_batchnorm) and collects the above; the expansion's
// error when the style cannot expand the graph.
absl::StatusOr<StyledAnalysis> AnalyzeStyle(const ir::Graph& graph, const BatchDimAnalysis& a,
                                            const ExpandOptions& options);

// AnalysisToJson with the overrides, plus "style" and "memory" (the fields
// of StateMemory, and "total_bytes").
std::string StyledAnalysisToJson(const ir::Graph& graph, const BatchDimAnalysis& a,
                                 const StyledAnalysis& s);
// AnalysisToTable with the overrides, then StateMemoryToTable.
std::string StyledAnalysisToTable(const ir::Graph& graph, const BatchDimAnalysis& a,
                                  const StyledAnalysis& s, bool with_source = false);

}  // namespace fxdp

#endif  // FXDP_EXPANSION_STATE_MEMORY_H_
