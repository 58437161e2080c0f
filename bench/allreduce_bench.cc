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

struct Args {
  std::string device = "cpu", json_path;
  int64_t min_bytes = 1024, max_bytes = int64_t{64} << 20, factor = 2, reps = 3, budget_mb = 128;
};

// The command line into `a`: 0, or 2 after a usage message.
int ParseArgs(int argc, char** argv, Args* a) {
  std::string v;
  for (int i = 1; i < argc; ++i) {
    if (Flag(argv[i], "--device", &a->device) || Flag(argv[i], "--json", &a->json_path)) continue;
    int64_t* target = nullptr;
    if (Flag(argv[i], "--min_bytes", &v))
      target = &a->min_bytes;
    else if (Flag(argv[i], "--max_bytes", &v))
      target = &a->max_bytes;
    else if (Flag(argv[i], "--factor", &v))
      target = &a->factor;
    else if (Flag(argv[i], "--reps", &v))
      target = &a->reps;
    else if (Flag(argv[i], "--budget_mb", &v))
      target = &a->budget_mb;
    if (target == nullptr || !absl::SimpleAtoi(v, target) || *target < 1) {
      std::fprintf(stderr,
                   "usage: RANK=r WORLD_SIZE=n MASTER_ADDR=a MASTER_PORT=p fxdp_allreduce_bench "
                   "[--device=cpu|cuda] [--min_bytes=B] [--max_bytes=B] [--factor=F] [--reps=R] "
                   "[--budget_mb=M] [--json=OUT]\n");
      return 2;
    }
  }
  if (a->factor < 2 || a->min_bytes < 4 || a->max_bytes < a->min_bytes ||
      (a->device != "cpu" && a->device != "cuda")) {
    std::fprintf(stderr,
                 "fxdp_allreduce_bench: need --factor >= 2, 4 <= min <= max bytes, "
                 "--device cpu or cuda\n");
    return 2;
  }
  return 0;
}

// One rank's benchmark: the store, the raw Gloo group (also the barrier
// before each timed loop), fxdp's communicator and the implementations timed.
struct Bench {
  Args args;
  RendezvousOptions ro;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> raw_pg;
  std::unique_ptr<Communicator> comm;
  at::Tensor donated, input, raw_buf;  // the CPU implementations' buffers
  std::vector<Impl> impls;

  void Barrier() {
    try {
      raw_pg->barrier()->wait(kWait);
    } catch (const std::exception& e) {
      Die(absl::StrCat("barrier: ", e.what()));
    }
  }
};

// RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT: the store and the raw group.
void Connect(Bench& b) {
  RendezvousOptions& ro = b.ro;
  ro.rank = EnvInt("RANK", 0);
  ro.world_size = EnvInt("WORLD_SIZE", 1);
  ro.port = EnvInt("MASTER_PORT", 29500);
  if (const char* h = std::getenv("MASTER_ADDR")) ro.host = h;
  ro.timeout = kWait;
  auto store = fxdp::executor::ConnectStore(ro);
  if (!store.ok()) Die(store.status().ToString());
  b.store = *store;
  c10::intrusive_ptr<c10d::Store> raw_store =
      c10::make_intrusive<c10d::PrefixStore>("bench/raw", b.store);
  auto raw = fxdp::executor::CreateGlooBackend(raw_store, ro, ro.host);
  if (!raw.ok()) Die(raw.status().ToString());
  b.raw_pg = *raw;
}

