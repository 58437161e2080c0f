// The fixed-point engine of the batch-dim analysis (analyzer.h).
#include "analysis/batch_dim/analyzer.h"

#include "analysis/analysis_table.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "analysis/ir/hyperparameters.h"
#include "analysis/ir/node_error.h"
#include "analysis/ir/random_ops.h"
#include "analysis/op_schemas.h"
#include "analysis/view_rules.h"
#include "util/status_macros.h"

namespace fxdp {

using ir::Argument;
using ir::Graph;
using ir::Node;
using ir::NodeId;
using ir::TensorType;
using ir::ValueRef;

bool Placement::operator==(const Placement& o) const {
  if (kind != o.kind) return false;
  if (kind == Kind::kShard) return dim == o.dim;
  if (kind == Kind::kPartial) return reduce == o.reduce;
  return true;
}

const char* ReduceOpName(ReduceOp op) { return op == ReduceOp::kAvg ? "avg" : "sum"; }

std::string Placement::ToString() const {
  switch (kind) {
    case Kind::kReplicate: return "R";
    case Kind::kShard: return absl::StrCat("S(", dim, ")");
    case Kind::kPartial: return absl::StrCat("P(", ReduceOpName(reduce), ")");
  }
  return "?";
}

absl::StatusOr<BatchDimAnalysis> BatchDimAnalyzer::Run() {
  if (options_.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("world size must be >= 1, got ", options_.world_size));
  }
  if (!options_.guess_unruled_ops) FXDP_RETURN_IF_ERROR(RefuseUnruledOps());
  a_.world_size_ = options_.world_size;
  a_.sync_batchnorm_ = options_.sync_batchnorm;
  a_.value_offset_.resize(g_.size() + 1);
  int32_t off = 0;
  for (int32_t i = 0; i < g_.size(); ++i) {
    a_.value_offset_[i] = off;
    off += static_cast<int32_t>(g_.nodes()[i].outputs.size());
  }
  a_.value_offset_[g_.size()] = off;
  a_.reduced_.assign(off, 0);
  SeedReductions();
  FXDP_RETURN_IF_ERROR(FindBatchSize());
  FindRaggedInputs();
  // Each pass may discover values that must be all-reduced or factories
  // that must be built sharded; both sets only grow, so this converges.
  constexpr int kMaxPasses = 32;
  for (int pass = 0;; ++pass) {
    changed_ = false;
    FXDP_RETURN_IF_ERROR(Pass());
    if (!changed_) break;
    if (pass + 1 == kMaxPasses) {
      const Node& last = g_.node(last_change_);
      return absl::InternalError(absl::StrFormat(
          "batch-dim analysis did not converge after %d passes: pass %d still found a value to "
          "all-reduce or build sharded, last for %s",
          kMaxPasses, kMaxPasses, ir::NodeLabel(last)));
    }
  }
  Finish();
  return std::move(a_);
}

void BatchDimAnalyzer::SeedReductions() {
  // Gradients and non-loss outputs are all-reduced when they come out partial.
  for (int32_t i = 0; i < g_.size(); ++i) {
    const Node& n = g_.nodes()[i];
    if (!n.grad_of.empty() && !n.outputs.empty()) a_.reduced_[Offset({NodeId{i}, 0})] = 1;
  }
}

absl::Status BatchDimAnalyzer::Pass() {
  a_.values_.assign(a_.value_offset_.back(), ValueInfo{});
  a_.nodes_.assign(g_.size(), NodeInfo{});
  a_.sharded_reads_.clear();
  a_.gathered_reads_.clear();
  a_.notes_.clear();
  fallback_ops_.clear();
  fallback_order_.clear();
  for (int32_t i = 0; i < g_.size(); ++i) {
    const NodeId id{i};
    const Node& n = g_.nodes()[i];
    FXDP_RETURN_IF_ERROR(Visit(id, n));
  }
  return absl::OkStatus();
}

