// Synchronized batch norm (ExpandOptions::sync_batchnorm) on the hand-written
// batch-norm graph: the rank graphs normalise with all-reduced statistics and
// carry no batch-norm kernel; the default keeps DDP's local statistics.
// tests/python/test_sync_batchnorm.py trains BatchNorm models on real workers
// against one device.
#include "expansion/sync_batchnorm.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "analysis/ir/text.h"
#include "expansion/data_parallel.h"
#include "tests/expansion/expand_util.h"
#include "tests/test_util.h"

namespace fxdp {
namespace {

using ::fxdp::testing::Count;
using ::fxdp::testing::ExpandText;
using ::fxdp::testing::ReadTestData;
using ::fxdp::testing::StatusIs;
using ::fxdp::testing::ValueOrDie;
using ::testing::HasSubstr;

absl::StatusOr<Expansion> ExpandBn(ExpandOptions o, bool analyze_sync) {
  return ExpandText(ReadTestData("batchnorm_getitem.txt"), o, analyze_sync);
}

int CountPurpose(const ExpansionReport& r, const std::string& prefix) {
  int c = 0;
  for (const Collective& x : r.collectives) c += x.purpose.rfind(prefix, 0) == 0;
  return c;
}

TEST(SyncBatchNorm, RewritesForwardAndBackwardOnEveryRank) {
  // B=6 over 4 ranks: 2, 2, 1, 1.
  Expansion e = ValueOrDie(ExpandBn({.world_size = 4, .sync_batchnorm = true}, true));
  EXPECT_FALSE(e.identical);
  EXPECT_EQ(e.report.batch_norm, "global");
  EXPECT_EQ(CountPurpose(e.report, "bn stats bn"), 2);  // sum, then sum of squared deviations
  EXPECT_EQ(CountPurpose(e.report, "bn grad bwd"), 1);  // sum(dy), sum(dy * xmu) packed
  // The running statistics are the global batch's on every rank: nothing to average.
  EXPECT_EQ(CountPurpose(e.report, "sync "), 0);
  for (int r = 0; r < 4; ++r) {
    const ir::Graph& g = e.graph(r);
    EXPECT_EQ(Count(g, "aten::_native_batch_norm_legit_functional"), 0) << r;
    EXPECT_EQ(Count(g, "aten::native_batch_norm_backward"), 0) << r;
    EXPECT_EQ(Count(g, "operator.getitem"), 0) << r;
    // + the loss, the bucket and the hand-written grad_output (an expand of the partial loss)
    EXPECT_EQ(Count(g, "_c10d_functional::all_reduce"), 3 + 3) << r;
    EXPECT_EQ(Count(g, "_c10d_functional::wait_tensor"), 6) << r;
    // The sum loss gives gradients that are not mean-scaled: no per-rank weight.
    for (const ir::Node& n : g.nodes()) {
      if (n.name.rfind("bwd_sync", 0) == 0 && n.target.ToString() == "aten::mul.Scalar") {
        EXPECT_DOUBLE_EQ(n.args[1].as<double>(), 1.0 / 150) << n.name;  // 1 / (6 * 5 * 5)
      }
    }
  }
  // The local input is the rank's slice; the statistics are per channel.
  const ir::Graph& g3 = e.graph(3);
  EXPECT_EQ(g3.node(*g3.FindNode("x")).outputs[0].tensor.shape, (std::vector<int64_t>{1, 2, 5, 5}));
}

TEST(SyncBatchNorm, DefaultIsLocalStatistics) {
  Expansion e = ValueOrDie(ExpandBn({.world_size = 2}, false));
  EXPECT_EQ(e.report.batch_norm, "local");
  EXPECT_EQ(Count(e.graph(0), "aten::_native_batch_norm_legit_functional"), 1);
  EXPECT_EQ(CountPurpose(e.report, "bn "), 0);
  EXPECT_EQ(CountPurpose(e.report, "sync bn.running_"), 2);
  EXPECT_THAT(e.report.ToTable(), HasSubstr("batch norm statistics: local"));
}

TEST(SyncBatchNorm, AnalysisSaysWhichStatistics) {
  auto g = ValueOrDie(ir::ParseGraphText(ReadTestData("batchnorm_getitem.txt")));
  const ir::NodeId bn = *g.FindNode("bn");
  BatchDimAnalysis sync =
      ValueOrDie(AnalyzeBatchDims(g, {.world_size = 2, .sync_batchnorm = true}));
  BatchDimAnalysis local = ValueOrDie(AnalyzeBatchDims(g, {.world_size = 2}));
  EXPECT_TRUE(sync.sync_batchnorm());
  EXPECT_EQ(sync.node(bn).detail, Detail::kSyncStats);
  EXPECT_EQ(local.node(bn).detail, Detail::kLocalStats);
  for (int k = 1; k < 5; ++k) {
    EXPECT_FALSE(sync.value(ir::ValueRef{bn, k}).rank_local) << k;
    EXPECT_TRUE(local.value(ir::ValueRef{bn, k}).rank_local) << k;
  }
  EXPECT_THAT(DescribeDecision(g, sync, bn), HasSubstr("global batch statistics"));
  EXPECT_THAT(DescribeDecision(g, local, bn), HasSubstr("local batch statistics"));
}

TEST(SyncBatchNorm, OptionsMustAgreeWithTheAnalysis) {
  EXPECT_THAT(ExpandBn({.world_size = 2, .sync_batchnorm = true}, false).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "sync_batchnorm=true"));
  EXPECT_THAT(ExpandBn({.world_size = 2}, true).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "sync_batchnorm=false"));
}

TEST(SyncBatchNorm, InPlaceRunningStatisticsAreRefused) {
  std::string text = ReadTestData("batchnorm_getitem.txt");
  // The non-functional op updates running_mean/var in place: no rewrite can keep that.
  const std::string from =
      "(f32[6, 2, 5, 5], f32[2], f32[2], f32[2], f32[2]) = "
      "aten::_native_batch_norm_legit_functional(";
  const size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos);
  text.replace(at, from.size(),
               "(f32[6, 2, 5, 5], f32[2], f32[2], f32[2], f32[2]) = "
               "aten::_native_batch_norm_legit(");
  auto g = ValueOrDie(ir::ParseGraphText(text));
  auto a = ValueOrDie(AnalyzeBatchDims(g, {.world_size = 2, .sync_batchnorm = true}));
  EXPECT_THAT(ExpandDataParallel(g, a, {.world_size = 2, .sync_batchnorm = true}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "node 'bn' (aten::_native_batch_norm_legit): sync_batchnorm: "
                       "updates its running statistics in place"));
}

}  // namespace
}  // namespace fxdp
