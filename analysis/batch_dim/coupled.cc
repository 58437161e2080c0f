// Samples coupled across the batch: an op whose result for one sample reads every sample
// (a softmax over the batch dim) reads its batch-sharded operands all-gathered.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
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
    if (o.info.mean_scaled) {
      return ScaledError(id, n, o,
                         "all-gathering it for an op along the batch dim would mix "
                         "the ranks' scales");
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
    a_.gathered_reads_.push_back(ShardedRead{o.ref, static_cast<int32_t>(dim), 1, id, o.arg});
    names.push_back(name);
  }
  a_.notes_.push_back(absl::StrFormat(
      "%s: all-gathers %s (batch dim %d) and works along it whole on every rank: samples "
      "coupled across the batch",
      n.name, absl::StrJoin(names, ", "), dim));
  SetCombined(id, Combined{}, s);
  a_.nodes_[id.value].detail = Detail::kGathered;
  return true;
}

}  // namespace fxdp
