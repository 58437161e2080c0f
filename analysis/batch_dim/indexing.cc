// index, index_put and embedding.
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
  const Operand* g = Find(ops, 0);
  // grad_output is [*indices.shape, embedding_dim]: both hold the batch on
  // the same leading dim, so a replicated one is built sharded or sliced.
  Special s;
  FXDP_ASSIGN_OR_RETURN(std::optional<Combined> batch,
                        GradAndInputBatch(id, n, rule, ops, g ? g->type->rank() : 0, &s));
  if (!batch) return absl::OkStatus();
  if (BoolArg(n, rule.param(ParamRole::kScaleGradByFreq)).value_or(false)) {
    a_.notes_.push_back(absl::StrCat(n.name, ": scale_grad_by_freq counts token frequencies "
                                     "in each rank's local batch"));
  }
  NodeInfo& info = a_.nodes_[id.value];
  info.detail = Detail::kContracted;
  info.arg = 0;
  SetAllOut(id, Partial(s.scaled));
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
    if (rule == nullptr || (rule->family != OpFamily::kIndex && rule->family != OpFamily::kIndexPut)) {
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
int64_t BatchDimAnalyzer::BatchPositionsIndex(NodeId id, const Node& n, const std::vector<Operand>& ops,
                            const Argument::List& list, int64_t pos) {
  if (pos < 0 || pos >= static_cast<int64_t>(list.size()) || !IsBatchPositions(list[pos])) return -1;
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
  const bool adjacent = indexed.back() - indexed.front() + 1 == static_cast<int64_t>(indexed.size());
  return adjacent ? indexed.front() : 0;
}

// index_put(self, indices, values, accumulate): a parameter's gradient
// scattered into a zero table (no batch operand; partial values flow through
// a zero self); the backward of x[..., idx] with the batch in self and values
// on a dim that is not indexed; or the backward of x[arange(B), idx]
// (BatchPositionsIndex).
absl::Status BatchDimAnalyzer::IndexPut(NodeId id, const Node& n, const OpRule& rule) {
  std::vector<Operand> ops = Operands(n);
  if (const Operand* p = PositionsOperand(ops)) return IndexPutRows(id, n, rule, ops, *p);
  FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule.linear, ops));
  const Operand* self = Find(ops, 0);
  const Argument* idx = ArgOf(n, rule.param(ParamRole::kIndices));
  const Argument::List* list = idx ? idx->get_if<Argument::List>() : nullptr;
  if (self == nullptr || list == nullptr) return Error(n, "expects self and a list of indices");
  bool sharded = false;
  for (const Operand& o : ops) sharded |= o.info.placement.is_shard();
  // arange(B) indexes the batch only next to a batch-sharded self or index (a
  // same-sized arange over another dim is positions of that dim).
  int64_t pos = -1;
  for (size_t i = 0; i < list->size() && pos < 0; ++i) {
    if (!IsBatchPositions((*list)[i])) continue;
    bool batch = self->info.placement.is_shard() && self->info.placement.dim == static_cast<int32_t>(i);
    for (const Operand& o : ops) {
      batch |= o.arg == 1 && o.elem != static_cast<int>(i) && o.info.placement.is_shard();
    }
    if (batch) pos = static_cast<int64_t>(i);
  }
  if (!sharded && pos < 0) {
    SetCombined(id, Combined{}, s);
    return absl::OkStatus();
  }
  // The indexed result's layout (as Index): [self dims before the indexed ones, the
  // indices' broadcast dims, the rest]; non-adjacent indexed dims put the broadcast first.
  std::vector<int64_t> indexed;
  int64_t bcast_rank = 0;
  for (size_t i = 0; i < list->size(); ++i) {
    if ((*list)[i].is_none()) continue;
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
  const bool adjacent = indexed.back() - indexed.front() + 1 == static_cast<int64_t>(indexed.size());
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
    nd = BatchPositionsIndex(id, n, ops, *list, pos);
    d = pos;
    if (nd < 0) {
      return Error(n, "indexes the batch dim with arange(B) whose values are also used "
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
                                      "indices' broadcast dims of self", v->info.placement.dim));
    }
  }
  if (d < 0) return Error(n, "cannot place the batch of its operands in self");
  if (self->info.placement.is_shard() && self->info.placement.dim != d) {
    return Error(n, absl::StrFormat("self holds the batch on dim %d, the indexed rows need it "
                                    "on dim %d", self->info.placement.dim, d));
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
  NodeInfo& info = a_.nodes_[id.value];
  info.detail = Detail::kFromArg;
  info.arg = 0;
  SetAllOut(id, Shard(static_cast<int32_t>(d), 1, s.scaled));
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
  const bool adjacent =
      indexed.empty() || indexed.back() - indexed.front() + 1 == static_cast<int64_t>(indexed.size());
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
    const int64_t k = sharded_index->info.placement.dim +
                      (bcast_rank - sharded_index->type->rank());
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
