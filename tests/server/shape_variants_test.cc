// ShapeVariants (server/jobs/shape_variants.h): a job's symbolic graph
// compiled per batch shape through the compile service's Expand: each shape's
// rank graphs equal expanding the static trace at that shape, shapes seen
// before are not compiled again, the least recently used go past max_shapes,
// and a batch the guards refuse is an error naming it.
#include "server/jobs/shape_variants.h"

#include <gtest/gtest.h>

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

TEST(ShapeVariants, EachShapeIsItsStaticTraceExpanded) {
  int calls = 0;
  ShapeVariants v(Request(SymbolicGraphDef(/*train=*/true)), [&calls](const v1::ExpandRequest& r) {
    ++calls;
    return RunExpand(r);
  });
  for (auto [b, s] : {std::pair<int64_t, int64_t>{8, 6}, {5, 7}, {3, 133}}) {
    SCOPED_TRACE(absl::StrCat(b, "x", s));
    const auto got = ValueOrDie(v.Get(Shapes(b, s)));
    const v1::ExpandResponse want =
        ValueOrDie(RunExpand(Request(StaticGraphDef(b, s, /*train=*/true))));
    ASSERT_EQ(got->graphs_size(), want.graphs_size());
    for (int r = 0; r < want.graphs_size(); ++r)
      EXPECT_EQ(got->graphs(r).SerializeAsString(), want.graphs(r).SerializeAsString());
    EXPECT_EQ(got->report_json(), want.report_json());
  }
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(ValueOrDie(v.Get(Shapes(5, 7))).get(), ValueOrDie(v.Get(Shapes(5, 7))).get());
  EXPECT_EQ(calls, 3);  // seen before: not compiled again
  EXPECT_EQ(v.hits(), 2);
  EXPECT_EQ(v.misses(), 3);
}

TEST(ShapeVariants, KeepsTheLastMaxShapes) {
  int calls = 0;
  ShapeVariants v(
      Request(SymbolicGraphDef(true)),
      [&calls](const v1::ExpandRequest& r) {
        ++calls;
        return RunExpand(r);
      },
      /*max_shapes=*/2);
  for (int64_t s : {4, 5, 4, 6, 4, 5}) ASSERT_TRUE(v.Get(Shapes(2, s)).ok());
  // 4, 5 compiled; 4 hit; 6 evicts 5; 4 hit; 5 again compiled (evicting 6).
  EXPECT_EQ(calls, 4);
  EXPECT_EQ(v.size(), 2);
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
