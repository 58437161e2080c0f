// WorkerRegistry (server/workers/worker_registry.h) in process, over a real gRPC
// channel, with FakeWorkers: registration and refusals, heartbeats, LOST
// workers (silent or gone), subscriptions, re-attachment.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "grpcpp/impl/client_unary_call.h"
#include "tests/server/test_server.h"

namespace fxdp::testing {
namespace {

using ::testing::HasSubstr;

server::WorkerRegistryOptions Fast() { return server::WorkerRegistryOptions{50, 3, 60}; }

v1::WorkerInfo Info(TestServer& s, const std::string& id) {
  for (const v1::WorkerInfo& w : s.registry().List()) {
    if (w.worker_id() == id) return w;
  }
  return {};
}

// One Attach stream that sends `first` and returns the status the server ends it with.
grpc::Status AttachWith(const TestServer& s, const v1::WorkerMessage& first) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto stream = s.workers()->Attach(&ctx);
  stream->Write(first);
  stream->WritesDone();
  v1::ServerMessage m;
  while (stream->Read(&m)) {
  }
  return stream->Finish();
}

v1::WorkerMessage GoodRegister(const std::string& id) {
  v1::WorkerMessage m;
  v1::Register* r = m.mutable_register_worker();
  r->set_protocol_version(v1::WORKER_PROTOCOL_VERSION_2);
  r->set_worker_id(id);
  r->set_hostname("gpu-node-1.cluster");
  r->set_pid(4242);
  r->set_device("cuda:7");
  r->set_capacity(1);
  r->set_memory_bytes(int64_t{80} << 30);
  r->set_threads(8);
  r->set_fxdp_version("0.1.0");
  r->set_torch_version("2.13.0+cu130");
  return m;
}

// Issue 17: absurd registrations were accepted (capacity 2^31-1, memory
// 2^63-1, threads -5, cuda:999, a newline in the hostname that wrote a fake
// line into the server's log). Each is refused naming the field and value.
TEST(WorkerRegistry, RefusesRegistrationsOutOfBounds) {
  TestServer server({}, Fast());
  const std::vector<std::pair<std::function<void(v1::Register*)>, std::string>> cases = {
      {[](v1::Register* r) { r->set_capacity(INT32_MAX); },
       "Register.capacity must be in [1, 64], got 2147483647"},
      {[](v1::Register* r) { r->set_capacity(0); }, "Register.capacity must be in [1, 64], got 0"},
      {[](v1::Register* r) { r->set_memory_bytes(INT64_MAX); },
       "Register.memory_bytes must be in [0, 1125899906842624] (0: unknown), got "
       "9223372036854775807"},
      {[](v1::Register* r) { r->set_threads(-5); },
       "Register.threads must be in [0, 4096] (0: unknown), got -5"},
      {[](v1::Register* r) { r->set_device("cuda:999"); },
       "Register.device must be cpu or cuda:N with 0 <= N < 128, got 'cuda:999'"},
      {[](v1::Register* r) { r->set_device("cuda:-1"); }, "Register.device must be"},
      {[](v1::Register* r) { r->set_device("tpu"); }, "got 'tpu'"},
      {[](v1::Register* r) { r->set_hostname("evil\nfxdp-server: worker x attached"); },
       "Register.hostname must be 1 to 253 letters, digits, '-', '.' or '_', got "
       "'evil\\nfxdp-server: worker x attached'"},
      {[](v1::Register* r) { r->set_hostname(""); }, "Register.hostname must be"},
      {[](v1::Register* r) { r->set_hostname(std::string(300, 'a')); },
       "Register.hostname must be"},
      {[](v1::Register* r) { r->set_pid(-1); }, "Register.pid must be in [0, 4194304], got -1"},
      {[](v1::Register* r) { r->set_fxdp_version("0.1\n"); }, "Register.fxdp_version must be"},
      {[](v1::Register* r) { r->set_torch_version(std::string(65, 'x')); },
       "Register.torch_version must be"},
      {[](v1::Register* r) { r->set_busy_with_job_id("a b"); },
       "Register.busy_with_job_id must be"},
      {[](v1::Register* r) { r->set_worker_id("a\tb"); }, "Register.worker_id must be"},
  };
  int n = 0;
  for (const auto& [mutate, want] : cases) {
    v1::WorkerMessage m = GoodRegister("w" + std::to_string(n++));
    mutate(m.mutable_register_worker());
    EXPECT_TRUE(server::ValidateRegister(GoodRegister("ok").register_worker()).ok());
    const grpc::Status s = AttachWith(server, m);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << want;
    EXPECT_THAT(s.error_message(), HasSubstr(want));
  }
  EXPECT_TRUE(server.registry().List().empty());
  // The bounds themselves are accepted.
  v1::WorkerMessage edge = GoodRegister("edge");
  v1::Register* r = edge.mutable_register_worker();
  r->set_device("cuda:127");
  r->set_capacity(64);
  r->set_memory_bytes(int64_t{1} << 50);
  r->set_threads(4096);
  r->set_hostname(std::string(253, 'h'));
  EXPECT_TRUE(server::ValidateRegister(*r).ok()) << server::ValidateRegister(*r).error_message();
}

// The rendezvous host of a job is the server's view of rank 0's connection
// (WorkerInfo.address), not Register.hostname.
TEST(WorkerRegistry, AddressIsThePeerNotTheDeclaredHostname) {
  EXPECT_EQ(server::PeerHost("ipv4:10.1.2.3:4711"), "10.1.2.3");
  EXPECT_EQ(server::PeerHost("ipv4:127.0.0.1:4711"), "127.0.0.1");
  EXPECT_EQ(server::PeerHost("ipv4:127.3.4.5:1"), "127.0.0.1");
  EXPECT_EQ(server::PeerHost("ipv6:[::1]:4711"), "127.0.0.1");
  EXPECT_EQ(server::PeerHost("ipv6:[fe80::1]:4711"), "fe80::1");
  EXPECT_EQ(server::PeerHost("ipv6:[::ffff:10.0.0.5]:4711"), "10.0.0.5");
  EXPECT_EQ(server::PeerHost("unix:/tmp/s"), "127.0.0.1");
  EXPECT_EQ(server::PeerHost("garbage"), "");
  TestServer server({}, Fast());
  FakeWorker a(server.address(), "a");  // declares hostname "fake"
  ASSERT_TRUE(a.WaitRegistered());
  EXPECT_EQ(Info(server, "a").hostname(), "fake");
  EXPECT_EQ(Info(server, "a").address(), "127.0.0.1");
}

// Issue 17: every silent Attach held a server thread (19 -> 2,021 threads
// with 2,000 streams). Streams are capped, and one that does not register in
// time is ended.
TEST(WorkerRegistry, CapsStreamsAndEndsSilentAttaches) {
  server::WorkerRegistryOptions o = Fast();
  o.max_streams = 2;
  o.register_deadline_s = 0.3;
  TestServer server({}, o);
  std::vector<std::unique_ptr<grpc::ClientContext>> ctxs;
  std::vector<std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::ServerMessage>>>
      silent;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 2; ++i) {
    ctxs.push_back(std::make_unique<grpc::ClientContext>());
    silent.push_back(server.workers()->Attach(ctxs.back().get()));
  }
  // Both are in their handlers once a third one is refused.
  grpc::Status third;
  ASSERT_TRUE(WaitUntil(
      [&] {
        third = AttachWith(server, GoodRegister("third"));
        return third.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
      },
      2))
      << third.error_message();
  EXPECT_THAT(third.error_message(),
              HasSubstr("at most 2 Attach streams at once (fxdp-server --max-worker-streams)"));
  for (auto& st : silent) {
    v1::ServerMessage m;
    EXPECT_FALSE(st->Read(&m));
    EXPECT_FALSE(st->Finish().ok());
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 3);
  // The slots are free again once the handlers have returned: the client
  // sees the watchdog's cancel before the handler gives its slot back (CI run
  // 33 refused the next worker in that gap).
  EXPECT_TRUE(WaitUntil([&] { return server.registry().OpenStreams() == 0; }, 2))
      << server.registry().OpenStreams() << " Attach streams still open";
  FakeWorker a(server.address(), "a");
  EXPECT_TRUE(a.WaitRegistered());
}

