#include "expansion/fully_shard.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "analysis/dim_spec.h"
#include "analysis/ir/flat_shard.h"
#include "analysis/ir/node_error.h"
#include "analysis/op_rules.h"
#include "analysis/view_rules.h"
#include "util/status_macros.h"

namespace fxdp {

using ir::Graph;
using ir::Node;
using ir::NodeId;
using ir::PlaceholderRole;
using ir::ValueRef;

namespace {

// Whether backward may recompute `n` from its own gather: a getitem, a view
// (view_rules.h) or an op whose rule draws no random numbers (op_rules.h's
// kRandom). An op without a rule is not recomputed: it might be random.
bool Recomputable(const Node& n) {
  if (n.is_getitem() || IsViewOp(n.target)) return true;
  const OpRule* r = FindOpRule(n.target);
  return r != nullptr && !r->has(kRandom);
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

// The whole tensor's numel when `r` is a shard in the optimizer, else -1.
int64_t FullNumel(const absl::flat_hash_map<ValueRef, int64_t>& full_numel, ValueRef r) {
  auto it = full_numel.find(r);
  return it == full_numel.end() ? -1 : it->second;
}

absl::Status Refuse(const Node& node, int32_t world, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s runs in the optimizer on sharded state, which FULLY_SHARD holds as flat "
      "1/%d shards: only elementwise ops with 0-d operands (and 2-norms, all-reduced) run on "
      "shards (%s)",
      ir::NodeLabel(node), world, why));
}

bool IsTwo(const ir::Argument* a) {
  if (a == nullptr) return true;  // ord defaults to 2
  if (const double* d = a->get_if<double>()) return *d == 2.0;
  if (const int64_t* i = a->get_if<int64_t>()) return *i == 2;
  return false;
}

// One optimizer node on sharded state (PlanOptimizerNode): how it runs on
// the shards, recorded in `p`, or INVALID_ARGUMENT naming it.
struct ShardedOp {
  const Graph& g;
  int32_t i;
  const Node& node;
  int32_t world;
  absl::flat_hash_map<ValueRef, int64_t>& full_numel;
  FullyShardPlan& p;

  bool ZeroD(ValueRef r) const { return g.type(r).is_tensor() && g.type(r).tensor.rank() == 0; }

  // A view of shard `in` (a reshape, or a permutation of the whole tensor's
  // dims): the same [s] data, an alias, with the permutation it stands for.
  absl::Status PlanView(ValueRef in, bool reshape) {
    const int32_t rank = g.type(in).tensor.rank();
    std::vector<int32_t> perm = p.perm.contains(in) ? p.perm.at(in) : std::vector<int32_t>{};
    if (perm.empty()) {
      perm.resize(rank);
      for (int32_t d = 0; d < rank; ++d) perm[d] = d;
    }
    bool identity = true;
    for (int32_t d = 0; d < static_cast<int32_t>(perm.size()); ++d)
      identity = identity && perm[d] == d;
    std::vector<int32_t> out;
    if (reshape) {
      if (!identity) return Refuse(node, world, "a reshape of a transposed view of a shard");
    } else if (rank > 0) {
      // New dim d reads old dim order[d]: the view's dim map.
      absl::StatusOr<DimMap> map =
          ComputeViewDimMap(node.target, g.type(in).tensor.shape, node.args, node.kwargs);
      if (!map.ok()) return Refuse(node, world, map.status().message());
      for (const DimSpec& d : *map) {
        if (!d.is(DimSpec::Kind::kInputDim) || d.input_dim() >= rank) {
          return Refuse(node, world, "a view that is not a permutation of a shard's dims");
        }
        out.push_back(perm[d.input_dim()]);
      }
      bool id = true;
      for (int32_t d = 0; d < static_cast<int32_t>(out.size()); ++d) id = id && out[d] == d;
      if (id) out.clear();
    }
    const ValueRef o{NodeId{i}, 0};
    full_numel[o] = FullNumel(full_numel, in);
    if (!out.empty()) p.perm[o] = out;
    p.alias[i] = true;
    p.out_shards[i] = {full_numel[o]};
    return absl::OkStatus();
  }

