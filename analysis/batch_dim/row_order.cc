// Rows each rank puts in its own order: dropless MoE dispatch.
//
// A mixture-of-experts layer (transformers' grouped_mm experts) sorts the
// token -> expert assignments along the flattened token dim, gathers the
// tokens in that order, runs each expert on its contiguous group of rows
// (_grouped_mm with offsets = cumsum(histc(sorted keys))), and gathers the
// results back with the inverse permutation. Sorting a batch-sharded dim on
// each rank is not a slice of sorting it on one device, but every step in
// between works on each row alone, so the rows come back exact:
//
//   * sort along the batch dim gives values and indices whose rows are in a
//     rank-local order P (ValueInfo::order = 1 + the sort's node id); its
//     indices are positions (kGather): x[perm] and x[perm // k] put a tensor
//     in batch order into order P (x[perm // k]: each row k times);
//   * index_put(_, [perm], arange(n)) is the inverse (kRestore): x_P[inv]
//     is back in batch order; the backwards (index_put with accumulate of a
//     zero tensor) go the other way;
//   * every other op that reads rows in order P is row-wise (OrderRows): its
//     sharded outputs keep the dim's extent and take order P, or it reduces
//     the dim (a sum: the order does not matter, the partial sum is summed);
//     mixing rows of two orders, or of order P with rows in batch order
//     (including a replicated value sliced by batch rows, or arange(B)
//     positions), is refused, as is any op without a rule;
//   * _grouped_mm groups rows by offsets that must be a function of the same
//     sort's values alone, and not all-reduced: each rank's own group sizes.
// Order-dependent work stays refused by the families: cumsum, top-k, softmax
// or a capacity limit along the token dim work along the batch dim.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "analysis/batch_dim/analyzer.h"
#include "analysis/view_rules.h"
#include "util/status_macros.h"

