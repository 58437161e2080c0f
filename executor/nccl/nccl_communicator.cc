// NcclCommunicator: raw NCCL on a dedicated CUDA stream (see the header for
// the design). Only compiled where the CUDA toolkit and NCCL are found.
#include "executor/nccl/nccl_communicator.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/ScalarType.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "executor/torch_types.h"

// Features by NCCL version. NCCL_VERSION(2,x,y) encodes differently below
// 2.9; every threshold here is above it.
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
#define FXDP_NCCL_NONBLOCKING 1  // ncclConfig_t, ncclCommInitRankConfig, ncclCommFinalize
#endif
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
#define FXDP_NCCL_LAST_ERROR 1  // ncclGetLastError
#endif
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0) && CUDART_VERSION >= 11000
#define FXDP_NCCL_BF16 1
#endif

namespace fxdp::executor {
namespace {

using Clock = std::chrono::steady_clock;

std::string NcclError(ncclResult_t r, ncclComm_t comm) {
  std::string s = absl::StrCat(ncclGetErrorString(r), " (ncclResult_t ", static_cast<int>(r), ")");
#ifdef FXDP_NCCL_LAST_ERROR
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') absl::StrAppend(&s, ": ", last);
#endif
  return s;
}

std::string CudaError(cudaError_t e) {
  return absl::StrCat(cudaGetErrorName(e), ": ", cudaGetErrorString(e));
}

// Polling with backoff: yield first (a collective on one node finishes in
// microseconds), then sleep, so a long wait does not burn a core.
class Backoff {
 public:
  void Pause() {
    ++n_;
    if (n_ < 200) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(n_ < 2000 ? 20 : 200));
    }
  }

 private:
  int n_ = 0;
};

// A nonblocking communicator's calls may return ncclInProgress: the operation
// (initialisation, finalisation, enqueueing a collective) finishes in the
// background and ncclCommGetAsyncError reports ncclInProgress until then.
// Returns its final result, or sets *timed_out at `deadline`.
ncclResult_t PollInProgress(ncclComm_t comm, Clock::time_point deadline, bool* timed_out) {
  *timed_out = false;
  Backoff backoff;
  while (true) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return r;
    if (state != ncclInProgress) return state;
    if (Clock::now() >= deadline) {
      *timed_out = true;
      return ncclInProgress;
    }
    backoff.Pause();
  }
}

// Makes `device` current for the scope, restoring the previous one.
class CudaDeviceScope {
 public:
  explicit CudaDeviceScope(int device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) {
      prev_ = -1;
      cudaGetLastError();
    }
    if (prev_ != device) error_ = cudaSetDevice(device);
  }
  ~CudaDeviceScope() {
    if (prev_ >= 0 && error_ == cudaSuccess) cudaSetDevice(prev_);
  }
  cudaError_t error() const { return error_; }

 private:
  int prev_ = -1;
  cudaError_t error_ = cudaSuccess;
};

struct NcclType {
  ncclDataType_t type;
  int64_t scalars_per_element = 1;  // 2 for complex: summed as pairs of reals
  ncclRedOp_t op = ncclSum;         // bool: ncclMax, a logical or (as torch does)
};

absl::StatusOr<NcclType> NcclTypeOf(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return NcclType{ncclFloat32};
    case c10::ScalarType::Double: return NcclType{ncclFloat64};
    case c10::ScalarType::Half: return NcclType{ncclFloat16};
#ifdef FXDP_NCCL_BF16
    case c10::ScalarType::BFloat16: return NcclType{ncclBfloat16};
#endif
    case c10::ScalarType::Char: return NcclType{ncclInt8};
    case c10::ScalarType::Byte: return NcclType{ncclUint8};
    case c10::ScalarType::Int: return NcclType{ncclInt32};
    case c10::ScalarType::Long: return NcclType{ncclInt64};
    case c10::ScalarType::Bool: return NcclType{ncclUint8, 1, ncclMax};
    case c10::ScalarType::ComplexFloat: return NcclType{ncclFloat32, 2};
    case c10::ScalarType::ComplexDouble: return NcclType{ncclFloat64, 2};
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("NCCL cannot sum ", c10::toString(t), " tensors"));
  }
}

