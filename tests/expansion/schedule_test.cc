// The overlap schedule (expansion/schedule.h) and the split of the last
// bucket (ExpandOptions::last_bucket_mb): order invariants on expanded
// graphs. tests/executor/schedule_equivalence_test.cc runs them.
#include "expansion/schedule.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "analysis/ir/text.h"
#include "expansion/data_parallel.h"
#include "tests/expansion/expand_util.h"
#include "tests/test_util.h"

namespace fxdp {
namespace {

using ::fxdp::testing::ExpandText;
using ::fxdp::testing::IndexOf;
using ::fxdp::testing::ReadTestData;
using ::fxdp::testing::ValueOrDie;

constexpr double kKiB = 1.0 / 1024;  // in MiB

Expansion Expand(const std::string& text, ExpandOptions o) {
  return ValueOrDie(ExpandText(text, o));
}

std::vector<std::string> Names(const ir::Graph& g) {
  std::vector<std::string> v;
  for (const ir::Node& n : g.nodes()) v.push_back(n.name);
  return v;
}

bool Is(const ir::Node& n, absl::string_view target) { return n.target.name == target; }

// mlp3_momentum.txt: gradients of 256 bytes, produced g2, g1, g0; the
// optimizer updates w0, w1, w2 in that order.
ExpandOptions ThreeBuckets(int32_t world) {
  return ExpandOptions{.world_size = world,
                       .bucket_cap_mb = 1.0,
                       .first_bucket_mb = 0.25 * kKiB,
                       .last_bucket_mb = 0.25 * kKiB};
}

TEST(LastBucket, TheTailOfTheLastBucketIsSplitOff) {
  const std::string text = ReadTestData("mlp3_momentum.txt");
  ExpandOptions o = ThreeBuckets(2);
  Expansion e = Expand(text, o);
  ASSERT_EQ(e.report.buckets.size(), 3u);
  EXPECT_EQ(e.report.buckets[0].gradients, (std::vector<std::string>{"w2"}));
  EXPECT_EQ(e.report.buckets[1].gradients, (std::vector<std::string>{"w1"}));
  EXPECT_EQ(e.report.buckets[2].gradients, (std::vector<std::string>{"w0"}));
  EXPECT_EQ(e.report.buckets[1].start_after, "g1");  // no longer waits for g0
  // last_bucket_mb = 0: DDP's buckets.
  o.last_bucket_mb = 0;
  e = Expand(text, o);
  ASSERT_EQ(e.report.buckets.size(), 2u);
  EXPECT_EQ(e.report.buckets[1].gradients, (std::vector<std::string>{"w1", "w0"}));
  // A last bucket under the cap is left alone (the default, 1 MiB).
  o.last_bucket_mb = 1.0;
  EXPECT_EQ(Expand(text, o).report.buckets.size(), 2u);
}

// Five gradients of 4 KiB, produced w4 ... w0; DDP's caps give [w4] and
// [w3 w2 w1 w0]; its tail with caps 4, 8, 16 KiB gives [w0], [w2 w1], and the
// leftover [w3] (4 KiB, under half of 16) joins [w2 w1].
TEST(LastBucket, CapsDoubleAndASmallLeftoverJoinsItsNeighbour) {
  std::string text = "graph format=1 producer=\"test\" torch=\"2.13.0+cpu\" {\n";
  for (int i = 0; i < 5; ++i)
    absl::StrAppend(&text, "  %w", i, ": f32[32, 32] rg = placeholder() {role=PARAMETER, state=\"w",
                    i, "\"}\n");
  absl::StrAppend(&text,
                  "  %x: f32[8, 32] = placeholder() {role=INPUT, state=\"x\", batch_dim=0}\n"
                  "  %xt: f32[32, 8]{1, 32} = aten::t(%x)\n");
  for (int i = 4; i >= 0; --i)
    absl::StrAppend(&text, "  %g", i, ": f32[32, 32] = aten::mm(%xt, %x) {grad_of=\"w", i, "\"}\n");
  std::string outs, specs;
  for (int i = 0; i < 5; ++i) {
    absl::StrAppend(&text, "  %n", i, ": f32[32, 32] = aten::sub.Tensor(%w", i, ", %g", i, ")\n");
    absl::StrAppend(&outs, i ? ", " : "", "%n", i);
    absl::StrAppend(&specs, i ? ", " : "", "UPDATED_PARAMETER \"w", i, "\"");
  }
  absl::StrAppend(&text, "  %output = output([", outs, "]) {specs=[", specs, "]}\n}\n");
  Expansion e = Expand(text, {.world_size = 2,
                              .bucket_cap_mb = 1.0,
                              .first_bucket_mb = 4 * kKiB,
                              .last_bucket_mb = 4 * kKiB});
  ASSERT_EQ(e.report.buckets.size(), 3u);
  EXPECT_EQ(e.report.buckets[0].gradients, (std::vector<std::string>{"w4"}));
  EXPECT_EQ(e.report.buckets[1].gradients, (std::vector<std::string>{"w3", "w2", "w1"}));
  EXPECT_EQ(e.report.buckets[2].gradients, (std::vector<std::string>{"w0"}));
  // A bucket cap below the tail's caps stops their growth: [w0], [w1], [w2],
  // and the leftover [w3] holds its whole (4 KiB) cap.
  e = Expand(text, {.world_size = 2,
                    .bucket_cap_mb = 4 * kKiB,
                    .first_bucket_mb = 4 * kKiB,
                    .last_bucket_mb = 4 * kKiB});
  ASSERT_EQ(e.report.buckets.size(), 5u);
  for (int b = 0; b < 5; ++b)
    EXPECT_EQ(e.report.buckets[b].gradients, (std::vector<std::string>{absl::StrCat("w", 4 - b)}));
}

TEST(OverlapSchedule, UpdatesOfABucketRunWhileLaterBucketsAreInFlight) {
  Expansion e = Expand(ReadTestData("mlp3_momentum.txt"), ThreeBuckets(2));
  const ir::Graph& g = e.graph(0);
  // Bucket k (gradient of w{2-k}) is waited on, then its parameter is
  // updated, before bucket k+1 is waited on.
  const int32_t w0 = IndexOf(g, "fxdp_wait_bucket0"), w1 = IndexOf(g, "fxdp_wait_bucket1"),
                w2 = IndexOf(g, "fxdp_wait_bucket2");
  EXPECT_LT(w0, IndexOf(g, "nw2"));
  EXPECT_LT(IndexOf(g, "nw2"), w1);
  EXPECT_LT(w1, IndexOf(g, "nw1"));
  EXPECT_LT(IndexOf(g, "nw1"), w2);
  EXPECT_LT(w2, IndexOf(g, "nw0"));
  // Every all_reduce starts before the first bucket wait, and so does the
  // optimizer's work on its own state (momentum * 0.9).
  for (const ir::Node& n : g.nodes()) {
    if (Is(n, "_c10d_functional::all_reduce")) {
      EXPECT_LT(IndexOf(g, n.name), w0) << n.name;
    }
  }
  for (const char* m : {"mm0", "mm1", "mm2"}) EXPECT_LT(IndexOf(g, m), w0) << m;
  // The loss all_reduce (emitted with the outputs) starts right after the loss,
  // its wait is the last node before the output.
  const std::string loss_ar = e.report.collectives[0].node;
  EXPECT_EQ(e.report.collectives[0].purpose, "loss");
  EXPECT_EQ(IndexOf(g, loss_ar), IndexOf(g, "loss") + 2);  // after its scale
  EXPECT_EQ(e.report.collectives[0].position, IndexOf(g, loss_ar));
  const ir::Node& last = g.nodes()[g.size() - 2];
  EXPECT_TRUE(Is(last, "_c10d_functional::wait_tensor"));
  EXPECT_EQ(g.node(last.args[0].as<ir::ValueRef>().node).name, loss_ar);
  // The report lists the collectives in the order they start.
  for (size_t k = 1; k < e.report.collectives.size(); ++k)
    EXPECT_LT(e.report.collectives[k - 1].position, e.report.collectives[k].position);
  // Each wait comes right before the first node that reads it.
  for (const ir::Node& n : g.nodes()) {
    if (!Is(n, "_c10d_functional::wait_tensor")) continue;
    int32_t first_use = g.size();
    for (int32_t i = 0; i < g.size(); ++i) {
      g.nodes()[i].ForEachInput([&](ir::ValueRef r) {
        if (g.node(r.node).name == n.name) first_use = std::min(first_use, i);
      });
    }
    EXPECT_EQ(first_use, IndexOf(g, n.name) + 1) << n.name;
  }
}

TEST(OverlapSchedule, IsATopologicalOrderThatDependsOnStructureOnly) {
  // Uneven split: rank graphs differ in shapes, not in order.
  Expansion e = Expand(ReadTestData("mlp3_momentum.txt"), ThreeBuckets(3));
  ASSERT_EQ(e.world_size(), 3);
  ASSERT_EQ(e.distinct_graphs.size(), 3u);
  EXPECT_FALSE(e.identical);
  EXPECT_EQ(Names(e.graph(1)), Names(e.graph(0)));
  EXPECT_EQ(Names(e.graph(2)), Names(e.graph(0)));
  for (const ir::Graph& g : e.distinct_graphs) {
    // Every reference points backwards (Graph::Create verified it too).
    for (int32_t i = 0; i < g.size(); ++i)
      g.nodes()[i].ForEachInput([&](ir::ValueRef r) { EXPECT_LT(r.node.value, i); });
    // Scheduling a scheduled graph changes nothing.
    EXPECT_EQ(OverlapSchedule(g).moved, 0);
  }
  // Same nodes as without the schedule, in another order.
  ExpandOptions off = ThreeBuckets(3);
  off.overlap_schedule = false;
  Expansion plain = Expand(ReadTestData("mlp3_momentum.txt"), off);
  std::vector<std::string> a = Names(plain.graph(0)), b = Names(e.graph(0));
  EXPECT_NE(a, b);
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  EXPECT_EQ(a, b);
  const ScheduleInfo s = OverlapSchedule(plain.graph(0));
  EXPECT_EQ(s.deferred_waits, 4);  // 3 buckets + the loss
  EXPECT_GT(s.moved, 0);
  const ir::Graph re = ValueOrDie(Reorder(plain.graph(0), s.order));
  EXPECT_EQ(Names(re), Names(e.graph(0)));
}

TEST(OverlapSchedule, WaitsThatFeedACollectiveStayInPlace) {
  // `x - x.mean(0)` all-reduces the mean in the forward pass and waits before
  // the subtraction: the gradient's bucket depends on it, so that wait keeps
  // its place (it is not a level) and the forward pass stays in order.
  const std::string text = R"(graph format=1 producer="test" torch="2.13.0+cpu" {
  %w: f32[4, 4] rg = placeholder() {role=PARAMETER, state="w"}
  %x: f32[8, 4] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %mu: f32[1, 4] = aten::mean.dim(%x, [0], true)
  %c: f32[8, 4] = aten::sub.Tensor(%x, %mu)
  %ct: f32[4, 8]{1, 4} = aten::t(%c)
  %g: f32[4, 4] = aten::mm(%ct, %c) {grad_of="w"}
  %n: f32[4, 4] = aten::sub.Tensor(%w, %g)
  %output = output([%n]) {specs=[UPDATED_PARAMETER "w"]}
}
)";
  Expansion e = Expand(text, {.world_size = 2});
  const ir::Graph& g = e.graph(0);
  ASSERT_EQ(e.report.collectives.size(), 2u);
  int waits = 0;
  for (const ir::Node& n : g.nodes()) waits += Is(n, "_c10d_functional::wait_tensor");
  EXPECT_EQ(waits, 2);
  EXPECT_EQ(OverlapSchedule(g).deferred_waits, 1);  // the bucket's only
  EXPECT_LT(IndexOf(g, "mu"), IndexOf(g, "c"));
  EXPECT_LT(IndexOf(g, "c"), IndexOf(g, "g"));
}

