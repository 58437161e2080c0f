// LocalCommunicator and GlooCommunicator.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "analysis/ir/status_macros.h"
#include "executor/communicator.h"
#include "executor/gloo_communicator.h"
#include "executor/torch_types.h"

namespace fxdp::executor {

absl::StatusOr<std::unique_ptr<Work>> LocalCommunicator::AllReduceSum(const at::Tensor& input) {
  try {
    return std::unique_ptr<Work>(std::make_unique<ReadyWork>(input.clone()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("all_reduce (local): ", ExceptionMessage(e)));
  }
}

namespace {

class GlooWork : public Work {
 public:
  GlooWork(c10::intrusive_ptr<c10d::Work> work, at::Tensor result, std::string who)
      : work_(std::move(work)), result_(std::move(result)), who_(std::move(who)) {}

  absl::StatusOr<at::Tensor> Wait(std::chrono::milliseconds timeout) override {
    try {
      work_->wait(timeout);
    } catch (const std::exception& e) {
      const std::string msg = ExceptionMessage(e);
      const bool timed_out = absl::StrContains(msg, "timed out") ||
                             absl::StrContains(msg, "Timed out") ||
                             absl::StrContains(msg, "Timeout");
      return absl::Status(
          timed_out ? absl::StatusCode::kDeadlineExceeded : absl::StatusCode::kUnavailable,
          absl::StrCat(who_, ": all_reduce ", timed_out ? "timed out" : "failed", " after at most ",
                       timeout.count(), " ms: ", msg));
    }
    return result_;
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  at::Tensor result_;
  std::string who_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Connect(
    const RendezvousOptions& opts, const std::string& interface_host) {
  FXDP_ASSIGN_OR_RETURN(c10::intrusive_ptr<c10d::Store> store, ConnectStore(opts));
  return Create(store, opts, interface_host);
}

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(
    const c10::intrusive_ptr<c10d::Store>& store, const RendezvousOptions& opts,
    const std::string& interface_host) {
  FXDP_ASSIGN_OR_RETURN(c10::intrusive_ptr<c10d::Backend> backend,
                        CreateGlooBackend(store, opts, interface_host));
  return std::unique_ptr<GlooCommunicator>(
      new GlooCommunicator(store, std::move(backend), opts.rank, opts.world_size));
}

std::string GlooCommunicator::name() const {
  return absl::StrCat("gloo rank ", rank_, "/", world_size_);
}

absl::StatusOr<std::unique_ptr<Work>> GlooCommunicator::AllReduceSum(const at::Tensor& input) {
  if (!input.device().is_cpu()) {
    return absl::UnimplementedError(absl::StrCat(
        name(), ": Gloo all_reduce of a ", input.device().str(),
        " tensor is not supported (Gloo is the CPU communicator)"));
  }
  try {
    // A normal (not inference) contiguous CPU copy: Gloo works in place on it
    // from its own threads, outside the caller's InferenceMode.
    c10::InferenceMode normal(false);
    at::Tensor buf = input.clone(at::MemoryFormat::Contiguous);
    std::vector<at::Tensor> tensors{buf};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    c10::intrusive_ptr<c10d::Work> work = backend_->allreduce(tensors, o);
    return std::unique_ptr<Work>(std::make_unique<GlooWork>(std::move(work), std::move(buf),
                                                            name()));
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat(name(), ": starting all_reduce failed: ", ExceptionMessage(e)));
  }
}

}  // namespace fxdp::executor
