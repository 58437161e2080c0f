// Samples coupled across the batch: an op whose result for one sample reads every sample
// (a softmax over the batch dim, a product of two batch-sharded operands) reads batch-sharded
// operands all-gathered.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "analysis/batch_dim/analyzer.h"
#include "util/status_macros.h"

namespace fxdp {

using ir::Node;
using ir::NodeId;

// An op along the dim that holds the batch (CLIP's cross-entropy over logits.T: a softmax
// over the samples): every output row reads every sample, so each batch-sharded operand is
// all-gathered for this use (gathered_reads, expansion/gathered_reads.cc) and the op computes
// the whole value on every rank (R; P when a linear operand is partial). Its gradient comes
// out whole too, and each sharded use reads its rows of it (NeedShard: a slice, the backward
// of the all-gather). False when no operand holds the batch on `dim`.
absl::StatusOr<bool> BatchDimAnalyzer::GatherAlong(NodeId id, const Node& n, const OpRule& rule,
                                                   int64_t dim) {
  std::vector<Operand> ops = Operands(n);
  bool along = false;
  for (const Operand& o : ops) along |= o.info.placement.is_shard() && o.info.placement.dim == dim;
  if (!along) return false;
  // A mean-scaled operand on `dim` (a softmax over the batch below a mean-reduced loss) is
  // gathered unscaled: each rank's rows times B_r/B, the one device's values (true scale).
  std::vector<int> unscaled;
  for (Operand& o : ops) {
    if (o.info.placement.is_shard() && o.info.placement.dim == dim && o.info.mean_scaled) {
      o.info.mean_scaled = false;
      unscaled.push_back(o.arg);
    }
  }
  FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule.linear, ops));
  std::vector<std::string> names;
  for (const Operand& o : ops) {
    if (!o.info.placement.is_shard()) continue;
    const std::string name = g_.node(o.ref.node).name;
    if (o.info.placement.dim != dim) {
      return Error(n, absl::StrFormat("works along dim %d, which holds the batch of some operands, "
                                      "but arg %d (%s) holds it on dim %d",
                                      dim, o.arg, name, o.info.placement.dim));
    }
    const char* why = o.info.outer != 1   ? "the batch is folded inside the dim"
                      : o.info.order != 0 ? "its rows are in a rank-local order"
                      : o.elem >= 0       ? "it is a list element"
                                          : nullptr;
    if (why != nullptr) {
      return Error(n, absl::StrFormat("works along dim %d, which holds the batch; it needs the "
                                      "whole batch on every rank, and arg %d (%s) cannot be "
                                      "all-gathered for it: %s",
                                      dim, o.arg, name, why));
    }
    const bool unscale = std::count(unscaled.begin(), unscaled.end(), o.arg) > 0;
    a_.gathered_reads_.push_back(
        ShardedRead{o.ref, static_cast<int32_t>(dim), 1, id, o.arg, unscale});
    names.push_back(unscale ? absl::StrCat(name, " (mean-scaled: its rows times B_r/B first)")
                            : name);
  }
  a_.notes_.push_back(absl::StrFormat(
      "%s: all-gathers %s (batch dim %d) and works along it whole on every rank: samples "
      "coupled across the batch",
      n.name, absl::StrJoin(names, ", "), dim));
  SetCombined(id, Combined{}, s);
  a_.nodes_[id.value].detail = Detail::kGathered;
  return true;
}

