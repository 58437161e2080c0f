// Instantiation of symbolic graphs (analysis/ir/instantiate.h): a graph traced
// once at 8x6 with symbolic B and S gives, at any batch its guards allow,
// exactly the graph a static trace at that batch gives; every other batch is
// refused naming the input, its shape, the guard, the user's line and what to do.
#include "analysis/ir/instantiate.h"

#include <gtest/gtest.h>

#include <string>

#include "analysis/ir/proto_codec.h"
#include "analysis/ir/text.h"
#include "tests/analysis/symbolic_graph.h"
#include "tests/test_util.h"

namespace fxdp::ir {
namespace {

using ::fxdp::testing::AddExpr;
using ::fxdp::testing::AddGuard;
using ::fxdp::testing::StaticGraphDef;
using ::fxdp::testing::StaticGraphText;
using ::fxdp::testing::StatusIs;
using ::fxdp::testing::SymbolicGraphDef;
using ::fxdp::testing::ValueOrDie;

InputShapes Shapes(int64_t b, int64_t s, int64_t b2, int64_t s2) {
  return {{"x", {b, s, 4}}, {"y", {b2, s2}}};
}

TEST(Instantiate, AtTheTracedShapeGivesTheStaticTrace) {
  const Graph g = ValueOrDie(Instantiate(SymbolicGraphDef(), Shapes(8, 6, 8, 6)));
  EXPECT_EQ(g, ValueOrDie(ParseGraphText(StaticGraphText(8, 6))));
}

TEST(Instantiate, AtOtherShapesGivesTheirStaticTraces) {
  for (auto [b, s] : {std::pair<int64_t, int64_t>{5, 7}, {2, 1}, {3, 133}, {16, 2}}) {
    SCOPED_TRACE(absl::StrCat(b, "x", s));
    const Graph g = ValueOrDie(Instantiate(SymbolicGraphDef(), Shapes(b, s, b, s)));
    EXPECT_EQ(g, ValueOrDie(ParseGraphText(StaticGraphText(b, s))));
    // Shapes, strides (x's [S*4, 4, 1]) and the views' size arguments all moved.
    EXPECT_EQ(g.node(NodeId{testing::kX}).outputs[0].tensor.stride,
              (std::vector<int64_t>{s * 4, 4, 1}));
    EXPECT_EQ(g.node(NodeId{testing::kFlat}).args[1],
              Argument(Argument::List{Argument(b * s), Argument(4)}));
  }
}

TEST(Instantiate, TheDefLosesEverySymbolicField) {
  const v1::GraphDef def = ValueOrDie(InstantiateDef(SymbolicGraphDef(), Shapes(5, 7, 5, 7)));
  EXPECT_EQ(def.SerializeAsString(), StaticGraphDef(5, 7).SerializeAsString());
}

TEST(Instantiate, AStaticGraphPassesThroughUnchanged) {
  const v1::GraphDef def = StaticGraphDef(8, 6);
  EXPECT_EQ(ValueOrDie(Instantiate(def, {})), ValueOrDie(DecodeGraph(def)));
  EXPECT_EQ(ValueOrDie(Instantiate(def, Shapes(8, 6, 8, 6))), ValueOrDie(DecodeGraph(def)));
  EXPECT_EQ(ValueOrDie(InstantiateDef(def, {})).SerializeAsString(), def.SerializeAsString());
  EXPECT_THAT(Instantiate(def, {{"x", {8, 7, 4}}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "input 'x' is [8, 7, 4], but the graph is static, traced at [8, 6, 4]: "
                       "re-trace with symbolic sizes (trace_step(..., dynamic=True)), or with "
                       "this batch as the example"));
}

TEST(Instantiate, BytesTakeTheSamePathsAsMessages) {
  const std::string symbolic = SymbolicGraphDef().SerializeAsString();
  EXPECT_EQ(ValueOrDie(InstantiateBytes(symbolic, Shapes(5, 7, 5, 7))),
            ValueOrDie(ParseGraphText(StaticGraphText(5, 7))));
  const std::string fixed = StaticGraphDef(8, 6).SerializeAsString();
  EXPECT_EQ(ValueOrDie(InstantiateBytes(fixed, {})), ValueOrDie(DecodeGraphBytes(fixed)));
  EXPECT_THAT(InstantiateBytes("\xff\xff", {}), StatusIs(absl::StatusCode::kInvalidArgument, ""));
}

// Without instantiation a symbolic graph is refused, never read at its hints
// (proto_codec.cc), and InstantiateBytes is how to read one.
TEST(Instantiate, DecodingASymbolicGraphIsRefused) {
  const v1::GraphDef def = SymbolicGraphDef();
  const auto refused = StatusIs(absl::StatusCode::kInvalidArgument,
                                "the graph has 4 symbolic sizes and 3 guards (docs/shapes.md): "
                                "instantiate it at concrete input shapes first");
  EXPECT_THAT(DecodeGraph(def), refused);
  EXPECT_THAT(DecodeGraphBytes(def.SerializeAsString()), refused);
  EXPECT_TRUE(InstantiateBytes(def.SerializeAsString(), Shapes(8, 6, 8, 6)).ok());
}

TEST(Instantiate, AFailedGuardNamesTheShapesTheGuardItsLineAndWhatToDo) {
  EXPECT_THAT(
      Instantiate(SymbolicGraphDef(), Shapes(5, 7, 4, 7)),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "at x=5x7x4, y=4x7: the trace assumed s2 == s0 [train.py:9: loss = step(x, y)], "
               "which does not hold here: 4 against 5 (s2=4 (input 'y' dim 0); s0=5 (input 'x' "
               "dim 0)): pad the batch to a shape the trace allows (a collator's "
               "pad_to_multiple_of), drop a partial last batch (DataLoader(drop_last=True)), or "
               "re-trace with this batch as the example"));
  EXPECT_THAT(Instantiate(SymbolicGraphDef(), Shapes(5, 7, 5, 8)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "the trace assumed s3 == s1 [model.py:7: d = s - y]"));
}

TEST(Instantiate, AGuardIsCheckedBeforeAZeroDivisorStopsTheEvaluation) {
  // chunk(3) traced at B=6 writes entries like B % (S*(B - 2*((B + 2)//3))), whose divisor is 0
  // at B=4, where the guards already refuse (two chunks, not three). Here: q = s0//8,
  // r = s0//q and the guard r <= s0; at s0=5, q is 0. Before: 'divides by zero', no guard.
  v1::GraphDef def = SymbolicGraphDef();
  const uint32_t b = AddExpr(&def, v1::SIZE_OP_SYMBOL, {}, 0);
  const uint32_t q =
      AddExpr(&def, v1::SIZE_OP_FLOORDIV, {b, AddExpr(&def, v1::SIZE_OP_CONST, {}, 8)});
  AddGuard(&def, v1::GUARD_LE, AddExpr(&def, v1::SIZE_OP_FLOORDIV, {b, q}), b,
           "model.py:4: for c in x.chunk(3):");
  EXPECT_TRUE(Instantiate(def, Shapes(9, 6, 9, 6)).ok());
  EXPECT_THAT(Instantiate(def, Shapes(5, 6, 5, 6)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "at x=5x6x4, y=5x6: the trace assumed s0//(s0//8) <= s0 [model.py:4: for c "
                       "in x.chunk(3):], which does not hold here: a side divides by zero"));
  // An entry no guard reads that divides by zero is still refused, by the entry.
  v1::GraphDef bare = SymbolicGraphDef();
  const uint32_t b0 = AddExpr(&bare, v1::SIZE_OP_SYMBOL, {}, 0);
  AddExpr(
      &bare, v1::SIZE_OP_FLOORDIV,
      {b0, AddExpr(&bare, v1::SIZE_OP_FLOORDIV, {b0, AddExpr(&bare, v1::SIZE_OP_CONST, {}, 8)})});
  EXPECT_THAT(
      Instantiate(bare, Shapes(5, 6, 5, 6)),
      StatusIs(absl::StatusCode::kInvalidArgument, "(s0//(s0//8)) divides by zero at s0=5"));
}

TEST(Instantiate, ASymbolOutsideItsRangeIsRefused) {
  // s0 has min 2 (the trace specialised batch sizes 0 and 1 away).
  EXPECT_THAT(Instantiate(SymbolicGraphDef(), Shapes(1, 7, 1, 7)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "at x=1x7x4, y=1x7: input 'x' is [1, 7, 4]: its dim 0 (s0) is 1, "
                       "but the trace holds for s0 in [2, inf] (traced at 8): pad"));
  v1::GraphDef def = SymbolicGraphDef();
  def.mutable_symbols(1)->set_max(64);
  EXPECT_THAT(Instantiate(def, Shapes(5, 65, 5, 65)),
              StatusIs(absl::StatusCode::kInvalidArgument, "s1 in [0, 64]"));
}

// Node `node`'s output dim 1 becomes the expression s1 + c (expression 2 of
// SymbolicGraphDef is the symbol s1, given as 1 + its index like every operand).
void SetDim1ToS1Plus(v1::GraphDef* def, int node, int64_t c) {
  const uint32_t e =
      testing::AddExpr(def, v1::SIZE_OP_ADD, {2, testing::AddExpr(def, v1::SIZE_OP_CONST, {}, c)});
  def->mutable_nodes(node)->mutable_outputs(0)->mutable_tensor()->set_shape_expr(1, e);
}

TEST(Instantiate, EveryInputDimIsChecked) {
  const v1::GraphDef def = SymbolicGraphDef();
  EXPECT_THAT(Instantiate(def, {{"x", {5, 7, 3}}, {"y", {5, 7}}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "input 'x' is [5, 7, 3], but its dim 2 must be static in the "
                       "trace: 4: pad"));
  EXPECT_THAT(Instantiate(def, {{"x", {5, 7}}, {"y", {5, 7}}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "input 'x' is [5, 7], but the graph's has 3 dims (traced at [8, 6, 4])"));
  EXPECT_THAT(
      Instantiate(def, {{"x", {5, 7, 4}}}),
      StatusIs(
          absl::StatusCode::kInvalidArgument,
          "no shape was given for input 'y' (traced at [8, 6]; its dim 0 is s2): give the shape of "
          "every input with a symbolic dim (the fxdp CLI: `--shape y=8x6`)"));
  EXPECT_THAT(Instantiate(def, {{"x", {5, 7, 4}}, {"y", {5, 7}}, {"z", {1}}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "the graph has no input 'z'"));
  EXPECT_THAT(Instantiate(def, {{"x", {5, -7, 4}}, {"y", {5, 7}}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "sizes are >= 0"));
  // A dim given as another's expression: y's dim 1 is S + 1.
  v1::GraphDef plus = SymbolicGraphDef();
  SetDim1ToS1Plus(&plus, testing::kY, 1);
  EXPECT_THAT(Instantiate(plus, Shapes(5, 7, 5, 7)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "input 'y' is [5, 7], but its dim 1 must be s1 + 1 = 8, from "
                       "s1=7 (input 'x' dim 1)"));
}

TEST(Instantiate, ANegativeSizeNamesTheNodeAndItsLine) {
  v1::GraphDef def = SymbolicGraphDef();
  SetDim1ToS1Plus(&def, testing::kV, -10);
  EXPECT_THAT(Instantiate(def, Shapes(5, 7, 5, 7)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "node 'v' (aten::view) [model.py:5: h = h.view(b, s, 3)]: output "
                       "0 dim 1 is s1 + -10 = -3 < 0 (s1=7 (input 'x' dim 1))"));
}

TEST(Instantiate, TheStateNeverHasASymbolicSize) {
  v1::GraphDef def = SymbolicGraphDef();
  v1::TensorMeta* w = def.mutable_nodes(testing::kW)->mutable_outputs(0)->mutable_tensor();
  w->add_shape_expr(0);
  w->add_shape_expr(1);
  EXPECT_THAT(Instantiate(def, Shapes(5, 7, 5, 7)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "state 'w' has a symbolic size; only batch INPUTs may"));
}

TEST(Instantiate, NodeIndicesAreChecked) {
  struct Case {
    const char* what;
    void (*mutate)(v1::GraphDef*);
    const char* error;
  };
  const Case cases[] = {
      {"index past the table",
       [](v1::GraphDef* d) {
         d->mutable_nodes(testing::kMm)
             ->mutable_outputs(0)
             ->mutable_tensor()
             ->set_shape_expr(1, 11);
       },
       "shape_expr is 11 (1 + an index), but the graph has 10 size expressions"},
      {"one entry per dim",
       [](v1::GraphDef* d) {
         d->mutable_nodes(testing::kMm)->mutable_outputs(0)->mutable_tensor()->add_shape_expr(0);
       },
       "shape_expr has 3 entries for 2 dims"},
      {"strides too",
       [](v1::GraphDef* d) {
         d->mutable_nodes(testing::kMm)->mutable_outputs(0)->mutable_tensor()->add_stride_expr(1);
       },
       "stride_expr has 1 entries for 2 dims"},
      {"offset",
       [](v1::GraphDef* d) {
         d->mutable_nodes(testing::kMm)
             ->mutable_outputs(0)
             ->mutable_tensor()
             ->set_storage_offset_expr(99);
       },
       "storage_offset_expr is 99"},
      {"a size on a float",
       [](v1::GraphDef* d) {
         v1::Argument* a =
             d->mutable_nodes(testing::kFlat)->mutable_args(1)->mutable_list()->mutable_items(1);
         a->set_float_value(4.0);
         a->set_size_expr(1);
       },
       "a size expression on an argument that is not an int"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    v1::GraphDef def = SymbolicGraphDef();
    c.mutate(&def);
    EXPECT_THAT(Instantiate(def, Shapes(5, 7, 5, 7)),
                StatusIs(absl::StatusCode::kInvalidArgument, c.error));
  }
}

TEST(ParseInputShape, ReadsNameEqualsDims) {
  InputShapes s;
  ASSERT_TRUE(ParseInputShape("input_ids=8x60", &s).ok());
  ASSERT_TRUE(ParseInputShape("scale=", &s).ok());
  EXPECT_EQ(s, (InputShapes{{"input_ids", {8, 60}}, {"scale", {}}}));
  EXPECT_EQ(InputShapesText(s), "input_ids=8x60, scale=");
  for (const char* bad : {"8x60", "=8", "x=8x", "x=8xy", "x=-1", "x=8,60"}) {
    SCOPED_TRACE(bad);
    InputShapes t;
    EXPECT_THAT(ParseInputShape(bad, &t),
                StatusIs(absl::StatusCode::kInvalidArgument, "is not NAME=SHAPE"));
  }
  EXPECT_THAT(ParseInputShape("input_ids=1", &s),
              StatusIs(absl::StatusCode::kInvalidArgument, "input 'input_ids' is given twice"));
}

}  // namespace
}  // namespace fxdp::ir
