// FULLY_SHARD state on a worker (expansion/fully_shard.h): a rank graph says
// which state it holds as flat shards (metadata "fxdp.style" = "fully_shard",
// "fxdp.sharded_state" = the names, one per line). `fxdp-worker run` reads
// only this rank's slice of each sharded tensor from the state file
// (analysis/ir/flat_shard.h FlatShardOf: real elements, then zero padding) and, for
// --out, all-gathers the shards back into whole tensors, so users never
// handle shards.
#ifndef FXDP_EXECUTOR_WORKER_SHARDED_STATE_H_
#define FXDP_EXECUTOR_WORKER_SHARDED_STATE_H_

#include <ATen/Tensor.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "analysis/ir/graph.h"
#include "executor/communicator.h"
#include "executor/safetensors.h"

namespace fxdp::executor {

// The state names `g` holds as flat shards (empty for REPLICATE graphs).
std::vector<std::string> ShardedStateNames(const ir::Graph& g);

// The state file `path` as rank `rank` of `world` holds it: each tensor named
// in `names` read as its flat shard (only those bytes are read), the rest
// whole; `full_shapes` gets the sharded tensors' whole shapes.
// INVALID_ARGUMENT naming a tensor in `names` the file lacks.
absl::StatusOr<SafetensorsFile> ReadRankState(
    const std::string& path, const std::vector<std::string>& names, int world, int rank,
    std::map<std::string, std::vector<int64_t>>* full_shapes);

// The whole state: every tensor in `full_shapes` all-gathered from the ranks'
// shards (every rank calls this, with the same names), padding dropped.
absl::StatusOr<std::map<std::string, at::Tensor>> UnshardState(
    const std::map<std::string, at::Tensor>& state,
    const std::map<std::string, std::vector<int64_t>>& full_shapes, Communicator& comm,
    std::chrono::milliseconds timeout);

}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_WORKER_SHARDED_STATE_H_
