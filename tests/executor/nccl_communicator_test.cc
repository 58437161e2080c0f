// NcclCommunicator (executor/nccl/nccl_communicator.h). Every test that needs
// a GPU skips itself, naming the reason, where CudaDeviceCount() finds none;
// the two-rank tests need two GPUs (one per rank, as NCCL requires).
//
// CUDA tensors are made with the CUDA runtime and at::from_blob, so the test
// runs with the CPU-only torch wheel too (ATen cannot allocate on CUDA there).
#include "executor/nccl/nccl_communicator.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/ones.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "executor/nccl/nccl_info.h"
#include "tests/test_util.h"

namespace fxdp::executor {
namespace {

using ::fxdp::testing::StatusIs;
using ::fxdp::testing::ValueOrDie;

// Skips the test unless at least `n` CUDA devices are usable.
#define FXDP_REQUIRE_GPUS(n)                                                                     \
  do {                                                                                           \
    auto count_ = CudaDeviceCount();                                                             \
    if (!count_.ok()) GTEST_SKIP() << "needs " << (n) << " GPU(s): " << count_.status();         \
    if (*count_ < (n)) GTEST_SKIP() << "needs " << (n) << " GPUs, this machine has " << *count_; \
  } while (0)

// A contiguous CUDA tensor on `device` holding `host`.
template <typename T>
at::Tensor ToCuda(const std::vector<T>& host, at::ScalarType dtype, int device) {
  EXPECT_EQ(cudaSetDevice(device), cudaSuccess);
  const size_t bytes = host.size() * sizeof(T);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, bytes == 0 ? 1 : bytes), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, host.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  const c10::Device dev(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device));
  return at::from_blob(
      p, {static_cast<int64_t>(host.size())}, [](void* q) { cudaFree(q); },
      at::TensorOptions().dtype(dtype).device(dev), dev);
}

template <typename T>
std::vector<T> ToHost(const at::Tensor& t) {
  std::vector<T> out(static_cast<size_t>(t.numel()));
  EXPECT_EQ(
      cudaMemcpy(out.data(), t.const_data_ptr(), out.size() * sizeof(T), cudaMemcpyDeviceToHost),
      cudaSuccess);
  return out;
}

RendezvousOptions Opts(int rank, int world, std::chrono::milliseconds timeout) {
  RendezvousOptions o;
  o.rank = rank;
  o.world_size = world;
  o.timeout = timeout;
  return o;
}

constexpr std::chrono::seconds kLong(30);

TEST(NcclCommunicatorTest, WithoutADeviceConnectFailsCleanly) {
  if (CudaDeviceCount().ok()) GTEST_SKIP() << "a GPU is present (this checks the CPU-only error)";
  auto c = MakeNcclCommunicator(Opts(0, 1, kLong), 0);
  EXPECT_THAT(c.status(), StatusIs(absl::StatusCode::kUnavailable, "no usable CUDA device"));
  EXPECT_THAT(c.status(), StatusIs(absl::StatusCode::kUnavailable, "nccl rank 0/1 cuda:0"));
}

TEST(NcclCommunicatorTest, SingleRankAllReduceIsIdentity) {
  FXDP_REQUIRE_GPUS(1);
  auto comm = ValueOrDie(NcclCommunicator::Create({}, Opts(0, 1, kLong), 0));
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->world_size(), 1);
  EXPECT_EQ(comm->name(), "nccl rank 0/1 cuda:0");

  std::vector<float> x(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.5f * static_cast<float>(i) - 7.0f;
  at::Tensor in = ToCuda(x, at::kFloat, 0);
  auto work = ValueOrDie(comm->AllReduceSum(in));
  at::Tensor out = ValueOrDie(work->Wait(kLong));
  ASSERT_TRUE(out.is_cuda());
  EXPECT_EQ(out.scalar_type(), at::kFloat);
  EXPECT_EQ(out.sizes(), in.sizes());
  EXPECT_NE(out.const_data_ptr(), in.const_data_ptr());  // a new tensor
  EXPECT_EQ(ToHost<float>(out), x);
  EXPECT_EQ(ToHost<float>(in), x);  // the input is untouched
  EXPECT_FALSE(comm->aborted());
}

