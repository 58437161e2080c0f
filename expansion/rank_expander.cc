// The walk over the input graph that builds one rank's graph
// (expansion/rank_expander.h); FULLY_SHARD's additions are in
// fully_shard_emit.cc.
#include "expansion/rank_expander.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "analysis/ir/collectives.h"
#include "analysis/ir/instantiate.h"
#include "analysis/ir/node_error.h"
#include "analysis/op_queries.h"
#include "analysis/op_rules.h"
#include "expansion/random_layout.h"
#include "util/status_macros.h"

namespace fxdp {

using ir::Argument;
using ir::Node;
using ir::NodeId;
using ir::TensorType;
using ir::ValueRef;
using ir::ValueType;

absl::StatusOr<RankNodes> RankExpander::Run(std::vector<Collective>* collectives) {
  collectives_ = collectives;
  new_id_.assign(g_.size(), -1);
  out_.reserve(g_.size() + 4 * buckets_.size());
  // (node, bucket) pairs, sorted: where each bucket's wait and start go.
  std::vector<std::pair<int32_t, int32_t>> waits, starts;
  waits.reserve(buckets_.size());
  starts.reserve(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    waits.emplace_back(buckets_[b].wait, static_cast<int32_t>(b));
    starts.emplace_back(buckets_[b].start, static_cast<int32_t>(b));
  }
  std::sort(waits.begin(), waits.end());
  std::sort(starts.begin(), starts.end());
  size_t next_wait = 0, next_start = 0;
  for (const ShardedRead& r : a_.sharded_reads()) reads_[r.user.value].push_back(r);
  for (const ShardedRead& r : a_.gathered_reads()) gathered_[r.user.value].push_back(r);
  // Non-gradient reductions: all-reduced right after they are produced.
  for (const Reduction& r : a_.reductions()) {
    if (r.grad_of.empty()) solo_[r.value.node.value].push_back(r);
  }
  size_t next_gather = 0;
  std::vector<std::pair<int32_t, int32_t>> gathers;  // (position, event), sorted
  if (fs_ != nullptr) {
    for (size_t e = 0; e < fs_->gathers.size(); ++e)
      gathers.emplace_back(fs_->gathers[e].position, static_cast<int32_t>(e));
    std::stable_sort(gathers.begin(), gathers.end());
  }
  for (int32_t i = 0; i < g_.size(); ++i) {
    const Node& n = g_.nodes()[i];
    for (; next_gather < gathers.size() && gathers[next_gather].first <= i; ++next_gather) {
      FXDP_RETURN_IF_ERROR(EmitGatherWait(gathers[next_gather].second));
    }
    while (next_wait < waits.size() && waits[next_wait].first < i) ++next_wait;
    for (; next_wait < waits.size() && waits[next_wait].first == i; ++next_wait) {
      FXDP_RETURN_IF_ERROR(EmitWait(waits[next_wait].second));
    }
    if (n.is_output()) {
      FXDP_RETURN_IF_ERROR(EmitOutput(n));
      break;
    }
    FXDP_RETURN_IF_ERROR(EmitNode(NodeId{i}, n));
    if (auto it = solo_.find(i); it != solo_.end()) {
      for (const Reduction& r : it->second) FXDP_RETURN_IF_ERROR(EmitSolo(r));
    }
    while (next_start < starts.size() && starts[next_start].first < i) ++next_start;
    for (; next_start < starts.size() && starts[next_start].first == i; ++next_start) {
      FXDP_RETURN_IF_ERROR(EmitStart(starts[next_start].second));
    }
  }
  RankNodes r;
  r.header = g_.header();
  r.header.metadata.emplace_back("fxdp.world_size", absl::StrCat(o_.world_size));
  r.header.metadata.emplace_back("fxdp.local_batch", absl::StrCat(slice_.size));
  r.header.metadata.emplace_back(std::string(ir::kInputShapesKey),
                                 ir::InputShapesText(ir::InputShapesOf(g_)));
  // Micro-batches: the rows each rank holds are ir::RankRows(B, this, N, r), which the server
  // and the workers read from here (a key the input graph carried is not the analysis').
  auto& meta = r.header.metadata;
  // Ragged inputs likewise: each splitter cuts them at the rank's bags (ir::CutRagged).
  meta.erase(std::remove_if(meta.begin(), meta.end(),
                            [](const auto& kv) {
                              return kv.first == ir::kMicroBatchKey || kv.first == ir::kRaggedKey;
                            }),
             meta.end());
  if (a_.micro_batches() > 1) meta.emplace_back(ir::kMicroBatchKey, absl::StrCat(batch_));
  if (!a_.ragged().empty()) {
    ir::RaggedInputs ragged;
    for (const auto& [input, offsets] : a_.ragged())
      ragged.emplace_back(g_.node(input).placeholder.state_name,
                          g_.node(offsets).placeholder.state_name);
    meta.emplace_back(ir::kRaggedKey, ir::FormatRagged(ragged));
  }
  FXDP_RETURN_IF_ERROR(AddRandomLayouts(g_, a_, r.header));
  if (fs_ != nullptr) FullyShardMetadata(r.header);
  r.nodes = std::move(out_);
  return r;
}

// `base`, or base_1, base_2, ...: the first name neither the input graph
// nor an earlier Fresh() uses. Names are only ever added, so the first free
// suffix of a base never decreases: the probe resumes where the last one
// for the same base stopped.
bool RankExpander::Used(absl::string_view name) const {
  return fresh_names_.contains(name) || g_.FindNode(name).has_value();
}

std::string RankExpander::Fresh(absl::string_view base) {
  std::string name(base);
  if (Used(name)) {
    int& k = next_suffix_.try_emplace(name, 1).first->second;
    for (name = absl::StrCat(base, "_", k); Used(name); name = absl::StrCat(base, "_", k)) ++k;
  }
  fresh_names_.insert(name);
  return name;
}

TensorType RankExpander::Local(const TensorType& t, const ValueInfo& v) const {
  if (!v.placement.is_shard()) return t;
  TensorType l = t;
  const int32_t d = v.placement.dim;
  l.shape[d] = LocalExtent(t.shape[d]);
  if (t.IsContiguous()) {
    l.stride = ir::ContiguousStrides(l.shape);
  } else {
    // Same memory order, dense: innermost (smallest stride) first.
    std::vector<int> order(t.rank());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int x, int y) { return t.stride[x] > t.stride[y]; });
    int64_t running = 1;
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      if (t.stride[*it] == 0) {
        l.stride[*it] = 0;
        continue;
      }
      l.stride[*it] = running;
      running *= std::max<int64_t>(l.shape[*it], 1);
    }
  }
  // Views into a batch-sized base: the offset scales with the batch (approximate
  // for views of views; the executor never reads it).
  l.storage_offset = t.storage_offset / batch_ * slice_.size;
  return l;
}

