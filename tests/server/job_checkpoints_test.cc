// The checkpoints a job's workers write themselves (JobSpec.checkpoints,
// docs/checkpoints.md, issue 27), through the gRPC service with fake
// workers: the server counts each rank's CheckpointWritten and names a
// step's checkpoint (JobInfo.checkpoint_step, checkpoint_path) only once
// every rank's is in; the checkpoint of the last step is the job's final
// state, which the server does not collect: no FetchState reaches a worker,
// the ranks end by CancelJob, the job SUCCEEDS without a state kept, and
// FetchState says where the state is.
#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/job_client.h"

namespace fxdp::testing {
namespace {

using ::testing::HasSubstr;

JobArgs CheckpointedJob(int world, int64_t steps, int64_t every) {
  JobArgs args = Args(world, steps);
  args.edit_spec = [every](v1::JobSpec& spec) {
    spec.mutable_checkpoints()->set_dir("/workers/ck");
    spec.mutable_checkpoints()->set_every(every);
  };
  return args;
}

TEST(JobCheckpoints, CompleteOnceEveryRankWroteItAndTheLastIsTheFinalState) {
  TestServer server(FastOptions());
  auto workers = Workers(server, 2);
  workers[1]->HoldCheckpoints();
  Submission job(server, CheckpointedJob(2, 2, 1));
  const std::string id = job.Next().job_id();
  // Both steps ran: rank 0's CheckpointWritten of each step came before its
  // StepResult in its stream, so the server has counted them; rank 1's are held.
  ASSERT_TRUE(WaitUntil([&] { return GetJob(server, id).steps_done() == 2; }, 30));
  v1::JobInfo info = GetJob(server, id);
  EXPECT_EQ(info.state(), v1::JOB_STATE_RUNNING);  // waiting for the last checkpoint
  EXPECT_EQ(info.checkpoint_step(), 0);
  EXPECT_EQ(info.checkpoint_path(), "");
  workers[1]->ReleaseCheckpoints();
  const grpc::Status s = job.Finish();
  ASSERT_TRUE(s.ok()) << s.error_message();
  info = GetJob(server, id);
  EXPECT_EQ(info.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(info.checkpoint_step(), 2);
  EXPECT_EQ(info.checkpoint_path(), "/workers/ck/step-2");
  EXPECT_FALSE(info.has_state());
  for (const auto& w : workers) {
    ASSERT_TRUE(WaitUntil([&] { return w->jobs().at(0).cancelled; })) << w->id();
    EXPECT_EQ(w->jobs().at(0).fetches, 0) << w->id();  // no tensor of the state to the server
  }
  std::map<std::string, std::string> state;
  const grpc::Status f = FetchState(server, id, &state);
  EXPECT_EQ(f.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(f.error_message(),
              HasSubstr("SUCCEEDED and its final state is the checkpoint its workers wrote, "
                        "/workers/ck/step-2 (step 2, JobSpec.checkpoints)"));
  EXPECT_TRUE(state.empty());
}

// Without a checkpoint of the last step (none due: an open-ended job whose
// last step is not a multiple of `every`), the server collects the final
// state as for any job.
TEST(JobCheckpoints, AJobEndingBetweenCheckpointsHasItsFinalStateCollected) {
  TestServer server(FastOptions());
  auto workers = Workers(server, 2);
  JobArgs args = CheckpointedJob(2, 0, 2);
  args.batches = 3;
  Submission job(server, Requests(args));
  const std::string id = job.Next().job_id();
  const grpc::Status s = job.Finish();
  ASSERT_TRUE(s.ok()) << s.error_message();
  const v1::JobInfo info = GetJob(server, id);
  EXPECT_EQ(info.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(info.steps_done(), 3);
  EXPECT_EQ(info.checkpoint_step(), 2);
  EXPECT_TRUE(info.has_state());
  std::map<std::string, std::string> state;
  ASSERT_TRUE(FetchState(server, id, &state).ok());
  EXPECT_EQ(state.size(), 2u);
}

}  // namespace
}  // namespace fxdp::testing
