// A job whose graph has symbolic sizes (docs/shapes.md, build plan step 5),
// through the gRPC service with fake workers: every batch shape in one job
// (each rank sent a LoadGraph once per program, each Batch naming its
// program, rows sliced as that shape's rank graphs declare), a shape seen
// again not compiled again, max_shapes evicting on the server and on the
// workers, JobEvent.shape and JobInfo.shapes, and the refusals: a batch its
// guards refuse (the step fails, the last step's state kept), a static dim
// changed, max_shapes out of range; a dataset job (data_paths) whose steps
// take the shapes rank 0 reports, each report checked before any step.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/compile/compile_service.h"
#include "tests/analysis/symbolic_graph.h"
#include "tests/server/job_client.h"

namespace fxdp::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct Shape {
  int64_t b, s;
};

// The Submit stream of a job of SymbolicGraphDef(train) on `world` ranks:
// its state w f32[4, 3], then one batch per shape (x f32[B, S, 4],
// y f32[B, S]; `bad_y`: y of B - 1 rows at that step).
std::vector<v1::SubmitJobRequest> ShapesJob(int world, const std::vector<Shape>& shapes,
                                            int max_shapes = 0, int64_t bad_y = 0) {
  std::vector<v1::SubmitJobRequest> out(1);
  v1::JobSpec* spec = out[0].mutable_spec();
  *spec->mutable_graph() = SymbolicGraphDef(/*train=*/true);
  spec->set_world_size(world);
  spec->set_steps(static_cast<int64_t>(shapes.size()));
  spec->set_num_state_tensors(1);
  spec->set_collective_timeout_s(5);
  spec->set_max_shapes(max_shapes);
  *out.emplace_back().mutable_state() = F32("w", {4, 3}, 0);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const int64_t step = static_cast<int64_t>(i) + 1, b = shapes[i].b, s = shapes[i].s;
    out.push_back(BatchMessage(step, F32("x", {b, s, 4}, 1000.0f * step), true));
    out.push_back(BatchMessage(step, F32("y", {step == bad_y ? b - 1 : b, s}, 0), false));
  }
  return out;
}

// Rank r's graph of the static graph at BxS expanded for `world` ranks.
v1::GraphDef StaticRankGraph(Shape at, int world, int r) {
  v1::ExpandRequest req;
  *req.mutable_graph() = StaticGraphDef(at.b, at.s, /*train=*/true);
  req.set_world_size(world);
  const v1::ExpandResponse x = ValueOrDie(server::RunExpand(req));
  return x.graphs(r % x.graphs_size());
}