// FULLY_SHARD's two collectives over one rank: both a flattened copy.
TEST(NcclCommunicatorTest, SingleRankAllGatherAndReduceScatterAreFlatCopies) {
  FXDP_REQUIRE_GPUS(1);
  auto comm = ValueOrDie(NcclCommunicator::Create({}, Opts(0, 1, kLong), 0));
  std::vector<float> x(6 * 7);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.25f * static_cast<float>(i) - 3.0f;
  const at::Tensor in = ToCuda(x, at::kFloat, 0).view({6, 7});
  for (bool gather : {true, false}) {
    SCOPED_TRACE(gather ? "all_gather" : "reduce_scatter");
    auto work = ValueOrDie(gather ? comm->AllGather(in) : comm->ReduceScatterSum(in));
    at::Tensor out = ValueOrDie(work->Wait(kLong));
    ASSERT_TRUE(out.is_cuda());
    EXPECT_EQ(out.sizes(), c10::IntArrayRef({42}));
    EXPECT_NE(out.const_data_ptr(), in.const_data_ptr());
    EXPECT_EQ(ToHost<float>(out), x);
  }
  EXPECT_FALSE(comm->aborted());
}

TEST(NcclCommunicatorTest, SingleRankOtherDtypesAndManyInFlight) {
  FXDP_REQUIRE_GPUS(1);
  auto comm = ValueOrDie(NcclCommunicator::Create({}, Opts(0, 1, kLong), 0));
  std::vector<int64_t> l = {1, -2, 3, int64_t{1} << 40};
  std::vector<double> d = {1.25, -3.5};
  std::vector<uint8_t> b = {1, 0, 1};
  std::vector<std::unique_ptr<Work>> works;
  works.push_back(ValueOrDie(comm->AllReduceSum(ToCuda(l, at::kLong, 0))));
  works.push_back(ValueOrDie(comm->AllReduceSum(ToCuda(d, at::kDouble, 0))));
  works.push_back(ValueOrDie(comm->AllReduceSum(ToCuda(b, at::kBool, 0))));
  // The inputs' last references are gone: the Works keep them alive.
  for (int i = 0; i < 8; ++i)
    works.push_back(
        ValueOrDie(comm->AllReduceSum(ToCuda(std::vector<float>(4096, i), at::kFloat, 0))));
  // Waited in reverse order.
  for (int i = 7; i >= 0; --i)
    EXPECT_EQ(ToHost<float>(ValueOrDie(works[3 + i]->Wait(kLong))), std::vector<float>(4096, i));
  EXPECT_EQ(ToHost<uint8_t>(ValueOrDie(works[2]->Wait(kLong))), b);
  EXPECT_EQ(ToHost<double>(ValueOrDie(works[1]->Wait(kLong))), d);
  EXPECT_EQ(ToHost<int64_t>(ValueOrDie(works[0]->Wait(kLong))), l);
  // A Work dropped without Wait is fine.
  ValueOrDie(comm->AllReduceSum(ToCuda(std::vector<float>(16, 1.f), at::kFloat, 0)));
  // An empty tensor.
  at::Tensor empty = ValueOrDie(
      ValueOrDie(comm->AllReduceSum(ToCuda(std::vector<float>{}, at::kFloat, 0)))->Wait(kLong));
  EXPECT_EQ(empty.numel(), 0);
}

TEST(NcclCommunicatorTest, RejectsCpuTensorsAndUnsupportedDtypes) {
  FXDP_REQUIRE_GPUS(1);
  auto comm = ValueOrDie(NcclCommunicator::Create({}, Opts(0, 1, kLong), 0));
  EXPECT_THAT(comm->AllReduceSum(at::ones({3})).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "NCCL sums CUDA tensors"));
  std::vector<int16_t> s = {1, 2};
  EXPECT_THAT(comm->AllReduceSum(ToCuda(s, at::kShort, 0)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "NCCL cannot sum Short tensors"));
  EXPECT_FALSE(comm->aborted());
}

