// The size-expression table of symbolic graphs (analysis/ir/size_exprs.h):
// Python's integer semantics, checked arithmetic, bounded checks and text, and
// instantiation of randomly corrupted graphs returning a status, never crashing.
#include "analysis/ir/size_exprs.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "analysis/ir/instantiate.h"
#include "tests/analysis/symbolic_graph.h"
#include "tests/test_util.h"

namespace fxdp::ir {
namespace {

using ::fxdp::testing::AddExpr;
using ::fxdp::testing::AddSymbol;
using ::fxdp::testing::StaticGraphDef;
using ::fxdp::testing::StatusIs;
using ::fxdp::testing::SymbolicGraphDef;
using ::fxdp::testing::ValueOrDie;

// A graph with symbols a = x dim 0, b = x dim 1 and an empty table.
v1::GraphDef TwoSymbols() {
  v1::GraphDef def = StaticGraphDef(8, 6);
  AddSymbol(&def, "a", testing::kX, 0, 8);
  AddSymbol(&def, "b", testing::kX, 1, 6);
  AddExpr(&def, v1::SIZE_OP_SYMBOL, {}, 0);  // 1: a
  AddExpr(&def, v1::SIZE_OP_SYMBOL, {}, 1);  // 2: b
  return def;
}

int64_t Eval(const v1::GraphDef& def, std::vector<int64_t> symbols) {
  EXPECT_TRUE(CheckSizeExprs(def).ok()) << CheckSizeExprs(def);
  return ValueOrDie(EvaluateSizeExprs(def, symbols)).back();
}

TEST(SizeExprs, FloorDivisionAndModuloArePythons) {
  v1::GraphDef div = TwoSymbols();
  AddExpr(&div, v1::SIZE_OP_FLOORDIV, {1, 2});
  v1::GraphDef mod = TwoSymbols();
  AddExpr(&mod, v1::SIZE_OP_MOD, {1, 2});
  // Python: 7//2 = 3, -7//2 = -4, 7//-2 = -4, -7//-2 = 3; 7%2 = 1, -7%2 = 1, 7%-2 = -1.
  const int64_t cases[][4] = {{7, 2, 3, 1},    {-7, 2, -4, 1}, {7, -2, -4, -1},
                              {-7, -2, 3, -1}, {6, 3, 2, 0},   {0, 5, 0, 0}};
  for (const auto& c : cases) {
    SCOPED_TRACE(absl::StrCat(c[0], ", ", c[1]));
    EXPECT_EQ(Eval(div, {c[0], c[1]}), c[2]);
    EXPECT_EQ(Eval(mod, {c[0], c[1]}), c[3]);
  }
  EXPECT_EQ(Eval(mod, {INT64_MIN, -1}), 0);
}

TEST(SizeExprs, NaryOpsAndNeg) {
  v1::GraphDef def = TwoSymbols();
  const uint32_t three = AddExpr(&def, v1::SIZE_OP_CONST, {}, 3);
  const uint32_t add = AddExpr(&def, v1::SIZE_OP_ADD, {1, 2, three});
  const uint32_t mul = AddExpr(&def, v1::SIZE_OP_MUL, {1, 2, three});
  const uint32_t mn = AddExpr(&def, v1::SIZE_OP_MIN, {1, 2, three});
  const uint32_t mx = AddExpr(&def, v1::SIZE_OP_MAX, {1, 2, three});
  AddExpr(&def, v1::SIZE_OP_NEG, {mul});
  const std::vector<int64_t> v = ValueOrDie(EvaluateSizeExprs(def, {5, 7}));
  EXPECT_EQ(v[add - 1], 15);
  EXPECT_EQ(v[mul - 1], 105);
  EXPECT_EQ(v[mn - 1], 3);
  EXPECT_EQ(v[mx - 1], 7);
  EXPECT_EQ(v.back(), -105);
}

TEST(SizeExprs, OverflowAndZeroDivisorsAreErrorsNamingTheValues) {
  v1::GraphDef mul = TwoSymbols();
  AddExpr(&mul, v1::SIZE_OP_MUL, {1, 2});
  EXPECT_THAT(EvaluateSizeExprs(mul, {int64_t{1} << 40, int64_t{1} << 30}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "size expression 2 (a*b) overflows int64 at a=1099511627776, "
                       "b=1073741824"));
  v1::GraphDef div = TwoSymbols();
  AddExpr(&div, v1::SIZE_OP_FLOORDIV, {1, 2});
  EXPECT_THAT(EvaluateSizeExprs(div, {7, 0}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "size expression 2 (a//b) divides by zero at a=7, b=0"));
  EXPECT_THAT(EvaluateSizeExprs(div, {INT64_MIN, -1}),
              StatusIs(absl::StatusCode::kInvalidArgument, "overflows int64"));
  v1::GraphDef neg = TwoSymbols();
  AddExpr(&neg, v1::SIZE_OP_NEG, {1});
  EXPECT_THAT(EvaluateSizeExprs(neg, {INT64_MIN, 0}),
              StatusIs(absl::StatusCode::kInvalidArgument, "overflows int64"));
}

TEST(SizeExprs, TextParenthesizesWhatBindsLooser) {
  v1::GraphDef def = TwoSymbols();
  const uint32_t one = AddExpr(&def, v1::SIZE_OP_CONST, {}, 1);
  const uint32_t two = AddExpr(&def, v1::SIZE_OP_CONST, {}, 2);
  const uint32_t a1 = AddExpr(&def, v1::SIZE_OP_ADD, {1, one});
  const uint32_t ceil = AddExpr(&def, v1::SIZE_OP_FLOORDIV, {a1, two});
  const uint32_t prod = AddExpr(&def, v1::SIZE_OP_MUL, {2, ceil});
  const uint32_t neg = AddExpr(&def, v1::SIZE_OP_NEG, {prod});
  const uint32_t mn = AddExpr(&def, v1::SIZE_OP_MIN, {a1, prod});
  ASSERT_TRUE(CheckSizeExprs(def).ok());
  EXPECT_EQ(SizeExprText(def, ceil - 1), "(a + 1)//2");
  EXPECT_EQ(SizeExprText(def, prod - 1), "b*((a + 1)//2)");
  EXPECT_EQ(SizeExprText(def, neg - 1), "-(b*((a + 1)//2))");
  EXPECT_EQ(SizeExprText(def, mn - 1), "min(a + 1, b*((a + 1)//2))");
  EXPECT_EQ(SizeExprSymbols(def, mn - 1), (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(SizeExprSymbols(def, one - 1), (std::vector<uint32_t>{}));
}

// A table whose entry k adds entry k-1 to itself: 2^k leaves as a tree, yet
// checking, evaluating, printing and collecting symbols stay linear.
TEST(SizeExprs, SharedEntriesCostLinearTime) {
  v1::GraphDef def = TwoSymbols();
  uint32_t e = 1;
  for (int k = 0; k < kMaxSizeExprDepth - 1; ++k) e = AddExpr(&def, v1::SIZE_OP_ADD, {e, e});
  ASSERT_TRUE(CheckSizeExprs(def).ok()) << CheckSizeExprs(def);
  EXPECT_THAT(EvaluateSizeExprs(def, {1, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, "overflows int64 at a=1"));
  const std::string text = SizeExprText(def, e - 1);
  EXPECT_LE(text.size(), 200u);
  EXPECT_EQ(text.substr(text.size() - 3), "...");
  EXPECT_EQ(SizeExprSymbols(def, e - 1), (std::vector<uint32_t>{0}));
  AddExpr(&def, v1::SIZE_OP_ADD, {e, e});  // one level deeper than the limit
  EXPECT_THAT(CheckSizeExprs(def), StatusIs(absl::StatusCode::kInvalidArgument,
                                            "nested 65 deep, more than the limit 64"));
}

TEST(SizeExprs, TheTablesAreChecked) {
  struct Case {
    const char* what;
    void (*mutate)(v1::GraphDef*);
    const char* error;
  };
  const Case cases[] = {
      {"forward operand", [](v1::GraphDef* d) { d->mutable_size_exprs(4)->set_operands(1, 4); },
       "GraphDef.size_exprs[4]: operand 4 is not an earlier entry"},
      {"unknown op", [](v1::GraphDef* d) { d->mutable_size_exprs(0)->set_op(v1::SizeOp(99)); },
       "GraphDef.size_exprs[0]: unknown or missing op (enum value 99)"},
      {"arity", [](v1::GraphDef* d) { d->mutable_size_exprs(4)->add_operands(0); },
       ""},  // MUL takes any number from 2: no error
      {"one-operand add", [](v1::GraphDef* d) { d->mutable_size_exprs(4)->clear_operands(); },
       "GraphDef.size_exprs[4]: SIZE_OP_MUL with 0 operands (it takes 2 or more)"},
      {"symbol index", [](v1::GraphDef* d) { d->mutable_size_exprs(0)->set_symbol(4); },
       "GraphDef.size_exprs[0]: symbol 4 (the graph has 4)"},
      {"guard index", [](v1::GraphDef* d) { d->mutable_guards(0)->set_lhs(10); },
       "GraphDef.guards[0]: lhs 10, rhs 0 (the graph has 10 size expressions)"},
      {"guard kind", [](v1::GraphDef* d) { d->mutable_guards(1)->set_kind(v1::GuardKind(0)); },
       "GraphDef.guards[1]: unknown or missing kind (enum value 0)"},
      {"symbol node", [](v1::GraphDef* d) { d->mutable_symbols(0)->set_input_node(testing::kW); },
       "GraphDef.symbols[0] 's0': input_node 0 ('w') is not an INPUT tensor placeholder"},
      {"symbol dim", [](v1::GraphDef* d) { d->mutable_symbols(3)->set_dim(2); },
       "GraphDef.symbols[3] 's3': dim 2 of input 'y', which has 2 dims"},
      {"symbol range",
       [](v1::GraphDef* d) {
         d->mutable_symbols(1)->set_min(5);
         d->mutable_symbols(1)->set_max(3);
       },
       "GraphDef.symbols[1] 's1': range [5, 3] (min >= 0, max 0 or >= min)"},
      {"symbol past the nodes", [](v1::GraphDef* d) { d->mutable_symbols(1)->set_input_node(99); },
       "GraphDef.symbols[1] 's1': input_node 99 is not a node (the graph has 10)"},
      {"nameless", [](v1::GraphDef* d) { d->mutable_symbols(2)->clear_name(); },
       "GraphDef.symbols[2] '': a name of 0 bytes (1 to 128)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    v1::GraphDef def = SymbolicGraphDef();
    c.mutate(&def);
    const absl::Status s = CheckSizeExprs(def);
    if (std::string(c.error).empty()) {
      EXPECT_TRUE(s.ok()) << s;
    } else {
      EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument, c.error));
    }
  }
  v1::GraphDef many = SymbolicGraphDef();
  for (int i = 0; i < kMaxSymbols; ++i) AddSymbol(&many, "s", testing::kX, 0, 8);
  EXPECT_THAT(CheckSizeExprs(many),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "GraphDef.symbols has 4100 entries, more than the limit 4096"));
}

// Random corruption of every symbolic field: instantiation returns OK or
// INVALID_ARGUMENT and never crashes (ASan/UBSan in `make test-asan`).
TEST(SizeExprs, CorruptedGraphsGiveAStatus) {
  std::mt19937_64 rng(26);
  auto pick = [&rng](int64_t n) { return static_cast<int64_t>(rng() % static_cast<uint64_t>(n)); };
  const int64_t values[] = {0, 1, -1, 2, 63, INT64_MAX, INT64_MIN, 1 << 20};
  int ok = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    v1::GraphDef def = SymbolicGraphDef();
    for (int m = 0; m < 3; ++m) {
      switch (pick(6)) {
        case 0: {
          v1::SizeExpr* e = def.mutable_size_exprs(pick(def.size_exprs_size()));
          e->set_op(v1::SizeOp(pick(11)));
          e->set_value(values[pick(8)]);
          e->set_symbol(pick(6));
          if (e->operands_size() > 0) e->set_operands(0, pick(12));
          break;
        }
        case 1: def.mutable_guards(pick(3))->set_rhs(pick(12)); break;
        case 2: def.mutable_symbols(pick(4))->set_dim(pick(4) - 1); break;
        case 3: {
          v1::TensorMeta* t = def.mutable_nodes(1 + pick(7))->mutable_outputs(0)->mutable_tensor();
          if (t->shape_expr_size() > 0) t->set_shape_expr(pick(t->shape_expr_size()), pick(12));
          break;
        }
        case 4: def.mutable_symbols(pick(4))->set_min(values[pick(8)]); break;
        default: def.mutable_size_exprs(pick(def.size_exprs_size()))->add_operands(pick(10));
      }
    }
    // Mostly batches the guards allow, so that corrupted graphs get far.
    const int64_t b = 2 + pick(8), sq = pick(9);
    const InputShapes shapes = {{"x", {b, sq, 4}},
                                {"y", {pick(4) == 0 ? pick(9) : b, pick(4) == 0 ? pick(9) : sq}}};
    absl::StatusOr<Graph> g = Instantiate(def, shapes);
    if (g.ok()) {
      ++ok;
    } else {
      EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << g.status();
    }
  }
  EXPECT_GT(ok, 0);
}

}  // namespace
}  // namespace fxdp::ir
