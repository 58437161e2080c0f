// safetensors files as LibTorch tensors: the executor's wrapper of the
// torch-free parser and writer in analysis/ir/safetensors.h (the format, its
// checks and its error messages are described there). Reading copies each
// tensor into a CPU at::Tensor; writing copies tensors to the CPU,
// contiguous, in name order.
#ifndef FXDP_EXECUTOR_SAFETENSORS_H_
#define FXDP_EXECUTOR_SAFETENSORS_H_

#include <ATen/Tensor.h>

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "analysis/ir/safetensors.h"

namespace fxdp::executor {

struct SafetensorsFile {
  std::map<std::string, at::Tensor> tensors;  // CPU tensors
  std::map<std::string, std::string> metadata;
};

using ir::kMaxSafetensorsFile;
using ir::kMaxSafetensorsHeader;
using ir::SafetensorsReadOptions;

absl::StatusOr<SafetensorsFile> ParseSafetensors(absl::string_view bytes);

// ir::ReadSafetensorsBytes, then ParseSafetensors. Errors name `path` as given.
absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path,
                                                const SafetensorsReadOptions& options = {});

// Undefined tensors and dtypes safetensors cannot name are INVALID_ARGUMENT.
absl::StatusOr<std::string> SerializeSafetensors(
    const std::map<std::string, at::Tensor>& tensors,
    const std::map<std::string, std::string>& metadata = {});
// Writes to `path` via a temporary file in the same directory, then renames.
absl::Status WriteSafetensors(const std::string& path,
                              const std::map<std::string, at::Tensor>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_SAFETENSORS_H_