namespace fxdp {

using ir::Argument;
using ir::Node;
using ir::NodeId;
using ir::TensorType;
using ir::ValueRef;
using Positions = ValueInfo::Positions;

std::string BatchDimAnalyzer::OrderName(int32_t order) const {
  if (order <= 0) return "batch order";
  return absl::StrFormat("the order sort '%s' put each rank's rows in",
                         g_.node(NodeId{order - 1}).name);
}

// arange(extent): 1-D, start 0, step 1.
bool BatchDimAnalyzer::IsPositionsOf(ValueRef r, int64_t extent) const {
  if (r.output != 0) return false;
  const Node& n = g_.node(r.node);
  const TensorType* t = TypeOf(r);
  const OpRule* rule = n.is_call() ? FindOpRule(n.target) : nullptr;
  const OpParam* end_arg = rule != nullptr && rule->family == OpFamily::kFactory
                               ? rule->param(ParamRole::kEnd)
                               : nullptr;
  if (end_arg == nullptr || t == nullptr || t->rank() != 1 || t->shape[0] != extent) return false;
  const OpParam* start_arg = rule->param(ParamRole::kStart);
  const OpParam* step_arg = rule->param(ParamRole::kStep);
  const int64_t start = start_arg ? IntArg(n, start_arg).value_or(-1) : 0;
  const int64_t step = step_arg ? IntArg(n, step_arg).value_or(-1) : 1;
  return start == 0 && IntArg(n, end_arg).value_or(-1) == extent && step == 1;
}

absl::Status BatchDimAnalyzer::SortRows(NodeId id, const Node& n, const OpRule& rule, int32_t d) {
  const ValueRef* in = n.args.empty() ? nullptr : n.args[0].get_if<ValueRef>();
  if (in == nullptr) return Error(n, "arg 0 must be a tensor");
  const ValueInfo x = Read(*in);
  const TensorType* xt = TypeOf(*in);
  if (xt != nullptr && xt->numel() != xt->shape[d]) {
    return Error(n, absl::StrFormat("sorts %s (%s) along the batch dim %d: each of its %d columns "
                                    "gets its own permutation, so "
                                    "its rows are not one permutation of each rank's rows (sort a "
                                    "1-D key and gather the rows "
                                    "with its indices, x[perm])",
                                    g_.node(in->node).name, xt->ToString(), d,
                                    xt->numel() / std::max<int64_t>(xt->shape[d], 1)));
  }
  if (x.order > 0) {
    return Error(n, absl::StrFormat("sorts rows of %s that are in %s; only rows in batch order "
                                    "can be sorted within each rank",
                                    g_.node(in->node).name, OrderName(x.order)));
  }
  ValueInfo v = Shard(d, x.outer, false);
  v.order = id.value + 1;
  SetOut(id, 0, v);
  v.positions = Positions::kGather;
  SetOut(id, 1, v);
  order_set_ = true;
  NodeInfo& info = a_.nodes_[id.value];
  info.detail = Detail::kFromArg;
  info.arg = 0;
  a_.notes_.push_back(absl::StrCat(
      n.name, ": sorts along the batch dim within each rank (", TargetString(n),
      "); exact because its rows are only permuted, worked on row by row, summed or put back"));
  (void)rule;
  return absl::OkStatus();
}

const Operand* BatchDimAnalyzer::PositionsOperand(const std::vector<Operand>& ops, int arg) const {
  for (const Operand& o : ops) {
    if (o.arg == arg && o.info.placement.is_shard() && o.info.positions != Positions::kNone)
      return &o;
  }
  return nullptr;
}

namespace {

// The one index of an index/index_put, at position `elem`: every other entry is None.
bool OnlyIndex(const Argument* idx, int elem) {
  const Argument::List* list = idx ? idx->get_if<Argument::List>() : nullptr;
  if (list == nullptr || elem < 0 || elem >= static_cast<int>(list->size())) return false;
  for (size_t i = 0; i < list->size(); ++i) {
    if (static_cast<int>(i) != elem && !(*list)[i].is_none()) return false;
  }
  return true;
}

}  // namespace

// x[p] (index with one index, at dim p.elem) or index_select(x, dim, p).
absl::Status BatchDimAnalyzer::IndexRows(NodeId id, const Node& n, const OpRule& rule,
                                         std::vector<Operand>& ops, const Operand& p) {
  positions_index_ = p.ref;
  FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule.linear, ops));
  const Operand* self = Find(ops, 0);
  const bool select = rule.family == OpFamily::kIndexWithDim;
  const int32_t d =
      select ? static_cast<int32_t>(NormDim(IntArg(n, rule.param(ParamRole::kDim)).value_or(-1),
                                            self ? self->type->rank() : 0))
             : p.elem;
  if ((!select && !OnlyIndex(ArgOf(n, rule.param(ParamRole::kIndices)), d)) ||
      (p.type->rank() != 1 && !rule.has(kAligned)) || self == nullptr ||
      !self->info.placement.is_shard() || self->info.placement.dim != d ||
      self->info.outer != p.info.outer) {
    return Error(
        n,
        absl::StrFormat(
            "indexes with %s, positions of batch rows, but not as x[positions] on x's batch dim %d "
            "alone (the only form whose rows stay within each rank)",
            g_.node(p.ref.node).name, d));
  }
  const int64_t rows = p.type->shape[p.info.placement.dim];  // gather's index: its rows' dim d
  const int64_t extent = self->type->shape[d];
  ValueInfo v = Shard(d, p.info.outer, s.scaled);
  if (p.info.positions == Positions::kGather) {
    if (self->info.order > 0 || extent * p.info.repeat != rows) {
      return Error(
          n, absl::StrFormat(
                 "gathers %d rows of %s (%d rows, in %s) with positions in %s (each row %d times)",
                 rows, g_.node(self->ref.node).name, extent, OrderName(self->info.order),
                 OrderName(p.info.order), p.info.repeat));
    }
    v.order = p.info.order;
  } else if (self->info.order != p.info.restores || extent != rows) {
    return Error(n, absl::StrFormat("puts back rows in %s, but %s (%d rows) is in %s",
                                    OrderName(p.info.restores), g_.node(self->ref.node).name,
                                    extent, OrderName(self->info.order)));
  }
  SetAllOut(id, v);
  order_set_ = true;
  NodeInfo& info = a_.nodes_[id.value];
  info.detail = Detail::kFromArg;
  info.arg = 0;
  return absl::OkStatus();
}

