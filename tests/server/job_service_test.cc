// JobService (server/jobs/job_service.h) in process, over a real gRPC channel,
// with FakeWorkers (tests/server/test_server.h) as the workers: streamed
// submission, per-rank batch shards, FIFO queueing, cancellation, a full
// queue, malformed submissions, lost and failing ranks, data_paths jobs,
// open-ended jobs, final-state eviction and the finished-job history.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "analysis/ir/proto_codec.h"
#include "analysis/ir/text.h"
#include "tests/server/job_client.h"
#include "tests/server/mlp_job.h"
#include "tests/server/test_server.h"
#include "tests/test_util.h"

namespace fxdp::testing {
namespace {

using ::testing::HasSubstr;

TEST(JobService, StreamedJobGivesEachRankItsShard) {
  server::JobServiceOptions o = FastOptions();
  o.chunk_bytes = 40;
  TestServer server(o);
  auto workers = Workers(server, 3);
  Submission job(server, Args(3, 2));
  std::vector<v1::JobEvent> ev;
  ASSERT_TRUE(job.Finish(&ev).ok());
  ASSERT_EQ(ev.size(), 5u);
  EXPECT_EQ(ev[0].state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(ev[0].queue_position(), 0);  // started at once
  EXPECT_EQ(ev[1].state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(ev[1].workers_size(), 3);
  EXPECT_EQ(ev[2].step(), 1);
  EXPECT_EQ(ev[2].loss(), 1.0);
  EXPECT_THAT(ev[2].local_losses(), ::testing::ElementsAre(0.0, 1.0, 2.0));
  EXPECT_EQ(ev[3].step(), 2);
  EXPECT_EQ(ev[4].state(), v1::JOB_STATE_SUCCEEDED);

  const int64_t starts[] = {0, 3, 6}, sizes[] = {3, 3, 2};  // 8 samples on 3 ranks
  std::vector<v1::TensorChunk> state = State();
  const std::string weight = state[0].data() + state[1].data();
  for (const auto& w : workers) {
    const auto jobs = w->jobs();
    ASSERT_EQ(jobs.size(), 1u) << w->id();
    const auto& rec = jobs[0];
    const int r = rec.assign.rank();
    EXPECT_TRUE(rec.assign.batches_sharded());
    // Issue 17: the ranks rendezvous at rank 0's address as the server sees its
    // connection (loopback here), never at the hostname it declared ("fake").
    EXPECT_EQ(rec.assign.rendezvous_host(), "127.0.0.1");
    EXPECT_EQ(rec.state.at("fc.weight").data, weight);
    EXPECT_EQ(rec.state.at("fc.bias").data, state[2].data());
    EXPECT_LE(rec.max_chunk_bytes, 40u);
    for (int64_t step = 1; step <= 2; ++step) {
      const auto& b = rec.batches.at(step);
      EXPECT_GT(rec.batch_messages.at(step), 1);  // split to stay under chunk_bytes
      for (const auto& global : MlpBatch(step)) {
        const auto& got = b.at(global.name());
        const int64_t cols = global.shape(1);
        EXPECT_THAT(got.shape, ::testing::ElementsAre(sizes[r], cols)) << global.name();
        EXPECT_EQ(got.data, global.data().substr(starts[r] * cols * 4, sizes[r] * cols * 4))
            << "rank " << r << " " << global.name() << " step " << step;
      }
    }
  }
  std::map<std::string, std::string> final_state;
  ASSERT_TRUE(FetchState(server, ev[0].job_id(), &final_state, 16).ok());
  EXPECT_EQ(final_state.at("fc.weight"), weight);
  const v1::JobInfo info = GetJob(server, ev[0].job_id());
  EXPECT_EQ(info.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_TRUE(info.has_state());
  EXPECT_THAT(info.losses(), ::testing::ElementsAre(1.0, 2.0));
}

TEST(JobService, FifoDispatchNeverLetsASmallerJobOvertake) {
  TestServer server(FastOptions());
  auto workers = Workers(server, 2);
  for (auto& w : workers) w->Hold();
  Submission a(server, Args(1, 1));
  EXPECT_EQ(a.Next().state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(a.Next().state(), v1::JOB_STATE_RUNNING);  // one worker busy, one idle
  Submission b(server, Args(2, 1));
  const v1::JobEvent eb = b.Next();
  EXPECT_EQ(eb.queue_position(), 1);
  EXPECT_THAT(eb.message(), HasSubstr("waiting for 2 idle workers; 2 registered, 1 idle"));
  Submission c(server, Args(1, 1));
  const v1::JobEvent ec = c.Next();
  EXPECT_EQ(ec.queue_position(), 2);
  EXPECT_THAT(ec.message(), HasSubstr("1 job ahead in the queue"));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(GetJob(server, ec.job_id()).state(),
            v1::JOB_STATE_QUEUED);  // the idle worker waits for b
  EXPECT_EQ(GetJob(server, ec.job_id()).queue_position(), 2);
  for (auto& w : workers) w->Release();
  EXPECT_TRUE(a.Finish().ok());
  EXPECT_TRUE(b.Finish().ok());
  EXPECT_TRUE(c.Finish().ok());
  const v1::JobInfo ib = GetJob(server, eb.job_id()), ic = GetJob(server, ec.job_id());
  EXPECT_EQ(ib.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(ic.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_GE(ic.started_unix_ms(), ib.ended_unix_ms());
}

TEST(JobService, CancelQueuedJobsAndRunningOnes) {
  TestServer server(FastOptions());
  auto workers = Workers(server, 1);
  workers[0]->Hold();
  Submission running(server, Args(1, 1));
  const std::string running_id = running.Next().job_id();
  EXPECT_EQ(running.Next().state(), v1::JOB_STATE_RUNNING);

  Submission queued(server, Args(1, 1));
  const std::string queued_id = queued.Next().job_id();
  const v1::JobInfo info = CancelJob(server, queued_id);
  EXPECT_EQ(info.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_THAT(info.error(), HasSubstr("cancelled while queued: CancelJob: test"));
  std::vector<v1::JobEvent> rest;
  const grpc::Status s = queued.Finish(&rest);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::CANCELLED);
  ASSERT_FALSE(rest.empty());
  EXPECT_EQ(rest.back().state(), v1::JOB_STATE_CANCELLED);

  Submission gone(server, Args(1, 1));
  const std::string gone_id = gone.Next().job_id();
  gone.Cancel();  // the client goes away
  EXPECT_TRUE(
      WaitUntil([&] { return GetJob(server, gone_id).state() == v1::JOB_STATE_CANCELLED; }));
  EXPECT_THAT(GetJob(server, gone_id).error(), HasSubstr("the client of Submit went away"));

  EXPECT_EQ(CancelJob(server, running_id).state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(running.Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(
      WaitUntil([&] { return !workers[0]->jobs().empty() && workers[0]->jobs()[0].cancelled; }));
  std::map<std::string, std::string> state;
  EXPECT_EQ(FetchState(server, running_id, &state).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST(JobService, CancelWhileWaitingForTheClientsNextBatch) {
  TestServer server(FastOptions());
  auto workers = Workers(server, 1);
  Submission slow(server, Requests(Args(1, 3, 1)), /*close=*/false);  // step 2's batch never comes
  const v1::JobEvent e = slow.UntilStep(1);
  ASSERT_EQ(e.step(), 1) << e.DebugString();
  const auto t0 = std::chrono::steady_clock::now();
  const v1::JobInfo info = CancelJob(server, e.job_id());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  EXPECT_EQ(info.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_THAT(info.error(), HasSubstr("cancelled: CancelJob: test"));
  EXPECT_EQ(slow.Finish().error_code(), grpc::StatusCode::CANCELLED);
  // Its rank gave the state after step 1 and ended (issue 26): kept, fetchable.
  EXPECT_THAT(info.error(), HasSubstr("its state after step 1 is kept"));
  EXPECT_EQ(info.checkpoint_step(), 1);
  EXPECT_EQ(info.steps_done(), 1);
  EXPECT_TRUE(info.has_state());
  std::map<std::string, std::string> state;
  ASSERT_TRUE(FetchState(server, e.job_id(), &state).ok());
  EXPECT_EQ(state.size(), 2u);
  EXPECT_TRUE(WaitUntil([&] { return !workers[0]->jobs().at(0).cancelled; }));
}

TEST(JobService, ClientMayWaitForEachStepsResultBeforeSendingTheNextBatch) {
  TestServer server(FastOptions());
  auto workers = Workers(server, 2);
  const std::vector<v1::SubmitJobRequest> reqs =
      Requests(Args(2, 3));  // spec, 3 state chunks, 2 per step
  Submission job(server, std::vector<v1::SubmitJobRequest>(reqs.begin(), reqs.begin() + 4),
                 /*close=*/false);
  for (int64_t step = 1; step <= 3; ++step) {
    ASSERT_TRUE(job.Write(reqs[2 + 2 * step]));
    ASSERT_TRUE(job.Write(reqs[3 + 2 * step]));
    const v1::JobEvent e =
        job.UntilStep(step);  // the server reports it without waiting for the next batch
    ASSERT_EQ(e.step(), step) << e.DebugString();
    EXPECT_EQ(e.loss(), static_cast<double>(step));
  }
  job.Close();
  std::vector<v1::JobEvent> rest;
  ASSERT_TRUE(job.Finish(&rest).ok());
  EXPECT_EQ(rest.back().state(), v1::JOB_STATE_SUCCEEDED);
}

TEST(JobService, FullQueueIsResourceExhaustedAndJobsWaitForWorkersToAttach) {
  server::JobServiceOptions o = FastOptions();
  o.max_queued_jobs = 1;
  TestServer server(o);
  Submission first(server, Args(1, 1));
  const v1::JobEvent e = first.Next();
  EXPECT_THAT(e.message(),
              HasSubstr("waiting for 1 idle worker; 0 registered (more workers must attach)"));
  Submission second(server, Args(1, 1));
  const grpc::Status s = second.Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("--max-queued-jobs is 1"));
  auto workers = Workers(server, 1);  // attaches later: the queued job runs
  EXPECT_TRUE(first.Finish().ok());
  EXPECT_EQ(GetJob(server, e.job_id()).state(), v1::JOB_STATE_SUCCEEDED);
}

// A job that can never run neither waits forever nor blocks the queue.
TEST(JobService, JobsLargerThanTheRegisteredWorkersFailAfterTheGracePeriod) {
  server::JobServiceOptions o = FastOptions();
  o.queue_grace_s = 0.5;
  TestServer server(o);
  auto workers = Workers(server, 2);
  // Just started: a 3-rank job may wait for a third worker, then fails; the
  // 1-rank job behind it runs.
  const auto t0 = std::chrono::steady_clock::now();
  Submission big(server, Args(3, 1));
  const v1::JobEvent queued = big.Next();
  EXPECT_THAT(queued.message(),
              HasSubstr("waiting for 3 idle workers; 2 registered (more workers must attach)"));
  Submission small(server, Args(1, 1));
  std::vector<v1::JobEvent> rest;
  const grpc::Status s = big.Finish(&rest);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(450));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_THAT(s.error_message(),
              HasSubstr("failed while queued: JobSpec.world_size 3 exceeds the 2 workers "
                        "registered (not LOST), so it cannot run"));
  ASSERT_FALSE(rest.empty());
  EXPECT_EQ(rest.back().state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(GetJob(server, queued.job_id()).state(), v1::JOB_STATE_FAILED);
  EXPECT_TRUE(small.Finish().ok());
  // Up longer than the grace period: refused at once, not queued.
  Submission again(server, Args(3, 1));
  const auto t1 = std::chrono::steady_clock::now();
  const grpc::Status s2 = again.Finish();
  EXPECT_LT(std::chrono::steady_clock::now() - t1, std::chrono::milliseconds(400));
  EXPECT_EQ(s2.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s2.error_message(),
              HasSubstr("JobSpec.world_size 3 exceeds the 2 workers registered"));
  EXPECT_TRUE(Submission(server, Args(2, 1)).Finish().ok());
}

// A client that sends its spec and then nothing does not hold the workers.
TEST(JobService, SilentClientsFailAfterTheIdleLimitAndFreeTheWorkers) {
  server::JobServiceOptions o = FastOptions();
  o.client_idle_s = 0.5;
  TestServer server(o);
  auto workers = Workers(server, 2);
  const std::vector<v1::SubmitJobRequest> reqs = Requests(Args(2, 2));
  {  // the spec only
    Submission job(server, {reqs[0]}, /*close=*/false);
    const grpc::Status s = job.Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
    EXPECT_THAT(s.error_message(),
                HasSubstr("the client sent nothing for 0.5 s while the job waited for its "
                          "initial state (0 of the"));
  }
  {  // spec and state, then silence before step 1's batch
    Submission job(server, std::vector<v1::SubmitJobRequest>(reqs.begin(), reqs.begin() + 4),
                   /*close=*/false);
    const grpc::Status s = job.Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
    EXPECT_THAT(s.error_message(),
                HasSubstr("while the job waited for step 1's batch (fxdp-server --client-idle-s)"));
  }
  {  // nothing at all: not even a spec
    Submission job(server, {}, /*close=*/false);
    const grpc::Status s = job.Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("sent no JobSpec within 0.5 s"));
  }
  // The workers were freed: a well-behaved job runs on both.
  EXPECT_TRUE(Submission(server, Args(2, 2)).Finish().ok());
}

TEST(JobService, MalformedSubmissionsAreInvalidArgumentNamingWhatIsWrong) {
  TestServer server(FastOptions());
  auto expect_invalid = [&](const std::vector<v1::SubmitJobRequest>& reqs,
                            const std::string& want) {
    Submission sub(server, reqs);
    const grpc::Status s = sub.Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << want << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(want));
  };
  std::vector<v1::SubmitJobRequest> reqs = Requests(JobArgs());
  expect_invalid({reqs[1]},
                 "the first SubmitJobRequest must carry the JobSpec, got an initial-state chunk");
  expect_invalid({}, "the Submit stream ended before its first message");
  expect_invalid(Requests(Args(0, 1)), "JobSpec.world_size must be >= 1, got 0");
  expect_invalid(Requests(Args(9, 1)), "world size 9 is larger than the batch (8 samples)");
  expect_invalid(Requests(Args(1, 0, 0, {"/data"})), "JobSpec.steps must be > 0 with data_paths");
  JobArgs bad_node = Args(1, 1);
  bad_node.edit_spec = [](v1::JobSpec& spec) {
    for (v1::Node& n : *spec.mutable_graph()->mutable_nodes()) {
      if (n.name() == "addmm") n.mutable_args(1)->mutable_ref()->set_node(9999);
    }
  };
  expect_invalid(Requests(bad_node), "addmm");

  // Once the job runs: the stream's content is checked as it is read.
  auto workers = Workers(server, 1);
  reqs = Requests(Args(1, 1));
  reqs[1].mutable_state()->set_offset(4);
  expect_invalid(reqs, "initial state: tensor 'fc.weight': chunk at offset 4, expected 0");
  reqs = Requests(Args(1, 1));
  *reqs[4].mutable_batch()->mutable_tensors(0) = F32("input.0", {kB, 5}, 0);
  expect_invalid(reqs, "step 1's batch: input 'input.0' is f32[8, 5], the graph expects f32[8, 4]");
  reqs = Requests(Args(1, 1));
  reqs[5].mutable_batch()->mutable_tensors(0)->set_name("labels");
  expect_invalid(reqs,
                 "step 1's batch: tensor 'labels' is not an INPUT of the graph (its inputs: "
                 "input.0, input.1)");
  reqs = Requests(Args(1, 1));
  reqs[4].mutable_batch()->set_step(2);
  expect_invalid(reqs, "got a StepBatch for step 2, expected step 1");
  expect_invalid(Requests(Args(1, 3, 2)),
                 "the client ended the stream after the batches of 2 of 3 steps");
  EXPECT_TRUE(WaitUntil([&] { return server.registry().IdleWorkers().size() == 1; }));
}

TEST(JobService, LostRankFailsTheJobNamingItAndTheQueueGoesOn) {
  TestServer server(FastOptions(), server::WorkerRegistryOptions{50, 3, 60});
  auto workers = Workers(server, 3);
  for (auto& w : workers) w->Hold();
  Submission a(server, Args(2, 1));
  const std::string a_id = a.Next().job_id();
  const v1::JobEvent running = a.Next();
  ASSERT_EQ(running.workers_size(), 2);
  Submission b(server, Args(2, 1));
  EXPECT_EQ(b.Next().state(), v1::JOB_STATE_QUEUED);
  FakeWorker* rank1 = nullptr;
  FakeWorker* rank0 = nullptr;
  for (auto& w : workers) {
    if (w->id() == running.workers(1)) rank1 = w.get();
    if (w->id() == running.workers(0)) rank0 = w.get();
  }
  ASSERT_TRUE(
      WaitUntil([&] { return !rank0->jobs().empty() && !rank0->jobs()[0].batches.empty(); }));
  rank1->StopHeartbeats();  // hung: only the missing heartbeats tell
  const grpc::Status s = a.Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(s.error_message(),
              HasSubstr("job " + a_id + ": rank 1 (worker " + rank1->id() + ") was lost"));
  EXPECT_TRUE(WaitUntil([&] { return rank0->jobs()[0].cancelled; }));
  for (auto& w : workers) w->Release();
  std::vector<v1::JobEvent> rest;
  EXPECT_TRUE(b.Finish(&rest).ok());
  ASSERT_FALSE(rest.empty());
  EXPECT_EQ(rest.back().state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_THAT(rest.back().workers(), ::testing::Not(::testing::Contains(rank1->id())));
}

TEST(JobService, FailedRankFailsTheJobWithItsCode) {
  TestServer server(FastOptions());
  auto workers = Workers(server, 2);
  workers[0]->FailAt(2, grpc::StatusCode::INVALID_ARGUMENT, "node addmm: shapes do not match");
  workers[1]->FailAt(2, grpc::StatusCode::INVALID_ARGUMENT, "node addmm: shapes do not match");
  Submission job(server, Args(2, 3));
  const grpc::Status s = job.Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(
      s.error_message(),
      ::testing::MatchesRegex(".*rank [01] \\(worker w[01]\\) failed at step 2: node addmm.*"));
  EXPECT_TRUE(WaitUntil([&] { return server.registry().IdleWorkers().size() == 2; }));
  // A worker's error text is bounded in the job's record (issue 17).
  for (auto& w : workers) w->FailAt(1, grpc::StatusCode::INTERNAL, std::string(1 << 20, 'e'));
  const grpc::Status big = Submission(server, Args(2, 1)).Finish();
  EXPECT_EQ(big.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_LT(big.error_message().size(), 4600u);  // and what state is kept (issue 26)
  EXPECT_THAT(big.error_message(), HasSubstr("eee... (1048576 bytes, cut)"));
}

// A rank whose collective was cut short (UNAVAILABLE) reports first; the rank
// that failed for a reason of its own reports soon after: the job names the
// cause (test_job_lifecycle saw UNAVAILABLE from the good worker once in 29).
TEST(JobService, ARanksOwnFailureWinsOverItsPeersCutCollective) {
  TestServer server(FastOptions());
  auto workers = Workers(server, 2);
  workers[0]->FailAt(1, grpc::StatusCode::UNAVAILABLE, "all_reduce: connection closed by peer");
  workers[1]->FailAt(1, grpc::StatusCode::RESOURCE_EXHAUSTED, "node mm: out of memory");
  workers[1]->Hold();
  Submission job(server, Args(2, 1));
  ASSERT_TRUE(WaitUntil([&] { return workers[1]->held() == 1; }));
  workers[1]->Release();  // within the 1.5 s the server waits for the cause
  const grpc::Status s = job.Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("rank 1 (worker w1) failed at step 1: node mm"));
}

TEST(JobService, DataPathsJobsSendEmptyBatches) {
  TestServer server(FastOptions());
  auto workers = Workers(server, 2);
  Submission job(server, Args(2, 2, 0, {"/data/a.safetensors", "/data/b.safetensors"}));
  std::vector<v1::JobEvent> ev;
  ASSERT_TRUE(job.Finish(&ev).ok());
  EXPECT_EQ(ev.back().state(), v1::JOB_STATE_SUCCEEDED);
  for (const auto& w : workers) {
    const auto rec = w->jobs().at(0);
    EXPECT_FALSE(rec.assign.batches_sharded());
    EXPECT_THAT(rec.assign.data_paths(),
                ::testing::ElementsAre("/data/a.safetensors", "/data/b.safetensors"));
    ASSERT_EQ(rec.batches.size(), 2u);
    EXPECT_TRUE(rec.batches.at(1).empty() && rec.batches.at(2).empty());
  }
  EXPECT_THAT(GetJob(server, ev[0].job_id()).data_paths(), ::testing::SizeIs(2));
}

v1::GraphDef HyperGraph() {
  return ir::EncodeGraph(ValueOrDie(ir::ParseGraphText(ReadTestData("mlp_sgd_hyper.txt"))));
}

void AddSeries(v1::JobSpec& spec, const std::string& name, std::vector<double> values) {
  v1::HyperparameterSeries* h = spec.add_schedule();
  h->set_name(name);
  for (double v : values) h->add_values(v);
}

TEST(JobService, AScheduledJobCompilesOnceAndEveryRankGetsEachStepsValues) {
  TestServer server(FastOptions());
  auto workers = Workers(server, 2);
  // data_paths: the values come from JobSpec.schedule, one per step.
  JobArgs files = Args(2, 5, 0, {"/data/a.safetensors"});
  files.edit_spec = [](v1::JobSpec& spec) {
    *spec.mutable_graph() = HyperGraph();
    AddSeries(spec, "optim.group0.lr", {0.5, 0.4, 0.3, 0.2, 0.1, 99});
  };
  const int64_t misses_before = server.cache_stats().misses;
  std::vector<v1::JobEvent> ev;
  Submission a(server, files);
  ASSERT_TRUE(a.Finish(&ev).ok());
  EXPECT_EQ(ev.back().state(), v1::JOB_STATE_SUCCEEDED);
  // One compile for the whole job, not one per step.
  EXPECT_EQ(server.cache_stats().misses - misses_before, 1);
  v1::JobInfo info = GetJob(server, ev[0].job_id());
  EXPECT_FALSE(info.compile_cached());
  EXPECT_THAT(info.hyperparameters(),
              ::testing::ElementsAre("optim.group0.lr", "optim.group0.weight_decay"));
  for (const auto& w : workers) {
    const auto rec = w->jobs().at(0);
    ASSERT_EQ(rec.hyperparameters.size(), 5u) << w->id();
    const double want[] = {0, 0.5, 0.4, 0.3, 0.2, 0.1};
    for (int64_t step = 1; step <= 5; ++step) {
      EXPECT_THAT(rec.hyperparameters.at(step),
                  ::testing::ElementsAre(::testing::Pair("optim.group0.lr", want[step])))
          << w->id() << " step " << step;
    }
  }

  // Streamed, same graph and world size: a cache hit; the schedule's values
  // are overridden by a StepBatch's, a step without values gets none.
  JobArgs streamed = Args(2, 3);
  streamed.edit_spec = [](v1::JobSpec& spec) {
    *spec.mutable_graph() = HyperGraph();
    AddSeries(spec, "optim.group0.weight_decay", {0.01, 0.02, 0.03});
  };
  std::vector<v1::SubmitJobRequest> reqs = Requests(streamed);
  // spec, 5 state messages (the graph's lr and weight_decay too), 2 batch messages a step
  v1::HyperparameterValue* h =
      reqs[8].mutable_batch()->add_hyperparameters();  // step 2's first message
  h->set_name("optim.group0.lr");
  h->set_value(0.25);
  h = reqs[9].mutable_batch()->add_hyperparameters();  // step 2's last message
  h->set_name("optim.group0.weight_decay");
  h->set_value(0.5);
  ev.clear();
  Submission b(server, reqs);
  ASSERT_TRUE(b.Finish(&ev).ok());
  EXPECT_EQ(server.cache_stats().misses - misses_before, 1);
  EXPECT_TRUE(GetJob(server, ev[0].job_id()).compile_cached());
  for (const auto& w : workers) {
    const auto rec = w->jobs().at(1);
    EXPECT_THAT(rec.hyperparameters.at(1),
                ::testing::ElementsAre(::testing::Pair("optim.group0.weight_decay", 0.01)));
    EXPECT_THAT(rec.hyperparameters.at(2),
                ::testing::ElementsAre(::testing::Pair("optim.group0.lr", 0.25),
                                       ::testing::Pair("optim.group0.weight_decay", 0.5)));
    EXPECT_THAT(rec.hyperparameters.at(3),
                ::testing::ElementsAre(::testing::Pair("optim.group0.weight_decay", 0.03)));
  }
}

TEST(JobService, BadSchedulesAreInvalidArgumentNamingTheName) {
  TestServer server(FastOptions());
  auto workers = Workers(server, 1);
  auto expect_invalid = [&](const std::vector<v1::SubmitJobRequest>& reqs,
                            const std::string& want) {
    Submission sub(server, reqs);
    const grpc::Status s = sub.Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << want << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(want));
  };
  auto with = [](int64_t steps, std::function<void(v1::JobSpec&)> edit) {
    JobArgs a = Args(1, steps);
    a.edit_spec = [edit](v1::JobSpec& spec) {
      *spec.mutable_graph() = HyperGraph();
      edit(spec);
    };
    return Requests(a);
  };
  const int64_t misses = server.cache_stats().misses;
  expect_invalid(
      with(2, [](v1::JobSpec& s) { AddSeries(s, "optim.group0.momentum", {0.9, 0.9}); }),
      "JobSpec.schedule: 'optim.group0.momentum' is not a hyper-parameter of the graph (no "
      "placeholder has that state name; its hyper-parameters: optim.group0.lr, "
      "optim.group0.weight_decay)");
  expect_invalid(
      with(2, [](v1::JobSpec& s) { AddSeries(s, "fc.weight", {0.9, 0.9}); }),
      "'fc.weight' is not a hyper-parameter of the graph (it is the state of placeholder 'w'");
  expect_invalid(with(3, [](v1::JobSpec& s) { AddSeries(s, "optim.group0.lr", {0.1, 0.2}); }),
                 "JobSpec.schedule: 'optim.group0.lr' has 2 values for 3 steps");
  expect_invalid(with(0, [](v1::JobSpec& s) { AddSeries(s, "optim.group0.lr", {0.1}); }),
                 "JobSpec.steps must be > 0 with a schedule");
  // Refused before anything was compiled.
  EXPECT_EQ(server.cache_stats().misses, misses);
  // A StepBatch naming something else fails the running job.
  std::vector<v1::SubmitJobRequest> reqs = with(1, [](v1::JobSpec&) {});
  v1::HyperparameterValue* h =
      reqs[6].mutable_batch()->add_hyperparameters();  // after 5 state messages
  h->set_name("optim.group0.betas");
  h->set_value(0.9);
  expect_invalid(
      reqs,
      "step 1's batch: StepBatch.hyperparameters: 'optim.group0.betas' is not a hyper-parameter");
  EXPECT_TRUE(WaitUntil([&] { return server.registry().IdleWorkers().size() == 1; }));
}

TEST(JobService, OpenEndedJobRunsUntilTheClientHalfCloses) {
  TestServer server(FastOptions());
  auto workers = Workers(server, 1);
  Submission job(server, Args(1, 0, 3));
  std::vector<v1::JobEvent> ev;
  ASSERT_TRUE(job.Finish(&ev).ok());
  EXPECT_EQ(ev.back().state(), v1::JOB_STATE_SUCCEEDED);
  const v1::JobInfo info = GetJob(server, ev[0].job_id());
  EXPECT_EQ(info.steps(), 3);
  EXPECT_EQ(info.steps_done(), 3);
}

TEST(JobService, EvictsTheOldestFinalStateAndForgetsOldJobs) {
  server::JobServiceOptions o = FastOptions();
  o.max_state_bytes = 2 * (3 * 4 + 3) * sizeof(float);  // two states
  o.max_finished_jobs = 3;
  TestServer server(o);
  auto workers = Workers(server, 1);
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    Submission job(server);
    ids.push_back(job.Next().job_id());
    ASSERT_TRUE(job.Finish().ok());
  }
  std::map<std::string, std::string> state;
  const grpc::Status s = FetchState(server, ids[0], &state);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("final state was evicted"));
  EXPECT_THAT(s.error_message(), HasSubstr("--max-state-mb"));
  const v1::JobInfo evicted = GetJob(server, ids[0]);
  EXPECT_TRUE(evicted.state_evicted());
  EXPECT_FALSE(evicted.has_state());
  for (int i : {1, 2}) {
    EXPECT_TRUE(FetchState(server, ids[i], &state).ok()) << i;
    EXPECT_TRUE(GetJob(server, ids[i]).has_state());
  }
  Submission fourth(server);
  ASSERT_TRUE(fourth.Finish().ok());
  grpc::Status gs;
  GetJob(server, ids[0], &gs);
  EXPECT_EQ(gs.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(gs.error_message(), HasSubstr("--max-finished-jobs"));
  grpc::ClientContext ctx;
  v1::ListJobsResponse list;
  ASSERT_TRUE(server.jobs()->ListJobs(&ctx, v1::ListJobsRequest(), &list).ok());
  EXPECT_EQ(list.jobs_size(), 3);
}

}  // namespace
}  // namespace fxdp::testing
