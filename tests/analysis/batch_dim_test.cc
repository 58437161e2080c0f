// BatchDimAnalyzer: golden tests per op family on hand-written graphs (text
// form), the traps the seed's size matching got wrong, and bad input.
// Real traced zoo graphs are covered by tests/python/test_analyze.py.
#include "analysis/batch_dim.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "analysis/ir/text.h"
#include "analysis/op_rules.h"
#include "tests/analysis/batch_dim_util.h"
#include "tests/test_util.h"

namespace fxdp {
namespace {

using ::fxdp::testing::Analysed;
using ::fxdp::testing::Analyze;
using ::fxdp::testing::MustRun;
using ::fxdp::testing::ReadTestData;
using ::fxdp::testing::StatusIs;
using ::fxdp::testing::ValueOrDie;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

TEST(OpRules, TableIsSortedUniqueAndLookedUp) {
  const std::vector<std::string> names = OpRuleNames();
  ASSERT_GT(names.size(), 200u);
  std::set<std::string> seen;
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_TRUE(seen.insert(names[i]).second) << "duplicate " << names[i];
  }
  for (int i = 1; i < static_cast<int>(names.size()); ++i) {
    const OpRule& a = OpRuleAt(i - 1);
    const OpRule& b = OpRuleAt(i);
    EXPECT_TRUE(std::make_pair(a.name, a.overload) < std::make_pair(b.name, b.overload))
        << a.name << "." << a.overload << " before " << b.name << "." << b.overload;
  }
  EXPECT_EQ(FindOpRule({"aten::mm", ""})->family, OpFamily::kMatmul);
  EXPECT_EQ(FindOpRule({"aten::relu", "default"})->family, OpFamily::kPointwise);  // wildcard
  EXPECT_EQ(FindOpRule({"aten::_foreach_addcdiv", "ScalarList"})->family, OpFamily::kForeach);
  EXPECT_EQ(FindOpRule({"aten::view", ""}), nullptr);  // view ops have dim maps instead
  EXPECT_EQ(FindOpRule({"aten::no_such_op", ""}), nullptr);
}

TEST(BatchDim, MlpSgdGolden) {
  auto g = ValueOrDie(ir::ParseGraphText(ReadTestData("mlp_sgd.txt")));
  BatchDimAnalysis a = ValueOrDie(AnalyzeBatchDims(g, {2}));
  Analysed r{g, std::move(a)};
  EXPECT_EQ(r.a.batch_size(), 8);
  EXPECT_EQ(r.P("x"), "S(0)");
  EXPECT_EQ(r.P("y"), "S(0)");
  EXPECT_EQ(r.P("w"), "R");
  EXPECT_EQ(r.P("t"), "R");
  EXPECT_EQ(r.P("addmm"), "S(0)");
  EXPECT_EQ(r.P("loss"), "P(avg)");  // mean over the local batch
  EXPECT_EQ(r.P("ones"), "R");
  // The mean's backward expands a scalar to the batch shape: built sharded.
  EXPECT_EQ(r.P("expand"), "S(0)");
  EXPECT_THAT(r.Why("expand"), HasSubstr("built sharded for its use by"));
  EXPECT_EQ(r.P("div"), "S(0)");
  // div by the literal 24 (the global numel) is kept, so gradients are sums.
  EXPECT_EQ(r.P("mm"), "P(sum)");
  EXPECT_EQ(r.P("sum"), "P(sum)");
  EXPECT_EQ(r.P("new_w"), "R");
  ASSERT_EQ(r.a.reductions().size(), 2u);
  EXPECT_EQ(r.a.reductions()[0].grad_of, "fc.weight");
  EXPECT_EQ(r.a.reductions()[0].op, ReduceOp::kSum);
  EXPECT_EQ(g.node(r.a.reductions()[0].first_use).name, "new_w");
  EXPECT_TRUE(r.a.warnings().empty());
}

TEST(BatchDim, HyperparametersAreReplicatedAndListed) {
  auto g = ValueOrDie(ir::ParseGraphText(ReadTestData("mlp_sgd_hyper.txt")));
  BatchDimAnalysis a = ValueOrDie(AnalyzeBatchDims(g, {2}));
  Analysed r{g, std::move(a)};
  EXPECT_EQ(r.P("lr"), "R");
  EXPECT_EQ(r.P("wd"), "R");
  EXPECT_EQ(r.Why("lr"),
            "hyper-parameter optim.group0.lr: replicated (one value for every rank, fed per step)");
  // The update reads the all-reduced gradient and the replicated lr.
  EXPECT_EQ(r.P("step_w"), "R");
  EXPECT_EQ(r.P("new_w"), "R");
  EXPECT_EQ(r.a.reductions().size(), 2u);
  EXPECT_THAT(r.a.notes(), ::testing::Contains(
                               HasSubstr("hyper-parameters (R: the same value on every rank, fed "
                                         "per step by a schedule): optim.group0.lr, "
                                         "optim.group0.weight_decay")));
  EXPECT_THAT(AnalysisToTable(g, r.a), HasSubstr("hyper-parameter optim.group0.weight_decay"));
  EXPECT_TRUE(r.a.warnings().empty());
}

// B = 8 and every other dim is 8 too: size matching cannot tell them apart.
TEST(BatchDim, AllDimsEqualToTheBatchSize) {
  auto r = MustRun(R"(
  %w: f32[8, 8] rg = placeholder() {role=PARAMETER, state="w"}
  %x: f32[8, 8] = placeholder() {role=INPUT, state="x", batch_dim=1}
  %xt: f32[8, 8]{1, 8} = aten::t(%x)
  %wt: f32[8, 8]{1, 8} = aten::t(%w)
  %h: f32[8, 8] = aten::mm(%xt, %wt)
  %ht: f32[8, 8]{1, 8} = aten::t(%h)
  %g: f32[8, 8] = aten::mm(%ht, %xt)
  %s: f32[8] = aten::sum.dim_IntList(%h, [1], false)
  %s2: f32[8] = aten::sum.dim_IntList(%h, [0], false)
  %output = output([%g, %s, %s2]) {specs=[OTHER, OTHER, OTHER]}
)");
  EXPECT_EQ(r.P("x"), "S(1)");
  EXPECT_EQ(r.P("xt"), "S(0)");
  EXPECT_EQ(r.P("wt"), "R");
  EXPECT_EQ(r.P("h"), "S(0)");
  EXPECT_EQ(r.P("ht"), "S(1)");
  EXPECT_EQ(r.P("g"), "P(sum)");   // contracts the batch
  EXPECT_EQ(r.P("s"), "S(0)");     // sums a feature dim
  EXPECT_EQ(r.P("s2"), "P(sum)");  // sums the batch dim
  // Non-loss outputs that are partial get all-reduced.
  EXPECT_EQ(r.a.reductions().size(), 2u);
}

TEST(BatchDim, FlattenTheBatchIntoAnotherDimAndSplitItBack) {
  auto r = MustRun(R"(
  %x: f32[4, 6, 5] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %s: f32[6, 4, 5] = placeholder() {role=INPUT, state="s", batch_dim=1}
  %a: f32[24, 5] = aten::view(%x, [24, 5])
  %b: f32[4, 6, 5] = aten::view(%a, [4, -1, 5])
  %d: f32[24, 5] = aten::view(%s, [24, 5])
  %e: f32[6, 4, 5] = aten::view(%d, [6, 4, 5])
  %f: f32[120] = aten::view(%s, [120])
  %g: f32[6, 20] = aten::view(%f, [6, 20])
  %h: f32[8, 15] = aten::_unsafe_view(%x, [8, 15])
  %output = output([%b, %e, %g, %h]) {specs=[OTHER, OTHER, OTHER, OTHER]}
)");
  EXPECT_EQ(r.P("a"), "S(0)");
  EXPECT_EQ(r.V("a").outer, 1);
  EXPECT_EQ(r.P("b"), "S(0)");
  EXPECT_EQ(r.P("d"), "S(0)");
  EXPECT_EQ(r.V("d").outer, 6);  // seq-first: the batch is inside the flattened dim
  EXPECT_THAT(r.Why("d"), HasSubstr("batch inside the dim"));
  EXPECT_EQ(r.P("e"), "S(1)");
  EXPECT_EQ(r.V("e").outer, 1);
  EXPECT_EQ(r.P("g"), "S(1)");
  EXPECT_EQ(r.V("g").outer, 1);
  // [4*6*5] as (8, 15): 8 = 4 samples x 2 blocks, batch-major.
  EXPECT_EQ(r.P("h"), "S(0)");
}

TEST(BatchDim, ViewThatBreaksTheBatchIsAnError) {
  EXPECT_THAT(Analyze(R"(
  %x: f32[4, 6] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %a: f32[24] = aten::view(%x, [24])
  %c: f32[2, 12] = aten::view(%a, [2, 12])
  %output = output([%c]) {specs=[OTHER]}
)")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "node 'c' (aten::view)"));
  EXPECT_THAT(Analyze(R"(
  %x: f32[4, 6] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %r: f32[8, 6] = aten::repeat(%x, [2, 1])
  %output = output([%r]) {specs=[OTHER]}
)")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "repeats the batch"));
}

TEST(BatchDim, PointwiseBroadcastsAndShardsFactories) {
  auto r = MustRun(R"(
  %x: f32[4, 3] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %b: f32[3] rg = placeholder() {role=PARAMETER, state="b"}
  %z: f32[4, 3] = aten::zeros([4, 3], dtype=torch.float32)
  %f: f32[4, 1] = aten::full([4, 1], 2.0)
  %a: f32[4, 3] = aten::add.Tensor(%x, %b)
  %m: f32[4, 3] = aten::mul.Tensor(%a, %z)
  %n: f32[4, 3] = aten::mul.Tensor(%f, %x)
  %r: f32[3] = aten::relu(%b)
  %output = output([%m, %n, %r]) {specs=[OTHER, OTHER, OTHER]}
)");
  EXPECT_EQ(r.P("a"), "S(0)");
  EXPECT_EQ(r.P("z"), "S(0)");
  EXPECT_EQ(r.P("f"), "S(0)");
  EXPECT_THAT(r.Why("z"), HasSubstr("for its use by m"));
  EXPECT_EQ(r.P("r"), "R");
  EXPECT_TRUE(r.a.sharded_reads().empty());
}

TEST(BatchDim, ReplicatedValueSpanningTheBatchIsSlicedNotUpgraded) {
  // A parameter of shape [B, 3] added to the batch: rank r needs its rows.
  auto r = MustRun(R"(
  %x: f32[4, 3] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %p: f32[4, 3] rg = placeholder() {role=PARAMETER, state="p"}
  %a: f32[4, 3] = aten::add.Tensor(%x, %p)
  %output = output([%a]) {specs=[OTHER]}
)");
  EXPECT_EQ(r.P("p"), "R");
  ASSERT_EQ(r.a.sharded_reads().size(), 1u);
  EXPECT_EQ(r.graph.node(r.a.sharded_reads()[0].value.node).name, "p");
  EXPECT_EQ(r.a.sharded_reads()[0].dim, 0);
}

TEST(BatchDim, OperandsOnDifferentDimsAreAnError) {
  EXPECT_THAT(Analyze(R"(
  %x: f32[4, 4] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %xt: f32[4, 4]{1, 4} = aten::t(%x)
  %a: f32[4, 4] = aten::add.Tensor(%x, %xt)
  %output = output([%a]) {specs=[OTHER]}
)")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "node 'a' (aten::add.Tensor)"));
}

TEST(BatchDim, ReductionsOverAndBesideTheBatch) {
  auto r = MustRun(R"(
  %x: f32[4, 3] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %s: f32[4] = aten::sum.dim_IntList(%x, [1], false)
  %m: f32[1, 3] = aten::mean.dim(%x, [0], true)
  %c: f32[4, 3] = aten::sub.Tensor(%x, %m)
  %k: f32[4, 1] = aten::amax(%x, [-1], true)
  %t: f32[] = aten::sum(%x)
  %output = output([%s, %c, %k, %t]) {specs=[OTHER, OTHER, OTHER, LOSS]}
)");
  EXPECT_EQ(r.P("s"), "S(0)");
  EXPECT_EQ(r.P("m"), "P(avg)");
  // x - mean(x, 0): the batch statistic is all-reduced before the sub.
  ASSERT_EQ(r.a.reductions().size(), 1u);
  EXPECT_EQ(r.graph.node(r.a.reductions()[0].value.node).name, "m");
  EXPECT_EQ(r.graph.node(r.a.reductions()[0].first_use).name, "c");
  EXPECT_EQ(r.a.ReadPlacement(r.a.reductions()[0].value).ToString(), "R");
  EXPECT_EQ(r.P("c"), "S(0)");
  EXPECT_EQ(r.P("k"), "S(0)");
  EXPECT_EQ(r.P("t"), "P(sum)");  // the loss output stays partial (no reduction)

  EXPECT_THAT(Analyze(R"(
  %x: f32[4, 3] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %k: f32[3] = aten::amax(%x, [0], false)
  %output = output([%k]) {specs=[OTHER]}
)")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a sum or mean"));
}

// An op along the batch dim reads its sharded operands all-gathered and is whole (R) on every
// rank; a mean-scaled operand (each rank's rows scaled by its own B / B_r) is gathered unscaled
// (times B_r / B first): the whole result is at true scale, not mean-scaled.
TEST(BatchDim, SoftmaxAlongTheBatchReadsItAllGathered) {
  auto r = MustRun(R"(
  %x: f32[4, 3] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %s: f32[4, 3] = aten::_softmax(%x, 0, false)
  %g: f32[4, 3] = aten::_softmax_backward_data(%x, %s, 0, torch.float32)
  %y: f32[4, 3] = aten::mul.Tensor(%g, %x)
  %output = output([%y]) {specs=[OTHER]}
)");
  EXPECT_EQ(r.P("s"), "R");
  EXPECT_EQ(r.P("g"), "R");
  EXPECT_EQ(r.P("y"), "S(0)");  // reads its rows of g
  ASSERT_EQ(r.a.gathered_reads().size(), 2u);
  EXPECT_EQ(r.a.gathered_reads()[0].arg, 0);
  EXPECT_EQ(r.a.gathered_reads()[1].arg, 0);  // g's arg 1, s, is whole already
  ASSERT_EQ(r.a.sharded_reads().size(), 1u);
  EXPECT_EQ(r.a.sharded_reads()[0].user.value, r.graph.FindNode("y")->value);
  auto m = MustRun(R"(
  %x: f32[4, 3] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %y: f32[4, 3] = placeholder() {role=INPUT, state="y", batch_dim=0}
  %s: f32[4, 3] = aten::_softmax(%x, 0, false)
  %loss: f32[] = aten::mse_loss(%s, %y, 1)
  %one: f32[] = aten::ones_like(%loss)
  %d: f32[4, 3] = aten::mse_loss_backward(%one, %s, %y, 1)
  %g: f32[4, 3] = aten::_softmax_backward_data(%d, %s, 0, torch.float32)
  %output = output([%g, %loss]) {specs=[OTHER, LOSS]}
)");
  EXPECT_TRUE(m.a.value(ir::ValueRef{*m.graph.FindNode("d"), 0}).mean_scaled);
  EXPECT_EQ(m.P("g"), "R");
  EXPECT_FALSE(m.a.value(ir::ValueRef{*m.graph.FindNode("g"), 0}).mean_scaled);
  const ShardedRead& d = m.a.gathered_reads().back();
  EXPECT_EQ(m.graph.node(d.value.node).name, "d");
  EXPECT_TRUE(d.unscale);
  EXPECT_FALSE(m.a.gathered_reads().front().unscale);  // x, for s
}

// In-batch distances: each product gathers the label whose operands are fewer bytes. The
// backward for x2 reads (grad.T, x2, x1, p, cdist.T): it gathers x2 (arg 1) and sums over the
// rank's x1 rows (partial); arg 1 and arg 2 are the same value, gathered at one position only.
TEST(BatchDim, InBatchCdistGathersOneLabelsOperands) {
  auto r = MustRun(R"(
  %x: f32[4, 3] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %d: f32[4, 4] = aten::_cdist_forward(%x, %x, 2.0, None)
  %g: f32[4, 3] = aten::_cdist_backward(%d, %x, %x, 2.0, %d)
  %dt: f32[4, 4] = aten::t(%d)
  %h: f32[4, 3] = aten::_cdist_backward(%dt, %x, %x, 2.0, %dt)
  %s: f32[4, 3] = aten::add.Tensor(%g, %h)
  %output = output([%s]) {specs=[OTHER]}
)");
  EXPECT_EQ(r.P("d"), "S(0)");
  EXPECT_EQ(r.P("g"), "S(0)");
  EXPECT_EQ(r.P("h"), "P(sum)");
  EXPECT_EQ(r.P("s"), "S(0)");
  std::vector<std::pair<std::string, int>> gathered;
  for (const ShardedRead& g : r.a.gathered_reads()) {
    gathered.emplace_back(r.graph.node(g.user).name, g.arg);
  }
  EXPECT_THAT(gathered, ElementsAre(Pair("d", 1), Pair("g", 2), Pair("h", 1)));
}

// index_add of batch rows (index and source hold the batch) into zeros is a partial sum; into
// anything else every rank would add it once; the backward's index_select reads whole rows.
TEST(BatchDim, IndexAddOfBatchRowsIntoZerosIsAPartialSum) {
  const std::string head = R"(
  %x: f32[4, 3] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %i: i64[4] = placeholder() {role=INPUT, state="i", batch_dim=0}
  %w: f32[2, 3] = placeholder() {role=PARAMETER, state="w"}
  %z: f32[2, 3] = aten::zeros([2, 3], dtype=torch.float32)
)";
  auto r = MustRun(head + R"(  %s: f32[2, 3] = aten::index_add(%z, 0, %i, %x)
  %g: f32[4, 3] = aten::index_select(%s, 0, %i)
  %output = output([%g]) {specs=[OTHER]}
)");
  EXPECT_EQ(r.P("s"), "P(sum)");
  EXPECT_EQ(r.P("g"), "S(0)");
  ASSERT_EQ(r.a.reductions().size(), 1u);
  EXPECT_EQ(r.graph.node(r.a.reductions()[0].value.node).name, "s");
  EXPECT_THAT(Analyze(head + R"(  %s: f32[2, 3] = aten::index_add(%w, 0, %i, %x)
  %output = output([%s]) {specs=[OTHER]}
)")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "which is not a fresh zero tensor"));
}

TEST(BatchDim, CatSliceSelectAlongTheBatchAreErrors) {
  const std::string head = R"(
  %x: f32[4, 3] = placeholder() {role=INPUT, state="x", batch_dim=0}
)";
  EXPECT_THAT(Analyze(head + R"(  %c: f32[8, 3] = aten::cat([%x, %x])
  %output = output([%c]) {specs=[OTHER]}
)")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "concatenates along dim 0"));
  EXPECT_THAT(Analyze(head + R"(  %c: f32[2, 3] = aten::slice.Tensor(%x, 0, 0, 2)
  %output = output([%c]) {specs=[OTHER]}
)")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "takes part of dim 0"));
  EXPECT_THAT(Analyze(head + R"(  %c: f32[3] = aten::select.int(%x, 0, 1)
  %output = output([%c]) {specs=[OTHER]}
)")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "selects one entry of dim 0"));
  // Along other dims they keep the batch.
  auto r = MustRun(head + R"(  %s: f32[4, 3] = aten::_softmax(%x, -1, false)
  %c: f32[4, 6] = aten::cat([%x, %s], 1)
  %k: f32[2, 4, 3] = aten::stack([%x, %s])
  %l: f32[4, 2] = aten::slice.Tensor(%c, 1, 0, 2)
  %f: f32[4, 3] = aten::slice.Tensor(%x, 0, 0, 9223372036854775807)
  %e: f32[4] = aten::select.int(%x, 1, 0)
  %output = output([%k, %l, %f, %e]) {specs=[OTHER, OTHER, OTHER, OTHER]}
)");
  EXPECT_EQ(r.P("s"), "S(0)");
  EXPECT_EQ(r.P("c"), "S(0)");
  EXPECT_EQ(r.P("k"), "S(1)");
  EXPECT_EQ(r.P("l"), "S(0)");
  EXPECT_EQ(r.P("f"), "S(0)");
  EXPECT_EQ(r.P("e"), "S(0)");
}

TEST(BatchDim, LossesAndTheirBackwardScaleByTheLocalBatch) {
  auto r = MustRun(R"(
  %w: f32[5, 3] rg = placeholder() {role=PARAMETER, state="w"}
  %x: f32[4, 3] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %y: i64[4] = placeholder() {role=INPUT, state="y", batch_dim=0}
  %wt: f32[3, 5]{1, 3} = aten::t(%w)
  %h: f32[4, 5] = aten::mm(%x, %wt)
  %ls: f32[4, 5] = aten::_log_softmax(%h, 1, false)
  %nll: (f32[], f32[]) = aten::nll_loss_forward(%ls, %y, None, 1, -100)
  %loss: f32[] = operator.getitem(%nll#0, 0)
  %tw: f32[] = operator.getitem(%nll#1, 1)
  %one: f32[] = aten::ones_like(%loss, pin_memory=false, memory_format=torch.preserve_format)
  %gls: f32[4, 5] = aten::nll_loss_backward(%one, %ls, %y, None, 1, -100, %tw)
  %gh: f32[4, 5] = aten::_log_softmax_backward_data(%gls, %ls, 1, torch.float32)
  %ght: f32[5, 4]{1, 5} = aten::t(%gh)
  %gw: f32[5, 3] = aten::mm(%ght, %x) {grad_of="w"}
  %nw: f32[5, 3] = aten::sub.Tensor(%w, %gw, alpha=0.1)
  %output = output([%nw, %loss]) {specs=[UPDATED_PARAMETER "w", LOSS]}
)");
  EXPECT_EQ(r.P("nll"), "(P(avg), P(sum))");
  EXPECT_EQ(r.P("loss"), "P(avg)");
  EXPECT_EQ(r.P("one"), "R");
  EXPECT_EQ(r.P("gls"), "S(0)");
  EXPECT_TRUE(r.V("gls").mean_scaled);
  EXPECT_TRUE(r.V("gh").mean_scaled);
  EXPECT_EQ(r.P("gw"), "P(avg)");
  EXPECT_EQ(r.P("nw"), "R");
  // total_weight is read locally by nll_loss_backward, never all-reduced.
  ASSERT_EQ(r.a.reductions().size(), 1u);
  EXPECT_EQ(r.a.reductions()[0].grad_of, "w");
  EXPECT_EQ(r.a.reductions()[0].op, ReduceOp::kAvg);
  EXPECT_THAT(r.Why("gw"), HasSubstr("gradient of w; all-reduced (avg) before use"));
}

TEST(BatchDim, NonlinearOpOnAMeanScaledGradientIsAnError) {
  EXPECT_THAT(Analyze(R"(
  %x: f32[4, 3] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %y: f32[4, 3] = placeholder() {role=INPUT, state="y", batch_dim=0}
  %loss: f32[] = aten::mse_loss(%x, %y, 1)
  %one: f32[] = aten::ones_like(%loss)
  %g: f32[4, 3] = aten::mse_loss_backward(%one, %x, %y, 1)
  %e: f32[4, 3] = aten::exp(%g)
  %output = output([%e, %loss]) {specs=[OTHER, LOSS]}
)")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "node 'e' (aten::exp)"));
}

}  // namespace
}  // namespace fxdp