ValueType RankExpander::LocalValue(ValueRef r) const {
  const ValueType& t = g_.type(r);
  if (!t.is_tensor()) return t;
  return ValueType::Tensor(Local(t.tensor, a_.value(r)));
}

ValueRef RankExpander::MapLocal(ValueRef r, const LocalRefs& local) const {
  if (!local.empty()) {
    if (auto it = local.find(r); it != local.end()) return it->second;
  }
  return Map(r);
}

// `a` with every reference mapped; `a` must hold one.
Argument RankExpander::Mapped(const Argument& a, const LocalRefs& local) const {
  if (const ValueRef* r = a.get_if<ValueRef>()) return Argument(MapLocal(*r, local));
  const Argument::List& src = a.as<Argument::List>();
  Argument::List l;
  l.reserve(src.size());
  for (const Argument& e : src) l.push_back(e.HasRef() ? Mapped(e, local) : e);
  return Argument(std::move(l));
}

void RankExpander::MapArgs(Argument& a, const LocalRefs& local) const {
  if (const ValueRef* r = a.get_if<ValueRef>()) {
    a = Argument(MapLocal(*r, local));
  } else if (a.is_list() && a.HasRef()) {
    a = Mapped(a, local);
  }
}

Node RankExpander::Call(absl::string_view base, absl::string_view target,
                        absl::string_view overload, std::vector<Argument> args, TensorType type) {
  Node n;
  n.name = Fresh(base);
  n.kind = ir::NodeKind::kCallFunction;
  n.target = ir::Target{std::string(target), std::string(overload)};
  n.args = std::move(args);
  n.outputs.push_back(ValueType::Tensor(std::move(type)));
  return n;
}

