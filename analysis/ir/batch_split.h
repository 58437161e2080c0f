// Which global batch rows each rank holds: one definition for the expansion
// (it sizes each rank's graph), the server (it slices streamed batches) and
// the workers (batches they slice themselves, files, datasets), mirrored by
// client/python/fxdp/dp_oracle.py's rank_rows (the tests' oracle).
//
// Without micro-batches rank r gets the contiguous samples [start, start +
// size), the first B % N ranks one more than the others (B / N): SliceForRank.
// With micro-batches (a step that splits its batch into pieces of `micro`
// rows, x.chunk(k) / x.split(micro): piece j is rows [j*micro, min((j+1)*micro,
// B))), rank r gets its balanced share of EACH piece, concatenated in piece
// order (RankRows): micro-batch j gathered over the ranks in rank order is one
// device's micro-batch j, so a per-micro-batch mean (a loss over padded
// tokens, whose count is all-reduced per micro-batch) equals one device's.
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

// The rank graph metadata key of a step with micro-batches: the micro-batch
// size in rows (decimal), what RankRows takes as `micro`. Absent: none.
inline constexpr char kMicroBatchKey[] = "fxdp.micro_batch";

// The global rows rank `rank` holds, in the order its graph reads them: one
// range per micro-batch of `micro` rows (micro <= 0 or >= batch: one range,
// SliceForRank). A range may be empty (a last micro-batch smaller than the
// world size).
std::vector<RankSlice> RankRows(int64_t batch, int64_t micro, int32_t world, int32_t rank);
// The number of rows RankRows gives: sum of the sizes.
int64_t RowCount(const std::vector<RankSlice>& rows);

}  // namespace fxdp::ir

#endif  // FXDP_ANALYSIS_IR_BATCH_SPLIT_H_
