// A Communicator over a c10d backend (ProcessGroupGloo from gloo_backend.h):
// AllReduceSum is `allreduce(SUM)` on a contiguous CPU copy of the input.
#ifndef FXDP_EXECUTOR_GLOO_COMMUNICATOR_H_
#define FXDP_EXECUTOR_GLOO_COMMUNICATOR_H_

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "executor/communicator.h"
#include "executor/gloo_backend.h"

namespace fxdp::executor {

class GlooCommunicator : public Communicator {
 public:
  // Rendezvous (rank 0 serves the TCPStore at opts.host:opts.port) and a Gloo
  // process group bound to `interface_host`. Fails within ~2x opts.timeout
  // when a peer does not show up.
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Connect(
      const RendezvousOptions& opts, const std::string& interface_host);
  // Over an existing store (tests: several ranks in one process).
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Create(
      const c10::intrusive_ptr<c10d::Store>& store, const RendezvousOptions& opts,
      const std::string& interface_host);

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  absl::StatusOr<std::unique_ptr<Work>> AllReduceSum(const at::Tensor& input) override;
  std::string name() const override;

 private:
  GlooCommunicator(c10::intrusive_ptr<c10d::Store> store,
                   c10::intrusive_ptr<c10d::Backend> backend, int rank, int world_size)
      : store_(std::move(store)), backend_(std::move(backend)), rank_(rank),
        world_size_(world_size) {}
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Backend> backend_;
  int rank_;
  int world_size_;
};

}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_GLOO_COMMUNICATOR_H_