// The producer stream (torch's current stream, by default the legacy default
// stream; the legacy default stream with CPU-only torch) is held by a host
// function until `release` is set, so the all-reduce cannot start.
TEST(NcclCommunicatorTest, WaitTimesOutAndAbortsBehindABlockedStream) {
  FXDP_REQUIRE_GPUS(1);
  auto comm = ValueOrDie(NcclCommunicator::Create({}, Opts(0, 1, std::chrono::seconds(10)), 0));
  at::Tensor in = ToCuda(std::vector<float>(256, 2.f), at::kFloat, 0);
  static std::atomic<bool> release{false};
  ASSERT_EQ(cudaLaunchHostFunc(
                cudaStreamLegacy,
                [](void*) {
                  while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
                },
                nullptr),
            cudaSuccess);
  // Released later from another thread: aborting may wait for the device.
  std::thread releaser([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    release.store(true);
  });
  auto work = ValueOrDie(comm->AllReduceSum(in));
  const auto t0 = std::chrono::steady_clock::now();
  auto out = work->Wait(std::chrono::milliseconds(200));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(200));
  EXPECT_THAT(out.status(), StatusIs(absl::StatusCode::kDeadlineExceeded,
                                     "nccl rank 0/1 cuda:0: all_reduce #1 timed out after 200 ms"));
  EXPECT_TRUE(comm->aborted());
  EXPECT_THAT(comm->AllReduceSum(in).status(),
              StatusIs(absl::StatusCode::kUnavailable, "was aborted earlier"));
  releaser.join();
  work.reset();
  comm.reset();
}

TEST(NcclCommunicatorTest, InitTimesOutWhenAPeerNeverComes) {
  FXDP_REQUIRE_GPUS(1);
  auto store = c10::make_intrusive<c10d::HashStore>();
  const auto t0 = std::chrono::steady_clock::now();
  auto c = NcclCommunicator::Create(store, Opts(0, 2, std::chrono::seconds(2)), 0);
  EXPECT_THAT(c.status(), StatusIs(absl::StatusCode::kDeadlineExceeded,
                                   "nccl rank 0/2 cuda:0: NCCL initialisation timed out"));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
}

TEST(NcclCommunicatorTest, RankOneTimesOutWithoutRankZerosId) {
  FXDP_REQUIRE_GPUS(1);
  auto store = c10::make_intrusive<c10d::HashStore>();
  store->setTimeout(std::chrono::milliseconds(500));
  auto c = NcclCommunicator::Create(store, Opts(1, 2, std::chrono::seconds(2)), 0);
  EXPECT_THAT(c.status(), StatusIs(absl::StatusCode::kDeadlineExceeded,
                                   "nccl rank 1/2 cuda:0: waiting for rank 0's NCCL id"));
}

// Two ranks in two threads of this process, one GPU each, meeting in a HashStore.
TEST(NcclCommunicatorTest, TwoRanksSum) {
  FXDP_REQUIRE_GPUS(2);
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<float> got[2];
  absl::Status status[2];
  auto rank_main = [&](int r) {
    auto comm = NcclCommunicator::Create(store, Opts(r, 2, kLong), r, "two_ranks_sum");
    if (!comm.ok()) {
      status[r] = comm.status();
      return;
    }
    auto work = (*comm)->AllReduceSum(ToCuda(std::vector<float>(1 << 20, r + 1.f), at::kFloat, r));
    if (!work.ok()) {
      status[r] = work.status();
      return;
    }
    auto out = (*work)->Wait(kLong);
    if (!out.ok()) {
      status[r] = out.status();
      return;
    }
    got[r] = ToHost<float>(*out);
  };
  std::thread t0(rank_main, 0), t1(rank_main, 1);
  t0.join();
  t1.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    EXPECT_EQ(got[r], std::vector<float>(1 << 20, 3.f)) << "rank " << r;
  }
}

TEST(NcclCommunicatorTest, WaitTimesOutWhenAPeerSkipsTheCollective) {
  FXDP_REQUIRE_GPUS(2);
  auto store = c10::make_intrusive<c10d::HashStore>();
  absl::Status status[2];
  std::atomic<bool> rank0_done{false};
  auto rank_main = [&](int r) {
    auto comm = NcclCommunicator::Create(store, Opts(r, 2, std::chrono::seconds(5)), r, "skip");
    if (!comm.ok()) {
      status[r] = comm.status();
      return;
    }
    if (r == 1) {  // never joins the all-reduce; stays alive until rank 0 gave up
      while (!rank0_done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return;
    }
    auto work = (*comm)->AllReduceSum(ToCuda(std::vector<float>(1024, 1.f), at::kFloat, 0));
    status[0] = work.ok() ? (*work)->Wait(std::chrono::milliseconds(500)).status() : work.status();
    rank0_done.store(true);
  };
  std::thread t0(rank_main, 0), t1(rank_main, 1);
  t0.join();
  t1.join();
  EXPECT_THAT(status[0], StatusIs(absl::StatusCode::kDeadlineExceeded,
                                  "nccl rank 0/2 cuda:0: all_reduce #1 timed out after 500 ms"));
  EXPECT_TRUE(status[1].ok()) << status[1];
}

}  // namespace
}  // namespace fxdp::executor
