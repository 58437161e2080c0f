// WorkerRegistry (server/worker_registry.h) in process, over a real gRPC
// channel, with FakeWorkers: registration and refusals, heartbeats, LOST
// workers (silent or gone), subscriptions, re-attachment.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

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
  const int64_t h = server.registry().Subscribe("a", [&](const std::string& id, const v1::WorkerMessage* m) {
    (m == nullptr ? lost : messages)++;
  });
  ASSERT_NE(h, 0);
  EXPECT_TRUE(WaitUntil([&] { return messages > 0; }, 3));  // its heartbeats
  a->Kill();
  ASSERT_TRUE(WaitUntil([&] { return Info(server, "a").state() == v1::WORKER_STATE_LOST; }, 1));
  EXPECT_THAT(Info(server, "a").lost_reason(), HasSubstr("stream"));
  EXPECT_TRUE(WaitUntil([&] { return lost == 1; }, 1));
  EXPECT_EQ(server.registry().Subscribe("a", [](const std::string&, const v1::WorkerMessage*) {}), 0);
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
  v1::WorkerMessage m;
  m.mutable_register_worker()->set_protocol_version(v1::WORKER_PROTOCOL_VERSION_1);
  m.mutable_register_worker()->set_worker_id("w");
  ASSERT_TRUE(stream->Write(m));
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
