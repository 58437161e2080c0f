// Pointwise and shape-preserving families, like, foreach, and the size-matching fallback.
#include "analysis/batch_dim/analyzer.h"

#include "analysis/deferred_division.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "analysis/view_rules.h"
#include "util/status_macros.h"

namespace fxdp {

using ir::Argument;
using ir::Graph;
using ir::Node;
using ir::NodeId;
using ir::TensorType;
using ir::ValueRef;

// Broadcasting combination: every sharded operand must put the batch on the
// same output dim; replicated operands spanning that dim are sharded too.
absl::StatusOr<BatchDimAnalyzer::Combined> BatchDimAnalyzer::Broadcast(
    NodeId id, const Node& n, const std::vector<Operand>& ops, int64_t out_rank, bool broadcast) {
  Combined c;
  for (const Operand& o : ops) {
    if (!o.info.placement.is_shard()) continue;
    const int32_t d =
        o.info.placement.dim + (broadcast ? static_cast<int32_t>(out_rank - o.type->rank()) : 0);
    if (c.dim < 0) {
      c = {d, o.info.outer, o.arg};
    } else if (c.dim != d || c.outer != o.info.outer) {
      return Error(n,
                   absl::StrFormat(
                       "operands put the batch on different dims: arg %d (%s) on output dim %d, "
                       "arg %d (%s) on output dim %d",
                       c.arg, OperandName(ops, c.arg), c.dim, o.arg, g_.node(o.ref.node).name, d));
    }
  }
  if (c.dim >= 0) {
    for (const Operand& o : ops) {
      if (!o.info.placement.is_replicate()) continue;
      const int32_t d = c.dim - (broadcast ? static_cast<int32_t>(out_rank - o.type->rank()) : 0);
      if (d >= 0 && d < o.type->rank()) NeedShard(o, d, c.outer, id);
    }
  }
  return c;
}

// Sets every tensor output from a combination.
void BatchDimAnalyzer::SetCombined(NodeId id, const Combined& c, const Special& s) {
  NodeInfo& info = a_.nodes_[id.value];
  if (c.dim >= 0) {
    info.detail = Detail::kFromArg;
    info.arg = static_cast<int8_t>(std::min(c.arg, 127));
    SetAllOut(id, Shard(c.dim, c.outer, s.scaled));
  } else if (s.partial) {
    info.detail = Detail::kPartialLinear;
    SetAllOut(id, Partial(s.scaled));
  } else {
    info.detail = Detail::kNoBatch;
    SetAllOut(id, kReplicated);
  }
}

absl::Status BatchDimAnalyzer::Pointwise(NodeId id, const Node& n, const OpRule& rule,
                                         int64_t out_rank, bool broadcast) {
  std::vector<Operand> ops = Operands(n);
  const LinearIn linear = LinearOf(n, rule);
  FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, linear, ops));
  FXDP_ASSIGN_OR_RETURN(Combined c, Broadcast(id, n, ops, out_rank, broadcast));
  if (c.dim >= 0 && s.partial) {
    return Error(n, "combines a partial value with a batch-sharded one");
  }
  SetCombined(id, c, s);
  return absl::OkStatus();
}

// *_like(self), fill, zero: self's shape and batch, no data read.
absl::Status BatchDimAnalyzer::Like(NodeId id, const Node& n, const OpRule& rule) {
  NodeInfo& info = a_.nodes_[id.value];
  std::vector<Operand> ops = Operands(n);
  const Operand* self = ops.empty() ? nullptr : &ops[0];
  if (self != nullptr && self->info.placement.is_shard()) {
    info.detail = Detail::kFromArg;
    info.arg = 0;
    SetAllOut(id, Shard(self->info.placement.dim, self->info.outer, false));
  } else {
    info.detail = Detail::kNoBatch;
  }
  return absl::OkStatus();
}