absl::Status BatchDimAnalyzer::Visit(NodeId id, const Node& n) {
  switch (n.kind) {
    case ir::NodeKind::kPlaceholder: return VisitPlaceholder(id, n);
    case ir::NodeKind::kOutput: return VisitOutput(id, n);
    case ir::NodeKind::kGetAttr:
      a_.nodes_[id.value].decision = Decision::kState;
      return absl::OkStatus();
    case ir::NodeKind::kCallFunction: break;
  }
  NodeInfo& info = a_.nodes_[id.value];
  if (auto it = upgrades_.find(id.value); it != upgrades_.end()) {
    info.decision = Decision::kShapedByUse;
    const OpRule* rule = FindOpRule(n.target);
    info.rule = static_cast<int16_t>(OpRuleIndex(rule));
    info.shaped_by = it->second.user;
    ValueInfo v = Shard(it->second.dim, it->second.outer, false);
    // Built from constants (zeros, new_ones, ones_like: self gives only the dtype), its rows
    // are in any order; arange's are not, nor a view or pointwise op of rows in an order.
    const bool constant =
        rule != nullptr && rule->param(ParamRole::kEnd) == nullptr &&
        (rule->family == OpFamily::kFactory || rule->family == OpFamily::kNewFactory ||
         rule->family == OpFamily::kLike);
    v.order = constant || rule == nullptr || rule->param(ParamRole::kEnd) == nullptr ? -1 : 0;
    n.ForEachInput([&](ValueRef r) {
      if (!constant && TypeOf(r) != nullptr && Read(r).placement.is_shard() &&
          Read(r).order != -1) {
        v.order = 0;
      }
    });
    SetOut(id, 0, v);
    return absl::OkStatus();
  }
  order_set_ = false;
  positions_index_.reset();
  if (n.is_getitem()) {
    const ValueRef src = n.args[0].as<ValueRef>();
    info.decision = Decision::kGetItem;
    SetOut(id, 0, Read(src));
    return absl::OkStatus();
  }
  const OpRule* rule = IsViewOp(n.target) ? nullptr : FindOpRule(n.target);
  if (IsViewOp(n.target)) {
    FXDP_RETURN_IF_ERROR(VisitView(id, n));
  } else if (rule == nullptr) {
    FXDP_RETURN_IF_ERROR(VisitFallback(id, n));
  } else {
    info.decision = Decision::kRule;
    info.rule = static_cast<int16_t>(OpRuleIndex(rule));
    FXDP_RETURN_IF_ERROR(VisitRule(id, n, *rule));
  }
  if (!order_set_) FXDP_RETURN_IF_ERROR(OrderRows(id, n, rule));
  FollowPositions(id, n);
  FXDP_RETURN_IF_ERROR(CheckPositionsUse(id, n, rule));
  PropagateRankLocal(id, n);
  return absl::OkStatus();
}

// Dispatches on the rule's family: the only switch over families.
absl::Status BatchDimAnalyzer::VisitRule(NodeId id, const Node& n, const OpRule& rule) {
  if (rule.has(kRandom) && ir::FindRandomOp(n.target) == nullptr)
    return Error(n, absl::StrCat(n.target.ToString(),
                                 " draws random values fxdp cannot draw rank-invariantly: every "
                                 "random op comes from fxdp's own generator so that N ranks draw "
                                 "exactly what one device draws, and it has no such form of this "
                                 "op (docs/randomness.md lists the random ops it draws)"));
  NodeInfo& info = a_.nodes_[id.value];
  switch (rule.family) {
    case OpFamily::kPointwise: {
      const TensorType* out = OutType(n);
      return Pointwise(id, n, rule, out ? out->rank() : 0);
    }
    case OpFamily::kLike: return Like(id, n, rule);
    case OpFamily::kNewFactory:
    case OpFamily::kFactory:
    case OpFamily::kNoTensor: info.detail = Detail::kNoBatch; return absl::OkStatus();
    case OpFamily::kMatmul: return Matmul(id, n, rule);
    case OpFamily::kReduce: return Reduce(id, n, rule);
    case OpFamily::kAlongDim:
    case OpFamily::kLastDims:
    case OpFamily::kDimsList:
    case OpFamily::kPad: return ShapePreserving(id, n, rule);
    case OpFamily::kLayerNorm: return LayerNorm(id, n, rule);
    case OpFamily::kLayerNormBackward:
    case OpFamily::kBatchNormBackward:
    case OpFamily::kConvBackward: return NormOrConvBackward(id, n, rule);
    case OpFamily::kBatchNorm: return BatchNorm(id, n, rule);
    case OpFamily::kSpatial: return Spatial(id, n, rule);
    case OpFamily::kEmbedding: return Embedding(id, n, rule);
    case OpFamily::kEmbeddingBackward: return EmbeddingBackward(id, n, rule);
    case OpFamily::kEmbeddingBag: return EmbeddingBag(id, n, rule);
    case OpFamily::kHistogram: return Histogram(id, n, rule);
    case OpFamily::kLoss:
    case OpFamily::kNllLoss: return Loss(id, n, rule);
    case OpFamily::kLossBackward:
    case OpFamily::kNllLossBackward: return LossBackward(id, n, rule);
    case OpFamily::kCat:
    case OpFamily::kStack: return CatStack(id, n, rule);
    case OpFamily::kSplit:
    case OpFamily::kSlice:
    case OpFamily::kSelect:
    case OpFamily::kIndexWithDim:
    case OpFamily::kSliceBackward: return DimOp(id, n, rule);
    case OpFamily::kIndex: return Index(id, n, rule);
    case OpFamily::kScatterInto: return ScatterInto(id, n, rule);
    case OpFamily::kAsStrided:
    case OpFamily::kAsStridedScatter: return AsStrided(id, n, rule);
    case OpFamily::kIndexPut: return IndexPut(id, n, rule);
    case OpFamily::kIndexAdd: return IndexAdd(id, n, rule);
    case OpFamily::kGroupedMm: return GroupedMm(id, n, rule);
    case OpFamily::kForeach: return Foreach(id, n, rule);
  }
  return absl::OkStatus();
}

