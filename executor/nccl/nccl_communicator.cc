// NcclCommunicator: raw NCCL on a dedicated CUDA stream (see the header for
// the design). Only compiled where the CUDA toolkit and NCCL are found.
// nccl_state.{h,cc} hold its resources and the Work of a pending collective.
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
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "executor/nccl/nccl_state.h"
#include "executor/torch_types.h"

namespace fxdp::executor {
namespace {

using nccl_internal::Clock;
using nccl_internal::CudaDeviceScope;
using nccl_internal::CudaError;
using nccl_internal::NcclError;
using nccl_internal::PollInProgress;

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
      p, sizes,
      [](void* q) {
        if (q != nullptr) cudaFree(q);
      },
      options.device(dev), dev);
}

bool IsTimeout(const std::string& msg) {
  const std::string m = absl::AsciiStrToLower(msg);
  return absl::StrContains(m, "timeout") || absl::StrContains(m, "timed out");
}

using State = NcclCommunicator::State;

// Create's parts: the ncclUniqueId (rank 0 makes it, the store carries it to
// the others), the communicator, the stream and the producer event.
absl::StatusOr<ncclUniqueId> ExchangeUniqueId(const State& state,
                                              const c10::intrusive_ptr<c10d::Store>& store,
                                              const std::string& store_key) {
  const std::string who = state.Who();
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (state.rank == 0) {
    if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
      return absl::UnavailableError(
          absl::StrCat(who, ": ncclGetUniqueId failed: ", NcclError(r, nullptr)));
    if (state.world_size > 1) {
      try {
        const auto* b = reinterpret_cast<const uint8_t*>(&id);
        store->set(store_key, std::vector<uint8_t>(b, b + sizeof(id)));
      } catch (const std::exception& e) {
        return absl::UnavailableError(absl::StrCat(who, ": publishing the NCCL id under '",
                                                   store_key, "' failed: ", ExceptionMessage(e)));
      }
    }
    return id;
  }
  std::vector<uint8_t> bytes;
  try {
    bytes = store->get(store_key);
  } catch (const std::exception& e) {
    const std::string msg = ExceptionMessage(e);
    return absl::Status(
        IsTimeout(msg) ? absl::StatusCode::kDeadlineExceeded : absl::StatusCode::kUnavailable,
        absl::StrCat(who, ": waiting for rank 0's NCCL id under '", store_key, "' failed: ", msg));
  }
  if (bytes.size() != sizeof(id))
    return absl::InternalError(absl::StrCat(who, ": the store holds ", bytes.size(),
                                            " bytes under '", store_key, "', not an NCCL id (",
                                            sizeof(id), " bytes)"));
  std::memcpy(&id, bytes.data(), sizeof(id));
  return id;
}

absl::StatusOr<ncclComm_t> InitComm(const State& state, const ncclUniqueId& id,
                                    Clock::time_point deadline) {
  const std::string who = state.Who();
  ncclComm_t comm = nullptr;
#ifdef FXDP_NCCL_NONBLOCKING
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&comm, state.world_size, id, state.rank, &config);
  bool timed_out = false;
  if (r == ncclInProgress) r = PollInProgress(comm, deadline, &timed_out);
  if (timed_out) {
    ncclCommAbort(comm);
    return absl::DeadlineExceededError(absl::StrCat(
        who, ": NCCL initialisation timed out after ", state.timeout.count(), " ms (did all ",
        state.world_size, " ranks start, each on its own GPU, and can they reach each other?)"));
  }
#else
  (void)deadline;
  ncclResult_t r = ncclCommInitRank(&comm, state.world_size, id, state.rank);
#endif
  if (r != ncclSuccess) {
    const std::string err = NcclError(r, comm);
    if (comm != nullptr) ncclCommAbort(comm);
    return absl::UnavailableError(absl::StrCat(who, ": ncclCommInitRank failed: ", err));
  }
  return comm;
}

absl::Status CreateStreamAndEvent(State& state) {
  if (const cudaError_t e = cudaStreamCreateWithFlags(&state.stream, cudaStreamNonBlocking);
      e != cudaSuccess) {
    cudaGetLastError();
    state.stream = nullptr;
    return absl::UnavailableError(absl::StrCat(state.Who(), ": cudaStreamCreate: ", CudaError(e)));
  }
  if (const cudaError_t e = cudaEventCreateWithFlags(&state.ready, cudaEventDisableTiming);
      e != cudaSuccess) {
    cudaGetLastError();
    state.ready = nullptr;
    return absl::UnavailableError(absl::StrCat(state.Who(), ": cudaEventCreate: ", CudaError(e)));
  }
  return absl::OkStatus();
}

