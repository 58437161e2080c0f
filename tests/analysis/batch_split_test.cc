// The balanced batch split (analysis/ir/batch_split.h): the first B % N ranks
// get one sample more, slices are contiguous and cover the batch.
#include "analysis/ir/batch_split.h"

#include <gtest/gtest.h>

namespace fxdp::ir {
namespace {

TEST(BatchSplit, FirstRanksGetTheRemainder) {
  const std::vector<RankSlice> s = SplitBatch(10, 4);
  ASSERT_EQ(s.size(), 4u);
  const int64_t want_start[] = {0, 3, 6, 8}, want_size[] = {3, 3, 2, 2};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(s[r].rank, r);
    EXPECT_EQ(s[r].start, want_start[r]) << r;
    EXPECT_EQ(s[r].size, want_size[r]) << r;
  }
}

TEST(BatchSplit, SliceForRankAgreesWithSplitBatchAndCoversTheBatch) {
  for (int64_t b : {1, 2, 7, 8, 33}) {
    for (int32_t n : {1, 2, 3, 5, 8}) {
      const std::vector<RankSlice> all = SplitBatch(b, n);
      int64_t next = 0;
      for (int32_t r = 0; r < n; ++r) {
        const RankSlice one = SliceForRank(b, n, r);
        EXPECT_EQ(one.start, all[r].start);
        EXPECT_EQ(one.size, all[r].size);
        EXPECT_EQ(one.start, next) << "b=" << b << " n=" << n << " r=" << r;
        EXPECT_LE(one.size - all[n - 1].size, 1);
        next += one.size;
      }
      EXPECT_EQ(next, b);
    }
  }
}

}  // namespace
}  // namespace fxdp::ir
