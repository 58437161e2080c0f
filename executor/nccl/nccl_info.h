// What this machine's CUDA runtime and NCCL offer. No CUDA headers here, so
// any executor TU may ask.
#ifndef FXDP_EXECUTOR_NCCL_NCCL_INFO_H_
#define FXDP_EXECUTOR_NCCL_NCCL_INFO_H_

#include <string>

#include "absl/status/statusor.h"

namespace fxdp::executor {

// "2.28.9": the NCCL library linked into this build.
std::string NcclVersion();
// Number of usable CUDA devices; an error (naming the CUDA error) when there
// is no driver or no device, e.g. on a CPU-only machine.
absl::StatusOr<int> CudaDeviceCount();

}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_NCCL_NCCL_INFO_H_
