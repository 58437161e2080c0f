// Data-parallel expansion on hand-written graphs: local shapes, rewritten size
// lists, bucket layout and placement of collectives, uneven splits, errors.
// tests/python/test_expand_oracle.py runs expanded zoo graphs under Gloo.
#include "expansion/data_parallel.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "analysis/ir/hyperparameters.h"
#include "analysis/ir/text.h"
#include "tests/expansion/expand_util.h"
#include "tests/test_util.h"

namespace fxdp {
namespace {

using ::fxdp::testing::Count;
using ::fxdp::testing::ExpandText;
using ::fxdp::testing::Find;
using ::fxdp::testing::ReadTestData;
using ::fxdp::testing::StatusIs;
using ::fxdp::testing::ValueOrDie;
using ::testing::HasSubstr;
using ::testing::Not;

std::vector<std::string> Targets(const ir::Graph& g) {
  std::vector<std::string> t;
  for (const ir::Node& n : g.nodes()) t.push_back(n.target.ToString());
  return t;
}

TEST(Expand, MlpEvenSplit) {
  Expansion e = ValueOrDie(ExpandText(ReadTestData("mlp_sgd.txt"), {.world_size = 2}));
  ASSERT_EQ(e.world_size(), 2);
  EXPECT_TRUE(e.identical);
  // Identical ranks share one graph.
  EXPECT_EQ(e.distinct_graphs.size(), 1u);
  EXPECT_EQ(&e.graph(1), &e.graph(0));
  const ir::Graph& g = e.graph(0);
  EXPECT_EQ(Find(g, "x").outputs[0].tensor.shape, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(Find(g, "addmm").outputs[0].tensor.shape, (std::vector<int64_t>{4, 3}));
  // expand(ones, [8, 3]) was built sharded: its size list is local now.
  const ir::Node& expand = Find(g, "expand");
  EXPECT_EQ(ir::PrintArgument(g, expand.args[1]), "[4, 3]");
  EXPECT_EQ(expand.outputs[0].tensor.shape, (std::vector<int64_t>{4, 3}));
  // Parameters and their gradients keep their shapes.
  EXPECT_EQ(Find(g, "mm").outputs[0].tensor.shape, (std::vector<int64_t>{3, 4}));
  // One bucket (15 floats) + the loss.
  ASSERT_EQ(e.report.buckets.size(), 1u);
  EXPECT_EQ(e.report.buckets[0].gradients, (std::vector<std::string>{"fc.weight", "fc.bias"}));
  EXPECT_EQ(e.report.buckets[0].bytes, 15 * 4);
  EXPECT_EQ(e.report.buckets[0].op, ReduceOp::kSum);  // div by the literal 24 is kept
  EXPECT_EQ(Count(g, "_c10d_functional::all_reduce"), 2);
  EXPECT_EQ(Count(g, "_c10d_functional::wait_tensor"), 2);
  EXPECT_EQ(e.report.bytes_per_step, 15 * 4 + 4);
  // The all-reduce starts after the last gradient and is waited on before the update.
  const auto t = Targets(g);
  auto pos = [&](const std::string& name) { return g.FindNode(name)->value; };
  EXPECT_GT(pos("fxdp_all_reduce"), pos("sum"));
  EXPECT_LT(pos("fxdp_wait_bucket0"), pos("new_w"));
  EXPECT_GT(pos("fxdp_wait_bucket0"), pos("fxdp_all_reduce"));
  // The optimizer reads the reduced gradient.
  const ir::Node& new_w = Find(g, "new_w");
  EXPECT_EQ(g.node(new_w.args[1].as<ir::ValueRef>().node).name, "fxdp_reduced_mm");
  // Outputs: global loss (LOSS) and local loss (OTHER "local_loss").
  const ir::Node& out = g.output_node();
  ASSERT_EQ(out.output_specs.size(), 4u);
  EXPECT_EQ(out.output_specs[2].role, ir::OutputRole::kLoss);
  EXPECT_EQ(out.output_specs[3].state_name, "local_loss");
  const auto& rets = out.args[0].as<ir::Argument::List>();
  EXPECT_EQ(g.node(rets[2].as<ir::ValueRef>().node).target.name, "_c10d_functional::wait_tensor");
  EXPECT_EQ(g.node(rets[3].as<ir::ValueRef>().node).name, "loss");
}

TEST(Expand, HyperparametersPassThroughUnchanged) {
  const ir::Graph src = ValueOrDie(ir::ParseGraphText(ReadTestData("mlp_sgd_hyper.txt")));
  Expansion e = ValueOrDie(ExpandText(ReadTestData("mlp_sgd_hyper.txt"), {.world_size = 3}));
  for (int r = 0; r < 3; ++r) {
    const ir::Graph& g = e.graph(r);
    for (const char* name : {"lr", "wd"}) {
      const ir::Node& before = Find(src, name);
      const ir::Node& after = Find(g, name);
      EXPECT_EQ(ir::PrintNode(g, *g.FindNode(name)), ir::PrintNode(src, *src.FindNode(name)));
      EXPECT_EQ(after.placeholder.role, ir::PlaceholderRole::kHyperparameter);
      EXPECT_EQ(after.placeholder.state_name, before.placeholder.state_name);
    }
    // Nothing is all-reduced but the two gradients and the loss.
    EXPECT_EQ(Count(g, "_c10d_functional::all_reduce"), 2);
    EXPECT_EQ(ir::HyperparameterNames(g), ir::HyperparameterNames(src));
  }
}

TEST(Expand, UnevenSplitWeightsByShare) {
  Expansion e = ValueOrDie(ExpandText(ReadTestData("mlp_sgd.txt"), {.world_size = 3}));
  EXPECT_FALSE(e.identical);
  ASSERT_EQ(e.report.slices.size(), 3u);
  EXPECT_EQ(e.report.slices[2].start, 6);
  EXPECT_EQ(e.report.slices[2].size, 2);
  EXPECT_EQ(Find(e.graph(0), "x").outputs[0].tensor.shape[0], 3);
  EXPECT_EQ(Find(e.graph(2), "x").outputs[0].tensor.shape[0], 2);
  // The loss is a mean (P(avg)): rank 2 scales its loss by 2/8 before the sum.
  const ir::Node& scale = Find(e.graph(2), "fxdp_scale");
  EXPECT_EQ(ir::PrintArgument(e.graph(2), scale.args[1]), "0.25");
}

TEST(Expand, BucketsFollowTheCaps) {
  // Three gradients of 4 KiB in production order g2, g1, g0; a first bucket
  // of 4 KiB and then 5 KiB: a bucket closes once it reaches its cap.
  std::string text = R"(graph format=1 producer="test" torch="2.13.0+cpu" {
  %w0: f32[32, 32] rg = placeholder() {role=PARAMETER, state="w0"}
  %w1: f32[32, 32] rg = placeholder() {role=PARAMETER, state="w1"}
  %w2: f32[32, 32] rg = placeholder() {role=PARAMETER, state="w2"}
  %x: f32[8, 32] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %xt: f32[32, 8]{1, 32} = aten::t(%x)
  %g2: f32[32, 32] = aten::mm(%xt, %x) {grad_of="w2"}
  %h: f32[8, 32] = aten::relu(%x)
  %ht: f32[32, 8]{1, 32} = aten::t(%h)
  %g1: f32[32, 32] = aten::mm(%ht, %x) {grad_of="w1"}
  %g0: f32[32, 32] = aten::mm(%ht, %h) {grad_of="w0"}
  %n0: f32[32, 32] = aten::sub.Tensor(%w0, %g0)
  %n1: f32[32, 32] = aten::sub.Tensor(%w1, %g1)
  %n2: f32[32, 32] = aten::sub.Tensor(%w2, %g2)
  %output = output([%n0, %n1, %n2]) {specs=[UPDATED_PARAMETER "w0", UPDATED_PARAMETER "w1", UPDATED_PARAMETER "w2"]}
}
)";
  ExpandOptions o{.world_size = 2, .bucket_cap_mb = 5.0 / 1024, .first_bucket_mb = 4.0 / 1024};
  Expansion e = ValueOrDie(ExpandText(text, o));
  ASSERT_EQ(e.report.buckets.size(), 2u);
  EXPECT_EQ(e.report.buckets[0].gradients, (std::vector<std::string>{"w2"}));
  EXPECT_EQ(e.report.buckets[1].gradients, (std::vector<std::string>{"w1", "w0"}));
  // Bucket 0 starts right after g2, long before backward ends: overlap.
  EXPECT_EQ(e.report.buckets[0].start_after, "g2");
  EXPECT_EQ(e.report.buckets[0].wait_before, "n2");  // g2's only use
  EXPECT_EQ(e.report.buckets[1].start_after, "g0");
  const ir::Graph& g = e.graph(0);
  EXPECT_EQ(Count(g, "_c10d_functional::all_reduce"), 2);  // no loss output here
  EXPECT_LT(g.FindNode("fxdp_all_reduce")->value, g.FindNode("h")->value);
  EXPECT_EQ(Count(g, "aten::cat"), 1);
}

TEST(Expand, ReplicatedRowsAreSlicedPerRank) {
  std::string text = R"(graph format=1 producer="test" torch="2.13.0+cpu" {
  %w: f32[3] rg = placeholder() {role=PARAMETER, state="w"}
  %c: f32[4, 3] = placeholder() {role=INPUT, state="c", batch_dim=-1}
  %x: f32[4, 3] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %xc: f32[4, 3] = aten::add.Tensor(%x, %c)
  %a: f32[4, 3] = aten::mul.Tensor(%xc, %w)
  %s: f32[] = aten::sum(%a)
  %one: f32[] = aten::ones_like(%s)
  %e: f32[4, 3]{0, 0} = aten::expand(%one, [4, 3])
  %ge: f32[4, 3] = aten::mul.Tensor(%e, %xc)
  %g: f32[3] = aten::sum.dim_IntList(%ge, [0], false) {grad_of="w"}
  %n: f32[3] = aten::sub.Tensor(%w, %g)
  %output = output([%n, %s]) {specs=[UPDATED_PARAMETER "w", LOSS]}
}
)";
  Expansion e = ValueOrDie(ExpandText(text, {.world_size = 2}));
  ASSERT_FALSE(e.identical);  // rank-specific slices of c
  const ir::Graph& g1 = e.graph(1);
  const ir::Node& slice = Find(g1, "fxdp_rows_c");
  EXPECT_EQ(slice.target.ToString(), "aten::slice.Tensor");
  EXPECT_EQ(ir::PrintArgument(g1, slice.args[2]), "2");
  EXPECT_EQ(ir::PrintArgument(g1, slice.args[3]), "4");
  EXPECT_EQ(g1.node(Find(g1, "xc").args[1].as<ir::ValueRef>().node).name, "fxdp_rows_c");
  EXPECT_EQ(Find(g1, "e").outputs[0].tensor.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(e.report.sharded_reads, 1);
}

