// Gloo over device tensors: a Communicator that copies each collective's
// input to the host, runs it on an inner CPU communicator (Gloo), and copies
// the result back to the input's device when it is waited for. What
// `fxdp-worker run --communicator gloo` uses on cuda:N, e.g. several ranks on
// one GPU, which NCCL refuses (docs/gpu.md). Costs a device-to-host and a
// host-to-device copy per collective; NCCL is the fast path.
#ifndef FXDP_EXECUTOR_GLOO_HOST_STAGED_COMMUNICATOR_H_
#define FXDP_EXECUTOR_GLOO_HOST_STAGED_COMMUNICATOR_H_

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "executor/communicator.h"
#include "executor/torch_types.h"
#include "util/status_macros.h"

namespace fxdp::executor {

class HostStagedCommunicator : public Communicator {
 public:
  explicit HostStagedCommunicator(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string name() const override { return absl::StrCat(inner_->name(), " (host-staged)"); }

  absl::StatusOr<std::unique_ptr<Work>> AllReduceSum(const at::Tensor& input) override {
    return Staged(input, "all_reduce",
                  [this](at::Tensor h) { return inner_->AllReduceSumDonated(std::move(h)); });
  }
  absl::StatusOr<std::unique_ptr<Work>> AllGather(const at::Tensor& input) override {
    return Staged(input, "all_gather_into_tensor",
                  [this](at::Tensor h) { return inner_->AllGather(h); });
  }
  absl::StatusOr<std::unique_ptr<Work>> ReduceScatterSum(const at::Tensor& input) override {
    return Staged(input, "reduce_scatter_tensor",
                  [this](at::Tensor h) { return inner_->ReduceScatterSumDonated(std::move(h)); });
  }

 private:
  // Waits for the host collective and copies its result to `device`.
  class StagedWork : public Work {
   public:
    StagedWork(std::unique_ptr<Work> inner, c10::Device device, std::string what)
        : inner_(std::move(inner)), device_(device), what_(std::move(what)) {}
    absl::StatusOr<at::Tensor> Wait(std::chrono::milliseconds timeout) override {
      FXDP_ASSIGN_OR_RETURN(at::Tensor host, inner_->Wait(timeout));
      try {
        return host.to(device_);
      } catch (const std::exception& e) {
        return absl::ResourceExhaustedError(absl::StrCat(
            what_, ": copying the result to ", device_.str(), " failed: ", ExceptionMessage(e)));
      }
    }
    void Poll() override { inner_->Poll(); }

   private:
    std::unique_ptr<Work> inner_;
    c10::Device device_;
    std::string what_;
  };

  template <typename Start>
  absl::StatusOr<std::unique_ptr<Work>> Staged(const at::Tensor& input, const char* op,
                                               Start start) {
    const std::string what = absl::StrCat(name(), ": ", op);
    if (!input.defined()) return absl::InvalidArgumentError(absl::StrCat(what, " of no tensor"));
    at::Tensor host;
    try {
      // A normal (not inference), contiguous host copy of its own: the inner
      // communicator's threads work on it in place.
      c10::InferenceMode normal(false);
      host = input.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true).contiguous();
    } catch (const std::exception& e) {
      return absl::ResourceExhaustedError(
          absl::StrCat(what, ": copying the input to the host failed: ", ExceptionMessage(e)));
    }
    FXDP_ASSIGN_OR_RETURN(std::unique_ptr<Work> w, start(std::move(host)));
    return std::unique_ptr<Work>(std::make_unique<StagedWork>(std::move(w), input.device(), what));
  }

  std::unique_ptr<Communicator> inner_;
};

}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_GLOO_HOST_STAGED_COMMUNICATOR_H_
