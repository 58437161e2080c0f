// A batch-sharded operand all-gathered for one use (BatchDimAnalysis::gathered_reads: a
// product of two batch-sharded operands, samples coupled across the batch).
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "analysis/ir/batch_split.h"
#include "analysis/ir/collectives.h"
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

// Each gathered argument reads the value all-gathered; one gather per value and use.
void RankExpander::GatherArgs(ir::NodeId id, ir::Node& n) {
  auto it = gathered_.find(id.value);
  if (it == gathered_.end()) return;
  absl::flat_hash_map<ValueRef, ValueRef> whole;
  for (const ShardedRead& r : it->second) {
    auto [w, fresh] = whole.try_emplace(r.value);
    if (fresh) w->second = EmitGathered(r);
    if (r.arg >= 64 && r.arg - 64 < static_cast<int32_t>(n.kwargs.size())) {
      n.kwargs[r.arg - 64].value = Argument(w->second);
    } else if (r.arg >= 0 && r.arg < static_cast<int32_t>(n.args.size())) {
      n.args[r.arg] = Argument(w->second);
    }
  }
}

}  // namespace fxdp