// A replicated result computed from a rank-local operand is rank-local.
void BatchDimAnalyzer::PropagateRankLocal(NodeId id, const Node& n) {
  bool local = false;
  n.ForEachInput([&](ValueRef r) {
    if (g_.type(r).is_tensor() && Read(r).rank_local) local = true;
  });
  if (!local) return;
  const int32_t base = a_.value_offset_[id.value];
  for (int32_t k = 0; k < a_.num_outputs(id); ++k) {
    ValueInfo& v = a_.values_[base + k];
    if (n.outputs[k].is_tensor() && v.placement.is_replicate()) v.rank_local = true;
  }
}

absl::Status BatchDimAnalyzer::VisitPlaceholder(NodeId id, const Node& n) {
  NodeInfo& info = a_.nodes_[id.value];
  if (n.placeholder.role != ir::PlaceholderRole::kInput) {
    info.decision = Decision::kState;
    return absl::OkStatus();
  }
  info.decision = Decision::kInput;
  if (n.placeholder.batch_dim >= 0) SetOut(id, 0, Shard(n.placeholder.batch_dim, 1, false));
  return absl::OkStatus();
}

absl::Status BatchDimAnalyzer::VisitOutput(NodeId id, const Node& n) {
  a_.nodes_[id.value].decision = Decision::kOutput;
  // args[0] lists the outputs, aligned with output_specs.
  if (n.args.empty() || !n.args[0].is_list()) return absl::OkStatus();
  const auto& list = n.args[0].as<Argument::List>();
  for (size_t k = 0; k < list.size(); ++k) {
    const ValueRef* r = list[k].get_if<ValueRef>();
    if (r == nullptr) continue;
    const bool loss = k < n.output_specs.size() && n.output_specs[k].role == ir::OutputRole::kLoss;
    if (loss) continue;
    RequireWhole(*r, id);
    if (a_.values_[Offset(*r)].placement.is_shard() && a_.values_[Offset(*r)].order > 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "output %d (%s) holds rows in %s, not the batch's: put them back (x[inverse]) first", k,
          g_.node(r->node).name, OrderName(a_.values_[Offset(*r)].order)));
    }
    if (a_.values_[Offset(*r)].positions != ValueInfo::Positions::kNone) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "output %d (%s) holds the row numbers of each rank's own rows (positions from a sort), "
          "not the batch's",
          k, g_.node(r->node).name));
    }
    const ir::OutputRole role =
        k < n.output_specs.size() ? n.output_specs[k].role : ir::OutputRole::kOther;
    if (ir::UpdatedRole(role).has_value() && a_.values_[Offset(*r)].placement.is_shard()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "output %d (%s '%s') is %s: the updated state depends on batch rows (%s), so "
          "ranks would hold different parts of it; data parallelism needs it replicated",
          k, ir::OutputRoleName(role), n.output_specs[k].state_name,
          a_.values_[Offset(*r)].placement.ToString(), g_.node(r->node).name));
    }
  }
  return absl::OkStatus();
}

