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
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

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

// Ragged inputs (issue 23): a flat 1-D INPUT whose samples are bags of
// varying length, sample i being [offsets[i], offsets[i + 1]) and the last
// one running to the input's end (the text classification tutorial's text,
// offsets = cumsum([0] + lengths[:-1]), read by _embedding_bag). The input has
// no batch dim of its own; the analysis finds it (BatchDimAnalysis::ragged)
// and the expansion lists it in every rank graph's metadata under this key, one
// line per input: "INPUT OFFSETS" (the two INPUTs' state names, the batch's
// tensor names: "input.0 input.1"). A rank then reads
// only its bags' part of INPUT and its rows of OFFSETS rebased to that part
// (CutRagged); its graph declares INPUT at the global length, an upper bound.
inline constexpr char kRaggedKey[] = "fxdp.ragged";

// (INPUT, OFFSETS) pairs, in order.
using RaggedInputs = std::vector<std::pair<std::string, std::string>>;
// The metadata value of `inputs`, and back. ParseRagged: INTERNAL naming the
// line that is not two names.
std::string FormatRagged(const RaggedInputs& inputs);
absl::StatusOr<RaggedInputs> ParseRagged(const std::string& value);

// A rank's part of a ragged input of `length` elements whose global offsets
// are `offsets` (one per sample), for the rows `rows` (RankRows): the spans
// of the input it reads, concatenated in order, and its offsets into that
// concatenation (one per row).
struct RaggedCut {
  std::vector<std::pair<int64_t, int64_t>> spans;  // [begin, end) of the input
  std::vector<int64_t> offsets;
  int64_t length() const;  // of the concatenated spans
};
// INVALID_ARGUMENT, naming the element, when the offsets decrease, are
// negative or pass `length`, or `rows` pass the offsets.
absl::StatusOr<RaggedCut> CutRagged(const std::vector<int64_t>& offsets, int64_t length,
                                    const std::vector<RankSlice>& rows);

}  // namespace fxdp::ir

#endif  // FXDP_ANALYSIS_IR_BATCH_SPLIT_H_
