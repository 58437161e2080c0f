// safetensors files (https://github.com/huggingface/safetensors) in C++:
//
//   8 bytes      little-endian u64 N, the header length
//   N bytes      JSON: {"name": {"dtype": "F32", "shape": [2, 3],
//                "data_offsets": [begin, end]}, ..., "__metadata__": {str: str}}
//                (may be padded with trailing spaces)
//   rest         the data buffer; offsets are relative to its start, tensors
//                are row-major little-endian, and together cover it exactly
//
// dtypes: F64 F32 F16 BF16 F8_E4M3 F8_E5M2 I64 I32 I16 I8 U64 U32 U16 U8 BOOL
// C64. Reading checks everything a corrupt or truncated file could get wrong
// (header length, JSON, dtype names, shapes, offsets against sizes, overlap,
// gaps) and says which tensor and what; it never reads out of bounds.
// Writing puts tensors in name order, contiguous, on the CPU, and pads the
// header to a multiple of 8 bytes (as the Python library does).
#ifndef FXDP_EXECUTOR_SAFETENSORS_H_
#define FXDP_EXECUTOR_SAFETENSORS_H_

#include <ATen/Tensor.h>

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace fxdp::executor {

struct SafetensorsFile {
  std::map<std::string, at::Tensor> tensors;  // CPU tensors
  std::map<std::string, std::string> metadata;
};

// The header is limited like the reference implementation (100 MB).
inline constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

absl::StatusOr<SafetensorsFile> ParseSafetensors(absl::string_view bytes);
// The largest file ReadSafetensors reads unless told otherwise (64 GiB).
inline constexpr uint64_t kMaxSafetensorsFile = uint64_t{64} << 30;

struct SafetensorsReadOptions {
  // Read only under `roots` (util::ConfinePath; none means nothing), e.g. a
  // job's data_paths on a worker.
  bool confine = false;
  std::vector<std::string> roots;
  uint64_t max_bytes = kMaxSafetensorsFile;
};

// Reads regular files only (util::ReadRegularFile: no directories, FIFOs or
// devices; the size checked before reading). Errors name `path` as given.
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
