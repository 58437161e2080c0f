// A hand-built symbolic graph for the instantiation tests: x f32[B, S, 4] and
// y f32[B2, S2] (each dim its own symbol, as a trace with duck sizing off
// makes them), guards B2 == B and S2 == S and 2 <= B, a view to [B*S, 4] and
// back to [B, S, 3] whose size arguments are expressions. Traced at 8x6.
#ifndef FXDP_TESTS_ANALYSIS_SYMBOLIC_GRAPH_H_
#define FXDP_TESTS_ANALYSIS_SYMBOLIC_GRAPH_H_

#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/strings/str_replace.h"
#include "analysis/ir/proto_codec.h"
#include "analysis/ir/text.h"
#include "proto/fxdp/v1/graph.pb.h"
#include "tests/test_util.h"

namespace fxdp::testing {

// The static graph at batch B and sequence S (what instantiation must give):
// tests/testdata/sized_step.txt.in with its sizes filled in (the Python tests
// read the same file). With `train`, its backward and an SGD update of w too
// (what Expand takes); without, the forward up to the loss.
inline std::string StaticGraphText(int64_t b, int64_t s, bool train = false) {
  std::string text = ReadTestData("sized_step.txt.in");
  if (!train) {
    text.resize(text.find("  %ones: "));
    text += "  %output = output([%loss]) {specs=[LOSS]}\n}\n";
  }
  return absl::StrReplaceAll(
      text,
      {{"{BS}", std::to_string(b * s)}, {"{B}", std::to_string(b)}, {"{S}", std::to_string(s)}});
}

inline v1::GraphDef StaticGraphDef(int64_t b, int64_t s, bool train = false) {
  return ir::EncodeGraph(ValueOrDie(ir::ParseGraphText(StaticGraphText(b, s, train))));
}

inline void AddSymbol(v1::GraphDef* def, const std::string& name, uint32_t node, int dim,
                      int64_t hint, int64_t min = 0) {
  v1::Symbol* s = def->add_symbols();
  s->set_name(name);
  s->set_input_node(node);
  s->set_dim(dim);
  s->set_hint(hint);
  s->set_min(min);
}

// Appends an entry; returns 1 + its index (what shape_expr and size_expr hold).
inline uint32_t AddExpr(v1::GraphDef* def, v1::SizeOp op, std::initializer_list<uint32_t> operands,
                        int64_t value = 0) {
  v1::SizeExpr* e = def->add_size_exprs();
  e->set_op(op);
  if (op == v1::SIZE_OP_SYMBOL) e->set_symbol(static_cast<uint32_t>(value));
  if (op == v1::SIZE_OP_CONST) e->set_value(value);
  for (uint32_t o : operands) e->add_operands(o - 1);  // operands given as 1 + index too
  return static_cast<uint32_t>(def->size_exprs_size());
}

inline void AddGuard(v1::GraphDef* def, v1::GuardKind kind, uint32_t lhs, uint32_t rhs,
                     const std::string& source) {
  v1::Guard* g = def->add_guards();
  g->set_kind(kind);
  g->set_lhs(lhs - 1);
  g->set_rhs(rhs - 1);
  g->set_source(source);
}

inline void SetExprs(v1::TensorMeta* t, std::initializer_list<uint32_t> shape,
                     std::initializer_list<uint32_t> stride) {
  for (uint32_t e : shape) t->add_shape_expr(e);
  for (uint32_t e : stride) t->add_stride_expr(e);
}

// Node indices of the graph above.
enum SymbolicNode { kW = 0, kX, kY, kFlat, kMm, kV, kS, kD, kLoss, kOutput };

// The graph above traced at 8x6 with symbolic B and S.
inline v1::GraphDef SymbolicGraphDef(bool train = false) {
  v1::GraphDef def = StaticGraphDef(8, 6, train);
  AddSymbol(&def, "s0", kX, 0, 8, /*min=*/2);
  AddSymbol(&def, "s1", kX, 1, 6);
  AddSymbol(&def, "s2", kY, 0, 8);
  AddSymbol(&def, "s3", kY, 1, 6);
  const uint32_t b = AddExpr(&def, v1::SIZE_OP_SYMBOL, {}, 0);
  const uint32_t s = AddExpr(&def, v1::SIZE_OP_SYMBOL, {}, 1);
  const uint32_t b2 = AddExpr(&def, v1::SIZE_OP_SYMBOL, {}, 2);
  const uint32_t s2 = AddExpr(&def, v1::SIZE_OP_SYMBOL, {}, 3);
  const uint32_t bs = AddExpr(&def, v1::SIZE_OP_MUL, {b, s});
  const uint32_t s4 = AddExpr(&def, v1::SIZE_OP_MUL, {s, AddExpr(&def, v1::SIZE_OP_CONST, {}, 4)});
  const uint32_t s3 = AddExpr(&def, v1::SIZE_OP_MUL, {s, AddExpr(&def, v1::SIZE_OP_CONST, {}, 3)});
  const uint32_t two = AddExpr(&def, v1::SIZE_OP_CONST, {}, 2);
  AddGuard(&def, v1::GUARD_EQ, b2, b, "train.py:9: loss = step(x, y)");
  AddGuard(&def, v1::GUARD_EQ, s2, s, "model.py:7: d = s - y");
  AddGuard(&def, v1::GUARD_LE, two, b, "");
  auto meta = [&def](int node) {
    return def.mutable_nodes(node)->mutable_outputs(0)->mutable_tensor();
  };
  SetExprs(meta(kX), {b, s, 0}, {s4, 0, 0});
  SetExprs(meta(kY), {b2, s2}, {s2, 0});
  SetExprs(meta(kFlat), {bs, 0}, {});
  SetExprs(meta(kMm), {bs, 0}, {});
  SetExprs(meta(kV), {b, s, 0}, {s3, 0, 0});
  SetExprs(meta(kS), {b, s}, {s, 0});
  SetExprs(meta(kD), {b, s}, {s, 0});
  def.mutable_nodes(kFlat)->mutable_args(1)->mutable_list()->mutable_items(0)->set_size_expr(bs);
  v1::ArgumentList* v = def.mutable_nodes(kV)->mutable_args(1)->mutable_list();
  v->mutable_items(0)->set_size_expr(b);
  v->mutable_items(1)->set_size_expr(s);
  if (!train) return def;
  // The backward (kLoss + 1 on): mean's gradient divides by B*S.
  enum { kOnes = kLoss + 1, kG, kGd, kGv, kGe, kGc, kGf, kFt };
  SetExprs(meta(kG), {b, s}, {});
  SetExprs(meta(kGd), {b, s}, {s, 0});
  SetExprs(meta(kGv), {b, s, 0}, {s, 0, 0});
  SetExprs(meta(kGe), {b, s, 0}, {s, 0, 0});
  SetExprs(meta(kGc), {b, s, 0}, {s3, 0, 0});
  SetExprs(meta(kGf), {bs, 0}, {});
  SetExprs(meta(kFt), {0, bs}, {});
  auto items = [&def](int node) {
    return def.mutable_nodes(node)->mutable_args(1)->mutable_list();
  };
  items(kG)->mutable_items(0)->set_size_expr(b);
  items(kG)->mutable_items(1)->set_size_expr(s);
  items(kGe)->mutable_items(0)->set_size_expr(b);
  items(kGe)->mutable_items(1)->set_size_expr(s);
  items(kGf)->mutable_items(0)->set_size_expr(bs);
  def.mutable_nodes(kGd)->mutable_args(1)->set_size_expr(bs);
  return def;
}

}  // namespace fxdp::testing

#endif  // FXDP_TESTS_ANALYSIS_SYMBOLIC_GRAPH_H_
