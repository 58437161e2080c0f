// View ops (dim maps, view_rules.h) and as_strided.
#include "analysis/batch_dim/analyzer.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "analysis/ir/node_error.h"
#include "analysis/view_rules.h"
#include "util/status_macros.h"

namespace fxdp {

using ir::Argument;
using ir::Graph;
using ir::Node;
using ir::NodeId;
using ir::TensorType;
using ir::ValueRef;

// Where the batch (input dim `d`, outer/inner factors) ends up in the dim
// `spec` describes. `size` receives the spec's size.
BatchLoc BatchDimAnalyzer::Locate(const DimSpec& spec, const std::vector<int64_t>& in_shape,
                                  int64_t d, int64_t outer, int64_t inner, int64_t* size) const {
  const int64_t b = a_.batch_size_;
  switch (spec.kind()) {
    case DimSpec::Kind::kSingleton: *size = 1; return {};
    case DimSpec::Kind::kNewDim: *size = spec.size(); return {};
    case DimSpec::Kind::kInputDim:
      *size = in_shape[spec.input_dim()];
      if (spec.input_dim() == d) return {BatchLoc::kWhole, outer, inner};
      return {};
    case DimSpec::Kind::kBroadcast: {
      int64_t s = 0;
      BatchLoc l = Locate(spec.inputs()[0], in_shape, d, outer, inner, &s);
      *size = spec.size();
      if (l.kind == BatchLoc::kNone) return l;
      return b == 1 ? BatchLoc{} : BatchLoc{BatchLoc::kBroken};
    }
    case DimSpec::Kind::kRepeat: {
      int64_t s = 0;
      BatchLoc l = Locate(spec.inputs()[0], in_shape, d, outer, inner, &s);
      *size = s * spec.size();
      if (l.kind == BatchLoc::kNone) return l;
      return BatchLoc{BatchLoc::kBroken};
    }
    case DimSpec::Kind::kFlatten: {
      std::vector<int64_t> sizes;
      int found = -1;
      BatchLoc member;
      for (const DimSpec& m : spec.inputs()) {
        int64_t s = 0;
        BatchLoc l = Locate(m, in_shape, d, outer, inner, &s);
        if (l.kind == BatchLoc::kBroken) return l;
        if (l.kind == BatchLoc::kWhole) {
          found = static_cast<int>(sizes.size());
          member = l;
        }
        sizes.push_back(s);
      }
      int64_t total = 1;
      for (int64_t s : sizes) total *= s;
      *size = total;
      if (found < 0) return {};
      for (int i = 0; i < found; ++i) member.outer *= sizes[i];
      for (size_t i = found + 1; i < sizes.size(); ++i) member.inner *= sizes[i];
      return member;
    }
    case DimSpec::Kind::kSplit: {
      int64_t s = 0;
      BatchLoc l = Locate(spec.inputs()[0], in_shape, d, outer, inner, &s);
      const auto& group = spec.group_shape();
      const int64_t id = spec.split_id();
      *size = group[id];
      if (l.kind != BatchLoc::kWhole) return l;
      int64_t lo = 1;
      for (int64_t i = 0; i < id; ++i) lo *= group[i];
      const int64_t hi = lo * group[id];
      // The batch occupies radix span (outer, outer*B]; this piece (lo, hi].
      const int64_t blo = l.outer, bhi = l.outer * b;
      if (bhi <= lo || hi <= blo) return {};
      if (blo % lo == 0 && hi % bhi == 0) return {BatchLoc::kWhole, blo / lo, hi / bhi};
      return BatchLoc{BatchLoc::kBroken};
    }
  }
  return {};
}

absl::Status BatchDimAnalyzer::VisitView(NodeId id, const Node& n) {
  NodeInfo& info = a_.nodes_[id.value];
  info.decision = Decision::kView;
  const ValueRef* in = n.args.empty() ? nullptr : n.args[0].get_if<ValueRef>();
  const TensorType* it = in ? TypeOf(*in) : nullptr;
  if (it == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(ir::NodeLabel(n), ": arg 0 must be a tensor"));
  }
  const ValueInfo src = Read(*in);
  if (!src.placement.is_shard()) {
    // Views are linear: replicated stays replicated, partial stays partial.
    SetAllOut(id, src);
    info.detail = src.placement.is_partial() ? Detail::kPartialLinear : Detail::kNoBatch;
    return absl::OkStatus();
  }
  auto map = ComputeViewDimMap(n.target, it->shape, n.args, n.kwargs);
  if (!map.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(ir::NodeLabel(n), ": ", map.status().message()));
  }
  const int64_t d = src.placement.dim;
  const int64_t n_in = it->shape[d];
  const int64_t inner = n_in / (src.outer * a_.batch_size_);
  int found = -1;
  BatchLoc loc;
  for (size_t k = 0; k < map->size(); ++k) {
    int64_t size = 0;
    BatchLoc l = Locate((*map)[k], it->shape, d, src.outer, inner, &size);
    if (l.kind == BatchLoc::kBroken) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: the view %s splits or repeats the batch (size %d, in input dim %d "
          "of %s) across output dim %d; the batch cannot stay split over ranks",
          ir::NodeLabel(n), DimMapToString(*map), a_.batch_size_, d, it->ToString(), k));
    }
    if (l.kind == BatchLoc::kWhole && found < 0) {
      found = static_cast<int>(k);
      loc = l;
    }
  }
  if (found < 0) {
    if (a_.batch_size_ == 1) {
      SetAllOut(id, kReplicated);
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: the view %s drops the batch dim %d of %s", ir::NodeLabel(n),
                        DimMapToString(*map), d, it->ToString()));
  }
  info.detail = Detail::kFromArg;
  info.arg = 0;
  SetAllOut(id, Shard(found, loc.outer, src.mean_scaled));
  return absl::OkStatus();
}

