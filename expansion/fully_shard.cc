#include "expansion/fully_shard.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "analysis/op_rules.h"
#include "expansion/sharding.h"

namespace fxdp {

using ir::Graph;
using ir::Node;
using ir::NodeId;
using ir::PlaceholderRole;
using ir::ValueRef;

namespace {

bool IsRandom(const Node& n) {
  for (absl::string_view w : {"rand", "dropout", "bernoulli", "normal", "uniform", "multinomial"}) {
    if (absl::StrContains(n.target.name, w)) return true;
  }
  return false;
}

absl::string_view PhaseName(ShardPhase p) {
  switch (p) {
    case ShardPhase::kInput: return "input";
    case ShardPhase::kForward: return "forward";
    case ShardPhase::kBackward: return "backward";
    case ShardPhase::kOptimizer: return "optimizer";
  }
  return "?";
}

// Marks `from` and every node it (transitively) reads.
void MarkAncestors(const Graph& g, int32_t from, std::vector<bool>& mark) {
  std::vector<int32_t> stack{from};
  while (!stack.empty()) {
    const int32_t i = stack.back();
    stack.pop_back();
    if (mark[i]) continue;
    mark[i] = true;
    g.nodes()[i].ForEachInput([&](ValueRef r) {
      if (!mark[r.node.value]) stack.push_back(r.node.value);
    });
  }
}

}  // namespace

bool RunsOnShards(const Node& n) {
  const OpRule* r = FindOpRule(n.target);
  return r != nullptr && (r->family == OpFamily::kPointwise || r->family == OpFamily::kLike);
}

absl::StatusOr<FullyShardPlan> PlanFullyShard(const Graph& g, const BatchDimAnalysis& a,
                                              const ExpandOptions& o) {
  (void)a;
  FullyShardPlan p;
  const int32_t world = o.world_size;
  p.world_size = world;
  const int32_t n = g.size();

  // ---- which state is sharded ----------------------------------------------------
  absl::flat_hash_map<std::string, int32_t> params;  // state name -> placeholder
  for (int32_t i = 0; i < n; ++i) {
    const Node& node = g.nodes()[i];
    if (!node.is_placeholder() || node.placeholder.role != PlaceholderRole::kParameter) continue;
    if (node.outputs.size() != 1 || !node.outputs[0].is_tensor()) continue;
    params[node.placeholder.state_name] = i;
  }
  for (int32_t i = 0; i < n; ++i) {
    const Node& node = g.nodes()[i];
    if (!node.is_placeholder() || node.outputs.size() != 1 || !node.outputs[0].is_tensor()) continue;
    const ir::TensorType& t = node.outputs[0].tensor;
    bool shard = node.placeholder.role == PlaceholderRole::kParameter;
    if (node.placeholder.role == PlaceholderRole::kOptimizerState &&
        absl::StartsWith(node.placeholder.state_name, "optim.")) {
      // optim.<param>.<key>: the longest parameter name that fits, same numel.
      const std::string rest = node.placeholder.state_name.substr(6);
      size_t best = 0;
      int32_t owner = -1;
      for (const auto& [name, idx] : params) {
        if (name.size() > best && rest.size() > name.size() + 1 && absl::StartsWith(rest, name) &&
            rest[name.size()] == '.') {
          best = name.size();
          owner = idx;
        }
      }
      shard = owner >= 0 && t.rank() > 0 && g.nodes()[owner].outputs[0].tensor.numel() == t.numel();
    }
    if (!shard) continue;
    ShardedState s;
    s.state_name = node.placeholder.state_name;
    s.role = node.placeholder.role;
    s.shape = t.shape;
    s.dtype = t.dtype;
    s.shard_numel = FlatShardOf(t.numel(), world, 0).shard_numel;
    p.sharded[i] = s;
    p.sharded_state.push_back(std::move(s));
  }

  // ---- phases ----------------------------------------------------------------------
  std::vector<bool> fwd(n, false), grad_anc(n, false);
  int32_t out = -1;
  for (int32_t i = 0; i < n; ++i) {
    if (g.nodes()[i].is_output()) out = i;
    if (!g.nodes()[i].grad_of.empty()) MarkAncestors(g, i, grad_anc);
  }
  if (out >= 0) {
    const Node& on = g.nodes()[out];
    const auto& list = on.args[0].as<ir::Argument::List>();
    for (size_t k = 0; k < list.size() && k < on.output_specs.size(); ++k) {
      const ValueRef* r = list[k].get_if<ValueRef>();
      const ir::OutputRole role = on.output_specs[k].role;
      if (r != nullptr && (role == ir::OutputRole::kLoss || role == ir::OutputRole::kUpdatedBuffer)) {
        MarkAncestors(g, r->node.value, fwd);
      }
    }
  }
  p.phase.assign(n, ShardPhase::kOptimizer);
  for (int32_t i = 0; i < n; ++i) {
    const Node& node = g.nodes()[i];
    if (node.is_placeholder() || node.kind == ir::NodeKind::kGetAttr) {
      p.phase[i] = ShardPhase::kInput;
    } else if (fwd[i]) {
      p.phase[i] = ShardPhase::kForward;
    } else if (grad_anc[i]) {
      p.phase[i] = ShardPhase::kBackward;
    }
  }

  // ---- parameter-derived forward values and who reads which parameter ------------
  p.param_derived.assign(n, false);
  // Per node: the parameters it reads directly or through parameter-derived values.
  std::vector<std::vector<int32_t>> deps(n);
  auto is_param = [&](int32_t i) {
    auto it = p.sharded.find(i);
    return it != p.sharded.end() && it->second.role == PlaceholderRole::kParameter;
  };
  constexpr int32_t kNever = std::numeric_limits<int32_t>::max();
  absl::flat_hash_map<int32_t, int32_t> first_fwd, first_bwd;  // param -> node
  for (int32_t i = 0; i < n; ++i) {
    const Node& node = g.nodes()[i];
    if (!node.is_call() && !node.is_output()) continue;
    std::vector<int32_t> d;
    bool only_params = true, any = false;
    node.ForEachInput([&](ValueRef r) {
      const int32_t s = r.node.value;
      if (!g.type(r).is_tensor()) return;
      any = true;
      if (is_param(s)) {
        d.push_back(s);
      } else if (p.param_derived[s]) {
        d.insert(d.end(), deps[s].begin(), deps[s].end());
      } else {
        only_params = false;
      }
    });
    std::sort(d.begin(), d.end());
    d.erase(std::unique(d.begin(), d.end()), d.end());
    const ShardPhase ph = p.phase[i];
    if (ph == ShardPhase::kForward) {
      node.ForEachInput([&](ValueRef r) {
        if (is_param(r.node.value)) first_fwd.try_emplace(r.node.value, i);
      });
      if (node.is_call() && any && only_params && !IsRandom(node)) p.param_derived[i] = true;
    } else if (ph == ShardPhase::kBackward) {
      for (int32_t q : d) first_bwd.try_emplace(q, i);
    }
    deps[i] = std::move(d);
  }

  // ---- what each phase may read -----------------------------------------------------
  absl::flat_hash_map<int32_t, std::string> grads;  // grad node -> parameter
  for (int32_t i = 0; i < n; ++i) {
    if (!g.nodes()[i].grad_of.empty()) grads[i] = g.nodes()[i].grad_of;
  }
  // Optimizer nodes that run on shards: numel of the full value they stand for.
  std::vector<int64_t> shard_numel(n, -1);
  for (const auto& [i, s] : p.sharded) {
    int64_t numel = 1;
    for (int64_t d : s.shape) numel *= d;
    shard_numel[i] = numel;
  }
  p.on_shards.assign(n, -1);
  for (int32_t i = 0; i < n; ++i) {
    if (p.phase[i] == ShardPhase::kOptimizer) p.on_shards[i] = shard_numel[i];
  }
  for (const auto& [i, param] : grads) shard_numel[i] = g.nodes()[i].outputs[0].is_tensor()
                                                           ? g.nodes()[i].outputs[0].tensor.numel()
                                                           : -1;
  for (int32_t i = 0; i < n; ++i) {
    const Node& node = g.nodes()[i];
    if (node.is_placeholder() || node.kind == ir::NodeKind::kGetAttr) continue;
    const ShardPhase ph = p.phase[i];
    if (node.is_output()) {
      bool bad = false;
      std::string what;
      node.ForEachInput([&](ValueRef r) {
        if (grads.contains(r.node.value) && !bad) {
          bad = true;
          what = g.nodes()[r.node.value].name;
        }
      });
      if (bad) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "node %s: the step returns the gradient %s; FULLY_SHARD keeps only 1/%d shards of "
            "gradients (return a value computed from it in forward/backward, or use REPLICATE)",
            node.name, what, world));
      }
      continue;
    }
    // Forward and backward read whole parameters (gathered) but never sharded
    // optimizer state or a gradient (reduce-scattered: only the optimizer has it).
    std::string problem;
    node.ForEachInput([&](ValueRef r) {
      if (!problem.empty()) return;
      const int32_t s = r.node.value;
      if (ph != ShardPhase::kOptimizer) {
        if (p.sharded.contains(s) && !is_param(s)) {
          problem = absl::StrCat("reads the sharded optimizer state '",
                                 p.sharded.at(s).state_name, "' in ", PhaseName(ph));
        } else if (grads.contains(s) && !grads.contains(i)) {
          problem = absl::StrCat("reads the gradient of '", grads.at(s), "' (", g.nodes()[s].name,
                                 ") in ", PhaseName(ph),
                                 ", but FULLY_SHARD reduce-scatters gradients for the optimizer");
        }
      }
    });
    if (!problem.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat("node %s (%s) %s", node.name,
                                                        node.target.ToString(), problem));
    }
    if (ph != ShardPhase::kOptimizer) continue;
    // Optimizer: elementwise on shards, with 0-d operands.
    int64_t numel = -1;
    std::string full_operand;
    node.ForEachInput([&](ValueRef r) {
      const int32_t s = r.node.value;
      if (shard_numel[s] >= 0 && (p.phase[s] == ShardPhase::kOptimizer || p.sharded.contains(s) ||
                                  grads.contains(s))) {
        numel = shard_numel[s];
      }
    });
    if (numel < 0) continue;  // not on sharded state: runs as it is
    node.ForEachInput([&](ValueRef r) {
      const int32_t s = r.node.value;
      const bool sharded = shard_numel[s] >= 0 && (p.phase[s] == ShardPhase::kOptimizer ||
                                                    p.sharded.contains(s) || grads.contains(s));
      const ir::ValueType& t = g.type(r);
      if (full_operand.empty() && t.is_tensor() && !sharded && t.tensor.rank() > 0) {
        full_operand = g.nodes()[s].name;
      } else if (full_operand.empty() && sharded && shard_numel[s] != numel) {
        full_operand = g.nodes()[s].name;
      }
    });
    const bool outputs_fit = !node.outputs.empty() && node.outputs[0].is_tensor() &&
                             node.outputs[0].tensor.numel() == numel;
    if (!RunsOnShards(node) || !full_operand.empty() || !outputs_fit) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "node %s (%s) runs in the optimizer on sharded state, which FULLY_SHARD holds as flat "
          "1/%d shards: only elementwise ops with 0-d operands run on shards%s",
          node.name, node.target.ToString(), world,
          !full_operand.empty() ? absl::StrCat(" (operand ", full_operand,
                                               " is a whole tensor of another size)")
                                : std::string(!RunsOnShards(node) ? " (this op is not elementwise)"
                                                                  : " (its output has another size)")));
    }
    shard_numel[i] = numel;
  }
  p.on_shards.assign(n, -1);
  for (int32_t i = 0; i < n; ++i) {
    if (p.phase[i] == ShardPhase::kOptimizer) p.on_shards[i] = shard_numel[i];
  }

  // ---- units ------------------------------------------------------------------------
  std::vector<std::pair<int32_t, int32_t>> order;  // (first forward use, param)
  for (const auto& [q, at] : first_fwd) order.emplace_back(at, q);
  std::sort(order.begin(), order.end());
  const int64_t cap = static_cast<int64_t>(o.bucket_cap_mb * 1024 * 1024);
  for (const auto& [at, q] : order) {
    const ShardedState& s = p.sharded.at(q);
    const int64_t bytes = s.shard_numel * world * ir::DTypeItemSize(s.dtype);
    if (p.units.empty() || p.unit_bytes.back() >= cap ||
        p.sharded.at(p.units.back()[0]).dtype != s.dtype) {
      p.units.emplace_back();
      p.unit_bytes.push_back(0);
    }
    p.units.back().push_back(q);
    p.unit_bytes.back() += bytes;
  }
  for (int32_t u = 0; u < static_cast<int32_t>(p.units.size()); ++u) {
    GatherEvent e;
    e.unit = u;
    e.phase = ShardPhase::kForward;
    e.position = kNever;
    for (int32_t q : p.units[u]) e.position = std::min(e.position, first_fwd.at(q));
    e.params = p.units[u];
    p.gathers.push_back(std::move(e));
  }
  std::vector<GatherEvent> back;
  for (int32_t u = 0; u < static_cast<int32_t>(p.units.size()); ++u) {
    GatherEvent e;
    e.unit = u;
    e.phase = ShardPhase::kBackward;
    e.position = kNever;
    for (int32_t q : p.units[u]) {
      if (auto it = first_bwd.find(q); it != first_bwd.end()) {
        e.params.push_back(q);
        e.position = std::min(e.position, it->second);
      }
    }
    if (!e.params.empty()) back.push_back(std::move(e));
  }
  std::stable_sort(back.begin(), back.end(),
                   [](const GatherEvent& x, const GatherEvent& y) { return x.position < y.position; });
  for (GatherEvent& e : back) p.gathers.push_back(std::move(e));
  // Backward may read a parameter forward never did (no gather for it).
  for (const auto& [q, at] : first_bwd) {
    if (!first_fwd.contains(q)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "node %s reads parameter '%s' in backward, but forward never does: FULLY_SHARD gathers "
          "parameters in units of forward",
          g.nodes()[at].name, p.sharded.at(q).state_name));
    }
  }
  return p;
}

}  // namespace fxdp
