#include "analysis/ir/size_exprs.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "util/status_macros.h"

namespace fxdp::ir {
namespace {

using absl::InvalidArgumentError;

// The operand counts an op takes: [min, max] (max -1: no bound); min -1: not
// an op this reader knows.
struct Arity {
  int min;
  int max;
};
Arity OpArity(int op) {
  switch (op) {
    case v1::SIZE_OP_CONST:
    case v1::SIZE_OP_SYMBOL: return {0, 0};
    case v1::SIZE_OP_NEG: return {1, 1};
    case v1::SIZE_OP_FLOORDIV:
    case v1::SIZE_OP_MOD: return {2, 2};
    case v1::SIZE_OP_ADD:
    case v1::SIZE_OP_MUL:
    case v1::SIZE_OP_MIN:
    case v1::SIZE_OP_MAX: return {2, -1};
    default: return {-1, -1};
  }
}

absl::Status CheckSymbol(const v1::GraphDef& def, int i) {
  const v1::Symbol& s = def.symbols(i);
  const std::string what = absl::StrCat("GraphDef.symbols[", i, "] '", s.name().substr(0, 64), "'");
  if (s.name().empty() || s.name().size() > kMaxSymbolNameBytes)
    return InvalidArgumentError(absl::StrCat(what, ": a name of ", s.name().size(), " bytes (1 to ",
                                             kMaxSymbolNameBytes, ")"));
  if (s.input_node() >= static_cast<uint32_t>(def.nodes_size()))
    return InvalidArgumentError(absl::StrCat(what, ": input_node ", s.input_node(),
                                             " is not a node (the graph has ", def.nodes_size(),
                                             ")"));
  const v1::Node& n = def.nodes(s.input_node());
  if (n.kind() != v1::PLACEHOLDER || n.placeholder().role() != v1::INPUT || n.outputs_size() != 1 ||
      n.outputs(0).kind() != v1::TENSOR)
    return InvalidArgumentError(absl::StrCat(what, ": input_node ", s.input_node(), " ('", n.name(),
                                             "') is not an INPUT tensor placeholder"));
  const int rank = n.outputs(0).tensor().shape_size();
  if (s.dim() < 0 || s.dim() >= rank)
    return InvalidArgumentError(absl::StrCat(what, ": dim ", s.dim(), " of input '",
                                             n.placeholder().state_name(), "', which has ", rank,
                                             " dims"));
  if (s.min() < 0 || (s.max() != 0 && s.max() < s.min()))
    return InvalidArgumentError(
        absl::StrCat(what, ": range [", s.min(), ", ", s.max(), "] (min >= 0, max 0 or >= min)"));
  return absl::OkStatus();
}

absl::Status CheckEntry(const v1::GraphDef& def, int i, std::vector<int>* depth) {
  const v1::SizeExpr& e = def.size_exprs(i);
  const std::string what = absl::StrCat("GraphDef.size_exprs[", i, "]");
  const Arity a = OpArity(e.op());
  if (a.min < 0)
    return InvalidArgumentError(
        absl::StrCat(what, ": unknown or missing op (enum value ", static_cast<int>(e.op()), ")"));
  const int n = e.operands_size();
  if (n < a.min || (a.max >= 0 && n > a.max))
    return InvalidArgumentError(absl::StrCat(what, ": ", v1::SizeOp_Name(e.op()), " with ", n,
                                             " operands (it takes ", a.min,
                                             a.max < 0 ? " or more" : "", ")"));
  if (e.op() == v1::SIZE_OP_SYMBOL && e.symbol() >= static_cast<uint32_t>(def.symbols_size()))
    return InvalidArgumentError(
        absl::StrCat(what, ": symbol ", e.symbol(), " (the graph has ", def.symbols_size(), ")"));
  int d = 1;
  for (uint32_t o : e.operands()) {
    if (o >= static_cast<uint32_t>(i))
      return InvalidArgumentError(absl::StrCat(what, ": operand ", o, " is not an earlier entry"));
    d = std::max(d, (*depth)[o] + 1);
  }
  if (d > kMaxSizeExprDepth)
    return InvalidArgumentError(
        absl::StrCat(what, ": nested ", d, " deep, more than the limit ", kMaxSizeExprDepth));
  (*depth)[i] = d;
  return absl::OkStatus();
}

absl::Status CheckLimit(const char* field, int64_t n, int64_t limit) {
  if (n <= limit) return absl::OkStatus();
  return InvalidArgumentError(
      absl::StrCat("GraphDef.", field, " has ", n, " entries, more than the limit ", limit));
}

// One step of the arithmetic; false on overflow or a zero divisor.
bool Apply(int op, int64_t a, int64_t b, int64_t* out) {
  switch (op) {
    case v1::SIZE_OP_ADD: return !__builtin_add_overflow(a, b, out);
    case v1::SIZE_OP_MUL: return !__builtin_mul_overflow(a, b, out);
    case v1::SIZE_OP_MIN: *out = std::min(a, b); return true;
    case v1::SIZE_OP_MAX: *out = std::max(a, b); return true;
    case v1::SIZE_OP_FLOORDIV: {  // Python's: rounds toward -inf
      if (b == 0 || (a == std::numeric_limits<int64_t>::min() && b == -1)) return false;
      int64_t q = a / b;
      if (a % b != 0 && ((a < 0) != (b < 0))) --q;
      *out = q;
      return true;
    }
    case v1::SIZE_OP_MOD: {  // Python's: the divisor's sign
      if (b == 0) return false;
      if (b == -1) {
        *out = 0;
        return true;
      }
      int64_t r = a % b;
      if (r != 0 && ((r < 0) != (b < 0))) r += b;
      *out = r;
      return true;
    }
    default: return false;
  }
}

std::string SymbolValues(const v1::GraphDef& def, uint32_t index,
                         const std::vector<int64_t>& symbols) {
  std::vector<std::string> parts;
  for (uint32_t s : SizeExprSymbols(def, index))
    parts.push_back(absl::StrCat(def.symbols(s).name(), "=", symbols[s]));
  return parts.empty() ? std::string("no symbols") : absl::StrJoin(parts, ", ");
}

// Appends entry `i` to *out; `parent` is the op around it (parentheses).
void AppendText(const v1::GraphDef& def, uint32_t i, int parent, size_t max_chars,
                std::string* out) {
  if (out->size() > max_chars) return;
  const v1::SizeExpr& e = def.size_exprs(i);
  const auto operand = [&](int k, int around) {
    AppendText(def, e.operands(k), around, max_chars, out);
  };
  switch (e.op()) {
    case v1::SIZE_OP_CONST: absl::StrAppend(out, e.value()); return;
    case v1::SIZE_OP_SYMBOL: absl::StrAppend(out, def.symbols(e.symbol()).name()); return;
    case v1::SIZE_OP_MIN:
    case v1::SIZE_OP_MAX:
      absl::StrAppend(out, e.op() == v1::SIZE_OP_MIN ? "min(" : "max(");
      for (int k = 0; k < e.operands_size(); ++k) {
        if (k > 0) absl::StrAppend(out, ", ");
        operand(k, v1::SIZE_OP_UNSPECIFIED);
      }
      absl::StrAppend(out, ")");
      return;
    default: break;
  }
  // ADD binds loosest, then MUL, FLOORDIV and MOD, then NEG: parenthesize an
  // entry inside a tighter one.
  const bool tight =
      parent == v1::SIZE_OP_FLOORDIV || parent == v1::SIZE_OP_MOD || parent == v1::SIZE_OP_NEG;
  const bool paren = (e.op() == v1::SIZE_OP_ADD && parent != v1::SIZE_OP_UNSPECIFIED &&
                      parent != v1::SIZE_OP_ADD) ||
                     (e.op() == v1::SIZE_OP_MUL && tight) ||
                     ((e.op() == v1::SIZE_OP_FLOORDIV || e.op() == v1::SIZE_OP_MOD) &&
                      (tight || parent == v1::SIZE_OP_MUL));
  if (paren) absl::StrAppend(out, "(");
  if (e.op() == v1::SIZE_OP_NEG) {
    absl::StrAppend(out, "-");
    operand(0, e.op());
  } else {
    const char* sep = e.op() == v1::SIZE_OP_ADD        ? " + "
                      : e.op() == v1::SIZE_OP_MUL      ? "*"
                      : e.op() == v1::SIZE_OP_FLOORDIV ? "//"
                                                       : " % ";
    for (int k = 0; k < e.operands_size(); ++k) {
      if (k > 0) absl::StrAppend(out, sep);
      operand(k, e.op());
    }
  }
  if (paren) absl::StrAppend(out, ")");
}

}  // namespace

bool HasSymbolicSizes(const v1::GraphDef& def) {
  return def.symbols_size() > 0 || def.size_exprs_size() > 0 || def.guards_size() > 0;
}

absl::Status CheckSizeExprs(const v1::GraphDef& def) {
  FXDP_RETURN_IF_ERROR(CheckLimit("symbols", def.symbols_size(), kMaxSymbols));
  FXDP_RETURN_IF_ERROR(CheckLimit("size_exprs", def.size_exprs_size(), kMaxSizeExprs));
  FXDP_RETURN_IF_ERROR(CheckLimit("guards", def.guards_size(), kMaxGuards));
  for (int i = 0; i < def.symbols_size(); ++i) FXDP_RETURN_IF_ERROR(CheckSymbol(def, i));
  std::vector<int> depth(def.size_exprs_size(), 0);
  for (int i = 0; i < def.size_exprs_size(); ++i) FXDP_RETURN_IF_ERROR(CheckEntry(def, i, &depth));
  const uint32_t entries = static_cast<uint32_t>(def.size_exprs_size());
  for (int i = 0; i < def.guards_size(); ++i) {
    const v1::Guard& g = def.guards(i);
    if (g.kind() < v1::GUARD_EQ || g.kind() > v1::GUARD_LE)
      return InvalidArgumentError(absl::StrCat("GraphDef.guards[", i,
                                               "]: unknown or missing kind (enum value ",
                                               static_cast<int>(g.kind()), ")"));
    if (g.lhs() >= entries || g.rhs() >= entries)
      return InvalidArgumentError(absl::StrCat("GraphDef.guards[", i, "]: lhs ", g.lhs(), ", rhs ",
                                               g.rhs(), " (the graph has ", entries,
                                               " size expressions)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> EvaluateSizeExprs(const v1::GraphDef& def,
                                                       const std::vector<int64_t>& symbols,
                                                       std::vector<bool>* undefined) {
  std::vector<int64_t> v(def.size_exprs_size());
  if (undefined != nullptr) undefined->assign(def.size_exprs_size(), false);
  for (int i = 0; i < def.size_exprs_size(); ++i) {
    const v1::SizeExpr& e = def.size_exprs(i);
    if (undefined != nullptr &&
        std::any_of(e.operands().begin(), e.operands().end(),
                    [&](uint32_t k) { return static_cast<bool>((*undefined)[k]); })) {
      (*undefined)[i] = true;
      continue;
    }
    bool ok = true;
    switch (e.op()) {
      case v1::SIZE_OP_CONST: v[i] = e.value(); break;
      case v1::SIZE_OP_SYMBOL: v[i] = symbols[e.symbol()]; break;
      case v1::SIZE_OP_NEG:
        ok = !__builtin_sub_overflow(int64_t{0}, v[e.operands(0)], &v[i]);
        break;
      default:
        v[i] = v[e.operands(0)];
        for (int k = 1; ok && k < e.operands_size(); ++k)
          ok = Apply(e.op(), v[i], v[e.operands(k)], &v[i]);
    }
    const bool zero_divisor = !ok &&
                              (e.op() == v1::SIZE_OP_FLOORDIV || e.op() == v1::SIZE_OP_MOD) &&
                              std::any_of(e.operands().begin() + 1, e.operands().end(),
                                          [&](uint32_t k) { return v[k] == 0; });
    if (zero_divisor && undefined != nullptr) {
      (*undefined)[i] = true;
      continue;
    }
    if (!ok)
      return InvalidArgumentError(absl::StrCat("size expression ", i, " (", SizeExprText(def, i),
                                               ") ",
                                               zero_divisor ? "divides by zero" : "overflows int64",
                                               " at ", SymbolValues(def, i, symbols)));
  }
  return v;
}

std::string SizeExprText(const v1::GraphDef& def, uint32_t index, size_t max_chars) {
  std::string out;
  AppendText(def, index, v1::SIZE_OP_UNSPECIFIED, max_chars, &out);
  if (out.size() > max_chars) {
    out.resize(max_chars);
    absl::StrAppend(&out, "...");
  }
  return out;
}

std::vector<uint32_t> SizeExprSymbols(const v1::GraphDef& def, uint32_t index) {
  std::vector<bool> seen(index + 1, false);
  std::vector<uint32_t> stack = {index};
  std::vector<uint32_t> out;
  seen[index] = true;
  while (!stack.empty()) {
    const v1::SizeExpr& e = def.size_exprs(stack.back());
    stack.pop_back();
    if (e.op() == v1::SIZE_OP_SYMBOL) out.push_back(e.symbol());
    for (uint32_t o : e.operands()) {
      if (!seen[o]) {
        seen[o] = true;
        stack.push_back(o);
      }
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string GuardText(const v1::GraphDef& def, const v1::Guard& guard) {
  const char* op = guard.kind() == v1::GUARD_EQ   ? " == "
                   : guard.kind() == v1::GUARD_NE ? " != "
                   : guard.kind() == v1::GUARD_LT ? " < "
                                                  : " <= ";
  return absl::StrCat(SizeExprText(def, guard.lhs()), op, SizeExprText(def, guard.rhs()));
}

bool GuardHolds(v1::GuardKind kind, int64_t lhs, int64_t rhs) {
  switch (kind) {
    case v1::GUARD_EQ: return lhs == rhs;
    case v1::GUARD_NE: return lhs != rhs;
    case v1::GUARD_LT: return lhs < rhs;
    case v1::GUARD_LE: return lhs <= rhs;
    default: return false;
  }
}

}  // namespace fxdp::ir