// --device=cpu: fxdp in place, fxdp copying, c10d's ProcessGroupGloo.
void AddGlooImpls(Bench& b) {
  const int rank = b.ro.rank, world = b.ro.world_size;
  c10::intrusive_ptr<c10d::Store> fx_store =
      c10::make_intrusive<c10d::PrefixStore>("bench/fxdp", b.store);
  auto c = fxdp::executor::GlooCommunicator::Create(fx_store, b.ro, b.ro.host);
  if (!c.ok()) Die(c.status().ToString());
  b.comm = *std::move(c);
  Communicator* cm = b.comm.get();
  b.impls.push_back(Impl{
      "fxdp", [&b, rank](int64_t n) { b.donated = at::full({n}, static_cast<float>(rank + 1)); },
      [&b, cm, world](bool check) {
        auto w = cm->AllReduceSumDonated(std::move(b.donated));
        if (!w.ok()) Die(w.status().ToString());
        auto r = (*w)->Wait(kWait);
        if (!r.ok()) Die(r.status().ToString());
        b.donated = *std::move(r);  // reduced in place: the same buffer, reused
        if (check) {
          CheckSum(b.donated, world, "fxdp");
          b.donated.zero_();
        }
      }});
  b.impls.push_back(
      Impl{"fxdp (copy)",
           [&b, rank](int64_t n) { b.input = at::full({n}, static_cast<float>(rank + 1)); },
           [&b, cm, world](bool check) {
             auto w = cm->AllReduceSum(b.input);
             if (!w.ok()) Die(w.status().ToString());
             auto r = (*w)->Wait(kWait);
             if (!r.ok()) Die(r.status().ToString());
             if (check) {
               CheckSum(*r, world, "fxdp (copy)");
               b.input.zero_();
             }
           }});
  b.impls.push_back(
      Impl{"c10d Gloo",
           [&b, rank](int64_t n) { b.raw_buf = at::full({n}, static_cast<float>(rank + 1)); },
           [&b, world](bool check) {
             try {
               std::vector<at::Tensor> ts{b.raw_buf};
               c10d::AllreduceOptions o;
               o.reduceOp = c10d::ReduceOp::SUM;
               b.raw_pg->allreduce(ts, o)->wait(kWait);
             } catch (const std::exception& e) {
               Die(absl::StrCat("c10d allreduce: ", e.what()));
             }
             if (check) {
               CheckSum(b.raw_buf, world, "c10d Gloo");
               b.raw_buf.zero_();
             }
           }});
}

