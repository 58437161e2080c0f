// Dropless MoE dispatch written with torch.gather / scatter over an expanded index
// (row_order.cc has the sort, x[p], index_put and _grouped_mm forms):
//
//   rows = torch.gather(h, 0, (perm // k).unsqueeze(1).expand(-1, D))       # h[perm // k]
//   back = zeros.scatter(0, perm.unsqueeze(1).expand(-1, D), y)            # back[perm] = y
//   back = zeros.scatter_add(0, (perm // k).unsqueeze(1).expand(-1, D), y) # back[perm // k] += y
//   back = zeros.index_add(0, perm // k, y)                                # back[perm // k] += y
//
//   * unsqueeze, expand and a view as a column ([n] -> [n, 1]) of a sort's positions carry them
//     (kPositionsViews): the rows stay on the positions' dim and every other dim is a broadcast of
//     size 1, so every column holds the same positions;
//   * gather / scatter / scatter_add along that dim with such an index, and every other dim the
//     whole of x's, and index_add with the positions themselves, are x[p] / x[p] = v / x[p] += v
//     (kAlignedRows): row_order.cc's IndexRows and PutRows decide them, backwards included
//     (gather's backward is a scatter_add into new_zeros, scatter's a gather, index_add's an
//     index_select);
//   * anything else (positions on another dim than the one indexed, an index not made of a sort's
//     positions, a scatter with a reduction or a scalar) stays refused.
#include <cstdint>
#include <string>
#include <vector>
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "analysis/batch_dim/analyzer.h"
#include "util/status_macros.h"

namespace fxdp {

using ir::Node;
using ir::NodeId;
using ir::TensorType;
using ir::ValueRef;
using Positions = ValueInfo::Positions;

namespace {

// View ops whose output carries the positions its input holds: each only adds or broadcasts dims
// of size 1, so the rows stay on one dim and every column holds the same positions.
struct PositionsView {
  absl::string_view op;
  bool column;  // only a column of positions ([n] <-> [n, 1]: every other dim of size 1)
};
constexpr PositionsView kPositionsViews[] = {
    {"aten::unsqueeze", false},  // p.unsqueeze(1): [n] -> [n, 1]
    {"aten::expand", false},     // .expand(-1, D): [n, 1] -> [n, D] (the rows' dim keeps n)
    {"aten::view", true},        // p.view(-1, 1)
    {"aten::reshape", true},    {"aten::_unsafe_view", true},
};

const PositionsView* FindPositionsView(const Node& n) {
  for (const PositionsView& v : kPositionsViews) {
    if (n.is_call() && v.op == n.target.name) return &v;
  }
  return nullptr;
}

// Ops that take a sort's positions along one dim: x[p], x[p] = v, x[p] += v.
struct AlignedRowsOp {
  absl::string_view op;
  absl::string_view overload;
  int src_arg;      // the values put at the positions; -1: a gather.
  bool accumulate;  // repeated positions add up (scatter_add), else each is written once.
  bool expanded;    // the index has x's rank (positions expanded over the other dims), else 1-D.
};
constexpr AlignedRowsOp kAlignedRows[] = {
    {"aten::gather", "", -1, false, true},
    {"aten::scatter", "src", 3, false, true},
    {"aten::scatter_add", "", 3, true, true},
    {"aten::index_add", "", 3, true, false},  // x.index_add(d, p, v): x[p] += v (alpha: row-wise)
};

const AlignedRowsOp* FindAlignedRows(const ir::Target& t) {
  for (const AlignedRowsOp& r : kAlignedRows) {
    if (r.op == t.name && r.overload == t.overload) return &r;
  }
  return nullptr;
}

}  // namespace

bool BatchDimAnalyzer::IsPositionsView(const Node& n) const {
  return FindPositionsView(n) != nullptr;
}

// After the view's placement and order: its output holds the same positions when the rows keep
// their dim's extent (an expand never broadcasts them: they are not of size 1), and a view is one
// column of them.
void BatchDimAnalyzer::FollowPositions(NodeId id, const Node& n) {
  const PositionsView* view = FindPositionsView(n);
  if (view == nullptr || a_.num_outputs(id) != 1) return;
  const ValueRef* in = n.args.empty() ? nullptr : n.args[0].get_if<ValueRef>();
  const TensorType* it = in ? TypeOf(*in) : nullptr;
  const TensorType* ot = OutType(n, 0);
  if (it == nullptr || ot == nullptr) return;
  const ValueInfo src = Read(*in);
  ValueInfo& v = a_.values_[a_.value_offset_[id.value]];
  if (!src.placement.is_shard() || src.positions == Positions::kNone || !v.placement.is_shard() ||
      v.outer != src.outer || ot->shape[v.placement.dim] != it->shape[src.placement.dim]) {
    return;
  }
  const int64_t rows = it->shape[src.placement.dim];
  if (view->column && (it->numel() != rows || ot->numel() != rows)) return;
  v.positions = src.positions;
  v.restores = src.restores;
  v.repeat = src.repeat;
}

// gather(x, d, P) / scatter(x, d, P, v) / scatter_add(x, d, P, v), P positions expanded over the
// dims other than d: P's rows on dim d, every other dim x's (and v's) whole.
absl::Status BatchDimAnalyzer::AlignedRows(NodeId id, const Node& n, const OpRule& rule,
                                           std::vector<Operand>& ops, const Operand& p) {
  const AlignedRowsOp* form = FindAlignedRows(n.target);
  const Operand* self = Find(ops, 0);
  if (form == nullptr || self == nullptr) {
    return Error(n, absl::StrFormat("indexes with %s, positions of batch rows from a sort, in a "
                                    "form without a rule (only gather, scatter.src, scatter_add "
                                    "and index_add follow positions: x[p], x[p] = v, x[p] += v)",
                                    g_.node(p.ref.node).name));
  }
  const int64_t rank = self->type->rank();
  const int32_t d =
      static_cast<int32_t>(NormDim(IntArg(n, rule.param(ParamRole::kDim)).value_or(-1), rank));
  const Operand* src = form->src_arg < 0 ? nullptr : Find(ops, form->src_arg);
  const TensorType* shape = form->expanded ? p.type : src ? src->type : nullptr;
  bool whole = shape != nullptr && shape->rank() == rank &&
               (form->expanded ? p.info.placement.dim == d : p.type->rank() == 1) &&
               (form->src_arg < 0 || (src != nullptr && src->type->shape == shape->shape));
  for (int64_t k = 0; whole && k < rank; ++k) {
    whole = k == d || shape->shape[k] == self->type->shape[k];
  }
  if (!whole) {
    return Error(
        n,
        absl::StrFormat(
            "indexes along dim %d with %s (%s), positions of batch rows on its dim %d: exact "
            "only as x.gather(%d, p.unsqueeze(..).expand(..)) (or scatter/scatter_add; index_add "
            "with p itself) with the positions on the dim indexed and every other dim of x (%s) "
            "and of the values whole, so that each column picks the same rows",
            d, g_.node(p.ref.node).name, p.type->ToString(), p.info.placement.dim, d,
            self->type->ToString()));
  }
  if (src == nullptr) return IndexRows(id, n, rule, ops, p);
  positions_index_ = p.ref;
  FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule.linear, ops));
  return PutRows(id, n, *self, *Find(ops, form->src_arg), p, d, form->accumulate, s.scaled);
}

