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

std::vector<RankSlice> RankRows(int64_t batch, int64_t micro, int32_t world, int32_t rank) {
  if (micro <= 0 || micro >= batch) return {SliceForRank(batch, world, rank)};
  std::vector<RankSlice> out;
  for (int64_t first = 0; first < batch; first += micro) {
    RankSlice s = SliceForRank(std::min(micro, batch - first), world, rank);
    s.start += first;
    out.push_back(s);
  }
  return out;
}

int64_t RowCount(const std::vector<RankSlice>& rows) {
  int64_t n = 0;
  for (const RankSlice& s : rows) n += s.size;
  return n;
}

}  // namespace fxdp::ir
