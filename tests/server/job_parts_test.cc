// The job service's parts alone, without gRPC or workers: the batch sharder,
// the spec checks, the job table and the scheduler. The job runner that drives
// them: job_runner_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "server/compile/compile_service.h"
#include "server/jobs/batch_sharder.h"
#include "server/jobs/job.h"
#include "server/jobs/job_spec.h"
#include "server/jobs/job_table.h"
#include "server/jobs/ragged_batch.h"
#include "tests/server/mlp_job.h"
#include "tests/test_util.h"
#include "util/status_macros.h"

namespace fxdp::testing {
namespace {

using ::testing::HasSubstr;

// The balanced split of `batch` rows over `world` ranks for every input: what
// RankRowsOf gives for a graph expanded as usual.
server::RankRows Balanced(const std::vector<server::InputSpec>& inputs, int64_t batch, int world) {
  server::RankRows rows;
  for (const server::InputSpec& in : inputs) {
    for (const ir::RankSlice& s : ir::SplitBatch(batch, world)) rows[in.name].push_back({s});
  }
  return rows;
}

// The sharder alone: 8 rows on 3 ranks (3, 3, 2), messages of <= 40 bytes.
TEST(BatchSharder, SlicesEachInputAlongItsBatchDimIntoSmallMessages) {
  const std::vector<server::InputSpec> inputs = server::GraphInputs(MlpGraph());
  ASSERT_EQ(inputs.size(), 2u);
  const ir::PlaceholderNames names = ir::PlaceholderNames::Of(MlpGraph());
  const ir::Schedule schedule;
  server::BatchSharder sharder("job-x", 3, 40, &inputs, &names, &schedule);
  const auto b = MlpBatch(1);
  absl::StatusOr<bool> done = sharder.Add(1, BatchMessage(1, b[0], true));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_FALSE(*done);
  done = sharder.Add(1, BatchMessage(1, b[1], false));
  ASSERT_TRUE(done.ok() && *done) << done.status();
  const int64_t starts[] = {0, 3, 6}, sizes[] = {3, 3, 2};
  for (int r = 0; r < 3; ++r) {
    auto msgs = sharder.RankBatch(r, Balanced(inputs, kB, 3));
    ASSERT_TRUE(msgs.ok()) << msgs.status();
    EXPECT_GT(msgs->size(), 1u);
    std::map<std::string, std::string> got;
    for (size_t i = 0; i < msgs->size(); ++i) {
      const v1::Batch& m = (*msgs)[i].batch();
      EXPECT_EQ(m.job_id(), "job-x");
      EXPECT_EQ(m.step(), 1);
      EXPECT_EQ(m.more(), i + 1 < msgs->size());
      for (const auto& c : m.tensors()) {
        EXPECT_LE(c.data().size(), 40u);
        EXPECT_EQ(c.shape(0), sizes[r]);
        got[c.name()] += c.data();
      }
    }
    for (const auto& global : b) {
      const int64_t row = global.shape(1) * 4;
      EXPECT_EQ(got[global.name()], global.data().substr(starts[r] * row, sizes[r] * row)) << r;
    }
  }
}

TEST(BatchSharder, RefusesBatchesThatDoNotMatchTheGraphNamingWhat) {
  const std::vector<server::InputSpec> inputs = server::GraphInputs(MlpGraph());
  const ir::PlaceholderNames names = ir::PlaceholderNames::Of(MlpGraph());
  const ir::Schedule schedule;
  auto error = [&](const v1::SubmitJobRequest& r, int64_t step = 1) {
    server::BatchSharder sharder("job-x", 2, 1 << 20, &inputs, &names, &schedule);
    absl::StatusOr<bool> s = sharder.Add(step, r);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(s.status().message());
  };
  const auto b = MlpBatch(1);
  EXPECT_THAT(error(BatchMessage(2, b[0], false)),
              HasSubstr("got a StepBatch for step 2, expected step 1"));
  EXPECT_THAT(
      error(BatchMessage(1, F32("labels", {8}, 0), false)),
      HasSubstr("tensor 'labels' is not an INPUT of the graph (its inputs: input.0, input.1)"));
  EXPECT_THAT(error(BatchMessage(1, b[0], false)),
              HasSubstr("step 1's batch lacks input 'input.1' (f32[8, 3])"));
  v1::SubmitJobRequest hyper = BatchMessage(1, b[0], true);
  auto* h = hyper.mutable_batch()->add_hyperparameters();
  h->set_name("optim.lr");
  EXPECT_THAT(error(hyper), HasSubstr("'optim.lr' is not a hyper-parameter of the graph"));
  v1::SubmitJobRequest state;
  *state.mutable_state() = b[0];
  EXPECT_THAT(error(state), HasSubstr("expected step 1's batch, got an initial-state chunk"));
}

// A resumed job (after its checkpoint of step 5): its client numbers the
// batches 6, 7, ..., its schedule is read at those steps, its workers count
// from 1.
TEST(BatchSharder, AResumedJobTakesTheJobsStepsAndTheScheduleFromThere) {
  const v1::GraphDef g =
      ir::EncodeGraph(ValueOrDie(ir::ParseGraphText(ReadTestData("mlp_sgd_hyper.txt"))));
  const std::vector<server::InputSpec> inputs = server::GraphInputs(g);
  const ir::PlaceholderNames names = ir::PlaceholderNames::Of(g);
  const ir::Schedule schedule = ValueOrDie(ir::Schedule::FromSeries(
      {{"optim.group0.lr", {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8}}}, 8, "JobSpec.schedule"));
  server::BatchSharder sharder("job-x", 2, 1 << 20, &inputs, &names, &schedule);
  sharder.set_first_step(5);
  const auto b = MlpBatch(1);
  absl::StatusOr<bool> wrong = sharder.Add(1, BatchMessage(1, b[0], true));
  EXPECT_THAT(wrong.status().message(),
              HasSubstr("got a StepBatch for step 1, expected step 6 (the job resumes after its "
                        "checkpoint of step 5"));
  server::BatchSharder resumed("job-x", 2, 1 << 20, &inputs, &names, &schedule);
  resumed.set_first_step(5);
  ASSERT_TRUE(resumed.Add(1, BatchMessage(6, b[0], true)).ok());
  absl::StatusOr<bool> done = resumed.Add(1, BatchMessage(6, b[1], false));
  ASSERT_TRUE(done.ok() && *done) << done.status();
  const std::vector<v1::ServerMessage> msgs =
      ValueOrDie(resumed.RankBatch(0, Balanced(inputs, kB, 2)));
  const v1::Batch& m = msgs[0].batch();
  EXPECT_EQ(m.step(), 1);  // the workers' first step of this run
  ASSERT_EQ(m.hyperparameters_size(), 1);
  EXPECT_EQ(m.hyperparameters(0).value(), 0.6);  // the job's step 6
  EXPECT_EQ(resumed.ScheduleOnlyBatch(2, 7).batch().hyperparameters(0).value(), 0.7);
}

// Rank 1's rows of input.0 (as (start, size)) that RankRowsOf gives for the MLP expanded on 2
// ranks (4 + 4 of 8 rows) whose rank graphs say "fxdp.micro_batch" = `micro` ("": no key).
absl::StatusOr<std::vector<std::pair<int64_t, int64_t>>> Rank1Rows(const std::string& micro) {
  v1::ExpandRequest req;
  *req.mutable_graph() = MlpGraph();
  req.set_world_size(2);
  v1::ExpandResponse x = ValueOrDie(server::RunExpand(req));
  for (v1::GraphDef& g : *x.mutable_graphs()) {
    if (micro.empty()) continue;
    v1::StringPair* m = g.add_metadata();
    m->set_key(ir::kMicroBatchKey);
    m->set_value(micro);
  }
  const std::vector<server::InputSpec> inputs = server::GraphInputs(MlpGraph());
  ir::InputShapes shapes;
  for (const server::InputSpec& in : inputs) shapes[in.name] = in.shape;
  FXDP_ASSIGN_OR_RETURN(const server::RankRows rows, server::RankRowsOf(x, 2, inputs, shapes));
  EXPECT_EQ(rows.at("input.0").size(), 2u);
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const ir::RankSlice& s : rows.at("input.0")[1]) out.emplace_back(s.start, s.size);
  return out;
}

// RankRowsOf: ir::RankRows with the micro-batch size the rank graphs say (each shape of a
// symbolic graph its own), checked against the rows each rank graph declares.
TEST(RankRowsOf, EachRankItsShareOfEachMicroBatchCheckedAgainstItsGraph) {
  using Rows = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(ValueOrDie(Rank1Rows("")), (Rows{{4, 4}}));
  EXPECT_EQ(ValueOrDie(Rank1Rows("4")), (Rows{{2, 2}, {6, 2}}));  // rows 2, 3, 6, 7
  EXPECT_EQ(ValueOrDie(Rank1Rows("2")), (Rows{{1, 1}, {3, 1}, {5, 1}, {7, 1}}));
  // Micro-batches of 3 rows would give rank 0 2 + 2 + 1 rows: not what its graph declares.
  EXPECT_THAT(Rank1Rows("3").status(),
              StatusIs(absl::StatusCode::kInternal,
                       "rank 0's graph declares 4 rows of input 'input.0', but its rows of the "
                       "global batch of 8 in micro-batches of 3 are 5"));
  EXPECT_THAT(
      Rank1Rows("four").status(),
      StatusIs(absl::StatusCode::kInternal, "fxdp.micro_batch is 'four', not a number of rows"));
}

// Ragged inputs (issue 23): 7 bags of 17 tokens (lengths 4 1 3 2 3 2 2), the text i64[17] and
// per-sample weights f32[17] (no batch dim, cut by bags) sharing offsets i64[7] (batch dim 0).
constexpr int64_t kBags = 7, kTokens = 17;
const std::vector<int64_t> kOffsets = {0, 4, 5, 8, 10, 13, 15};

std::vector<server::InputSpec> RaggedInputs(v1::DType offsets) {
  return {{"text", v1::INT64, {kTokens}, -1, {}},
          {"offsets", offsets, {kBags}, 0, {}},
          {"weights", v1::FLOAT32, {kTokens}, -1, {}}};
}

// A 1-D integer tensor of `values`, int64 or int32.
v1::TensorChunk Ints(const std::string& name, const std::vector<int64_t>& values, v1::DType dtype) {
  v1::TensorChunk c;
  c.set_name(name);
  c.set_dtype(dtype);
  c.add_shape(static_cast<int64_t>(values.size()));
  for (int64_t v : values) {
    const int32_t n = static_cast<int32_t>(v);
    c.mutable_data()->append(
        dtype == v1::INT64 ? reinterpret_cast<const char*>(&v) : reinterpret_cast<const char*>(&n),
        dtype == v1::INT64 ? 8 : 4);
  }
  return c;
}

// The values of an integer tensor's bytes (8 or 4 bytes each).
std::vector<int64_t> Values(const std::string& data, size_t item) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < data.size(); i += item) {
    int64_t v = 0;
    if (item == 8) std::memcpy(&v, data.data() + i, 8);
    int32_t n = 0;
    if (item == 4) std::memcpy(&n, data.data() + i, 4);
    out.push_back(item == 8 ? v : n);
  }
  return out;
}

