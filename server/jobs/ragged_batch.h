// Ragged inputs on the server (issue 23): a step whose rank graphs list
// ragged inputs (ir::kRaggedKey: a flat 1-D INPUT of bags, EmbeddingBag's
// text, whose samples its OFFSETS input starts) sends each rank only its
// bags' part of each such input and its rows of the offsets rebased to that
// part (ir::CutRagged), not the whole input and the global offsets. The rank
// graph declares the input at its global length, an upper bound of what the
// rank gets. Several ragged inputs may share one OFFSETS (text and
// per_sample_weights): each is cut by the same rows. No gRPC here.
#ifndef FXDP_SERVER_JOBS_RAGGED_BATCH_H_
#define FXDP_SERVER_JOBS_RAGGED_BATCH_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "analysis/ir/batch_split.h"
#include "proto/fxdp/v1/compile.pb.h"
#include "proto/fxdp/v1/worker.pb.h"
#include "server/jobs/raw_tensors.h"

namespace fxdp::server {

// Each batch INPUT's rows per rank, by name ([r]: the ranges of the global
// batch rank r holds, in its graph's order): batch_sharder.h's RankRowsOf.
using RankRows = std::map<std::string, std::vector<std::vector<ir::RankSlice>>>;

// The (INPUT, OFFSETS) pairs the rank graphs of `expanded` list under
// ir::kRaggedKey (none: empty). INTERNAL when a value does not parse or two
// rank graphs list different pairs.
absl::StatusOr<ir::RaggedInputs> RaggedOf(const v1::ExpandResponse& expanded);

// One step's ragged inputs cut for every rank.
struct RaggedCuts {
  std::map<std::string, std::vector<ir::RaggedCut>> inputs;  // per ragged INPUT: [rank]
  std::map<std::string, std::string> offsets;                // per OFFSETS: the first INPUT it cuts
  bool empty() const { return inputs.empty(); }
};

// The ragged inputs `ragged` of a step's global batch `tensors` cut for each
// of `world` ranks by its `rows` of their offsets (ir::CutRagged over the
// offsets' values, int64 or int32). INVALID_ARGUMENT naming the inputs and
// the element (CutRagged's message), or the offsets' dtype; INTERNAL when a
// pair names a tensor the batch lacks, a ragged input has a batch dim or
// is not 1-D, or the offsets have no rows for every rank.
absl::StatusOr<RaggedCuts> CutRaggedBatch(const ir::RaggedInputs& ragged,
                                          const std::vector<RawTensor>& tensors,
                                          const RankRows& rows, int world);

// Rank `rank`'s part of `t` when `cuts` cut it: a ragged input's spans
// concatenated, or its offsets' rows rebased (in t's dtype), as `c`'s data
// and shape. False (c untouched) when `t` is neither.
absl::StatusOr<bool> RaggedRankTensor(const RaggedCuts& cuts, const RawTensor& t, int rank,
                                      v1::TensorChunk* c);

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_RAGGED_BATCH_H_
