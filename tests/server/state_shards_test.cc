// FULLY_SHARD's state split and reassembly in the server (server/jobs/state_shards.h):
// every rank gets exactly analysis/ir/flat_shard.h's flat shard (zero padded),
// whatever the chunking of the client's tensors, and the ranks' shards come
// back as the whole tensors; replicated tensors go to every rank as they are
// and come back from rank 0. Bad shapes and short shards are errors naming the
// tensor and rank.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "analysis/ir/flat_shard.h"
#include "server/jobs/raw_tensors.h"
#include "server/jobs/state_shards.h"
#include "tests/test_util.h"

namespace fxdp::testing {
namespace {

using server::ShardedStateList;
using server::StateGatherer;
using server::StateSplitter;
using ::testing::HasSubstr;

std::string Floats(int64_t n, float start) {
  std::string s(static_cast<size_t>(n) * 4, '\0');
  for (int64_t i = 0; i < n; ++i) {
    const float v = start + static_cast<float>(i);
    std::memcpy(&s[static_cast<size_t>(i) * 4], &v, 4);
  }
  return s;
}

// `data` of a tensor as chunks of `chunk` bytes (one empty chunk when empty).
std::vector<v1::TensorChunk> Chunks(const std::string& name, std::vector<int64_t> shape,
                                    const std::string& data, size_t chunk) {
  std::vector<v1::TensorChunk> out;
  size_t off = 0;
  do {
    v1::TensorChunk c;
    c.set_name(name);
    c.set_dtype(v1::FLOAT32);
    *c.mutable_shape() = {shape.begin(), shape.end()};
    c.set_offset(off);
    c.set_data(data.substr(off, chunk));
    off += c.data().size();
    out.push_back(c);
  } while (off < data.size());
  return out;
}

ShardedStateList Sharded(const std::string& name, std::vector<int64_t> shape, int world) {
  ShardedStateList l;
  v1::ShardedState* s = l.Add();
  s->set_state_name(name);
  *s->mutable_shape() = {shape.begin(), shape.end()};
  s->set_dtype(v1::FLOAT32);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  s->set_shard_numel(ir::FlatShardOf(n, world, 0).shard_numel);
  return l;
}

// Each rank's received chunks, checked against the chunking rules, as whole tensors.
std::map<std::string, server::RawTensor> Receive(const std::vector<v1::TensorChunk>& chunks) {
  server::ChunkStream stream("rank", /*keep_data=*/true);
  for (const v1::TensorChunk& c : chunks) EXPECT_TRUE(stream.Add(c).ok());
  EXPECT_FALSE(stream.pending());
  std::map<std::string, server::RawTensor> out;
  for (server::RawTensor& t : stream.Take()) out[t.name] = std::move(t);
  return out;
}

TEST(StateShards, EveryRankGetsItsPaddedFlatShardAndTheWholeComesBack) {
  for (int world : {1, 2, 3, 4}) {
    for (std::vector<int64_t> shape :
         std::vector<std::vector<int64_t>>{{0}, {1}, {5}, {3, 4}, {7, 3}, {2, 2, 2}}) {
      for (size_t chunk : {1, 3, 4, 8, 1000}) {
        SCOPED_TRACE(::testing::Message()
                     << "world " << world << " shape[0] " << shape[0] << " chunk " << chunk);
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        const std::string w = Floats(n, 1.0f), bias = Floats(3, 100.0f);
        const ShardedStateList sharded = Sharded("w", shape, world);
        StateSplitter split(world, sharded, /*chunk_bytes=*/5);
        std::vector<std::vector<v1::TensorChunk>> to(world);
        for (const auto& c : Chunks("w", shape, w, chunk)) ASSERT_TRUE(split.Add(c, &to).ok());
        for (const auto& c : Chunks("b", {3}, bias, chunk)) ASSERT_TRUE(split.Add(c, &to).ok());
        StateGatherer gather(world, sharded, /*chunk_bytes=*/7);
        for (int r = 0; r < world; ++r) {
          for (const v1::TensorChunk& c : to[r]) EXPECT_LE(c.data().size(), 5u);
          std::map<std::string, server::RawTensor> got = Receive(to[r]);
          const ir::FlatShard f = ir::FlatShardOf(n, world, r);
          ASSERT_EQ(got["w"].shape, std::vector<int64_t>{f.shard_numel});
          // the real elements, then zeros
          std::string want =
              w.substr(static_cast<size_t>(f.begin) * 4, static_cast<size_t>(f.real()) * 4);
          want.resize(static_cast<size_t>(f.shard_numel) * 4, '\0');
          EXPECT_EQ(got["w"].data, want) << "rank " << r;
          EXPECT_EQ(got["b"].data, bias);
          EXPECT_EQ(got["b"].shape, std::vector<int64_t>{3});
          // the rank sends its state back (another chunking; the rank's own order)
          for (const auto& c : Chunks("w", {f.shard_numel}, got["w"].data, 6))
            ASSERT_TRUE(gather.Add(r, c).ok());
          for (const auto& c : Chunks("b", {3}, got["b"].data, 6))
            ASSERT_TRUE(gather.Add(r, c).ok());
        }
        absl::StatusOr<server::StateStore::State> whole = gather.Finish();
        ASSERT_TRUE(whole.ok()) << whole.status();
        for (const v1::TensorChunk& c : *whole) EXPECT_LE(c.data().size(), 7u);
        std::map<std::string, server::RawTensor> back = Receive(*whole);
        EXPECT_EQ(back["w"].shape, shape);
        EXPECT_EQ(back["w"].data, w);
        EXPECT_EQ(back["b"].data, bias);
        EXPECT_EQ(whole->front().name(), "w");  // rank 0's order
      }
    }
  }
}

TEST(StateShards, AShardedTensorOfTheWrongShapeIsRefusedNamingIt) {
  const ShardedStateList sharded = Sharded("fc.weight", {4, 3}, 2);
  StateSplitter split(2, sharded, 1 << 20);
  std::vector<std::vector<v1::TensorChunk>> to(2);
  const absl::Status s = split.Add(Chunks("fc.weight", {3, 4}, Floats(12, 0), 1 << 20)[0], &to);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      std::string(s.message()),
      HasSubstr("initial state: tensor 'fc.weight' is f32[3, 4], the graph's is f32[4, 3]"));
}

TEST(StateShards, AShortOrMisshapenShardIsDataLossNamingTheRank) {
  const ShardedStateList sharded = Sharded("w", {5}, 2);  // s = 3
  {
    StateGatherer gather(2, sharded, 1 << 20);
    ASSERT_TRUE(gather.Add(0, Chunks("w", {3}, Floats(3, 0), 100)[0]).ok());
    ASSERT_TRUE(gather.Add(1, Chunks("w", {3}, Floats(2, 0), 100)[0]).ok());  // 8 of 12 bytes
    const absl::StatusOr<server::StateStore::State> r = gather.Finish();
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(std::string(r.status().message()),
                HasSubstr("the final state of rank 1 has 8 of the 12 bytes of its shard of 'w'"));
  }
  StateGatherer gather(2, sharded, 1 << 20);
  const absl::Status s = gather.Add(1, Chunks("w", {5}, Floats(5, 0), 100)[0]);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("rank 1: shard of 'w' is f32[5], expected f32[3]"));
}

}  // namespace
}  // namespace fxdp::testing
