// The balanced batch split (analysis/ir/batch_split.h): the first B % N ranks
// get one sample more, slices are contiguous and cover the batch; with
// micro-batches each rank holds its slice of each (RankRows).
#include "analysis/ir/batch_split.h"

#include <gtest/gtest.h>

#include <string>
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

// Ragged inputs: 7 bags of 17 tokens (lengths 4 1 3 2 3 2 2) over 3 ranks (3, 2, 2 bags): each
// rank reads the tokens of its bags, its offsets rebased to 0; together they are the whole text.
TEST(CutRagged, EachRankReadsItsBagsTokens) {
  const std::vector<int64_t> offsets = {0, 4, 5, 8, 10, 13, 15};
  using Spans = std::vector<std::pair<int64_t, int64_t>>;
  const auto cut = [&](int32_t r) { return CutRagged(offsets, 17, RankRows(7, 0, 3, r)); };
  ASSERT_TRUE(cut(0).ok()) << cut(0).status();
  EXPECT_EQ(cut(0)->spans, (Spans{{0, 8}}));
  EXPECT_EQ(cut(0)->offsets, (std::vector<int64_t>{0, 4, 5}));
  EXPECT_EQ(cut(1)->spans, (Spans{{8, 13}}));
  EXPECT_EQ(cut(1)->offsets, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(cut(2)->spans, (Spans{{13, 17}}));  // the last bag runs to the input's end
  EXPECT_EQ(cut(2)->offsets, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(cut(2)->length(), 4);
  // Micro-batches of 4 rows over 2 ranks: rows 0-1 and 4-5, concatenated.
  const auto micro = CutRagged(offsets, 17, RankRows(7, 4, 2, 0));
  ASSERT_TRUE(micro.ok());
  EXPECT_EQ(micro->spans, (Spans{{0, 5}, {10, 15}}));
  EXPECT_EQ(micro->offsets, (std::vector<int64_t>{0, 4, 5, 8}));
  // A first offset above 0 (tokens before it belong to no bag) cuts from it.
  EXPECT_EQ(CutRagged({2, 5}, 9, RankRows(2, 0, 2, 0))->spans, (Spans{{2, 5}}));
}

TEST(CutRagged, OffsetsThatDecreaseOrPassTheInputAreRefusedByElement) {
  const auto one = RankRows(3, 0, 1, 0);
  const absl::Status down = CutRagged({0, 5, 3}, 9, one).status();
  EXPECT_EQ(down.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(down.message().find("offsets[2] is 3, outside [5, 9]"), std::string::npos) << down;
  EXPECT_NE(CutRagged({0, 5, 10}, 9, one).status().message().find("offsets[2] is 10"),
            std::string::npos);
  EXPECT_NE(CutRagged({-1, 5, 6}, 9, one).status().message().find("offsets[0] is -1"),
            std::string::npos);
  EXPECT_FALSE(CutRagged({0, 5}, 9, one).ok());  // rows [0, 3) pass 2 offsets
}

TEST(RaggedKey, FormatAndParseRoundTrip) {
  const RaggedInputs in = {{"text", "offsets"}, {"weights", "offsets"}};
  EXPECT_EQ(FormatRagged(in), "text offsets\nweights offsets\n");
  EXPECT_EQ(*ParseRagged(FormatRagged(in)), in);
  EXPECT_EQ(ParseRagged("text\n").status().code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace fxdp::ir
