// ShapeVariants (server/jobs/shape_variants.h): a job's symbolic graph
// compiled per batch shape through the compile service's Expand: each shape's
// rank graphs equal expanding the static trace at that shape, shapes seen
// before are not compiled again, the least recently used go past max_shapes,
// and a batch the guards refuse is an error naming it.
#include "server/jobs/shape_variants.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <utility>

#include "server/compile/compile_service.h"
#include "tests/analysis/symbolic_graph.h"
#include "tests/test_util.h"

namespace fxdp::server {
namespace {

using ::fxdp::testing::StaticGraphDef;
using ::fxdp::testing::StatusIs;
using ::fxdp::testing::SymbolicGraphDef;
using ::fxdp::testing::ValueOrDie;

v1::ExpandRequest Request(v1::GraphDef graph) {
  v1::ExpandRequest r;
  *r.mutable_graph() = std::move(graph);
  r.set_world_size(2);
  return r;
}

ir::InputShapes Shapes(int64_t b, int64_t s) { return {{"x", {b, s, 4}}, {"y", {b, s}}}; }

// The compile service's Expand, counting its calls in `calls`.
auto CountingExpand(int* calls) {
  return [calls](const v1::ExpandRequest& r) {
    ++*calls;
    return RunExpand(r);
  };
}

TEST(ShapeVariants, EachShapeIsItsStaticTraceExpanded) {
  int calls = 0;
  ShapeVariants v(Request(SymbolicGraphDef(/*train=*/true)), CountingExpand(&calls));
  for (auto [b, s] : {std::pair<int64_t, int64_t>{8, 6}, {5, 7}, {3, 133}}) {
    SCOPED_TRACE(absl::StrCat(b, "x", s));
    const ShapeVariant got = ValueOrDie(v.Get(Shapes(b, s)));
    EXPECT_TRUE(got.compiled);
    const v1::ExpandResponse want =
        ValueOrDie(RunExpand(Request(StaticGraphDef(b, s, /*train=*/true))));
    ASSERT_EQ(got.expanded->graphs_size(), want.graphs_size());
    for (int r = 0; r < want.graphs_size(); ++r)
      EXPECT_EQ(got.expanded->graphs(r).SerializeAsString(), want.graphs(r).SerializeAsString());
    EXPECT_EQ(got.expanded->report_json(), want.report_json());
  }
  EXPECT_EQ(calls, 3);
  const ShapeVariant again = ValueOrDie(v.Get(Shapes(5, 7)));
  EXPECT_EQ(again.expanded.get(), ValueOrDie(v.Get(Shapes(5, 7))).expanded.get());
  EXPECT_FALSE(again.compiled);
  EXPECT_EQ(again.graph_id, 2u);  // ids in compile order from 1
  EXPECT_EQ(again.shape, "x=5x7x4 y=5x7");
  EXPECT_EQ(calls, 3);  // seen before: not compiled again
  EXPECT_EQ(v.hits(), 2);
  EXPECT_EQ(v.misses(), 3);
}

TEST(ShapeVariants, KeepsTheLastMaxShapes) {
  int calls = 0;
  ShapeVariants v(Request(SymbolicGraphDef(true)), CountingExpand(&calls), /*max_shapes=*/2);
  for (int64_t s : {4, 5, 4, 6, 4, 5}) ASSERT_TRUE(v.Get(Shapes(2, s)).ok());
  // 4, 5 compiled; 4 hit; 6 evicts 5; 4 hit; 5 again compiled (evicting 6).
  EXPECT_EQ(calls, 4);
  EXPECT_EQ(v.size(), 2);
  EXPECT_EQ(ValueOrDie(v.Get(Shapes(2, 5))).graph_id, 4u);  // a new id per compile
  // JobInfo.shapes: first seen first, steps per shape, the evicted marked.
  ASSERT_EQ(v.compiled().size(), 3u);
  EXPECT_EQ(v.compiled()[0].shape(), "x=2x4x4 y=2x4");
  EXPECT_EQ(v.compiled()[0].steps(), 3);
  EXPECT_FALSE(v.compiled()[0].evicted());
  EXPECT_EQ(v.compiled()[1].steps(), 3);
  EXPECT_FALSE(v.compiled()[1].evicted());
  EXPECT_TRUE(v.compiled()[2].evicted());
}

TEST(ShapeVariants, ThePinnedShapeIsGraphZeroAndCountsInMaxShapes) {
  int calls = 0;
  ShapeVariants v(Request(SymbolicGraphDef(true)), CountingExpand(&calls), /*max_shapes=*/2);
  auto zero = std::make_shared<const v1::ExpandResponse>(
      ValueOrDie(RunExpand(Request(StaticGraphDef(8, 6, true)))));
  v.Pin(Shapes(8, 6), zero, 12.5);
  EXPECT_EQ(v.max_graphs(), 1);
  for (int64_t s : {6, 5, 6, 7, 6}) ASSERT_TRUE(v.Get(Shapes(s == 6 ? 8 : 2, s)).ok());
  EXPECT_EQ(calls, 2);  // 2x5, 2x7; 8x6 is never compiled again nor evicted
  const ShapeVariant pinned = ValueOrDie(v.Get(Shapes(8, 6)));
  EXPECT_EQ(pinned.graph_id, 0u);
  EXPECT_EQ(pinned.expanded.get(), zero.get());
  ASSERT_EQ(v.compiled().size(), 3u);
  EXPECT_EQ(v.compiled()[0].compile_ms(), 12.5);
  EXPECT_EQ(v.compiled()[0].steps(), 4);
  EXPECT_TRUE(v.compiled()[1].evicted());
  ShapeVariants one(Request(SymbolicGraphDef(true)), RunExpand, /*max_shapes=*/1);
  one.Pin(Shapes(8, 6), zero, 1);
  EXPECT_THAT(one.Get(Shapes(2, 5)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "the batch is x=2x5x4 y=2x5, but JobSpec.max_shapes is 1: the job runs its "
                       "traced shape only (x=8x6x4 y=8x6)"));
}

TEST(RankPrograms, EachRankLoadsAProgramOnceAndDropsTheLeastRecentlyUsed) {
  RankPrograms p(/*world=*/2, /*max_graphs=*/2);
  auto run = [&p](int rank, uint32_t id) {
    const RankPrograms::Use u = p.Run(rank, id);
    return std::make_pair(u.load, u.evict);
  };
  using L = std::pair<bool, uint32_t>;
  EXPECT_EQ(run(0, 0), L(false, 0));  // AssignJob's: always held
  EXPECT_EQ(run(0, 1), L(true, 0));
  EXPECT_EQ(run(0, 2), L(true, 0));
  EXPECT_EQ(run(0, 1), L(false, 0));
  EXPECT_EQ(run(0, 3), L(true, 2));  // 2 was used least recently
  EXPECT_EQ(run(1, 3), L(true, 0));  // each rank its own
  EXPECT_THAT(p.held(0), ::testing::ElementsAre(1u, 3u));
}

TEST(ShapeVariants, ABatchTheGuardsRefuseNamesItself) {
  ShapeVariants v(Request(SymbolicGraphDef(true)), RunExpand);
  EXPECT_THAT(v.Get({{"x", {5, 7, 4}}, {"y", {4, 7}}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "at x=5x7x4, y=4x7: the trace assumed s2 == s0 [train.py:9"));
  EXPECT_EQ(v.size(), 0);
  // An expansion error names the shapes: B = 1 is below the world size.
  v1::GraphDef def = SymbolicGraphDef(true);
  def.mutable_symbols(0)->set_min(1);
  def.mutable_guards()->RemoveLast();  // 2 <= s0
  ShapeVariants one(Request(def), RunExpand);
  EXPECT_THAT(one.Get(Shapes(1, 7)),
              StatusIs(absl::StatusCode::kInvalidArgument, "the graph at x=1x7x4, y=1x7: "));
}

TEST(ShapeVariants, AStaticGraphHasItsOwnShapeOnly) {
  ShapeVariants v(Request(StaticGraphDef(8, 6, true)), RunExpand);
  EXPECT_TRUE(v.Get(Shapes(8, 6)).ok());
  EXPECT_TRUE(v.Get({}).ok());
  EXPECT_THAT(v.Get(Shapes(8, 5)),
              StatusIs(absl::StatusCode::kInvalidArgument, "but the graph is static"));
}

}  // namespace
}  // namespace fxdp::server
