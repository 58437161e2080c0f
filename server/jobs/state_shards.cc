#include "server/jobs/state_shards.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "analysis/ir/flat_shard.h"
#include "server/jobs/raw_tensors.h"

namespace fxdp::server {
namespace {

int64_t Numel(const v1::ShardedState& s) {
  int64_t n = 1;
  for (int64_t d : s.shape()) n *= d;
  return n;
}

std::vector<int64_t> ShapeOf(const v1::TensorChunk& c) {
  return {c.shape().begin(), c.shape().end()};
}
std::vector<int64_t> ShapeOf(const v1::ShardedState& s) {
  return {s.shape().begin(), s.shape().end()};
}

v1::TensorChunk Piece(const std::string& name, v1::DType dtype, std::vector<int64_t> shape,
                      uint64_t offset, std::string data) {
  v1::TensorChunk c;
  c.set_name(name);
  c.set_dtype(dtype);
  *c.mutable_shape() = {shape.begin(), shape.end()};
  c.set_offset(offset);
  c.set_data(std::move(data));
  return c;
}

}  // namespace

StateSplitter::StateSplitter(int world, const ShardedStateList& sharded, size_t chunk_bytes)
    : world_(world), chunk_bytes_(chunk_bytes) {
  for (const v1::ShardedState& s : sharded) sharded_[s.state_name()] = s;
}

absl::Status StateSplitter::Add(const v1::TensorChunk& c,
                                std::vector<std::vector<v1::TensorChunk>>* out) const {
  auto it = sharded_.find(c.name());
  if (it == sharded_.end()) {
    for (int r = 0; r < world_; ++r) RechunkTensor(c, chunk_bytes_, &(*out)[r]);
    return absl::OkStatus();
  }
  const v1::ShardedState& meta = it->second;
  if (c.dtype() != meta.dtype() || ShapeOf(c) != ShapeOf(meta)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "initial state: tensor '", c.name(), "' is ", TypeString(c.dtype(), ShapeOf(c)),
        ", the graph's is ", TypeString(meta.dtype(), ShapeOf(meta)),
        " (a parameter or optimizer state the ranks hold sharded)"));
  }
  absl::StatusOr<int> item_or = ItemSize(c.dtype());
  if (!item_or.ok()) return item_or.status();
  const uint64_t item = static_cast<uint64_t>(*item_or);
  const int64_t numel = Numel(meta);
  const uint64_t lo = c.offset(), hi = c.offset() + c.data().size();
  const bool last = hi == static_cast<uint64_t>(numel) * item;
  for (int r = 0; r < world_; ++r) {
    const ir::FlatShard f = ir::FlatShardOf(numel, world_, r);
    const std::vector<int64_t> shard_shape = {f.shard_numel};
    if (f.shard_numel == 0) {  // an empty tensor: one empty chunk per rank
      (*out)[r].push_back(Piece(c.name(), c.dtype(), shard_shape, 0, ""));
      continue;
    }
    const uint64_t begin = static_cast<uint64_t>(f.begin) * item,
                   end = static_cast<uint64_t>(f.end) * item;
    const uint64_t a = std::max(lo, begin), b = std::min(hi, end);
    if (a < b) {
      RechunkTensor(
          Piece(c.name(), c.dtype(), shard_shape, a - begin, c.data().substr(a - lo, b - a)),
          chunk_bytes_, &(*out)[r]);
    }
    if (last && f.real() < f.shard_numel) {
      const uint64_t pad = static_cast<uint64_t>(f.shard_numel - f.real()) * item;
      RechunkTensor(Piece(c.name(), c.dtype(), shard_shape, end - begin, std::string(pad, '\0')),
                    chunk_bytes_, &(*out)[r]);
    }
  }
  return absl::OkStatus();
}

StateGatherer::StateGatherer(int world, const ShardedStateList& sharded, size_t chunk_bytes)
    : world_(world), chunk_bytes_(chunk_bytes) {
  for (const v1::ShardedState& s : sharded) {
    Whole& w = sharded_[s.state_name()];
    w.meta = s;
    w.item = ItemSize(s.dtype()).value_or(0);  // an unknown dtype: every shard chunk is refused
    w.received.assign(world, 0);
  }
}

absl::Status StateGatherer::Add(int rank, const v1::TensorChunk& c) {
  if (rank == 0 && seen_.insert(c.name()).second) order_.push_back(c.name());
  auto it = sharded_.find(c.name());
  if (it == sharded_.end()) {
    if (rank == 0) replicated_[c.name()].push_back(c);
    return absl::OkStatus();
  }
  Whole& w = it->second;
  const int64_t numel = Numel(w.meta);
  const ir::FlatShard f = ir::FlatShardOf(numel, world_, rank);
  const std::vector<int64_t> want = {f.shard_numel};
  auto error = [&](const std::string& what) {
    return absl::DataLossError(
        absl::StrCat("the final state of rank ", rank, ": shard of '", c.name(), "' ", what));
  };
  if (c.dtype() != w.meta.dtype() || ShapeOf(c) != want) {
    return error(absl::StrCat("is ", TypeString(c.dtype(), ShapeOf(c)), ", expected ",
                              TypeString(w.meta.dtype(), want)));
  }
  if (w.item == 0) return error(absl::StrCat("has an unknown dtype ", static_cast<int>(c.dtype())));
  if (w.data.size() != static_cast<size_t>(numel) * w.item)
    w.data.assign(static_cast<size_t>(numel) * w.item, '\0');
  const uint64_t item = static_cast<uint64_t>(w.item);
  const uint64_t shard_bytes = static_cast<uint64_t>(f.shard_numel) * item;
  const uint64_t lo = c.offset(), hi = c.offset() + c.data().size();
  if (hi > shard_bytes)
    return error(absl::StrCat("has bytes up to ", hi, ", past its ", shard_bytes));
  const uint64_t real = static_cast<uint64_t>(f.real()) * item;  // the rest is padding
  if (lo < real) {
    const uint64_t b = std::min(hi, real);
    std::copy_n(c.data().data(), b - lo,
                w.data.begin() + static_cast<int64_t>(f.begin * w.item + lo));
  }
  w.received[rank] += c.data().size();
  return absl::OkStatus();
}

absl::StatusOr<StateStore::State> StateGatherer::Finish() {
  StateStore::State out;
  for (const auto& [name, w] : sharded_) {
    if (!seen_.count(name)) order_.push_back(name);  // not from rank 0: caught below
    for (int r = 0; r < world_; ++r) {
      const ir::FlatShard f = ir::FlatShardOf(Numel(w.meta), world_, r);
      const uint64_t want = static_cast<uint64_t>(f.shard_numel) * static_cast<uint64_t>(w.item);
      if (w.received[r] != want) {
        return absl::DataLossError(absl::StrCat("the final state of rank ", r, " has ",
                                                w.received[r], " of the ", want,
                                                " bytes of its shard of '", name, "'"));
      }
    }
  }
  for (const std::string& name : order_) {
    auto it = sharded_.find(name);
    if (it == sharded_.end()) {
      for (v1::TensorChunk& c : replicated_[name]) out.push_back(std::move(c));
      continue;
    }
    Whole& w = it->second;
    RechunkTensor(Piece(name, w.meta.dtype(), ShapeOf(w.meta), 0, std::move(w.data)), chunk_bytes_,
                  &out);
  }
  return out;
}

}  // namespace fxdp::server