void BatchDimAnalyzer::SetOut(NodeId id, int k, const ValueInfo& v) {
  if (k >= static_cast<int>(g_.node(id).outputs.size())) return;
  if (!g_.node(id).outputs[k].is_tensor()) return;
  a_.values_[a_.value_offset_[id.value] + k] = v;
}

void BatchDimAnalyzer::SetAllOut(NodeId id, const ValueInfo& v) {
  const int n = static_cast<int>(g_.node(id).outputs.size());
  for (int k = 0; k < n; ++k) SetOut(id, k, v);
}

// The value as a use reads it: replicated once all-reduced.
ValueInfo BatchDimAnalyzer::Read(ValueRef r) const {
  const ValueInfo& v = a_.values_[Offset(r)];
  if (v.placement.is_partial() && a_.reduced_[Offset(r)]) return kReplicated;
  return v;
}

// A use needs the whole value: a partial value is all-reduced first.
void BatchDimAnalyzer::RequireWhole(ValueRef r, NodeId user) {
  const int32_t off = Offset(r);
  if (!a_.values_[off].placement.is_partial() || a_.reduced_[off]) return;
  a_.reduced_[off] = 1;
  MarkChanged(user);
}

const TensorType* BatchDimAnalyzer::TypeOf(ValueRef r) const {
  const ir::ValueType& t = g_.type(r);
  return t.is_tensor() ? &t.tensor : nullptr;
}

void BatchDimAnalyzer::AddOperand(std::vector<Operand>& ops, int arg, int elem,
                                  const Argument& a) const {
  const ValueRef* r = a.get_if<ValueRef>();
  if (r == nullptr) return;
  const TensorType* t = TypeOf(*r);
  if (t == nullptr) return;
  ops.push_back(Operand{arg, elem, *r, t, Read(*r)});
}

// Tensor operands of `n`, lists flattened, keyword arguments numbered 64+.
std::vector<Operand> BatchDimAnalyzer::Operands(const Node& n) const {
  std::vector<Operand> ops;
  ops.reserve(4);
  for (size_t i = 0; i < n.args.size(); ++i) {
    const Argument& a = n.args[i];
    if (const auto* l = a.get_if<Argument::List>()) {
      for (size_t e = 0; e < l->size(); ++e) AddOperand(ops, int(i), int(e), (*l)[e]);
    } else {
      AddOperand(ops, int(i), -1, a);
    }
  }
  for (size_t k = 0; k < n.kwargs.size(); ++k) AddOperand(ops, 64 + int(k), -1, n.kwargs[k].value);
  return ops;
}

const Operand* BatchDimAnalyzer::Find(const std::vector<Operand>& ops, int arg) const {
  for (const Operand& o : ops) {
    if (o.arg == arg) return &o;
  }
  return nullptr;
}