ValueRef RankExpander::AllReduceWeighted(ValueRef v, const TensorType& t, double w,
                                         const std::string& purpose, bool wait_now) {
  ValueRef x = v;
  if (w != 1.0) {
    x = Emit(Call("fxdp_scale", "aten::mul", "Scalar", {x, Argument(w)}, t));
  }
  Node ar = Call("fxdp_all_reduce", ir::kAllReduce, "",
                 {x, Argument(std::string("sum")), Argument(o_.group_name)}, t);
  const std::string name = ar.name;
  ValueRef r = Emit(std::move(ar));
  if (collectives_ != nullptr) {
    collectives_->push_back(Collective{name, purpose, Bytes(t), r.node.value});
  }
  if (!wait_now) return r;
  return Emit(Call("fxdp_wait", ir::kWaitTensor, "", {r}, t));
}

bool RankExpander::HasTensorInput(const Node& n) const {
  bool any = false;
  n.ForEachInput([&](ValueRef r) { any |= g_.type(r).is_tensor(); });
  return any;
}

// Under sync_batchnorm: rewrites a batch-norm node in training with a
// batch-sharded input (and forwards getitems of its outputs). Whether it did.
absl::StatusOr<bool> RankExpander::MaybeSyncBatchNorm(NodeId id, const Node& old) {
  if (old.is_getitem()) {
    const ValueRef src = old.args[0].as<ValueRef>();
    if (!sync_bn_outputs_.contains(src)) return false;
    // A copy first: operator[] may rehash and free what at() refers to
    // (heap-use-after-free under ASan).
    const ValueRef to = replaced_.at(src);
    replaced_[ValueRef{id, 0}] = to;
    // A parameter's gradient: FULLY_SHARD's bucket or per-rank slice, as in EmitNode.
    if (fs_ != nullptr) FXDP_RETURN_IF_ERROR(FullyShardAfter(id, old));
    return true;
  }
  const SyncBatchNormRole role = SyncBatchNormRoleOf(old);
  if (role == SyncBatchNormRole::kNone) return false;
  const int input_arg = role == SyncBatchNormRole::kForward ? 0 : 1;
  if (role == SyncBatchNormRole::kForward && a_.node(id).detail != Detail::kSyncStats) {
    return false;
  }
  if (input_arg >= static_cast<int>(old.args.size()) || !old.args[input_arg].is_ref()) return false;
  const ValueRef x = old.args[input_arg].as<ValueRef>();
  if (!a_.value(x).placement.is_shard()) return false;
  SyncBatchNormSite site;
  site.node = &old;
  if (role == SyncBatchNormRole::kBackward && !BatchNormBackwardTrains(old)) return false;
  // Replicated operands this node reads by rows are sliced, as in EmitNode.
  absl::flat_hash_map<ValueRef, ValueRef> local;
  if (auto it = reads_.find(id.value); it != reads_.end()) {
    for (const ShardedRead& r : it->second) {
      if (!local.contains(r.value)) local[r.value] = EmitRead(r);
    }
  }
  // FULLY_SHARD: the weight and bias are read gathered, as in EmitNode.
  if (fs_ != nullptr) FXDP_RETURN_IF_ERROR(FullyShardReads(id, old, local));
  bool dy_scaled = false;
  if (role == SyncBatchNormRole::kBackward) {
    const ValueRef* dy = old.args[0].get_if<ValueRef>();
    if (dy == nullptr || (!a_.value(*dy).placement.is_shard() && !local.contains(*dy))) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: sync_batchnorm: grad_output is not sharded on the batch", ir::NodeLabel(old)));
    }
    dy_scaled = !local.contains(*dy) && a_.value(*dy).mean_scaled;
  }
  const TensorType& global = g_.type(x).tensor;
  site.input = Local(global, a_.value(x));
  site.global_count =
      global.rank() >= 2 && global.shape[1] > 0 ? global.numel() / global.shape[1] : 0;
  if (role == SyncBatchNormRole::kBackward) {
    // See sync_batchnorm.h: dy scaled by B/B_r on an uneven split needs weights.
    const double n = static_cast<double>(site.global_count);
    if (dy_scaled && batch_ % o_.world_size != 0) {
      site.grad_weight = static_cast<double>(slice_.size) / static_cast<double>(batch_);
      site.grad_factor = static_cast<double>(batch_) / (static_cast<double>(slice_.size) * n);
    } else {
      site.grad_factor = 1.0 / n;
    }
  }
  site.args = old.args;
  for (Argument& a : site.args) MapArgs(a, local);
  for (int32_t k = 0; k < static_cast<int32_t>(old.outputs.size()); ++k) {
    site.outputs.push_back(LocalValue(ValueRef{id, k}));
  }
  FXDP_ASSIGN_OR_RETURN(std::vector<std::optional<ValueRef>> values,
                        EmitSyncBatchNorm(site, *this));
  for (int32_t k = 0; k < static_cast<int32_t>(values.size()); ++k) {
    if (!values[k].has_value()) continue;
    replaced_[ValueRef{id, k}] = *values[k];
    sync_bn_outputs_.insert(ValueRef{id, k});
  }
  return true;
}

