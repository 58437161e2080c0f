// cat, stack, split, slice, select, and scattering into a slice.
#include "analysis/batch_dim/analyzer.h"

#include <algorithm>
#include <cstdint>
#include <limits>
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

absl::Status BatchDimAnalyzer::CatStack(NodeId id, const Node& n, const OpRule& rule) {
  std::vector<Operand> ops = Operands(n);
  FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule.linear, ops));
  const TensorType* out = OutType(n);
  const int64_t out_rank = out ? out->rank() : 0;
  const bool stack = rule.family == OpFamily::kStack;
  const int64_t dim = NormDim(IntArg(n, rule.param(ParamRole::kDim)).value_or(0), out_rank);
  // Operands of a stack gain the new dim `dim`.
  std::vector<Operand> moved = ops;
  Combined c;
  const Operand* first = nullptr;
  for (Operand& o : moved) {
    if (!o.info.placement.is_shard()) continue;
    int32_t d = o.info.placement.dim;
    if (stack && d >= dim) ++d;
    if (!stack && o.type->rank() == 1 && o.type->shape[0] == 0) continue;
    if (c.dim < 0) {
      c = {d, o.info.outer, o.arg};
      first = &o;
    } else if (c.dim != d || c.outer != o.info.outer) {
      return Error(
          n, absl::StrFormat(
                 "operands hold the batch on different dims: tensor %d (%s) on dim %d (%d blocks), "
                 "tensor %d (%s) on dim %d (%d blocks)",
                 first->elem, g_.node(first->ref.node).name, first->info.placement.dim, c.outer,
                 o.elem, g_.node(o.ref.node).name, o.info.placement.dim, o.info.outer));
    }
  }
  if (c.dim >= 0) {
    if (!stack && c.dim == dim) {
      return Error(n, absl::StrFormat("concatenates along dim %d, which holds the batch; the "
                                      "result's rows would interleave across ranks",
                                      dim));
    }
    for (const Operand& o : ops) {
      if (!o.info.placement.is_replicate()) continue;
      // cat skips 1-D empty tensors (a legacy empty cache): nothing to shard.
      if (!stack && o.type->rank() == 1 && o.type->shape[0] == 0) continue;
      const int32_t d = stack && c.dim > dim ? c.dim - 1 : c.dim;
      if (d < o.type->rank()) NeedShard(o, d, c.outer, id);
    }
  }
  SetCombined(id, c, s);
  return absl::OkStatus();
}