TEST(JobShapes, EveryShapeRunsInOneJobEachProgramSentOnce) {
  TestServer server(FastOptions());
  auto workers = Workers(server, 2);
  Submission job(server, ShapesJob(2, {{8, 6}, {5, 7}, {8, 6}, {5, 7}, {3, 2}}));
  std::vector<v1::JobEvent> ev;
  ASSERT_TRUE(job.Finish(&ev).ok()) << (ev.empty() ? "" : ev.back().error());
  std::vector<std::string> shapes;
  for (const v1::JobEvent& e : ev) {
    if (e.state() == v1::JOB_STATE_RUNNING && e.step() > 0) shapes.push_back(e.shape());
  }
  EXPECT_THAT(shapes, ElementsAre("x=8x6x4 y=8x6", "x=5x7x4 y=5x7", "x=8x6x4 y=8x6",
                                  "x=5x7x4 y=5x7", "x=3x2x4 y=3x2"));
  for (const auto& w : workers) {
    const FakeWorker::JobRecord rec = w->jobs().at(0);
    const int r = rec.assign.rank();
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_THAT(rec.errors, ElementsAre());
    EXPECT_EQ(rec.assign.max_graphs(), 15u);  // max_shapes 16, graph 0 included
    // Graph 0 runs the traced shape; 5x7 and 3x2 are loaded once each.
    EXPECT_THAT(rec.graph_ids, ElementsAre(std::pair<const int64_t, uint32_t>{1, 0},
                                           std::pair<const int64_t, uint32_t>{2, 1},
                                           std::pair<const int64_t, uint32_t>{3, 0},
                                           std::pair<const int64_t, uint32_t>{4, 1},
                                           std::pair<const int64_t, uint32_t>{5, 2}));
    ASSERT_EQ(rec.loads.size(), 2u);
    EXPECT_EQ(rec.loads[0].graph_id(), 1u);
    EXPECT_EQ(rec.loads[0].evict_graph_id(), 0u);
    EXPECT_EQ(rec.loads[0].graph().SerializeAsString(),
              StaticRankGraph({5, 7}, 2, r).SerializeAsString());
    EXPECT_EQ(rec.loads[1].graph().SerializeAsString(),
              StaticRankGraph({3, 2}, 2, r).SerializeAsString());
    // Uneven steps: 5 rows as 3 + 2, 3 as 2 + 1, each rank its contiguous rows.
    const int64_t rows5[] = {3, 2}, start5[] = {0, 3};
    const FakeWorker::Tensor& x2 = rec.batches.at(2).at("x");
    EXPECT_THAT(x2.shape, ElementsAre(rows5[r], 7, 4));
    EXPECT_EQ(x2.data,
              F32("x", {5, 7, 4}, 2000).data().substr(start5[r] * 7 * 4 * 4, rows5[r] * 7 * 4 * 4));
    EXPECT_THAT(rec.batches.at(5).at("y").shape, ElementsAre(r == 0 ? 2 : 1, 2));
  }
  const v1::JobInfo info = GetJob(server, ev[0].job_id());
  ASSERT_EQ(info.shapes_size(), 3);
  EXPECT_EQ(info.shapes(0).shape(), "x=8x6x4 y=8x6");
  EXPECT_EQ(info.shapes(0).steps(), 2);
  EXPECT_GT(info.shapes(0).compile_ms(), 0);  // at Submit
  EXPECT_EQ(info.shapes(1).shape(), "x=5x7x4 y=5x7");
  EXPECT_EQ(info.shapes(1).steps(), 2);
  EXPECT_GT(info.shapes(1).compile_ms(), 0);
  EXPECT_EQ(info.shapes(2).steps(), 1);
  for (const v1::CompiledShape& c : info.shapes()) EXPECT_FALSE(c.evicted()) << c.shape();
}

TEST(JobShapes, MaxShapesEvictsOnTheServerAndOnTheWorkers) {
  TestServer server(FastOptions());
  auto workers = Workers(server, 2);
  const server::CompileCacheStats before = server.cache_stats();
  // max_shapes 2: graph 0 (8x6) and one more.
  Submission job(server, ShapesJob(2, {{5, 7}, {4, 7}, {5, 7}, {8, 6}, {5, 7}}, 2));
  std::vector<v1::JobEvent> ev;
  ASSERT_TRUE(job.Finish(&ev).ok()) << (ev.empty() ? "" : ev.back().error());
  for (const auto& w : workers) {
    const FakeWorker::JobRecord rec = w->jobs().at(0);
    EXPECT_THAT(rec.errors, ElementsAre());
    EXPECT_EQ(rec.assign.max_graphs(), 1u);
    // 5x7 as 1; 4x7 as 2 evicting 1; 5x7 again compiled as 3 evicting 2; 8x6 is graph 0.
    ASSERT_EQ(rec.loads.size(), 3u);
    EXPECT_EQ(rec.loads[1].graph_id(), 2u);
    EXPECT_EQ(rec.loads[1].evict_graph_id(), 1u);
    EXPECT_EQ(rec.loads[2].graph_id(), 3u);
    EXPECT_EQ(rec.loads[2].evict_graph_id(), 2u);
    EXPECT_EQ(rec.graph_ids.at(4), 0u);
    EXPECT_EQ(rec.graph_ids.at(5), 3u);  // still held: no LoadGraph
  }
  const v1::JobInfo info = GetJob(server, ev[0].job_id());
  ASSERT_EQ(info.shapes_size(), 3);
  EXPECT_EQ(info.shapes(1).shape(), "x=5x7x4 y=5x7");
  EXPECT_EQ(info.shapes(1).steps(), 3);
  EXPECT_FALSE(info.shapes(1).evicted());
  EXPECT_EQ(info.shapes(2).shape(), "x=4x7x4 y=4x7");
  EXPECT_TRUE(info.shapes(2).evicted());
  // The expansions: 8x6 at Submit, 5x7, 4x7 (5x7's second compile hits the compile cache).
  EXPECT_EQ(server.cache_stats().misses - before.misses, 3);
}