absl::Status RankExpander::EmitNode(NodeId id, const Node& old) {
  if (o_.sync_batchnorm) {
    FXDP_ASSIGN_OR_RETURN(const bool rewritten, MaybeSyncBatchNorm(id, old));
    if (rewritten) return absl::OkStatus();
  }
  if (dd_ != nullptr && id == dd_->seed) {
    replaced_[ValueRef{id, 0}] = Map(dd_->ones);  // the backward starts from 1
    return absl::OkStatus();
  }
  Node n = old;
  // Sharded reads: slice the replicated operand's rows for this use.
  absl::flat_hash_map<ValueRef, ValueRef> local;
  if (auto it = reads_.find(id.value); it != reads_.end()) {
    for (const ShardedRead& r : it->second) {
      if (!local.contains(r.value)) local[r.value] = EmitRead(r);
    }
  }
  if (fs_ != nullptr) {
    if (FullyShardReplaces(id, old)) return absl::OkStatus();
    FXDP_RETURN_IF_ERROR(FullyShardReads(id, old, local));
    // The parameter is a shard here: the whole gradient is no longer of its type.
    n.grad_of.clear();
  }
  for (Argument& a : n.args) MapArgs(a, local);
  for (ir::KeywordArgument& k : n.kwargs) MapArgs(k.value, local);
  if (dd_ != nullptr) DeferredDivisionArgs(id, n);
  GatherArgs(id, n);
  for (int32_t k = 0; k < static_cast<int32_t>(n.outputs.size()); ++k) {
    // LocalValue() is the value itself unless it is a batch-sharded tensor.
    const ValueRef r{id, k};
    if (n.outputs[k].is_tensor() && a_.value(r).placement.is_shard()) n.outputs[k] = LocalValue(r);
  }
  if (fs_ != nullptr) FullyShardOutputs(id, n);
  FXDP_RETURN_IF_ERROR(LocalizeSizes(id, old, n));
  out_.push_back(std::move(n));
  new_id_[id.value] = static_cast<int32_t>(out_.size() - 1);
  if (fs_ != nullptr) return FullyShardAfter(id, old);
  return absl::OkStatus();
}

absl::Status RankExpander::LocalizeSizes(NodeId id, const Node& old, Node& n) {
  FXDP_RETURN_IF_ERROR(LocalizeSizeList(id, old, n));
  LocalizeSplitSize(old, n);
  return LocalizeBatchSizeArg(id, old, n);
}