// `world` rank graphs listing text and weights as ragged by offsets (graph r's value: `pairs(r)`).
v1::ExpandResponse RaggedExpand(int world, const std::function<std::string(int)>& pairs) {
  v1::ExpandResponse x;
  for (int r = 0; r < world; ++r) {
    v1::StringPair* m = x.add_graphs()->add_metadata();
    m->set_key(ir::kRaggedKey);
    m->set_value(pairs(r));
  }
  return x;
}
const char kPairs[] = "text offsets\nweights offsets\n";

struct RankPart {
  std::map<std::string, std::string> data;
  std::map<std::string, std::vector<int64_t>> shape;
};

// Each rank's tensors of the ragged step (text 100 + i, weights i, `offsets`) sharded over `world`
// ranks with micro-batches of `micro` rows, in messages of <= `chunk` bytes.
absl::StatusOr<std::vector<RankPart>> ShardRagged(int world, const std::vector<int64_t>& offsets,
                                                  v1::DType dtype, int64_t micro = 0,
                                                  size_t chunk = 1 << 20) {
  const std::vector<server::InputSpec> inputs = RaggedInputs(dtype);
  const ir::PlaceholderNames names;
  const ir::Schedule schedule;
  server::BatchSharder sharder("job-x", world, chunk, &inputs, &names, &schedule);
  std::vector<int64_t> text(kTokens);
  for (int64_t i = 0; i < kTokens; ++i) text[i] = 100 + i;
  EXPECT_TRUE(sharder.Add(1, BatchMessage(1, Ints("text", text, v1::INT64), true)).ok());
  EXPECT_TRUE(sharder.Add(1, BatchMessage(1, F32("weights", {kTokens}, 0), true)).ok());
  absl::StatusOr<bool> done =
      sharder.Add(1, BatchMessage(1, Ints("offsets", offsets, dtype), false));
  EXPECT_TRUE(done.ok() && *done) << done.status();
  server::RankRows rows;
  for (int r = 0; r < world; ++r) rows["offsets"].push_back(ir::RankRows(kBags, micro, world, r));
  FXDP_ASSIGN_OR_RETURN(const ir::RaggedInputs ragged,
                        server::RaggedOf(RaggedExpand(world, [](int) { return kPairs; })));
  FXDP_RETURN_IF_ERROR(sharder.CutRagged(ragged, rows));
  std::vector<RankPart> out(world);
  for (int r = 0; r < world; ++r) {
    FXDP_ASSIGN_OR_RETURN(const std::vector<v1::ServerMessage> msgs, sharder.RankBatch(r, rows));
    for (const v1::ServerMessage& m : msgs) {
      for (const v1::TensorChunk& c : m.batch().tensors()) {
        EXPECT_LE(c.data().size(), chunk);
        out[r].data[c.name()] += c.data();
        out[r].shape[c.name()].assign(c.shape().begin(), c.shape().end());
      }
    }
  }
  return out;
}