TEST(OverlapSchedule, GraphInputsKeepTheirOrder) {
  // %m feeds no collective, %x feeds the bucket's all_reduce: sorted by the collective each node
  // feeds first, %x moved above %m, and fxdp.dp_oracle (which binds the batch to the INPUT
  // placeholders by position) fed each input the other's slice.
  const std::string text = R"(graph format=1 producer="test" torch="2.13.0+cpu" {
  %w: f32[4, 4] rg = placeholder() {role=PARAMETER, state="w"}
  %m: f32[8] = placeholder() {role=INPUT, state="m", batch_dim=0}
  %x: f32[8, 4] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %xt: f32[4, 8]{1, 4} = aten::t(%x)
  %g: f32[4, 4] = aten::mm(%xt, %x) {grad_of="w"}
  %n: f32[4, 4] = aten::sub.Tensor(%w, %g)
  %s: f32[] = aten::sum(%m)
  %output = output([%n, %s]) {specs=[UPDATED_PARAMETER "w", OTHER]}
}
)";
  Expansion e = Expand(text, {.world_size = 2});
  const ir::Graph& g = e.graph(0);
  EXPECT_EQ(IndexOf(g, "w"), 0);
  EXPECT_EQ(IndexOf(g, "m"), 1);
  EXPECT_EQ(IndexOf(g, "x"), 2);
  EXPECT_EQ(OverlapSchedule(g).moved, 0);
}

