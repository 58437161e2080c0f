// Queries other passes make of the op vocabulary that also consult the view
// rules (view_rules.h): the expansion's size lists, its shape check and the
// overlap schedule's packing ops. In fxdp_analysis; the table itself
// (op_rules.h) is fxdp_op_facts, which the executor links too.
#ifndef FXDP_ANALYSIS_OP_QUERIES_H_
#define FXDP_ANALYSIS_OP_QUERIES_H_

#include "analysis/ir/graph.h"
#include "analysis/op_rules.h"

namespace fxdp {

// The index of `t`'s size-list argument (a kSizes parameter of its op or
// view rule), or -1 when it has none.
int SizeArgIndex(const ir::Target& t);
// The same when the caller has looked up FindOpRule(t) already.
int SizeArgIndex(const ir::Target& t, const OpRule* rule);
// The shape check of `t`'s op or view rule (the default when it has none).
ShapeRule ShapeRuleOf(const ir::Target& t);
ShapeRule ShapeRuleOf(const ir::Target& t, const OpRule* rule);
// Whether `t` is cheap enough to move up with the all_reduce it feeds.
bool IsPackingOp(const ir::Target& t);

}  // namespace fxdp

#endif  // FXDP_ANALYSIS_OP_QUERIES_H_