// Issue 17: bytes that are not a request were INTERNAL (gRPC's default).
TEST(WorkerRegistry, GarbageListWorkersIsInvalidArgument) {
  TestServer server({}, Fast());
  const std::string garbage = "\xff\xff\xff\xff\x0f not a request";
  grpc::Slice slice(garbage);
  grpc::ByteBuffer request(&slice, 1), response;
  grpc::ClientContext ctx;
  const grpc::Status s = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      server.channel().get(),
      grpc::internal::RpcMethod("/fxdp.v1.WorkerService/ListWorkers",
                                grpc::internal::RpcMethod::NORMAL_RPC),
      &ctx, request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(),
              HasSubstr("the request to /fxdp.v1.WorkerService/ListWorkers is not a valid"));
}

TEST(WorkerRegistry, RegistersAndListsWorkers) {
  TestServer server({}, Fast());
  FakeWorker a(server.address(), "a"), b(server.address(), "b");
  ASSERT_TRUE(a.WaitRegistered());
  ASSERT_TRUE(b.WaitRegistered());
  grpc::ClientContext ctx;
  v1::ListWorkersResponse list;
  ASSERT_TRUE(server.workers()->ListWorkers(&ctx, v1::ListWorkersRequest(), &list).ok());
  ASSERT_EQ(list.workers_size(), 2);
  EXPECT_EQ(list.workers(0).worker_id(), "a");
  EXPECT_EQ(list.workers(0).state(), v1::WORKER_STATE_IDLE);
  EXPECT_EQ(list.workers(0).device(), "cpu");
  EXPECT_EQ(list.workers(0).hostname(), "fake");
  EXPECT_EQ(list.workers(0).capacity(), 1);
  EXPECT_THAT(server.registry().IdleWorkers(), ::testing::ElementsAre("a", "b"));
}

