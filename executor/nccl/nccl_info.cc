#include "executor/nccl/nccl_info.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include "absl/strings/str_cat.h"

namespace fxdp::executor {

std::string NcclVersion() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
  return absl::StrCat(v / 10000, ".", (v / 100) % 100, ".", v % 100);
}

absl::StatusOr<int> CudaDeviceCount() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess)
    return absl::UnavailableError(absl::StrCat("no usable CUDA device: ", cudaGetErrorString(err)));
  if (n == 0) return absl::UnavailableError("no usable CUDA device: the driver reports 0 devices");
  return n;
}

}  // namespace fxdp::executor