#ifdef FXDP_HAVE_NCCL
// --device=cuda: fxdp's NcclCommunicator and raw NCCL (its own communicator,
// rank 0 publishing the id in the store).
void AddNcclImpls(Bench& b) {
  const int rank = b.ro.rank, world = b.ro.world_size;
  auto count = fxdp::executor::CudaDeviceCount();
  if (!count.ok()) Die(absl::StrCat("--device cuda: ", count.status().ToString()));
  const int dev = rank % *count;
  auto c = fxdp::executor::NcclCommunicator::Create(b.store, b.ro, dev);
  if (!c.ok()) Die(c.status().ToString());
  b.comm = *std::move(c);
  Communicator* cm = b.comm.get();
  static ncclComm_t nccl = nullptr;
  static cudaStream_t stream = nullptr;
  static void* send = nullptr;
  static void* recv = nullptr;
  ncclUniqueId id;
  if (rank == 0) {
    if (ncclGetUniqueId(&id) != ncclSuccess) Die("ncclGetUniqueId failed");
    std::vector<uint8_t> bytes(reinterpret_cast<uint8_t*>(&id),
                               reinterpret_cast<uint8_t*>(&id) + sizeof id);
    b.store->set("bench/raw_nccl_id", bytes);
  } else {
    std::vector<uint8_t> bytes = b.store->get("bench/raw_nccl_id");
    if (bytes.size() != sizeof id) Die("bad raw NCCL id in the store");
    std::memcpy(&id, bytes.data(), sizeof id);
  }
  if (cudaSetDevice(dev) != cudaSuccess || cudaStreamCreate(&stream) != cudaSuccess) {
    Die("cannot set up CUDA device " + std::to_string(dev));
  }
  if (ncclCommInitRank(&nccl, world, id, rank) != ncclSuccess) Die("ncclCommInitRank failed");
  const c10::Device cdev(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(dev));
  static at::Tensor cuda_in;
  b.impls.push_back(Impl{"fxdp",
                         [cdev](int64_t n) {
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
                         [cm](bool) {
                           auto w = cm->AllReduceSum(cuda_in);
                           if (!w.ok()) Die(w.status().ToString());
                           auto r = (*w)->Wait(kWait);
                           if (!r.ok()) Die(r.status().ToString());
                         }});
  static int64_t raw_n = 0;
  b.impls.push_back(Impl{"raw NCCL",
                         [](int64_t n) {
                           if (send != nullptr) cudaFree(send);
                           if (recv != nullptr) cudaFree(recv);
                           if (cudaMalloc(&send, n * 4) != cudaSuccess ||
                               cudaMalloc(&recv, n * 4) != cudaSuccess ||
                               cudaMemset(send, 0, n * 4) != cudaSuccess) {
                             Die("cudaMalloc failed");
                           }
                           raw_n = n;
                         },
                         [](bool) {
                           if (ncclAllReduce(send, recv, static_cast<size_t>(raw_n), ncclFloat,
                                             ncclSum, nccl, stream) != ncclSuccess ||
                               cudaStreamSynchronize(stream) != cudaSuccess) {
                             Die("ncclAllReduce failed");
                           }
                         }});
}
#else
void AddNcclImpls(Bench&) {
  Die("--device cuda: this build has no NCCL (FXDP_HAVE_NCCL is not set: no CUDA toolkit or "
      "NCCL when it was configured)");
}
#endif

// What the timed loops measured: per size its bytes and iterations; per
// implementation, size and repetition the µs of one all-reduce.
struct Timings {
  std::vector<int64_t> sizes, iters;
  std::vector<std::vector<std::vector<double>>> times;  // [impl][size][rep]
};

// Every repetition, size and implementation (in rotating order): set up,
// 2 untimed all-reduces (the first checks the sum on the CPU), a barrier,
// then the timed loop.
Timings Measure(Bench& b) {
  const Args& a = b.args;
  Timings t;
  for (int64_t bytes = a.min_bytes; bytes <= a.max_bytes; bytes *= a.factor)
    t.sizes.push_back(bytes / 4 * 4);
  t.times.assign(b.impls.size(), std::vector<std::vector<double>>(t.sizes.size()));
  t.iters.resize(t.sizes.size());
  const int64_t budget = a.budget_mb << 20;
  c10::InferenceMode guard(false);
  for (int64_t rep = 0; rep < a.reps; ++rep) {
    for (size_t s = 0; s < t.sizes.size(); ++s) {
      const int64_t numel = t.sizes[s] / 4;
      t.iters[s] = std::clamp<int64_t>(budget / t.sizes[s], 5, 1000);
      for (size_t k = 0; k < b.impls.size(); ++k) {
        // Rotate the order with the repetition and the size.
        const size_t i = (k + static_cast<size_t>(rep) + s) % b.impls.size();
        Impl& impl = b.impls[i];
        impl.setup(numel);
        impl.run(/*check=*/a.device == "cpu");
        impl.run(false);
        b.Barrier();
        const Clock::time_point t0 = Clock::now();
        for (int64_t it = 0; it < t.iters[s]; ++it) impl.run(false);
        const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() /
                          static_cast<double>(t.iters[s]);
        t.times[i][s].push_back(us);
      }
    }
    if (b.ro.rank == 0) {
      std::fprintf(stderr, "rep %lld/%lld done\n", static_cast<long long>(rep + 1),
                   static_cast<long long>(a.reps));
    }
  }
  return t;
}

std::string ResultJson(const Bench& b, const Timings& t) {
  std::string j = "{\n  \"device\": \"" + b.args.device +
                  "\",\n  \"world_size\": " + std::to_string(b.ro.world_size) +
                  ",\n  \"reps\": " + std::to_string(b.args.reps) +
                  ",\n  \"dtype\": \"float32\",\n  \"bytes\": [";
  for (size_t s = 0; s < t.sizes.size(); ++s) j += (s ? ", " : "") + std::to_string(t.sizes[s]);
  j += "],\n  \"iterations\": [";
  for (size_t s = 0; s < t.sizes.size(); ++s) j += (s ? ", " : "") + std::to_string(t.iters[s]);
  j += "],\n  \"time_us\": {";
  for (size_t i = 0; i < b.impls.size(); ++i) {
    j += (i ? ",\n" : "\n") + std::string("    \"") + b.impls[i].name + "\": [";
    for (size_t s = 0; s < t.sizes.size(); ++s) {
      j += s ? ", [" : "[";
      for (size_t r = 0; r < t.times[i][s].size(); ++r) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%s%.3f", r ? ", " : "", t.times[i][s][r]);
        j += buf;
      }
      j += "]";
    }
    j += "]";
  }
  j += "\n  }\n}\n";
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  // A write to a dead peer's socket must fail, not kill this process.
  signal(SIGPIPE, SIG_IGN);
  Bench b;
  if (const int rc = ParseArgs(argc, argv, &b.args); rc != 0) return rc;
  Connect(b);
  if (b.args.device == "cpu")
    AddGlooImpls(b);
  else
    AddNcclImpls(b);
  const Timings t = Measure(b);
  b.Barrier();
  if (b.ro.rank == 0) {
    const std::string j = ResultJson(b, t);
    if (b.args.json_path.empty()) {
      std::fputs(j.c_str(), stdout);
    } else {
      std::ofstream f(b.args.json_path);
      f << j;
      if (!f.good()) Die("cannot write " + b.args.json_path);
    }
  }
  std::fflush(stdout);
  // Both ranks passed the last barrier: leave without tearing Gloo down
  // (DEVELOPMENT.md: destroying a group its peer still uses can abort).
  std::_Exit(0);
}
