// Internal to the NCCL communicator (nccl_communicator.h): its CUDA/NCCL
// resources (NcclCommunicator::State, shared with the Works still pending),
// the Work a collective returns, and the CUDA/NCCL helpers both use. Only
// compiled where the CUDA toolkit and NCCL are found (executor/CMakeLists.txt).
#ifndef FXDP_EXECUTOR_NCCL_NCCL_STATE_H_
#define FXDP_EXECUTOR_NCCL_NCCL_STATE_H_

#include <ATen/core/Tensor.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/nccl/nccl_communicator.h"

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

namespace fxdp::executor::nccl_internal {

using Clock = std::chrono::steady_clock;

// NCCL's error text, with ncclGetLastError's detail where the version has it.
std::string NcclError(ncclResult_t r, ncclComm_t comm);
// "cudaErrorX: text".
std::string CudaError(cudaError_t e);

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
ncclResult_t PollInProgress(ncclComm_t comm, Clock::time_point deadline, bool* timed_out);

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

// The Work of a collective enqueued on `state`'s stream: `done` is recorded
// after it; `what` names it in errors.
std::unique_ptr<Work> MakeNcclWork(std::shared_ptr<NcclCommunicator::State> state, cudaEvent_t done,
                                   at::Tensor input, at::Tensor output, std::string what);

}  // namespace fxdp::executor::nccl_internal

namespace fxdp::executor {

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

  // "nccl rank R/N cuda:D", the prefix of every error.
  std::string Who() const;
  // A completion event: a free one, or a new one.
  absl::StatusOr<cudaEvent_t> TakeEvent();
  // Keeps `input`/`output` until `done` has completed.
  void Adopt(cudaEvent_t done, at::Tensor input, at::Tensor output);
  // Frees the buffers of orphans whose collective has completed.
  void ReapOrphans();
  // Aborts the communicator (its running kernels end early) once, for `reason`.
  void Abort(const std::string& reason);
  // Finalises the communicator (aborts it after `timeout`) and frees what the
  // stream no longer uses.
  ~State();
};

}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_NCCL_NCCL_STATE_H_
