// The job service's pure parts: JobQueue (strict FIFO, reservations),
// StateStore (bounded final states), and raw tensors on the wire
// (ChunkStream's checks, SliceDim, RechunkTensor), and the compile cache.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "proto/fxdp/v1/compile.pb.h"
#include "server/compile/compile_cache.h"
#include "server/compile/compile_service.h"
#include "server/jobs/job_queue.h"
#include "server/jobs/raw_tensors.h"
#include "server/jobs/state_store.h"
#include "tests/test_util.h"

namespace fxdp::server {
namespace {

using ::fxdp::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(CompileCache, KeysBytesAsTheirMessageAndEvictsLeastRecentlyUsed) {
  // The key of serialized bytes, however chunked, equals the key of the message.
  v1::AnalyzeRequest req;
  req.set_world_size(3);
  req.mutable_graph()->add_nodes()->set_name("x");
  const std::string bytes = req.SerializeAsString();
  const absl::string_view all(bytes);
  const absl::string_view parts[] = {all.substr(0, 3), all.substr(3)};
  EXPECT_EQ(CompileCacheKeyOfBytes("Analyze", parts), CompileCacheKey("Analyze", req));
  EXPECT_NE(CompileCacheKey("Expand", req), CompileCacheKey("Analyze", req));

  CompileCache cache(CompileCacheOptions{/*max_entries=*/2, /*max_bytes=*/1 << 20});
  EXPECT_EQ(cache.Lookup("a", /*count_miss=*/false), nullptr);
  EXPECT_EQ(cache.stats().misses, 0);
  EXPECT_EQ(cache.Lookup("a"), nullptr);
  EXPECT_EQ(cache.stats().misses, 1);
  cache.Insert("a", std::make_shared<const std::string>("AA"));
  cache.Insert("b", std::make_shared<const std::string>("BBB"));
  ASSERT_NE(cache.Lookup("a"), nullptr);  // a is now the most recent
  cache.Insert("c", std::make_shared<const std::string>("C"));
  EXPECT_EQ(cache.Lookup("b", false), nullptr);
  EXPECT_EQ(*cache.Lookup("a"), "AA");
  const CompileCacheStats s = cache.stats();
  EXPECT_EQ(s.hits, 2);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.entries, 2);
  EXPECT_EQ(s.evictions, 1);
  EXPECT_EQ(s.bytes, 2 + 1 + 1 + 1);  // values plus keys
  EXPECT_FALSE(CompileCache(CompileCacheOptions{0, 1 << 20}).enabled());
}

// Issue 17: a 2^22-node graph peaked at 7.2 GB; requests are measured and
// their nodes counted on the wire before anything is parsed.
TEST(CompileLimits, CountsNodesOnTheWireAndNamesTheLimit) {
  v1::ExpandRequest req;
  req.set_world_size(2);
  for (int i = 0; i < 5; ++i) req.mutable_graph()->add_nodes()->set_name("n" + std::to_string(i));
  req.mutable_graph()->add_metadata()->set_key("k");
  std::string bytes = req.SerializeAsString();
  EXPECT_EQ(CountRequestGraphNodes(bytes), 5);
  // A graph field split in two (protobuf merges them): both parts count.
  v1::ExpandRequest more;
  more.mutable_graph()->add_nodes()->set_name("n5");
  EXPECT_EQ(CountRequestGraphNodes(bytes + more.SerializeAsString()), 6);
  EXPECT_EQ(CountRequestGraphNodes(""), 0);
  EXPECT_EQ(CountRequestGraphNodes(bytes.substr(0, bytes.size() - 1)), -1);
  EXPECT_EQ(CountRequestGraphNodes("\xff\xff\xff\xff\x0f garbage"), -1);

  const CompileLimits limits{/*max_graph_nodes=*/4, /*max_request_bytes=*/1 << 20};
  EXPECT_TRUE(CheckCompileLimits(limits, "the Expand request", 100, 4).ok());
  EXPECT_THAT(CheckCompileLimits(limits, "the Expand request", 100, 5),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "the Expand request's graph has 5 nodes, over this server's limit of 4 "
                       "(fxdp-server --max-graph-nodes)"));
  EXPECT_THAT(CheckCompileLimits(limits, "the Analyze request", 3 << 20, 1),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       "the Analyze request is 3.0 MiB (3145728 bytes), over this server's limit "
                       "of 1 MiB (fxdp-server --max-graph-mb)"));

  // Through the service, in process (a job's spec takes this path).
  CompileServiceImpl service({}, limits);
  v1::ExpandResponse resp;
  const grpc::Status st = service.Expand(nullptr, &req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(st.error_message(), ::testing::HasSubstr("graph has 5 nodes"));
}