TEST(WorkerRegistry, RefusesDuplicatesBadFirstMessagesAndOtherProtocols) {
  TestServer server({}, Fast());
  FakeWorker a(server.address(), "a");
  ASSERT_TRUE(a.WaitRegistered());
  FakeWorker again(server.address(), "a");
  EXPECT_FALSE(again.WaitRegistered());
  EXPECT_EQ(again.status().error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(again.status().error_message(), HasSubstr("worker id 'a' is attached already"));

  v1::WorkerMessage hb;
  hb.mutable_heartbeat()->set_state(v1::WORKER_STATE_IDLE);
  const grpc::Status s = AttachWith(server, hb);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("must be register_worker"));

  v1::WorkerMessage old;
  old.mutable_register_worker()->set_worker_id("old");
  const grpc::Status o = AttachWith(server, old);
  EXPECT_EQ(o.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(o.error_message(), HasSubstr("protocol version 0 is not supported"));
  // A version-1 worker does not know LoadGraph (a job of several shapes).
  old.mutable_register_worker()->set_protocol_version(v1::WORKER_PROTOCOL_VERSION_1);
  const grpc::Status v1_worker = AttachWith(server, old);
  EXPECT_EQ(v1_worker.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(v1_worker.error_message(),
              HasSubstr("protocol version 1 is not supported (this server speaks 2)"));
  EXPECT_EQ(server.registry().List().size(), 1u);  // a only; a stays IDLE
  EXPECT_EQ(Info(server, "a").state(), v1::WORKER_STATE_IDLE);
}

TEST(WorkerRegistry, SilentWorkerIsLostAndItsStreamEnded) {
  TestServer server({}, Fast());
  FakeWorker a(server.address(), "a");
  ASSERT_TRUE(a.WaitRegistered());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // heartbeats keep it attached
  EXPECT_EQ(Info(server, "a").state(), v1::WORKER_STATE_IDLE);
  a.StopHeartbeats();
  ASSERT_TRUE(WaitUntil([&] { return Info(server, "a").state() == v1::WORKER_STATE_LOST; }, 2));
  EXPECT_THAT(Info(server, "a").lost_reason(), HasSubstr("no heartbeat for"));
  EXPECT_TRUE(WaitUntil([&] { return a.ended(); }, 2));
  EXPECT_TRUE(server.registry().IdleWorkers().empty());
  EXPECT_FALSE(server.registry().Send("a", v1::ServerMessage()));
}

TEST(WorkerRegistry, DeadWorkerIsLostAtOnceAndMayReattach) {
  TestServer server({}, server::WorkerRegistryOptions{1000, 3, 60});  // heartbeats play no part
  auto a = std::make_unique<FakeWorker>(server.address(), "a");
  ASSERT_TRUE(a->WaitRegistered());
  std::atomic<int> messages{0}, lost{0};
  const int64_t h =
      server.registry().Subscribe("a", [&](const std::string& id, const v1::WorkerMessage* m) {
        (m == nullptr ? lost : messages)++;
      });
  ASSERT_NE(h, 0);
  EXPECT_TRUE(WaitUntil([&] { return messages > 0; }, 3));  // its heartbeats
  a->Kill();
  ASSERT_TRUE(WaitUntil([&] { return Info(server, "a").state() == v1::WORKER_STATE_LOST; }, 1));
  EXPECT_THAT(Info(server, "a").lost_reason(), HasSubstr("stream"));
  EXPECT_TRUE(WaitUntil([&] { return lost == 1; }, 1));
  EXPECT_EQ(server.registry().Subscribe("a", [](const std::string&, const v1::WorkerMessage*) {}),
            0);
  server.registry().Unsubscribe(h);
  a.reset();
  FakeWorker again(server.address(), "a");  // replaces the LOST entry
  ASSERT_TRUE(again.WaitRegistered());
  EXPECT_EQ(Info(server, "a").state(), v1::WORKER_STATE_IDLE);
}

TEST(WorkerRegistry, HeartbeatsSayBusyAndJobEndedMakesTheWorkerIdleAtOnce) {
  TestServer server({}, server::WorkerRegistryOptions{1000, 3, 60});
  FakeWorker a(server.address(), "a", /*heartbeat_ms=*/20);
  ASSERT_TRUE(a.WaitRegistered());
  v1::ServerMessage assign;
  assign.mutable_assign_job()->set_job_id("j");
  assign.mutable_assign_job()->set_world_size(1);
  ASSERT_TRUE(server.registry().Send("a", assign));
  ASSERT_TRUE(WaitUntil([&] { return Info(server, "a").state() == v1::WORKER_STATE_BUSY; }));
  EXPECT_EQ(Info(server, "a").job_id(), "j");
  EXPECT_TRUE(server.registry().IdleWorkers().empty());
  a.StopHeartbeats();  // from here on only JobEnded can say it is idle
  v1::ServerMessage state;
  state.mutable_state_chunk()->set_job_id("j");
  state.mutable_state_chunk()->set_last(true);
  ASSERT_TRUE(server.registry().Send("a", state));
  v1::ServerMessage fetch;
  fetch.mutable_fetch_state()->set_job_id("j");
  fetch.mutable_fetch_state()->set_end_job(true);
  ASSERT_TRUE(server.registry().Send("a", fetch));
  EXPECT_TRUE(WaitUntil([&] { return Info(server, "a").state() == v1::WORKER_STATE_IDLE; }, 1));
  EXPECT_EQ(Info(server, "a").job_id(), "");
}

// ListWorkers is current without waiting for a heartbeat: BUSY with the job
// from the moment AssignJob is written, the step from each StepResult; a
// heartbeat the worker sent before it saw the assignment (IDLE) is not taken
// as the truth, one sent after it is.
TEST(WorkerRegistry, AssignedWorkerIsBusyAtOnceAndItsStepFollowsStepResults) {
  TestServer server({}, server::WorkerRegistryOptions{1000, 3, 60});
  grpc::ClientContext ctx;
  auto stream = server.workers()->Attach(&ctx);
  ASSERT_TRUE(stream->Write(GoodRegister("w")));
  v1::ServerMessage in;
  ASSERT_TRUE(stream->Read(&in));
  ASSERT_TRUE(in.has_registered());
  auto heartbeat = [&](v1::WorkerState st, const std::string& job, int64_t step) {
    v1::WorkerMessage h;
    h.mutable_heartbeat()->set_state(st);
    h.mutable_heartbeat()->set_job_id(job);
    h.mutable_heartbeat()->set_step(step);
    ASSERT_TRUE(stream->Write(h));
  };
  auto step_result = [&](int64_t step) {
    v1::WorkerMessage r;
    r.mutable_step_result()->set_job_id("j");
    r.mutable_step_result()->set_step(step);
    ASSERT_TRUE(stream->Write(r));
    ASSERT_TRUE(WaitUntil([&] { return Info(server, "w").step() == step; }));
  };
  heartbeat(v1::WORKER_STATE_IDLE, "", 0);

  v1::ServerMessage assign;
  assign.mutable_assign_job()->set_job_id("j");
  assign.mutable_assign_job()->set_world_size(1);
  ASSERT_TRUE(server.registry().Send("w", assign));
  v1::WorkerInfo w = Info(server, "w");  // no waiting
  EXPECT_EQ(w.state(), v1::WORKER_STATE_BUSY);
  EXPECT_EQ(w.job_id(), "j");
  EXPECT_EQ(w.step(), 0);
  EXPECT_TRUE(server.registry().IdleWorkers().empty());

  heartbeat(v1::WORKER_STATE_IDLE, "", 0);  // sent before the worker read AssignJob
  step_result(1);                           // read after that heartbeat, same stream
  EXPECT_EQ(Info(server, "w").state(), v1::WORKER_STATE_BUSY);
  EXPECT_EQ(Info(server, "w").job_id(), "j");

  heartbeat(v1::WORKER_STATE_BUSY, "j", 0);  // older than StepResult 1: the step stays
  step_result(2);
  EXPECT_EQ(Info(server, "w").step(), 2);

  v1::WorkerMessage ended;
  ended.mutable_job_ended()->set_job_id("j");
  ASSERT_TRUE(stream->Write(ended));
  ASSERT_TRUE(WaitUntil([&] { return Info(server, "w").state() == v1::WORKER_STATE_IDLE; }));
  EXPECT_EQ(Info(server, "w").job_id(), "");
  EXPECT_EQ(Info(server, "w").step(), 0);
  stream->WritesDone();
  ctx.TryCancel();
}

}  // namespace
}  // namespace fxdp::testing