// Rank r's text (100 + token) and weights (token) for tokens [begin, end) of each span, its
// offsets rebased.
void ExpectRank(const RankPart& got, const std::vector<std::pair<int64_t, int64_t>>& spans,
                const std::vector<int64_t>& offsets, size_t offset_item, int rank) {
  std::vector<int64_t> text;
  std::vector<float> weights;
  for (const auto& [begin, end] : spans) {
    for (int64_t i = begin; i < end; ++i) {
      text.push_back(100 + i);
      weights.push_back(static_cast<float>(i));
    }
  }
  const int64_t n = static_cast<int64_t>(text.size());
  EXPECT_EQ(Values(got.data.at("text"), 8), text) << "rank " << rank;
  EXPECT_EQ(got.shape.at("text"), std::vector<int64_t>{n}) << "rank " << rank;
  EXPECT_EQ(got.data.at("weights"),
            std::string(reinterpret_cast<const char*>(weights.data()), weights.size() * 4))
      << "rank " << rank;
  EXPECT_EQ(got.shape.at("weights"), std::vector<int64_t>{n}) << "rank " << rank;
  EXPECT_EQ(Values(got.data.at("offsets"), offset_item), offsets) << "rank " << rank;
  EXPECT_EQ(got.shape.at("offsets"), std::vector<int64_t>{static_cast<int64_t>(offsets.size())});
}

