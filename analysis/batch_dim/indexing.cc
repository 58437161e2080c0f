// index, index_put, embedding and embedding bag.
#include "analysis/batch_dim/analyzer.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "util/status_macros.h"

namespace fxdp {

using ir::Argument;
using ir::Graph;
using ir::Node;
using ir::NodeId;
using ir::TensorType;
using ir::ValueRef;

absl::Status BatchDimAnalyzer::Embedding(NodeId id, const Node& n, const OpRule& rule) {
  std::vector<Operand> ops = Operands(n);
  Special s;
  FXDP_ASSIGN_OR_RETURN(const Operand* idx, ShardedOperand(id, n, rule, ops, 1, &s));
  if (idx == nullptr) return absl::OkStatus();
  SetCombined(id, Combined{idx->info.placement.dim, idx->info.outer, 1}, s);
  return absl::OkStatus();
}

absl::Status BatchDimAnalyzer::EmbeddingBackward(NodeId id, const Node& n, const OpRule& rule) {
  std::vector<Operand> ops = Operands(n);
  if (IsRagged(n)) return RaggedBagsBackward(id, n, rule, ops);
  const Operand* g = Find(ops, 0);
  const Operand* idx = Find(ops, 1);
  if (rule.param(ParamRole::kOffsets) != nullptr && idx != nullptr &&
      !idx->info.placement.is_shard()) {
    // The backward of bags of a whole flat input (EmbeddingBag): grad_output's rows (and the
    // offsets) all-gathered, every bag's gradient added into the whole table on every rank.
    FXDP_ASSIGN_OR_RETURN(const bool gathered, GatherAlong(id, n, rule, 0));
    if (gathered) return absl::OkStatus();
  }
  // grad_output is [*indices.shape, embedding_dim]: both hold the batch on
  // the same leading dim, so a replicated one is built sharded or sliced.
  Special s;
  FXDP_ASSIGN_OR_RETURN(std::optional<Combined> batch,
                        GradAndInputBatch(id, n, rule, ops, g ? g->type->rank() : 0, &s));
  if (!batch) return absl::OkStatus();
  if (BoolArg(n, rule.param(ParamRole::kScaleGradByFreq)).value_or(false)) {
    // Each rank would divide by the counts of its own rows' indices, one
    // device by the whole batch's: not a sum of per-rank parts.
    return Error(n,
                 "scale_grad_by_freq=True divides each row's gradient by its index's count in the "
                 "whole batch, which no rank sees (each would count its own rows); use "
                 "scale_grad_by_freq=False");
  }
  NodeInfo& info = a_.nodes_[id.value];
  info.detail = Detail::kContracted;
  info.arg = 0;
  SetAllOut(id, Partial(s.scaled));
  return absl::OkStatus();
}

// arange(0, B * bag, bag): the offsets of B bags of `bag` indices each, the
// form F.embedding_bag gives a 2-D input [B, bag] (flattened).
bool BatchDimAnalyzer::IsBagOffsets(const Argument& a, int64_t bag) const {
  const ValueRef* r = a.get_if<ValueRef>();
  if (r == nullptr || r->output != 0) return false;
  const Node& n = g_.node(r->node);
  const TensorType* t = TypeOf(*r);
  const OpRule* rule = n.is_call() ? FindOpRule(n.target) : nullptr;
  if (rule == nullptr || rule->family != OpFamily::kFactory || t == nullptr || t->rank() != 1 ||
      t->shape[0] != a_.batch_size_) {
    return false;
  }
  const OpParam* start = rule->param(ParamRole::kStart);
  const OpParam* end = rule->param(ParamRole::kEnd);
  const OpParam* step = rule->param(ParamRole::kStep);
  return end != nullptr && (start ? IntArg(n, start).value_or(-1) : 0) == 0 &&
         IntArg(n, end).value_or(-1) == a_.batch_size_ * bag &&
         (step ? IntArg(n, step).value_or(-1) : 1) == bag;
}

// Whether every use of `r` is as the offsets of an embedding bag (forward or
// backward), so that each rank may hold its own bags' offsets.
bool BatchDimAnalyzer::OnlyOffsets(ValueRef r) const {
  for (const Node& u : g_.nodes()) {
    const OpRule* rule = u.is_call() ? FindOpRule(u.target) : nullptr;
    const OpParam* p = rule != nullptr ? rule->param(ParamRole::kOffsets) : nullptr;
    const Argument* offsets = p != nullptr ? ArgOf(u, p) : nullptr;
    bool other = false;
    u.ForEachInput([&](ValueRef x) {
      if (x == r && (offsets == nullptr || offsets->get_if<ValueRef>() == nullptr ||
                     !(*offsets->get_if<ValueRef>() == r))) {
        other = true;
      }
    });
    if (other) return false;
  }
  return true;
}

// _embedding_bag(weight, indices, offsets, ..., per_sample_weights,
// include_last_offset): bag i sums (means, maxes) indices[offsets[i] :
// offsets[i + 1]]. With the batch in the bags, each rank's bags must be
// contiguous indices of a static size: the 2-D form [B, bag] flattened, whose
// offsets arange(0, B * bag, bag) each rank builds as arange(0, B_r * bag, bag).
// Offsets from the data (bags of varying length) into a flat input that holds
// the batch would give each rank a share of the input whose size depends on
// the data: refused. A flat input without a batch dim (batch_dim=-1, the text
// classification tutorial) is split by its offsets (ragged_bags.cc) or, where
// something else reads it, read whole (WholeInputBags).
absl::Status BatchDimAnalyzer::EmbeddingBag(NodeId id, const Node& n, const OpRule& rule) {
  std::vector<Operand> ops = Operands(n);
  Special s;
  FXDP_ASSIGN_OR_RETURN(s, Linear(id, n, rule.linear, ops));
  FXDP_RETURN_IF_ERROR(RequireReplicatedArgs(n, ops, rule));
  const OpParam* offsets_p = rule.param(ParamRole::kOffsets);
  const Operand* idx = Find(ops, 1);
  const Operand* offsets = Find(ops, offsets_p->index);
  const bool idx_sharded = idx != nullptr && idx->info.placement.is_shard();
  if (!idx_sharded && (offsets == nullptr || !offsets->info.placement.is_shard())) {
    SetCombined(id, Combined{}, s);
    return absl::OkStatus();
  }
  if (IsRagged(n)) {
    RaggedBags(id, n, s);
    return absl::OkStatus();
  }
  if (!idx_sharded) return WholeInputBags(id, n, rule, ops);
  const int64_t extent = idx != nullptr && idx->type->rank() == 1 ? idx->type->shape[0] : -1;
  const int64_t bag = extent > 0 && extent % a_.batch_size_ == 0 ? extent / a_.batch_size_ : -1;
  const Argument* off_arg = ArgOf(n, offsets_p);
  if (!idx_sharded || idx->info.placement.dim != 0 || idx->info.outer != 1 || bag < 0 ||
      off_arg == nullptr || !IsBagOffsets(*off_arg, bag)) {
    return Error(
        n,
        absl::StrFormat(
            "splits the batch by bags of a flat 1-D input (indices %s: %s, offsets %s: %s): unless "
            "every bag has the same length (a 2-D input [batch, bag length]), a rank's share of "
            "the input depends on the data, which a static per-rank graph cannot hold; give the "
            "flat input batch_dim=-1 (each rank then reads its own bags' elements or the whole "
            "input, whichever moves fewer bytes; exact either way) "
            "or pass a 2-D input (pad the bags to one length with padding_idx, or with "
            "per_sample_weights 0 in mode='sum')",
            idx ? g_.node(idx->ref.node).name : "?", idx ? idx->info.placement.ToString() : "-",
            offsets ? g_.node(offsets->ref.node).name : "?",
            offsets ? offsets->info.placement.ToString() : "-"));
  }
  if (BoolArg(n, rule.param(ParamRole::kIncludeLastOffset)).value_or(false)) {
    return Error(n,
                 "include_last_offset=True with the batch in the bags: the last offset "
                 "is the whole input's length; pass include_last_offset=False");
  }
  const ValueRef positions = off_arg->as<ValueRef>();
  if (!OnlyOffsets(positions)) {
    return Error(n, absl::StrFormat("its offsets (%s) are also used elsewhere; each rank holds "
                                    "its own bags' offsets",
                                    g_.node(positions.node).name));
  }
  if (upgrades_.emplace(positions.node.value, Upgrade{0, 1, id}).second) MarkChanged(id);
  // per_sample_weights: one per index, the batch as in indices.
  std::vector<Operand> per_index;
  for (const Operand& o : ops) {
    if (o.arg != offsets_p->index && !rule.replicated(o.arg)) per_index.push_back(o);
  }
  FXDP_ASSIGN_OR_RETURN(Combined c, Broadcast(id, n, per_index, 1, false));
  (void)c;
  // (output, offset2bag, bag_size, max_indices): per bag but offset2bag, per
  // index (rank-local bag numbers, read only by the backward).
  NodeInfo& info = a_.nodes_[id.value];
  info.detail = Detail::kFromArg;
  info.arg = 1;
  SetAllOut(id, Shard(0, 1, s.scaled));
  return absl::OkStatus();
}

// Bags of a whole flat input (indices replicated: batch_dim=-1, every rank reads all of it) at
// offsets that hold the batch (the text classification tutorial's collate: offsets =
// cumsum(lengths), one per sample). A rank's bags are indices[offsets[b_r] : offsets[b_r + B_r]],
// whose end is the next rank's first offset: the offsets are all-gathered and every rank computes
// every bag (GatherAlong: the output whole, R), as one device does; each sharded use reads its
// rows. The backward gathers grad_output's rows the same way (EmbeddingBackward).
absl::Status BatchDimAnalyzer::WholeInputBags(NodeId id, const Node& n, const OpRule& rule,
                                              const std::vector<Operand>& ops) {
  const OpParam* offsets_p = rule.param(ParamRole::kOffsets);
  for (const Operand& o : ops) {
    if (o.arg == offsets_p->index || !o.info.placement.is_shard()) continue;
    return Error(n, absl::StrFormat("arg %d (%s) holds the batch on dim %d, but the indices (a "
                                    "flat input read whole) do not: per_sample_weights are one "
                                    "per index; give them the indices' batch_dim (-1)",
                                    o.arg, g_.node(o.ref.node).name, o.info.placement.dim));
  }
  if (BoolArg(n, rule.param(ParamRole::kIncludeLastOffset)).value_or(false)) {
    return Error(n,
                 "include_last_offset=True with the batch in the offsets: the offsets have one "
                 "more entry than the batch; pass include_last_offset=False");
  }
  FXDP_ASSIGN_OR_RETURN(const bool gathered, GatherAlong(id, n, rule, 0));
  if (!gathered) {
    return Error(n, "its offsets hold the batch on another dim than 0");
  }
  NoteBagChoice(id);
  return absl::OkStatus();
}

// arange(B) (a factory with an End, start 0, step 1): the positions of the
// batch's samples.
bool BatchDimAnalyzer::IsBatchPositions(const Argument& a) const {
  const ValueRef* r = a.get_if<ValueRef>();
  return r != nullptr && IsPositionsOf(*r, a_.batch_size_);
}

// Whether every use of `r` indexes dim `pos` of an index or index_put, so
// that arange(B) can become arange(B_r): each rank indexes its own rows.
bool BatchDimAnalyzer::OnlyIndexesDim(ValueRef r, int64_t pos) const {
  bool ok = true;
  for (const Node& u : g_.nodes()) {
    bool uses = false;
    u.ForEachInput([&](ValueRef x) { uses |= x == r; });
    if (!uses) continue;
    const OpRule* rule = u.is_call() ? FindOpRule(u.target) : nullptr;
    if (rule == nullptr ||
        (rule->family != OpFamily::kIndex && rule->family != OpFamily::kIndexPut)) {
      return false;
    }
    const Argument* idx = ArgOf(u, rule->param(ParamRole::kIndices));
    const Argument::List* list = idx ? idx->get_if<Argument::List>() : nullptr;
    if (list == nullptr) return false;
    for (size_t i = 0; i < list->size(); ++i) {
      const ValueRef* x = (*list)[i].get_if<ValueRef>();
      if (x != nullptr && *x == r && static_cast<int64_t>(i) != pos) ok = false;
    }
    if (const ValueRef* self = u.args.empty() ? nullptr : u.args[0].get_if<ValueRef>()) {
      if (*self == r) return false;
    }
  }
  return ok;
}

// Indexing the batch dim `pos` by arange(B) and other 1-D indices
// (`x[arange(B), last_token]`): each rank indexes its own rows with
// arange(B_r), the other indices are its batch rows. Returns the dim of the
// indexed result that holds the batch, or -1 when the pattern does not apply.
int64_t BatchDimAnalyzer::BatchPositionsIndex(NodeId id, const Node& n,
                                              const std::vector<Operand>& ops,
                                              const Argument::List& list, int64_t pos) {
  if (pos < 0 || pos >= static_cast<int64_t>(list.size()) || !IsBatchPositions(list[pos]))
    return -1;
  const ValueRef positions = list[pos].as<ValueRef>();
  if (!OnlyIndexesDim(positions, pos)) return -1;
  std::vector<int64_t> indexed;
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].is_none()) continue;
    indexed.push_back(static_cast<int64_t>(i));
    const TensorType* t = list[i].get_if<ValueRef>() ? TypeOf(list[i].as<ValueRef>()) : nullptr;
    if (t == nullptr || t->rank() != 1) return -1;
  }
  for (const Operand& o : ops) {
    if (o.arg != 1 || o.elem == pos) continue;
    if (o.info.placement.is_shard() && (o.info.placement.dim != 0 || o.info.outer != 1)) return -1;
    if (o.info.placement.is_replicate()) NeedShard(o, 0, 1, id);
  }
  if (upgrades_.emplace(positions.node.value, Upgrade{0, 1, id}).second) MarkChanged(id);
  const bool adjacent =
      indexed.back() - indexed.front() + 1 == static_cast<int64_t>(indexed.size());
  return adjacent ? indexed.front() : 0;
}

