#include "executor/worker/sharded_state.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "executor/torch_types.h"
#include "expansion/sharding.h"
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

absl::Status ShardState(std::map<std::string, at::Tensor>& state,
                        const std::vector<std::string>& names, int world, int rank,
                        std::map<std::string, std::vector<int64_t>>* full_shapes) {
  c10::InferenceMode guard;
  for (const std::string& name : names) {
    auto it = state.find(name);
    if (it == state.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the state has no tensor '", name, "', which the graph holds sharded (FULLY_SHARD)"));
    }
    const at::Tensor& full = it->second;
    const FlatShard f = FlatShardOf(full.numel(), world, rank);
    try {
      at::Tensor shard = at::zeros({f.shard_numel}, full.options());
      if (f.real() > 0) shard.narrow(0, 0, f.real()).copy_(full.reshape({-1}).narrow(0, f.begin, f.real()));
      (*full_shapes)[name] = full.sizes().vec();
      it->second = std::move(shard);
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("slicing rank ", rank, "'s shard of '", name,
                                              "': ", ExceptionMessage(e)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, at::Tensor>> UnshardState(
    const std::map<std::string, at::Tensor>& state,
    const std::map<std::string, std::vector<int64_t>>& full_shapes, Communicator& comm,
    std::chrono::milliseconds timeout) {
  std::map<std::string, at::Tensor> out = state;
  for (const auto& [name, shape] : full_shapes) {
    auto it = out.find(name);
    if (it == out.end()) {
      return absl::InternalError(absl::StrCat("the final state lost the sharded tensor '", name, "'"));
    }
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    FXDP_ASSIGN_OR_RETURN(std::unique_ptr<Work> w, comm.AllGather(it->second));
    absl::StatusOr<at::Tensor> gathered = w->Wait(timeout);
    if (!gathered.ok()) {
      return absl::Status(gathered.status().code(),
                          absl::StrCat("gathering '", name, "' for --out: ", gathered.status().message()));
    }
    try {
      c10::InferenceMode guard;
      it->second = gathered->narrow(0, 0, numel).reshape(shape).clone();
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("reassembling '", name, "' (", absl::StrJoin(shape, "x"),
                                              "): ", ExceptionMessage(e)));
    }
  }
  return out;
}

}  // namespace fxdp::executor