absl::Status RankExpander::LocalizeSizeList(NodeId id, const Node& old, Node& n) {
  // Size lists that spell a sharded output's global shape.
  const ValueInfo& out_info = a_.primary(id);
  const OpRule* rule = FindOpRule(old.target);
  const int si = SizeArgIndex(old.target, rule);
  // as_strided_scatter's sizes spell its src's shape.
  const ValueRef* src =
      rule != nullptr && rule->family == OpFamily::kAsStridedScatter && old.args.size() > 1
          ? old.args[1].get_if<ValueRef>()
          : nullptr;
  const ValueInfo& v = src != nullptr ? a_.value(*src) : out_info;
  if (si >= 0 && v.placement.is_shard() && si < static_cast<int>(n.args.size()) &&
      n.args[si].is_list()) {
    Argument::List sizes = n.args[si].as<Argument::List>();
    const int32_t d = v.placement.dim;
    if (d < static_cast<int32_t>(sizes.size())) {
      if (const auto* x = sizes[d].get_if<int64_t>(); x != nullptr && *x != -1) {
        if (*x % batch_ != 0) {
          return absl::InvalidArgumentError(
              absl::StrFormat("%s: size %d of dim %d is not a multiple of the batch size %d",
                              ir::NodeLabel(old), *x, d, batch_));
        }
        sizes[d] = Argument(LocalExtent(*x));
      }
    }
    n.args[si] = Argument(std::move(sizes));
  } else if (out_info.placement.is_shard() && a_.node(id).decision == Decision::kShapedByUse &&
             rule != nullptr && rule->family == OpFamily::kFactory &&
             rule->param(ParamRole::kEnd) != nullptr) {
    // arange(B) indexing the batch rows (batch_dim.h): this rank's positions, arange(B_r).
    const int end = rule->param(ParamRole::kEnd)->index;
    if (end < static_cast<int>(n.args.size()) && n.args[end].get_if<int64_t>() != nullptr) {
      n.args[end] = Argument(LocalExtent(*n.args[end].get_if<int64_t>()));
    }
  } else if (out_info.placement.is_shard() && a_.node(id).decision == Decision::kShapedByUse &&
             si < 0 && !HasTensorInput(old)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s is built sharded for its use by %s, but the expansion does not know "
                        "how to build it locally",
                        ir::NodeLabel(old), g_.node(a_.node(id).shaped_by).name));
  }
  return absl::OkStatus();
}

void RankExpander::LocalizeSplitSize(const Node& old, Node& n) {
  const OpRule* rule = FindOpRule(old.target);
  // A micro-batch split of an input (batch_dim.h): the split size is the
  // micro-batch's, which becomes the rank's.
  if (a_.micro_batches() > 1 && !old.args.empty() && rule != nullptr &&
      rule->param(ParamRole::kSplitSize) != nullptr) {
    const ValueRef* in = old.args[0].get_if<ValueRef>();
    if (in != nullptr && g_.node(in->node).is_placeholder() && a_.value(*in).placement.is_shard() &&
        n.args.size() > 1) {
      if (const auto* x = n.args[1].get_if<int64_t>(); x != nullptr && *x == batch_) {
        n.args[1] = Argument(slice_.size);
      } else if (n.args[1].is_list()) {
        Argument::List sizes = n.args[1].as<Argument::List>();
        for (Argument& a : sizes) {
          if (const auto* y = a.get_if<int64_t>(); y != nullptr && *y == batch_)
            a = Argument(slice_.size);
        }
        n.args[1] = Argument(std::move(sizes));
      }
    }
  }
}

absl::Status RankExpander::LocalizeBatchSizeArg(NodeId id, const Node& old, Node& n) {
  const ValueInfo& out_info = a_.primary(id);
  const OpRule* rule = FindOpRule(old.target);
  // An int argument that spells the batch size (native_group_norm's N).
  if (const OpParam* bs = out_info.placement.is_shard() && rule != nullptr
                              ? rule->param(ParamRole::kBatchSize)
                              : nullptr;
      bs != nullptr && bs->index < static_cast<int>(n.args.size())) {
    if (const auto* x = n.args[bs->index].get_if<int64_t>()) {
      if (*x % batch_ != 0) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: argument %d '%s' (%d) should be a multiple of the batch size %d",
                            ir::NodeLabel(old), bs->index, bs->name, *x, batch_));
      }
      n.args[bs->index] = Argument(LocalExtent(*x));
    }
  }
  return absl::OkStatus();
}

// A sharded read: a replicated value's rows (a slice), or a mean-scaled shard at true scale.
ValueRef RankExpander::EmitRead(const ShardedRead& r) {
  if (!r.unscale) return EmitSlice(r);
  const double w = static_cast<double>(slice_.size) / static_cast<double>(batch_);
  TensorType t = LocalValue(r.value).tensor;
  t.stride = ir::ContiguousStrides(t.shape);
  t.storage_offset = 0;
  return Emit(Call(absl::StrCat("fxdp_unscale_", g_.node(r.value.node).name), "aten::mul", "Scalar",
                   {Map(r.value), Argument(w)}, t));
}