TEST(Expand, StateThatDependsOnBatchRowsIsRejected) {
  // A parameter whose rows pair with batch rows: its gradient is sharded, not partial.
  EXPECT_THAT(
      ExpandText(R"(graph format=1 producer="test" torch="2.13.0+cpu" {
  %p: f32[4, 3] rg = placeholder() {role=PARAMETER, state="p"}
  %x: f32[4, 3] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %g: f32[4, 3] = aten::mul.Tensor(%x, %p) {grad_of="p"}
  %n: f32[4, 3] = aten::sub.Tensor(%p, %g)
  %output = output([%n]) {specs=[UPDATED_PARAMETER "p"]}
}
)",
                 {.world_size = 2})
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument, "output 0 (UPDATED_PARAMETER 'p') is S(0)"));
}

std::string MetadataValue(const ir::Graph& g, const std::string& key) {
  for (const auto& [k, v] : g.header().metadata) {
    if (k == key) return v;
  }
  return "<absent>";
}

// Gradient accumulation: x.chunk(2) in a loop over micro-batches. Each micro-batch is the batch
// the analysis sees (B = 4 of 8 rows); rank r holds its share of EACH micro-batch (RankRows: rows
// 0-1 and 4-5 on rank 0 of 2), which the rank graphs' "fxdp.micro_batch" tells the server and
// the workers; the gradient (the sum over micro-batches) is all-reduced once.
TEST(Expand, MicroBatchesGiveEachRankItsShareOfEach) {
  const std::string text = R"(graph format=1 producer="test" torch="2.13.0+cpu" {
  %w: f32[3] rg = placeholder() {role=PARAMETER, state="w"}
  %x: f32[8, 3] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %sp: (f32[4, 3], f32[4, 3]) = aten::split.Tensor(%x, 4)
  %x0: f32[4, 3] = operator.getitem(%sp#0, 0)
  %x1: f32[4, 3] = operator.getitem(%sp#1, 1)
  %g0: f32[3] = aten::mean.dim(%x0, [0], false)
  %g1: f32[3] = aten::mean.dim(%x1, [0], false)
  %g: f32[3] = aten::add.Tensor(%g0, %g1) {grad_of="w"}
  %n: f32[3] = aten::sub.Tensor(%w, %g)
  %l: f32[] = aten::sum(%g)
  %output = output([%n, %l]) {specs=[UPDATED_PARAMETER "w", LOSS]}
}
)";
  auto g = ValueOrDie(ir::ParseGraphText(text));
  auto a = ValueOrDie(AnalyzeBatchDims(g, {2}));
  EXPECT_EQ(a.batch_size(), 4);
  EXPECT_EQ(a.micro_batches(), 2);
  EXPECT_EQ(a.value({*g.FindNode("x0"), 0}).placement.ToString(), "S(0)");
  EXPECT_EQ(a.value({*g.FindNode("g"), 0}).placement.ToString(), "P(avg)");
  ASSERT_EQ(a.reductions().size(), 1u);
  Expansion e = ValueOrDie(ExpandDataParallel(g, a, {.world_size = 2}));
  const ir::Graph& g0 = e.graph(0);
  EXPECT_EQ(Find(g0, "x").outputs[0].tensor.shape, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(ir::PrintArgument(g0, Find(g0, "sp").args[1]), "2");
  EXPECT_EQ(Find(g0, "x1").outputs[0].tensor.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(Count(g0, "_c10d_functional::all_reduce"), 1);  // once per step, not per micro-batch
  EXPECT_EQ(MetadataValue(g0, ir::kMicroBatchKey), "4");
  EXPECT_EQ(e.report.micro_batches, 2);
  ASSERT_EQ(e.report.rank_rows.size(), 2u);
  EXPECT_EQ(e.report.rank_rows[1][1].start, 6);
  EXPECT_THAT(e.report.ToJson(), HasSubstr("\"micro_batches\": 2"));
  EXPECT_THAT(e.report.ToTable(), HasSubstr("rank 1: rows [2, 4) [6, 8)"));

  // 3 ranks: micro-batches of 4 rows split 2 + 1 + 1 (before, each rank split its own contiguous
  // rows, and 3 ranks were refused): rank 0 reads 4 rows in 2 pieces, ranks 1 and 2 two in 1.
  auto a3 = ValueOrDie(AnalyzeBatchDims(g, {3}));
  Expansion e3 = ValueOrDie(ExpandDataParallel(g, a3, {.world_size = 3}));
  ASSERT_FALSE(e3.identical);
  const int64_t want_rows[] = {4, 2, 2}, want_piece[] = {2, 1, 1};
  for (int r = 0; r < 3; ++r) {
    const ir::Graph& gr = e3.graph(r);
    EXPECT_EQ(Find(gr, "x").outputs[0].tensor.shape[0], want_rows[r]) << r;
    EXPECT_EQ(ir::PrintArgument(gr, Find(gr, "sp").args[1]), absl::StrCat(want_piece[r])) << r;
    EXPECT_EQ(ir::RowCount(e3.report.rank_rows[r]), want_rows[r]) << r;
    EXPECT_EQ(MetadataValue(gr, ir::kMicroBatchKey), "4") << r;
  }
  EXPECT_EQ(e3.report.rank_rows[2][1].start, 7);
}

// Micro-batches of unequal sizes (x.chunk(2) of 5 rows: 3 and 2) are refused at the split, with
// what to do; a step without micro-batches has no "fxdp.micro_batch" in its rank graphs.
TEST(Expand, UnequalMicroBatchesAreRefusedNamingTheSizes) {
  EXPECT_THAT(ExpandText(R"(graph format=1 producer="test" torch="2.13.0+cpu" {
  %w: f32[3] rg = placeholder() {role=PARAMETER, state="w"}
  %x: f32[5, 3] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %sp: (f32[3, 3], f32[2, 3]) = aten::split.Tensor(%x, 3)
  %x0: f32[3, 3] = operator.getitem(%sp#0, 0)
  %x1: f32[2, 3] = operator.getitem(%sp#1, 1)
  %g0: f32[3] = aten::mean.dim(%x0, [0], false)
  %g1: f32[3] = aten::mean.dim(%x1, [0], false)
  %g: f32[3] = aten::add.Tensor(%g0, %g1) {grad_of="w"}
  %n: f32[3] = aten::sub.Tensor(%w, %g)
  %output = output([%n]) {specs=[UPDATED_PARAMETER "w"]}
}
)",
                         {.world_size = 2})
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "node 'sp' (aten::split.Tensor): splits the batch of 5 samples along dim 0 "
                       "into micro-batches of 3 rows, the last of 2"));
  Expansion e = ValueOrDie(ExpandText(ReadTestData("mlp_sgd.txt"), {.world_size = 2}));
  EXPECT_EQ(MetadataValue(e.graph(0), ir::kMicroBatchKey), "<absent>");
  EXPECT_EQ(e.report.micro_batches, 1);
  EXPECT_THAT(e.report.ToJson(), Not(HasSubstr("micro_batches")));
}

TEST(Expand, Errors) {
  const std::string mlp = ReadTestData("mlp_sgd.txt");
  EXPECT_THAT(ExpandText(mlp, {.world_size = 9}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "world size 9 is larger than the batch (8 samples)"));
  std::string no_grads = mlp;
  for (size_t p; (p = no_grads.find(" {grad_of=")) != std::string::npos;) {
    no_grads.erase(p, no_grads.find('}', p) - p + 1);
  }
  EXPECT_THAT(ExpandText(no_grads, {.world_size = 2}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "marks no gradients"));
  auto g = ValueOrDie(ir::ParseGraphText(mlp));
  auto a = ValueOrDie(AnalyzeBatchDims(g, {2}));
  EXPECT_THAT(ExpandDataParallel(g, a, {.world_size = 4}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "analysis is for world size 2"));
}

TEST(Expand, ArangeOfTheBatchBecomesThisRanksPositions) {
  // logits[arange(B), idx]: rank r indexes its own B_r rows with arange(B_r).
  const std::string text = R"(graph format=1 producer="test" torch="2.13.0+cpu" {
  %w: f32[3] rg = placeholder() {role=PARAMETER, state="w"}
  %x: f32[5, 4, 3] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %tok: i64[5] = placeholder() {role=INPUT, state="tok", batch_dim=0}
  %xw: f32[5, 4, 3] = aten::mul.Tensor(%x, %w)
  %ar: i64[5] = aten::arange(5, device=device(cpu), pin_memory=false)
  %ix: f32[5, 3] = aten::index.Tensor(%xw, [%ar, %tok])
  %g: f32[3] = aten::sum.dim_IntList(%ix, [0], false) {grad_of="w"}
  %output = output([%g]) {specs=[OTHER]}
}
)";
  Expansion e = ValueOrDie(ExpandText(text, {.world_size = 2}));
  EXPECT_EQ(ir::PrintArgument(e.graph(0), Find(e.graph(0), "ar").args[0]), "3");
  EXPECT_EQ(ir::PrintArgument(e.graph(1), Find(e.graph(1), "ar").args[0]), "2");
  EXPECT_EQ(Find(e.graph(1), "ix").outputs[0].tensor.shape, (std::vector<int64_t>{2, 3}));
}

TEST(Expand, ReportPrints) {
  Expansion e = ValueOrDie(ExpandText(ReadTestData("mlp_sgd.txt"), {.world_size = 2}));
  EXPECT_THAT(e.report.ToTable(), HasSubstr("rank 1: samples [4, 8) (4)"));
  EXPECT_THAT(e.report.ToTable(), HasSubstr("bucket 0: 2 gradients, 60 bytes, sum"));
  EXPECT_THAT(e.report.ToJson(), HasSubstr("\"bytes_per_step\": 64"));
}

}  // namespace
}  // namespace fxdp
