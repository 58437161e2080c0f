// --state-dir without gRPC: JobStore (SQLite records, safetensors states,
// checkpoints) round trips, RecoverJobs after a "restart" (a second JobStore
// on the same directory), and the JobTable serving a recovered final state
// from its file.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "analysis/ir/proto_codec.h"
#include "analysis/ir/text.h"
#include "server/compile/compile_service.h"
#include "server/jobs/job_recovery.h"
#include "server/jobs/job_resume.h"
#include "server/jobs/job_store.h"
#include "server/jobs/job_table.h"
#include "tests/server/mlp_job.h"
#include "tests/test_util.h"

namespace fxdp::testing {
namespace {

using ::testing::HasSubstr;

std::string TempDir() {
  std::string tmpl = ::testing::TempDir() + "fxdp_store_XXXXXX";
  EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

v1::JobInfo Info(const std::string& id, v1::JobState state) {
  v1::JobInfo i;
  i.set_job_id(id);
  i.set_state(state);
  i.set_world_size(2);
  i.set_steps(3);
  return i;
}

TEST(JobStore, RecordsAndStatesSurviveAReopenAndRecoveryResolvesEachJob) {
  const std::string dir = TempDir();
  v1::JobSpec files_spec = MlpSpec(2, 3);
  files_spec.add_data_paths("/data/batch.safetensors");
  const std::vector<v1::TensorChunk> initial = {F32("fc.weight", {3, 4}, 0),
                                                F32("fc.bias", {3}, 100)};
  // The final state in two chunks of one tensor and a second tensor.
  v1::TensorChunk w = F32("fc.weight", {3, 4}, 7), w2 = w;
  w.set_data(w.data().substr(0, 20));
  w2.set_data(w2.data().substr(20));
  w2.set_offset(20);
  {
    auto store = ValueOrDie(server::JobStore::Open(dir));
    v1::JobInfo done = Info("job-1-a", v1::JOB_STATE_SUCCEEDED);
    done.set_owner("alice");
    ASSERT_TRUE(store->Insert(1, Info("job-1-a", v1::JOB_STATE_QUEUED), v1::JobSpec()).ok());
    ASSERT_TRUE(store->WriteFinalState("job-1-a", {w, w2, F32("fc.bias", {3}, 1)}).ok());
    ASSERT_TRUE(store->Update(done, /*ended=*/true).ok());
    ASSERT_TRUE(store->Insert(2, Info("job-2-b", v1::JOB_STATE_QUEUED), v1::JobSpec()).ok());
    ASSERT_TRUE(store->Update(Info("job-2-b", v1::JOB_STATE_RUNNING), false).ok());
    ASSERT_TRUE(store->Insert(3, Info("job-3-c", v1::JOB_STATE_QUEUED), v1::JobSpec()).ok());
    ASSERT_TRUE(store->Insert(4, Info("job-4-d", v1::JOB_STATE_QUEUED), files_spec).ok());
    ASSERT_TRUE(store->WriteInitialState("job-4-d", initial).ok());
  }  // "killed": a new store on the same directory
  auto store = ValueOrDie(server::JobStore::Open(dir));
  server::RecoveredJobs r = ValueOrDie(server::RecoverJobs(store.get(), server::RunExpand));
  ASSERT_EQ(r.jobs.size(), 4u);
  EXPECT_EQ(r.last_seq, 4);
  EXPECT_EQ(r.jobs[0]->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_TRUE(r.jobs[0]->Info().has_state());
  EXPECT_EQ(r.jobs[0]->owner().identity, "alice");  // ownership survives the restart
  EXPECT_EQ(r.jobs[1]->state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(r.jobs[1]->Info().error_code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_THAT(r.jobs[1]->Info().error(),
              HasSubstr("job job-2-b: the server restarted while the job ran"));
  EXPECT_EQ(r.jobs[2]->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(r.jobs[2]->Info().error(), HasSubstr("its batches came over its Submit stream"));
  ASSERT_EQ(r.to_run.size(), 1u);
  const server::Job& d = *r.to_run[0];
  EXPECT_EQ(r.to_run[0]->id(), "job-4-d");
  EXPECT_TRUE(d.plan().recovered);
  EXPECT_EQ(d.plan().spec.world_size(), 2);
  EXPECT_EQ(d.plan().expanded.graphs_size(), 1);
  EXPECT_EQ(d.plan().inputs.size(), 2u);
  ASSERT_EQ(d.initial_state().size(), 2u);  // read back whole, by name
  EXPECT_EQ(d.initial_state()[0].name(), "fc.bias");
  EXPECT_EQ(d.initial_state()[0].data(), initial[1].data());
  EXPECT_EQ(d.initial_state()[1].data(), initial[0].data());

  // The failures were recorded: a third start sees them as they are.
  server::RecoveredJobs again = ValueOrDie(server::RecoverJobs(store.get(), server::RunExpand));
  EXPECT_EQ(again.jobs[1]->Info().error(), r.jobs[1]->Info().error());

  // The table serves the recovered final state from its file, whole.
  server::JobServiceOptions o;
  server::JobTable table(o, store.get());
  table.Restore(r.jobs, r.last_seq);
  EXPECT_THAT(table.NextId(), ::testing::StartsWith("job-5-"));
  auto state = table.FinalState("job-1-a");
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ((*state)->size(), 2u);
  EXPECT_EQ((*state)->at(1).name(), "fc.weight");
  EXPECT_EQ((*state)->at(1).data(), F32("fc.weight", {3, 4}, 7).data());
  EXPECT_EQ(table.FinalState("job-2-b").status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(JobStore, ARunningDataPathsJobWithACheckpointResumesAfterItsStep) {
  const std::string dir = TempDir();
  v1::JobSpec spec = MlpSpec(1, 10);
  spec.add_data_paths("/data/a.safetensors");
  const std::vector<v1::TensorChunk> at6 = {F32("fc.weight", {3, 4}, 60), F32("fc.bias", {3}, 6)};
  {
    auto store = ValueOrDie(server::JobStore::Open(dir));
    v1::JobInfo info = Info("job-1-r", v1::JOB_STATE_QUEUED);
    ASSERT_TRUE(store->Insert(1, info, spec).ok());
    ASSERT_TRUE(
        store->WriteInitialState("job-1-r", {F32("fc.weight", {3, 4}, 0), F32("fc.bias", {3}, 0)})
            .ok());
    ASSERT_TRUE(store->WriteCheckpoint("job-1-r", 3, at6).ok());
    ASSERT_TRUE(store->WriteCheckpoint("job-1-r", 6, at6).ok());  // replaces step 3's
    info.set_state(v1::JOB_STATE_RUNNING);
    info.set_steps_done(7);
    for (int i = 1; i <= 7; ++i) info.add_losses(i);
    ASSERT_TRUE(store->Update(info, false).ok());
  }
  auto store = ValueOrDie(server::JobStore::Open(dir));
  server::RecoveredJobs r = ValueOrDie(server::RecoverJobs(store.get(), server::RunExpand));
  ASSERT_EQ(r.to_run.size(), 1u);
  const server::Job& j = *r.to_run[0];
  EXPECT_EQ(j.plan().first_step, 6);
  EXPECT_EQ(j.Info().state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(j.Info().steps_done(), 6);
  EXPECT_THAT(j.Info().losses(), ::testing::ElementsAre(1, 2, 3, 4, 5, 6));
  EXPECT_EQ(j.Info().message(), "resumed from the checkpoint of step 6 after a server restart");
  ASSERT_EQ(j.initial_state().size(), 2u);
  EXPECT_EQ(j.initial_state()[1].data(), at6[0].data());  // fc.weight, from the checkpoint
  // The end of the job drops its spec, initial state and checkpoint.
  ASSERT_TRUE(store->Update(Info("job-1-r", v1::JOB_STATE_SUCCEEDED), true).ok());
  EXPECT_FALSE(std::ifstream(store->CheckpointPath("job-1-r")).good());
  EXPECT_FALSE(std::ifstream(store->InitialStatePath("job-1-r")).good());
}

// fc.weight's bytes in `state` (a safetensors file orders its tensors by name).
std::string WeightOf(const server::JobStore::Tensors& state) {
  for (const v1::TensorChunk& t : state) {
    if (t.name() == "fc.weight") return t.data();
  }
  return "(none)";
}

TEST(JobStore, AFailedJobKeepsItsCheckpointAndSpecToBeResumed) {
  const std::string dir = TempDir();
  v1::JobSpec spec;  // a streamed job
  *spec.mutable_graph() = MlpGraph();
  spec.set_world_size(2);
  spec.set_steps(10);
  const std::vector<v1::TensorChunk> at4 = {F32("fc.weight", {3, 4}, 40), F32("fc.bias", {3}, 4)};
  auto store = ValueOrDie(server::JobStore::Open(dir));
  ASSERT_TRUE(store->Insert(1, Info("job-1-f", v1::JOB_STATE_RUNNING), spec).ok());
  ASSERT_TRUE(store->Insert(2, Info("job-2-f", v1::JOB_STATE_RUNNING), spec).ok());
  ASSERT_TRUE(store->WriteCheckpoint("job-1-f", 4, at4).ok());
  ASSERT_TRUE(store->Update(Info("job-1-f", v1::JOB_STATE_FAILED), true).ok());
  ASSERT_TRUE(store->Update(Info("job-2-f", v1::JOB_STATE_FAILED), true).ok());  // no checkpoint
  server::JobStore::ResumePoint p = ValueOrDie(store->ReadResumePoint("job-1-f"));
  EXPECT_EQ(p.checkpoint_step, 4);
  EXPECT_EQ(p.spec.graph().nodes_size(), spec.graph().nodes_size());
  EXPECT_EQ(WeightOf(ValueOrDie(store->ReadCheckpoint("job-1-f")).state), at4[0].data());
  p = ValueOrDie(store->ReadResumePoint("job-2-f"));
  EXPECT_EQ(p.checkpoint_step, 0);
  EXPECT_FALSE(p.spec.has_graph());  // nothing to resume: the spec went
  EXPECT_EQ(store->ReadResumePoint("job-9-x").status().code(), absl::StatusCode::kNotFound);
  // A resume's checkpoint is the resumed job's (a hard link), replaced by its own later.
  ASSERT_TRUE(store->Insert(3, Info("job-3-r", v1::JOB_STATE_QUEUED), spec).ok());
  ASSERT_TRUE(store->ShareCheckpoint("job-1-f", "job-3-r", 4).ok());
  EXPECT_EQ(ValueOrDie(store->ReadResumePoint("job-3-r")).checkpoint_step, 4);
  ASSERT_TRUE(
      store->WriteCheckpoint("job-3-r", 6, {F32("fc.weight", {3, 4}, 60), F32("fc.bias", {3}, 6)})
          .ok());
  EXPECT_EQ(WeightOf(ValueOrDie(store->ReadCheckpoint("job-1-f")).state), at4[0].data());
  // Succeeded: its checkpoint goes.
  ASSERT_TRUE(store->Update(Info("job-3-r", v1::JOB_STATE_SUCCEEDED), true).ok());
  EXPECT_FALSE(std::ifstream(store->CheckpointPath("job-3-r")).good());
  EXPECT_TRUE(std::ifstream(store->CheckpointPath("job-1-f")).good());
}

// A job whose workers wrote its checkpoints keeps its spec when it fails
// (a resume is checked against it); the server holds no checkpoint of it.
TEST(JobStore, AFailedJobWithAWorkersCheckpointKeepsItsSpec) {
  const std::string dir = TempDir();
  v1::JobSpec spec;
  *spec.mutable_graph() = MlpGraph();
  spec.set_world_size(2);
  spec.mutable_checkpoints()->set_dir("/data/ck");
  auto store = ValueOrDie(server::JobStore::Open(dir));
  ASSERT_TRUE(store->Insert(1, Info("job-1-w", v1::JOB_STATE_RUNNING), spec).ok());
  v1::JobInfo failed = Info("job-1-w", v1::JOB_STATE_CANCELLED);
  failed.set_checkpoint_step(2);
  failed.set_checkpoint_path("/data/ck/step-2");
  ASSERT_TRUE(store->Update(failed, true).ok());
  const server::JobStore::ResumePoint p = ValueOrDie(store->ReadResumePoint("job-1-w"));
  EXPECT_EQ(p.checkpoint_step, 0);  // none on the server
  EXPECT_EQ(p.spec.graph().nodes_size(), spec.graph().nodes_size());
}

// A SIGKILL after a checkpoint's file was renamed into place and before the
// database recorded its step: the file's step holds.
TEST(JobStore, ACheckpointFileNewerThanItsRecordedStepIsTakenAtItsOwnStep) {
  const std::string dir = TempDir();
  v1::JobSpec spec;
  *spec.mutable_graph() =
      ir::EncodeGraph(ValueOrDie(ir::ParseGraphText(ReadTestData("mlp_sgd.txt"))));
  spec.set_world_size(1);
  spec.set_steps(10);
  spec.add_data_paths("/data/a.safetensors");
  const std::vector<v1::TensorChunk> at6 = {F32("fc.weight", {3, 4}, 60), F32("fc.bias", {3}, 6)};
  {
    auto store = ValueOrDie(server::JobStore::Open(dir));
    v1::JobInfo info = Info("job-1-c", v1::JOB_STATE_RUNNING);
    info.set_steps(10);
    info.set_steps_done(7);
    for (int i = 1; i <= 7; ++i) info.add_losses(i);
    ASSERT_TRUE(store->Insert(1, info, spec).ok());
    ASSERT_TRUE(store->Insert(2, Info("job-2-c", v1::JOB_STATE_RUNNING), spec).ok());
    ASSERT_TRUE(
        store->WriteCheckpoint("job-1-c", 4, {F32("fc.weight", {3, 4}, 40), F32("fc.bias", {3}, 4)})
            .ok());
    ASSERT_TRUE(store->WriteCheckpoint("job-2-c", 6, at6).ok());
    // job-1-c's file of step 6 is in place, its record still says 4.
    ASSERT_EQ(std::rename(store->CheckpointPath("job-2-c").c_str(),
                          store->CheckpointPath("job-1-c").c_str()),
              0);
  }
  auto store = ValueOrDie(server::JobStore::Open(dir));
  EXPECT_EQ(ValueOrDie(store->ReadResumePoint("job-1-c")).checkpoint_step, 4);
  EXPECT_EQ(ValueOrDie(store->ReadCheckpoint("job-1-c")).step, 6);
  server::RecoveredJobs r = ValueOrDie(server::RecoverJobs(store.get(), server::RunExpand));
  ASSERT_EQ(r.to_run.size(), 1u);
  EXPECT_EQ(r.to_run[0]->plan().first_step, 6);
  EXPECT_EQ(r.to_run[0]->Info().checkpoint_step(), 6);
  EXPECT_THAT(r.to_run[0]->Info().losses(), ::testing::ElementsAre(1, 2, 3, 4, 5, 6));
  EXPECT_EQ(WeightOf(r.to_run[0]->initial_state()), at6[0].data());
}

TEST(GraphDifference, NamesTheStateTensorTheNodeCountOrTheFirstNodeThatDiffers) {
  const std::string text = ReadTestData("mlp_sgd.txt");
  const v1::GraphDef g = ir::EncodeGraph(ValueOrDie(ir::ParseGraphText(text)));
  auto with = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    t.replace(t.find(from), from.size(), to);
    return ir::EncodeGraph(ValueOrDie(ir::ParseGraphText(t)));
  };
  EXPECT_EQ(server::GraphDifference(g, g), "");
  v1::GraphDef other_meta = g;
  other_meta.set_producer("someone else");
  EXPECT_EQ(server::GraphDifference(g, other_meta), "");
  EXPECT_EQ(server::GraphDifference(g, with("alpha=0.1)\n  %new_b", "alpha=0.2)\n  %new_b")),
            "node 'new_w' (#17, aten::sub.Tensor) differs (its arguments or output types)");
  EXPECT_EQ(server::GraphDifference(g, with("aten::mean(%pow)", "aten::sum(%pow)")),
            "node 'loss' (#8, aten::mean) in the resumed job's graph is node 'loss' (#8, "
            "aten::sum) in the new one");
  std::string renamed = text;
  for (size_t at; (at = renamed.find("\"fc.bias\"")) != std::string::npos;)
    renamed.replace(at, 9, "\"fc.b\"");
  EXPECT_EQ(server::GraphDifference(g, ir::EncodeGraph(ValueOrDie(ir::ParseGraphText(renamed)))),
            "state tensor or input 'fc.bias' (f32[3] PARAMETER) is not in the new graph");
}

TEST(JobStore, AStateDirThatIsAFileIsRefusedNamingIt) {
  const std::string dir = TempDir();
  const std::string file = dir + "/plain";
  std::ofstream(file) << "x";
  auto store = server::JobStore::Open(file);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(store.status().message(), HasSubstr("'" + file + "' is not a directory"));
}

}  // namespace
}  // namespace fxdp::testing
