// The balanced split of a global batch over ranks: rank r gets the
// contiguous samples [start, start + size), the first B % N ranks one more
// than the others (B / N). The expansion sizes each rank's graph with it,
// the server and the workers slice batches with it: one definition.
#ifndef FXDP_ANALYSIS_IR_BATCH_SPLIT_H_
#define FXDP_ANALYSIS_IR_BATCH_SPLIT_H_

#include <cstdint>
#include <vector>

namespace fxdp::ir {

struct RankSlice {
  int32_t rank = 0;
  int64_t start = 0;  // first sample of the global batch.
  int64_t size = 0;   // B_r.
};

// Rank `rank`'s slice of `batch` samples over `world` ranks (world >= 1,
// 0 <= rank < world).
RankSlice SliceForRank(int64_t batch, int32_t world, int32_t rank);
// Every rank's slice, in rank order.
std::vector<RankSlice> SplitBatch(int64_t batch, int32_t world);

}  // namespace fxdp::ir

#endif  // FXDP_ANALYSIS_IR_BATCH_SPLIT_H_