// Each rank gets only its bags' tokens of the text and of the weights, and its rows of the
// offsets rebased to them: 2 ranks (4 + 3 bags), 3 ranks (3 + 2 + 2), in messages of <= 16 bytes.
TEST(BatchSharder, CutsRaggedInputsByBagsAndRebasesTheOffsets) {
  const std::vector<RankPart> two = ValueOrDie(ShardRagged(2, kOffsets, v1::INT64, 0, 16));
  ExpectRank(two[0], {{0, 10}}, {0, 4, 5, 8}, 8, 0);
  ExpectRank(two[1], {{10, 17}}, {0, 3, 5}, 8, 1);
  const std::vector<RankPart> three = ValueOrDie(ShardRagged(3, kOffsets, v1::INT64));
  ExpectRank(three[0], {{0, 8}}, {0, 4, 5}, 8, 0);
  ExpectRank(three[1], {{8, 13}}, {0, 2}, 8, 1);
  ExpectRank(three[2], {{13, 17}}, {0, 2}, 8, 2);  // the last bag runs to the text's end
  // Micro-batches of 4 rows on 2 ranks: rank 0 holds bags 0-1 and 4-5, rank 1 bags 2-3 and 6.
  const std::vector<RankPart> micro = ValueOrDie(ShardRagged(2, kOffsets, v1::INT64, 4));
  ExpectRank(micro[0], {{0, 5}, {10, 15}}, {0, 4, 5, 8}, 8, 0);
  ExpectRank(micro[1], {{5, 10}, {15, 17}}, {0, 3, 5}, 8, 1);
}