namespace {

// The first node other than `except` that reads `v`, or nullptr.
const Node* OtherReader(const ir::Graph& g, ValueRef v, NodeId except) {
  for (size_t u = 0; u < g.nodes().size(); ++u) {
    bool reads = false;
    g.nodes()[u].ForEachInput([&](ValueRef x) { reads = reads || x == v; });
    if (reads && static_cast<int32_t>(u) != except.value) return &g.nodes()[u];
  }
  return nullptr;
}

}  // namespace

// index_put(_, [perm], arange(n)): the inverse permutation; index_put(zeros,
// [perm (// k)], rows in order P, accumulate): rows back in batch order (the
// backward of a gather); index_put(zeros, [inverse], rows): rows in order P.
absl::Status BatchDimAnalyzer::IndexPutRows(NodeId id, const Node& n, const OpRule& rule,
                                            std::vector<Operand>& ops, const Operand& p) {
  positions_index_ = p.ref;
  FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule.linear, ops));
  const Operand* self = Find(ops, 0);
  const Operand* vals = Find(ops, 2);
  const int32_t d = p.elem;
  const int64_t outer = p.info.outer;
  if (!OnlyIndex(ArgOf(n, rule.param(ParamRole::kIndices)), d) || p.type->rank() != 1 ||
      self == nullptr || vals == nullptr || self->type->rank() <= d) {
    return Error(n, absl::StrFormat("puts values at %s, positions of batch rows, but not as "
                                    "x[positions] = values on one dim of x",
                                    g_.node(p.ref.node).name));
  }
  const bool accumulate = BoolArg(n, 3, "accumulate").value_or(false);
  const int64_t rows = p.type->shape[0];
  const int64_t extent = self->type->shape[d];
  if (p.info.positions != Positions::kGather || p.info.repeat != 1 || accumulate ||
      !IsPositionsOf(vals->ref, rows) || extent != rows) {
    return PutRows(id, n, *self, *vals, p, d, accumulate, s.scaled);
  }
  // The inverse permutation: arange(n) becomes each rank's arange(n_r), so nothing else may read
  // it.
  if (const Node* other = OtherReader(g_, vals->ref, id)) {
    return Error(
        n, absl::StrFormat("builds the inverse of %s from %s, which %s also reads: each rank's "
                           "inverse needs its own arange(n_r), where %s needs the batch's "
                           "positions (use a separate arange)",
                           g_.node(p.ref.node).name, g_.node(vals->ref.node).name, other->name,
                           other->name));
  }
  if (vals->info.placement.is_replicate() &&
      upgrades_.emplace(vals->ref.node.value, Upgrade{0, outer, id}).second) {
    MarkChanged(id);
  }
  if (!self->info.placement.is_replicate()) {
    FXDP_RETURN_IF_ERROR(PutInto(id, n, *self, d, outer, self->info.order));
  }
  ValueInfo out = Shard(d, outer, false);
  out.positions = Positions::kRestore;
  out.restores = p.info.order;
  SetAllOut(id, out);
  order_set_ = true;
  NodeInfo& info = a_.nodes_[id.value];
  info.detail = Detail::kFromArg;
  info.arg = 2;
  return absl::OkStatus();
}

namespace {

bool Is(const Node& m, absl::string_view name) { return m.is_call() && m.target.name == name; }

}  // namespace

// Through dtype casts (and, with `views`, views that keep every element in order).
ValueRef BatchDimAnalyzer::ThroughCasts(ValueRef r, bool views) const {
  for (int depth = 0; depth < 16; ++depth) {
    const Node& m = g_.node(r.node);
    const bool cast = Is(m, "aten::_to_copy") || Is(m, "aten::to") || Is(m, "aten::clone");
    const bool view = views && (Is(m, "aten::view") || Is(m, "aten::reshape") ||
                                Is(m, "aten::_unsafe_view") || Is(m, "aten::flatten"));
    const ValueRef* in = m.args.empty() ? nullptr : m.args[0].get_if<ValueRef>();
    if (!(cast || view) || in == nullptr) return r;
    r = *in;
  }
  return r;
}