// A contiguous CUDA tensor without ATen's CUDA backend (CPU-only torch):
// cudaMalloc'd memory wrapped by at::from_blob, freed with cudaFree.
absl::StatusOr<at::Tensor> RawCudaEmpty(at::IntArrayRef sizes, const at::TensorOptions& options,
                                        int device) {
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  const size_t bytes = static_cast<size_t>(numel) * options.dtype().itemsize();
  void* p = nullptr;
  if (bytes > 0) {
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(
          absl::StrCat("cudaMalloc of ", bytes, " bytes failed: ", CudaError(e)));
    }
  }
  const c10::Device dev(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device));
  return at::from_blob(
      p, sizes, [](void* q) { if (q != nullptr) cudaFree(q); }, options.device(dev), dev);
}

}  // namespace

// The communicator's CUDA/NCCL resources, shared by the communicator and the
// Works that are still pending (a Work may outlive its communicator).
struct NcclCommunicator::State {
  int rank = 0;
  int world_size = 1;
  int device = 0;
  std::chrono::milliseconds timeout{30000};
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr;  // re-recorded on the producer stream by every call
  std::vector<cudaEvent_t> free_events;
  // Works dropped (or failed) before their all-reduce was seen to complete:
  // their buffers stay alive until the device is done with them.
  struct Orphan {
    cudaEvent_t done;
    at::Tensor input, output;
  };
  std::vector<Orphan> orphans;
  std::string abort_reason;  // non-empty once aborted
  int64_t seq = 0;           // collectives started

  std::string Who() const {
    return absl::StrCat("nccl rank ", rank, "/", world_size, " cuda:", device);
  }

  absl::StatusOr<cudaEvent_t> TakeEvent() {
    if (!free_events.empty()) {
      cudaEvent_t e = free_events.back();
      free_events.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    const cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return absl::UnavailableError(absl::StrCat(Who(), ": cudaEventCreate: ", CudaError(err)));
    }
    return e;
  }

  // Keeps `input`/`output` until `done` has completed.
  void Adopt(cudaEvent_t done, at::Tensor input, at::Tensor output) {
    if (cudaEventQuery(done) == cudaSuccess) {
      free_events.push_back(done);
      return;
    }
    cudaGetLastError();  // cudaErrorNotReady is sticky for nobody, but be tidy
    orphans.push_back(Orphan{done, std::move(input), std::move(output)});
  }

  void ReapOrphans() {
    for (size_t i = 0; i < orphans.size();) {
      if (cudaEventQuery(orphans[i].done) == cudaSuccess) {
        free_events.push_back(orphans[i].done);
        orphans[i] = std::move(orphans.back());
        orphans.pop_back();
      } else {
        ++i;
      }
    }
  }

  void Abort(const std::string& reason) {
    if (!abort_reason.empty()) return;
    abort_reason = reason;
    if (comm != nullptr) {
      CudaDeviceScope scope(device);
      ncclCommAbort(comm);  // kills the kernels still running
      comm = nullptr;
    }
  }

  ~State() {
    CudaDeviceScope scope(device);
    if (comm != nullptr) {
#ifdef FXDP_NCCL_NONBLOCKING
      // Finalize flushes outstanding collectives; give up after the timeout.
      ncclResult_t r = ncclCommFinalize(comm);
      bool timed_out = false;
      if (r == ncclInProgress) r = PollInProgress(comm, Clock::now() + timeout, &timed_out);
      if (r == ncclSuccess && !timed_out) {
        ncclCommDestroy(comm);
      } else {
        ncclCommAbort(comm);
      }
#else
      ncclCommDestroy(comm);
#endif
      comm = nullptr;
    }
    // The buffers of unfinished collectives may only be freed once the
    // stream is idle (after an abort it drains quickly). If it does not
    // drain, they are leaked on purpose: freeing memory a kernel may still
    // write is worse.
    bool idle = true;
    if (stream != nullptr) {
      const auto deadline = Clock::now() + timeout;
      Backoff backoff;
      while (true) {
        const cudaError_t e = cudaStreamQuery(stream);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady || Clock::now() >= deadline) {
          cudaGetLastError();
          idle = false;
          break;
        }
        backoff.Pause();
      }
    }
    if (!idle) {
      new std::vector<Orphan>(std::move(orphans));  // deliberately leaked
      return;
    }
    for (Orphan& o : orphans) cudaEventDestroy(o.done);
    orphans.clear();
    for (cudaEvent_t e : free_events) cudaEventDestroy(e);
    if (ready != nullptr) cudaEventDestroy(ready);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

namespace {

class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<NcclCommunicator::State> state, cudaEvent_t done, at::Tensor input,
           at::Tensor output, std::string what)
      : state_(std::move(state)), done_(done), input_(std::move(input)),
        output_(std::move(output)), what_(std::move(what)) {}

