// What a job keeps when it ends before its last step (issue 26,
// job_lifecycle.h StateKept::kLastStep), through the gRPC service with fake
// workers: a job failing on a bad batch at step k keeps the state after step
// k - 1 (steps_done and the error agree), fetchable; a job whose step in
// flight does not finish within --keep-state-s keeps nothing and says why;
// and the batch errors say what to do.
#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/jobs/batch_sharder.h"
#include "tests/server/job_client.h"

namespace fxdp::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kSymbolic[] =
    "or trace with symbolic sizes (fxdp.trace_step(..., dynamic=True)): one job then runs every "
    "batch shape (docs/shapes.md)";

TEST(JobKeep, ABadBatchAtStep3KeepsTheStateAfterStep2) {
  TestServer server(FastOptions());
  auto workers = Workers(server, 2);
  std::vector<v1::SubmitJobRequest> reqs = Requests(Args(2, 4));
  for (v1::SubmitJobRequest& r : reqs) {  // step 3's last batch of 5 samples, not 8
    if (!r.has_batch() || r.batch().step() != 3 || r.batch().tensors(0).name() != "input.0")
      continue;
    *r.mutable_batch()->mutable_tensors(0) = F32("input.0", {5, 4}, 0);
  }
  Submission job(server, reqs);
  const std::string id = job.Next().job_id();
  const grpc::Status s = job.Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              HasSubstr("step 3's batch: input 'input.0' is f32[5, 4], the graph expects "
                        "f32[8, 4] (the global batch): a partial last batch (5 of 8 samples): "
                        "drop it (DataLoader(..., drop_last=True)) or pad it to 8 samples; "));
  EXPECT_THAT(s.error_message(), HasSubstr("; its state after step 2 is kept (fxdp fetch " + id));
  const v1::JobInfo info = GetJob(server, id);
  EXPECT_EQ(info.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(info.steps_done(), 2);  // as the error says
  EXPECT_EQ(info.losses_size(), 2);
  EXPECT_EQ(info.checkpoint_step(), 2);
  EXPECT_TRUE(info.has_state());
  std::map<std::string, std::string> state;
  ASSERT_TRUE(FetchState(server, id, &state).ok());
  EXPECT_EQ(state.size(), 2u);
  EXPECT_EQ(state.at("fc.bias"), F32("fc.bias", {3}, 100).data());  // the fake workers' state
}

// A job whose step is stuck when it is cancelled (a held worker) waits at
// most --keep-state-s for it, then keeps nothing and says why.
TEST(JobKeep, CancelKeepsNoStateWhenTheStepInFlightDoesNotFinish) {
  server::JobServiceOptions o = FastOptions();
  o.keep_state_s = 0.5;
  TestServer server(o);
  auto workers = Workers(server, 1);
  workers[0]->Hold();
  Submission running(server, Args(1, 2));
  const std::string id = running.Next().job_id();
  EXPECT_EQ(running.Next().state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(WaitUntil([&] { return workers[0]->held() > 0; }));
  const v1::JobInfo info = CancelJob(server, id);
  EXPECT_EQ(info.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_THAT(info.error(), HasSubstr(" did not finish within 0.5 s (fxdp-server --keep-state-s)) "
                                      "and it has no checkpoint"));
  EXPECT_FALSE(info.has_state());
  EXPECT_TRUE(WaitUntil([&] { return workers[0]->jobs().at(0).cancelled; }));
}

TEST(JobKeep, BatchErrorsSayWhatToDo) {
  const std::vector<server::InputSpec> inputs = server::GraphInputs(MlpGraph());
  const ir::PlaceholderNames names = ir::PlaceholderNames::Of(MlpGraph());
  const ir::Schedule schedule;
  auto error = [&](const v1::TensorChunk& input0) {
    server::BatchSharder sharder("job-x", 2, 1 << 20, &inputs, &names, &schedule);
    v1::SubmitJobRequest r;
    r.mutable_batch()->set_step(1);
    *r.mutable_batch()->add_tensors() = input0;
    return std::string(sharder.Add(1, r).status().message());
  };
  const std::string head = "step 1's batch: input 'input.0' is ";
  EXPECT_EQ(error(F32("input.0", {8, 6}, 0)),
            head +
                "f32[8, 6], the graph expects f32[8, 4] (the global batch): dim 1 is 6, "
                "traced with 4 (a padded sequence length?): pad every batch to 4 (a "
                "tokenizer's padding=\"max_length\", max_length=4); " +
                kSymbolic);
  EXPECT_EQ(error(F32("input.0", {16, 4}, 0)),
            head +
                "f32[16, 4], the graph expects f32[8, 4] (the global batch): 16 samples, "
                "traced with 8: send batches of 8; " +
                kSymbolic);
  EXPECT_EQ(error(F32("input.0", {3, 5}, 0)),
            head +
                "f32[3, 5], the graph expects f32[8, 4] (the global batch): a partial last "
                "batch (3 of 8 samples): drop it (DataLoader(..., drop_last=True)) or pad it "
                "to 8 samples; dim 1 is 5, traced with 4 (a padded sequence length?): pad "
                "every batch to 4 (a tokenizer's padding=\"max_length\", max_length=4); " +
                kSymbolic);
  v1::TensorChunk f64 = F32("input.0", {8, 4}, 0);
  f64.set_dtype(v1::FLOAT64);
  f64.set_data(std::string(8 * 4 * 8, '\0'));
  EXPECT_EQ(error(f64), head +
                            "f64[8, 4], the graph expects f32[8, 4] (the global batch): "
                            "convert it to the traced dtype (f32[8, 4])");
}

}  // namespace
}  // namespace fxdp::testing