  // A 2-norm over whole tensors: the shards' norms, squared, all-reduced,
  // square-rooted (the padding adds zeros). Over dims it is refused.
  absl::Status PlanNorm(const OpRule& rule, const OpParam& ord_param) {
    const auto arg = [&](const OpParam* q) -> const ir::Argument* {
      if (q == nullptr) return nullptr;
      return q->index >= 0 && q->index < static_cast<int>(node.args.size()) ? &node.args[q->index]
                                                                            : node.kwarg(q->name);
    };
    const ir::Argument* ord = arg(&ord_param);
    const ir::Argument* dim = arg(rule.param(ParamRole::kDims));
    if (!IsTwo(ord) || (dim != nullptr && !dim->is_none())) {
      return Refuse(node, world, "a norm other than the 2-norm of whole tensors");
    }
    bool all = true;
    node.args[0].ForEachRef([&](ValueRef r) { all = all && FullNumel(full_numel, r) >= 0; });
    if (!all) return Refuse(node, world, "a norm over shards and whole tensors together");
    p.partial_norm[i] = true;
    return absl::OkStatus();
  }

  // Elementwise across lists: position k of every list is a shard of the
  // same tensor (or 0-d); a lone tensor operand must be 0-d.
  absl::Status PlanForeach() {
    std::vector<int64_t> numel;
    for (const ir::Argument& a : node.args) {
      if (!a.is_list() || !a.HasRef()) continue;
      const auto& l = a.as<ir::Argument::List>();
      if (numel.empty()) numel.assign(l.size(), -2);
      if (l.size() != numel.size()) return Refuse(node, world, "lists of different lengths");
      for (size_t k = 0; k < l.size(); ++k) {
        const ValueRef* r = l[k].get_if<ValueRef>();
        if (r == nullptr) continue;
        const int64_t f = FullNumel(full_numel, *r);
        if (f < 0 && ZeroD(*r)) continue;
        if (numel[k] == -2) numel[k] = f;
        if (f != numel[k]) {
          return Refuse(node, world,
                        absl::StrCat("list position ", k, " mixes a shard with ",
                                     g.node(r->node).name, ", a whole tensor"));
        }
      }
    }
    for (const ir::Argument& a : node.args) {
      if (const ValueRef* r = a.get_if<ValueRef>(); r != nullptr && !ZeroD(*r)) {
        return Refuse(node, world, absl::StrCat("operand ", g.node(r->node).name, " is not 0-d"));
      }
    }
    if (node.outputs.size() != numel.size())
      return Refuse(node, world, "outputs do not match the lists");
    for (size_t k = 0; k < numel.size(); ++k) {
      if (numel[k] == -2) numel[k] = -1;
      full_numel[ValueRef{NodeId{i}, static_cast<int32_t>(k)}] = numel[k];
    }
    p.out_shards[i] = std::move(numel);
    return absl::OkStatus();
  }

