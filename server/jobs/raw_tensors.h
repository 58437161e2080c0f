// Tensors on the wire (worker.proto's TensorChunk) as the server handles
// them: raw row-major little-endian bytes, never LibTorch. Checking a chunk
// stream against the chunking rules, assembling whole tensors, slicing a
// global batch along its batch dim, and re-chunking.
#ifndef FXDP_SERVER_JOBS_RAW_TENSORS_H_
#define FXDP_SERVER_JOBS_RAW_TENSORS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "analysis/ir/batch_split.h"
#include "analysis/ir/declared_tensors.h"
#include "analysis/ir/raw_tensor.h"
#include "analysis/ir/tensor_chunks.h"
#include "proto/fxdp/v1/worker.pb.h"

namespace fxdp::server {

// Whole tensors as bytes: the one RawTensor struct (analysis/ir/raw_tensor.h).
using ir::RawTensor;

// Bytes per element of a wire dtype; INVALID_ARGUMENT for an unknown one.
absl::StatusOr<int> ItemSize(v1::DType dtype);

// "f32[8, 4]"-like text of a dtype and shape, for error messages.
std::string TypeString(v1::DType dtype, const std::vector<int64_t>& shape);
std::string TypeString(ir::DType dtype, const std::vector<int64_t>& shape);

// A stream of TensorChunks checked against the protocol's rules
// (analysis/ir/tensor_chunks.h: the worker's and, mirrored, the Python
// client's), optionally assembling the complete tensors (`keep_data`: Take).
// Errors are INVALID_ARGUMENT starting with `what` ("initial state", "step
// 3's batch") and naming the tensor, the offsets and sizes. With `declared`
// (which outlives the stream) each tensor's first chunk must also be one of
// those tensors, with its dtype and shape (DeclaredTensors::CheckFirstChunk),
// so a stream never holds more than what the graph declares.
class ChunkStream {
 public:
  ChunkStream(std::string what, bool keep_data, const ir::DeclaredTensors* declared = nullptr)
      : check_(std::move(what), declared), keep_(keep_data) {}

  absl::Status Add(const v1::TensorChunk& chunk);
  // A tensor is partly received.
  bool pending() const { return check_.pending(); }
  const std::string& pending_name() const { return check_.pending_name(); }
  // The bytes of the tensor the last chunk belongs to (all of it, as declared).
  uint64_t current_bytes() const { return check_.current().bytes; }
  // Complete tensors so far.
  size_t complete() const { return check_.complete(); }
  const std::string& what() const { return check_.what(); }
  // keep_data: the complete tensors, in order; forgets them.
  std::vector<RawTensor> Take();

 private:
  ir::TensorChunkChecker check_;
  bool keep_;
  std::vector<RawTensor> done_;
  RawTensor cur_;  // keep_data: the tensor being received
};

// Elements [start, start + size) along `dim` of a row-major tensor `t`, as
// bytes (the slice's own row-major layout). Requires 0 <= dim < rank and a
// range inside the dim (checked: INVALID_ARGUMENT).
absl::StatusOr<std::string> SliceDim(const RawTensor& t, int dim, int64_t start, int64_t size);
// The ranges `rows` along `dim`, concatenated along it in their order (a
// rank's rows of a batch with micro-batches: ir::RankRows), as bytes of the
// result's row-major layout. The same checks as SliceDim, per range.
absl::StatusOr<std::string> SliceRows(const RawTensor& t, int dim,
                                      const std::vector<ir::RankSlice>& rows);

// Splits a chunk's bytes into chunks of at most `max_bytes` data bytes
// (offsets adjusted; an empty chunk stays one chunk), appended to `out`.
void RechunkTensor(const v1::TensorChunk& in, size_t max_bytes, std::vector<v1::TensorChunk>* out);

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_RAW_TENSORS_H_
