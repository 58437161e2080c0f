#include "expansion/data_parallel.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "analysis/ir/collectives.h"
#include "analysis/ir/node_error.h"
#include "analysis/op_rules.h"
#include "expansion/fully_shard.h"
#include "expansion/schedule.h"
#include "expansion/shape_check.h"
#include "expansion/sharding.h"
#include "expansion/sync_batchnorm.h"
#include "util/status_macros.h"

namespace fxdp {

using ir::Argument;
using ir::Graph;
using ir::Node;
using ir::NodeId;
using ir::TensorType;
using ir::ValueRef;
using ir::ValueType;

absl::string_view DataParallelStyleName(DataParallelStyle s) {
  return s == DataParallelStyle::kFullyShard ? "fully_shard" : "replicate";
}

absl::StatusOr<DataParallelStyle> ParseDataParallelStyle(absl::string_view s) {
  const std::string l = absl::AsciiStrToLower(s);
  if (l == "replicate") return DataParallelStyle::kReplicate;
  if (l == "fully_shard" || l == "full_shard") return DataParallelStyle::kFullyShard;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown data-parallel style '", s, "': expected 'replicate' or 'fully_shard'"));
}

namespace {

// Whether every reference is to an output of an earlier node.
bool RefsPointBackwards(const std::vector<Node>& nodes) {
  bool ok = true;
  for (int32_t i = 0; i < static_cast<int32_t>(nodes.size()) && ok; ++i) {
    nodes[i].ForEachInput([&](ValueRef r) {
      ok = ok && r.node.value >= 0 && r.node.value < i && r.output >= 0 &&
           r.output < static_cast<int32_t>(nodes[r.node.value].outputs.size());
    });
  }
  return ok;
}

// A rank's expanded nodes, not yet verified as a graph.
struct RankNodes {
  ir::GraphHeader header;
  std::vector<Node> nodes;
};

// A planned all-reduce of gradients (rank independent).
struct PlannedBucket {
  Bucket info;
  std::vector<ValueRef> values;  // global graph refs, production order.
  std::vector<int32_t> produced, first_use;  // per value: producer, first use.
  int32_t start = 0;             // all-reduce after this node.
  int32_t wait = 0;              // wait before this node.
};

int64_t Bytes(const TensorType& t) { return t.numel() * ir::DTypeItemSize(t.dtype); }

class Expander final : public RankGraphBuilder {
 public:
  Expander(const Graph& g, const BatchDimAnalysis& a, const ExpandOptions& o,
           const std::vector<PlannedBucket>& buckets, RankSlice slice,
           const FullyShardPlan* fs = nullptr)
      : g_(g), a_(a), o_(o), buckets_(buckets), slice_(slice), batch_(a.batch_size()), fs_(fs) {
    for (const PlannedBucket& b : buckets_) bucketed_.insert(b.values.begin(), b.values.end());
  }

  absl::StatusOr<RankNodes> Run(std::vector<Collective>* collectives) {
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
    if (fs_ != nullptr) {
      // fxdp-worker run reads these to slice and reassemble state files.
      r.header.metadata.emplace_back("fxdp.style", "fully_shard");
      std::vector<std::string> names;
      for (const ShardedState& s : fs_->sharded_state) names.push_back(s.state_name);
      r.header.metadata.emplace_back("fxdp.sharded_state", absl::StrJoin(names, "\n"));
    }
    r.nodes = std::move(out_);
    return r;
  }

 private:
  // ---- names, types, refs ------------------------------------------------------

  // `base`, or base_1, base_2, ...: the first name neither the input graph
  // nor an earlier Fresh() uses. Names are only ever added, so the first free
  // suffix of a base never decreases: the probe resumes where the last one
  // for the same base stopped.
  bool Used(absl::string_view name) const {
    return fresh_names_.contains(name) || g_.FindNode(name).has_value();
  }
  std::string Fresh(absl::string_view base) {
    std::string name(base);
    if (Used(name)) {
      int& k = next_suffix_.try_emplace(name, 1).first->second;
      for (name = absl::StrCat(base, "_", k); Used(name); name = absl::StrCat(base, "_", k)) ++k;
    }
    fresh_names_.insert(name);
    return name;
  }

  int64_t LocalExtent(int64_t global) const { return global / batch_ * slice_.size; }