// index_put(self, indices, values, accumulate): a parameter's gradient
// scattered into a zero table (no batch operand; partial values flow through
// a zero self); the backward of x[..., idx] with the batch in self and values
// on a dim that is not indexed; or the backward of x[arange(B), idx]
// (BatchPositionsIndex); or, the batch in the indices, the backward of
// param[ids] (IndexAccumulate).
absl::Status BatchDimAnalyzer::IndexPut(NodeId id, const Node& n, const OpRule& rule) {
  std::vector<Operand> ops = Operands(n);
  if (const Operand* p = PositionsOperand(ops)) return IndexPutRows(id, n, rule, ops, *p);
  const Operand* self = Find(ops, 0);
  const Argument* idx = ArgOf(n, rule.param(ParamRole::kIndices));
  const Argument::List* list = idx ? idx->get_if<Argument::List>() : nullptr;
  if (self == nullptr || list == nullptr) return Error(n, "expects self and a list of indices");
  bool sharded = false;
  for (const Operand& o : ops) sharded |= o.info.placement.is_shard();
  const int64_t pos = BatchPositionsArg(ops, *self, *list);
  if (pos < 0 && IndicesHoldBatch(ops, *list)) return IndexAccumulate(id, n, rule, ops, *list);
  FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule.linear, ops));
  if (!sharded && pos < 0) {
    SetCombined(id, Combined{}, s);
    return absl::OkStatus();
  }
  FXDP_ASSIGN_OR_RETURN(const int64_t d, IndexPutBatchDim(id, n, ops, *list, pos));
  NodeInfo& info = a_.nodes_[id.value];
  info.detail = Detail::kFromArg;
  info.arg = 0;
  SetAllOut(id, Shard(static_cast<int32_t>(d), 1, s.scaled));
  return absl::OkStatus();
}

