// A Communicator over raw NCCL for CUDA tensors (built only where the CUDA
// toolkit and NCCL are found: FXDP_HAVE_NCCL, target fxdp_nccl). No CUDA or
// NCCL headers here, so the worker can include it; everything CUDA lives in
// nccl_communicator.cc.
//
// Rendezvous: rank 0 calls ncclGetUniqueId and publishes the id under a key of
// the c10d store (the TCPStore the Gloo path uses, executor/gloo/gloo_backend.h
// ConnectStore); the others read it (blocking, up to the store's timeout);
// then every rank calls ncclCommInitRankConfig on its device. World size 1
// needs no store. Where NCCL supports it (>= 2.14) the communicator is
// nonblocking (ncclConfig_t::blocking = 0), so that initialisation and
// collectives can be given up on (ncclCommAbort) instead of hanging.
//
// AllReduceSum(input) on a CUDA tensor of this communicator's device:
//  1. an event is recorded on the input's producer stream, the "current
//     stream": with a CUDA build of torch (c10's CUDA DeviceGuardImpl is
//     registered) torch's current stream for the device, recorded through
//     c10::impl::DeviceGuardImplInterface::record (header-only, works with any
//     torch version); with a CPU-only torch, where no ATen op can run on CUDA
//     anyway, the legacy default stream (cudaStreamLegacy, which is also
//     torch's default CUDA stream);
//  2. the communicator's own stream (cudaStreamNonBlocking, created once)
//     waits on that event, ncclAllReduce(sum) runs there into a new tensor,
//     and a completion event is recorded after it;
//  3. Work::Wait(timeout) polls cudaEventQuery and ncclCommGetAsyncError
//     until the event has completed (returns the result), NCCL reports an
//     error (UNAVAILABLE) or the timeout passes (DEADLINE_EXCEEDED); on error
//     or timeout the communicator is aborted (ncclCommAbort) and every later
//     call fails with UNAVAILABLE. Messages name the rank, the device and the
//     collective ("all_reduce #k": the k-th since this communicator was made). Wait blocks the host
//     until the all-reduce is done, so every op launched after it is ordered after the result on
//     any stream.
// The input is not modified; the Work keeps it (and the output) alive until
// the all-reduce is known to be done, so the caller may drop its reference and
// the caching allocator cannot hand the memory out while NCCL still reads it.
// A non-contiguous input is copied first (torch CUDA builds only; a CPU-only
// torch refuses it). The output is allocated by ATen (at::empty, torch's
// caching allocator) with a CUDA build of torch, else with cudaMalloc
// (freed with cudaFree) and wrapped with at::from_blob.
//
// Dtypes: float32/64, float16, bfloat16 (NCCL >= 2.10), int8/32/64, uint8,
// bool (summed as a logical or, as torch does), complex64/128 (as pairs of
// reals). Others are INVALID_ARGUMENT.
//
// Like a Program, a communicator is used by one thread at a time.
#ifndef FXDP_EXECUTOR_NCCL_NCCL_COMMUNICATOR_H_
#define FXDP_EXECUTOR_NCCL_NCCL_COMMUNICATOR_H_

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "executor/communicator.h"
#include "executor/gloo/gloo_backend.h"

namespace fxdp::executor {

class NcclCommunicator : public Communicator {
 public:
  // The store key rank 0 publishes the ncclUniqueId under. Ranks that create
  // several communicators over one store must use a different key for each.
  static constexpr char kDefaultStoreKey[] = "fxdp/nccl/unique_id";

  // Rendezvous through a TCPStore at opts.host:opts.port (rank 0 serves it;
  // none for world size 1) and an NCCL communicator on cuda:`device_index`.
  // opts.timeout bounds the rendezvous, NCCL initialisation and the enqueueing
  // of each collective (DEADLINE_EXCEEDED naming the rank); no usable device
  // or a failing CUDA/NCCL call is UNAVAILABLE.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Connect(const RendezvousOptions& opts,
                                                                   int device_index);
  // Over an existing store (tests: several ranks in one process, one GPU
  // each). `store` may be null for world size 1.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      const c10::intrusive_ptr<c10d::Store>& store, const RendezvousOptions& opts, int device_index,
      const std::string& store_key = kDefaultStoreKey);

  // Finalizes the NCCL communicator (waiting up to opts.timeout for
  // outstanding collectives, then aborting it) and frees its stream.
  ~NcclCommunicator() override;

  int rank() const override;
  int world_size() const override;
  int device_index() const;
  absl::StatusOr<std::unique_ptr<Work>> AllReduceSum(const at::Tensor& input) override;
  // ncclAllGather / ncclReduceScatter(sum) on the same stream, with the same
  // ordering, lifetime and error handling as AllReduceSum.
  absl::StatusOr<std::unique_ptr<Work>> AllGather(const at::Tensor& input) override;
  absl::StatusOr<std::unique_ptr<Work>> ReduceScatterSum(const at::Tensor& input) override;
  // "nccl rank 0/2 cuda:0"
  std::string name() const override;
  // True after a failed or timed-out collective aborted the communicator.
  bool aborted() const;

  struct State;  // implementation detail (nccl_state.h)

 private:
  explicit NcclCommunicator(std::shared_ptr<State> state) : state_(std::move(state)) {}
  enum class Collective { kAllReduce, kAllGather, kReduceScatter };
  absl::StatusOr<std::unique_ptr<Work>> Start(const at::Tensor& input, Collective kind);
  std::shared_ptr<State> state_;  // shared with the Works still pending
};

// The factory the worker calls for `--device cuda:N`: NcclCommunicator::Connect.
absl::StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(const RendezvousOptions& opts,
                                                                   int device_index);

}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_NCCL_NCCL_COMMUNICATOR_H_
