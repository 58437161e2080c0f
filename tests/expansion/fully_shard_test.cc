// FULLY_SHARD: the flat-shard layout (expansion/sharding.h) and the style option.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "analysis/ir/text.h"
#include "expansion/data_parallel.h"
#include "expansion/sharding.h"
#include "tests/test_util.h"

namespace fxdp {
namespace {

using ::fxdp::testing::ReadTestData;
using ::fxdp::testing::StatusIs;
using ::fxdp::testing::ValueOrDie;

TEST(FlatShard, EvenSplit) {
  for (int r = 0; r < 4; ++r) {
    const FlatShard f = FlatShardOf(12, 4, r);
    EXPECT_EQ(f.shard_numel, 3);
    EXPECT_EQ(f.begin, 3 * r);
    EXPECT_EQ(f.end, 3 * r + 3);
  }
}

TEST(FlatShard, UnevenSplitPadsTheLastRanks) {
  // 10 elements over 4 ranks: s = 3; ranks hold [0,3) [3,6) [6,9) [9,10) + 2 zeros.
  EXPECT_EQ(FlatShardOf(10, 4, 3).shard_numel, 3);
  EXPECT_EQ(FlatShardOf(10, 4, 3).begin, 9);
  EXPECT_EQ(FlatShardOf(10, 4, 3).end, 10);
  EXPECT_EQ(FlatShardOf(10, 4, 3).real(), 1);
  // 3 elements over 4 ranks: s = 1; rank 3 holds padding only.
  EXPECT_EQ(FlatShardOf(3, 4, 3).real(), 0);
  EXPECT_EQ(FlatShardOf(3, 4, 3).begin, 3);
  // Every element is held by exactly one rank, in order.
  for (int64_t n : {1, 5, 7, 12, 13, 1000003}) {
    for (int w : {1, 2, 3, 4, 7}) {
      int64_t next = 0;
      for (int r = 0; r < w; ++r) {
        const FlatShard f = FlatShardOf(n, w, r);
        EXPECT_EQ(f.begin, next);
        EXPECT_GE(f.shard_numel * w, n);
        EXPECT_LT(f.shard_numel * w - n, w);
        EXPECT_LE(f.real(), f.shard_numel);
        next = f.end;
      }
      EXPECT_EQ(next, n);
    }
  }
}

TEST(DataParallelStyle, Names) {
  EXPECT_EQ(ValueOrDie(ParseDataParallelStyle("fully_shard")), DataParallelStyle::kFullyShard);
  EXPECT_EQ(ValueOrDie(ParseDataParallelStyle("FULLY_SHARD")), DataParallelStyle::kFullyShard);
  EXPECT_EQ(ValueOrDie(ParseDataParallelStyle("replicate")), DataParallelStyle::kReplicate);
  EXPECT_THAT(ParseDataParallelStyle("zero2").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "expected 'replicate' or 'fully_shard'"));
  EXPECT_EQ(DataParallelStyleName(DataParallelStyle::kFullyShard), "fully_shard");
  EXPECT_EQ(ExpandOptions{}.style, DataParallelStyle::kReplicate);
}

}  // namespace
}  // namespace fxdp
