#include "executor/worker/sharded_state.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "analysis/ir/flat_shard.h"
#include "executor/torch_types.h"
#include "util/status_macros.h"

namespace fxdp::executor {

std::vector<std::string> ShardedStateNames(const ir::Graph& g) {
  bool fully_shard = false;
  std::vector<std::string> names;
  for (const auto& [k, v] : g.header().metadata) {
    if (k == "fxdp.style") fully_shard = v == "fully_shard";
    if (k == "fxdp.sharded_state" && !v.empty()) names = absl::StrSplit(v, '\n');
  }
  if (!fully_shard) names.clear();
  return names;
}

namespace {

absl::Status MissingShardedTensor(const std::string& name) {
  return absl::InvalidArgumentError(absl::StrCat("the state has no tensor '", name,
                                                 "', which the graph holds sharded (FULLY_SHARD)"));
}

}  // namespace

absl::StatusOr<SafetensorsFile> ReadRankState(
    const std::string& path, const std::vector<std::string>& names, int world, int rank,
    std::map<std::string, std::vector<int64_t>>* full_shapes) {
  FlatShardRead shards;
  shards.names = std::set<std::string>(names.begin(), names.end());
  shards.world = world;
  shards.rank = rank;
  FXDP_ASSIGN_OR_RETURN(SafetensorsFile f, ReadSafetensors(path, {}, &shards));
  for (const std::string& name : names)
    if (f.tensors.count(name) == 0) return MissingShardedTensor(name);
  *full_shapes = std::move(shards.full_shapes);
  return f;
}

absl::StatusOr<std::map<std::string, at::Tensor>> UnshardState(
    const std::map<std::string, at::Tensor>& state,
    const std::map<std::string, std::vector<int64_t>>& full_shapes, Communicator& comm,
    std::chrono::milliseconds timeout) {
  std::map<std::string, at::Tensor> out = state;
  for (const auto& [name, shape] : full_shapes) {
    auto it = out.find(name);
    if (it == out.end()) {
      return absl::InternalError(
          absl::StrCat("the final state lost the sharded tensor '", name, "'"));
    }
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    FXDP_ASSIGN_OR_RETURN(std::unique_ptr<Work> w, comm.AllGather(it->second));
    absl::StatusOr<at::Tensor> gathered = w->Wait(timeout);
    if (!gathered.ok()) {
      return absl::Status(
          gathered.status().code(),
          absl::StrCat("gathering '", name, "' for --out: ", gathered.status().message()));
    }
    try {
      c10::InferenceMode guard;
      it->second = gathered->narrow(0, 0, numel).reshape(shape).clone();
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat(
          "reassembling '", name, "' (", absl::StrJoin(shape, "x"), "): ", ExceptionMessage(e)));
    }
  }
  return out;
}

}  // namespace fxdp::executor