absl::Status BatchDimAnalyzer::DimOp(NodeId id, const Node& n, const OpRule& rule) {
  std::vector<Operand> ops = Operands(n);
  if (rule.family == OpFamily::kIndexWithDim &&
      !rule.has(kAligned)) {  // index_select(x, dim, positions)
    if (const Operand* p = PositionsOperand(ops, 2)) return IndexRows(id, n, rule, ops, *p);
  }
  if (rule.family == OpFamily::kIndexWithDim && rule.has(kAligned)) {  // gather(x, dim, positions)
    if (const Operand* p = PositionsOperand(ops, 2)) return AlignedRows(id, n, rule, ops, *p);
  }
  FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule.linear, ops));
  const Operand* self = Find(ops, 0);
  if (self == nullptr) return Error(n, "arg 0 must be a tensor");
  const OpParam* dim_arg = rule.param(ParamRole::kDim);
  const Operand* index = Find(ops, 2);
  if (!rule.has(kAligned) && index != nullptr && index->info.placement.is_shard() &&
      !self->info.placement.is_shard()) {
    // index_select(x, dim, ids) with ids batch data (the backward of index_add over samples):
    // each sample's slice of the whole x.
    if (self->info.placement.is_partial()) RequireWhole(self->ref, id);
    NodeInfo& info = a_.nodes_[id.value];
    info.detail = Detail::kFromArg;
    info.arg = 2;
    SetAllOut(
        id, Shard(static_cast<int32_t>(NormDim(IntArg(n, dim_arg).value_or(0), self->type->rank())),
                  index->info.outer, false));
    return absl::OkStatus();
  }
  if (rule.has(kAligned)) {
    // gather / scatter: every tensor operand has self's rank.
    FXDP_ASSIGN_OR_RETURN(Combined c, Broadcast(id, n, ops, self->type->rank(), false));
    if (c.dim >= 0 && c.dim == NormDim(IntArg(n, dim_arg).value_or(0), self->type->rank())) {
      return Error(n, absl::StrFormat("indexes along dim %d, which holds the batch", c.dim));
    }
    SetCombined(id, c, s);
    return absl::OkStatus();
  }
  for (const Operand& o : ops) {
    if (o.arg != 0 && o.info.placement.is_shard()) {
      return Error(n, absl::StrFormat("arg %d (%s) is sharded on the batch; only arg 0 may be",
                                      o.arg, g_.node(o.ref.node).name));
    }
  }
  if (!self->info.placement.is_shard()) {
    SetCombined(id, Combined{}, s);
    return absl::OkStatus();
  }
  const int64_t in_rank = self->type->rank();
  const TensorType* out = OutType(n);
  const int64_t out_rank = out ? out->rank() : in_rank;
  // select_backward / slice_backward work in the output's coordinates.
  const int64_t dim_rank = rule.family == OpFamily::kSliceBackward ? out_rank : in_rank;
  const int64_t dim = NormDim(IntArg(n, dim_arg).value_or(0), dim_rank);
  FXDP_ASSIGN_OR_RETURN(const int32_t nd, ShardedDimAfter(n, rule, *self, dim));
  NodeInfo& info = a_.nodes_[id.value];
  info.detail = Detail::kFromArg;
  info.arg = 0;
  SetAllOut(id, Shard(nd, self->info.outer, s.scaled));
  return absl::OkStatus();
}

// Whether a slice/narrow takes all of a dim of `size`.
bool BatchDimAnalyzer::SliceTakesAll(const Node& n, const OpRule& rule, int64_t size) {
  if (const OpParam* length = rule.param(ParamRole::kLength)) {  // narrow(self, dim, start, length)
    return IntArg(n, rule.param(ParamRole::kStart)).value_or(-1) == 0 &&
           IntArg(n, length).value_or(-1) == size;
  }
  const int64_t start = IntArg(n, rule.param(ParamRole::kStart)).value_or(0);
  const int64_t end =
      IntArg(n, rule.param(ParamRole::kEnd)).value_or(std::numeric_limits<int64_t>::max());
  const int64_t step = IntArg(n, rule.param(ParamRole::kStep)).value_or(1);
  return start == 0 && end >= size && step == 1;
}

// A split along the batch dim that is not one of micro-batches (FindMicroBatches): micro-batches of
// unequal sizes (x.chunk(k) of a batch k does not divide) would each need their own batch size in
// the expansion, which sizes every sharded value by one B; refused, with what to do.
absl::Status BatchDimAnalyzer::SplitAlongBatchError(const Node& n, const Operand& self,
                                                    int32_t d) const {
  const int64_t rows = self.type->shape[d];
  const int64_t piece = EqualSplitSize(n, d, self.type->rank());
  if (self.ref.node.value >= 0 && g_.node(self.ref.node).is_placeholder() && piece > 0 &&
      piece < rows && rows % piece != 0) {
    const int64_t k = (rows + piece - 1) / piece;
    return Error(n, absl::StrFormat("splits the batch of %d samples along dim %d into "
                                    "micro-batches of %d rows, the last of %d: micro-batches of "
                                    "unequal sizes cannot be split over ranks exactly (each would "
                                    "need its own batch size); make the batch a multiple of the "
                                    "micro-batch count (pad it to %d samples, or drop the partial "
                                    "last batch: DataLoader(..., drop_last=True))",
                                    rows, d, piece, rows - (k - 1) * piece, k * piece));
  }
  return Error(n, absl::StrFormat("splits along dim %d, which holds the batch", d));
}

