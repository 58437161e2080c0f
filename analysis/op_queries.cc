// Queries other passes make of the op vocabulary: the op table's row
// (op_rules.h), else the view rule (view_rules.h).
#include "analysis/op_queries.h"

#include <optional>

#include "analysis/view_rules.h"

namespace fxdp {

using R = ParamRole;

int SizeArgIndex(const ir::Target& t) { return SizeArgIndex(t, FindOpRule(t)); }

int SizeArgIndex(const ir::Target& t, const OpRule* r) {
  if (r != nullptr) {
    const OpParam* p = r->param(R::kSizes);
    return p == nullptr ? -1 : p->index;
  }
  const std::optional<ViewOpFacts> v = FindViewOpFacts(t);
  return v ? v->sizes_arg : -1;
}

ShapeRule ShapeRuleOf(const ir::Target& t) { return ShapeRuleOf(t, FindOpRule(t)); }

ShapeRule ShapeRuleOf(const ir::Target& t, const OpRule* r) {
  if (r != nullptr) return r->shape;
  const std::optional<ViewOpFacts> v = FindViewOpFacts(t);
  if (!v || v->sizes_arg < 0) return {};
  return {v->expands ? ShapeCheck::kExpand : ShapeCheck::kView, -1};
}

bool IsPackingOp(const ir::Target& t) {
  if (const OpRule* r = FindOpRule(t)) return r->has(kPacking);
  const std::optional<ViewOpFacts> v = FindViewOpFacts(t);
  return v && v->packing;
}

}  // namespace fxdp