  // One elementwise op: its shards all stand for tensors of one size, its
  // other tensor operands are 0-d, and so is its output's size.
  absl::Status PlanElementwise() {
    int64_t numel = -1;
    std::string problem;
    node.ForEachInput([&](ValueRef r) {
      const int64_t f = FullNumel(full_numel, r);
      if (!problem.empty()) return;
      if (f >= 0) {
        if (numel >= 0 && f != numel)
          problem = absl::StrCat("shards of tensors of different sizes");
        numel = f;
      } else if (g.type(r).is_tensor() && !ZeroD(r)) {
        problem =
            absl::StrCat("operand ", g.node(r.node).name, " is a whole tensor of another size");
      }
    });
    if (!problem.empty()) return Refuse(node, world, problem);
    if (!RunsOnShards(node)) return Refuse(node, world, "this op is not elementwise");
    if (node.outputs.size() != 1 || !node.outputs[0].is_tensor() ||
        node.outputs[0].tensor.numel() != numel) {
      return Refuse(node, world, "its output has another size");
    }
    p.out_shards[i] = {numel};
    full_numel[ValueRef{NodeId{i}, 0}] = numel;
    return absl::OkStatus();
  }
};

// Optimizer node `i`: which of its outputs are shards (FullyShardPlan::out_shards),
// or a 2-norm of shards (partial_norm), or INVALID_ARGUMENT naming it.
absl::Status PlanOptimizerNode(const Graph& g, int32_t i, int32_t world,
                               absl::flat_hash_map<ValueRef, int64_t>& full_numel,
                               FullyShardPlan& p) {
  const Node& node = g.nodes()[i];
  bool any = false;
  node.ForEachInput([&](ValueRef r) { any |= FullNumel(full_numel, r) >= 0; });
  if (!any) return absl::OkStatus();  // not on sharded state: runs as it is
  ShardedOp op{g, i, node, world, full_numel, p};
  const OpRule* rule = FindOpRule(node.target);
  // Views of a shard (functionalised .grad updates go through t(t(g)),
  // view(view(g))): the same [s] data, with the permutation of the whole
  // tensor's dims the view stands for (view_rules.h's ShardView, op_rules.h's
  // kSelfAlias). Only identity-ordered shards feed math.
  const std::optional<ViewOpFacts> view = FindViewOpFacts(node.target);
  const ShardView sv = view.has_value()                           ? view->shard_view
                       : rule != nullptr && rule->has(kSelfAlias) ? ShardView::kFlat
                                                                  : ShardView::kNo;
  const bool reshape = sv == ShardView::kFlat;
  const bool transpose = sv == ShardView::kPermuted;
  if ((reshape || transpose) && !node.args.empty() && node.args[0].is_ref() &&
      FullNumel(full_numel, node.args[0].as<ValueRef>()) >= 0) {
    return op.PlanView(node.args[0].as<ValueRef>(), reshape);
  }
  std::string transposed;
  node.ForEachInput([&](ValueRef r) {
    if (transposed.empty() && p.perm.contains(r)) transposed = g.node(r.node).name;
  });
  if (!transposed.empty()) {
    return Refuse(node, world,
                  absl::StrCat("operand ", transposed, " is a transposed view of a shard"));
  }
  if (node.is_getitem()) {
    const ValueRef src = node.args[0].as<ValueRef>();
    p.out_shards[i] = {FullNumel(full_numel, src)};
    full_numel[ValueRef{NodeId{i}, 0}] = p.out_shards[i][0];
    return absl::OkStatus();
  }
  if (const OpParam* ord = rule != nullptr ? rule->param(ParamRole::kOrd) : nullptr) {
    return op.PlanNorm(*rule, *ord);
  }
  if (rule != nullptr && rule->family == OpFamily::kForeach) return op.PlanForeach();
  return op.PlanElementwise();
}

}  // namespace

bool RunsOnShards(const Node& n) {
  const OpRule* r = FindOpRule(n.target);
  return r != nullptr && (r->family == OpFamily::kPointwise || r->family == OpFamily::kLike);
}