// The number of storage elements one sample spans in a tensor whose batch
// is dim `d` (outer 1): stride[d] * size[d] / B, when every other dim stays
// inside one sample (the batch is the outermost dim in memory); else -1.
int64_t BatchDimAnalyzer::SampleSpan(const std::vector<int64_t>& size,
                                     const std::vector<int64_t>& stride, int64_t offset,
                                     int64_t d) const {
  const int64_t b = a_.batch_size_;
  if (d < 0 || d >= static_cast<int64_t>(size.size()) || size.size() != stride.size() ||
      size[d] % b != 0) {
    return -1;
  }
  const int64_t per = size[d] / b;
  const int64_t span = stride[d] * per;
  int64_t reach = offset + stride[d] * (per - 1);
  for (size_t j = 0; j < size.size(); ++j) {
    if (static_cast<int64_t>(j) != d && size[j] > 1) reach += stride[j] * (size[j] - 1);
  }
  return span > 0 && reach < span ? span : -1;
}

// The dim of a view (size, stride, offset) that steps over samples of
// `span` elements, or -1.
int64_t BatchDimAnalyzer::ViewBatchDim(const std::vector<int64_t>& size,
                                       const std::vector<int64_t>& stride, int64_t offset,
                                       int64_t span) const {
  for (size_t k = 0; k < size.size(); ++k) {
    if (SampleSpan(size, stride, offset, static_cast<int64_t>(k)) == span) {
      return static_cast<int64_t>(k);
    }
  }
  return -1;
}

// as_strided(self, size, stride, offset) and as_strided_scatter(self, src,
// size, stride, offset) over a storage that holds whole samples one after
// another: the view's batch dim is the one whose stride steps over samples.
absl::Status BatchDimAnalyzer::AsStrided(NodeId id, const Node& n, const OpRule& rule) {
  std::vector<Operand> ops = Operands(n);
  FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule.linear, ops));
  const bool scatter = rule.family == OpFamily::kAsStridedScatter;
  const Operand* self = Find(ops, 0);
  const Operand* src = scatter ? Find(ops, 1) : nullptr;
  if (self == nullptr || (scatter && src == nullptr)) return Error(n, "expects tensor operands");
  const bool sharded = self->info.placement.is_shard() || (src && src->info.placement.is_shard());
  if (!sharded) {
    SetCombined(id, Combined{}, s);
    return absl::OkStatus();
  }
  auto size = DimsArg(n, rule.param(ParamRole::kSizes));
  auto stride = DimsArg(n, rule.param(ParamRole::kStride));
  const int64_t offset =
      IntArg(n, rule.param(ParamRole::kStorageOffset)).value_or(self->type->storage_offset);
  if (!size || !stride || size->size() != stride->size()) {
    return Error(n, "expects int lists for size and stride");
  }
  const TensorType& st = *self->type;
  int64_t span = -1;
  if (self->info.placement.is_shard()) {
    if (self->info.outer != 1) return Error(n, "the batch is folded inside a dim of its input");
    span = SampleSpan(st.shape, st.stride, st.storage_offset, self->info.placement.dim);
    if (span < 0) {
      return Error(n, absl::StrFormat("its input %s does not store the batch (dim %d) "
                                      "outermost; its storage cannot be split by samples",
                                      st.ToString(), self->info.placement.dim));
    }
  } else {
    span = SampleSpan(*size, *stride, offset, src->info.placement.dim);
  }
  const int64_t k = span < 0 ? -1 : ViewBatchDim(*size, *stride, offset, span);
  if (k < 0) {
    return Error(
        n, absl::StrFormat("the view (size [%s], stride [%s], offset %d) mixes "
                           "samples of %d elements: it cannot be split by samples",
                           absl::StrJoin(*size, ", "), absl::StrJoin(*stride, ", "), offset, span));
  }
  if (!scatter) {
    NodeInfo& info = a_.nodes_[id.value];
    info.detail = Detail::kFromArg;
    info.arg = 0;
    SetAllOut(id, Shard(static_cast<int32_t>(k), 1, s.scaled));
    return absl::OkStatus();
  }
  // The view must carry src's batch on k; self's storage the same samples.
  if (src->info.placement.is_shard() && src->info.placement.dim != k) {
    return Error(n, absl::StrFormat("src holds the batch on dim %d, the view on dim %d",
                                    src->info.placement.dim, k));
  }
  if (src->info.placement.is_replicate()) NeedShard(*src, static_cast<int32_t>(k), 1, id);
  int64_t d = self->info.placement.is_shard() ? self->info.placement.dim : -1;
  if (d < 0) {
    for (int64_t j = 0; j < st.rank() && d < 0; ++j) {
      if (SampleSpan(st.shape, st.stride, st.storage_offset, j) == span) d = j;
    }
    if (d < 0) {
      return Error(n, absl::StrFormat("self %s has no dim that steps over samples of %d "
                                      "elements",
                                      st.ToString(), span));
    }
    NeedShard(*self, static_cast<int32_t>(d), 1, id);
  }
  NodeInfo& info = a_.nodes_[id.value];
  info.detail = Detail::kFromArg;
  info.arg = self->info.placement.is_shard() ? 0 : 1;
  SetAllOut(id, Shard(static_cast<int32_t>(d), 1, s.scaled));
  return absl::OkStatus();
}

}  // namespace fxdp