  ~NcclWork() override {
    if (finished_) {
      state_->free_events.push_back(done_);
    } else {
      state_->Adopt(done_, std::move(input_), std::move(output_));
    }
  }

  absl::StatusOr<at::Tensor> Wait(std::chrono::milliseconds timeout) override {
    NcclCommunicator::State& s = *state_;
    if (waited_)
      return absl::FailedPreconditionError(
          absl::StrCat(s.Who(), ": ", what_, ": Wait called twice"));
    waited_ = true;
    const auto deadline = Clock::now() + timeout;
    Backoff backoff;
    while (true) {
      const cudaError_t e = cudaEventQuery(done_);
      if (e == cudaSuccess) {
        // An aborted communicator's kernels end early: their results are
        // not sums.
        if (!s.abort_reason.empty()) return Aborted(s);
        ncclResult_t async = ncclSuccess;
        if (s.comm != nullptr && ncclCommGetAsyncError(s.comm, &async) == ncclSuccess &&
            async != ncclSuccess && async != ncclInProgress)
          return Fail(s, absl::StrCat(what_, " failed: ", NcclError(async, s.comm)));
        finished_ = true;
        input_ = at::Tensor();
        return std::move(output_);
      }
      if (e != cudaErrorNotReady) {
        cudaGetLastError();
        return Fail(s, absl::StrCat(what_, " failed: CUDA error ", CudaError(e)));
      }
      if (!s.abort_reason.empty()) return Aborted(s);
      ncclResult_t async = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(s.comm, &async);
      if (r != ncclSuccess)
        return Fail(s, absl::StrCat(what_, ": ncclCommGetAsyncError failed: ", NcclError(r, s.comm)));
      if (async != ncclSuccess && async != ncclInProgress)
        return Fail(s, absl::StrCat(what_, " failed: ", NcclError(async, s.comm)));
      if (Clock::now() >= deadline) {
        const std::string reason = absl::StrCat(what_, " timed out after ", timeout.count(), " ms");
        s.Abort(reason);
        return absl::DeadlineExceededError(absl::StrCat(
            s.Who(), ": ", reason,
            "; the NCCL communicator is aborted (a peer may have died, be stuck, or not have "
            "called the same collective)"));
      }
      backoff.Pause();
    }
  }

 private:
  absl::Status Fail(NcclCommunicator::State& s, const std::string& reason) {
    s.Abort(reason);
    return absl::UnavailableError(
        absl::StrCat(s.Who(), ": ", reason, "; the NCCL communicator is aborted"));
  }
  absl::Status Aborted(const NcclCommunicator::State& s) {
    return absl::UnavailableError(absl::StrCat(s.Who(), ": ", what_,
                                               " failed: the NCCL communicator was aborted (",
                                               s.abort_reason, ")"));
  }

  std::shared_ptr<NcclCommunicator::State> state_;
  cudaEvent_t done_;
  at::Tensor input_, output_;
  std::string what_;
  bool waited_ = false;
  bool finished_ = false;  // the all-reduce was seen complete
};