int64_t BatchDimAnalyzer::BatchPositionsArg(const std::vector<Operand>& ops, const Operand& self,
                                            const Argument::List& list) const {
  // arange(B) indexes the batch only next to a batch-sharded self or index (a
  // same-sized arange over another dim is positions of that dim).
  int64_t pos = -1;
  for (size_t i = 0; i < list.size() && pos < 0; ++i) {
    if (!IsBatchPositions(list[i])) continue;
    bool batch =
        self.info.placement.is_shard() && self.info.placement.dim == static_cast<int32_t>(i);
    for (const Operand& o : ops) {
      batch |= o.arg == 1 && o.elem != static_cast<int>(i) && o.info.placement.is_shard();
    }
    if (batch) pos = static_cast<int64_t>(i);
  }
  return pos;
}

absl::StatusOr<int64_t> BatchDimAnalyzer::IndexPutBatchDim(NodeId id, const Node& n,
                                                           const std::vector<Operand>& ops,
                                                           const Argument::List& list,
                                                           int64_t pos) {
  const Operand* self = Find(ops, 0);
  // The indexed result's layout (as Index): [self dims before the indexed ones, the
  // indices' broadcast dims, the rest]; non-adjacent indexed dims put the broadcast first.
  std::vector<int64_t> indexed;
  int64_t bcast_rank = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].is_none()) continue;
    indexed.push_back(static_cast<int64_t>(i));
    for (const Operand& o : ops) {
      if (o.arg != 1 || o.elem != static_cast<int>(i)) continue;
      bcast_rank = std::max<int64_t>(bcast_rank, o.type->rank());
      if (o.info.placement.is_shard() && pos < 0) {
        return Error(n, absl::StrFormat("index %d (%s) is sharded on the batch; index_put "
                                        "supports a batch in self and values only",
                                        i, g_.node(o.ref.node).name));
      }
    }
  }
  if (indexed.empty()) return Error(n, "expects at least one index");
  const bool adjacent =
      indexed.back() - indexed.front() + 1 == static_cast<int64_t>(indexed.size());
  const int64_t n_indexed = static_cast<int64_t>(indexed.size());
  const int64_t res_rank = self->type->rank() - n_indexed + bcast_rank;
  auto is_indexed = [&](int64_t d) {
    return std::find(indexed.begin(), indexed.end(), d) != indexed.end();
  };
  auto self_to_res = [&](int64_t d) -> int64_t {  // d not indexed
    if (adjacent) return d < indexed.front() ? d : d - n_indexed + bcast_rank;
    int64_t before = 0;
    for (int64_t i = 0; i < d; ++i) before += is_indexed(i) ? 0 : 1;
    return bcast_rank + before;
  };
  const Operand* v = Find(ops, 2);
  int64_t nd = -1, d = -1;
  if (pos >= 0) {
    nd = BatchPositionsIndex(id, n, ops, list, pos);
    d = pos;
    if (nd < 0) {
      return Error(n,
                   "indexes the batch dim with arange(B) whose values are also used "
                   "elsewhere; each rank can only index its own rows");
    }
  } else if (self->info.placement.is_shard()) {
    d = self->info.placement.dim;
    if (is_indexed(d)) return Error(n, absl::StrFormat("indexes dim %d, which holds the batch", d));
    nd = self_to_res(d);
  } else if (v != nullptr && v->info.placement.is_shard()) {
    nd = v->info.placement.dim + (res_rank - v->type->rank());
    for (int64_t j = 0; j < self->type->rank() && d < 0; ++j) {
      if (!is_indexed(j) && self_to_res(j) == nd) d = j;
    }
    if (d < 0) {
      return Error(n, absl::StrFormat("values hold the batch on dim %d, which lands in the "
                                      "indices' broadcast dims of self",
                                      v->info.placement.dim));
    }
  }
  if (d < 0) return Error(n, "cannot place the batch of its operands in self");
  if (self->info.placement.is_shard() && self->info.placement.dim != d) {
    return Error(n, absl::StrFormat("self holds the batch on dim %d, the indexed rows need it "
                                    "on dim %d",
                                    self->info.placement.dim, d));
  }
  if (self->info.placement.is_replicate()) NeedShard(*self, static_cast<int32_t>(d), 1, id);
  if (v != nullptr) {
    const int64_t vd = nd - (res_rank - v->type->rank());
    if (v->info.placement.is_shard() && v->info.placement.dim != vd) {
      return Error(n, absl::StrFormat("values hold the batch on dim %d, the indexed rows on dim %d",
                                      v->info.placement.dim, vd));
    }
    if (v->info.placement.is_replicate() && vd >= 0) NeedShard(*v, static_cast<int32_t>(vd), 1, id);
  }
  return d;
}

