// The overlap schedule and the split last bucket change when things run, not
// what is computed: a 3-layer MLP with SGD + momentum (mlp3_momentum.txt),
// expanded for 2 and 3 ranks with and without them, trained for 3 steps on
// real Gloo ranks (threads of this process) by the interpreter, whose
// pointwise ops also reuse dying buffers in place. At N=2 the two expansions
// give bit-identical state on every rank; at N=2 and N=3 the state equals
// single-device training of the traced graph.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "analysis/ir/text.h"
#include "executor/gloo/gloo_communicator.h"
#include "executor/interpreter.h"
#include "executor/step_runner.h"
#include "expansion/data_parallel.h"
#include "tests/executor/local_rendezvous.h"
#include "tests/test_util.h"

namespace fxdp::executor {
namespace {

using ::fxdp::testing::LocalRendezvous;
using ::fxdp::testing::ReadTestData;
using ::fxdp::testing::ValueOrDie;

constexpr int kSteps = 3;
constexpr int64_t kBatch = 16;

// Made once, before any thread starts (the generator is global).
struct Data {
  TensorMap state;
  std::vector<TensorMap> batches;
  Data() {
    at::manual_seed(7);
    for (int i = 0; i < 3; ++i) {
      state[absl::StrCat("w", i)] = at::randn({8, 8}) * 0.5;
      state[absl::StrCat("optim.w", i, ".momentum_buffer")] = at::randn({8, 8}) * 0.1;
    }
    for (int step = 0; step < kSteps; ++step)
      batches.push_back({{"x", at::randn({kBatch, 8})}, {"y", at::randn({kBatch, 8})}});
  }
};
const Data& TheData() {
  static const Data* d = new Data();
  return *d;
}

TensorMap Clone(const TensorMap& m) {
  TensorMap out;
  for (const auto& [k, v] : m) out[k] = v.clone();
  return out;
}

// A fresh copy: the runner updates its state in place.
TensorMap InitialState() { return Clone(TheData().state); }
const TensorMap& Batch(int step) { return TheData().batches[step]; }

TensorMap Slice(const TensorMap& batch, const RankSlice& r) {
  TensorMap out;
  for (const auto& [k, v] : batch) out[k] = v.narrow(0, r.start, r.size).contiguous();
  return out;
}

// Trains `e` on `world` Gloo ranks (threads) for kSteps; the final state of
// every rank.
std::vector<TensorMap> TrainDistributed(const Expansion& e, int world) {
  const LocalRendezvous rv(world, std::chrono::milliseconds(30000));
  std::vector<TensorMap> state(world);
  std::vector<absl::Status> status(world);
  auto run = [&](int rank) {
    absl::StatusOr<std::unique_ptr<GlooCommunicator>> comm = rv.Communicator(rank);
    if (!comm.ok()) {
      status[rank] = comm.status();
      return;
    }
    ProgramOptions po;
    po.communicator = comm->get();
    po.check_outputs = true;
    absl::StatusOr<Program> p = Program::Load(e.graph(rank), po);
    if (!p.ok()) {
      status[rank] = p.status();
      return;
    }
    absl::StatusOr<StepRunner> runner = StepRunner::Create(*std::move(p), InitialState());
    if (!runner.ok()) {
      status[rank] = runner.status();
      return;
    }
    for (int step = 0; step < kSteps && status[rank].ok(); ++step)
      status[rank] = runner->Step(Slice(Batch(step), e.report.slices[rank])).status();
    state[rank] = Clone(runner->state());
  };
  std::vector<std::thread> threads;
  for (int r = 1; r < world; ++r) threads.emplace_back(run, r);
  run(0);
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
  return state;
}

TensorMap TrainOneDevice(const ir::Graph& g) {
  StepRunner runner =
      ValueOrDie(StepRunner::Create(ValueOrDie(Program::Load(g, c10::kCPU)), InitialState()));
  for (int step = 0; step < kSteps; ++step) ValueOrDie(runner.Step(Batch(step)));
  return Clone(runner.state());
}

Expansion Expand(const ir::Graph& g, int world, bool overlap) {
  constexpr double kKiB = 1.0 / 1024;
  ExpandOptions o{.world_size = world, .bucket_cap_mb = 1.0, .first_bucket_mb = 0.25 * kKiB};
  o.last_bucket_mb = overlap ? 0.25 * kKiB : 0;
  o.overlap_schedule = overlap;
  const BatchDimAnalysis a = ValueOrDie(AnalyzeBatchDims(g, AnalyzeOptions{world}));
  return ValueOrDie(ExpandDataParallel(g, a, o));
}

void ExpectStateClose(const TensorMap& got, const TensorMap& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [k, v] : want) {
    ASSERT_TRUE(got.count(k)) << what << ": " << k;
    EXPECT_TRUE(at::allclose(got.at(k), v, 1e-5, 1e-6)) << what << ": " << k;
  }
}

void ExpectStateEqual(const TensorMap& got, const TensorMap& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [k, v] : want) EXPECT_TRUE(at::equal(got.at(k), v)) << what << ": " << k;
}

TEST(ScheduleEquivalence, SameResultsWithAndWithoutTheOverlapSchedule) {
  const ir::Graph g = ValueOrDie(ir::ParseGraphText(ReadTestData("mlp3_momentum.txt")));
  TheData();
  const TensorMap one = TrainOneDevice(g);
  const Expansion plain = Expand(g, 2, false), overlap = Expand(g, 2, true);
  ASSERT_EQ(plain.report.buckets.size(), 2u);
  ASSERT_EQ(overlap.report.buckets.size(), 3u);
  const std::vector<TensorMap> a = TrainDistributed(plain, 2), b = TrainDistributed(overlap, 2);
  for (int r = 0; r < 2; ++r) {
    ExpectStateEqual(b[r], a[0], absl::StrCat("N=2 rank ", r, " with vs without"));
    ExpectStateClose(b[r], one, absl::StrCat("N=2 rank ", r, " vs one device"));
  }
  // Uneven split (6, 5, 5 samples).
  const std::vector<TensorMap> c = TrainDistributed(Expand(g, 3, true), 3);
  for (int r = 0; r < 3; ++r) {
    ExpectStateEqual(c[r], c[0], absl::StrCat("N=3 rank ", r, " vs rank 0"));
    ExpectStateClose(c[r], one, absl::StrCat("N=3 rank ", r, " vs one device"));
  }
}

}  // namespace
}  // namespace fxdp::executor
