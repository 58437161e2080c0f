// A batch-sharded operand all-gathered for one use (BatchDimAnalysis::gathered_reads: a
// product of two batch-sharded operands, samples coupled across the batch).
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "analysis/ir/batch_split.h"
#include "analysis/ir/collectives.h"
#include "analysis/view_rules.h"
#include "expansion/rank_expander.h"

namespace fxdp {

using ir::Argument;
using ir::TensorType;
using ir::ValueRef;

namespace {

TensorType Permuted(const TensorType& t, const std::vector<int64_t>& perm) {
  TensorType p = t;
  for (size_t i = 0; i < perm.size(); ++i) {
    p.shape[i] = t.shape[perm[i]];
    p.stride[i] = t.stride[perm[i]];
  }
  return p;
}

}  // namespace

// The rows moved to dim 0 and flattened, padded to the largest rank's rows (an
// uneven split), all_gather_into_tensor'ed and waited, each rank's rows taken
// back: the global value, the same on every rank.
ValueRef RankExpander::EmitGathered(const ShardedRead& r) {
  const TensorType& t = g_.type(r.value).tensor;
  const TensorType local = Local(t, a_.value(r.value));
  const int32_t d = r.dim;
  const int64_t world = o_.world_size;
  const int64_t inner = t.shape[d] / batch_;
  const std::string base = absl::StrCat("fxdp_gather_", g_.node(r.value.node).name);
  std::vector<int64_t> perm{d}, inverse(t.rank());
  for (int64_t i = 0; i < t.rank(); ++i) {
    if (i != d) perm.push_back(i);
  }
  for (size_t i = 0; i < perm.size(); ++i) inverse[perm[i]] = static_cast<int64_t>(i);
  ValueRef x = Map(r.value);
  if (d != 0) x = Emit(Call(base, "aten::permute", "", {x, Ints(perm)}, Permuted(local, perm)));
  const int64_t row = t.numel() / t.shape[d];
  const std::vector<ir::RankSlice> split = ir::SplitBatch(batch_, static_cast<int32_t>(world));
  const int64_t most = split[0].size * inner;
  const int64_t mine = slice_.size * inner;
  x = Emit(Call(base, "aten::reshape", "", {x, Ints({-1})}, Flat(t, mine * row)));
  if (r.unscale) {  // rank r holds B/B_r times its rows: times B_r/B, the one device's values
    x = Emit(Call(base, "aten::mul", "Scalar",
                  {x, Argument(static_cast<double>(slice_.size) / static_cast<double>(batch_))},
                  Flat(t, mine * row)));
  }
  if (batch_ % world != 0) {  // every rank pads (the largest by 0): one schedule for all ranks
    x = Emit(Call(base, "aten::constant_pad_nd", "",
                  {x, Ints({0, (most - mine) * row}), Argument(0.0)}, Flat(t, most * row)));
  }
  const TensorType all = Flat(t, world * most * row);
  ValueRef g =
      Collect(Call(base, ir::kAllGather, "", {x, Argument(world), Argument(o_.group_name)}, all),
              absl::StrCat("gather ", g_.node(r.value.node).name, " for ", g_.node(r.user).name),
              world * most * row * ir::DTypeItemSize(t.dtype));
  ValueRef full = Emit(Call("fxdp_wait", ir::kWaitTensor, "", {g}, all));
  if (batch_ % world != 0) {
    std::vector<Argument> parts;
    for (const ir::RankSlice& s : split) {
      parts.emplace_back(
          Emit(Call(base, "aten::slice", "Tensor",
                    {full, Argument(int64_t{0}), Argument(s.rank * most * row),
                     Argument((s.rank * most + s.size * inner) * row), Argument(int64_t{1})},
                    Flat(t, s.size * inner * row))));
    }
    full = Emit(Call(base, "aten::cat", "", {Argument(Argument::List(parts)), Argument(int64_t{0})},
                     Flat(t, t.numel())));
  }
  TensorType moved = t;
  moved.stride = ir::ContiguousStrides(t.shape);
  moved = Permuted(moved, perm);
  moved.stride = ir::ContiguousStrides(moved.shape);
  moved.storage_offset = 0;
  moved.requires_grad = false;
  ValueRef v = ViewAs(base, full, moved);
  if (d != 0)
    v = Emit(Call(base, "aten::permute", "", {v, Ints(inverse)}, Permuted(moved, inverse)));
  return v;
}

// The value a gathered read `r` is taken from: back through views of one tensor (t, permute,
// transpose: logits.T, b.T) to the first value that holds the batch whole on one dim, with the
// views from it to `r.value` in `chain` (last first). Reads of views of one value then share its
// one gather (a forward product and its backward's, the 3 reads of cdist(f, f)).
ShardedRead RankExpander::GatherRoot(const ShardedRead& r, std::vector<ValueRef>* chain) const {
  ShardedRead root = r;
  for (;;) {
    const ir::Node& n = g_.node(root.value.node);
    if (!n.is_call() || !IsViewOp(n.target) || n.args.empty()) return root;
    const ValueRef* in = n.args[0].get_if<ValueRef>();
    int inputs = 0;
    n.ForEachInput([&](ValueRef) { ++inputs; });
    if (in == nullptr || inputs != 1 || !g_.type(*in).is_tensor()) return root;
    const ValueInfo& v = a_.value(*in);
    if (!v.placement.is_shard() || v.outer != 1 || v.order != 0 || v.mean_scaled ||
        a_.value(root.value).mean_scaled) {
      return root;
    }
    chain->push_back(root.value);
    root.value = *in;
    root.dim = v.placement.dim;
  }
}

// `r.value` whole on this rank: all-gathered once per value (whole_), its views replayed on the
// gathered root when the root comes out in its traced layout (so each view's traced type holds).
ValueRef RankExpander::Whole(const ShardedRead& r) {
  if (auto it = whole_.find(r.value); it != whole_.end()) return it->second;
  std::vector<ValueRef> chain;
  const ShardedRead root = GatherRoot(r, &chain);
  auto [w, fresh] = whole_.try_emplace(root.value);
  if (fresh) w->second = EmitGathered(root);
  ValueRef v = w->second;
  const TensorType& got = out_[v.node.value].outputs[0].tensor;
  const TensorType& traced = g_.type(root.value).tensor;
  if (got.shape != traced.shape || got.stride != traced.stride ||
      got.storage_offset != traced.storage_offset) {
    if (root.value == r.value) return v;
    auto [own, own_fresh] = whole_.try_emplace(r.value);
    if (own_fresh) own->second = EmitGathered(r);
    return own->second;
  }
  for (auto c = chain.rbegin(); c != chain.rend(); ++c) {
    if (auto it = whole_.find(*c); it != whole_.end()) {
      v = it->second;
      continue;
    }
    const ir::Node& old = g_.node(c->node);
    std::vector<Argument> args = old.args;
    args[0] = Argument(v);
    TensorType t = g_.type(*c).tensor;
    t.requires_grad = false;
    ir::Node n = Call(absl::StrCat("fxdp_whole_", old.name), old.target.name, old.target.overload,
                      std::move(args), t);
    n.kwargs = old.kwargs;
    v = Emit(std::move(n));
    whole_[*c] = v;
  }
  return v;
}

// Each gathered argument reads the value all-gathered: one gather per value in the graph.
void RankExpander::GatherArgs(ir::NodeId id, ir::Node& n) {
  auto it = gathered_.find(id.value);
  if (it == gathered_.end()) return;
  for (const ShardedRead& r : it->second) {
    const ValueRef w = Whole(r);
    if (r.arg >= 64 && r.arg - 64 < static_cast<int32_t>(n.kwargs.size())) {
      n.kwargs[r.arg - 64].value = Argument(w);
    } else if (r.arg >= 0 && r.arg < static_cast<int32_t>(n.args.size())) {
      n.args[r.arg] = Argument(w);
    }
  }
}

}  // namespace fxdp