ValueRef RankExpander::EmitSlice(const ShardedRead& r) {
  const ValueRef src = Map(r.value);
  const TensorType& t = g_.type(r.value).tensor;
  TensorType local = t;
  local.shape[r.dim] = LocalExtent(t.shape[r.dim]);
  local.stride = ir::ContiguousStrides(local.shape);
  local.storage_offset = 0;
  const std::string base = absl::StrCat("fxdp_rows_", g_.node(r.value.node).name);
  if (r.outer == 1) {
    const int64_t inner = t.shape[r.dim] / batch_;
    TensorType s = t;
    s.shape[r.dim] = local.shape[r.dim];
    return Emit(Call(base, "aten::slice", "Tensor",
                     {src, Argument(int64_t{r.dim}), Argument(slice_.start * inner),
                      Argument((slice_.start + slice_.size) * inner), Argument(int64_t{1})},
                     s));
  }
  // [.., outer*B*inner, ..] -> [.., outer, B*inner, ..], slice, merge back.
  const int64_t inner = t.shape[r.dim] / (batch_ * r.outer);
  std::vector<int64_t> split = t.shape;
  split[r.dim] = batch_ * inner;
  split.insert(split.begin() + r.dim, r.outer);
  TensorType st = t;
  st.shape = split;
  st.stride = ir::ContiguousStrides(split);
  ValueRef v = Emit(Call(base, "aten::reshape", "", {src, Ints(split)}, st));
  std::vector<int64_t> sliced = split;
  sliced[r.dim + 1] = slice_.size * inner;
  TensorType sl = st;
  sl.shape = sliced;
  v = Emit(Call(base, "aten::slice", "Tensor",
                {v, Argument(int64_t{r.dim + 1}), Argument(slice_.start * inner),
                 Argument((slice_.start + slice_.size) * inner), Argument(int64_t{1})},
                sl));
  return Emit(Call(base, "aten::reshape", "", {v, Ints(local.shape)}, local));
}

absl::Status RankExpander::EmitSolo(const Reduction& r) {
  const TensorType& t = g_.type(r.value).tensor;
  replaced_[r.value] =
      AllReduce(Map(r.value), t, r.op, absl::StrCat("reduce ", g_.node(r.value.node).name), true);
  return absl::OkStatus();
}

void RankExpander::DeferredDivisionArgs(NodeId id, Node& n) const {
  if (id == dd_->ones_like && !n.args.empty()) n.args[0] = Argument(Map(dd_->total));
  for (const auto& [node, arg] : dd_->local_reads) {
    if (node != id || arg >= static_cast<int>(n.args.size())) continue;
    n.args[arg] = Argument(ValueRef{NodeId{new_id_[dd_->divisor.node.value]}, dd_->divisor.output});
  }
}

ValueRef RankExpander::DivideBucket(ValueRef waited, const TensorType& flat, size_t b) {
  if (dd_ == nullptr) return waited;
  return Emit(Call(absl::StrCat("fxdp_divide_bucket", b), "aten::div", "Tensor",
                   {waited, Map(dd_->divisor)}, flat));
}

ValueRef RankExpander::DeferredLoss(const TensorType& loss) {
  const ValueRef total =
      AllReduce(Map(dd_->total), g_.type(dd_->total).tensor, ReduceOp::kSum, "loss", true);
  return Emit(Call("fxdp_loss", "aten::div", "Tensor", {total, Map(dd_->divisor)}, loss));
}

