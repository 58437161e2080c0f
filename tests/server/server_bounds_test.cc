// Issue 25: every per-request cost is bounded before the work starts. In
// process, over a real gRPC channel, with fake workers: FetchState's chunk
// size clamped and its calls bounded (and cancelled when their client takes
// nothing), the world size and the rank graphs of an Expand or a job bounded
// before anything is expanded, a job for more ranks than workers refused
// before its graph is expanded.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "analysis/ir/proto_codec.h"
#include "analysis/ir/text.h"
#include "tests/server/job_client.h"
#include "tests/server/mlp_job.h"
#include "tests/server/test_server.h"
#include "tests/test_util.h"

namespace fxdp::testing {
namespace {

using ::testing::HasSubstr;

// "big": f32[524288], 2 MiB (the fake worker sends each tensor of its state
// in one message, under gRPC's default 4 MiB limit).
constexpr int64_t kBigNumel = int64_t{1} << 19;

// The MLP job with a 2 MiB buffer in its state.
JobArgs BigStateJob() {
  JobArgs a = Args(1, 1);
  a.edit_spec = [](v1::JobSpec& spec) {
    const std::string text = absl::StrReplaceAll(
        ReadTestData("mlp_sgd.txt"),
        {{"  %x: f32[8, 4]", absl::StrCat("  %big: f32[", kBigNumel,
                                          "] = placeholder() {role=BUFFER, state=\"big\"}\n"
                                          "  %x: f32[8, 4]")}});
    *spec.mutable_graph() = ir::EncodeGraph(ValueOrDie(ir::ParseGraphText(text)));
  };
  return a;
}

std::vector<v1::SubmitJobRequest> BigStateRequests() {
  std::vector<v1::SubmitJobRequest> reqs = Requests(BigStateJob());
  reqs[0].mutable_spec()->set_num_state_tensors(3);
  v1::SubmitJobRequest big;
  *big.mutable_state() = F32("big", {kBigNumel}, 0);
  reqs.insert(reqs.begin() + 1, big);
  return reqs;
}

// A channel whose HTTP/2 window stays 64 KiB until the client reads (no BDP
// growth): a client that reads nothing holds the server's writes.
std::shared_ptr<grpc::Channel> SmallWindowChannel(const TestServer& s) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 10);
  args.SetInt("grpc.use_local_subchannel_pool", 1);  // its own connection
  return grpc::CreateCustomChannel(s.address(), grpc::InsecureChannelCredentials(), args);
}

// A FetchState call that reads only when told.
struct OpenFetch {
  OpenFetch(const std::shared_ptr<grpc::Channel>& channel, const std::string& id,
            uint32_t chunk_bytes)
      : stub(v1::JobService::NewStub(channel)) {
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::FetchJobStateRequest req;
    req.set_job_id(id);
    req.set_chunk_bytes(chunk_bytes);
    reader = stub->FetchState(&ctx, req);
  }
  std::unique_ptr<v1::JobService::Stub> stub;
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReader<v1::StateChunk>> reader;
};

// 25.4: chunk_bytes = 1 sent a 16 MiB state as 16.8M messages (3.4 GB of
// server memory); the size asked for is clamped to [64 KiB, 4 MiB].
TEST(ServerBounds, FetchStateChunkSizeIsClamped) {
  TestServer server(FastOptions());
  auto workers = Workers(server, 1);
  std::vector<v1::JobEvent> ev;
  ASSERT_TRUE(Submission(server, BigStateRequests()).Finish(&ev).ok());
  const std::string id = ev.at(0).job_id();
  const std::string big = F32("big", {kBigNumel}, 0).data();
  for (const uint32_t asked : {1u, 4095u, 0xffffffffu}) {
    OpenFetch f(server.channel(), id, asked);
    std::map<std::string, std::string> got;
    std::vector<size_t> sizes;  // of "big"'s chunks
    v1::StateChunk c;
    while (f.reader->Read(&c)) {
      got[c.tensor().name()] += c.tensor().data();
      if (c.tensor().name() == "big") sizes.push_back(c.tensor().data().size());
      ASSERT_LT(sizes.size(), 1000u)
          << "chunk_bytes " << asked << ": chunks of " << sizes.front() << " bytes";
    }
    ASSERT_TRUE(f.reader->Finish().ok());
    // The kept state holds "big" in one 2 MiB piece, under the ceiling.
    const size_t want =
        asked < server::kMinFetchChunkBytes ? server::kMinFetchChunkBytes : big.size();
    EXPECT_EQ(sizes.size(), big.size() / want) << "chunk_bytes " << asked;
    EXPECT_EQ(sizes.front(), want);
    EXPECT_TRUE(got.at("big") == big);
  }
}

