#include "server/jobs/eval_spec.h"

#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "analysis/ir/declared_tensors.h"
#include "analysis/ir/type_text.h"

namespace fxdp::server {
namespace {

using absl::InvalidArgumentError;

absl::Status CheckPolicy(const v1::JobSpec& spec) {
  const v1::EvalPolicy& e = spec.eval();
  if (!e.has_graph()) return InvalidArgumentError("JobSpec.eval.graph is missing");
  if (e.every() < 0)
    return InvalidArgumentError(absl::StrCat(
        "JobSpec.eval.every must be >= 0 (0: only after the last step), got ", e.every()));
  if (spec.steps() <= 0)
    return InvalidArgumentError(
        "JobSpec.eval needs JobSpec.steps > 0: the ranks evaluate after the last step, which an "
        "open-ended job does not know ahead");
  const int64_t count = (e.every() > 0 ? spec.steps() / e.every() : 0) + 1;
  if (count > kMaxEvaluations)
    return InvalidArgumentError(absl::StrCat("JobSpec.eval.every ", e.every(), " over ",
                                             spec.steps(), " steps gives ", count,
                                             " evaluations, more than ", kMaxEvaluations));
  if (e.data_paths_size() == 0)
    return InvalidArgumentError(
        "JobSpec.eval.data_paths is empty: name the evaluation batches on the workers (a dataset "
        "directory or safetensors files, docs/datasets.md)");
  if (e.data_paths_size() > kMaxDataPaths)
    return InvalidArgumentError(absl::StrCat("JobSpec.eval.data_paths has ", e.data_paths_size(),
                                             " entries, more than ", kMaxDataPaths));
  for (int i = 0; i < e.data_paths_size(); ++i) {
    const size_t n = e.data_paths(i).size();
    if (n == 0 || n > kMaxDataPathBytes)
      return InvalidArgumentError(absl::StrCat("JobSpec.eval.data_paths[", i, "] is ", n,
                                               " bytes; a path has 1 to ", kMaxDataPathBytes));
  }
  return absl::OkStatus();
}

// An evaluation graph changes nothing and reads only the training state.
absl::Status CheckGraph(const v1::GraphDef& eval, const v1::GraphDef& train) {
  for (const v1::Node& n : eval.nodes()) {
    for (const v1::OutputSpec& s : n.output_specs()) {
      if (s.role() == v1::UPDATED_PARAMETER || s.role() == v1::UPDATED_BUFFER ||
          s.role() == v1::UPDATED_OPTIMIZER_STATE)
        return InvalidArgumentError(absl::StrCat(
            "JobSpec.eval.graph updates state '", s.state_name(),
            "': an evaluation graph (fxdp.trace_eval) leaves the training state as it is"));
    }
  }
  for (const v1::Node& n : eval.nodes()) {
    if (n.kind() == v1::PLACEHOLDER && n.placeholder().role() == v1::HYPERPARAMETER)
      return InvalidArgumentError(
          absl::StrCat("JobSpec.eval.graph has hyper-parameter '", n.placeholder().state_name(),
                       "': an evaluation graph has none (fxdp.trace_eval)"));
  }
  using ir::DeclaredTensors;
  const DeclaredTensors state = DeclaredTensors::Of(train, DeclaredTensors::Kind::kState);
  const DeclaredTensors read = DeclaredTensors::Of(eval, DeclaredTensors::Kind::kState);
  for (const std::string& name : read.names()) {
    const DeclaredTensors::Tensor* e = read.Find(name);
    const DeclaredTensors::Tensor* t = state.Find(name);
    if (t == nullptr)
      return InvalidArgumentError(
          absl::StrCat("JobSpec.eval.graph reads state '", name, "' (placeholder '", e->node,
                       "'), which the training graph does not hold (its ", state.size(),
                       " state tensors: ", state.Names(), ")"));
    if (e->dtype != t->dtype || e->shape != t->shape)
      return InvalidArgumentError(absl::StrCat(
          "JobSpec.eval.graph's state '", name, "' is ", ir::TypeText(e->dtype, e->shape),
          ", the training graph's is ", ir::TypeText(t->dtype, t->shape)));
  }
  return absl::OkStatus();
}

// FULLY_SHARD: a state tensor both graphs read has one layout on a rank.
absl::Status CheckSharding(const v1::GraphDef& eval, const v1::ExpandResponse& train,
                           const v1::ExpandResponse& evaluated) {
  std::map<std::string, const v1::ShardedState*> by_train, by_eval;
  for (const v1::ShardedState& s : train.sharded_state()) by_train[s.state_name()] = &s;
  for (const v1::ShardedState& s : evaluated.sharded_state()) by_eval[s.state_name()] = &s;
  for (const v1::Node& n : eval.nodes()) {
    if (n.kind() != v1::PLACEHOLDER || n.placeholder().role() == v1::INPUT) continue;
    const std::string& name = n.placeholder().state_name();
    auto t = by_train.find(name);
    auto e = by_eval.find(name);
    const bool tr = t != by_train.end(), ev = e != by_eval.end();
    if (tr == ev && (!tr || t->second->shard_numel() == e->second->shard_numel())) continue;
    return InvalidArgumentError(absl::StrCat(
        "JobSpec.eval.graph: state '", name, "' is ",
        ev ? absl::StrCat("sharded (", e->second->shard_numel(), " elements a rank)") : "whole",
        " in the expanded evaluation graph and ",
        tr ? absl::StrCat("sharded (", t->second->shard_numel(), " elements a rank)") : "whole",
        " in the training graph's: a rank holds one of them (fully_shard shards what a step "
        "updates)"));
  }
  return absl::OkStatus();
}

}  // namespace

bool EvalDue(const v1::EvalPolicy& eval, int64_t first_step, int64_t run_step, int64_t steps) {
  if (run_step == steps) return true;
  return eval.every() > 0 && (first_step + run_step) % eval.every() == 0;
}

absl::StatusOr<v1::ExpandResponse> PrepareEval(const v1::JobSpec& spec,
                                               const v1::GraphDef& train_graph,
                                               const v1::ExpandResponse& train_expanded,
                                               const Expander& expand) {
  if (absl::Status s = CheckPolicy(spec); !s.ok()) return s;
  if (absl::Status s = CheckGraph(spec.eval().graph(), train_graph); !s.ok()) return s;
  v1::ExpandRequest xr;
  *xr.mutable_graph() = spec.eval().graph();
  xr.set_world_size(spec.world_size());
  xr.set_sync_batchnorm(spec.sync_batchnorm());
  xr.set_style(spec.style());
  absl::StatusOr<v1::ExpandResponse> expanded = expand(xr);
  if (!expanded.ok())
    return absl::Status(expanded.status().code(),
                        absl::StrCat("expanding JobSpec.eval.graph for ", spec.world_size(),
                                     " ranks: ", expanded.status().message()));
  if (expanded->graphs_size() == 0)
    return absl::InternalError("the expansion returned no evaluation graph");
  if (absl::Status s = CheckSharding(spec.eval().graph(), train_expanded, *expanded); !s.ok())
    return s;
  return expanded;
}

}  // namespace fxdp::server
