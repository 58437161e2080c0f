// The balanced batch split (analysis/ir/batch_split.h): the first B % N ranks
// get one sample more, slices are contiguous and cover the batch; with
// micro-batches each rank holds its slice of each (RankRows).
#include "analysis/ir/batch_split.h"

#include <gtest/gtest.h>

#include <utility>
#include <vector>

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

// Micro-batches (docs/shapes.md, step 8): rank r holds its share of each micro-batch. 8 rows in
// micro-batches of 4 over 3 ranks: micro-batch 0 is rows 0-3 (ranks get 2, 1, 1), micro-batch 1
// rows 4-7.
TEST(RankRows, EachRankGetsItsShareOfEachMicroBatch) {
  auto ranges = [](int64_t b, int64_t micro, int32_t n, int32_t r) {
    std::vector<std::pair<int64_t, int64_t>> out;
    for (const RankSlice& s : RankRows(b, micro, n, r)) out.emplace_back(s.start, s.size);
    return out;
  };
  using R = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(ranges(8, 4, 3, 0), (R{{0, 2}, {4, 2}}));
  EXPECT_EQ(ranges(8, 4, 3, 1), (R{{2, 1}, {6, 1}}));
  EXPECT_EQ(ranges(8, 4, 3, 2), (R{{3, 1}, {7, 1}}));
  EXPECT_EQ(ranges(8, 4, 2, 1), (R{{2, 2}, {6, 2}}));
  // chunk(2) of 5 rows: micro-batches of 3 and 2.
  EXPECT_EQ(ranges(5, 3, 2, 0), (R{{0, 2}, {3, 1}}));
  EXPECT_EQ(ranges(5, 3, 2, 1), (R{{2, 1}, {4, 1}}));
  // No micro-batches (0, or one piece of the whole batch): SliceForRank.
  EXPECT_EQ(ranges(10, 0, 4, 1), (R{{3, 3}}));
  EXPECT_EQ(ranges(10, 10, 4, 3), (R{{8, 2}}));
}

TEST(RankRows, TheRanksTogetherHoldEveryRowOnce) {
  for (int64_t b : {1, 2, 7, 8, 33}) {
    for (int64_t micro : {0, 1, 2, 3, 4, 8}) {
      for (int32_t n : {1, 2, 3, 5}) {
        std::vector<int> seen(b, 0);
        int64_t total = 0;
        for (int32_t r = 0; r < n; ++r) {
          const std::vector<RankSlice> rows = RankRows(b, micro, n, r);
          for (const RankSlice& s : rows) {
            for (int64_t i = s.start; i < s.start + s.size; ++i) ++seen[i];
          }
          total += RowCount(rows);
        }
        EXPECT_EQ(total, b) << "b=" << b << " micro=" << micro << " n=" << n;
        for (int64_t i = 0; i < b; ++i) EXPECT_EQ(seen[i], 1) << "row " << i;
      }
    }
  }
}

}  // namespace
}  // namespace fxdp::ir