// int32 offsets stay int32, rebased.
TEST(BatchSharder, RaggedOffsetsKeepTheirInt32Dtype) {
  const std::vector<RankPart> three = ValueOrDie(ShardRagged(3, kOffsets, v1::INT32));
  ExpectRank(three[1], {{8, 13}}, {0, 2}, 4, 1);
  ExpectRank(three[2], {{13, 17}}, {0, 2}, 4, 2);
}

// Offsets that decrease or pass the text: refused naming the step, the inputs and the element,
// before any rank gets a message; rank graphs that disagree: INTERNAL.
TEST(BatchSharder, RefusesRaggedOffsetsThatDecreaseNamingTheElement) {
  EXPECT_THAT(ShardRagged(3, {0, 4, 5, 3, 10, 13, 15}, v1::INT64).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "step 1's batch: input 'offsets' (the offsets of the bags of input 'text' "
                       "i64[17]): offsets[3] is 3, outside [5, 17]"));
  EXPECT_THAT(ShardRagged(2, {0, 4, 5, 8, 10, 13, 18}, v1::INT32).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "offsets[6] is 18, outside [13, 17]"));
  EXPECT_THAT(server::RaggedOf(RaggedExpand(2, [](int r) { return r ? "text offsets\n" : kPairs; }))
                  .status(),
              StatusIs(absl::StatusCode::kInternal,
                       "the rank graphs list different ragged inputs (fxdp.ragged): rank 0 "));
  const ir::RawTensor f{"offsets", ir::DType::kFloat32, {kBags}, std::string(kBags * 4, '\0')};
  const ir::RawTensor text{"text", ir::DType::kInt64, {kTokens}, std::string(kTokens * 8, '\0')};
  server::RankRows rows;
  rows["offsets"] = {ir::RankRows(kBags, 0, 1, 0)};
  EXPECT_THAT(server::CutRaggedBatch({{"text", "offsets"}}, {text, f}, rows, 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "input 'offsets' (the offsets of the bags of input 'text') is f32[7]; "
                       "offsets are int64 or int32"));
}