  TensorType Local(const TensorType& t, const ValueInfo& v) const {
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

  ValueType LocalValue(ValueRef r) const {
    const ValueType& t = g_.type(r);
    if (!t.is_tensor()) return t;
    return ValueType::Tensor(Local(t.tensor, a_.value(r)));
  }

  ValueRef Map(ValueRef old) const {
    if (auto it = replaced_.find(old); it != replaced_.end()) return it->second;
    return ValueRef{NodeId{new_id_[old.node.value]}, old.output};
  }

  ValueRef MapLocal(ValueRef r, const absl::flat_hash_map<ValueRef, ValueRef>& local) const {
    if (!local.empty()) {
      if (auto it = local.find(r); it != local.end()) return it->second;
    }
    return Map(r);
  }

  // `a` with every reference mapped; `a` must hold one.
  Argument Mapped(const Argument& a, const absl::flat_hash_map<ValueRef, ValueRef>& local) const {
    if (const ValueRef* r = a.get_if<ValueRef>()) return Argument(MapLocal(*r, local));
    const Argument::List& src = a.as<Argument::List>();
    Argument::List l;
    l.reserve(src.size());
    for (const Argument& e : src) l.push_back(e.HasRef() ? Mapped(e, local) : e);
    return Argument(std::move(l));
  }

  void MapArgs(Argument& a, const absl::flat_hash_map<ValueRef, ValueRef>& local) const {
    if (const ValueRef* r = a.get_if<ValueRef>()) {
      a = Argument(MapLocal(*r, local));
    } else if (a.is_list() && a.HasRef()) {
      a = Mapped(a, local);
    }
  }

  ValueRef Emit(Node n) {
    out_.push_back(std::move(n));
    return ValueRef{NodeId{static_cast<int32_t>(out_.size() - 1)}, 0};
  }

  Node Call(absl::string_view base, absl::string_view target, absl::string_view overload,
            std::vector<Argument> args, TensorType type) {
    Node n;
    n.name = Fresh(base);
    n.kind = ir::NodeKind::kCallFunction;
    n.target = ir::Target{std::string(target), std::string(overload)};
    n.args = std::move(args);
    n.outputs.push_back(ValueType::Tensor(std::move(type)));
    return n;
  }

  static TensorType Flat(const TensorType& t, int64_t numel) {
    TensorType f = t;
    f.shape = {numel};
    f.stride = {1};
    f.storage_offset = 0;
    f.requires_grad = false;
    return f;
  }

  static Argument Ints(const std::vector<int64_t>& v) {
    Argument::List l;
    for (int64_t x : v) l.emplace_back(x);
    return l;
  }

  double Weight(ReduceOp op) const {
    return op == ReduceOp::kAvg ? static_cast<double>(slice_.size) / static_cast<double>(batch_)
                                : 1.0;
  }

  // scale (if needed) + all_reduce(sum) + wait on a 1-D or any tensor value.
  ValueRef AllReduce(ValueRef v, const TensorType& t, ReduceOp op, const std::string& purpose,
                     bool wait_now) {
    return AllReduceWeighted(v, t, Weight(op), purpose, wait_now);
  }

  ValueRef AllReduceWeighted(ValueRef v, const TensorType& t, double w, const std::string& purpose,
                             bool wait_now) {
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

  // ---- RankGraphBuilder (sync_batchnorm.h) ------------------------------------------

  ValueRef Add(absl::string_view base, absl::string_view target, absl::string_view overload,
               std::vector<Argument> args, TensorType type) override {
    return Emit(Call(base, target, overload, std::move(args), std::move(type)));
  }
  ValueRef AllReduceSum(ValueRef v, const TensorType& t, double weight,
                        const std::string& purpose) override {
    return AllReduceWeighted(v, t, weight, purpose, true);
  }

  // ---- emission -------------------------------------------------------------------

  // Under sync_batchnorm: rewrites a batch-norm node in training with a
  // batch-sharded input (and forwards getitems of its outputs). Whether it did.
  absl::StatusOr<bool> MaybeSyncBatchNorm(NodeId id, const Node& old) {
    if (old.is_getitem()) {
      const ValueRef src = old.args[0].as<ValueRef>();
      if (!sync_bn_outputs_.contains(src)) return false;
      // A copy first: operator[] may rehash and free what at() refers to
      // (heap-use-after-free under ASan).
      const ValueRef to = replaced_.at(src);
      replaced_[ValueRef{id, 0}] = to;
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
        if (!local.contains(r.value)) local[r.value] = EmitSlice(r);
      }
    }
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
    site.global_count = global.rank() >= 2 && global.shape[1] > 0 ? global.numel() / global.shape[1] : 0;
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
    FXDP_ASSIGN_OR_RETURN(std::vector<std::optional<ValueRef>> values, EmitSyncBatchNorm(site, *this));
    for (int32_t k = 0; k < static_cast<int32_t>(values.size()); ++k) {
      if (!values[k].has_value()) continue;
      replaced_[ValueRef{id, k}] = *values[k];
      sync_bn_outputs_.insert(ValueRef{id, k});
    }
    return true;
  }

  absl::Status EmitNode(NodeId id, const Node& old) {
    if (o_.sync_batchnorm) {
      FXDP_ASSIGN_OR_RETURN(const bool rewritten, MaybeSyncBatchNorm(id, old));
      if (rewritten) return absl::OkStatus();
    }
    Node n = old;
    // Sharded reads: slice the replicated operand's rows for this use.
    absl::flat_hash_map<ValueRef, ValueRef> local;
    if (auto it = reads_.find(id.value); it != reads_.end()) {
      for (const ShardedRead& r : it->second) {
        if (!local.contains(r.value)) local[r.value] = EmitSlice(r);
      }
    }
    if (fs_ != nullptr && fs_->alias[id.value]) {
      // A view of a shard in the optimizer: the shard itself (fully_shard.h).
      replaced_[ValueRef{id, 0}] = Map(old.args[0].as<ValueRef>());
      return absl::OkStatus();
    }
    if (fs_ != nullptr && old.is_getitem() && old.args[0].is_ref()) {
      // An element of a norm of shards: the whole tensors' norm (EmitPartialNorm).
      if (auto it = norms_.find(old.args[0].as<ValueRef>()); it != norms_.end()) {
        replaced_[ValueRef{id, 0}] = it->second;
        return absl::OkStatus();
      }
    }
    if (fs_ != nullptr) {
      FXDP_RETURN_IF_ERROR(FullyShardReads(id, old, local));
      // The parameter is a shard here: the whole gradient is no longer of its type.
      n.grad_of.clear();
    }
    for (Argument& a : n.args) MapArgs(a, local);
    for (ir::KeywordArgument& k : n.kwargs) MapArgs(k.value, local);
    for (int32_t k = 0; k < static_cast<int32_t>(n.outputs.size()); ++k) {
      // LocalValue() is the value itself unless it is a batch-sharded tensor.
      const ValueRef r{id, k};
      if (n.outputs[k].is_tensor() && a_.value(r).placement.is_shard()) n.outputs[k] = LocalValue(r);
    }
    if (fs_ != nullptr && n.is_placeholder() && fs_->sharded.contains(id.value)) {
      // Sharded state: this rank's flat shard.
      const bool rg = n.outputs[0].tensor.requires_grad;
      n.outputs[0] = ValueType::Tensor(
          Flat(n.outputs[0].tensor, fs_->sharded.at(id.value).shard_numel));
      n.outputs[0].tensor.requires_grad = rg;
    } else if (fs_ != nullptr && !fs_->out_shards[id.value].empty()) {
      // Optimizer math on shards: elementwise, so each such output is [s].
      const std::vector<int64_t>& full = fs_->out_shards[id.value];
      for (size_t k = 0; k < n.outputs.size() && k < full.size(); ++k) {
        if (n.outputs[k].is_tensor() && full[k] >= 0) {
          n.outputs[k] = ValueType::Tensor(Flat(n.outputs[k].tensor, ShardNumel(full[k])));
        }
      }
    }
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
            return absl::InvalidArgumentError(absl::StrFormat(
                "%s: size %d of dim %d is not a multiple of the batch size %d",
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
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s is built sharded for its use by %s, but the expansion does not know "
          "how to build it locally",
          ir::NodeLabel(old), g_.node(a_.node(id).shaped_by).name));
    }
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
            if (const auto* y = a.get_if<int64_t>(); y != nullptr && *y == batch_) a = Argument(slice_.size);
          }
          n.args[1] = Argument(std::move(sizes));
        }
      }
    }
    // An int argument that spells the batch size (native_group_norm's N).
    if (const OpParam* bs = out_info.placement.is_shard() && rule != nullptr
                                ? rule->param(ParamRole::kBatchSize)
                                : nullptr;
        bs != nullptr && bs->index < static_cast<int>(n.args.size())) {
      if (const auto* x = n.args[bs->index].get_if<int64_t>()) {
        if (*x % batch_ != 0) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "%s: argument %d '%s' (%d) should be a multiple of the batch size %d",
              ir::NodeLabel(old), bs->index, bs->name, *x, batch_));
        }
        n.args[bs->index] = Argument(LocalExtent(*x));
      }
    }
    out_.push_back(std::move(n));
    new_id_[id.value] = static_cast<int32_t>(out_.size() - 1);
    if (fs_ != nullptr && fs_->partial_norm[id.value]) return EmitPartialNorm(id, old);
    if (fs_ != nullptr && !old.grad_of.empty() && !bucketed_.contains(ValueRef{id, 0}) &&
        old.outputs[0].is_tensor()) {
      // A gradient the analysis already has whole on every rank (reduced
      // earlier, or never batch-dependent): this rank's shard is a slice.
      const TensorType& t = old.outputs[0].tensor;
      const int64_t world = o_.world_size, s = ShardNumel(t.numel());
      const std::string base = absl::StrCat("fxdp_grad_shard_", old.name);
      ValueRef x = Emit(Call(base, "aten::reshape", "", {Map(ValueRef{id, 0}), Ints({-1})},
                             Flat(t, t.numel())));
      if (world * s != t.numel()) {
        x = Emit(Call(base, "aten::constant_pad_nd", "",
                      {x, Ints({0, world * s - t.numel()}), Argument(0.0)}, Flat(t, world * s)));
      }
      TensorType piece = Flat(t, s);
      piece.storage_offset = slice_.rank * s;
      replaced_[ValueRef{id, 0}] =
          Emit(Call(base, "aten::slice", "Tensor",
                    {x, Argument(int64_t{0}), Argument(slice_.rank * s),
                     Argument((slice_.rank + 1) * s), Argument(int64_t{1})},
                    piece));
    }
    return absl::OkStatus();
  }

  // The norms this rank took of its shards -> the whole tensors' 2-norms:
  // sqrt(all_reduce(sum of squares)), one all-reduce for all of a node's norms.
  absl::Status EmitPartialNorm(NodeId id, const Node& old) {
    const ValueRef local{NodeId{new_id_[id.value]}, 0};
    const bool foreach = old.outputs.size() > 1 || old.target.name == "aten::_foreach_norm";
    const TensorType& t = old.outputs[0].tensor;
    const std::string base = absl::StrCat("fxdp_norm_", old.name);
    const int64_t k = static_cast<int64_t>(old.outputs.size());
    ValueRef v = local;
    TensorType vec = Flat(t, k);
    if (foreach) {
      Argument::List items;
      for (int64_t j = 0; j < k; ++j) {
        Node gi;
        gi.name = Fresh(base);
        gi.kind = ir::NodeKind::kCallFunction;
        gi.target = ir::Target{std::string(ir::kGetItem), ""};
        gi.args = {Argument(ValueRef{local.node, static_cast<int32_t>(j)}), Argument(j)};
        gi.outputs.push_back(old.outputs[j]);
        items.emplace_back(Emit(std::move(gi)));
      }
      v = Emit(Call(base, "aten::stack", "", {Argument(std::move(items))}, vec));
    }
    const TensorType& vt = foreach ? vec : t;
    ValueRef sq = Emit(Call(base, "aten::mul", "Tensor", {v, v}, vt));
    ValueRef sum = AllReduceWeighted(sq, vt, 1.0, absl::StrCat("norm ", old.name), true);
    ValueRef norm = Emit(Call(base, "aten::sqrt", "", {sum}, vt));
    if (!foreach) {
      replaced_[ValueRef{id, 0}] = norm;
      return absl::OkStatus();
    }
    for (int64_t j = 0; j < k; ++j) {
      norms_[ValueRef{id, static_cast<int32_t>(j)}] =
          Emit(Call(base, "aten::select", "int", {norm, Argument(int64_t{0}), Argument(j)},
                    old.outputs[j].tensor));
    }
    return absl::OkStatus();
  }

  bool HasTensorInput(const Node& n) const {
    bool any = false;
    n.ForEachInput([&](ValueRef r) { any |= g_.type(r).is_tensor(); });
    return any;
  }

  ValueRef EmitSlice(const ShardedRead& r) {
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

  absl::Status EmitSolo(const Reduction& r) {
    const TensorType& t = g_.type(r.value).tensor;
    replaced_[r.value] = AllReduce(Map(r.value), t, r.op,
                                   absl::StrCat("reduce ", g_.node(r.value.node).name), true);
    return absl::OkStatus();
  }

  absl::Status EmitStart(size_t b) {
    if (fs_ != nullptr) return EmitReduceScatter(b);
    const PlannedBucket& pb = buckets_[b];
    std::vector<Argument> flats;
    int64_t total = 0;
    const TensorType& first = g_.type(pb.values[0]).tensor;
    for (const ValueRef& v : pb.values) {
      const TensorType& t = g_.type(v).tensor;
      flats.emplace_back(Emit(Call(absl::StrCat("fxdp_flat_", g_.node(v.node).name),
                                   "aten::reshape", "", {Map(v), Ints({-1})}, Flat(t, t.numel()))));
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

  absl::Status EmitWait(size_t b) {
    const PlannedBucket& pb = buckets_[b];
    auto it = started_.find(b);
    if (it == started_.end()) {
      return absl::InternalError(absl::StrCat("bucket ", b, " waited on before it started"));
    }
    if (fs_ != nullptr) return EmitReduceScatterWait(b, it->second);
    int64_t total = 0;
    for (const ValueRef& v : pb.values) total += g_.type(v).tensor.numel();
    const TensorType flat = Flat(g_.type(pb.values[0]).tensor, total);
    ValueRef w = Emit(Call(absl::StrCat("fxdp_wait_bucket", b), ir::kWaitTensor,
                           "", {it->second}, flat));
    int64_t off = 0;
    for (const ValueRef& v : pb.values) {
      const TensorType& t = g_.type(v).tensor;
      const std::string base = absl::StrCat("fxdp_reduced_", g_.node(v.node).name);
      ValueRef s = w;
      if (pb.values.size() > 1) {
        s = Emit(Call(absl::StrCat("fxdp_unpack_", g_.node(v.node).name), "aten::slice", "Tensor",
                      {w, Argument(int64_t{0}), Argument(off), Argument(off + t.numel()),
                       Argument(int64_t{1})},
                      Flat(t, t.numel())));
      }
      TensorType shaped = t;
      shaped.stride = ir::ContiguousStrides(t.shape);
      shaped.storage_offset = 0;
      shaped.requires_grad = false;
      replaced_[v] = Emit(Call(base, "aten::view", "", {s, Ints(t.shape)}, shaped));
      off += t.numel();
    }
    return absl::OkStatus();
  }

  // ---- FULLY_SHARD (expansion/fully_shard.h) ---------------------------------------

  int64_t ShardNumel(int64_t numel) const {
    return FlatShardOf(numel, o_.world_size, 0).shard_numel;
  }

  ValueRef Collect(Node n, const std::string& purpose, int64_t bytes) {
    const std::string name = n.name;
    ValueRef r = Emit(std::move(n));
    if (collectives_ != nullptr) collectives_->push_back(Collective{name, purpose, bytes, r.node.value});
    return r;
  }

  // Forward reads gathered parameters; backward its own gather and its own
  // copies of parameter-derived forward values.
  absl::Status FullyShardReads(NodeId id, const Node& old,
                               absl::flat_hash_map<ValueRef, ValueRef>& local) {
    const ShardPhase ph = fs_->phase[id.value];
    if (ph != ShardPhase::kForward && ph != ShardPhase::kBackward) return absl::OkStatus();
    absl::Status status;
    old.ForEachInput([&](ValueRef r) {
      if (!status.ok() || local.contains(r)) return;
      const int32_t s = r.node.value;
      if (fs_->sharded.contains(s)) {
        auto& gathered = ph == ShardPhase::kForward ? gathered_fwd_ : gathered_bwd_;
        auto it = gathered.find(s);
        if (it == gathered.end()) {
          status = absl::InternalError(absl::StrCat(ir::NodeLabel(old), " reads parameter ",
                                                    g_.node(r.node).name, " before its gather"));
          return;
        }
        local[r] = it->second;
      } else if (ph == ShardPhase::kBackward && fs_->param_derived[s]) {
        absl::StatusOr<ValueRef> c = BackwardCopy(r);
        if (!c.ok()) {
          status = c.status();
          return;
        }
        local[r] = *c;
      }
    });
    return status;
  }

  absl::StatusOr<ValueRef> BackwardCopy(ValueRef r) {
    if (auto it = backward_copies_.find(r.node.value); it != backward_copies_.end()) {
      return ValueRef{NodeId{it->second}, r.output};
    }
    const Node& old = g_.node(r.node);
    absl::flat_hash_map<ValueRef, ValueRef> local;
    absl::Status status;
    old.ForEachInput([&](ValueRef x) {
      if (!status.ok() || local.contains(x)) return;
      if (fs_->sharded.contains(x.node.value)) {
        auto it = gathered_bwd_.find(x.node.value);
        if (it == gathered_bwd_.end()) {
          status = absl::InternalError(absl::StrCat("backward copy of ", old.name, " reads ",
                                                    g_.node(x.node).name, " before its gather"));
          return;
        }
        local[x] = it->second;
      } else if (fs_->param_derived[x.node.value]) {
        absl::StatusOr<ValueRef> c = BackwardCopy(x);
        if (!c.ok()) {
          status = c.status();
          return;
        }
        local[x] = *c;
      }
    });
    FXDP_RETURN_IF_ERROR(status);
    Node n = old;
    n.name = Fresh(absl::StrCat(old.name, "_bw"));
    n.grad_of.clear();
    for (Argument& a : n.args) MapArgs(a, local);
    for (ir::KeywordArgument& k : n.kwargs) MapArgs(k.value, local);
    out_.push_back(std::move(n));
    const int32_t id = static_cast<int32_t>(out_.size() - 1);
    backward_copies_[r.node.value] = id;
    return ValueRef{NodeId{id}, r.output};
  }

  // Gather event e: started if it was not (the previous event starts it:
  // prefetch), waited on, its parameters cut out; then the next one starts.
  absl::Status EmitGatherWait(int32_t e) {
    if (!gather_started_.contains(e)) FXDP_RETURN_IF_ERROR(EmitGatherStart(e));
    const GatherEvent& ev = fs_->gathers[e];
    const TensorType& first = g_.type(ValueRef{NodeId{ev.params[0]}, 0}).tensor;
    const int64_t world = o_.world_size;
    int64_t total = 0;
    for (int32_t q : ev.params) total += fs_->sharded.at(q).shard_numel;
    const std::string tag = absl::StrCat("unit", ev.unit, ev.phase == ShardPhase::kForward ? "" : "_bw");
    ValueRef w = Emit(Call(absl::StrCat("fxdp_wait_", tag), ir::kWaitTensor, "",
                           {gather_started_.at(e)}, Flat(first, world * total)));
    ValueRef rows = w;
    if (ev.params.size() > 1) {
      TensorType t = Flat(first, 0);
      t.shape = {world, total};
      t.stride = {total, 1};
      rows = Emit(Call(absl::StrCat("fxdp_rows_", tag), "aten::view", "", {w, Ints({world, total})}, t));
    }
    auto& gathered = ev.phase == ShardPhase::kForward ? gathered_fwd_ : gathered_bwd_;
    int64_t off = 0;
    for (int32_t q : ev.params) {
      const TensorType& t = g_.type(ValueRef{NodeId{q}, 0}).tensor;
      const int64_t s = fs_->sharded.at(q).shard_numel;
      const std::string base = absl::StrCat("fxdp_full_", g_.nodes()[q].name,
                                            ev.phase == ShardPhase::kForward ? "" : "_bw");
      ValueRef flat = w;
      if (ev.params.size() > 1) {
        TensorType col = Flat(t, 0);
        col.shape = {world, s};
        col.stride = {total, 1};
        col.storage_offset = off;
        ValueRef c = Emit(Call(base, "aten::slice", "Tensor",
                               {rows, Argument(int64_t{1}), Argument(off), Argument(off + s),
                                Argument(int64_t{1})},
                               col));
        flat = Emit(Call(base, "aten::reshape", "", {c, Ints({-1})}, Flat(t, world * s)));
      }
      if (world * s != t.numel()) {
        flat = Emit(Call(base, "aten::slice", "Tensor",
                         {flat, Argument(int64_t{0}), Argument(int64_t{0}), Argument(t.numel()),
                          Argument(int64_t{1})},
                         Flat(t, t.numel())));
      }
      TensorType shaped = t;
      shaped.stride = ir::ContiguousStrides(t.shape);
      shaped.storage_offset = 0;
      shaped.requires_grad = false;
      gathered[q] = Emit(Call(base, "aten::view", "", {flat, Ints(t.shape)}, shaped));
      off += s;
    }
    if (static_cast<size_t>(e + 1) < fs_->gathers.size() && !gather_started_.contains(e + 1)) {
      FXDP_RETURN_IF_ERROR(EmitGatherStart(e + 1));
    }
    return absl::OkStatus();
  }

  absl::Status EmitGatherStart(int32_t e) {
    const GatherEvent& ev = fs_->gathers[e];
    const TensorType& first = g_.type(ValueRef{NodeId{ev.params[0]}, 0}).tensor;
    const int64_t world = o_.world_size;
    std::vector<Argument> shards;
    int64_t total = 0;
    for (int32_t q : ev.params) {
      shards.emplace_back(Map(ValueRef{NodeId{q}, 0}));
      total += fs_->sharded.at(q).shard_numel;
    }
    const std::string tag = absl::StrCat("unit", ev.unit, ev.phase == ShardPhase::kForward ? "" : "_bw");
    ValueRef packed = shards[0].as<ValueRef>();
    if (shards.size() > 1) {
      packed = Emit(Call(absl::StrCat("fxdp_pack_", tag), "aten::cat", "",
                         {Argument(Argument::List(shards)), Argument(int64_t{0})}, Flat(first, total)));
    }
    Node ag = Call(absl::StrCat("fxdp_all_gather_", tag), ir::kAllGather,
                   "", {packed, Argument(world), Argument(o_.group_name)}, Flat(first, world * total));
    gather_started_[e] = Collect(std::move(ag),
                                 absl::StrCat("gather unit ", ev.unit,
                                              ev.phase == ShardPhase::kForward ? " (forward)"
                                                                               : " (backward)"),
                                 world * total * ir::DTypeItemSize(first.dtype));
    return absl::OkStatus();
  }

  // A bucket's gradients: each padded to N * s_i, laid out [N, sum s_i] so
  // that rank r's chunk holds its shard of each, scaled, reduce-scattered.
  absl::Status EmitReduceScatter(size_t b) {
    const PlannedBucket& pb = buckets_[b];
    const int64_t world = o_.world_size;
    const TensorType& first = g_.type(pb.values[0]).tensor;
    std::vector<Argument> parts;
    int64_t total = 0;
    for (const ValueRef& v : pb.values) {
      const TensorType& t = g_.type(v).tensor;
      const int64_t s = ShardNumel(t.numel());
      const std::string base = absl::StrCat("fxdp_flat_", g_.node(v.node).name);
      ValueRef x = Emit(Call(base, "aten::reshape", "", {Map(v), Ints({-1})}, Flat(t, t.numel())));
      if (world * s != t.numel()) {
        x = Emit(Call(base, "aten::constant_pad_nd", "",
                      {x, Ints({0, world * s - t.numel()}), Argument(0.0)}, Flat(t, world * s)));
      }
      if (pb.values.size() > 1) {
        TensorType rows = Flat(t, 0);
        rows.shape = {world, s};
        rows.stride = {s, 1};
        x = Emit(Call(base, "aten::view", "", {x, Ints({world, s})}, rows));
      }
      parts.emplace_back(x);
      total += s;
    }
    ValueRef packed = parts[0].as<ValueRef>();
    if (parts.size() > 1) {
      TensorType rows = Flat(first, 0);
      rows.shape = {world, total};
      rows.stride = {total, 1};
      ValueRef c = Emit(Call(absl::StrCat("fxdp_bucket", b), "aten::cat", "",
                             {Argument(Argument::List(parts)), Argument(int64_t{1})}, rows));
      packed = Emit(Call(absl::StrCat("fxdp_bucket", b), "aten::view", "",
                         {c, Ints({world * total})}, Flat(first, world * total)));
    }
    const double w = Weight(pb.info.op);
    if (w != 1.0) {
      packed = Emit(Call("fxdp_scale", "aten::mul", "Scalar", {packed, Argument(w)},
                         Flat(first, world * total)));
    }
    Node rs = Call("fxdp_reduce_scatter", ir::kReduceScatter, "",
                   {packed, Argument(std::string("sum")), Argument(world), Argument(o_.group_name)},
                   Flat(first, total));
    started_[b] = Collect(std::move(rs), absl::StrCat("bucket ", b),
                          world * total * ir::DTypeItemSize(first.dtype));
    return absl::OkStatus();
  }

  absl::Status EmitReduceScatterWait(size_t b, ValueRef started) {
    const PlannedBucket& pb = buckets_[b];
    int64_t total = 0;
    for (const ValueRef& v : pb.values) total += ShardNumel(g_.type(v).tensor.numel());
    const TensorType& first = g_.type(pb.values[0]).tensor;
    ValueRef w = Emit(Call(absl::StrCat("fxdp_wait_bucket", b), ir::kWaitTensor, "",
                           {started}, Flat(first, total)));
    int64_t off = 0;
    for (const ValueRef& v : pb.values) {
      const TensorType& t = g_.type(v).tensor;
      const int64_t s = ShardNumel(t.numel());
      ValueRef x = w;
      if (pb.values.size() > 1) {
        TensorType piece = Flat(t, s);
        piece.storage_offset = off;
        x = Emit(Call(absl::StrCat("fxdp_grad_shard_", g_.node(v.node).name), "aten::slice",
                      "Tensor",
                      {w, Argument(int64_t{0}), Argument(off), Argument(off + s), Argument(int64_t{1})},
                      piece));
      }
      replaced_[v] = x;
      off += s;
    }
    return absl::OkStatus();
  }

  absl::Status EmitOutput(const Node& old) {
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
          list[k] = AllReduce(list[k].as<ValueRef>(), Local(g_.type(*r).tensor, a_.value(*r)),
                              ReduceOp::kAvg, absl::StrCat("sync ", n.output_specs[k].state_name),
                              true);
        }
        continue;
      }
      local_loss = ValueRef{NodeId{new_id_[r->node.value]}, r->output};
      have_loss = true;
      const ValueInfo& v = a_.value(*r);
      if (replaced_.contains(*r)) {
        list[k] = replaced_[*r];
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

  const Graph& g_;
  const BatchDimAnalysis& a_;
  const ExpandOptions& o_;
  const std::vector<PlannedBucket>& buckets_;
  const RankSlice slice_;
  const int64_t batch_;
  std::vector<Node> out_;
  std::vector<int32_t> new_id_;
  absl::flat_hash_set<std::string> fresh_names_;            // names Fresh() gave out
  absl::flat_hash_map<std::string, int> next_suffix_;       // per base: first suffix to try
  absl::flat_hash_map<ValueRef, ValueRef> replaced_;
  absl::flat_hash_set<ValueRef> sync_bn_outputs_;  // outputs of rewritten batch-norm nodes
  absl::flat_hash_map<int32_t, std::vector<ShardedRead>> reads_;
  absl::flat_hash_map<int32_t, std::vector<Reduction>> solo_;
  absl::flat_hash_map<size_t, ValueRef> started_;
  std::vector<Collective>* collectives_ = nullptr;
  // FULLY_SHARD.
  const FullyShardPlan* fs_ = nullptr;
  absl::flat_hash_map<int32_t, ValueRef> gathered_fwd_, gathered_bwd_;  // placeholder -> whole
  absl::flat_hash_map<int32_t, ValueRef> gather_started_;               // event -> all_gather
  absl::flat_hash_map<int32_t, int32_t> backward_copies_;               // old node -> new node
  absl::flat_hash_map<ValueRef, ValueRef> norms_;  // _foreach_norm output -> whole norm
  absl::flat_hash_set<ValueRef> bucketed_;          // gradients some bucket reduces
};

absl::StatusOr<std::vector<PlannedBucket>> PlanBuckets(const Graph& g, const BatchDimAnalysis& a,
                                                       const ExpandOptions& o) {
  std::vector<const Reduction*> grads;
  for (const Reduction& r : a.reductions()) {
    if (!r.grad_of.empty()) grads.push_back(&r);
  }
  std::sort(grads.begin(), grads.end(),
            [](const Reduction* x, const Reduction* y) { return x->value.node < y->value.node; });
  std::vector<PlannedBucket> buckets;
  const auto cap = [&](size_t index) {
    return static_cast<int64_t>((index == 0 ? o.first_bucket_mb : o.bucket_cap_mb) * 1024 * 1024);
  };
  PlannedBucket cur;
  auto close = [&]() {
    if (cur.values.empty()) return;
    cur.info.index = static_cast<int32_t>(buckets.size());
    cur.info.start_after = g.node(NodeId{cur.start}).name;
    cur.info.wait_before = g.node(NodeId{cur.wait}).name;
    cur.info.start_position = cur.start;
    cur.info.wait_position = cur.wait;
    buckets.push_back(std::move(cur));
    cur = PlannedBucket{};
  };
  for (const Reduction* r : grads) {
    const TensorType* t = g.type(r->value).is_tensor() ? &g.type(r->value).tensor : nullptr;
    if (t == nullptr) continue;
    const int32_t produced = r->value.node.value;
    const int32_t first_use = r->first_use.valid() ? r->first_use.value : g.size() - 1;
    if (!cur.values.empty()) {
      const TensorType& head = g.type(cur.values[0]).tensor;
      if (produced >= cur.wait || head.dtype != t->dtype || head.device != t->device ||
          cur.info.op != r->op || cur.info.bytes >= cap(buckets.size())) {
        close();
      }
    }
    if (cur.values.empty()) {
      cur.info.op = r->op;
      cur.wait = first_use;
    }
    cur.values.push_back(r->value);
    cur.produced.push_back(produced);
    cur.first_use.push_back(first_use);
    cur.info.gradients.push_back(r->grad_of);
    cur.info.bytes += Bytes(*t);
    cur.start = std::max(cur.start, produced);
    cur.wait = std::min(cur.wait, first_use);
  }
  close();
  // The tail: the last bucket is split again from its end, with DDP's rule
  // (a bucket closes once it reaches its cap) and caps last_bucket_mb,
  // 2 * last_bucket_mb, 4 * ... (at most bucket_cap_mb); the front piece
  // left over is a bucket of its own if it holds at least half its cap.
  if (o.last_bucket_mb > 0 && !buckets.empty() && buckets.back().values.size() > 1) {
    PlannedBucket last = std::move(buckets.back());
    buckets.pop_back();
    const int64_t max_cap = static_cast<int64_t>(o.bucket_cap_mb * 1024 * 1024);
    int64_t piece_cap = static_cast<int64_t>(o.last_bucket_mb * 1024 * 1024);
    std::vector<std::pair<size_t, size_t>> pieces;  // [from, to), last piece first
    size_t to = last.values.size();
    int64_t bytes = 0;
    for (size_t k = last.values.size(); k-- > 0;) {
      bytes += Bytes(g.type(last.values[k]).tensor);
      if (bytes >= piece_cap) {
        pieces.emplace_back(k, to);
        to = k;
        bytes = 0;
        piece_cap = std::min(2 * piece_cap, std::max(max_cap, piece_cap));
      }
    }
    if (to > 0) {
      // A front piece under half its cap joins the piece after it (which then
      // starts no later: it holds the later gradients).
      if (pieces.empty() || 2 * bytes >= piece_cap) {
        pieces.emplace_back(0, to);
      } else {
        pieces.back().first = 0;
      }
    }
    for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {
      cur = PlannedBucket{};
      cur.info.op = last.info.op;
      cur.wait = g.size() - 1;
      for (size_t k = it->first; k < it->second; ++k) {
        cur.values.push_back(last.values[k]);
        cur.produced.push_back(last.produced[k]);
        cur.first_use.push_back(last.first_use[k]);
        cur.info.gradients.push_back(last.info.gradients[k]);
        cur.info.bytes += Bytes(g.type(last.values[k]).tensor);
        cur.start = std::max(cur.start, last.produced[k]);
        cur.wait = std::min(cur.wait, last.first_use[k]);
      }
      close();
    }
  }
  return buckets;
}

}  // namespace

absl::StatusOr<Expansion> ExpandDataParallel(const Graph& graph, const BatchDimAnalysis& analysis,
                                             const ExpandOptions& options) {
  const int32_t world = options.world_size;
  if (world < 1) {
    return absl::InvalidArgumentError(absl::StrCat("world size must be >= 1, got ", world));
  }
  if (analysis.world_size() != world) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the analysis is for world size %d, the expansion for %d", analysis.world_size(), world));
  }
  const int64_t batch = analysis.batch_size();
  if (batch == 0) {
    return absl::InvalidArgumentError(
        "the graph has no input with a batch dim (every INPUT placeholder has batch_dim -1)");
  }
  if (world > batch) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "world size %d is larger than the batch (%d samples): every rank needs at least one",
        world, batch));
  }
  // Micro-batches (batch_dim.h): rank r splits its own rows into k pieces of
  // s_r, as DDP with no_sync() does; the workers hand rank r its balanced
  // slice of the k * s rows, which is k * s_r only when N divides s.
  if (const int64_t k = analysis.micro_batches(); k > 1 && batch % world != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the step splits its batch of %d samples into %d micro-batches of %d; over %d ranks each "
        "rank's rows must split into %d equal micro-batches, so the micro-batch size must be a "
        "multiple of the world size (make the batch a multiple of %d)",
        k * batch, k, batch, world, k, k * world));
  }
  bool any_grad = false;
  for (const Node& n : graph.nodes()) any_grad |= !n.grad_of.empty();
  if (!any_grad) {
    return absl::InvalidArgumentError(
        "the graph marks no gradients (no node has grad_of): nothing to all-reduce; trace it "
        "with fxdp.trace");
  }
  if (options.bucket_cap_mb <= 0 || options.first_bucket_mb <= 0) {
    return absl::InvalidArgumentError("bucket sizes must be positive");
  }
  if (options.last_bucket_mb < 0) {
    return absl::InvalidArgumentError("the last bucket's cap must be >= 0 (0: no split)");
  }
  if (options.sync_batchnorm != analysis.sync_batchnorm()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the expansion asks for sync_batchnorm=%s but the analysis was run with %s",
        options.sync_batchnorm ? "true" : "false", analysis.sync_batchnorm() ? "true" : "false"));
  }
  FXDP_ASSIGN_OR_RETURN(std::vector<PlannedBucket> buckets, PlanBuckets(graph, analysis, options));
  std::optional<FullyShardPlan> fs;
  if (options.style == DataParallelStyle::kFullyShard) {
    FXDP_ASSIGN_OR_RETURN(fs, PlanFullyShard(graph, analysis, options));
  }

  Expansion e;
  ExpansionReport& rep = e.report;
  rep.world_size = world;
  rep.style = options.style;
  if (fs.has_value()) {
    e.sharded_state = fs->sharded_state;
    rep.sharded_state = fs->sharded_state;
    for (size_t u = 0; u < fs->units.size(); ++u) {
      std::vector<std::string> names;
      for (int32_t q : fs->units[u]) names.push_back(fs->sharded.at(q).state_name);
      rep.notes.push_back(absl::StrFormat("fully_shard unit %d (%d bytes gathered): %s", u,
                                          fs->unit_bytes[u], absl::StrJoin(names, ", ")));
    }
  }
  rep.batch_size = batch;
  rep.slices = SplitBatch(batch, world);
  rep.sharded_reads = static_cast<int32_t>(analysis.sharded_reads().size());
  rep.notes.insert(rep.notes.begin(), analysis.notes().begin(), analysis.notes().end());
  for (const Node& n : graph.nodes()) {
    if (!n.is_output() || n.args.empty() || !n.args[0].is_list()) continue;
    const auto& list = n.args[0].as<Argument::List>();
    for (size_t k = 0; k < list.size() && k < n.output_specs.size(); ++k) {
      const ValueRef* r = list[k].get_if<ValueRef>();
      if (r != nullptr && ir::UpdatedRole(n.output_specs[k].role).has_value() &&
          analysis.value(*r).rank_local) {
        rep.notes.push_back(absl::StrCat("updated state '", n.output_specs[k].state_name,
                                         "' comes from local batch statistics: all-reduced to "
                                         "the batch-weighted mean over ranks each step"));
      }
    }
  }
  for (ir::NodeId id{0}; id.value < graph.size(); ++id.value) {
    const Detail d = analysis.node(id).detail;
    if (d == Detail::kSyncStats) rep.batch_norm = "global";
    if (d == Detail::kLocalStats) rep.batch_norm = "local";
  }
  for (const PlannedBucket& b : buckets) rep.buckets.push_back(b.info);
  // Rank-specific slices of replicated values make the graphs differ too.
  e.identical = batch % world == 0 && analysis.sharded_reads().empty();
  if (fs.has_value()) {
    // A gradient no bucket reduces is sliced per rank (Expander::EmitNode).
    absl::flat_hash_set<ValueRef> bucketed;
    for (const PlannedBucket& b : buckets) bucketed.insert(b.values.begin(), b.values.end());
    for (ir::NodeId id{0}; id.value < graph.size(); ++id.value) {
      if (!graph.node(id).grad_of.empty() && !bucketed.contains(ValueRef{id, 0})) e.identical = false;
    }
  }
  // The overlap schedule: one order for every rank. The rank graphs have the
  // same structure, so each rank's own schedule is rank 0's (checked) and
  // they start their collectives in the same order.
  // Identical ranks share one graph: only rank 0's is built.
  ScheduleInfo schedule;
  const int32_t distinct = e.identical ? 1 : world;
  e.distinct_graphs.reserve(distinct);
  for (int32_t r = 0; r < distinct; ++r) {
    Expander x(graph, analysis, options, buckets, rep.slices[r], fs.has_value() ? &*fs : nullptr);
    FXDP_ASSIGN_OR_RETURN(RankNodes local, x.Run(r == 0 ? &rep.collectives : nullptr));
    if (options.overlap_schedule) {
      // Scheduling reads the edges before the graph is verified: a reference
      // that is not to an earlier node is reported as the verifier does.
      if (!RefsPointBackwards(local.nodes)) {
        absl::Status s = Graph::Create(std::move(local.header), std::move(local.nodes)).status();
        return s.ok() ? absl::InternalError("the expanded graph reads a value before it exists")
                      : s;
      }
      if (r == 0) {
        schedule = OverlapSchedule(local.nodes);
      } else if (OverlapSchedule(local.nodes).order != schedule.order) {
        return absl::InternalError(absl::StrCat(
            "rank ", r, "'s expanded graph schedules differently from rank 0's"));
      }
      local.nodes = ReorderNodes(std::move(local.nodes), schedule.order);
    }
    FXDP_ASSIGN_OR_RETURN(Graph g,
                          Graph::Create(std::move(local.header), std::move(local.nodes)));
    FXDP_RETURN_IF_ERROR(CheckRankShapes(g, r));
    e.distinct_graphs.push_back(std::move(g));
  }
  if (options.overlap_schedule) {
    std::vector<int32_t> new_index(schedule.order.size());
    for (size_t k = 0; k < schedule.order.size(); ++k)
      new_index[schedule.order[k]] = static_cast<int32_t>(k);
    for (Collective& c : rep.collectives) c.position = new_index[c.position];
    std::stable_sort(rep.collectives.begin(), rep.collectives.end(),
                     [](const Collective& a, const Collective& b) { return a.position < b.position; });
  }
  for (const Collective& c : rep.collectives) rep.bytes_per_step += c.bytes;
  return e;
}

}  // namespace fxdp
