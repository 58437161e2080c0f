// The functional collectives in the interpreter (executor/interpreter.h) through the
// Communicator interface: local (a copy), a fake, a timed one, and real 2-rank Gloo in one
// process.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_replace.h"
#include "executor/gloo/gloo_communicator.h"
#include "executor/interpreter.h"
#include "executor/timed_communicator.h"
#include "tests/executor/interpreter_test_util.h"
#include "tests/executor/local_rendezvous.h"
#include "tests/test_util.h"

namespace fxdp::executor {
namespace {

using ::fxdp::testing::LocalRendezvous;
using ::fxdp::testing::StatusIs;
using ::fxdp::testing::ValueOrDie;

// ---- collectives ---------------------------------------------------------------------

constexpr char kCollectiveGraph[] = R"(
  %x: f32[4] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %ar: f32[4] = _c10d_functional::all_reduce(%x, "REDUCE", "0")
  %y: f32[4] = aten::mul.Tensor(%x, 2.0)
  %w: f32[4] = _c10d_functional::wait_tensor(%ar)
  %ar2: f32[4] = _c10d_functional::all_reduce(%y, "sum", "0")
  %z: f32[4] = aten::add.Tensor(%ar2, %w)
  %output = output([%w, %z]) {specs=[OTHER, OTHER]}
)";

ir::Graph CollectiveGraph(const std::string& reduce) {
  return Parse(absl::StrReplaceAll(kCollectiveGraph, {{"REDUCE", reduce}}));
}

// World size 2 where the other rank contributes the same tensor.
class DoublingCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  absl::StatusOr<std::unique_ptr<Work>> AllReduceSum(const at::Tensor& t) override {
    ++calls;
    return std::unique_ptr<Work>(std::make_unique<ReadyWork>(t * 2));
  }
  std::string name() const override { return "doubling"; }
  int calls = 0;
};

TEST(InterpreterCollectivesTest, LocalAllReduceIsACopy) {
  Program p = LoadCpu(CollectiveGraph("sum"));
  const at::Tensor x = at::arange(4, at::kFloat);
  auto out = ValueOrDie(p.Run(Values({x})));
  EXPECT_TRUE(at::equal(out[0].toTensor(), x));
  EXPECT_NE(out[0].toTensor().data_ptr(), x.data_ptr());
  // z reads all_reduce(y) without a wait_tensor: it waits implicitly.
  EXPECT_TRUE(at::equal(out[1].toTensor(), x * 3));
}

// TimedCommunicator: totals and, per collective in start order, its bytes,
// time in flight before its wait and time blocked in it; ProgramOptions::profile.
TEST(InterpreterCollectivesTest, TimedCommunicatorAndProfile) {
  DoublingCommunicator inner;
  TimedCommunicator timed(&inner);
  ProgramOptions o;
  o.communicator = &timed;
  o.profile = true;
  Program p = LoadCpu(CollectiveGraph("sum"), o);
  const at::Tensor x = at::arange(4, at::kFloat);
  for (int run = 0; run < 2; ++run) {
    ValueOrDie(p.Run(Values({x})));
    const CollectiveStats s = timed.TakeStats();
    EXPECT_EQ(s.collectives, 2);
    EXPECT_EQ(s.bytes, 32);
    ASSERT_EQ(s.each.size(), 2u);
    for (const CollectiveStats::One& c : s.each) {
      EXPECT_EQ(c.bytes, 16);
      EXPECT_GE(c.in_flight_ms, 0);
      EXPECT_GE(c.wait_ms, 0);
    }
  }
  const std::vector<NodeTime> prof = p.profile();
  ASSERT_EQ(prof.size(), 5u);  // ar, y, w, ar2, z
  EXPECT_EQ(prof[0].node, "ar");
  EXPECT_EQ(prof[0].op, "_c10d_functional::all_reduce");
  EXPECT_EQ(prof[4].node, "z");
  for (const NodeTime& t : prof) {
    EXPECT_EQ(t.runs, 2);
    EXPECT_GE(t.total_ms, 0);
  }
}

TEST(InterpreterCollectivesTest, AllReduceGoesThroughTheCommunicator) {
  DoublingCommunicator comm;
  ProgramOptions o;
  o.communicator = &comm;
  const at::Tensor x = at::arange(4, at::kFloat);
  auto sum = ValueOrDie(LoadCpu(CollectiveGraph("sum"), o).Run(Values({x})));
  EXPECT_EQ(comm.calls, 2);
  EXPECT_TRUE(at::equal(sum[0].toTensor(), x * 2));
  EXPECT_TRUE(at::equal(sum[1].toTensor(), x * 6));
  auto avg = ValueOrDie(LoadCpu(CollectiveGraph("avg"), o).Run(Values({x})));
  EXPECT_TRUE(at::equal(avg[0].toTensor(), x));
  EXPECT_THAT(Program::Load(CollectiveGraph("max"), o).status(),
              StatusIs(absl::StatusCode::kUnimplemented,
                       "node 'ar' (_c10d_functional::all_reduce): reduce_op \"max\" is not "
                       "supported"));
}

TEST(InterpreterCollectivesTest, TwoGlooRanksInOneProcess) {
  const LocalRendezvous rv(2, std::chrono::milliseconds(20000));

  const ir::Graph g = CollectiveGraph("sum");
  std::vector<c10::IValue> results[2];
  absl::Status status[2];
  auto run = [&](int rank) {
    std::unique_ptr<GlooCommunicator> comm = ValueOrDie(rv.Communicator(rank));
    ProgramOptions po;
    po.communicator = comm.get();
    Program p = ValueOrDie(Program::Load(g, po));
    // Two steps: collectives are matched in order across runs.
    for (int step = 0; step < 2; ++step) {
      auto r = p.Run(Values({at::full({4}, static_cast<float>(rank + 1 + step))}));
      status[rank] = r.status();
      if (r.ok()) results[rank] = *r;
    }
  };
  std::thread r1(run, 1);
  run(0);
  r1.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    // step 2: inputs 2 and 3: all_reduce(x) = 5, z = all_reduce(2x) + 5 = 15.
    EXPECT_TRUE(at::equal(results[r][0].toTensor(), at::full({4}, 5.0f))) << r;
    EXPECT_TRUE(at::equal(results[r][1].toTensor(), at::full({4}, 15.0f))) << r;
  }
}

TEST(InterpreterCollectivesTest, GlooWaitTimesOutThenCompletes) {
  const LocalRendezvous rv(2, std::chrono::milliseconds(20000));
  std::unique_ptr<GlooCommunicator> c1;
  std::thread connect1([&] { c1 = ValueOrDie(rv.Communicator(1)); });
  auto c0 = ValueOrDie(rv.Communicator(0));
  connect1.join();
  EXPECT_EQ(c0->name(), "gloo rank 0/2");

  auto w0 = ValueOrDie(c0->AllReduceSum(at::ones({3})));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT(w0->Wait(std::chrono::milliseconds(300)).status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded, "gloo rank 0/2: all_reduce timed out"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  auto w1 = ValueOrDie(c1->AllReduceSum(at::full({3}, 2.0f)));
  const at::Tensor r1 = ValueOrDie(w1->Wait(std::chrono::milliseconds(10000)));
  const at::Tensor r0 = ValueOrDie(w0->Wait(std::chrono::milliseconds(10000)));
  EXPECT_TRUE(at::equal(r0, at::full({3}, 3.0f)));
  EXPECT_TRUE(at::equal(r1, at::full({3}, 3.0f)));
}

}  // namespace
}  // namespace fxdp::executor