// Where index_put's values go: [self's dims before the indexed ones, the
// indices' broadcast dims, the rest]; non-adjacent indexed dims put the
// indices' dims first.
BatchDimAnalyzer::IndexLayout BatchDimAnalyzer::LayoutOf(const std::vector<Operand>& ops,
                                                         const Argument::List& list) const {
  IndexLayout l;
  std::vector<int64_t> indexed;
  for (size_t i = 0; i < list.size(); ++i) {
    if (!list[i].is_none()) indexed.push_back(static_cast<int64_t>(i));
  }
  for (const Operand& o : ops) {
    if (o.arg == 1) l.bcast_rank = std::max<int64_t>(l.bcast_rank, o.type->rank());
  }
  const Operand* self = Find(ops, 0);
  if (indexed.empty() || self == nullptr) return l;
  const bool adjacent =
      indexed.back() - indexed.front() + 1 == static_cast<int64_t>(indexed.size());
  l.front = adjacent ? indexed.front() : 0;
  l.res_rank = self->type->rank() - static_cast<int64_t>(indexed.size()) + l.bcast_rank;
  return l;
}

// Whether the batch is in index_put's indices: an index is batch-sharded, or
// the values hold the batch on one of the indices' broadcast dims.
bool BatchDimAnalyzer::IndicesHoldBatch(const std::vector<Operand>& ops,
                                        const Argument::List& list) const {
  const IndexLayout l = LayoutOf(ops, list);
  for (const Operand& o : ops) {
    if (o.arg == 1 && o.info.placement.is_shard()) return true;
    if (o.arg != 2 || !o.info.placement.is_shard() || l.res_rank < 0) continue;
    const int64_t nd = o.info.placement.dim + (l.res_rank - o.type->rank());
    if (nd >= l.front && nd < l.front + l.bcast_rank) return true;
  }
  return false;
}

