// NcclCommunicator::State and the Work of a pending collective
// (nccl_state.h).
#include "executor/nccl/nccl_state.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace fxdp::executor {
namespace nccl_internal {

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

}  // namespace nccl_internal

using nccl_internal::Backoff;
using nccl_internal::Clock;
using nccl_internal::CudaDeviceScope;
using nccl_internal::CudaError;
using nccl_internal::NcclError;
using nccl_internal::PollInProgress;

std::string NcclCommunicator::State::Who() const {
  return absl::StrCat("nccl rank ", rank, "/", world_size, " cuda:", device);
}

absl::StatusOr<cudaEvent_t> NcclCommunicator::State::TakeEvent() {
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
void NcclCommunicator::State::Adopt(cudaEvent_t done, at::Tensor input, at::Tensor output) {
  if (cudaEventQuery(done) == cudaSuccess) {
    free_events.push_back(done);
    return;
  }
  cudaGetLastError();  // cudaErrorNotReady is sticky for nobody, but be tidy
  orphans.push_back(Orphan{done, std::move(input), std::move(output)});
}

void NcclCommunicator::State::ReapOrphans() {
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

void NcclCommunicator::State::Abort(const std::string& reason) {
  if (!abort_reason.empty()) return;
  abort_reason = reason;
  if (comm != nullptr) {
    CudaDeviceScope scope(device);
    ncclCommAbort(comm);  // kills the kernels still running
    comm = nullptr;
  }
}

NcclCommunicator::State::~State() {
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

namespace {

class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<NcclCommunicator::State> state, cudaEvent_t done, at::Tensor input,
           at::Tensor output, std::string what)
      : state_(std::move(state)),
        done_(done),
        input_(std::move(input)),
        output_(std::move(output)),
        what_(std::move(what)) {}

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
        return Fail(s,
                    absl::StrCat(what_, ": ncclCommGetAsyncError failed: ", NcclError(r, s.comm)));
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
    return absl::UnavailableError(absl::StrCat(
        s.Who(), ": ", what_, " failed: the NCCL communicator was aborted (", s.abort_reason, ")"));
  }

  std::shared_ptr<NcclCommunicator::State> state_;
  cudaEvent_t done_;
  at::Tensor input_, output_;
  std::string what_;
  bool waited_ = false;
  bool finished_ = false;  // the all-reduce was seen complete
};

}  // namespace

namespace nccl_internal {

std::unique_ptr<Work> MakeNcclWork(std::shared_ptr<NcclCommunicator::State> state, cudaEvent_t done,
                                   at::Tensor input, at::Tensor output, std::string what) {
  return std::make_unique<NcclWork>(std::move(state), done, std::move(input), std::move(output),
                                    std::move(what));
}

}  // namespace nccl_internal
}  // namespace fxdp::executor