TEST(OverlapSchedule, AGatherKeepsItsPlaceButNeverRisesAboveItsProducer) {
  // AnchorGathers: an all_gather, and the packing only it reads (%s), stay right after the node
  // before them. Here that node is a bucket's all_reduce (%ar), which the schedule hoists to
  // right after its gradient, above %h and %v, the value the packing reads (a mean-scaled
  // gradient unscaled and gathered, issue 23): anchored to %ar alone the packing came out before
  // %v (a forward reference). The expansion emits exactly this for a softmax over the batch
  // under a mean loss (test_coupled_batch's test_a_gathers_packing_stays_after_its_producer).
  const std::string text = R"(graph format=1 producer="test" torch="2.13.0+cpu" {
  %w: f32[4] rg = placeholder() {role=PARAMETER, state="w"}
  %x: f32[4] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %g: f32[4] = aten::mul.Tensor(%x, %w)
  %flat: f32[4] = aten::reshape(%g, [-1])
  %h: f32[4] = aten::exp(%x)
  %v: f32[4] = aten::tanh(%h)
  %ar: f32[4] = _c10d_functional::all_reduce(%flat, "sum", "0")
  %s: f32[4] = aten::mul.Scalar(%v, 0.5)
  %ag: f32[8] = _c10d_functional::all_gather_into_tensor(%s, 2, "0")
  %agw: f32[8] = _c10d_functional::wait_tensor(%ag)
  %u: f32[] = aten::sum(%agw)
  %wt: f32[4] = _c10d_functional::wait_tensor(%ar)
  %n: f32[4] = aten::sub.Tensor(%w, %wt)
  %output = output([%n, %u]) {specs=[UPDATED_PARAMETER "w", OTHER]}
}
)";
  const ir::Graph g = ValueOrDie(ir::ParseGraphText(text));
  const ScheduleInfo info = OverlapSchedule(g);
  const ir::Graph r = ValueOrDie(Reorder(g, info.order));  // topological
  EXPECT_LT(IndexOf(r, "flat"), IndexOf(r, "ar"));         // the all_reduce hoisted above %h and %v
  EXPECT_LT(IndexOf(r, "ar"), IndexOf(r, "h"));
  EXPECT_EQ(IndexOf(r, "s"), IndexOf(r, "v") + 1);  // the packing right after its producer
  EXPECT_EQ(IndexOf(r, "ag"), IndexOf(r, "s") + 1);
}

}  // namespace
}  // namespace fxdp
