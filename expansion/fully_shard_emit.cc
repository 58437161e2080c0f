// FULLY_SHARD's part of building a rank's graph (expansion/rank_expander.h):
// the plan of expansion/fully_shard.h emitted as gathers, backward copies,
// shard-typed optimizer nodes, partial norms and reduce-scattered buckets.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "analysis/ir/collectives.h"
#include "analysis/ir/node_error.h"
#include "analysis/op_rules.h"
#include "expansion/rank_expander.h"
#include "util/status_macros.h"

namespace fxdp {

using ir::Argument;
using ir::Graph;
using ir::Node;
using ir::NodeId;
using ir::TensorType;
using ir::ValueRef;
using ir::ValueType;

void ReportFullyShard(const FullyShardPlan& fs, Expansion* e) {
  ExpansionReport& rep = e->report;
  e->sharded_state = fs.sharded_state;
  rep.sharded_state = fs.sharded_state;
  for (size_t u = 0; u < fs.units.size(); ++u) {
    std::vector<std::string> names;
    for (int32_t q : fs.units[u]) names.push_back(fs.sharded.at(q).state_name);
    rep.notes.push_back(absl::StrFormat("fully_shard unit %d (%d bytes gathered): %s", u,
                                        fs.unit_bytes[u], absl::StrJoin(names, ", ")));
  }
}

bool FullyShardSlicesPerRank(const Graph& g, const std::vector<PlannedBucket>& buckets) {
  // A gradient no bucket reduces is sliced per rank (RankExpander::FullyShardAfter).
  absl::flat_hash_set<ValueRef> bucketed;
  for (const PlannedBucket& b : buckets) bucketed.insert(b.values.begin(), b.values.end());
  for (ir::NodeId id{0}; id.value < g.size(); ++id.value) {
    if (!g.node(id).grad_of.empty() && !bucketed.contains(ValueRef{id, 0})) return true;
  }
  return false;
}

void RankExpander::FullyShardMetadata(ir::GraphHeader& header) const {
  header.metadata.emplace_back("fxdp.style", "fully_shard");
  std::vector<std::string> names;
  for (const ShardedState& s : fs_->sharded_state) names.push_back(s.state_name);
  header.metadata.emplace_back("fxdp.sharded_state", absl::StrJoin(names, "\n"));
}

bool RankExpander::FullyShardReplaces(NodeId id, const Node& old) {
  if (fs_->alias[id.value]) {
    // A view of a shard in the optimizer: the shard itself (fully_shard.h).
    replaced_[ValueRef{id, 0}] = Map(old.args[0].as<ValueRef>());
    return true;
  }
  if (old.is_getitem() && old.args[0].is_ref()) {
    // An element of a norm of shards: the whole tensors' norm (EmitPartialNorm).
    if (auto it = norms_.find(old.args[0].as<ValueRef>()); it != norms_.end()) {
      replaced_[ValueRef{id, 0}] = it->second;
      return true;
    }
  }
  return false;
}

void RankExpander::FullyShardOutputs(NodeId id, Node& n) const {
  if (n.is_placeholder() && fs_->sharded.contains(id.value)) {
    // Sharded state: this rank's flat shard.
    const bool rg = n.outputs[0].tensor.requires_grad;
    n.outputs[0] =
        ValueType::Tensor(Flat(n.outputs[0].tensor, fs_->sharded.at(id.value).shard_numel));
    n.outputs[0].tensor.requires_grad = rg;
  } else if (!fs_->out_shards[id.value].empty()) {
    // Optimizer math on shards: elementwise, so each such output is [s].
    const std::vector<int64_t>& full = fs_->out_shards[id.value];
    for (size_t k = 0; k < n.outputs.size() && k < full.size(); ++k) {
      if (n.outputs[k].is_tensor() && full[k] >= 0) {
        n.outputs[k] = ValueType::Tensor(Flat(n.outputs[k].tensor, ShardNumel(full[k])));
      }
    }
  }
}

absl::Status RankExpander::FullyShardAfter(NodeId id, const Node& old) {
  if (fs_->partial_norm[id.value]) return EmitPartialNorm(id, old);
  if (!old.grad_of.empty() && !bucketed_.contains(ValueRef{id, 0}) && old.outputs[0].is_tensor()) {
    // A gradient the analysis already has whole on every rank (reduced
    // earlier, or never batch-dependent): this rank's shard is a slice.
    const TensorType& t = old.outputs[0].tensor;
    const int64_t world = o_.world_size, s = ShardNumel(t.numel());
    const std::string base = absl::StrCat("fxdp_grad_shard_", old.name);
    ValueRef x = Emit(
        Call(base, "aten::reshape", "", {Map(ValueRef{id, 0}), Ints({-1})}, Flat(t, t.numel())));
    if (world * s != t.numel()) {
      x = Emit(Call(base, "aten::constant_pad_nd", "",
                    {x, Ints({0, world * s - t.numel()}), Argument(0.0)}, Flat(t, world * s)));
    }
    TensorType piece = Flat(t, s);
    piece.storage_offset = slice_.rank * s;
    replaced_[ValueRef{id, 0}] = Emit(Call(base, "aten::slice", "Tensor",
                                           {x, Argument(int64_t{0}), Argument(slice_.rank * s),
                                            Argument((slice_.rank + 1) * s), Argument(int64_t{1})},
                                           piece));
  }
  return absl::OkStatus();
}

ValueRef RankExpander::Collect(Node n, const std::string& purpose, int64_t bytes) {
  const std::string name = n.name;
  const std::string op = n.target.name.substr(n.target.name.find("::") + 2);
  ValueRef r = Emit(std::move(n));
  if (collectives_ != nullptr)
    collectives_->push_back(Collective{name, purpose, bytes, r.node.value, op});
  return r;
}

// Forward reads gathered parameters; backward its own gather and its own
// copies of parameter-derived forward values.
absl::Status RankExpander::FullyShardReads(NodeId id, const Node& old, LocalRefs& local) {
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

absl::StatusOr<ValueRef> RankExpander::BackwardCopy(ValueRef r) {
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

// The norms this rank took of its shards -> the whole tensors' 2-norms:
// sqrt(all_reduce(sum of squares)), one all-reduce for all of a node's norms.
absl::Status RankExpander::EmitPartialNorm(NodeId id, const Node& old) {
  const ValueRef local{NodeId{new_id_[id.value]}, 0};
  const OpRule* rule = FindOpRule(old.target);
  const bool foreach =
      old.outputs.size() > 1 || (rule != nullptr && rule->family == OpFamily::kForeach);
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

// Gather event e: started if it was not (the previous event starts it:
// prefetch), waited on, its parameters cut out; then the next one starts.
absl::Status RankExpander::EmitGatherWait(int32_t e) {
  if (!gather_started_.contains(e)) FXDP_RETURN_IF_ERROR(EmitGatherStart(e));
  const GatherEvent& ev = fs_->gathers[e];
  const TensorType& first = g_.type(ValueRef{NodeId{ev.params[0]}, 0}).tensor;
  const int64_t world = o_.world_size;
  int64_t total = 0;
  for (int32_t q : ev.params) total += fs_->sharded.at(q).shard_numel;
  const std::string tag =
      absl::StrCat("unit", ev.unit, ev.phase == ShardPhase::kForward ? "" : "_bw");
  ValueRef w = Emit(Call(absl::StrCat("fxdp_wait_", tag), ir::kWaitTensor, "",
                         {gather_started_.at(e)}, Flat(first, world * total)));
  ValueRef rows = w;
  if (ev.params.size() > 1) {
    TensorType t = Flat(first, 0);
    t.shape = {world, total};
    t.stride = {total, 1};
    rows =
        Emit(Call(absl::StrCat("fxdp_rows_", tag), "aten::view", "", {w, Ints({world, total})}, t));
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
      ValueRef c = Emit(
          Call(base, "aten::slice", "Tensor",
               {rows, Argument(int64_t{1}), Argument(off), Argument(off + s), Argument(int64_t{1})},
               col));
      flat = Emit(Call(base, "aten::reshape", "", {c, Ints({-1})}, Flat(t, world * s)));
    }
    if (world * s != t.numel()) {
      flat = Emit(Call(base, "aten::slice", "Tensor",
                       {flat, Argument(int64_t{0}), Argument(int64_t{0}), Argument(t.numel()),
                        Argument(int64_t{1})},
                       Flat(t, t.numel())));
    }
    gathered[q] = ViewAs(base, flat, t);
    off += s;
  }
  if (static_cast<size_t>(e + 1) < fs_->gathers.size() && !gather_started_.contains(e + 1)) {
    FXDP_RETURN_IF_ERROR(EmitGatherStart(e + 1));
  }
  return absl::OkStatus();
}

absl::Status RankExpander::EmitGatherStart(int32_t e) {
  const GatherEvent& ev = fs_->gathers[e];
  const TensorType& first = g_.type(ValueRef{NodeId{ev.params[0]}, 0}).tensor;
  const int64_t world = o_.world_size;
  std::vector<Argument> shards;
  int64_t total = 0;
  for (int32_t q : ev.params) {
    shards.emplace_back(Map(ValueRef{NodeId{q}, 0}));
    total += fs_->sharded.at(q).shard_numel;
  }
  const std::string tag =
      absl::StrCat("unit", ev.unit, ev.phase == ShardPhase::kForward ? "" : "_bw");
  ValueRef packed = shards[0].as<ValueRef>();
  if (shards.size() > 1) {
    packed =
        Emit(Call(absl::StrCat("fxdp_pack_", tag), "aten::cat", "",
                  {Argument(Argument::List(shards)), Argument(int64_t{0})}, Flat(first, total)));
  }
  Node ag = Call(absl::StrCat("fxdp_all_gather_", tag), ir::kAllGather, "",
                 {packed, Argument(world), Argument(o_.group_name)}, Flat(first, world * total));
  gather_started_[e] =
      Collect(std::move(ag),
              absl::StrCat("gather unit ", ev.unit,
                           ev.phase == ShardPhase::kForward ? " (forward)" : " (backward)"),
              world * total * ir::DTypeItemSize(first.dtype));
  return absl::OkStatus();
}

// A bucket's gradients: each padded to N * s_i, laid out [N, sum s_i] so
// that rank r's chunk holds its shard of each, scaled, reduce-scattered.
absl::Status RankExpander::EmitReduceScatter(size_t b) {
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
    packed = Emit(Call(absl::StrCat("fxdp_bucket", b), "aten::view", "", {c, Ints({world * total})},
                       Flat(first, world * total)));
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

absl::Status RankExpander::EmitReduceScatterWait(size_t b, ValueRef started) {
  const PlannedBucket& pb = buckets_[b];
  int64_t total = 0;
  for (const ValueRef& v : pb.values) total += ShardNumel(g_.type(v).tensor.numel());
  const TensorType& first = g_.type(pb.values[0]).tensor;
  ValueRef w = DivideBucket(Emit(Call(absl::StrCat("fxdp_wait_bucket", b), ir::kWaitTensor, "",
                                      {started}, Flat(first, total))),
                            Flat(first, total), b);
  int64_t off = 0;
  for (const ValueRef& v : pb.values) {
    const TensorType& t = g_.type(v).tensor;
    const int64_t s = ShardNumel(t.numel());
    ValueRef x = w;
    if (pb.values.size() > 1) {
      TensorType piece = Flat(t, s);
      piece.storage_offset = off;
      x = Emit(
          Call(absl::StrCat("fxdp_grad_shard_", g_.node(v.node).name), "aten::slice", "Tensor",
               {w, Argument(int64_t{0}), Argument(off), Argument(off + s), Argument(int64_t{1})},
               piece));
    }
    replaced_[v] = x;
    off += s;
  }
  return absl::OkStatus();
}

}  // namespace fxdp