// Start's parts: the checks of its input (its NCCL type when they pass), the
// result buffer (`in` made contiguous first), and the NCCL stream's wait for
// the producer stream.
absl::StatusOr<NcclType> CheckInput(const State& s, const at::Tensor& input,
                                    const std::string& what) {
  if (!input.defined())
    return absl::InvalidArgumentError(absl::StrCat(s.Who(), ": ", what, " of an undefined tensor"));
  if (!input.is_cuda())
    return absl::InvalidArgumentError(
        absl::StrCat(s.Who(), ": ", what, " of a ", input.device().str(),
                     " tensor: NCCL sums CUDA tensors (Gloo is the CPU communicator)"));
  if (input.device().index() != s.device)
    return absl::InvalidArgumentError(absl::StrCat(s.Who(), ": ", what, " of a tensor on ",
                                                   input.device().str(),
                                                   ", not this communicator's device"));
  auto type = NcclTypeOf(input.scalar_type());
  if (!type.ok())
    return absl::InvalidArgumentError(
        absl::StrCat(s.Who(), ": ", what, ": ", type.status().message()));
  return type;
}

// With a CUDA build of torch (`torch_cuda`), ATen allocates and copies;
// with a CPU-only torch, raw CUDA.
absl::Status AllocateResult(const State& s, const std::string& what, bool torch_cuda,
                            const std::vector<int64_t>& out_sizes, at::Tensor& in,
                            at::Tensor& out) {
  try {
    if (!in.is_contiguous()) {
      if (!torch_cuda)
        return absl::InvalidArgumentError(
            absl::StrCat(s.Who(), ": ", what,
                         " of a non-contiguous tensor needs a CUDA build of torch to copy it"));
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
  return absl::OkStatus();
}

// The producer stream is torch's current stream with a CUDA build of torch,
// the legacy default stream without.
absl::Status WaitForProducer(const State& s, const std::string& what, bool torch_cuda) {
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
    return absl::UnavailableError(absl::StrCat(
        s.Who(), ": ", what, ": recording an event on the current stream: ", ExceptionMessage(e)));
  }
  if (const cudaError_t e = cudaStreamWaitEvent(s.stream, s.ready, 0); e != cudaSuccess) {
    cudaGetLastError();
    return absl::UnavailableError(
        absl::StrCat(s.Who(), ": ", what, ": cudaStreamWaitEvent: ", CudaError(e)));
  }
  return absl::OkStatus();
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
    const c10::intrusive_ptr<c10d::Store>& store, const RendezvousOptions& opts, int device_index,
    const std::string& store_key) {
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
    return absl::UnavailableError(absl::StrCat(who, ": cudaSetDevice: ", CudaError(scope.error())));
  const auto deadline = Clock::now() + opts.timeout;
  auto id = ExchangeUniqueId(*state, store, store_key);
  if (!id.ok()) return id.status();
  auto comm = InitComm(*state, *id, deadline);
  if (!comm.ok()) return comm.status();
  state->comm = *comm;  // from here on ~State cleans up
  if (absl::Status st = CreateStreamAndEvent(*state); !st.ok()) return st;
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
    return absl::UnavailableError(absl::StrCat(
        s.Who(), ": ", what, ": the NCCL communicator was aborted earlier (", s.abort_reason, ")"));
  auto type = CheckInput(s, input, what);
  if (!type.ok()) return type.status();
  CudaDeviceScope scope(s.device);
  if (scope.error() != cudaSuccess)
    return absl::UnavailableError(
        absl::StrCat(s.Who(), ": ", what, ": cudaSetDevice: ", CudaError(scope.error())));

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
  if (absl::Status st = AllocateResult(s, what, torch_cuda, out_sizes, in, out); !st.ok())
    return st;
  const int64_t count = in.numel() * type->scalars_per_element;
  if (count == 0) return std::unique_ptr<Work>(std::make_unique<ReadyWork>(out));
  // The NCCL stream waits for the producer stream up to this point.
  if (absl::Status st = WaitForProducer(s, what, torch_cuda); !st.ok()) return st;

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
    return absl::Status(code,
                        absl::StrCat(s.Who(), ": ", reason, "; the NCCL communicator is aborted"));
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
    return fail(absl::StatusCode::kUnavailable,
                absl::StrCat(what, ": cudaEventRecord: ", CudaError(e)));
  }
  return std::unique_ptr<Work>(
      nccl_internal::MakeNcclWork(state_, *done, std::move(in), std::move(out), what));
}

absl::StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(const RendezvousOptions& opts,
                                                                   int device_index) {
  auto c = NcclCommunicator::Connect(opts, device_index);
  if (!c.ok()) return c.status();
  return std::unique_ptr<Communicator>(*std::move(c));
}

}  // namespace fxdp::executor