bool IsTimeout(const std::string& msg) {
  const std::string m = absl::AsciiStrToLower(msg);
  return absl::StrContains(m, "timeout") || absl::StrContains(m, "timed out");
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Connect(
    const RendezvousOptions& opts, int device_index) {
  c10::intrusive_ptr<c10d::Store> store;
  if (opts.world_size > 1) {
    auto s = ConnectStore(opts);
    if (!s.ok()) return s.status();
    store = *std::move(s);
  }
  return Create(store, opts, device_index);
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    const c10::intrusive_ptr<c10d::Store>& store, const RendezvousOptions& opts,
    int device_index, const std::string& store_key) {
  auto state = std::make_shared<State>();
  state->rank = opts.rank;
  state->world_size = opts.world_size;
  state->device = device_index;
  state->timeout = opts.timeout;
  const std::string who = state->Who();
  if (opts.world_size < 1 || opts.rank < 0 || opts.rank >= opts.world_size)
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": rank ", opts.rank, " of world size ", opts.world_size));
  if (opts.world_size > 1 && !store)
    return absl::InvalidArgumentError(absl::StrCat(who, ": world size > 1 needs a store"));

  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
    cudaGetLastError();
    return absl::UnavailableError(absl::StrCat(
        who, ": no usable CUDA device: ",
        e != cudaSuccess ? CudaError(e) : std::string("the driver reports 0 devices")));
  }
  if (device_index < 0 || device_index >= count)
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": no such device (this process sees ", count, " CUDA devices)"));
  CudaDeviceScope scope(device_index);
  if (scope.error() != cudaSuccess)
    return absl::UnavailableError(
        absl::StrCat(who, ": cudaSetDevice: ", CudaError(scope.error())));
  const auto deadline = Clock::now() + opts.timeout;

  // The unique id: rank 0 makes it, the store carries it.
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (opts.rank == 0) {
    if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
      return absl::UnavailableError(
          absl::StrCat(who, ": ncclGetUniqueId failed: ", NcclError(r, nullptr)));
    if (opts.world_size > 1) {
      try {
        const auto* b = reinterpret_cast<const uint8_t*>(&id);
        store->set(store_key, std::vector<uint8_t>(b, b + sizeof(id)));
      } catch (const std::exception& e) {
        return absl::UnavailableError(absl::StrCat(who, ": publishing the NCCL id under '",
                                                   store_key, "' failed: ", ExceptionMessage(e)));
      }
    }
  } else {
    std::vector<uint8_t> bytes;
    try {
      bytes = store->get(store_key);
    } catch (const std::exception& e) {
      const std::string msg = ExceptionMessage(e);
      return absl::Status(
          IsTimeout(msg) ? absl::StatusCode::kDeadlineExceeded : absl::StatusCode::kUnavailable,
          absl::StrCat(who, ": waiting for rank 0's NCCL id under '", store_key,
                       "' failed: ", msg));
    }
    if (bytes.size() != sizeof(id))
      return absl::InternalError(absl::StrCat(who, ": the store holds ", bytes.size(),
                                              " bytes under '", store_key, "', not an NCCL id (",
                                              sizeof(id), " bytes)"));
    std::memcpy(&id, bytes.data(), sizeof(id));
  }

  // The communicator.
  ncclComm_t comm = nullptr;
#ifdef FXDP_NCCL_NONBLOCKING
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&comm, opts.world_size, id, opts.rank, &config);
  bool timed_out = false;
  if (r == ncclInProgress) r = PollInProgress(comm, deadline, &timed_out);
  if (timed_out) {
    ncclCommAbort(comm);
    return absl::DeadlineExceededError(absl::StrCat(
        who, ": NCCL initialisation timed out after ", opts.timeout.count(), " ms (did all ",
        opts.world_size, " ranks start, each on its own GPU, and can they reach each other?)"));
  }
#else
  (void)deadline;
  ncclResult_t r = ncclCommInitRank(&comm, opts.world_size, id, opts.rank);
#endif
  if (r != ncclSuccess) {
    const std::string err = NcclError(r, comm);
    if (comm != nullptr) ncclCommAbort(comm);
    return absl::UnavailableError(absl::StrCat(who, ": ncclCommInitRank failed: ", err));
  }
  state->comm = comm;  // from here on ~State cleans up

  if (const cudaError_t e = cudaStreamCreateWithFlags(&state->stream, cudaStreamNonBlocking);
      e != cudaSuccess) {
    cudaGetLastError();
    state->stream = nullptr;
    return absl::UnavailableError(absl::StrCat(who, ": cudaStreamCreate: ", CudaError(e)));
  }
  if (const cudaError_t e = cudaEventCreateWithFlags(&state->ready, cudaEventDisableTiming);
      e != cudaSuccess) {
    cudaGetLastError();
    state->ready = nullptr;
    return absl::UnavailableError(absl::StrCat(who, ": cudaEventCreate: ", CudaError(e)));
  }
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(std::move(state)));
}

