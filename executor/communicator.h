// The collectives the interpreter needs, behind a small interface.
//
// A graph's `_c10d_functional::all_reduce(Tensor, str reduce_op, str group)`
// node starts a Work through the program's Communicator; the matching
// `_c10d_functional::wait_tensor` waits for it. So do FULLY_SHARD's
// `all_gather_into_tensor(Tensor, int group_size, str group)` (AllGather) and
// `reduce_scatter_tensor(Tensor, str reduce_op, int group_size, str group)`
// (ReduceScatterSum) on 1-D flat buffers (expansion/fully_shard.h). Like
// torch's functional collectives, they never modify their argument: the result
// is a new tensor.
//
//   LocalCommunicator  world size 1: the result is a clone, done at once.
//   GlooCommunicator   c10d ProcessGroupGloo (CPU tensors), in executor/gloo/
//                      (HostStagedCommunicator: Gloo for device tensors).
//   NcclCommunicator   raw NCCL (CUDA tensors), in executor/nccl/.
#ifndef FXDP_EXECUTOR_COMMUNICATOR_H_
#define FXDP_EXECUTOR_COMMUNICATOR_H_

#include <ATen/Tensor.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace fxdp::executor {

// A started collective.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the collective is done or `timeout` has passed (then
  // DEADLINE_EXCEEDED); a failed collective (a lost peer) is UNAVAILABLE.
  // Returns the result; call at most once.
  virtual absl::StatusOr<at::Tensor> Wait(std::chrono::milliseconds timeout) = 0;
  // Never blocks: lets a collective that has finished release what it no
  // longer needs before the graph reaches its wait (Gloo's reduce-scatter
  // keeps this rank's chunk and frees the whole N*s buffer). The program
  // calls it on the collectives in flight whenever it starts another one.
  // The default does nothing.
  virtual void Poll() {}
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Starts summing `input` over all ranks. `input` is not modified; it may be
  // released by the caller once this returns.
  virtual absl::StatusOr<std::unique_ptr<Work>> AllReduceSum(const at::Tensor& input) = 0;
  // Like AllReduceSum, but the caller donates `buffer` (its last use; nothing
  // else shares its storage): the communicator may reduce in place and return
  // it, saving a copy. The default copies.
  virtual absl::StatusOr<std::unique_ptr<Work>> AllReduceSumDonated(at::Tensor buffer) {
    return AllReduceSum(buffer);
  }
  // Starts gathering `input` from every rank (all pass the same numel and
  // dtype): the result is 1-D with world_size() * numel elements, rank r's
  // input (flattened, row-major) at [r * numel, (r + 1) * numel).
  // The default is UNIMPLEMENTED naming the communicator.
  virtual absl::StatusOr<std::unique_ptr<Work>> AllGather(const at::Tensor& /*input*/) {
    return absl::UnimplementedError(
        absl::StrCat(name(), ": this communicator has no all_gather_into_tensor"));
  }
  // Starts summing `input` (numel a multiple of world_size(), the same on
  // every rank) over all ranks and keeps this rank's chunk: the result is 1-D
  // with numel / N elements, the sum of every rank's elements
  // [r * numel / N, (r + 1) * numel / N) for r = rank().
  // The default is UNIMPLEMENTED naming the communicator.
  virtual absl::StatusOr<std::unique_ptr<Work>> ReduceScatterSum(const at::Tensor& /*input*/) {
    return absl::UnimplementedError(
        absl::StrCat(name(), ": this communicator has no reduce_scatter_tensor"));
  }
  // Like ReduceScatterSum, but the caller donates `buffer` (as for
  // AllReduceSumDonated): the communicator may reduce in it, saving a copy
  // of the whole N*s buffer. The default copies.
  virtual absl::StatusOr<std::unique_ptr<Work>> ReduceScatterSumDonated(at::Tensor buffer) {
    return ReduceScatterSum(buffer);
  }
  // A short description for logs ("local", "gloo rank 0/2").
  virtual std::string name() const = 0;
  // The remote addresses ("[ip]:port") of its connections to the other
  // ranks, for a ConnectionAborter (socket_abort.h). The default: none.
  virtual std::vector<std::string> PeerSocketAddresses() const { return {}; }
};

// World size 1: AllReduceSum is a clone (the sum over one rank).
class LocalCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  absl::StatusOr<std::unique_ptr<Work>> AllReduceSum(const at::Tensor& input) override;
  // Over one rank both are a flattened clone.
  absl::StatusOr<std::unique_ptr<Work>> AllGather(const at::Tensor& input) override;
  absl::StatusOr<std::unique_ptr<Work>> ReduceScatterSum(const at::Tensor& input) override;
  std::string name() const override { return "local"; }
};

// A Work that is already done.
class ReadyWork : public Work {
 public:
  explicit ReadyWork(at::Tensor result) : result_(std::move(result)) {}
  absl::StatusOr<at::Tensor> Wait(std::chrono::milliseconds) override { return result_; }

 private:
  at::Tensor result_;
};

}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_COMMUNICATOR_H_
