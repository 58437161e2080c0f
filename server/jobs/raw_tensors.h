// Tensors on the wire (worker.proto's TensorChunk) as the server handles
// them: raw row-major little-endian bytes, never LibTorch. Checking a chunk
// stream against the chunking rules, assembling whole tensors, slicing a
// global batch along its batch dim, and re-chunking.
#ifndef FXDP_SERVER_JOBS_RAW_TENSORS_H_
#define FXDP_SERVER_JOBS_RAW_TENSORS_H_

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "analysis/ir/declared_tensors.h"
#include "analysis/ir/raw_tensor.h"
#include "proto/fxdp/v1/worker.pb.h"

namespace fxdp::server {

// Whole tensors as bytes: the one RawTensor struct (analysis/ir/raw_tensor.h).
using ir::RawTensor;

// Bytes per element of a wire dtype; INVALID_ARGUMENT for an unknown one.
absl::StatusOr<int> ItemSize(v1::DType dtype);

// "f32[8, 4]"-like text of a dtype and shape, for error messages.
std::string TypeString(v1::DType dtype, const std::vector<int64_t>& shape);
std::string TypeString(ir::DType dtype, const std::vector<int64_t>& shape);

// Checks a stream of TensorChunks against worker.proto's rules: a known dtype,
// non-negative dims, each tensor's chunks in order without gaps (the first
// at offset 0), the same dtype and shape in every chunk of a tensor, no chunk
// past the tensor's end, no tensor started before the previous one is
// complete, no name twice. With `keep_data` it also assembles the complete
// tensors (Take). Errors are INVALID_ARGUMENT starting with `what` ("initial
// state", "step 3's batch") and naming the tensor, the field, what was
// expected and what came. With `declared` (which outlives the stream) each
// tensor's first chunk must also be one of those tensors, with its dtype and
// shape (DeclaredTensors::CheckFirstChunk), so a stream never holds more than
// what the graph declares.
class ChunkStream {
 public:
  ChunkStream(std::string what, bool keep_data, const ir::DeclaredTensors* declared = nullptr)
      : what_(std::move(what)), keep_(keep_data), declared_(declared) {}

  absl::Status Add(const v1::TensorChunk& chunk);
  // A tensor is partly received.
  bool pending() const { return active_; }
  const std::string& pending_name() const { return cur_.name; }
  // Complete tensors so far.
  size_t complete() const { return complete_; }
  const std::string& what() const { return what_; }
  // keep_data: the complete tensors, in order; forgets them.
  std::vector<RawTensor> Take();

 private:
  std::string what_;
  bool keep_;
  const ir::DeclaredTensors* declared_;
  std::set<std::string> names_;
  std::vector<RawTensor> done_;
  RawTensor cur_;  // data only with keep_
  bool active_ = false;
  uint64_t next_ = 0, total_ = 0;
  size_t complete_ = 0;
};

// Elements [start, start + size) along `dim` of a row-major tensor `t`, as
// bytes (the slice's own row-major layout). Requires 0 <= dim < rank and a
// range inside the dim (checked: INVALID_ARGUMENT).
absl::StatusOr<std::string> SliceDim(const RawTensor& t, int dim, int64_t start, int64_t size);

// Splits a chunk's bytes into chunks of at most `max_bytes` data bytes
// (offsets adjusted; an empty chunk stays one chunk), appended to `out`.
void RechunkTensor(const v1::TensorChunk& in, size_t max_bytes, std::vector<v1::TensorChunk>* out);

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_RAW_TENSORS_H_