TEST(JobQueue, StrictFifoWithReservations) {
  JobQueue q(3);
  ASSERT_TRUE(q.Push("a", 2).ok());
  ASSERT_TRUE(q.Push("b", 1).ok());
  ASSERT_TRUE(q.Push("c", 1).ok());
  EXPECT_THAT(q.Push("d", 1),
              StatusIs(absl::StatusCode::kResourceExhausted, "--max-queued-jobs is 3"));
  EXPECT_EQ(q.Position("b"), 2);
  EXPECT_EQ(q.Position("nope"), 0);
  // One idle worker: the head needs two, so nobody starts (b may not overtake).
  EXPECT_THAT(q.Take({"w0"}), IsEmpty());
  auto d = q.Take({"w0", "w1", "w2"});
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].job_id, "a");
  EXPECT_THAT(d[0].workers, ElementsAre("w0", "w1"));
  EXPECT_EQ(d[1].job_id, "b");
  EXPECT_THAT(d[1].workers, ElementsAre("w2"));
  EXPECT_EQ(q.Holder("w1"), "a");
  // Reserved workers stay taken even when the registry says IDLE.
  EXPECT_THAT(q.Take({"w0", "w1", "w2"}), IsEmpty());
  EXPECT_THAT(q.Free({"w0", "w1", "w2"}), IsEmpty());
  q.Release("w1", "b");  // not b's: no-op
  EXPECT_EQ(q.Holder("w1"), "a");
  q.Release("w1", "a");
  d = q.Take({"w0", "w1", "w2"});
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].job_id, "c");
  EXPECT_THAT(d[0].workers, ElementsAre("w1"));
  EXPECT_EQ(q.size(), 0u);
}

TEST(JobQueue, RemoveKeepsTheOrder) {
  JobQueue q(8);
  for (const char* id : {"a", "b", "c"}) ASSERT_TRUE(q.Push(id, 1).ok());
  EXPECT_TRUE(q.Remove("b"));
  EXPECT_FALSE(q.Remove("b"));
  EXPECT_THAT(q.Ids(), ElementsAre("a", "c"));
  EXPECT_EQ(q.Position("c"), 2);
}

std::shared_ptr<const StateStore::State> StateOf(size_t bytes) {
  auto s = std::make_shared<StateStore::State>(1);
  (*s)[0].set_name("w");
  (*s)[0].set_data(std::string(bytes, 'x'));
  return s;
}

TEST(StateStore, EvictsTheOldestFirst) {
  StateStore store(100);
  EXPECT_THAT(store.Put("a", StateOf(40)), IsEmpty());
  EXPECT_THAT(store.Put("b", StateOf(40)), IsEmpty());
  EXPECT_THAT(store.Put("c", StateOf(40)), ElementsAre("a"));
  EXPECT_EQ(store.Get("a"), nullptr);
  EXPECT_NE(store.Get("b"), nullptr);
  EXPECT_EQ(store.bytes(), 80u);
  EXPECT_THAT(store.Put("d", StateOf(90)), ElementsAre("b", "c"));
  EXPECT_THAT(store.Put("huge", StateOf(101)), ElementsAre("huge"));  // never kept
  EXPECT_EQ(store.Get("huge"), nullptr);
  EXPECT_NE(store.Get("d"), nullptr);
  store.Erase("d");
  EXPECT_EQ(store.bytes(), 0u);
  EXPECT_EQ(store.size(), 0u);
}

v1::TensorChunk Chunk(const std::string& name, std::vector<int64_t> shape, std::string data,
                      uint64_t offset = 0, v1::DType dtype = v1::FLOAT32) {
  v1::TensorChunk c;
  c.set_name(name);
  c.set_dtype(dtype);
  for (int64_t d : shape) c.add_shape(d);
  c.set_offset(offset);
  c.set_data(std::move(data));
  return c;
}