absl::StatusOr<int32_t> BatchDimAnalyzer::ShardedDimAfter(const Node& n, const OpRule& rule,
                                                          const Operand& self, int64_t dim) const {
  const bool drops_dim = rule.has(kDropsDim);
  const int64_t in_rank = self.type->rank();
  const int32_t d = self.info.placement.dim;
  int32_t nd = d;
  switch (rule.family) {
    case OpFamily::kSplit:
      if (dim == d && a_.micro_batches_ > 1 && self.ref.node.value >= 0 &&
          g_.node(self.ref.node).is_placeholder() && !drops_dim) {
        break;  // a micro-batch of an input (FindMicroBatches): it holds the batch on dim d
      }
      if (dim == d && !drops_dim && EqualSplitSize(n, dim, in_rank) >= self.type->shape[d]) {
        break;  // one piece, the whole value (x.chunk(1)): an identity
      }
      if (dim == d) return SplitAlongBatchError(n, self, d);
      if (drops_dim && d > dim) --nd;
      break;
    case OpFamily::kSelect:
      if (dim == d) {
        return Error(n, absl::StrFormat("selects one entry of dim %d, which holds the batch; "
                                        "it lives on one rank only",
                                        d));
      }
      if (d > dim) --nd;
      break;
    case OpFamily::kIndexWithDim:
      if (dim == d) {
        return Error(n, absl::StrFormat("indexes along dim %d, which holds the batch", d));
      }
      break;
    case OpFamily::kSlice: {
      if (dim != d) break;
      const bool full = SliceTakesAll(n, rule, self.type->shape[d]);
      if (!full) {
        return Error(n, absl::StrFormat("takes part of dim %d, which holds the batch; a "
                                        "slice of the batch is not a slice of each rank's part",
                                        d));
      }
      break;
    }
    case OpFamily::kSliceBackward: {
      if (drops_dim) {  // select_backward: the selected dim is re-inserted.
        if (d >= dim) ++nd;
      } else if (dim == d) {
        return Error(n, absl::StrFormat("scatters a slice into dim %d, which holds the batch", d));
      }
      break;
    }
    default: break;
  }
  return nd;
}

// slice_scatter / select_scatter: self and src hold the batch on the same
// dim (src's is one lower past a selected dim); it must not be the scattered dim.
absl::Status BatchDimAnalyzer::ScatterInto(NodeId id, const Node& n, const OpRule& rule) {
  std::vector<Operand> ops = Operands(n);
  FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule.linear, ops));
  const Operand* self = Find(ops, 0);
  const Operand* src = Find(ops, 1);
  if (self == nullptr || src == nullptr) return Error(n, "args 0 and 1 must be tensors");
  const int64_t rank = self->type->rank();
  const int64_t dim = NormDim(IntArg(n, rule.param(ParamRole::kDim)).value_or(0), rank);
  const bool dropped = rule.has(kDropsDim);
  // src dim -> self dim, and back.
  auto to_self = [&](int32_t d) { return dropped && d >= dim ? d + 1 : d; };
  auto to_src = [&](int32_t d) { return dropped && d > dim ? d - 1 : d; };
  Combined c;
  if (self->info.placement.is_shard()) c = {self->info.placement.dim, self->info.outer, 0};
  if (src->info.placement.is_shard()) {
    const int32_t d = to_self(src->info.placement.dim);
    if (c.dim >= 0 && (c.dim != d || c.outer != src->info.outer)) {
      return Error(n, absl::StrFormat("self holds the batch on dim %d, src on dim %d (dim %d "
                                      "of self)",
                                      c.dim, src->info.placement.dim, d));
    }
    if (c.dim < 0) c = {d, src->info.outer, 1};
  }
  if (c.dim < 0) {
    SetCombined(id, c, s);
    return absl::OkStatus();
  }
  if (c.dim == dim) {
    return Error(n, absl::StrFormat("scatters into dim %d, which holds the batch", dim));
  }
  if (self->info.placement.is_replicate()) NeedShard(*self, c.dim, c.outer, id);
  if (src->info.placement.is_replicate()) NeedShard(*src, to_src(c.dim), c.outer, id);
  SetCombined(id, c, s);
  return absl::OkStatus();
}

}  // namespace fxdp
