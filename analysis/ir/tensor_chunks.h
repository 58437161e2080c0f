// The tensor-chunk protocol (proto/fxdp/v1/worker.proto, TensorChunk): a
// tensor travels as dtype + shape + raw row-major little-endian bytes, split
// into chunks by byte offset. The one copy of its rules and messages, used
// by the server (server's ChunkStream: what clients and workers stream) and
// the worker (executor/worker/wire_tensors.h: what the server streams);
// client/python/fxdp/tensor_chunks.py mirrors it, and
// tests/testdata/tensor_chunks.json holds the cases both sides must agree on
// (tests/analysis/tensor_chunks_test.cc, tests/python/test_tensor_chunks.py).
//
// The rules, in the order they are checked:
//   a tensor's first chunk: a name, not sent before, declared by the graph
//     with its dtype and shape (with a DeclaredTensors), a known dtype, no
//     negative dim, at most INT64_MAX bytes;
//   a later chunk: no other tensor before this one is complete, the same
//     dtype and shape as the first;
//   every chunk: at the offset where the previous one ended (0 first), not
//     past the tensor's end.
// A 0-byte tensor is one empty chunk. Errors are INVALID_ARGUMENT starting
// with "<what>: " (when `what` is not empty) and naming the tensor, the
// offsets and sizes; a chunk that fails changes nothing.
#ifndef FXDP_ANALYSIS_IR_TENSOR_CHUNKS_H_
#define FXDP_ANALYSIS_IR_TENSOR_CHUNKS_H_

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "analysis/ir/declared_tensors.h"
#include "analysis/ir/types.h"
#include "proto/fxdp/v1/worker.pb.h"

namespace fxdp::ir {

// The tensor a chunk stream is receiving.
struct ChunkedTensor {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;  // numel * item size
};

// Where an accepted chunk's bytes go: [offset, offset + data.size()) of the
// tensor current() names.
struct ChunkPlace {
  bool starts = false;     // the tensor's first chunk: its memory is to be made
  bool completes = false;  // its last: the tensor is whole after this chunk
};

class TensorChunkChecker {
 public:
  // `what` ("initial state", "step 3's batch") starts every message; with
  // `declared` (which outlives the checker) each tensor must be one of those
  // (DeclaredTensors::CheckFirstChunk; `world_size` > 1 admits a global batch
  // along an INPUT's batch dim).
  explicit TensorChunkChecker(std::string what = "", const DeclaredTensors* declared = nullptr,
                              int world_size = 1)
      : what_(std::move(what)), declared_(declared), world_size_(world_size) {}

  // Checks `c`; on OK the caller copies c.data() to current() at c.offset().
  absl::StatusOr<ChunkPlace> Add(const v1::TensorChunk& c);

  // The tensor being received (valid from its first chunk until the next
  // tensor's first chunk).
  const ChunkedTensor& current() const { return cur_; }
  // A tensor is partly received (pending_name: its name).
  bool pending() const { return active_; }
  const std::string& pending_name() const { return cur_.name; }
  // Complete tensors so far.
  size_t complete() const { return complete_; }
  const std::string& what() const { return what_; }
  // Forgets every tensor (names included): a new stream.
  void Reset();

 private:
  absl::Status CheckFirst(const v1::TensorChunk& c, ChunkedTensor* t) const;
  absl::Status Error(const std::string& tensor, const std::string& msg) const;

  std::string what_;
  const DeclaredTensors* declared_;
  int world_size_;
  std::set<std::string> names_;
  ChunkedTensor cur_;
  bool active_ = false;
  uint64_t next_ = 0;
  size_t complete_ = 0;
};

// "f32[2, 3]"; an unknown wire dtype as "dtype99[2, 3]".
std::string WireTypeText(int wire_dtype, const std::vector<int64_t>& shape);

// The offsets and sizes of the chunks a tensor of `bytes` is sent in, at most
// `chunk_bytes` (>= 1) each: one empty chunk for 0 bytes.
std::vector<std::pair<uint64_t, uint64_t>> ChunkSpans(uint64_t bytes, uint64_t chunk_bytes);

}  // namespace fxdp::ir

#endif  // FXDP_ANALYSIS_IR_TENSOR_CHUNKS_H_
