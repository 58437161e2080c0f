// A Communicator over a c10d backend (ProcessGroupGloo from gloo_backend.h):
// AllReduceSum is `allreduce(SUM)` on a contiguous CPU copy of the input.
// AllGather copies this rank's input into its place in the result and
// broadcasts each rank's part in place (c10d `broadcast`, one per rank, root
// r for part r): every byte lands where it belongs, with no temporary.
// (c10d's `_allgather_base` on Gloo gathers into a flat temporary allocated on
// Gloo's thread and copies it into the result: an extra N*s buffer per gather,
// in another malloc arena.) The wire carries what an all-gather carries, in N
// operations.
// ReduceScatterSum is an in-place `allreduce(SUM)` of the N*s buffer and, at
// Wait, this rank's chunk cloned out (the buffer then released): what
// ProcessGroupGloo's own `_reduce_scatter_base` does (torch 2.13 builds it
// from Gloo's all-reduce), without its extra clone of the whole buffer; a
// donated buffer (ReduceScatterSumDonated) is reduced without any copy. Cost
// against a true reduce-scatter: the wire carries an all-reduce's 2(N-1)/N of
// the buffer instead of (N-1)/N (2x), and the whole buffer is held until
// Wait (as REPLICATE's all-reduce holds its bucket); the result is the same.
//
// Errors name this rank ("gloo rank 0/2: all_reduce ...") and, when Gloo's
// message names a peer's socket address, the rank that owns it ("lost the
// connection to rank 1 ([127.0.0.1]:45751)"): after the rendezvous every rank
// publishes the addresses of its own TCP sockets in the store, so the
// address Gloo reports (the peer's listening or connecting socket) maps back
// to a rank.
#ifndef FXDP_EXECUTOR_GLOO_GLOO_COMMUNICATOR_H_
#define FXDP_EXECUTOR_GLOO_GLOO_COMMUNICATOR_H_

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/communicator.h"
#include "executor/gloo/gloo_backend.h"

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
  // Reduces a contiguous donated buffer in place (no copy).
  absl::StatusOr<std::unique_ptr<Work>> AllReduceSumDonated(at::Tensor buffer) override;
  absl::StatusOr<std::unique_ptr<Work>> AllGather(const at::Tensor& input) override;
  absl::StatusOr<std::unique_ptr<Work>> ReduceScatterSum(const at::Tensor& input) override;
  absl::StatusOr<std::unique_ptr<Work>> ReduceScatterSumDonated(at::Tensor buffer) override;

 private:
  // All-reduces `buf` in place; with `chunk`, Wait returns this rank's chunk
  // of the sum (a reduce-scatter).
  absl::StatusOr<std::unique_ptr<Work>> Start(at::Tensor buf, bool chunk = false);
  // A contiguous, normal (not inference) CPU copy of `input` (Gloo's threads
  // work on it outside the caller's InferenceMode), or an error naming `op`.
  absl::StatusOr<at::Tensor> CopyForGloo(const at::Tensor& input, const char* op) const;

 public:
  std::string name() const override;
  // Every peer's socket addresses (peer_addresses()).
  std::vector<std::string> PeerSocketAddresses() const override;

  // "[ip]:port" of the peers' sockets -> their rank (addresses two ranks
  // share, as ranks in one process do, are left out).
  using PeerAddresses = std::map<std::string, int>;
  const PeerAddresses& peer_addresses() const { return *peers_; }

 private:
  GlooCommunicator(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<c10d::Backend> backend,
                   int rank, int world_size, std::shared_ptr<const PeerAddresses> peers)
      : store_(std::move(store)),
        backend_(std::move(backend)),
        rank_(rank),
        world_size_(world_size),
        peers_(std::move(peers)) {}
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Backend> backend_;
  int rank_;
  int world_size_;
  std::shared_ptr<const PeerAddresses> peers_;
};

}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_GLOO_GLOO_COMMUNICATOR_H_
