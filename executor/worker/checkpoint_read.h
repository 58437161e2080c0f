// A job's initial state read by its ranks from a checkpoint on the worker's
// filesystem (AssignJob.initial_checkpoint, worker.proto's CheckpointSource;
// docs/checkpoints.md), and the optimizer state they create themselves.
//
// Formats: a Hugging Face checkpoint, `save_pretrained`'s model.safetensors
// or the model.safetensors.index.json ("weight_map": tensor -> file in the
// index's directory) of a sharded one, or a directory holding either. Every
// file is opened beneath the worker's data roots (util::DataRoots: no link
// followed, the server's files refused). Each header is checked against the
// graph before anything is allocated or read: a tensor's shape must be the
// single-device graph's, its dtype the graph's or another floating-point one
// (converted as read). A rank reads only the bytes it holds: whole tensors,
// and of each FULLY_SHARD tensor its flat shard's range
// (analysis/ir/flat_shard.h), the padding zero.
#ifndef FXDP_EXECUTOR_WORKER_CHECKPOINT_READ_H_
#define FXDP_EXECUTOR_WORKER_CHECKPOINT_READ_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "executor/interpreter.h"
#include "proto/fxdp/v1/worker.pb.h"
#include "util/data_roots.h"

namespace fxdp::ir {
class DeclaredTensors;  // analysis/ir/declared_tensors.h
}  // namespace fxdp::ir

namespace fxdp::executor {

// What a rank holds: its graph's state tensors (FULLY_SHARD: sharded ones as
// [shard_numel]) and the whole shapes of the sharded ones.
struct RankStateLayout {
  const ir::DeclaredTensors* declared = nullptr;           // the rank graph's state
  std::map<std::string, const v1::ShardedState*> sharded;  // by state name
  int world = 1;
  int rank = 0;
  const util::DataRoots* roots = nullptr;  // the worker's data roots (none: every path refused)
};

// The layout of a rank of `assign` (its sharded_state), over `declared`.
RankStateLayout LayoutOf(const v1::AssignJob& assign, const ir::DeclaredTensors* declared,
                         const util::DataRoots* roots);

struct CheckpointState {
  TensorMap tensors;          // by graph state name
  uint64_t bytes_read = 0;    // of tensor data, this rank's
  uint64_t bytes_listed = 0;  // of the tensors read, whole, in the checkpoint
  int files = 0;              // safetensors files opened
};

// source.tensors read (their names mapped) and source.fills created, for the
// rank of `layout`. Errors name the path, the tensor, what the graph expects
// and what the checkpoint holds: INVALID_ARGUMENT for a tensor the checkpoint
// lacks, a shape or dtype that does not fit, a malformed index, a name
// twice; the file errors of util::DataRoots (PERMISSION_DENIED outside the
// roots, NOT_FOUND, ...).
absl::StatusOr<CheckpointState> ReadCheckpointState(const v1::CheckpointSource& source,
                                                    const RankStateLayout& layout);

}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_WORKER_CHECKPOINT_READ_H_