namespace {

bool IsShardedParam(const FullyShardPlan& p, int32_t i) {
  auto it = p.sharded.find(i);
  return it != p.sharded.end() && it->second.role == PlaceholderRole::kParameter;
}

// Which state is sharded (p.sharded, p.sharded_state): every parameter, and
// the optimizer state "optim.<param>.<key>" of a parameter of its numel.
void PickShardedState(const Graph& g, FullyShardPlan& p) {
  const int32_t n = g.size();
  const int32_t world = p.world_size;
  absl::flat_hash_map<std::string, int32_t> params;  // state name -> placeholder
  for (int32_t i = 0; i < n; ++i) {
    const Node& node = g.nodes()[i];
    if (!node.is_placeholder() || node.placeholder.role != PlaceholderRole::kParameter) continue;
    if (node.outputs.size() != 1 || !node.outputs[0].is_tensor()) continue;
    params[node.placeholder.state_name] = i;
  }
  for (int32_t i = 0; i < n; ++i) {
    const Node& node = g.nodes()[i];
    if (!node.is_placeholder() || node.outputs.size() != 1 || !node.outputs[0].is_tensor())
      continue;
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
    s.shard_numel = ir::FlatShardOf(t.numel(), world, 0).shard_numel;
    p.sharded[i] = s;
    p.sharded_state.push_back(std::move(s));
  }
}

// p.phase: input, forward (what the loss and updated buffers need), backward
// (what the gradients need), the rest optimizer.
void MarkPhases(const Graph& g, FullyShardPlan& p) {
  const int32_t n = g.size();
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
      if (r != nullptr &&
          (role == ir::OutputRole::kLoss || role == ir::OutputRole::kUpdatedBuffer)) {
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
}

// The first node of forward and of backward that reads each sharded
// parameter (param -> node): forward reads it directly, backward also through
// parameter-derived forward values (p.param_derived), which it recomputes.
struct ParamReads {
  absl::flat_hash_map<int32_t, int32_t> first_fwd, first_bwd;
};

ParamReads TraceParameterReads(const Graph& g, FullyShardPlan& p) {
  const int32_t n = g.size();
  p.param_derived.assign(n, false);
  // Per node: the parameters it reads directly or through parameter-derived values.
  std::vector<std::vector<int32_t>> deps(n);
  ParamReads reads;
  for (int32_t i = 0; i < n; ++i) {
    const Node& node = g.nodes()[i];
    if (!node.is_call() && !node.is_output()) continue;
    std::vector<int32_t> d;
    bool only_params = true, any = false;
    node.ForEachInput([&](ValueRef r) {
      const int32_t s = r.node.value;
      if (!g.type(r).is_tensor()) return;
      any = true;
      if (IsShardedParam(p, s)) {
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
        if (IsShardedParam(p, r.node.value)) reads.first_fwd.try_emplace(r.node.value, i);
      });
      if (node.is_call() && any && only_params && Recomputable(node)) p.param_derived[i] = true;
    } else if (ph == ShardPhase::kBackward) {
      for (int32_t q : d) reads.first_bwd.try_emplace(q, i);
    }
    deps[i] = std::move(d);
  }
  return reads;
}

using Gradients = absl::flat_hash_map<int32_t, std::string>;  // grad node -> parameter

// The output node hands out neither a gradient nor a transposed view of a
// shard: FULLY_SHARD has neither whole.
absl::Status CheckStepOutputs(const Graph& g, const Node& node, const Gradients& grads,
                              const FullyShardPlan& p) {
  bool bad = false;
  std::string what;
  node.ForEachInput([&](ValueRef r) {
    if (grads.contains(r.node.value) && !bad) {
      bad = true;
      what = g.nodes()[r.node.value].name;
    }
  });
  node.ForEachInput([&](ValueRef r) {
    if (p.perm.contains(r) && !bad) {
      bad = true;
      what = g.nodes()[r.node.value].name;
    }
  });
  if (bad && !grads.contains(g.FindNode(what)->value)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: the step returns %s, a transposed view of a shard, which FULLY_SHARD "
                        "cannot hand out whole",
                        ir::NodeLabel(node), what));
  }
  if (bad) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: the step returns the gradient %s; FULLY_SHARD keeps only 1/%d shards of "
        "gradients (return a value computed from it in forward/backward, or use REPLICATE)",
        ir::NodeLabel(node), what, p.world_size));
  }
  return absl::OkStatus();
}

// Forward or backward node `i` reads whole parameters (gathered) but never
// sharded optimizer state or a gradient (reduce-scattered: only the optimizer
// has it).
absl::Status CheckPhaseReads(const Graph& g, int32_t i, const Gradients& grads,
                             const FullyShardPlan& p) {
  const Node& node = g.nodes()[i];
  const ShardPhase ph = p.phase[i];
  std::string problem;
  node.ForEachInput([&](ValueRef r) {
    if (!problem.empty()) return;
    const int32_t s = r.node.value;
    if (ph != ShardPhase::kOptimizer) {
      if (p.sharded.contains(s) && !IsShardedParam(p, s)) {
        problem = absl::StrCat("reads the sharded optimizer state '", p.sharded.at(s).state_name,
                               "' in ", PhaseName(ph));
      } else if (grads.contains(s) && !grads.contains(i)) {
        problem = absl::StrCat("reads the gradient of '", grads.at(s), "' (", g.nodes()[s].name,
                               ") in ", PhaseName(ph),
                               ", but FULLY_SHARD reduce-scatters gradients for the optimizer");
      }
    }
  });
  if (!problem.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat("%s %s", ir::NodeLabel(node), problem));
  }
  return absl::OkStatus();
}

