// fxdp_allreduce_bench: all-reduce (sum, float32) time and bandwidth through
// fxdp's communicator against the library it wraps, called directly
// (bench/README.md, area 5 and "The programs"). One process per rank, launched
// like fxdp-worker: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
//
//   RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=P
//   fxdp_allreduce_bench [--device=cpu|cuda] [--min_bytes=1024]
//       [--max_bytes=67108864] [--factor=2] [--reps=3] [--budget_mb=128]
//       [--json=OUT]
//
// --device=cpu (Gloo, c10d ProcessGroupGloo over a c10d TCPStore), each
// repetition and size, in rotating order:
//   fxdp          GlooCommunicator::AllReduceSumDonated + Work::Wait: in place,
//                 as the interpreter reduces a gradient bucket at its last use
//   fxdp (copy)   GlooCommunicator::AllReduceSum + Work::Wait: the functional
//                 collective (a new result tensor; the input copied first)
//   c10d Gloo     ProcessGroupGloo::allreduce({t}, SUM) + Work::wait(), on the
//                 same kind of process group, created directly (its own
//                 group, under a PrefixStore)
// --device=cuda (built with NCCL, a GPU per rank: cuda:RANK):
//   fxdp          NcclCommunicator::AllReduceSum + Work::Wait
//   raw NCCL      ncclAllReduce on cudaMalloc'ed buffers + cudaStreamSynchronize
//
// Every iteration is start + wait (one collective in flight). Per size:
// 2 untimed iterations (the first checks the sum), then
// clamp(budget / bytes, 5, 1000) timed ones, begun together after a barrier;
// the time of one all-reduce is the loop's wall time on rank 0 / iterations.
// Rank 0 prints (or writes) JSON: for every implementation and size the time
// in µs of each repetition. algbw = bytes / time, busbw = algbw * 2(n-1)/n
// (as nccl-tests) are left to the reader (bench/run_all.py).
//
// Exit codes: 0 ok, 1 a failure (message on stderr), 2 usage.
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/core/InferenceMode.h>
#include <signal.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "executor/communicator.h"
#include "executor/gloo/gloo_backend.h"
#include "executor/gloo/gloo_communicator.h"

#ifdef FXDP_HAVE_NCCL
#include <ATen/ops/from_blob.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "executor/nccl/nccl_communicator.h"
#include "executor/nccl/nccl_info.h"
#endif

namespace {

using fxdp::executor::Communicator;
using fxdp::executor::RendezvousOptions;
using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "fxdp_allreduce_bench: %s\n", what.c_str());
  std::fflush(stderr);
  // Gloo's threads may still hold a collective; do not run destructors.
  std::_Exit(1);
}

int EnvInt(const char* name, int dflt) {
  const char* v = std::getenv(name);
  int x = dflt;
  if (v != nullptr && !absl::SimpleAtoi(v, &x)) Die(absl::StrCat(name, " is not an integer: ", v));
  return x;
}

bool Flag(const char* arg, const char* name, std::string* value) {
  const size_t n = std::strlen(name);
  if (std::strncmp(arg, name, n) != 0 || arg[n] != '=') return false;
  *value = arg + n + 1;
  return true;
}

// One implementation: `setup(numel)` prepares its buffers for a size,
// `run(check)` does one all-reduce (start + wait); with `check` it also
// verifies the sum (every rank contributes rank + 1).
struct Impl {
  std::string name;
  std::function<void(int64_t numel)> setup;
  std::function<void(bool check)> run;
};

constexpr std::chrono::milliseconds kWait(120000);

void CheckSum(const at::Tensor& t, int world, const std::string& who) {
  const float want = static_cast<float>(world * (world + 1) / 2);
  const float* p = t.const_data_ptr<float>();
  const int64_t n = t.numel();
  for (int64_t i : {int64_t{0}, n / 2, n - 1}) {
    if (p[i] != want) Die(absl::StrCat(who, ": element ", i, " is ", p[i], ", want ", want));
  }
}

}  // namespace

