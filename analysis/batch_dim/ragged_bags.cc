// Bags of a flat input split by bags (a ragged input, issue 23): the text classification
// tutorial's _embedding_bag(weight, text, offsets) with `text` a flat 1-D INPUT without a batch
// dim (batch_dim=-1) and `offsets` an INPUT holding the batch (one per sample). Every splitter
// (server, workers, the Python oracle) gives each rank only its bags' elements of the text and its
// offsets rebased to them (ir::CutRagged; the expansion lists the pair under ir::kRaggedKey), so
// each rank computes its own bags: the output rows S(0), the table's gradient a partial sum,
// all-reduced as any gradient. Each rank's text, offsets and per-element outputs (offset2bag, and
// max mode's max_indices) then differ from one device's, so this holds only while nothing but the
// bags' own ops reads them (FindRaggedInputs); otherwise the text stays whole on every rank and
// the offsets are all-gathered (WholeInputBags), exact too.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "analysis/batch_dim/analyzer.h"
#include "analysis/ir/batch_split.h"
#include "util/status_macros.h"

namespace fxdp {

using ir::Argument;
using ir::Node;
using ir::NodeId;
using ir::ValueRef;

namespace {

// An argument of the bags' ops: its position and name (a kwarg).
struct Param {
  int32_t index;
  absl::string_view name;
};
// Where the bags' ops take the flat input, its offsets and per_sample_weights, and (backward)
// the forward's per-bag and per-element outputs (offset2bag, bag_size, maximum_indices).
struct BagOp {
  absl::string_view op;
  Param weight, indices, offsets, per_sample_weights, scale_grad_by_freq, include_last_offset;
  Param saved[3];  // backward only
};
constexpr BagOp kBagOps[] = {
    {"aten::_embedding_bag",
     {0, "weight"},
     {1, "indices"},
     {2, "offsets"},
     {6, "per_sample_weights"},
     {3, "scale_grad_by_freq"},
     {7, "include_last_offset"},
     {{-1, ""}, {-1, ""}, {-1, ""}}},
    {"aten::_embedding_bag_backward",
     {0, "grad"},
     {1, "indices"},
     {2, "offsets"},
     {10, "per_sample_weights"},
     {7, "scale_grad_by_freq"},
     {-1, ""},
     {{3, "offset2bag"}, {4, "bag_size"}, {5, "maximum_indices"}}},
};

const BagOp* FindBagOp(const Node& n) {
  if (!n.is_call()) return nullptr;
  for (const BagOp& op : kBagOps) {
    if (n.target.name == op.op) return &op;
  }
  return nullptr;
}

bool IsBackward(const BagOp& op) { return op.saved[0].index >= 0; }

const Argument* At(const Node& n, const Param& p) {
  if (p.index < 0) return nullptr;
  if (p.index < static_cast<int32_t>(n.args.size())) return &n.args[p.index];
  return n.kwarg(p.name);
}

const ValueRef* RefAt(const Node& n, const Param& p) {
  const Argument* a = At(n, p);
  return a != nullptr ? a->get_if<ValueRef>() : nullptr;
}

bool FalseOrAbsent(const Node& n, const Param& p) {
  const Argument* a = At(n, p);
  if (a == nullptr || a->is_none()) return true;
  const bool* b = a->get_if<bool>();
  return b != nullptr && !*b;
}

// `v` is `user`'s argument `p` and no other of its inputs.
bool OnlyAs(const Node& user, const Param& p, ValueRef v) {
  const ValueRef* r = RefAt(user, p);
  if (r == nullptr || !(*r == v)) return false;
  int seen = 0;
  user.ForEachInput([&](ValueRef x) { seen += x == v; });
  return seen == 1;
}

// A flat 1-D INPUT placeholder, with its batch on dim 0 (`batched`) or without one.
bool IsFlatInput(const ir::Graph& g, const ValueRef* r, bool batched) {
  if (r == nullptr || r->output != 0) return false;
  const Node& n = g.node(r->node);
  if (!n.is_placeholder() || n.placeholder.role != ir::PlaceholderRole::kInput) return false;
  if (n.outputs.empty() || !n.outputs[0].is_tensor() || n.outputs[0].tensor.rank() != 1)
    return false;
  return batched ? n.placeholder.batch_dim == 0 : n.placeholder.batch_dim < 0;
}

}  // namespace

// Whether `text` (with `offsets`, and `weights` when not null) is read only by bags' ops over
// these offsets, in those roles, and the forward's outputs past the first only by their
// backward: then each rank may hold its own bags' part of it.
bool BatchDimAnalyzer::OnlyBagsRead(const ir::UseMap& uses, ValueRef text, ValueRef offsets,
                                    const ValueRef* weights) const {
  auto only = [&](ValueRef v, Param BagOp::*role) {
    for (const ir::Use& u : uses[v.node.value][v.output]) {
      const Node& user = g_.node(u.user);
      const BagOp* op = FindBagOp(user);
      if (op == nullptr || !OnlyAs(user, op->*role, v)) return false;
      const ValueRef* t = RefAt(user, op->indices);
      const ValueRef* o = RefAt(user, op->offsets);
      const ValueRef* w = RefAt(user, op->per_sample_weights);
      if (t == nullptr || !(*t == text) || o == nullptr || !(*o == offsets)) return false;
      if ((w == nullptr) != (weights == nullptr) || (w != nullptr && !(*w == *weights)))
        return false;
      if (!FalseOrAbsent(user, op->scale_grad_by_freq) ||
          !FalseOrAbsent(user, op->include_last_offset))
        return false;
    }
    return true;
  };
  if (!only(text, &BagOp::indices) || !only(offsets, &BagOp::offsets)) return false;
  if (weights != nullptr && !only(*weights, &BagOp::per_sample_weights)) return false;
  // Each forward's outputs 1.. (through their getitems) are a backward's saved arguments.
  for (const ir::Use& u : uses[text.node.value][text.output]) {
    if (IsBackward(*FindBagOp(g_.node(u.user)))) continue;
    for (size_t k = 1; k < uses[u.user.value].size(); ++k) {
      for (const ir::Use& item : uses[u.user.value][k]) {
        if (!g_.node(item.user).is_getitem()) return false;
        const ValueRef got{item.user, 0};
        for (const ir::Use& b : uses[item.user.value][0]) {
          const Node& user = g_.node(b.user);
          const BagOp* op = FindBagOp(user);
          if (op == nullptr || !IsBackward(*op) || !OnlyAs(user, op->saved[k - 1], got))
            return false;
          const ValueRef* t = RefAt(user, op->indices);
          if (t == nullptr || !(*t == text)) return false;
        }
      }
    }
  }
  return true;
}

// Bytes each rank receives per step both ways for the bags over `text` (with `weights`), at
// world size N, summed over its forward ops (several tables may read one text): split, the ring
// all-reduce of each table's gradient (2 (N-1)/N of it; nothing when nothing trains the tables);
// whole, the (N-1)/N of the input (and weights) it reads beyond its own bags, and the others' rows
// of the offsets (once) and of each table's bags' gradient that it all-gathers.
BatchDimAnalyzer::BagBytes BatchDimAnalyzer::BagBytesOf(const ir::UseMap& uses, ValueRef text,
                                                        ValueRef offsets,
                                                        const ValueRef* weights) const {
  const int64_t n = options_.world_size;
  auto bytes = [&](const ValueRef* r) {
    const ir::TensorType* t = r != nullptr ? TypeOf(*r) : nullptr;
    return t == nullptr ? 0 : t->numel() * ir::DTypeItemSize(t->dtype);
  };
  bool trains = false;
  for (const ir::Use& u : uses[text.node.value][text.output])
    trains |= IsBackward(*FindBagOp(g_.node(u.user)));
  BagBytes b;
  int64_t gathered = 0;
  for (const ir::Use& u : uses[text.node.value][text.output]) {
    const Node& fwd = g_.node(u.user);
    if (IsBackward(*FindBagOp(fwd))) continue;
    const ir::TensorType* bags = OutType(fwd, 0);
    if (trains) b.split += 2 * (n - 1) * bytes(RefAt(fwd, kBagOps[0].weight)) / n;
    if (trains && bags != nullptr) gathered += bags->numel() * ir::DTypeItemSize(bags->dtype);
  }
  // One gather of the offsets serves every op reading them (gathered_reads: one per value).
  gathered += bytes(&offsets);
  b.whole = (n - 1) * (bytes(&text) + bytes(weights) + gathered) / n;
  return b;
}

// The note on the choice for `text`'s bags, the same on each of its forward ops.
std::string BatchDimAnalyzer::BagChoiceNote(ValueRef text, ValueRef offsets,
                                            const ValueRef* weights, const BagBytes& b) const {
  const bool split = b.split < b.whole;
  const std::string names = absl::StrCat(
      g_.node(text.node).name, weights ? absl::StrCat(" and ", g_.node(weights->node).name) : "");
  return absl::StrFormat(
      "%s %s: each rank %s (%d bytes per rank per step) rather than %s (%d bytes)", names,
      split ? absl::StrCat("split by the bags of ", g_.node(offsets.node).name, " (metadata ",
                           ir::kRaggedKey, ")")
            : "read whole by every rank",
      split ? absl::StrCat("reads only its bags' elements and its offsets rebased to them, "
                           "computes its own bags",
                           b.split > 0 ? ", and all-reduces the table's gradient" : "")
            : "reads every bag's elements and all-gathers the offsets and the bags' gradient rows",
      split ? b.split : b.whole,
      split ? "reading every bag's elements and all-gathering the offsets and the bags' gradient "
              "rows"
            : "splitting by bags and all-reducing the table's gradient",
      split ? b.whole : b.split);
}

// Before the passes: the flat inputs that can be split by bags (OnlyBagsRead), split where that
// moves fewer bytes per rank (BagBytesOf), one choice per input for all its bags' ops. Not with
// micro-batches (a rank's share of each micro-batch's bags), where the whole-input path stays.
void BatchDimAnalyzer::FindRaggedInputs() {
  if (a_.micro_batches_ > 1 || options_.world_size < 2) return;
  const ir::UseMap uses = ir::ComputeUses(g_);
  absl::flat_hash_set<int32_t> decided;
  for (int32_t i = 0; i < g_.size(); ++i) {
    const Node& n = g_.nodes()[i];
    const BagOp* op = FindBagOp(n);
    if (op == nullptr || IsBackward(*op)) continue;
    const ValueRef* text = RefAt(n, op->indices);
    const ValueRef* offsets = RefAt(n, op->offsets);
    const ValueRef* weights = RefAt(n, op->per_sample_weights);
    if (!IsFlatInput(g_, text, false) || !IsFlatInput(g_, offsets, true)) continue;
    if (weights != nullptr && !IsFlatInput(g_, weights, false)) continue;
    if (!decided.insert(text->node.value).second) continue;
    if (!OnlyBagsRead(uses, *text, *offsets, weights)) continue;
    const BagBytes b = BagBytesOf(uses, *text, *offsets, weights);
    const std::string note = BagChoiceNote(*text, *offsets, weights, b);
    for (const ir::Use& u : uses[text->node.value][text->output]) {
      const Node& user = g_.node(u.user);
      if (!IsBackward(*FindBagOp(user)))
        bag_notes_[u.user.value] = absl::StrCat(user.name, ": ", note);
    }
    if (b.split >= b.whole) continue;
    for (const ValueRef* in : {text, weights}) {
      if (in == nullptr || !ragged_.emplace(in->node.value, offsets->node.value).second) continue;
      a_.ragged_.emplace_back(in->node, offsets->node);
    }
  }
}

void BatchDimAnalyzer::NoteBagChoice(NodeId id) {
  auto it = bag_notes_.find(id.value);
  if (it != bag_notes_.end()) a_.notes_.push_back(it->second);
}

bool BatchDimAnalyzer::IsRagged(const Node& n) const {
  const BagOp* op = FindBagOp(n);
  const ValueRef* r = op != nullptr ? RefAt(n, op->indices) : nullptr;
  return r != nullptr && ragged_.count(r->node.value) > 0;
}

// _embedding_bag over a ragged input: the rank's own bags. Output 0 (the bags) and bag_size
// hold the batch on dim 0, as does max_indices where it is per bag; offset2bag (per element of
// the rank's part) stays unlabelled (R), read only by the backward.
void BatchDimAnalyzer::RaggedBags(NodeId id, const Node& n, const Special& s) {
  NoteBagChoice(id);
  NodeInfo& info = a_.nodes_[id.value];
  info.detail = Detail::kFromArg;
  info.arg = 2;
  for (int k = 0; k < static_cast<int>(n.outputs.size()); ++k) {
    const ir::TensorType* t = OutType(n, k);
    if (k == 1 || t == nullptr || t->rank() == 0 || t->shape[0] != a_.batch_size_) continue;
    SetOut(id, k, Shard(0, 1, k == 0 && s.scaled));
  }
}

// _embedding_bag_backward over a ragged input: each rank adds its bags' gradient rows into the
// table, a partial sum of one device's.
absl::Status BatchDimAnalyzer::RaggedBagsBackward(NodeId id, const Node& n, const OpRule& rule,
                                                  std::vector<Operand>& ops) {
  const Operand* g = Find(ops, 0);
  if (g == nullptr || !g->info.placement.is_shard() || g->info.placement.dim != 0 ||
      g->info.outer != 1 || g->info.order != 0) {
    return Error(n, absl::StrFormat("the bags' gradient (arg 0, %s) should hold the batch on dim "
                                    "0 like the bags of the ragged input, but is %s",
                                    g ? g_.node(g->ref.node).name : "?",
                                    g ? g->info.placement.ToString() : "absent"));
  }
  FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule.linear, ops));
  NodeInfo& info = a_.nodes_[id.value];
  info.detail = Detail::kContracted;
  info.arg = 0;
  SetAllOut(id, Partial(s.scaled));
  return absl::OkStatus();
}

}  // namespace fxdp
