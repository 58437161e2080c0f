// The checkpoints the workers write themselves (docs/checkpoints.md,
// worker.proto's CheckpointPolicy): after step K every rank R of N writes
// DIR/step-K/rank-R-of-N.safetensors, all ranks in parallel, and rank 0
// writes DIR/step-K/fxdp-checkpoint.json, this index:
//
//   {"format": "fxdp-checkpoint", "version": 1, "step": K, "world_size": N,
//    "style": "fully_shard", "files": ["rank-0-of-2.safetensors", ...],
//    "tensors": {"fc.weight": {"dtype": "F32", "shape": [64, 32],
//                              "role": "PARAMETER",
//                              "parts": [[0, 0, 1024], [1, 1024, 2048]]}, ...}}
//
// Every state tensor of the job (parameters, buffers, optimizer state,
// hyper-parameters, constants) with its whole dtype and shape, and the parts
// of it each file holds: [file, begin, end) is the flat range [begin, end) of
// the tensor's elements (row-major), held in files[file] under the tensor's
// name, with end - begin elements. A FULLY_SHARD sharded tensor is held by
// every rank as its flat shard's real elements (analysis/ir/flat_shard.h,
// the padding not written); every other tensor whole by one rank, the i-th
// of them in name order by rank i mod N, so that the ranks write about as
// much each. A reader on any world size and style takes any range of a
// tensor from the parts that hold it. A BUFFER that is not in the model's
// state_dict (registered with persistent=False, e.g. a rotary embedding's
// inv_freq) has "persistent": false, when the graph's metadata
// kNonPersistentBuffersKey names it (the tracer records it since issue 27);
// every other entry has no such field: an index of a graph without the key
// says nothing of its buffers. Torch-free: the worker writes and reads it,
// `fxdp export` consolidates it (leaving out the non-persistent buffers).
#ifndef FXDP_ANALYSIS_IR_CHECKPOINT_INDEX_H_
#define FXDP_ANALYSIS_IR_CHECKPOINT_INDEX_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "analysis/ir/types.h"

namespace fxdp::ir {

inline constexpr char kCheckpointIndexName[] = "fxdp-checkpoint.json";
// Graph metadata: the state names of the model's non-persistent buffers, one
// a line (client/python/fxdp/tracer.py; absent when the model has none).
inline constexpr char kNonPersistentBuffersKey[] = "fxdp.non_persistent_buffers";
// The largest index read (100k tensors of a few ranks' parts is ~20 MB).
inline constexpr uint64_t kMaxCheckpointIndexBytes = uint64_t{256} << 20;

// "step-K", "rank-R-of-N.safetensors".
std::string CheckpointStepDir(int64_t step);
std::string CheckpointRankFile(int rank, int world);
// `name` in directory `dir` ("D/name"; "D/" gives no double slash).
std::string JoinCheckpointPath(const std::string& dir, const std::string& name);

struct CheckpointPart {
  int file = 0;
  int64_t begin = 0, end = 0;  // elements of the flattened tensor
};

struct CheckpointTensorEntry {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;         // whole
  std::string role;                   // "PARAMETER", ... (graph.h's PlaceholderRoleName)
  std::vector<CheckpointPart> parts;  // by begin, covering [0, numel) exactly
  bool persistent = true;             // false: a non-persistent BUFFER
  int64_t numel() const;
};

struct CheckpointIndex {
  int64_t step = 0;
  int world_size = 1;
  std::string style;               // "replicate" or "fully_shard"
  std::vector<std::string> files;  // rank r's file name, in the index's directory
  std::map<std::string, CheckpointTensorEntry> tensors;
};

// A state tensor as the ranks hold it, for PlanCheckpoint.
struct CheckpointStateTensor {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;  // whole
  std::string role;
  bool sharded = false;    // FULLY_SHARD: every rank holds its flat shard
  bool persistent = true;  // false: a BUFFER not in the model's state_dict
};

// The index of a checkpoint of `state` written by `world` ranks after
// `step` (the placement above; every rank computes the same).
CheckpointIndex PlanCheckpoint(const std::map<std::string, CheckpointStateTensor>& state, int world,
                               int64_t step, const std::string& style);

std::string CheckpointIndexJson(const CheckpointIndex& index);
// INVALID_ARGUMENT "checkpoint index 'PATH': ..." naming what is wrong: not
// this format or version, a "persistent" that is not a boolean, a file name that is not a plain
// name, a dtype or shape that is not one, parts that overlap, leave a gap, pass the tensor's end or
// name a file it does not list.
absl::StatusOr<CheckpointIndex> ParseCheckpointIndex(absl::string_view json,
                                                     const std::string& path);

}  // namespace fxdp::ir

#endif  // FXDP_ANALYSIS_IR_CHECKPOINT_INDEX_H_