TEST(JobShapes, ABatchTheGuardsRefuseFailsTheStepAndKeepsTheState) {
  TestServer server(FastOptions());
  auto workers = Workers(server, 2);
  Submission job(server, ShapesJob(2, {{8, 6}, {5, 7}, {5, 7}}, 0, /*bad_y=*/3));
  const std::string id = job.Next().job_id();
  const grpc::Status s = job.Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              HasSubstr("step 3's batch: at x=5x7x4, y=4x7: the trace assumed s2 == s0 "
                        "[train.py:9"));
  EXPECT_THAT(s.error_message(), HasSubstr("drop a partial last batch"));  // what to do
  EXPECT_THAT(s.error_message(), HasSubstr("; its state after step 2 is kept (fxdp fetch " + id));
  const v1::JobInfo info = GetJob(server, id);
  EXPECT_EQ(info.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(info.steps_done(), 2);
  EXPECT_TRUE(info.has_state());
  std::map<std::string, std::string> state;
  ASSERT_TRUE(FetchState(server, id, &state).ok());
  EXPECT_EQ(state.at("w"), F32("w", {4, 3}, 0).data());  // the fake workers' state
  EXPECT_EQ(info.shapes_size(), 2);                      // the refused shape was not compiled
}

TEST(JobShapes, RefusalsNameWhatIsWrong) {
  TestServer server(FastOptions());
  auto workers = Workers(server, 2);
  // A dim the trace made static.
  std::vector<v1::SubmitJobRequest> reqs = ShapesJob(2, {{8, 6}});
  *reqs[2].mutable_batch()->mutable_tensors(0) = F32("x", {8, 6, 5}, 0);
  grpc::Status s = Submission(server, reqs).Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              HasSubstr("step 1's batch: input 'x' is f32[8, 6, 5], the graph expects f32[s, s, "
                        "4] (the global batch; s: a size its guards allow): dim 2 is 5, but the "
                        "trace made it static at 4"));
  // max_shapes 1: the traced shape only.
  s = Submission(server, ShapesJob(2, {{8, 6}, {5, 7}}, 1)).Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              HasSubstr("step 2's batch: the batch is x=5x7x4 y=5x7, but JobSpec.max_shapes is 1: "
                        "the job runs its traced shape only (x=8x6x4 y=8x6)"));
  reqs = ShapesJob(2, {{8, 6}}, server::kMaxMaxShapes + 1);
  s = Submission(server, reqs).Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("JobSpec.max_shapes must be in [0, 64] (0: 16), got "
                                           "65"));
}

// Rank 0's report of a dataset of `shapes` (x f32[B, S, 4], y f32[B, S]),
// index entry i of shape entries[i].
v1::DatasetShapes Report(const std::vector<Shape>& shapes, const std::vector<uint32_t>& entries) {
  v1::DatasetShapes r;
  for (const Shape& s : shapes) {
    v1::BatchShape* b = r.add_shapes();
    v1::NamedShape* x = b->add_tensors();
    x->set_name("x");
    for (int64_t d : {s.b, s.s, int64_t{4}}) x->add_dims(d);
    v1::NamedShape* y = b->add_tensors();
    y->set_name("y");
    for (int64_t d : {s.b, s.s}) y->add_dims(d);
  }
  for (uint32_t e : entries) r.add_entries(e);
  return r;
}

// The spec and state of a job of `steps` steps that the workers read from
// the dataset directory /data/epoch0.
std::vector<v1::SubmitJobRequest> DatasetJob(int64_t steps) {
  std::vector<v1::SubmitJobRequest> reqs = ShapesJob(2, {{8, 6}});
  reqs.resize(2);
  reqs[0].mutable_spec()->set_steps(steps);
  reqs[0].mutable_spec()->add_data_paths("/data/epoch0");
  return reqs;
}