NcclCommunicator::~NcclCommunicator() = default;

int NcclCommunicator::rank() const { return state_->rank; }
int NcclCommunicator::world_size() const { return state_->world_size; }
int NcclCommunicator::device_index() const { return state_->device; }
bool NcclCommunicator::aborted() const { return !state_->abort_reason.empty(); }
std::string NcclCommunicator::name() const { return state_->Who(); }

absl::StatusOr<std::unique_ptr<Work>> NcclCommunicator::AllReduceSum(const at::Tensor& input) {
  return Start(input, Collective::kAllReduce);
}

absl::StatusOr<std::unique_ptr<Work>> NcclCommunicator::AllGather(const at::Tensor& input) {
  return Start(input, Collective::kAllGather);
}

absl::StatusOr<std::unique_ptr<Work>> NcclCommunicator::ReduceScatterSum(const at::Tensor& input) {
  return Start(input, Collective::kReduceScatter);
}

absl::StatusOr<std::unique_ptr<Work>> NcclCommunicator::Start(const at::Tensor& input,
                                                              Collective kind) {
  State& s = *state_;
  s.ReapOrphans();
  const char* op = kind == Collective::kAllReduce   ? "all_reduce"
                   : kind == Collective::kAllGather ? "all_gather_into_tensor"
                                                    : "reduce_scatter_tensor";
  const std::string what = absl::StrCat(op, " #", ++s.seq);
  if (!s.abort_reason.empty())
    return absl::UnavailableError(absl::StrCat(s.Who(), ": ", what,
                                               ": the NCCL communicator was aborted earlier (",
                                               s.abort_reason, ")"));
  if (!input.defined())
    return absl::InvalidArgumentError(absl::StrCat(s.Who(), ": ", what, " of an undefined tensor"));
  if (!input.is_cuda())
    return absl::InvalidArgumentError(absl::StrCat(
        s.Who(), ": ", what, " of a ", input.device().str(),
        " tensor: NCCL sums CUDA tensors (Gloo is the CPU communicator)"));
  if (input.device().index() != s.device)
    return absl::InvalidArgumentError(absl::StrCat(s.Who(), ": ", what, " of a tensor on ",
                                                   input.device().str(),
                                                   ", not this communicator's device"));
  auto type = NcclTypeOf(input.scalar_type());
  if (!type.ok())
    return absl::InvalidArgumentError(absl::StrCat(s.Who(), ": ", what, ": ", type.status().message()));

  CudaDeviceScope scope(s.device);
  if (scope.error() != cudaSuccess)
    return absl::UnavailableError(
        absl::StrCat(s.Who(), ": ", what, ": cudaSetDevice: ", CudaError(scope.error())));

  // With a CUDA build of torch, ATen allocates and copies, and the producer
  // stream is torch's current stream; with a CPU-only torch, raw CUDA and
  // the legacy default stream.
  const bool torch_cuda = c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA);
  at::Tensor in = input;
  at::Tensor out;
  const int64_t n = input.numel();
  if (kind == Collective::kReduceScatter && n % s.world_size != 0)
    return absl::InvalidArgumentError(absl::StrCat(s.Who(), ": ", what, " of ", n,
                                                   " elements, not a multiple of the world size ",
                                                   s.world_size));
  // all_reduce: the input's shape; all_gather: N * n; reduce_scatter: n / N (1-D).
  std::vector<int64_t> out_sizes = kind == Collective::kAllReduce ? input.sizes().vec()
                                   : kind == Collective::kAllGather
                                       ? std::vector<int64_t>{n * s.world_size}
                                       : std::vector<int64_t>{n / s.world_size};
  try {
    if (!in.is_contiguous()) {
      if (!torch_cuda)
        return absl::InvalidArgumentError(absl::StrCat(
            s.Who(), ": ", what, " of a non-contiguous tensor needs a CUDA build of torch to copy it"));
      in = in.contiguous();
    }
    if (torch_cuda) {
      out = at::empty(out_sizes, in.options().memory_format(c10::MemoryFormat::Contiguous));
    } else {
      auto raw = RawCudaEmpty(out_sizes, in.options(), s.device);
      if (!raw.ok())
        return absl::Status(raw.status().code(),
                            absl::StrCat(s.Who(), ": ", what, ": ", raw.status().message()));
      out = *std::move(raw);
    }
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat(s.Who(), ": ", what, ": allocating the result failed: ", ExceptionMessage(e)));
  }
  const int64_t count = in.numel() * type->scalars_per_element;
  if (count == 0) return std::unique_ptr<Work>(std::make_unique<ReadyWork>(out));

  // The NCCL stream waits for the producer stream up to this point.
  try {
    if (torch_cuda) {
      const c10::impl::DeviceGuardImplInterface* impl =
          c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
      const c10::Device dev(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(s.device));
      void* ev = s.ready;
      impl->record(&ev, impl->getStream(dev), dev.index(), c10::EventFlag::PYTORCH_DEFAULT);
    } else if (const cudaError_t e = cudaEventRecord(s.ready, cudaStreamLegacy); e != cudaSuccess) {
      cudaGetLastError();
      return absl::UnavailableError(
          absl::StrCat(s.Who(), ": ", what, ": cudaEventRecord: ", CudaError(e)));
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(s.Who(), ": ", what,
                                               ": recording an event on the current stream: ",
                                               ExceptionMessage(e)));
  }
  if (const cudaError_t e = cudaStreamWaitEvent(s.stream, s.ready, 0); e != cudaSuccess) {
    cudaGetLastError();
    return absl::UnavailableError(
        absl::StrCat(s.Who(), ": ", what, ": cudaStreamWaitEvent: ", CudaError(e)));
  }

  auto done = s.TakeEvent();
  if (!done.ok()) return done.status();
  // all_gather: `count` is each rank's contribution; reduce_scatter: each rank's result.
  ncclResult_t r =
      kind == Collective::kAllReduce
          ? ncclAllReduce(in.const_data_ptr(), out.mutable_data_ptr(), static_cast<size_t>(count),
                          type->type, type->op, s.comm, s.stream)
      : kind == Collective::kAllGather
          ? ncclAllGather(in.const_data_ptr(), out.mutable_data_ptr(), static_cast<size_t>(count),
                          type->type, s.comm, s.stream)
          : ncclReduceScatter(in.const_data_ptr(), out.mutable_data_ptr(),
                              static_cast<size_t>(count / s.world_size), type->type, type->op,
                              s.comm, s.stream);
  // After a failure the collective may still sit on the stream: the event
  // recorded behind it keeps both buffers alive until the stream passes it.
  auto fail = [&](absl::StatusCode code, const std::string& reason) {
    s.Abort(reason);
    if (cudaEventRecord(*done, s.stream) != cudaSuccess) cudaGetLastError();
    s.Adopt(*done, std::move(in), std::move(out));
    return absl::Status(code, absl::StrCat(s.Who(), ": ", reason, "; the NCCL communicator is aborted"));
  };