// index_put(self, indices, values, accumulate=True) with the batch in the
// indices (the backward of param[ids], ids batch data): each rank adds its
// rows' values at its rows' indices, a share of the whole update, so the
// result is partial when self is zeros or partial. Without accumulate, an
// index two ranks write holds one value on one device: refused.
absl::Status BatchDimAnalyzer::IndexAccumulate(NodeId id, const Node& n, const OpRule& rule,
                                               std::vector<Operand> ops,
                                               const Argument::List& list) {
  if (!BoolArg(n, rule.param(ParamRole::kAccumulate)).value_or(false)) {
    return Error(n,
                 "writes values at indices that hold the batch without accumulate: an index "
                 "that two ranks write would keep one rank's value, not one device's; "
                 "accumulate (index_put_(..., accumulate=True)) or keep the indices replicated");
  }
  const Operand* self = Find(ops, 0);
  if (self == nullptr || self->info.placement.is_shard()) {
    return Error(n, "indexes a batch-sharded self with indices that hold the batch");
  }
  const IndexLayout l = LayoutOf(ops, list);
  std::vector<Operand> index_ops;
  for (const Operand& o : ops) {
    if (o.arg == 1) index_ops.push_back(o);
  }
  Operand* v = nullptr;
  for (Operand& o : ops) v = o.arg == 2 ? &o : v;
  Combined c;
  if (std::any_of(index_ops.begin(), index_ops.end(),
                  [](const Operand& o) { return o.info.placement.is_shard(); })) {
    FXDP_ASSIGN_OR_RETURN(c, Broadcast(id, n, index_ops, l.bcast_rank));
  } else {
    // Replicated indices spanning the batch (positions repeated per sample,
    // IndicesHoldBatch): each rank takes its rows of them, as of the values.
    c = {static_cast<int32_t>(v->info.placement.dim + (l.res_rank - v->type->rank()) - l.front),
         v->info.outer, 2};
    for (const Operand& o : index_ops) {
      const int64_t d = c.dim - (l.bcast_rank - o.type->rank());
      if (d >= 0) NeedShard(o, static_cast<int32_t>(d), c.outer, id);
    }
  }
  const int64_t nd = l.front + c.dim;
  if (v != nullptr) {
    const int64_t vd = nd - (l.res_rank - v->type->rank());
    if (v->info.placement.is_shard() && v->info.placement.dim != vd) {
      return Error(n, absl::StrFormat("values hold the batch on dim %d, the indices' rows on "
                                      "dim %d",
                                      v->info.placement.dim, vd));
    }
    if (v->info.placement.is_partial()) {
      RequireWhole(v->ref, id);
      v->info = kReplicated;
    }
    if (!v->info.placement.is_shard() && vd >= 0)
      NeedShard(*v, static_cast<int32_t>(vd), c.outer, id);
    // Each rank's values are its rows' share of the update.
    v->info = Partial(v->info.placement.is_shard() && v->info.mean_scaled);
  }
  FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule.linear, ops));
  if (!s.partial) {
    return Error(
        n, absl::StrFormat(
               "adds batch rows into self (%s), which is replicated and not zeros: each rank would "
               "add its rows to its own copy, counted once per rank in the sum",
               g_.node(self->ref.node).name));
  }
  NodeInfo& info = a_.nodes_[id.value];
  info.detail = Detail::kContracted;
  info.arg = 1;
  SetAllOut(id, Partial(s.scaled));
  return absl::OkStatus();
}

