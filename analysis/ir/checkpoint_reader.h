// Reading a checkpoint the workers wrote (checkpoint_index.h) by ranges:
// any flat range of any tensor, taken from the parts of the files that hold
// it, whatever world size or style wrote them. The worker reads its rank's
// range of each tensor (executor/worker/checkpoint_read.h: a new world size
// or style), `fxdp export` whole tensors. Torch-free: bytes in the
// checkpoint's dtype.
#ifndef FXDP_ANALYSIS_IR_CHECKPOINT_READER_H_
#define FXDP_ANALYSIS_IR_CHECKPOINT_READER_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "analysis/ir/checkpoint_index.h"
#include "analysis/ir/safetensors.h"

namespace fxdp::ir {

class CheckpointReader {
 public:
  // The index at `path` (a checkpoint's fxdp-checkpoint.json), read under
  // `options` (its roots: a worker's data roots; none: a file the operator
  // named) and parsed; its files are opened the same way when first read.
  static absl::StatusOr<CheckpointReader> Open(const std::string& path,
                                               const SafetensorsReadOptions& options);

  const CheckpointIndex& index() const { return index_; }
  const std::string& path() const { return path_; }
  // Elements [begin, end) of tensor `name` (0 <= begin <= end <= its numel)
  // into `dest`, row-major in the checkpoint's dtype. INVALID_ARGUMENT for a
  // tensor the index does not list or a file whose entry is not the part the
  // index says (naming the file), the file errors of SafetensorsReader.
  absl::Status Read(const std::string& name, int64_t begin, int64_t end, void* dest);
  uint64_t bytes_read() const { return bytes_read_; }
  int files_opened() const { return static_cast<int>(files_.size()); }

 private:
  CheckpointReader(CheckpointIndex index, std::string path, std::string dir,
                   SafetensorsReadOptions options)
      : index_(std::move(index)), path_(std::move(path)), dir_(std::move(dir)), options_(options) {}
  CheckpointIndex index_;
  std::string path_, dir_;
  SafetensorsReadOptions options_;
  std::map<int, SafetensorsReader> files_;
  uint64_t bytes_read_ = 0;
};

}  // namespace fxdp::ir

#endif  // FXDP_ANALYSIS_IR_CHECKPOINT_READER_H_