// Operands holding the batch on two labels of the product (logits = a @ b.T, both batch-sharded;
// cdist(a, b) and its backward, whose gradient for x2 reads grad.T, x2, x1 and cdist.T): the
// operands of one label are all-gathered for this use (read replicated), as open_clip's
// gather_features, so the product keeps the other label's rows, or sums over them (partial)
// when the output lacks that label. Gathered: the label whose operands are fewer bytes (the
// later operand's on a tie: b in a @ b.T), and whose operands do not span the other label. The
// gradient of a gathered operand comes out partial over the whole batch and is all-reduced,
// then sliced to each rank's rows where it meets them (Linear, NeedShard): the backward of the
// all-gather.
absl::Status BatchDimAnalyzer::GatherCoupled(
    NodeId id, const Node& n, std::vector<Operand>& ops,
    const std::function<int(const Operand&, int64_t)>& label_of) {
  std::vector<int> labels;
  for (const Operand& o : ops) {
    if (!o.info.placement.is_shard()) continue;
    const int l = label_of(o, o.info.placement.dim);
    if (l < 0) return absl::OkStatus();  // Matmul names the rank mismatch
    if (std::find(labels.begin(), labels.end(), l) == labels.end()) labels.push_back(l);
  }
  if (labels.size() != 2) return absl::OkStatus();
  struct Group {
    bool ok = true;
    int64_t bytes = 0;
    int last_arg = -1;
  };
  auto group = [&](int gathered, int kept) {
    Group g;
    for (const Operand& o : ops) {
      if (!o.info.placement.is_shard() || label_of(o, o.info.placement.dim) != gathered) continue;
      bool spans = false;
      for (int64_t d = 0; d < o.type->rank(); ++d) spans |= label_of(o, d) == kept;
      g.ok &= !spans && o.info.outer == 1 && o.info.order == 0 && o.elem < 0;
      g.bytes += o.type->numel() * ir::DTypeItemSize(o.type->dtype);
      g.last_arg = std::max(g.last_arg, o.arg);
    }
    return g;
  };
  const Group g0 = group(labels[0], labels[1]), g1 = group(labels[1], labels[0]);
  if (!g0.ok && !g1.ok) return absl::OkStatus();  // Matmul names the conflict
  const bool second =
      !g0.ok ||
      (g1.ok && (g1.bytes < g0.bytes || (g1.bytes == g0.bytes && g1.last_arg > g0.last_arg)));
  const int gathered = labels[second ? 1 : 0];
  std::vector<std::string> names;
  for (Operand& o : ops) {
    if (!o.info.placement.is_shard() || label_of(o, o.info.placement.dim) != gathered) continue;
    // A mean-scaled operand (below a mean-reduced loss) is gathered at true scale: each rank's
    // rows times B_r/B first.
    a_.gathered_reads_.push_back(
        ShardedRead{o.ref, o.info.placement.dim, 1, id, o.arg, o.info.mean_scaled});
    names.push_back(absl::StrFormat(
        "%s (arg %d, its batch dim %d%s)", g_.node(o.ref.node).name, o.arg, o.info.placement.dim,
        o.info.mean_scaled ? "; mean-scaled: its rows times B_r/B first" : ""));
    o.info = kReplicated;
  }
  a_.notes_.push_back(
      absl::StrFormat("%s: all-gathers %s for the product: samples coupled across the batch",
                      n.name, absl::StrJoin(names, ", ")));
  return absl::OkStatus();
}

// index_add(self, dim, index, source): source's slices added into self at index along dim. With
// the batch on source's dim `dim` (index batch data, or a replicated index sliced to the rank's
// rows), each rank adds its samples into a fresh zero tensor: a partial sum over the batch (a
// segment sum). With the batch in self and source on another dim, it is per sample.
absl::Status BatchDimAnalyzer::IndexAdd(NodeId id, const Node& n, const OpRule& rule) {
  std::vector<Operand> ops = Operands(n);
  if (const Operand* p = PositionsOperand(ops, 2)) return AlignedRows(id, n, rule, ops, *p);
  FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule.linear, ops));
  const Operand* self = Find(ops, 0);
  const Operand* index = Find(ops, 2);
  const Operand* source = Find(ops, 3);
  if (self == nullptr || index == nullptr || source == nullptr) {
    return Error(n, "expects self, index and source tensors");
  }
  const int64_t dim =
      NormDim(IntArg(n, rule.param(ParamRole::kDim)).value_or(0), self->type->rank());
  const bool rows = source->info.placement.is_shard() && source->info.placement.dim == dim;
  if (!rows && index->info.placement.is_shard()) {
    return Error(
        n, absl::StrFormat("index (%s) holds the batch but source (%s) does not hold it "
                           "on dim %d, the dim it adds along",
                           g_.node(index->ref.node).name, g_.node(source->ref.node).name, dim));
  }
  if (!rows) {
    std::vector<Operand> batched{*self, *source};
    FXDP_ASSIGN_OR_RETURN(Combined c, Broadcast(id, n, batched, self->type->rank(), false));
    if (c.dim == dim) {
      return Error(n, absl::StrFormat("self (%s) holds the batch on dim %d, the dim index "
                                      "adds into; each rank holds only its own rows",
                                      g_.node(self->ref.node).name, dim));
    }
    SetCombined(id, c, s);
    return absl::OkStatus();
  }
  if (self->info.placement.is_shard() || !IsZeros(self->ref)) {
    return Error(
        n, absl::StrFormat("adds each rank's samples (source %s, dim %d) into %s, which is not a "
                           "fresh zero tensor: every rank would add it once; write "
                           "torch.zeros(...).index_add(...) + it",
                           g_.node(source->ref.node).name, dim, g_.node(self->ref.node).name));
  }
  if (index->info.placement.is_replicate()) NeedShard(*index, 0, source->info.outer, id);
  NodeInfo& info = a_.nodes_[id.value];
  info.detail = Detail::kReducedBatch;
  info.arg = 3;
  SetAllOut(id, Partial(false));
  return absl::OkStatus();
}

}  // namespace fxdp