// Every key of sort `order` is a group 0..groups-1: the sort reads (through casts and views) the
// indices of a topk, max or argmax over a dim of `groups` entries.
bool BatchDimAnalyzer::KeysAreGroups(int32_t order, int64_t groups) const {
  const ValueRef* in = g_.node(NodeId{order - 1}).args.empty()
                           ? nullptr
                           : g_.node(NodeId{order - 1}).args[0].get_if<ValueRef>();
  if (in == nullptr) return false;
  ValueRef k = ThroughCasts(*in, true);
  const Node* src = &g_.node(k.node);
  if (src->is_getitem()) {
    const int64_t* out = src->args.size() > 1 ? src->args[1].get_if<int64_t>() : nullptr;
    if (out == nullptr || *out != 1) return false;
    k = src->args[0].as<ValueRef>();
    src = &g_.node(k.node);
    if (!Is(*src, "aten::topk") && !Is(*src, "aten::max")) return false;
  } else if (!Is(*src, "aten::argmax")) {
    return false;
  }
  const ValueRef* x = src->args.empty() ? nullptr : src->args[0].get_if<ValueRef>();
  const TensorType* xt = x ? TypeOf(*x) : nullptr;
  const int i = Is(*src, "aten::topk") ? 2 : 1;
  const std::optional<int64_t> dim = IntArg(*src, i, "dim");
  if (xt == nullptr || (!dim.has_value() && !Is(*src, "aten::topk"))) return false;
  return xt->rank() > 0 && xt->shape[NormDim(dim.value_or(-1), xt->rank())] == groups;
}

// The group sizes of sort `order`'s values (its output 0, or keys[perm] of its own keys and
// indices: argsort's form): histc(keys, bins=G, min=0, max=G-1), or
// (keys.unsqueeze(1) == arange(G)).sum(0); G, or -1.
int64_t BatchDimAnalyzer::GroupCounts(ValueRef r, int32_t order) const {
  auto sort_output = [&](const ValueRef& k, int64_t which) {
    const Node& m = g_.node(k.node);
    const int64_t* out =
        m.is_getitem() && m.args.size() > 1 ? m.args[1].get_if<int64_t>() : nullptr;
    return out != nullptr && *out == which && m.args[0].as<ValueRef>().node.value == order - 1;
  };
  auto sorted_keys = [&](const Argument& a) {
    const ValueRef* v = a.get_if<ValueRef>();
    if (v == nullptr) return false;
    const ValueRef k = ThroughCasts(*v, false);
    if (sort_output(k, 0)) return true;
    const Node& m = g_.node(k.node);  // keys[perm], perm the sort's indices of those keys
    const Node& sort = g_.node(NodeId{order - 1});
    if (!Is(m, "aten::index") || m.args.size() < 2 || !m.args[0].is_ref() || sort.args.empty() ||
        !sort.args[0].is_ref() || !(m.args[0].as<ValueRef>() == sort.args[0].as<ValueRef>())) {
      return false;
    }
    const auto* list = m.args[1].get_if<Argument::List>();
    return list != nullptr && list->size() == 1 && (*list)[0].is_ref() &&
           sort_output((*list)[0].as<ValueRef>(), 1);
  };
  const Node& c = g_.node(r.node);
  if (Is(c, "aten::histc") && !c.args.empty() && sorted_keys(c.args[0])) {
    const int64_t bins = IntArg(c, 1, "bins").value_or(100);
    return NumberArg(c, 2, "min").value_or(0) == 0 && NumberArg(c, 3, "max").value_or(0) == bins - 1
               ? bins
               : -1;
  }
  const std::optional<std::vector<int64_t>> dims =
      Is(c, "aten::sum") ? DimsArg(c, 1, "dim") : std::nullopt;
  if (!dims || *dims != std::vector<int64_t>{0} || c.args.empty() || !c.args[0].is_ref()) return -1;
  const Node& eq = g_.node(ThroughCasts(c.args[0].as<ValueRef>(), false).node);
  if (!Is(eq, "aten::eq") || eq.args.size() < 2) return -1;
  for (int side = 0; side < 2; ++side) {
    const ValueRef* u = eq.args[side].get_if<ValueRef>();
    const ValueRef* ar = eq.args[1 - side].get_if<ValueRef>();
    if (u == nullptr || ar == nullptr || !Is(g_.node(u->node), "aten::unsqueeze")) continue;
    const Node& un = g_.node(u->node);
    const int64_t d = IntArg(un, 1, "dim").value_or(0);
    const TensorType* at = TypeOf(*ar);
    if ((d == 1 || d == -1) && !un.args.empty() && sorted_keys(un.args[0]) && at != nullptr &&
        at->rank() == 1 && IsPositionsOf(*ar, at->shape[0])) {
      return at->shape[0];
    }
  }
  return -1;
}

