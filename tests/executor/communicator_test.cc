// The flat collectives FULLY_SHARD needs (all_gather_into_tensor,
// reduce_scatter_tensor) on the Local and Gloo communicators: real Gloo, 3
// ranks in one process over a TCPStore on 127.0.0.1. (NCCL: the gpu-labelled
// nccl_communicator_test.)
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "executor/communicator.h"
#include "executor/gloo/gloo_communicator.h"
#include "executor/gloo/host_staged_communicator.h"
#include "executor/safetensors.h"
#include "executor/timed_communicator.h"
#include "executor/worker/sharded_state.h"
#include "tests/executor/local_rendezvous.h"
#include "tests/test_util.h"

namespace fxdp::executor {
namespace {

using ::fxdp::testing::LocalRendezvous;
using ::fxdp::testing::StatusIs;
using ::fxdp::testing::ValueOrDie;

constexpr std::chrono::milliseconds kWait(20000);

TEST(LocalCommunicatorTest, GatherAndScatterOverOneRankAreFlatCopies) {
  LocalCommunicator c;
  const at::Tensor x = at::arange(6, at::kFloat).reshape({2, 3});
  const at::Tensor g = ValueOrDie(ValueOrDie(c.AllGather(x))->Wait(kWait));
  EXPECT_TRUE(at::equal(g, at::arange(6, at::kFloat)));
  EXPECT_NE(g.data_ptr(), x.data_ptr());
  const at::Tensor s = ValueOrDie(ValueOrDie(c.ReduceScatterSum(x))->Wait(kWait));
  EXPECT_TRUE(at::equal(s, at::arange(6, at::kFloat)));
}

// N Gloo communicators, one per thread, over one store.
std::vector<std::unique_ptr<GlooCommunicator>> GlooRanks(int world) {
  const LocalRendezvous rv(world, kWait);
  std::vector<std::unique_ptr<GlooCommunicator>> comms(world);
  std::vector<std::thread> threads;
  for (int r = 1; r < world; ++r) {
    threads.emplace_back([&, r] { comms[r] = ValueOrDie(rv.Communicator(r)); });
  }
  comms[0] = ValueOrDie(rv.Communicator(0));
  for (std::thread& t : threads) t.join();
  return comms;
}

TEST(GlooCommunicatorTest, AllGatherAndReduceScatterOverThreeRanks) {
  constexpr int kWorld = 3;
  auto comms = GlooRanks(kWorld);
  std::vector<at::Tensor> gathered(kWorld), scattered(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      // InferenceMode as the interpreter runs: the inputs are inference tensors.
      c10::InferenceMode im;
      TimedCommunicator timed(comms[r].get());
      // Shard of rank r: [10r, 10r+1]; gathered: [0, 1, 10, 11, 20, 21].
      const at::Tensor shard = at::arange(2, at::kFloat) + 10.0 * r;
      auto wg = ValueOrDie(timed.AllGather(shard));
      // Rank r contributes (r + 1) * [0..5]: the sum is 6 * [0..5]; rank r keeps 2 elements.
      const at::Tensor full = at::arange(6, at::kFloat).reshape({2, 3}) * (r + 1);
      auto ws = ValueOrDie(timed.ReduceScatterSum(full));
      gathered[r] = ValueOrDie(wg->Wait(kWait));
      scattered[r] = ValueOrDie(ws->Wait(kWait));
      EXPECT_EQ(timed.stats().collectives, 2);
    });
  }
  for (std::thread& t : threads) t.join();
  const at::Tensor want = at::tensor({0.f, 1.f, 10.f, 11.f, 20.f, 21.f});
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(at::equal(gathered[r], want)) << r << ": " << gathered[r];
    EXPECT_TRUE(at::equal(scattered[r], at::arange(2, at::kFloat) * 6 + 12.0 * r))
        << r << ": " << scattered[r];
  }
}

// Host staging (Gloo on cuda:N) over two Gloo ranks; the tensors here are on
// the CPU (the GPU path is gpu_check.sh's): inputs are copied, never touched,
// and non-contiguous inference-mode inputs work as the interpreter passes them.
TEST(HostStagedCommunicatorTest, TwoRanksAllThreeCollectives) {
  auto gloo = GlooRanks(2);
  std::vector<std::unique_ptr<HostStagedCommunicator>> comms;
  for (auto& g : gloo) comms.push_back(std::make_unique<HostStagedCommunicator>(std::move(g)));
  EXPECT_EQ(comms[1]->name(), "gloo rank 1/2 (host-staged)");
  std::vector<std::vector<at::Tensor>> got(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      c10::InferenceMode im;
      const at::Tensor x = (at::arange(6, at::kFloat).reshape({3, 2}) * (r + 1)).t();
      auto a = ValueOrDie(comms[r]->AllReduceSum(x));
      auto g = ValueOrDie(comms[r]->AllGather(x));
      auto s = ValueOrDie(comms[r]->ReduceScatterSum(x));
      got[r] = {ValueOrDie(a->Wait(kWait)), ValueOrDie(g->Wait(kWait)), ValueOrDie(s->Wait(kWait))};
      EXPECT_TRUE(at::equal(x, (at::arange(6, at::kFloat).reshape({3, 2}) * (r + 1)).t()));
    });
  }
  for (std::thread& t : threads) t.join();
  const at::Tensor x1 = at::arange(6, at::kFloat).reshape({3, 2}).t();
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(at::equal(got[r][0], x1 * 3)) << got[r][0];
    EXPECT_TRUE(at::equal(got[r][1], at::cat({x1.reshape({-1}), x1.reshape({-1}) * 2})));
    EXPECT_TRUE(at::equal(got[r][2], (x1 * 3).reshape({-1}).narrow(0, 3 * r, 3)));
  }
}