absl::Status BatchDimAnalyzer::RequireReplicatedArgs(const Node& n, const std::vector<Operand>& ops,
                                                     const OpRule& rule) const {
  for (const OpParam& p : rule.params) {
    if (p.role != ParamRole::kReplicated) continue;
    const Operand* o = Find(ops, p.index);
    if (o != nullptr && o->info.placement.is_shard()) {
      return Error(
          n, absl::StrFormat("arg %d '%s' (%s) is sharded on the batch (dim %d); this "
                             "op needs it replicated (a weight, bias or running "
                             "statistic)",
                             p.index, p.name, g_.node(o->ref.node).name, o->info.placement.dim));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<const Operand*> BatchDimAnalyzer::ShardedOperand(NodeId id, const Node& n,
                                                                const OpRule& rule,
                                                                std::vector<Operand>& ops, int arg,
                                                                Special* s) {
  FXDP_ASSIGN_OR_RETURN(*s, Linear(id, n, rule.linear, ops));
  FXDP_RETURN_IF_ERROR(RequireReplicatedArgs(n, ops, rule));
  const Operand* o = Find(ops, arg);
  if (o == nullptr || !o->info.placement.is_shard()) {
    SetCombined(id, Combined{}, *s);
    return nullptr;
  }
  return o;
}

absl::StatusOr<std::optional<BatchDimAnalyzer::Combined>> BatchDimAnalyzer::GradAndInputBatch(
    NodeId id, const Node& n, const OpRule& rule, std::vector<Operand>& ops, int64_t out_rank,
    Special* s) {
  FXDP_ASSIGN_OR_RETURN(*s, Linear(id, n, rule.linear, ops));
  std::vector<Operand> batched;
  for (const Operand& o : ops) {
    if (o.arg == 0 || o.arg == 1) batched.push_back(o);
  }
  if (std::none_of(batched.begin(), batched.end(),
                   [](const Operand& o) { return o.info.placement.is_shard(); })) {
    SetCombined(id, Combined{}, *s);
    return std::nullopt;
  }
  FXDP_RETURN_IF_ERROR(RequireReplicatedArgs(n, ops, rule));
  return Broadcast(id, n, batched, out_rank, /*broadcast=*/false);
}

std::string BatchDimAnalyzer::OperandName(const std::vector<Operand>& ops, int arg) const {
  for (const Operand& o : ops) {
    if (o.arg == arg) return g_.node(o.ref.node).name;
  }
  return "?";
}

absl::Status BatchDimAnalyzer::Error(const Node& n, const std::string& what) const {
  return ir::NodeError(n, what);
}

const TensorType* BatchDimAnalyzer::OutType(const Node& n, int k) const {
  if (k >= static_cast<int>(n.outputs.size()) || !n.outputs[k].is_tensor()) return nullptr;
  return &n.outputs[k].tensor;
}

void BatchDimAnalyzer::Finish() {
  // Reductions, in graph order, with their first use (one scan, no use lists).
  std::vector<int32_t> first_use(a_.values_.size(), -1);
  for (int32_t i = 0; i < g_.size(); ++i) {
    g_.nodes()[i].ForEachInput([&](ValueRef r) {
      const int32_t off = Offset(r);
      if (a_.reduced_[off] && first_use[off] < 0) first_use[off] = i;
    });
  }
  for (int32_t i = 0; i < g_.size(); ++i) {
    const Node& n = g_.nodes()[i];
    for (int32_t k = 0; k < static_cast<int32_t>(n.outputs.size()); ++k) {
      const ValueRef r{NodeId{i}, k};
      const int32_t off = Offset(r);
      const ValueInfo& v = a_.values_[off];
      if (!a_.reduced_[off]) continue;
      if (!v.placement.is_partial()) {
        a_.reduced_[off] = 0;
        continue;
      }
      Reduction red;
      red.value = r;
      red.op = v.placement.reduce;
      red.grad_of = k == 0 ? n.grad_of : std::string();
      red.first_use = NodeId{first_use[off]};
      a_.reductions_.push_back(std::move(red));
    }
  }
  for (const std::string& op : fallback_order_) {
    const auto& [count, first, what] = fallback_ops_.at(op);
    a_.warnings_.push_back(absl::StrFormat(
        "GUESSED: no batch-dim rule for %s (%d node%s, first %s): placed by size matching: %s "
        "(fxdp expand and jobs refuse this graph until the op has a rule)",
        op, count, count == 1 ? "" : "s", g_.node(first).name, what));
  }
  const std::vector<std::string> hyper = ir::HyperparameterNames(g_);
  if (!hyper.empty()) {
    a_.notes_.push_back(absl::StrCat(
        "hyper-parameters (R: the same value on every rank, fed per step by a schedule): ",
        absl::StrJoin(hyper, ", ")));
  }
}

absl::StatusOr<BatchDimAnalysis> AnalyzeBatchDims(const Graph& graph,
                                                  const AnalyzeOptions& options) {
  // A graph the workers cannot run is refused here, at compile time, naming the node.
  FXDP_RETURN_IF_ERROR(CheckOpSchemas(graph));
  return BatchDimAnalyzer(graph, options).Run();
}

const ValueInfo& BatchDimAnalysis::primary(NodeId n) const {
  if (num_outputs(n) == 0) return kReplicated;
  return values_[value_offset_[n.value]];
}

Placement BatchDimAnalysis::ReadPlacement(ValueRef r) const {
  const ValueInfo& v = value(r);
  if (v.placement.is_partial() && reduced_[value_offset_[r.node.value] + r.output]) {
    return Placement::Replicate();
  }
  return v.placement;
}

bool BatchDimAnalysis::IsReduced(ValueRef r) const {
  return reduced_[value_offset_[r.node.value] + r.output] != 0;
}

}  // namespace fxdp