TEST(JobSpec, ValidationNamesTheFieldAndTheValue) {
  auto error = [](v1::JobSpec spec) {
    return std::string(server::ValidateJobSpec(spec).message());
  };
  EXPECT_EQ(error(v1::JobSpec()), "JobSpec.graph is missing");
  v1::JobSpec s = MlpSpec(1, -1);
  EXPECT_THAT(error(s), HasSubstr("JobSpec.steps must be >= 0"));
  s = MlpSpec(1, 0);
  s.add_data_paths("a.safetensors");
  EXPECT_THAT(error(s), HasSubstr("JobSpec.steps must be > 0 with data_paths"));
  s = MlpSpec(1, 1);
  s.set_collective_timeout_s(-2);
  EXPECT_THAT(error(s),
              HasSubstr("collective_timeout_s must be in [0, one year] (0: 60 s), got -2"));
  s = MlpSpec(1, 1);  // issue 17: strings a client chooses are bounded
  s.set_name(std::string(100000, 'n'));
  EXPECT_EQ(error(s), "JobSpec.name is 100000 bytes, more than 256");
  s = MlpSpec(1, 1);
  for (int i = 0; i < 5000; ++i) s.add_data_paths("a.safetensors");
  EXPECT_EQ(error(s), "JobSpec.data_paths has 5000 entries, more than 4096");
  s = MlpSpec(1, 1);
  s.add_data_paths(std::string(5000, 'p'));
  EXPECT_EQ(error(s), "JobSpec.data_paths[0] is 5000 bytes, more than 4096 (PATH_MAX)");
  EXPECT_TRUE(server::ValidateJobSpec(MlpSpec(2, 3)).ok());
}

TEST(JobTable, KeepsTheLastFinishedJobsAndEvictsTheOldestState) {
  server::JobServiceOptions o;
  o.max_finished_jobs = 2;
  o.max_state_bytes = 100;
  server::JobTable table(o);
  std::vector<std::shared_ptr<server::Job>> jobs;
  for (int i = 0; i < 3; ++i) {
    auto j = std::make_shared<server::Job>();
    j->SetPlan(GraphlessPlan(1, 1));
    const std::string id = table.NextId();
    EXPECT_THAT(id, ::testing::StartsWith("job-" + std::to_string(i + 1) + "-"));
    ASSERT_TRUE(table.Add(j, id).ok());
    auto state = std::make_shared<server::StateStore::State>(1, F32("w", {15}, 0));  // 60 bytes
    ASSERT_TRUE(table.KeepState(j, state).ok());
    ASSERT_TRUE(j->Change(server::JobChange::kStart).ok());
    ASSERT_TRUE(j->Change(server::JobChange::kSucceed).ok());
    table.Finished(j);
    jobs.push_back(j);
  }
  // Job 1 is forgotten (history of 2); job 2's state made room for job 3's.
  EXPECT_EQ(table.Find(jobs[0]->id()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(table.Find(jobs[0]->id()).status().message(), HasSubstr("--max-finished-jobs"));
  ASSERT_EQ(table.All().size(), 2u);
  auto evicted = table.FinalState(jobs[1]->id());
  EXPECT_EQ(evicted.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(evicted.status().message(), HasSubstr("evicted"));
  EXPECT_TRUE(jobs[1]->Info().state_evicted());
  EXPECT_TRUE(table.FinalState(jobs[2]->id()).ok());
  auto failed = std::make_shared<server::Job>();
  failed->SetPlan(GraphlessPlan(1, 1));
  ASSERT_TRUE(table.Add(failed, table.NextId()).ok());
  ASSERT_TRUE(failed->Change(server::JobChange::kStart).ok());
  ASSERT_TRUE(failed->Change(server::JobChange::kFail, absl::InternalError("x")).ok());
  EXPECT_THAT(table.FinalState(failed->id()).status().message(),
              HasSubstr("is JOB_STATE_FAILED and keeps no state: it ended after 0 steps"));
}

}  // namespace
}  // namespace fxdp::testing