// offs groups the rows on each rank only when every row's group is a function of its key:
// offs = cumsum(counts) of each rank's own (partial, never all-reduced) counts of the values of
// the same ascending sort, by group 0..G-1, with every key a group (the indices of a top-k over G).
absl::Status BatchDimAnalyzer::CheckGroupOffsets(const Node& n, const Operand& offs,
                                                 int32_t order) const {
  if (order <= 0) {
    return Error(n,
                 "groups batch rows in batch order; its offsets would count the rows of the "
                 "whole batch, not this rank's (sort the rows by group first)");
  }
  if (!offs.info.placement.is_partial()) {
    return Error(
        n,
        absl::StrFormat(
            "groups rows by offsets %s that are %s: they must be each rank's own group sizes (the "
            "counts of its sorted keys, not all-reduced)",
            g_.node(offs.ref.node).name, offs.info.placement.ToString()));
  }
  const Node& sort = g_.node(NodeId{order - 1});
  if (BoolArg(sort, sort.target.overload == "stable" ? -1 : 2, "descending").value_or(false)) {
    return Error(n, absl::StrFormat("groups rows of sort '%s', which is descending: offsets count "
                                    "the groups from the first, so rows would not fall in their "
                                    "key's group",
                                    sort.name));
  }
  const Node& cs = g_.node(ThroughCasts(offs.ref, false).node);
  const ValueRef* counts =
      Is(cs, "aten::cumsum") && !cs.args.empty() && IntArg(cs, 1, "dim").value_or(-1) == 0
          ? cs.args[0].get_if<ValueRef>()
          : nullptr;
  const int64_t groups = counts ? GroupCounts(ThroughCasts(*counts, false), order) : -1;
  if (groups < 0) {
    return Error(n,
                 absl::StrFormat(
                     "groups rows by offsets %s that are not cumsum(histc(keys, G, 0, G - 1)) or "
                     "cumsum((keys.unsqueeze(1) == arange(G)).sum(0)) of the values of sort '%s', "
                     "so a row's "
                     "group may depend on the other rows of its rank",
                     g_.node(offs.ref.node).name, sort.name));
  }
  if (!KeysAreGroups(order, groups)) {
    return Error(n, absl::StrFormat("counts the keys of sort '%s' by groups 0..%d, but the keys "
                                    "are not shown to be groups (the "
                                    "indices of a topk, max or argmax over %d entries): keys "
                                    "outside would shift the offsets",
                                    sort.name, groups - 1, groups));
  }
  return absl::OkStatus();
}

