// safetensors files as LibTorch tensors: the executor's wrapper of the
// torch-free parser and writer in analysis/ir/safetensors.h (the format, its
// checks and its error messages are described there). Reading copies each
// tensor into a CPU at::Tensor; writing copies tensors to the CPU,
// contiguous, in name order.
#ifndef FXDP_EXECUTOR_SAFETENSORS_H_
#define FXDP_EXECUTOR_SAFETENSORS_H_

#include <ATen/Tensor.h>

#include <map>
#include <set>
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

// Reading a FULLY_SHARD rank's state (analysis/ir/flat_shard.h): each tensor
// named in `names` is read as rank `rank`'s flat shard of it over `world`
// ranks (a 1-D tensor of FlatShardOf's shard_numel elements, its real
// elements read from the file, the padding zero); its whole shape goes to
// `full_shapes`.
struct FlatShardRead {
  std::set<std::string> names;
  int32_t world = 1;
  int32_t rank = 0;
  std::map<std::string, std::vector<int64_t>> full_shapes;  // filled by the read
};

// The file read piece by piece (ir::SafetensorsReader): each tensor is read
// from the file straight into its own CPU tensor, so the whole file is never
// held besides them; with `shards`, only this rank's slice of the tensors it
// names. Errors name `path` as given.
absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path,
                                                const SafetensorsReadOptions& options = {},
                                                FlatShardRead* shards = nullptr);

// The tensors of an opened file (ir::SafetensorsReader::Open) named in
// `only` (all when null; the others are never read), as ReadSafetensors
// reads them; errors name `path`.
absl::StatusOr<SafetensorsFile> ReadTensors(const ir::SafetensorsReader& file,
                                            const std::string& path,
                                            const std::set<std::string>* only = nullptr,
                                            FlatShardRead* shards = nullptr);

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