absl::Status RankExpander::EmitStart(size_t b) {
  if (fs_ != nullptr) return EmitReduceScatter(b);
  const PlannedBucket& pb = buckets_[b];
  std::vector<Argument> flats;
  int64_t total = 0;
  const TensorType& first = g_.type(pb.values[0]).tensor;
  for (const ValueRef& v : pb.values) {
    const TensorType& t = g_.type(v).tensor;
    flats.emplace_back(Emit(Call(absl::StrCat("fxdp_flat_", g_.node(v.node).name), "aten::reshape",
                                 "", {Map(v), Ints({-1})}, Flat(t, t.numel()))));
    total += t.numel();
  }
  const TensorType flat = Flat(first, total);
  ValueRef packed = flats[0].as<ValueRef>();
  if (flats.size() > 1) {
    packed = Emit(Call(absl::StrCat("fxdp_bucket", b), "aten::cat", "",
                       {Argument(Argument::List(flats)), Argument(int64_t{0})}, flat));
  }
  started_[b] = AllReduce(packed, flat, pb.info.op, absl::StrCat("bucket ", b), false);
  return absl::OkStatus();
}

absl::Status RankExpander::EmitWait(size_t b) {
  const PlannedBucket& pb = buckets_[b];
  auto it = started_.find(b);
  if (it == started_.end()) {
    return absl::InternalError(absl::StrCat("bucket ", b, " waited on before it started"));
  }
  if (fs_ != nullptr) return EmitReduceScatterWait(b, it->second);
  int64_t total = 0;
  for (const ValueRef& v : pb.values) total += g_.type(v).tensor.numel();
  const TensorType flat = Flat(g_.type(pb.values[0]).tensor, total);
  ValueRef w = DivideBucket(
      Emit(Call(absl::StrCat("fxdp_wait_bucket", b), ir::kWaitTensor, "", {it->second}, flat)),
      flat, b);
  int64_t off = 0;
  for (const ValueRef& v : pb.values) {
    const TensorType& t = g_.type(v).tensor;
    const std::string base = absl::StrCat("fxdp_reduced_", g_.node(v.node).name);
    ValueRef s = w;
    if (pb.values.size() > 1) {
      s = Emit(Call(
          absl::StrCat("fxdp_unpack_", g_.node(v.node).name), "aten::slice", "Tensor",
          {w, Argument(int64_t{0}), Argument(off), Argument(off + t.numel()), Argument(int64_t{1})},
          Flat(t, t.numel())));
    }
    replaced_[v] = ViewAs(base, s, t);
    off += t.numel();
  }
  return absl::OkStatus();
}

absl::Status RankExpander::EmitOutput(const Node& old) {
  Node n = old;
  Argument::List list = n.args[0].as<Argument::List>();
  const Argument::List& orig = old.args[0].as<Argument::List>();
  ValueRef local_loss;
  bool have_loss = false;
  for (size_t k = 0; k < list.size(); ++k) {
    const bool loss = k < n.output_specs.size() && n.output_specs[k].role == ir::OutputRole::kLoss;
    const ValueRef* r = orig[k].get_if<ValueRef>();
    if (!loss || r == nullptr) {
      MapArgs(list[k], {});
      if (r != nullptr && k < n.output_specs.size() &&
          ir::UpdatedRole(n.output_specs[k].role).has_value() && a_.value(*r).rank_local) {
        // State computed from local batch statistics (batch-norm running
        // stats): every rank keeps the batch-weighted mean.
        list[k] =
            AllReduce(list[k].as<ValueRef>(), Local(g_.type(*r).tensor, a_.value(*r)),
                      ReduceOp::kAvg, absl::StrCat("sync ", n.output_specs[k].state_name), true);
      }
      continue;
    }
    local_loss = ValueRef{NodeId{new_id_[r->node.value]}, r->output};
    have_loss = true;
    const ValueInfo& v = a_.value(*r);
    if (replaced_.contains(*r)) {
      list[k] = replaced_[*r];
    } else if (dd_ != nullptr && *r == ValueRef{dd_->loss, 0}) {
      list[k] = DeferredLoss(g_.type(*r).tensor);
    } else if (v.placement.is_partial()) {
      list[k] = AllReduce(local_loss, g_.type(*r).tensor, v.placement.reduce, "loss", true);
    } else {
      list[k] = local_loss;
    }
  }
  if (have_loss) {
    list.emplace_back(local_loss);
    n.output_specs.push_back(ir::OutputSpec{ir::OutputRole::kOther, "local_loss"});
  }
  n.args[0] = Argument(std::move(list));
  out_.push_back(std::move(n));
  return absl::OkStatus();
}

}  // namespace fxdp