// 25.4: every FetchState call held the state's chunks queued for a client
// that did not read; now one chunk each, and at most --max-fetch-streams
// calls (RESOURCE_EXHAUSTED beyond); a call whose client takes nothing for
// --client-idle-s is cancelled and gives its slot back.
TEST(ServerBounds, FetchStateCallsAreBoundedAndSilentOnesCancelled) {
  server::JobServiceOptions o = FastOptions();
  o.max_fetch_streams = 2;
  o.client_idle_s = 1;
  TestServer server(o);
  auto workers = Workers(server, 1);
  std::vector<v1::JobEvent> ev;
  ASSERT_TRUE(Submission(server, BigStateRequests()).Finish(&ev).ok());
  const std::string id = ev.at(0).job_id();
  std::vector<std::unique_ptr<OpenFetch>> silent;
  for (int i = 0; i < 2; ++i) {
    silent.push_back(std::make_unique<OpenFetch>(SmallWindowChannel(server), id, 64 << 10));
    v1::StateChunk c;
    ASSERT_TRUE(silent.back()->reader->Read(&c));  // the call is running on the server
  }
  OpenFetch third(server.channel(), id, 0);
  v1::StateChunk c;
  EXPECT_FALSE(third.reader->Read(&c));
  const grpc::Status refused = third.reader->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr("this server takes at most 2 FetchState calls at "
                                                 "once (fxdp-server --max-fetch-streams)"));
  // The silent calls read nothing more: after --client-idle-s the server
  // cancels them and their slots are free for another fetch.
  std::map<std::string, std::string> state;
  EXPECT_TRUE(WaitUntil(
      [&] {
        state.clear();
        return FetchState(server, id, &state).ok();
      },
      30));
  EXPECT_EQ(state.at("big").size(), size_t{4} * kBigNumel);
  for (auto& f : silent) {
    while (f->reader->Read(&c)) {
    }
    const grpc::Status s = f->reader->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::CANCELLED) << s.error_message();
  }
}

// 25.5: an Expand's world size is bounded before the graph is decoded.
TEST(ServerBounds, ExpandWorldSizeIsBoundedBeforeAnythingIsComputed) {
  TestServer server(FastOptions());
  auto stub = v1::CompileService::NewStub(server.channel());
  v1::ExpandRequest req;
  // A batch of 65536 that 2000 ranks split unevenly: 2000 rank graphs before.
  const std::string text = absl::StrReplaceAll(
      ReadTestData("mlp_sgd.txt"), {{"[8, ", "[65536, "},
                                    {"[3, 8]", "[3, 65536]"},
                                    {"div.Scalar(%expand, 24)", "div.Scalar(%expand, 196608)"}});
  *req.mutable_graph() = ir::EncodeGraph(ValueOrDie(ir::ParseGraphText(text)));
  req.set_world_size(2000);
  grpc::ClientContext ctx;
  v1::ExpandResponse resp;
  const grpc::Status s = stub->Expand(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_EQ(s.error_message(),
            "world_size 2000 is over this server's limit of 1024 (fxdp-server --max-world-size)");
}

// 25.5: the rank graphs an Expand would build (one, or one per rank when the
// ranks differ) against --max-expanded-nodes, before the first is built.
TEST(ServerBounds, ExpandRankGraphsAreBoundedBeforeTheyAreBuilt) {
  server::CompileLimits limits;
  const int64_t nodes = MlpGraph().nodes_size();
  limits.max_expanded_nodes = 2 * nodes;
  TestServer server(FastOptions(), {}, nullptr, limits);
  auto stub = v1::CompileService::NewStub(server.channel());
  auto expand = [&](int world) {
    v1::ExpandRequest req;
    *req.mutable_graph() = MlpGraph();
    req.set_world_size(world);
    grpc::ClientContext ctx;
    v1::ExpandResponse resp;
    return stub->Expand(&ctx, req, &resp);
  };
  EXPECT_TRUE(expand(4).ok());       // 8 samples over 4 ranks: one graph for all
  const grpc::Status s = expand(3);  // 3, 3, 2: three graphs
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(),
              HasSubstr(absl::StrCat(
                  "would build 3 rank graphs (one graph per rank: the ranks' graphs differ (the "
                  "batch splits unevenly over 3 ranks, or values are sliced per rank)) of the ",
                  nodes, "-node graph: ", 3 * nodes, " nodes, over this server's limit of ",
                  2 * nodes, " (fxdp-server --max-expanded-nodes)")));
  // A job's expansion is bounded the same way.
  auto workers = Workers(server, 3);
  const grpc::Status job = Submission(server, Args(3, 1)).Finish();
  EXPECT_EQ(job.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << job.error_message();
  EXPECT_THAT(job.error_message(),
              HasSubstr("expanding the graph for 3 ranks: the expansion for world_size 3 would "
                        "build 3 rank graphs"));
}

// 25.5: a Submit for more ranks than are registered (once the grace period
// is over) is refused before its graph is expanded, not after.
TEST(ServerBounds, MoreRanksThanWorkersIsRefusedBeforeTheExpansion) {
  server::JobServiceOptions o = FastOptions();
  o.queue_grace_s = 1e-9;  // over at once
  TestServer server(o);
  auto workers = Workers(server, 2);
  const grpc::Status s = Submission(server, Args(5, 1)).Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_THAT(s.error_message(),
              HasSubstr("JobSpec.world_size 5 exceeds the 2 workers registered"));
  EXPECT_EQ(server.cache_stats().misses, 0) << "the graph was expanded before the job was refused";
}

}  // namespace
}  // namespace fxdp::testing
