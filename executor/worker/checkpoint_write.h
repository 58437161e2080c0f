// A rank's part of a checkpoint the workers write themselves
// (AssignJob.checkpoints, worker.proto's CheckpointPolicy; the layout is
// analysis/ir/checkpoint_index.h): DIR/step-K/rank-R-of-N.safetensors with
// what the rank holds of the checkpoint (FULLY_SHARD: the real elements of
// its flat shards; every other tensor whole on one rank, spread over the
// ranks), and on rank 0 DIR/step-K/fxdp-checkpoint.json. Files are created
// beneath the worker's data roots (util::DataRoots::CreateFile: no link
// followed, nothing written over, each appearing only when complete), each
// bounded by the bytes it is to hold.
#ifndef FXDP_EXECUTOR_WORKER_CHECKPOINT_WRITE_H_
#define FXDP_EXECUTOR_WORKER_CHECKPOINT_WRITE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "executor/interpreter.h"
#include "executor/worker/checkpoint_read.h"
#include "proto/fxdp/v1/worker.pb.h"

namespace fxdp::executor {

// Whether `policy` wants a checkpoint after job step `step` (every `every`
// steps, and after the last one when `last`).
bool CheckpointDue(const v1::CheckpointPolicy& policy, int64_t step, bool last);

struct WrittenPart {
  std::string dir;     // DIR/step-K
  uint64_t bytes = 0;  // this rank's, index included
  // Rank 0: the index, written but not committed: it appears (Commit) only
  // once every rank wrote its part, so that an index always lists a
  // checkpoint whose files are all there.
  std::optional<util::NewFile> index;
};

// The state names of the model's non-persistent buffers, as the graph's
// metadata ir::kNonPersistentBuffersKey lists them (empty without the key).
std::set<std::string> NonPersistentBuffers(const ir::Graph& graph);

// This rank's part of the checkpoint after job step `step` (its file, and
// on rank 0 the index, uncommitted): `state` is what
// the rank holds (its flat shards as [shard_numel]), `roles` each state
// name's placeholder role ("PARAMETER", ...), `non_persistent` the buffers
// the index marks "persistent": false. Errors name the file: the
// errors of DataRoots::CreateFile (PERMISSION_DENIED outside the roots or
// through a link, ALREADY_EXISTS for a file there already, INVALID_ARGUMENT
// for '.' or '..'), a full disk RESOURCE_EXHAUSTED.
absl::StatusOr<WrittenPart> WriteCheckpointPart(const v1::CheckpointPolicy& policy, int64_t step,
                                                const RankStateLayout& layout,
                                                const TensorMap& state,
                                                const std::map<std::string, std::string>& roles,
                                                const std::set<std::string>& non_persistent);

// Deletes this rank's files of the checkpoint after `step` (rank 0 its index
// first), then (`directory`) the step's directory once it is empty. Files
// already gone are not an error.
absl::Status RemoveCheckpointPart(const v1::CheckpointPolicy& policy, int64_t step,
                                  const RankStateLayout& layout, bool directory = true);

}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_WORKER_CHECKPOINT_WRITE_H_
