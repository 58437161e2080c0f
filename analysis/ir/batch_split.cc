#include "analysis/ir/batch_split.h"

#include <algorithm>

namespace fxdp::ir {

RankSlice SliceForRank(int64_t batch, int32_t world, int32_t rank) {
  const int64_t base = batch / world, extra = batch % world;
  return RankSlice{rank, rank * base + std::min<int64_t>(rank, extra),
                   base + (rank < extra ? 1 : 0)};
}

std::vector<RankSlice> SplitBatch(int64_t batch, int32_t world) {
  std::vector<RankSlice> out;
  out.reserve(world);
  for (int32_t r = 0; r < world; ++r) out.push_back(SliceForRank(batch, world, r));
  return out;
}

}  // namespace fxdp::ir