// x[p] = v (or +=): the rows v, in the order p gathers into (kGather: v in order P, the result in
// batch order, the backward of a gather) or in batch order (kRestore: the result in order P).
absl::Status BatchDimAnalyzer::PutRows(NodeId id, const Node& n, const Operand& self,
                                       const Operand& vals, const Operand& p, int32_t d,
                                       bool accumulate, bool scaled) {
  const bool gather = p.info.positions == Positions::kGather;
  const int32_t from = gather ? p.info.order : 0;   // the values' order
  const int32_t to = gather ? 0 : p.info.restores;  // the result's
  const int64_t rows = p.type->shape[p.info.placement.dim];
  const int64_t extent = self.type->shape[d];
  const ValueInfo& vv = vals.info;
  if (!vv.placement.is_shard() || vv.placement.dim != d || vals.type->rank() != self.type->rank() ||
      vv.order != from || vals.type->shape[d] != rows ||
      extent * (gather ? p.info.repeat : 1) != rows) {
    return Error(n,
                 absl::StrFormat("puts %s (%s, %s) at %s, positions of %d batch rows in %s, into "
                                 "%s (%d rows): the values must be those rows, in that order",
                                 g_.node(vals.ref.node).name, vv.placement.ToString(),
                                 OrderName(vv.order), g_.node(p.ref.node).name, rows,
                                 OrderName(p.info.order), g_.node(self.ref.node).name, extent));
  }
  if (!accumulate && gather && p.info.repeat > 1) {
    return Error(n, absl::StrFormat("writes each row %d times without accumulate: which write "
                                    "wins depends on the rows' order",
                                    p.info.repeat));
  }
  FXDP_RETURN_IF_ERROR(PutInto(id, n, self, d, p.info.outer, to));
  ValueInfo out = Shard(d, p.info.outer, scaled);
  out.order = to;
  SetAllOut(id, out);
  order_set_ = true;
  NodeInfo& info = a_.nodes_[id.value];
  info.detail = Detail::kFromArg;
  info.arg = vals.arg;
  return absl::OkStatus();
}

// The tensor rows are put into: replicated (zeros: sharded by this use), or its rows already on
// dim d in `order` (or in any order: a constant).
absl::Status BatchDimAnalyzer::PutInto(NodeId id, const Node& n, const Operand& self, int32_t d,
                                       int64_t outer, int32_t order) {
  const ValueInfo& sv = self.info;
  if (sv.placement.is_replicate()) {
    NeedShard(self, d, outer, id);
    return absl::OkStatus();
  }
  if (sv.placement.is_shard() && sv.placement.dim == d && (sv.order == order || sv.order == -1)) {
    return absl::OkStatus();
  }
  return Error(
      n, absl::StrFormat("puts rows into %s (%s), which is not in %s", g_.node(self.ref.node).name,
                         sv.placement.ToString(), OrderName(order)));
}

}  // namespace fxdp