TEST(JobShapes, ADatasetJobRunsEachStepWithItsIndexEntrysShape) {
  TestServer server(FastOptions());
  auto workers = Workers(server, 2);
  for (auto& w : workers) w->SetDatasetShapes(Report({{8, 6}, {5, 7}}, {0, 1, 1}));
  Submission job(server, DatasetJob(5));
  std::vector<v1::JobEvent> ev;
  ASSERT_TRUE(job.Finish(&ev).ok()) << (ev.empty() ? "" : ev.back().error());
  std::vector<std::string> shapes;
  for (const v1::JobEvent& e : ev) {
    if (e.state() == v1::JOB_STATE_RUNNING && e.step() > 0) shapes.push_back(e.shape());
  }
  // Steps 1-5 read index entries 0, 1, 2, 0, 1.
  EXPECT_THAT(shapes, ElementsAre("x=8x6x4 y=8x6", "x=5x7x4 y=5x7", "x=5x7x4 y=5x7",
                                  "x=8x6x4 y=8x6", "x=5x7x4 y=5x7"));
  for (const auto& w : workers) {
    const FakeWorker::JobRecord rec = w->jobs().at(0);
    const int r = rec.assign.rank();
    SCOPED_TRACE(absl::StrCat("rank ", r));
    EXPECT_THAT(rec.errors, ElementsAre());
    EXPECT_EQ(rec.assign.report_dataset_shapes(), r == 0);
    EXPECT_THAT(rec.graph_ids, ElementsAre(std::pair<const int64_t, uint32_t>{1, 0},
                                           std::pair<const int64_t, uint32_t>{2, 1},
                                           std::pair<const int64_t, uint32_t>{3, 1},
                                           std::pair<const int64_t, uint32_t>{4, 0},
                                           std::pair<const int64_t, uint32_t>{5, 1}));
    ASSERT_EQ(rec.loads.size(), 1u);
    EXPECT_EQ(rec.loads[0].graph().SerializeAsString(),
              StaticRankGraph({5, 7}, 2, r).SerializeAsString());
    EXPECT_TRUE(rec.batches.at(2).empty());  // the workers read the rows
  }
  const v1::JobInfo info = GetJob(server, ev[0].job_id());
  ASSERT_EQ(info.shapes_size(), 2);
  EXPECT_EQ(info.shapes(0).steps(), 2);
  EXPECT_EQ(info.shapes(1).shape(), "x=5x7x4 y=5x7");
  EXPECT_EQ(info.shapes(1).steps(), 3);
}

TEST(JobShapes, ADatasetReportIsCheckedBeforeAnyStep) {
  TestServer server(FastOptions());
  auto workers = Workers(server, 2);
  v1::DatasetShapes lacks_y = Report({{8, 6}}, {0});
  lacks_y.mutable_shapes(0)->mutable_tensors()->RemoveLast();
  v1::DatasetShapes static_dim = Report({{8, 6}, {5, 7}}, {0, 1});
  static_dim.mutable_shapes(1)->mutable_tensors(0)->set_dims(2, 5);
  v1::DatasetShapes other = Report({{8, 6}}, {0});
  other.mutable_shapes(0)->mutable_tensors(1)->set_name("z");
  const std::pair<v1::DatasetShapes, std::string> cases[] = {
      {Report({{8, 6}, {5, 7}}, {0, 2}), ": index entry 1 names shape 2 of 2"},
      {Report({{8, 6}}, {}), ": 0 index entries of 1 shapes"},
      {lacks_y, ": index entry 0's batch lacks input 'y'"},
      {static_dim,
       ": index entry 1's batch: input 'x' is f32[5, 7, 5], the graph expects "
       "f32[s, s, 4] (the global batch; s: a size its guards allow): dim 2 is 5, but "
       "the trace made it static at 4"},
      {other, ": index entry 0's batch: 'z' is not an INPUT of the graph (its inputs: x, y)"},
  };
  for (const auto& [report, error] : cases) {
    SCOPED_TRACE(error);
    for (auto& w : workers) w->SetDatasetShapes(report);
    const grpc::Status s = Submission(server, DatasetJob(3)).Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(),
                HasSubstr("dataset '/data/epoch0' (rank 0's report of its index)" + error));
  }
}

}  // namespace
}  // namespace fxdp::testing