// _grouped_mm(a [rows, k], b [groups, k, n], offs) -> [rows, n]: row-wise;
// _grouped_mm(a [k, rows], b [rows, n], offs) -> [groups, k, n]: a sum over rows.
absl::Status BatchDimAnalyzer::GroupedMm(NodeId id, const Node& n, const OpRule& rule) {
  std::vector<Operand> ops = Operands(n);
  FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule.linear, ops, /*exempt_arg=*/2));
  const Operand* a = Find(ops, 0);
  const Operand* b = Find(ops, 1);
  const Argument* offs_arg = ArgAt(n, 2, "offs");
  const ValueRef* offs_ref = offs_arg ? offs_arg->get_if<ValueRef>() : nullptr;
  if (a == nullptr || b == nullptr) return Error(n, "expects two tensor operands");
  const bool as = a->info.placement.is_shard(), bs = b->info.placement.is_shard();
  if (!as && !bs) {
    SetCombined(id, Combined{}, s);
    return absl::OkStatus();
  }
  if (const Argument* bias = ArgAt(n, 3, "bias"); bias != nullptr && !bias->is_none()) {
    const ValueRef* br = bias->get_if<ValueRef>();
    if (br != nullptr && Read(*br).placement.is_shard()) return Error(n, "bias holds the batch");
  }
  NodeInfo& info = a_.nodes_[id.value];
  info.arg = 0;
  const int32_t order = a->info.order;
  ValueInfo out;
  if (as && !bs && a->type->rank() == 2 && b->type->rank() == 3 && a->info.placement.dim == 0) {
    out = Shard(0, a->info.outer, s.scaled);
    out.order = order;
    info.detail = Detail::kFromArg;
  } else if (as && bs && a->type->rank() == 2 && b->type->rank() == 2 &&
             a->info.placement.dim == 1 && b->info.placement.dim == 0 && b->info.order == order &&
             a->info.outer == b->info.outer) {
    out = Partial(s.scaled);
    info.detail = Detail::kContracted;
  } else {
    return Error(
        n,
        absl::StrFormat(
            "holds the batch on dims the grouped product cannot keep row by row: a %s of rank %d, "
            "b %s of rank %d (supported: a's rows with a replicated 3-D b, or a^T b summed over "
            "rows)",
            a->info.placement.ToString(), a->type->rank(), b->info.placement.ToString(),
            b->type->rank()));
  }
  const Operand* offs = nullptr;
  for (const Operand& o : ops) {
    if (offs_ref != nullptr && o.ref == *offs_ref) offs = &o;
  }
  if (offs == nullptr) return Error(n, "groups batch rows without offsets");
  FXDP_RETURN_IF_ERROR(CheckGroupOffsets(n, *offs, order));
  SetAllOut(id, out);
  order_set_ = true;
  return absl::OkStatus();
}

// Positions (a sort's indices, p // k, the inverse permutation) hold each rank's own row numbers,
// 0..n_r-1, where one device has 0..B-1: exact as the index of x[p] or x[p] = v, as p // k
// (coarser positions), through unsqueeze/expand (row_order_gather.cc), or as the shape of
// empty_like(p); any other read uses them as values.
absl::Status BatchDimAnalyzer::CheckPositionsUse(NodeId id, const Node& n,
                                                 const OpRule* rule) const {
  if (rule != nullptr && rule->family == OpFamily::kLike) return absl::OkStatus();
  const int32_t base = a_.value_offset_[id.value];
  bool outputs_positions = a_.num_outputs(id) > 0;
  for (int32_t k = 0; k < a_.num_outputs(id); ++k) {
    const ValueInfo& v = a_.values_[base + k];
    if (v.placement.is_shard() && v.positions == Positions::kNone) outputs_positions = false;
  }
  const bool divides = ((rule != nullptr && rule->has(kDividesPositions)) || IsPositionsView(n)) &&
                       outputs_positions;
  absl::Status st;
  n.ForEachInput([&](ValueRef r) {
    if (!st.ok() || TypeOf(r) == nullptr || (positions_index_ && r == *positions_index_) || divides)
      return;
    const ValueInfo v = Read(r);
    if (!v.placement.is_shard() || v.positions == Positions::kNone) return;
    const int32_t sort = v.positions == Positions::kGather ? v.order : v.restores;
    st = Error(n, absl::StrFormat("reads %s, row positions from sort '%s', as values: on each rank "
                                  "they number its own rows "
                                  "0..n_r-1, where one device numbers the whole batch 0..B-1; "
                                  "positions are exact only as an "
                                  "index (x[p], x[p // k], inv[p] = arange(n), y[inv])",
                                  g_.node(r.node).name, g_.node(NodeId{sort - 1}).name));
  });
  return st;
}