absl::Status BatchDimAnalyzer::Index(NodeId id, const Node& n, const OpRule& rule) {
  std::vector<Operand> ops = Operands(n);
  if (const Operand* p = PositionsOperand(ops)) return IndexRows(id, n, rule, ops, *p);
  FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule.linear, ops));
  const Operand* self = Find(ops, 0);
  if (self == nullptr) return Error(n, "arg 0 must be a tensor");
  const Argument* idx = ArgOf(n, rule.param(ParamRole::kIndices));
  const Argument::List* list = idx ? idx->get_if<Argument::List>() : nullptr;
  if (list == nullptr) return Error(n, "arg 1 must be a list of indices");
  std::vector<int64_t> indexed;
  int64_t bcast_rank = 0;
  const Operand* sharded_index = nullptr;
  for (size_t i = 0; i < list->size(); ++i) {
    if ((*list)[i].is_none()) continue;
    indexed.push_back(static_cast<int64_t>(i));
    for (const Operand& o : ops) {
      if (o.arg == 1 && o.elem == static_cast<int>(i)) {
        bcast_rank = std::max<int64_t>(bcast_rank, o.type->rank());
        if (o.info.placement.is_shard()) sharded_index = &o;
      }
    }
  }
  const bool adjacent = indexed.empty() || indexed.back() - indexed.front() + 1 ==
                                               static_cast<int64_t>(indexed.size());
  if (self->info.placement.is_shard() && self->info.outer == 1) {
    const int64_t nd = BatchPositionsIndex(id, n, ops, *list, self->info.placement.dim);
    if (nd >= 0) {
      NodeInfo& info = a_.nodes_[id.value];
      info.detail = Detail::kFromArg;
      info.arg = 0;
      SetAllOut(id, Shard(static_cast<int32_t>(nd), 1, s.scaled));
      return absl::OkStatus();
    }
  }
  if (self->info.placement.is_shard()) {
    if (sharded_index != nullptr) {
      return Error(n, "indexes a batch-sharded tensor with a batch-sharded index");
    }
    const int32_t d = self->info.placement.dim;
    if (std::find(indexed.begin(), indexed.end(), d) != indexed.end()) {
      return Error(n, absl::StrFormat("indexes dim %d, which holds the batch", d));
    }
    int64_t nd;
    if (adjacent && !indexed.empty() && d < indexed.front()) {
      nd = d;
    } else if (adjacent) {
      nd = d - static_cast<int64_t>(indexed.size()) + bcast_rank;
    } else {
      int64_t before = 0;
      for (int64_t i = 0; i < d; ++i) {
        if (std::find(indexed.begin(), indexed.end(), i) == indexed.end()) ++before;
      }
      nd = bcast_rank + before;
    }
    NodeInfo& info = a_.nodes_[id.value];
    info.detail = Detail::kFromArg;
    info.arg = 0;
    SetAllOut(id, Shard(static_cast<int32_t>(nd), self->info.outer, s.scaled));
    return absl::OkStatus();
  }
  if (sharded_index != nullptr) {
    const int64_t k =
        sharded_index->info.placement.dim + (bcast_rank - sharded_index->type->rank());
    const int64_t nd = adjacent ? indexed.front() + k : k;
    NodeInfo& info = a_.nodes_[id.value];
    info.detail = Detail::kFromArg;
    info.arg = 1;
    SetAllOut(id, Shard(static_cast<int32_t>(nd), sharded_index->info.outer, false));
    return absl::OkStatus();
  }
  SetCombined(id, Combined{}, s);
  return absl::OkStatus();
}

}  // namespace fxdp