// What each phase may read, and how the optimizer runs on shards
// (PlanOptimizerNode: p.out_shards, p.partial_norm, p.alias, p.perm).
absl::Status PlanReads(const Graph& g, FullyShardPlan& p) {
  const int32_t n = g.size();
  Gradients grads;
  for (int32_t i = 0; i < n; ++i) {
    if (!g.nodes()[i].grad_of.empty()) grads[i] = g.nodes()[i].grad_of;
  }
  // Values the optimizer has as shards: the numel of the whole tensor each stands for.
  absl::flat_hash_map<ValueRef, int64_t> full_numel;
  for (const auto& [i, s] : p.sharded) {
    int64_t numel = 1;
    for (int64_t d : s.shape) numel *= d;
    full_numel[ValueRef{NodeId{i}, 0}] = numel;
  }
  for (const auto& [i, param] : grads) {
    if (g.nodes()[i].outputs[0].is_tensor())
      full_numel[ValueRef{NodeId{i}, 0}] = g.nodes()[i].outputs[0].tensor.numel();
  }
  p.out_shards.assign(n, {});
  p.partial_norm.assign(n, false);
  p.alias.assign(n, false);
  for (int32_t i = 0; i < n; ++i) {
    const Node& node = g.nodes()[i];
    if (node.is_placeholder() || node.kind == ir::NodeKind::kGetAttr) continue;
    const ShardPhase ph = p.phase[i];
    if (node.is_output()) {
      FXDP_RETURN_IF_ERROR(CheckStepOutputs(g, node, grads, p));
      continue;
    }
    if (ph != ShardPhase::kOptimizer) {
      FXDP_RETURN_IF_ERROR(CheckPhaseReads(g, i, grads, p));
      continue;
    }
    FXDP_RETURN_IF_ERROR(PlanOptimizerNode(g, i, p.world_size, full_numel, p));
  }
  return absl::OkStatus();
}

// The gather units: parameters in the order forward first reads them, a new
// unit when the last one holds `bucket_cap_mb` or the dtype changes.
void FormUnits(const ParamReads& reads, double bucket_cap_mb, FullyShardPlan& p) {
  std::vector<std::pair<int32_t, int32_t>> order;  // (first forward use, param)
  for (const auto& [q, at] : reads.first_fwd) order.emplace_back(at, q);
  std::sort(order.begin(), order.end());
  const int64_t cap = static_cast<int64_t>(bucket_cap_mb * 1024 * 1024);
  for (const auto& [at, q] : order) {
    const ShardedState& s = p.sharded.at(q);
    const int64_t bytes = s.shard_numel * p.world_size * ir::DTypeItemSize(s.dtype);
    if (p.units.empty() || p.unit_bytes.back() >= cap ||
        p.sharded.at(p.units.back()[0]).dtype != s.dtype) {
      p.units.emplace_back();
      p.unit_bytes.push_back(0);
    }
    p.units.back().push_back(q);
    p.unit_bytes.back() += bytes;
  }
}

// Each unit's forward gather, then its backward ones (only the parameters
// backward reads) in the order backward first reads them; INVALID_ARGUMENT
// for a parameter backward reads and forward never does.
absl::Status PlanGathers(const Graph& g, const ParamReads& reads, FullyShardPlan& p) {
  constexpr int32_t kNever = std::numeric_limits<int32_t>::max();
  for (int32_t u = 0; u < static_cast<int32_t>(p.units.size()); ++u) {
    GatherEvent e;
    e.unit = u;
    e.phase = ShardPhase::kForward;
    e.position = kNever;
    for (int32_t q : p.units[u]) e.position = std::min(e.position, reads.first_fwd.at(q));
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
      if (auto it = reads.first_bwd.find(q); it != reads.first_bwd.end()) {
        e.params.push_back(q);
        e.position = std::min(e.position, it->second);
      }
    }
    if (!e.params.empty()) back.push_back(std::move(e));
  }
  std::stable_sort(back.begin(), back.end(), [](const GatherEvent& x, const GatherEvent& y) {
    return x.position < y.position;
  });
  for (GatherEvent& e : back) p.gathers.push_back(std::move(e));
  // Backward may read a parameter forward never did (no gather for it).
  for (const auto& [q, at] : reads.first_bwd) {
    if (!reads.first_fwd.contains(q)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s reads parameter '%s' in backward, but forward never does: FULLY_SHARD gathers "
          "parameters in units of forward",
          ir::NodeLabel(g.nodes()[at]), p.sharded.at(q).state_name));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<FullyShardPlan> PlanFullyShard(const Graph& g, const BatchDimAnalysis& a,
                                              const ExpandOptions& o) {
  (void)a;
  FullyShardPlan p;
  p.world_size = o.world_size;
  PickShardedState(g, p);
  MarkPhases(g, p);
  const ParamReads reads = TraceParameterReads(g, p);
  FXDP_RETURN_IF_ERROR(PlanReads(g, p));
  FormUnits(reads, o.bucket_cap_mb, p);
  FXDP_RETURN_IF_ERROR(PlanGathers(g, reads, p));
  return p;
}

}  // namespace fxdp
