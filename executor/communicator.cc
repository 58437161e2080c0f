// LocalCommunicator (Gloo's communicator: executor/gloo/, NCCL's:
// executor/nccl/).
#include "executor/communicator.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "executor/torch_types.h"

namespace fxdp::executor {

absl::StatusOr<std::unique_ptr<Work>> LocalCommunicator::AllReduceSum(const at::Tensor& input) {
  try {
    return std::unique_ptr<Work>(std::make_unique<ReadyWork>(input.clone()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("all_reduce (local): ", ExceptionMessage(e)));
  }
}

absl::StatusOr<std::unique_ptr<Work>> LocalCommunicator::AllGather(const at::Tensor& input) {
  try {
    return std::unique_ptr<Work>(std::make_unique<ReadyWork>(input.reshape({-1}).clone()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("all_gather (local): ", ExceptionMessage(e)));
  }
}

absl::StatusOr<std::unique_ptr<Work>> LocalCommunicator::ReduceScatterSum(const at::Tensor& input) {
  try {
    return std::unique_ptr<Work>(std::make_unique<ReadyWork>(input.reshape({-1}).clone()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("reduce_scatter (local): ", ExceptionMessage(e)));
  }
}

}  // namespace fxdp::executor