absl::Status BatchDimAnalyzer::OrderRows(NodeId id, const Node& n, const OpRule* rule) {
  const int32_t base = a_.value_offset_[id.value];
  const int32_t n_out = a_.num_outputs(id);
  if (rule != nullptr && rule->family == OpFamily::kLike) {  // zeros_like(x): no rows to order
    for (int32_t k = 0; k < n_out; ++k) {
      if (a_.values_[base + k].placement.is_shard()) a_.values_[base + k].order = -1;
    }
    return absl::OkStatus();
  }
  int32_t order = 0;
  ValueRef first{}, natural{};
  bool has_natural = false;
  absl::Status mixed;
  n.ForEachInput([&](ValueRef r) {
    if (TypeOf(r) == nullptr) return;
    const ValueInfo v = Read(r);
    if (!v.placement.is_shard() || v.order == -1) return;
    if (v.order == 0) {
      has_natural = true;
      natural = r;
    } else if (order == 0) {
      order = v.order;
      first = r;
    } else if (v.order != order && mixed.ok()) {
      mixed = Error(n, absl::StrFormat("reads %s, in %s, with %s, in %s", g_.node(first.node).name,
                                       OrderName(order), g_.node(r.node).name, OrderName(v.order)));
    }
  });
  FXDP_RETURN_IF_ERROR(mixed);
  if (order == 0) return absl::OkStatus();
  const ValueInfo f = Read(first);
  const int64_t extent = TypeOf(first)->shape[f.placement.dim];
  auto refuse = [&](const std::string& why) {
    return Error(n, absl::StrFormat("reads %s, whose rows are in %s (not a slice of the batch), "
                                    "and %s; only row-wise ops, sums over the rows and putting the "
                                    "rows back are exact on such rows",
                                    g_.node(first.node).name, OrderName(order), why));
  };
  if (has_natural)
    return refuse(absl::StrCat(g_.node(natural.node).name, ", whose rows are in batch order"));
  if (rule == nullptr && !IsViewOp(n.target)) return refuse("has no batch-dim rule");
  if (rule != nullptr &&
      (rule->family == OpFamily::kAsStrided || rule->family == OpFamily::kAsStridedScatter)) {
    return refuse("views its storage with strides");
  }
  for (const ShardedRead& s : a_.sharded_reads_) {
    if (s.user == id)
      return refuse(absl::StrCat("slices ", g_.node(s.value.node).name, " by batch rows"));
  }
  const bool divides = rule != nullptr && rule->has(kDividesPositions) &&
                       f.positions == ValueInfo::Positions::kGather;
  for (int32_t k = 0; k < n_out; ++k) {
    ValueInfo& v = a_.values_[base + k];
    if (!v.placement.is_shard()) continue;
    const TensorType* t = OutType(n, k);
    if (t == nullptr || t->shape[v.placement.dim] != extent || v.outer != f.outer) {
      return refuse(
          absl::StrFormat("its output %d holds the batch on dim %d of %d entries (the rows: %d)", k,
                          v.placement.dim, t ? t->shape[v.placement.dim] : -1, extent));
    }
    v.order = order;
    // positions // k: positions along a dim k times coarser, whose rank blocks are those rows'.
    const std::optional<int64_t> by = divides ? IntArg(n, 1, "other") : std::nullopt;
    if (by && *by > 0 && f.outer == 1 && (extent / a_.batch_size_) % (f.repeat * *by) == 0) {
      v.positions = ValueInfo::Positions::kGather;
      v.repeat = f.repeat * *by;
    }
  }
  return absl::OkStatus();
}

}  // namespace fxdp