TEST(GlooCommunicatorTest, ReduceScatterOfANumelNotDivisibleByTheWorldIsRefused) {
  auto comms = GlooRanks(2);
  EXPECT_THAT(comms[0]->ReduceScatterSum(at::ones({3})).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "gloo rank 0/2: reduce_scatter_tensor of 3 elements, not a multiple of the "
                       "world size 2"));
}

// A donated reduce-scatter reduces in place; once its all-reduce is done,
// Poll keeps this rank's chunk and releases the whole buffer before Wait.
TEST(GlooCommunicatorTest, DonatedReduceScatterReleasesItsBufferWhenPolledAfterItIsDone) {
  constexpr int kWorld = 2;
  auto comms = GlooRanks(kWorld);
  std::vector<at::Tensor> mine(kWorld);
  std::vector<bool> released(kWorld, false);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      c10::InferenceMode im;
      at::Tensor buf = at::arange(8, at::kFloat) * (r + 1);  // the sum: 3 * [0..7]
      c10::weak_intrusive_ptr<c10::StorageImpl> weak(buf.storage().getWeakStorageImpl());
      auto w = ValueOrDie(comms[r]->ReduceScatterSumDonated(std::move(buf)));
      const auto deadline = std::chrono::steady_clock::now() + kWait;
      while (!weak.expired() && std::chrono::steady_clock::now() < deadline) {
        w->Poll();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      released[r] = weak.expired();
      mine[r] = ValueOrDie(w->Wait(kWait));
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(released[r]) << r;
    EXPECT_TRUE(at::equal(mine[r], (at::arange(4, at::kFloat) + 4 * r) * 3))
        << r << ": " << mine[r];
  }
}

// fxdp-worker run's FULLY_SHARD state: each rank reads its slices of the
// file, gathers them back for --out.
TEST(ShardedStateTest, ReadSlicesThenGatherRoundTripsUnevenTensors) {
  constexpr int kWorld = 3;
  auto comms = GlooRanks(kWorld);
  // w: 10 elements (s = 4: rank 2 holds 2 real + 2 zeros); b: 2 elements (rank 2: padding only).
  const std::map<std::string, at::Tensor> whole = {
      {"w", at::arange(10, at::kFloat).reshape({2, 5})},
      {"b", at::tensor({7.f, 8.f})},
      {"step", at::tensor(3.f)}};
  const std::string path = ::testing::TempDir() + "/sharded_state_test.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, whole).ok());
  std::vector<std::map<std::string, at::Tensor>> shards(kWorld), back(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      std::map<std::string, std::vector<int64_t>> shapes;
      shards[r] = ValueOrDie(ReadRankState(path, {"w", "b"}, kWorld, r, &shapes)).tensors;
      EXPECT_EQ(shapes.at("w"), (std::vector<int64_t>{2, 5}));
      back[r] = ValueOrDie(UnshardState(shards[r], shapes, *comms[r], kWait));
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(at::equal(shards[0]["w"], at::tensor({0.f, 1.f, 2.f, 3.f})));
  EXPECT_TRUE(at::equal(shards[2]["w"], at::tensor({8.f, 9.f, 0.f, 0.f})));
  EXPECT_TRUE(at::equal(shards[1]["b"], at::tensor({8.f})));
  EXPECT_TRUE(at::equal(shards[2]["b"], at::tensor({0.f})));
  EXPECT_TRUE(at::equal(shards[2]["step"], whole.at("step")));
  for (int r = 0; r < kWorld; ++r) {
    for (const auto& [k, v] : whole) EXPECT_TRUE(at::equal(back[r].at(k), v)) << r << " " << k;
  }
  std::map<std::string, std::vector<int64_t>> shapes;
  EXPECT_THAT(ReadRankState(path, {"w", "v"}, 2, 0, &shapes).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "the state has no tensor 'v'"));
}

}  // namespace
}  // namespace fxdp::executor