// Along a dim (softmax, cumsum, sort), over the last dims (triu), over
// listed dims (flip, roll), padding the last dims: pointwise in the batch
// unless the op works on the dim that holds it.
absl::Status BatchDimAnalyzer::ShapePreserving(NodeId id, const Node& n, const OpRule& rule) {
  const TensorType* out = OutType(n);
  const int64_t out_rank = out ? out->rank() : 0;
  if (rule.family == OpFamily::kAlongDim && !rule.has(kSortsRows)) {
    const int64_t dim = NormDim(IntArg(n, rule.param(ParamRole::kDim)).value_or(-1), out_rank);
    FXDP_ASSIGN_OR_RETURN(const bool gathered, GatherAlong(id, n, rule, dim));
    if (gathered) return absl::OkStatus();
  }
  FXDP_RETURN_IF_ERROR(Pointwise(id, n, rule, out_rank, /*broadcast=*/false));
  const ValueInfo& v = a_.values_[a_.value_offset_[id.value]];
  if (!v.placement.is_shard()) return absl::OkStatus();
  const int64_t d = v.placement.dim;
  if (rule.family == OpFamily::kAlongDim) {
    const int64_t dim = NormDim(IntArg(n, rule.param(ParamRole::kDim)).value_or(-1), out_rank);
    if (dim == d && rule.has(kSortsRows)) return SortRows(id, n, rule, static_cast<int32_t>(d));
    if (dim == d) {
      return Error(n, absl::StrFormat("works along dim %d, which holds the batch; it "
                                      "needs the whole batch on every rank",
                                      dim));
    }
  } else if (rule.family == OpFamily::kLastDims || rule.family == OpFamily::kPad) {
    int64_t last = 0;
    if (rule.family == OpFamily::kPad) {
      auto pad = DimsArg(n, rule.param(ParamRole::kPad));
      last = pad ? static_cast<int64_t>(pad->size() / 2) : 0;
    } else if (const OpParam* p = rule.param(ParamRole::kLastDims)) {
      last = p->value;
    }
    if (d >= out_rank - last) {
      return Error(n, absl::StrFormat("works on the last %d dims, which include the batch "
                                      "dim %d",
                                      last, d));
    }
  } else {
    auto dims = DimsArg(n, rule.param(ParamRole::kDims)).value_or(std::vector<int64_t>{});
    for (int64_t x : dims) {
      if (NormDim(x, out_rank) == d) {
        return Error(n, absl::StrFormat("works on dim %d, which holds the batch", d));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status BatchDimAnalyzer::Foreach(NodeId id, const Node& n, const OpRule& rule) {
  std::vector<Operand> ops = Operands(n);
  const int n_out = static_cast<int>(n.outputs.size());
  NodeInfo& info = a_.nodes_[id.value];
  info.detail = Detail::kNoBatch;
  for (int k = 0; k < n_out; ++k) {
    if (!n.outputs[k].is_tensor()) continue;
    std::vector<Operand> elem;
    for (const Operand& o : ops) {
      if (o.elem < 0 || o.elem == k) elem.push_back(o);
    }
    FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule.linear, elem));
    FXDP_ASSIGN_OR_RETURN(Combined c, Broadcast(id, n, elem, n.outputs[k].tensor.rank()));
    if (c.dim >= 0) {
      info.detail = Detail::kFromArg;
      SetOut(id, k, Shard(c.dim, c.outer, s.scaled));
    } else if (s.partial) {
      SetOut(id, k, Partial(s.scaled));
    }
  }
  return absl::OkStatus();
}

// Never guess on the compile path: size matching places a [B, B] value, a
// histogram over the batch or a size argument that spells the batch wrongly,
// and the job trains silently wrong or fails on the workers.
absl::Status BatchDimAnalyzer::RefuseUnruledOps() const {
  const Node* first = nullptr;
  std::vector<std::string> ops;  // each op once, in graph order
  for (const Node& n : g_.nodes()) {
    if (!n.is_call() || n.is_getitem() || IsViewOp(n.target) || FindOpRule(n.target) != nullptr) {
      continue;
    }
    const std::string op = TargetString(n);
    if (first == nullptr) first = &n;
    if (std::find(ops.begin(), ops.end(), op) == ops.end()) ops.push_back(op);
  }
  if (first == nullptr) return absl::OkStatus();
  std::string others;
  if (ops.size() > 1) {
    others = absl::StrCat(" (nor do ", absl::StrJoin(ops.begin() + 1, ops.end(), ", "), ")");
  }
  return Error(*first,
               absl::StrFormat(
                   "no batch-dim rule for %s%s: the compile step does not guess where the batch "
                   "goes (matching "
                   "tensor sizes can train a different model without a word); add a row for it to "
                   "analysis/op_rules.cc, e.g. {\"%s\", \"*\", F::kPointwise, kNotLinear, {}} with "
                   "the family, "
                   "linearity and parameters that say how the op treats the batch, and its line in "
                   "tests/testdata/op_rules.txt (docs/DEVELOPMENT.md, \"The op-rule table\"); "
                   "`fxdp analyze` "
                   "shows the size-matching guess",
                   ops[0], others, first->target.name));
}

absl::Status BatchDimAnalyzer::VisitFallback(NodeId id, const Node& n) {
  NodeInfo& info = a_.nodes_[id.value];
  info.decision = Decision::kFallback;
  std::vector<Operand> ops = Operands(n);
  int64_t batch_extent = -1;
  int64_t outer = 1;
  bool partial = false, avg = false;
  for (const Operand& o : ops) {
    if (o.info.placement.is_partial()) {
      partial = true;
      avg |= o.info.mean_scaled;
    }
    if (o.info.placement.is_shard() && batch_extent < 0) {
      batch_extent = o.type->shape[o.info.placement.dim];
      outer = o.info.outer;
      info.arg = static_cast<int8_t>(std::min(o.arg, 127));
    }
  }
  for (const Operand& o : ops) {
    if (o.info.placement.is_partial()) RequireWhole(o.ref, id);
  }
  (void)partial;
  (void)avg;
  std::string what = "replicated (no operand carries the batch)";
  for (size_t k = 0; k < n.outputs.size(); ++k) {
    if (!n.outputs[k].is_tensor() || batch_extent < 0) continue;
    const auto& shape = n.outputs[k].tensor.shape;
    auto it = std::find(shape.begin(), shape.end(), batch_extent);
    if (it != shape.end()) {
      SetOut(id, static_cast<int>(k),
             Shard(static_cast<int32_t>(it - shape.begin()), outer, false));
      what = absl::StrFormat("batch dim matched by size %d", batch_extent);
    }
  }
  auto [entry, inserted] = fallback_ops_.try_emplace(TargetString(n), 0, id, what);
  if (inserted) fallback_order_.push_back(entry->first);
  ++std::get<0>(entry->second);
  return absl::OkStatus();
}

}  // namespace fxdp
