// FULLY_SHARD: the flat-shard layout (analysis/ir/flat_shard.h) and the style option.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <vector>

#include "analysis/ir/flat_shard.h"
#include "analysis/ir/proto_codec.h"
#include "analysis/ir/text.h"
#include "expansion/data_parallel.h"
#include "tests/expansion/expand_util.h"
#include "tests/test_util.h"

namespace fxdp {
namespace {

using ::fxdp::testing::Count;
using ::fxdp::testing::ExpandText;
using ::fxdp::testing::Find;
using ::fxdp::testing::IndexOf;
using ::fxdp::testing::ReadTestData;
using ::fxdp::testing::StatusIs;
using ::fxdp::testing::ValueOrDie;

TEST(FlatShard, EvenSplit) {
  for (int r = 0; r < 4; ++r) {
    const ir::FlatShard f = ir::FlatShardOf(12, 4, r);
    EXPECT_EQ(f.shard_numel, 3);
    EXPECT_EQ(f.begin, 3 * r);
    EXPECT_EQ(f.end, 3 * r + 3);
  }
}

TEST(FlatShard, UnevenSplitPadsTheLastRanks) {
  // 10 elements over 4 ranks: s = 3; ranks hold [0,3) [3,6) [6,9) [9,10) + 2 zeros.
  EXPECT_EQ(ir::FlatShardOf(10, 4, 3).shard_numel, 3);
  EXPECT_EQ(ir::FlatShardOf(10, 4, 3).begin, 9);
  EXPECT_EQ(ir::FlatShardOf(10, 4, 3).end, 10);
  EXPECT_EQ(ir::FlatShardOf(10, 4, 3).real(), 1);
  // 3 elements over 4 ranks: s = 1; rank 3 holds padding only.
  EXPECT_EQ(ir::FlatShardOf(3, 4, 3).real(), 0);
  EXPECT_EQ(ir::FlatShardOf(3, 4, 3).begin, 3);
  // Every element is held by exactly one rank, in order.
  for (int64_t n : {1, 5, 7, 12, 13, 1000003}) {
    for (int w : {1, 2, 3, 4, 7}) {
      int64_t next = 0;
      for (int r = 0; r < w; ++r) {
        const ir::FlatShard f = ir::FlatShardOf(n, w, r);
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
  EXPECT_THAT(
      ParseDataParallelStyle("zero2").status(),
      StatusIs(absl::StatusCode::kInvalidArgument, "expected 'replicate' or 'fully_shard'"));
  EXPECT_EQ(DataParallelStyleName(DataParallelStyle::kFullyShard), "fully_shard");
  EXPECT_EQ(ExpandOptions{}.style, DataParallelStyle::kReplicate);
}

constexpr DataParallelStyle kFs = DataParallelStyle::kFullyShard;

TEST(FullyShard, MlpShardsParametersGathersThemAndReduceScattersGradients) {
  // fc.weight [3, 4] (12 over 3 ranks: s = 4), fc.bias [3] (s = 1); batch 8 -> 3, 3, 2.
  Expansion e =
      ValueOrDie(ExpandText(ReadTestData("mlp_sgd.txt"), {.world_size = 3, .style = kFs}));
  ASSERT_EQ(e.sharded_state.size(), 2u);
  EXPECT_EQ(e.sharded_state[0].state_name, "fc.weight");
  EXPECT_EQ(e.sharded_state[0].shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(e.sharded_state[0].shard_numel, 4);
  EXPECT_EQ(e.sharded_state[1].shard_numel, 1);
  EXPECT_EQ(e.report.style, kFs);
  for (int r = 0; r < 3; ++r) {
    const ir::Graph& g = e.graph(r);
    EXPECT_EQ(Find(g, "w").outputs[0].tensor.shape, (std::vector<int64_t>{4}));
    EXPECT_EQ(Find(g, "w").placeholder.state_name, "fc.weight");
    EXPECT_EQ(Find(g, "b").outputs[0].tensor.shape, (std::vector<int64_t>{1}));
    EXPECT_EQ(Count(g, "_c10d_functional::all_gather_into_tensor"), 1);
    EXPECT_EQ(Count(g, "_c10d_functional::reduce_scatter_tensor"), 1);
    EXPECT_EQ(Count(g, "_c10d_functional::all_reduce"), 1);  // the loss
    // The updates run on shards.
    EXPECT_EQ(Find(g, "new_w").outputs[0].tensor.shape, (std::vector<int64_t>{4}));
    EXPECT_EQ(Find(g, "new_b").outputs[0].tensor.shape, (std::vector<int64_t>{1}));
    // Forward reads the gathered weight, whole.
    const ir::Node& t = Find(g, "t");
    EXPECT_EQ(g.type(t.args[0].as<ir::ValueRef>()).tensor.shape, (std::vector<int64_t>{3, 4}));
    // The all-gather is waited on before forward's first use of the unit.
    EXPECT_LT(IndexOf(g, "fxdp_wait_unit0"), IndexOf(g, "t"));
    EXPECT_EQ(Find(g, "fxdp_all_gather_unit0").outputs[0].tensor.shape, (std::vector<int64_t>{15}));
    EXPECT_EQ(Find(g, "fxdp_reduce_scatter").outputs[0].tensor.shape, (std::vector<int64_t>{5}));
  }
  // The metadata fxdp-worker run reads.
  bool style = false, names = false;
  for (const auto& [k, v] : e.graph(0).header().metadata) {
    style |= k == "fxdp.style" && v == "fully_shard";
    names |= k == "fxdp.sharded_state" && v == "fc.weight\nfc.bias";
  }
  EXPECT_TRUE(style && names);
  EXPECT_NE(e.report.ToJson().find("\"sharded_state\""), std::string::npos);
  EXPECT_NE(e.report.ToJson().find("\"placement\": \"S(0)\""), std::string::npos);
  EXPECT_NE(e.report.ToTable().find("fc.weight"), std::string::npos);
}

TEST(FullyShard, UnitsArePrefetchedAndBackwardGathersAgain) {
  // Three 8x8 layers (256 bytes each) with a cap of 256 bytes: one unit per layer.
  ExpandOptions o{.world_size = 2, .style = kFs, .bucket_cap_mb = 256.0 / (1024 * 1024)};
  Expansion e = ValueOrDie(ExpandText(ReadTestData("mlp3_momentum.txt"), o));
  ASSERT_EQ(e.sharded_state.size(), 6u);  // w0..w2 and their momentum buffers
  const ir::Graph& g = e.graph(0);
  EXPECT_EQ(Find(g, "m0").outputs[0].tensor.shape, (std::vector<int64_t>{32}));
  // Forward: unit k+1's all-gather starts before unit k's first compute.
  EXPECT_LT(IndexOf(g, "fxdp_all_gather_unit1"), IndexOf(g, "t0"));
  EXPECT_LT(IndexOf(g, "fxdp_all_gather_unit2"), IndexOf(g, "t1"));
  EXPECT_LT(IndexOf(g, "fxdp_wait_unit1"), IndexOf(g, "t1"));
  // Backward gathers the layers again and recomputes the transposes from them:
  // forward's gathered weights die in forward.
  EXPECT_EQ(Count(g, "_c10d_functional::all_gather_into_tensor"), 5);  // 3 forward, 2 backward
  const ir::Node& tt1 = Find(g, "tt1");
  EXPECT_EQ(g.node(tt1.args[0].as<ir::ValueRef>().node).name, "t1_bw");
  EXPECT_EQ(g.node(Find(g, "t1_bw").args[0].as<ir::ValueRef>().node).name, "fxdp_full_w1_bw");
  ir::UseMap uses = ir::ComputeUses(g);
  const int32_t fwd_w1 = IndexOf(g, "fxdp_full_w1");
  for (const ir::Use& u : uses[fwd_w1][0]) EXPECT_LT(u.user.value, IndexOf(g, "loss"));
}

TEST(FullyShard, RefusesNonElementwiseOptimizerMathOnShardsNamingTheNode) {
  // A gradient-norm-like reduction over a sharded gradient in the optimizer.
  const std::string text = R"(graph format=1 producer="test" torch="2.13.0+cpu" {
  %w: f32[3, 4] rg = placeholder() {role=PARAMETER, state="w"}
  %x: f32[8, 4] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %t: f32[4, 3]{1, 4} = aten::t(%w)
  %h: f32[8, 3] = aten::mm(%x, %t)
  %loss: f32[] = aten::sum(%h)
  %one: f32[] = aten::ones_like(%loss, pin_memory=false, memory_format=torch.preserve_format)
  %ex: f32[8, 3]{0, 0} = aten::expand(%one, [8, 3])
  %ext: f32[3, 8]{0, 0} = aten::t(%ex)
  %g: f32[3, 4] = aten::mm(%ext, %x) {grad_of="w"}
  %gt: f32[4, 3]{1, 4} = aten::t(%g)
  %gs: f32[4, 3] = aten::mul.Tensor(%gt, 0.1)
  %gst: f32[3, 4]{1, 3} = aten::t(%gs)
  %nw: f32[3, 4] = aten::sub.Tensor(%w, %gst)
  %output = output([%nw, %loss]) {specs=[UPDATED_PARAMETER "w", LOSS]}
}
)";
  // Math on a transposed view of a shard: its elements are not the shard's.
  EXPECT_THAT(ExpandText(text, {.world_size = 2, .style = kFs}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "node 'gs' (aten::mul.Tensor) runs in the optimizer on sharded state, which "
                       "FULLY_SHARD holds as flat 1/2 shards"));
  // REPLICATE takes it.
  EXPECT_TRUE(ExpandText(text, {.world_size = 2}).ok());
  auto edit = [&](std::string from, const std::string& a, const std::string& b) {
    from.replace(from.find(a), a.size(), b);
    return from;
  };
  // A scan along a dim of a shard.
  std::string scan =
      edit(text, "%gt: f32[4, 3]{1, 4} = aten::t(%g)", "%gt: f32[3, 4] = aten::cumsum(%g, 1)");
  scan = edit(scan, "%gs: f32[4, 3] = aten::mul", "%gs: f32[3, 4] = aten::mul");
  scan = edit(scan, "%gst: f32[3, 4]{1, 3} = aten::t(%gs)",
              "%gst: f32[3, 4] = aten::mul.Tensor(%gs, 1.0)");
  EXPECT_THAT(ExpandText(scan, {.world_size = 2, .style = kFs}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "node 'gt' (aten::cumsum) runs in the optimizer on sharded state"));
  // Two transposes are the shard again: t(t(g)) is accepted.
  std::string twice =
      edit(text, "%gs: f32[4, 3] = aten::mul.Tensor(%gt, 0.1)", "%gs: f32[3, 4] = aten::t(%gt)");
  twice = edit(twice, "%gst: f32[3, 4]{1, 3} = aten::t(%gs)",
               "%gst: f32[3, 4] = aten::mul.Tensor(%gs, 0.1)");
  Expansion e = ValueOrDie(ExpandText(twice, {.world_size = 2, .style = kFs}));
  EXPECT_EQ(Find(e.graph(0), "nw").outputs[0].tensor.shape, (std::vector<int64_t>{6}));
  EXPECT_FALSE(e.graph(0).FindNode("gt").has_value());  // views of a shard are the shard
}

}  // namespace
}  // namespace fxdp
