// Tensors on the worker protocol's wire (proto/fxdp/v1/worker.proto,
// TensorChunk): dtype + shape + raw row-major little-endian bytes, split into
// chunks by byte offset.
#ifndef FXDP_EXECUTOR_WORKER_WIRE_TENSORS_H_
#define FXDP_EXECUTOR_WORKER_WIRE_TENSORS_H_

#include <ATen/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "analysis/ir/declared_tensors.h"
#include "analysis/ir/tensor_chunks.h"
#include "executor/interpreter.h"
#include "proto/fxdp/v1/worker.pb.h"

namespace fxdp::executor {

// FetchState's default chunk size (FetchState.chunk_bytes = 0).
inline constexpr size_t kDefaultChunkBytes = size_t{1} << 20;

// Builds CPU tensors from TensorChunk messages, each checked against the
// protocol's rules (analysis/ir/tensor_chunks.h, the server's too); with
// Expect, each tensor must also be one the graph declares, with its dtype and
// shape (ir::DeclaredTensors::CheckFirstChunk), checked before its memory is
// allocated: a message cannot make the worker allocate more than its graph
// needs. Errors are INVALID_ARGUMENT naming the tensor (RESOURCE_EXHAUSTED
// when it cannot be allocated).
class TensorAssembler {
 public:
  // `declared` outlives the assembler; `world_size` > 1 admits a global
  // batch along an INPUT's batch dim (not yet sharded for this rank).
  void Expect(const ir::DeclaredTensors* declared, int world_size = 1) {
    check_ = ir::TensorChunkChecker("", declared, world_size);
  }
  absl::Status Add(const v1::TensorChunk& chunk);
  // A tensor is partly received (its name; "" when none).
  bool pending() const { return check_.pending(); }
  const std::string& pending_name() const { return check_.pending_name(); }
  // Complete tensors so far.
  size_t size() const { return done_.size(); }
  // Hands the complete tensors over and starts afresh.
  TensorMap Take();

 private:
  ir::TensorChunkChecker check_;
  TensorMap done_;
  at::Tensor cur_;  // the tensor being received
};

// Splits `t` into chunks of at most `chunk_bytes` (>= 1) data bytes (one
// empty chunk for a 0-byte tensor), copied to a contiguous CPU tensor first,
// and calls `emit` for each in order. Stops and returns CANCELLED when `emit`
// returns false; INVALID_ARGUMENT for an undefined tensor or a dtype the wire
// cannot name.
absl::Status ChunkTensor(const std::string& name, const at::Tensor& t, size_t chunk_bytes,
                         const std::function<bool(v1::TensorChunk&)>& emit);

}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_WORKER_WIRE_TENSORS_H_