int main(int argc, char** argv) {
  // A write to a dead peer's socket must fail, not kill this process.
  signal(SIGPIPE, SIG_IGN);
  std::string device = "cpu", json_path, v;
  int64_t min_bytes = 1024, max_bytes = int64_t{64} << 20, factor = 2, reps = 3, budget_mb = 128;
  for (int i = 1; i < argc; ++i) {
    if (Flag(argv[i], "--device", &device) || Flag(argv[i], "--json", &json_path)) continue;
    int64_t* target = nullptr;
    if (Flag(argv[i], "--min_bytes", &v))
      target = &min_bytes;
    else if (Flag(argv[i], "--max_bytes", &v))
      target = &max_bytes;
    else if (Flag(argv[i], "--factor", &v))
      target = &factor;
    else if (Flag(argv[i], "--reps", &v))
      target = &reps;
    else if (Flag(argv[i], "--budget_mb", &v))
      target = &budget_mb;
    if (target == nullptr || !absl::SimpleAtoi(v, target) || *target < 1) {
      std::fprintf(stderr,
                   "usage: RANK=r WORLD_SIZE=n MASTER_ADDR=a MASTER_PORT=p fxdp_allreduce_bench "
                   "[--device=cpu|cuda] [--min_bytes=B] [--max_bytes=B] [--factor=F] [--reps=R] "
                   "[--budget_mb=M] [--json=OUT]\n");
      return 2;
    }
  }
  if (factor < 2 || min_bytes < 4 || max_bytes < min_bytes ||
      (device != "cpu" && device != "cuda")) {
    std::fprintf(stderr,
                 "fxdp_allreduce_bench: need --factor >= 2, 4 <= min <= max bytes, "
                 "--device cpu or cuda\n");
    return 2;
  }
  RendezvousOptions ro;
  ro.rank = EnvInt("RANK", 0);
  ro.world_size = EnvInt("WORLD_SIZE", 1);
  ro.port = EnvInt("MASTER_PORT", 29500);
  if (const char* h = std::getenv("MASTER_ADDR")) ro.host = h;
  ro.timeout = kWait;
  const int rank = ro.rank, world = ro.world_size;

  auto store = fxdp::executor::ConnectStore(ro);
  if (!store.ok()) Die(store.status().ToString());
  // The raw group: also the barrier before each timed loop.
  c10::intrusive_ptr<c10d::Store> raw_store =
      c10::make_intrusive<c10d::PrefixStore>("bench/raw", *store);
  auto raw = fxdp::executor::CreateGlooBackend(raw_store, ro, ro.host);
  if (!raw.ok()) Die(raw.status().ToString());
  c10::intrusive_ptr<c10d::Backend> raw_pg = *raw;
  auto barrier = [&] {
    try {
      raw_pg->barrier()->wait(kWait);
    } catch (const std::exception& e) {
      Die(absl::StrCat("barrier: ", e.what()));
    }
  };

  std::vector<Impl> impls;
  std::unique_ptr<Communicator> comm;
  // CPU state.
  at::Tensor donated, input, raw_buf;
  if (device == "cpu") {
    c10::intrusive_ptr<c10d::Store> fx_store =
        c10::make_intrusive<c10d::PrefixStore>("bench/fxdp", *store);
    auto c = fxdp::executor::GlooCommunicator::Create(fx_store, ro, ro.host);
    if (!c.ok()) Die(c.status().ToString());
    comm = *std::move(c);
    Communicator* cm = comm.get();
    impls.push_back(Impl{
        "fxdp", [&, rank](int64_t n) { donated = at::full({n}, static_cast<float>(rank + 1)); },
        [&, cm, world](bool check) {
          auto w = cm->AllReduceSumDonated(std::move(donated));
          if (!w.ok()) Die(w.status().ToString());
          auto r = (*w)->Wait(kWait);
          if (!r.ok()) Die(r.status().ToString());
          donated = *std::move(r);  // reduced in place: the same buffer, reused
          if (check) {
            CheckSum(donated, world, "fxdp");
            donated.zero_();
          }
        }});
    impls.push_back(
        Impl{"fxdp (copy)",
             [&, rank](int64_t n) { input = at::full({n}, static_cast<float>(rank + 1)); },
             [&, cm, world](bool check) {
               auto w = cm->AllReduceSum(input);
               if (!w.ok()) Die(w.status().ToString());
               auto r = (*w)->Wait(kWait);
               if (!r.ok()) Die(r.status().ToString());
               if (check) {
                 CheckSum(*r, world, "fxdp (copy)");
                 input.zero_();
               }
             }});
    impls.push_back(
        Impl{"c10d Gloo",
             [&, rank](int64_t n) { raw_buf = at::full({n}, static_cast<float>(rank + 1)); },
             [&, world](bool check) {
               try {
                 std::vector<at::Tensor> ts{raw_buf};
                 c10d::AllreduceOptions o;
                 o.reduceOp = c10d::ReduceOp::SUM;
                 raw_pg->allreduce(ts, o)->wait(kWait);
               } catch (const std::exception& e) {
                 Die(absl::StrCat("c10d allreduce: ", e.what()));
               }
               if (check) {
                 CheckSum(raw_buf, world, "c10d Gloo");
                 raw_buf.zero_();
               }
             }});
  } else {
#ifdef FXDP_HAVE_NCCL
    auto count = fxdp::executor::CudaDeviceCount();
    if (!count.ok()) Die(absl::StrCat("--device cuda: ", count.status().ToString()));
    const int dev = rank % *count;
    auto c = fxdp::executor::NcclCommunicator::Create(*store, ro, dev);
    if (!c.ok()) Die(c.status().ToString());
    comm = *std::move(c);
    Communicator* cm = comm.get();
    // Raw NCCL: its own communicator (rank 0 publishes the id in the store).
    static ncclComm_t nccl = nullptr;
    static cudaStream_t stream = nullptr;
    static void* send = nullptr;
    static void* recv = nullptr;
    ncclUniqueId id;
    if (rank == 0) {
      if (ncclGetUniqueId(&id) != ncclSuccess) Die("ncclGetUniqueId failed");
      std::vector<uint8_t> b(reinterpret_cast<uint8_t*>(&id),
                             reinterpret_cast<uint8_t*>(&id) + sizeof id);
      (*store)->set("bench/raw_nccl_id", b);
    } else {
      std::vector<uint8_t> b = (*store)->get("bench/raw_nccl_id");
      if (b.size() != sizeof id) Die("bad raw NCCL id in the store");
      std::memcpy(&id, b.data(), sizeof id);
    }
    if (cudaSetDevice(dev) != cudaSuccess || cudaStreamCreate(&stream) != cudaSuccess) {
      Die("cannot set up CUDA device " + std::to_string(dev));
    }
    if (ncclCommInitRank(&nccl, world, id, rank) != ncclSuccess) Die("ncclCommInitRank failed");
    const c10::Device cdev(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(dev));
    static at::Tensor cuda_in;
    impls.push_back(Impl{"fxdp",
                         [&, cdev](int64_t n) {
                           void* p = nullptr;
                           cuda_in = at::Tensor();
                           if (cudaMalloc(&p, n * 4) != cudaSuccess ||
                               cudaMemset(p, 0, n * 4) != cudaSuccess) {
                             Die("cudaMalloc failed");
                           }
                           cuda_in = at::from_blob(
                               p, {n}, [](void* q) { cudaFree(q); },
                               at::TensorOptions().dtype(at::kFloat).device(cdev), cdev);
                         },
                         [&, cm](bool) {
                           auto w = cm->AllReduceSum(cuda_in);
                           if (!w.ok()) Die(w.status().ToString());
                           auto r = (*w)->Wait(kWait);
                           if (!r.ok()) Die(r.status().ToString());
                         }});
    static int64_t raw_n = 0;
    impls.push_back(Impl{"raw NCCL",
                         [&](int64_t n) {
                           if (send != nullptr) cudaFree(send);
                           if (recv != nullptr) cudaFree(recv);
                           if (cudaMalloc(&send, n * 4) != cudaSuccess ||
                               cudaMalloc(&recv, n * 4) != cudaSuccess ||
                               cudaMemset(send, 0, n * 4) != cudaSuccess) {
                             Die("cudaMalloc failed");
                           }
                           raw_n = n;
                         },
                         [&](bool) {
                           if (ncclAllReduce(send, recv, static_cast<size_t>(raw_n), ncclFloat,
                                             ncclSum, nccl, stream) != ncclSuccess ||
                               cudaStreamSynchronize(stream) != cudaSuccess) {
                             Die("ncclAllReduce failed");
                           }
                         }});
#else
    Die("--device cuda: this build has no NCCL (FXDP_HAVE_NCCL is not set: no CUDA toolkit or "
        "NCCL when it was configured)");
#endif
  }

  std::vector<int64_t> sizes;
  for (int64_t b = min_bytes; b <= max_bytes; b *= factor) sizes.push_back(b / 4 * 4);
  // times[impl][size][rep], µs per all-reduce.
  std::vector<std::vector<std::vector<double>>> times(
      impls.size(), std::vector<std::vector<double>>(sizes.size()));
  std::vector<int64_t> iters(sizes.size());
  const int64_t budget = budget_mb << 20;
  c10::InferenceMode guard(false);
  for (int64_t rep = 0; rep < reps; ++rep) {
    for (size_t s = 0; s < sizes.size(); ++s) {
      const int64_t numel = sizes[s] / 4;
      iters[s] = std::clamp<int64_t>(budget / sizes[s], 5, 1000);
      for (size_t k = 0; k < impls.size(); ++k) {
        // Rotate the order with the repetition and the size.
        const size_t i = (k + static_cast<size_t>(rep) + s) % impls.size();
        Impl& impl = impls[i];
        impl.setup(numel);
        impl.run(/*check=*/device == "cpu");
        impl.run(false);
        barrier();
        const Clock::time_point t0 = Clock::now();
        for (int64_t it = 0; it < iters[s]; ++it) impl.run(false);
        const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() /
                          static_cast<double>(iters[s]);
        times[i][s].push_back(us);
      }
    }
    if (rank == 0) {
      std::fprintf(stderr, "rep %lld/%lld done\n", static_cast<long long>(rep + 1),
                   static_cast<long long>(reps));
    }
  }
  barrier();

  if (rank == 0) {
    std::string j =
        "{\n  \"device\": \"" + device + "\",\n  \"world_size\": " + std::to_string(world) +
        ",\n  \"reps\": " + std::to_string(reps) + ",\n  \"dtype\": \"float32\",\n  \"bytes\": [";
    for (size_t s = 0; s < sizes.size(); ++s) j += (s ? ", " : "") + std::to_string(sizes[s]);
    j += "],\n  \"iterations\": [";
    for (size_t s = 0; s < sizes.size(); ++s) j += (s ? ", " : "") + std::to_string(iters[s]);
    j += "],\n  \"time_us\": {";
    for (size_t i = 0; i < impls.size(); ++i) {
      j += (i ? ",\n" : "\n") + std::string("    \"") + impls[i].name + "\": [";
      for (size_t s = 0; s < sizes.size(); ++s) {
        j += s ? ", [" : "[";
        for (size_t r = 0; r < times[i][s].size(); ++r) {
          char buf[32];
          std::snprintf(buf, sizeof buf, "%s%.3f", r ? ", " : "", times[i][s][r]);
          j += buf;
        }
        j += "]";
      }
      j += "]";
    }
    j += "\n  }\n}\n";
    if (json_path.empty()) {
      std::fputs(j.c_str(), stdout);
    } else {
      std::ofstream f(json_path);
      f << j;
      if (!f.good()) Die("cannot write " + json_path);
    }
  }
  std::fflush(stdout);
  // Both ranks passed the last barrier: leave without tearing Gloo down
  // (DEVELOPMENT.md: destroying a group its peer still uses can abort).
  std::_Exit(0);
}