#ifdef FXDP_NCCL_NONBLOCKING
  // Nonblocking: ncclInProgress means "not on the stream yet".
  bool timed_out = false;
  if (r == ncclInProgress) r = PollInProgress(s.comm, Clock::now() + s.timeout, &timed_out);
  if (timed_out)
    return fail(absl::StatusCode::kDeadlineExceeded,
                absl::StrCat(what, ": enqueueing timed out after ", s.timeout.count(), " ms"));
#endif
  if (r != ncclSuccess)
    return fail(absl::StatusCode::kUnavailable,
                absl::StrCat(what, ": NCCL ", op, " failed: ", NcclError(r, s.comm)));
  if (const cudaError_t e = cudaEventRecord(*done, s.stream); e != cudaSuccess) {
    cudaGetLastError();
    return fail(absl::StatusCode::kUnavailable, absl::StrCat(what, ": cudaEventRecord: ", CudaError(e)));
  }
  return std::unique_ptr<Work>(
      std::make_unique<NcclWork>(state_, *done, std::move(in), std::move(out), what));
}

absl::StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(const RendezvousOptions& opts,
                                                                   int device_index) {
  auto c = NcclCommunicator::Connect(opts, device_index);
  if (!c.ok()) return c.status();
  return std::unique_ptr<Communicator>(*std::move(c));
}

}  // namespace fxdp::executor