TEST(ChunkStream, AssemblesTensorsAndNamesEveryError) {
  ChunkStream s("step 1's batch", /*keep_data=*/true);
  ASSERT_TRUE(s.Add(Chunk("x", {2, 2}, std::string(6, 'a'))).ok());
  EXPECT_TRUE(s.pending());
  EXPECT_THAT(s.Add(Chunk("y", {1}, "bbbb")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "step 1's batch: tensor 'y' started before tensor 'x' was complete "
                       "(6 of 16 bytes)"));
  EXPECT_THAT(
      s.Add(Chunk("x", {2, 2}, "c", 7)),
      StatusIs(absl::StatusCode::kInvalidArgument, "tensor 'x': chunk at offset 7, expected 6"));
  EXPECT_THAT(s.Add(Chunk("x", {2, 3}, "c", 6)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "a chunk says f32[2, 3], the first said f32[2, 2]"));
  EXPECT_THAT(s.Add(Chunk("x", {2, 2}, std::string(11, 'c'), 6)),
              StatusIs(absl::StatusCode::kInvalidArgument, "runs past the tensor's 16 bytes"));
  ASSERT_TRUE(s.Add(Chunk("x", {2, 2}, std::string(10, 'c'), 6)).ok());
  EXPECT_FALSE(s.pending());
  ASSERT_TRUE(s.Add(Chunk("e", {0, 3}, "")).ok());  // an empty tensor is one empty chunk
  EXPECT_THAT(s.Add(Chunk("x", {1}, "dddd")),
              StatusIs(absl::StatusCode::kInvalidArgument, "tensor 'x': sent twice"));
  EXPECT_THAT(s.Add(Chunk("z", {-1}, "")),
              StatusIs(absl::StatusCode::kInvalidArgument, "negative dim"));
  EXPECT_THAT(s.Add(Chunk("z", {1}, "", 0, static_cast<v1::DType>(99))),
              StatusIs(absl::StatusCode::kInvalidArgument, "unknown dtype 99"));
  EXPECT_THAT(s.Add(Chunk("z", {int64_t{1} << 62, 8}, "")),
              StatusIs(absl::StatusCode::kInvalidArgument, "too large"));
  EXPECT_EQ(s.complete(), 2u);
  const std::vector<RawTensor> t = s.Take();
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].data, std::string(6, 'a') + std::string(10, 'c'));
  EXPECT_THAT(t[1].shape, ElementsAre(0, 3));
}

RawTensor Iota(std::vector<int64_t> shape) {
  RawTensor t{"t", ir::DType::kInt32, shape, ""};
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  for (int32_t i = 0; i < n; ++i) t.data.append(reinterpret_cast<const char*>(&i), 4);
  return t;
}

std::vector<int32_t> Ints(const std::string& bytes) {
  std::vector<int32_t> v(bytes.size() / 4);
  if (!v.empty())
    std::memcpy(v.data(), bytes.data(), bytes.size());  // data() may be null when empty
  return v;
}

TEST(SliceDim, SlicesAnyDimOfARowMajorTensor) {
  const RawTensor t = Iota({2, 3, 2});  // [[[0,1],[2,3],[4,5]], [[6,7],[8,9],[10,11]]]
  EXPECT_THAT(Ints(*SliceDim(t, 0, 1, 1)), ElementsAre(6, 7, 8, 9, 10, 11));
  EXPECT_THAT(Ints(*SliceDim(t, 1, 1, 2)), ElementsAre(2, 3, 4, 5, 8, 9, 10, 11));
  EXPECT_THAT(Ints(*SliceDim(t, 2, 1, 1)), ElementsAre(1, 3, 5, 7, 9, 11));
  EXPECT_THAT(Ints(*SliceDim(t, 1, 3, 0)), IsEmpty());
  EXPECT_THAT(SliceDim(t, 1, 2, 2).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "no slice [2, 4) along dim 1"));
  EXPECT_THAT(SliceDim(t, 3, 0, 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "along dim 3"));
}

// A rank's rows of a batch with micro-batches (ir::RankRows): several ranges along the batch dim,
// concatenated along it, on any dim.
TEST(SliceRows, ConcatenatesRangesAlongTheDim) {
  const RawTensor t = Iota({2, 4, 1});                               // [[0..3], [4..7]] along dim 1
  const std::vector<ir::RankSlice> rows = ir::RankRows(4, 2, 2, 1);  // rows 1 and 3
  EXPECT_THAT(Ints(*SliceRows(t, 1, rows)), ElementsAre(1, 3, 5, 7));
  const RawTensor u = Iota({4, 2});
  EXPECT_THAT(Ints(*SliceRows(u, 0, rows)), ElementsAre(2, 3, 6, 7));
  EXPECT_THAT(SliceRows(u, 0, {{0, 3, 2}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "no slice [3, 5) along dim 0"));
}

TEST(RechunkTensor, SplitsWithOffsets) {
  std::vector<v1::TensorChunk> out;
  RechunkTensor(Chunk("x", {10}, std::string(40, 'a'), 0), 16, &out);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[1].offset(), 16u);
  EXPECT_EQ(out[2].data().size(), 8u);
  EXPECT_EQ(out[2].name(), "x");
  out.clear();
  RechunkTensor(Chunk("e", {0}, ""), 16, &out);
  EXPECT_EQ(out.size(), 1u);
}

}  // namespace
}  // namespace fxdp::server
