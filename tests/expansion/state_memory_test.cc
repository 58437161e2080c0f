// What each rank holds under a style (expansion/state_memory.h), read off the
// rank graphs, and how `fxdp analyze --style` shows the sharded state.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "analysis/ir/text.h"
#include "expansion/state_memory.h"
#include "tests/test_util.h"

namespace fxdp {
namespace {

using ::fxdp::testing::ReadTestData;
using ::fxdp::testing::ValueOrDie;
using ::testing::HasSubstr;

struct Styled {
  ir::Graph g;
  BatchDimAnalysis a;
  StyledAnalysis s;
};

Styled Analyze(DataParallelStyle style, int world) {
  ir::Graph g = ValueOrDie(ir::ParseGraphText(ReadTestData("mlp3_momentum.txt")));
  BatchDimAnalysis a = ValueOrDie(AnalyzeBatchDims(g, AnalyzeOptions{world}));
  ExpandOptions o;
  o.world_size = world;
  o.style = style;
  StyledAnalysis s = ValueOrDie(AnalyzeStyle(g, a, o));
  return {std::move(g), std::move(a), std::move(s)};
}

// mlp3_momentum: three f32[8, 8] weights (256 bytes each) and their momentum buffers.
TEST(StateMemory, ReplicateHoldsEverythingWhole) {
  const StateMemory m = Analyze(DataParallelStyle::kReplicate, 2).s.memory;
  EXPECT_EQ(m.parameter_bytes, 768);
  EXPECT_EQ(m.gradient_bytes, 768);
  EXPECT_EQ(m.optimizer_state_bytes, 768);
  EXPECT_EQ(m.other_state_bytes, 0);
  EXPECT_EQ(m.gathered_bytes, 0);
  EXPECT_EQ(m.largest_bucket_bytes, 768);  // one bucket of the three gradients
  EXPECT_EQ(m.total_bytes(), 4 * 768);
}

// Issue 17: a graph may declare thousands of tensors of up to 2^48 elements;
// their bytes overflowed int64 (a negative total passed the server's memory
// admission, and the overflow is undefined). The sums saturate.
TEST(StateMemory, SumsSaturateInsteadOfOverflowing) {
  std::string text = ReadTestData("mlp_sgd.txt");
  std::string big;
  for (int k = 0; k < 5000; ++k) {
    big += "  %big" + std::to_string(k) +
           ": f64[281474976710656] = placeholder() {role=BUFFER, state=\"big" + std::to_string(k) +
           "\"}\n";
  }
  const std::string after = "state=\"fc.bias\"}\n";
  text.insert(text.find(after) + after.size(), big);
  const ir::Graph g = ValueOrDie(ir::ParseGraphText(text));
  const StateMemory m = RankStateMemory(g, DataParallelStyle::kReplicate, 2);
  EXPECT_EQ(m.other_state_bytes, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(m.total_bytes(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(m.parameter_bytes, 60);
}

TEST(StateMemory, FullyShardHoldsShardsPlusTwoGatheredUnits) {
  // 64 elements over 3 ranks: s = 22 (2 of padding on the last rank), 88 bytes.
  const StateMemory m = Analyze(DataParallelStyle::kFullyShard, 3).s.memory;
  EXPECT_EQ(m.parameter_bytes, 3 * 88);
  EXPECT_EQ(m.gradient_bytes, 3 * 88);
  EXPECT_EQ(m.optimizer_state_bytes, 3 * 88);
  EXPECT_EQ(m.largest_unit_bytes, 3 * 3 * 88);  // one unit: the three weights, N * s each
  EXPECT_EQ(m.gathered_bytes, 2 * m.largest_unit_bytes);
  EXPECT_EQ(m.largest_bucket_bytes, 3 * 3 * 88);  // the reduce-scatter's input, whole
  EXPECT_EQ(m.total_bytes(), 3 * 3 * 88 + 2 * 792 + 792);
}

TEST(StyledAnalysis, ShardedStateIsS0WithTheReason) {
  Styled fs = Analyze(DataParallelStyle::kFullyShard, 3);
  ASSERT_EQ(fs.s.sharded_state.size(), 6u);
  ASSERT_EQ(fs.s.overrides.size(), 6u);
  const std::string table = StyledAnalysisToTable(fs.g, fs.a, fs.s);
  EXPECT_THAT(
      table,
      HasSubstr("S(0)       fully_shard: flat shard of 22 of 64 elements per rank (ceil(64 / 3)); "
                "parameter: each rank holds its flat shard"));
  EXPECT_THAT(table, HasSubstr("optimizer state with its parameter's numel"));
  EXPECT_THAT(table, HasSubstr("state per rank (fully_shard, 3 ranks): 3.1 KiB (3168 bytes)"));
  EXPECT_THAT(StyledAnalysisToJson(fs.g, fs.a, fs.s), HasSubstr("\"total_bytes\": 3168"));
  // Without a style the analysis prints what it always did; REPLICATE shards nothing.
  Styled rep = Analyze(DataParallelStyle::kReplicate, 3);
  EXPECT_TRUE(rep.s.overrides.empty());
  EXPECT_EQ(StyledAnalysisToTable(rep.g, rep.a, rep.s),
            AnalysisToTable(rep.g, rep.a) + StateMemoryToTable(rep.s.memory));
}

TEST(StateMemory, FormatBytes) {
  EXPECT_EQ(FormatBytes(512), "512 bytes");
  EXPECT_EQ(FormatBytes(70324272), "67.1 MiB (70324272 bytes)");
  EXPECT_EQ(FormatBytes(int64_t{3} << 30), "3.00 GiB (3221225472 bytes)");
}

}  // namespace
}  // namespace fxdp
