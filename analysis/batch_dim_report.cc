// Printing a BatchDimAnalysis: reasons, the table and the JSON form (batch_dim.h).
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "analysis/analysis_table.h"
#include "analysis/batch_dim.h"
#include "analysis/op_rules.h"
#include "analysis/view_rules.h"
#include "nlohmann/json.hpp"

namespace fxdp {

using ir::Graph;
using ir::Node;
using ir::NodeId;
using ir::ValueRef;

namespace {

std::string Lower(absl::string_view s) { return absl::AsciiStrToLower(s); }

std::string DetailText(const Graph& g, const BatchDimAnalysis& a, NodeId id) {
  const NodeInfo& info = a.node(id);
  const ValueInfo& v = a.primary(id);
  switch (info.detail) {
    case Detail::kNone: return "";
    case Detail::kNoBatch: return "no operand carries the batch";
    case Detail::kFromArg: {
      std::string s = absl::StrFormat("batch from arg %d", info.arg);
      if (v.placement.is_shard()) absl::StrAppend(&s, " -> dim ", v.placement.dim);
      return s;
    }
    case Detail::kContracted:
      return absl::StrFormat("batch (arg %d) contracted -> partial %s", info.arg,
                             ReduceOpName(v.placement.reduce));
    case Detail::kReducedBatch:
      return absl::StrFormat("batch dim reduced -> partial %s", ReduceOpName(v.placement.reduce));
    case Detail::kLossReduced:
      return absl::StrFormat("loss reduced over the batch by %s",
                             v.placement.reduce == ReduceOp::kAvg ? "mean" : "sum");
    case Detail::kPartialLinear: return "partial operand through a linear op";
    case Detail::kLocalStats: return "normalised with local batch statistics (as DDP)";
    case Detail::kSyncStats: return "normalised with global batch statistics (sync_batchnorm)";
    case Detail::kGathered:
      return "works along the batch dim: sharded operands all-gathered, whole on every rank";
  }
  return "";
}

}  // namespace

std::string DescribeDecision(const Graph& g, const BatchDimAnalysis& a, NodeId id) {
  const Node& n = g.node(id);
  const NodeInfo& info = a.node(id);
  const ValueInfo& v = a.primary(id);
  std::string s;
  switch (info.decision) {
    case Decision::kInput:
      s = n.placeholder.batch_dim >= 0 ? absl::StrFormat("input, batch dim %d (B=%d)",
                                                         n.placeholder.batch_dim, a.batch_size())
                                       : "input without a batch dim";
      for (const auto& [input, offsets] : a.ragged()) {
        if (input == id)
          s = absl::StrCat("input split by the bags of ", g.node(offsets).name,
                           " (ragged: each rank reads its bags' elements)");
      }
      break;
    case Decision::kState:
      if (n.is_placeholder() && n.placeholder.role == ir::PlaceholderRole::kHyperparameter) {
        s = absl::StrCat("hyper-parameter ", n.placeholder.state_name,
                         ": replicated (one value for every rank, fed per step)");
        break;
      }
      s = n.is_placeholder()
              ? absl::StrCat(Lower(ir::PlaceholderRoleName(n.placeholder.role)),
                             n.placeholder.state_name.empty() ? "" : " ", n.placeholder.state_name)
              : "attribute";
      break;
    case Decision::kView: {
      s = "view";
      if (v.placement.is_shard()) {
        const ValueRef in = n.args[0].as<ValueRef>();
        const ir::ValueType& t = g.type(in);
        auto map = ComputeViewDimMap(n.target, t.tensor.shape, n.args, n.kwargs);
        if (map.ok()) absl::StrAppend(&s, " ", DimMapToString(*map));
        absl::StrAppend(&s, ": batch dim ", a.value(in).placement.dim, " -> ", v.placement.dim);
      } else {
        absl::StrAppend(&s, ": ", DetailText(g, a, id));
      }
      break;
    }
    case Decision::kRule: {
      const OpRule& r = OpRuleAt(info.rule);
      s = absl::StrCat(OpFamilyName(r.family));
      if (r.spec.kind() == MatmulSpec::Kind::kEinsum) absl::StrAppend(&s, " ", r.spec.ToString());
      const std::string d = DetailText(g, a, id);
      if (!d.empty()) absl::StrAppend(&s, ": ", d);
      break;
    }
    case Decision::kGetItem: {
      const ValueRef src = n.args[0].as<ValueRef>();
      s = absl::StrFormat("output %d of %s", src.output, g.node(src.node).name);
      break;
    }
    case Decision::kShapedByUse:
      s = absl::StrFormat("sized by the batch: built sharded for its use by %s",
                          g.node(info.shaped_by).name);
      break;
    case Decision::kFallback:
      s = absl::StrFormat("NO RULE for %s: size matching", n.target.ToString());
      break;
    case Decision::kNoTensor: s = "no tensor output"; break;
    case Decision::kOutput: s = "graph output"; break;
  }
  if (v.placement.is_shard() && v.outer > 1) {
    absl::StrAppend(&s, absl::StrFormat(" (batch inside the dim, %d blocks)", v.outer));
  }
  if (v.placement.is_shard() && v.mean_scaled) absl::StrAppend(&s, " (mean-scaled)");
  if (v.rank_local) absl::StrAppend(&s, " (rank-local: from local batch statistics)");
  if (!n.grad_of.empty()) absl::StrAppend(&s, "; gradient of ", n.grad_of);
  if (a.num_outputs(id) > 0 && a.IsReduced(ValueRef{id, 0})) {
    absl::StrAppend(&s, "; all-reduced (", ReduceOpName(v.placement.reduce), ") before use");
  }
  return s;
}

std::string PlacementsString(const Graph& g, const BatchDimAnalysis& a, NodeId id) {
  const Node& n = g.node(id);
  std::vector<std::string> parts;
  bool all_same = true;
  const ValueInfo* first = nullptr;
  for (int32_t k = 0; k < static_cast<int32_t>(n.outputs.size()); ++k) {
    if (!n.outputs[k].is_tensor()) {
      parts.push_back("-");
      all_same = false;
      continue;
    }
    const ValueInfo& v = a.value(ValueRef{id, k});
    if (first == nullptr) {
      first = &v;
    } else if (!(v.placement == first->placement)) {
      all_same = false;
    }
    parts.push_back(v.placement.ToString());
  }
  if (first == nullptr) return "-";
  if (all_same) return first->placement.ToString();
  return absl::StrCat("(", absl::StrJoin(parts, ", "), ")");
}

namespace {

const std::pair<std::string, std::string>* OverrideOf(const PlacementOverrides* overrides,
                                                      NodeId id) {
  if (overrides == nullptr) return nullptr;
  auto it = overrides->find(id.value);
  return it == overrides->end() ? nullptr : &it->second;
}

nlohmann::json NodeJson(const Graph& g, const BatchDimAnalysis& a, NodeId id,
                        const PlacementOverrides* overrides) {
  const Node& n = g.node(id);
  const std::pair<std::string, std::string>* o = OverrideOf(overrides, id);
  nlohmann::json j;
  j["name"] = n.name;
  j["target"] = n.is_call() ? n.target.ToString() : std::string(ir::NodeKindName(n.kind));
  const int32_t bd = a.primary(id).batch_dim();
  bool tensor = !n.outputs.empty() && n.outputs[0].is_tensor();
  j["batch_dim"] = tensor && bd >= 0 ? nlohmann::json(bd) : nlohmann::json(nullptr);
  j["placement"] = o != nullptr ? o->first : PlacementsString(g, a, id);
  // One entry per output, null for a non-tensor one ("placement" above joins them).
  nlohmann::json each = nlohmann::json::array();
  for (int32_t k = 0; k < static_cast<int32_t>(n.outputs.size()); ++k) {
    each.push_back(!n.outputs[k].is_tensor() ? nlohmann::json(nullptr)
                   : o != nullptr            ? nlohmann::json(o->first)
                                  : nlohmann::json(a.value(ValueRef{id, k}).placement.ToString()));
  }
  j["placements"] = std::move(each);
  j["reason"] = o != nullptr ? o->second : DescribeDecision(g, a, id);
  if (!n.source.empty()) j["source"] = n.source;
  if (n.is_placeholder()) {
    j["role"] = std::string(ir::PlaceholderRoleName(n.placeholder.role));
    j["state_name"] = n.placeholder.state_name;
  }
  if (!n.grad_of.empty()) j["grad_of"] = n.grad_of;
  return j;
}

}  // namespace

std::string AnalysisToJson(const Graph& g, const BatchDimAnalysis& a,
                           const PlacementOverrides* overrides) {
  nlohmann::json j;
  j["world_size"] = a.world_size();
  j["batch_size"] = a.batch_size();
  nlohmann::json nodes = nlohmann::json::array();
  for (int32_t i = 0; i < g.size(); ++i) nodes.push_back(NodeJson(g, a, NodeId{i}, overrides));
  j["nodes"] = std::move(nodes);
  nlohmann::json reds = nlohmann::json::array();
  for (const Reduction& r : a.reductions()) {
    nlohmann::json x;
    x["value"] = g.node(r.value.node).name;
    x["output"] = r.value.output;
    x["op"] = ReduceOpName(r.op);
    x["first_use"] = r.first_use.valid() ? g.node(r.first_use).name : std::string();
    x["grad_of"] = r.grad_of;
    reds.push_back(std::move(x));
  }
  j["reductions"] = std::move(reds);
  nlohmann::json reads = nlohmann::json::array();
  for (const ShardedRead& r : a.sharded_reads()) {
    nlohmann::json x;
    x["value"] = g.node(r.value.node).name;
    x["output"] = r.value.output;
    x["dim"] = r.dim;
    x["user"] = g.node(r.user).name;
    reads.push_back(std::move(x));
  }
  j["sharded_reads"] = std::move(reads);
  j["warnings"] = a.warnings();
  j["notes"] = a.notes();
  return j.dump(1) + "\n";
}

std::string AnalysisToTable(const Graph& g, const BatchDimAnalysis& a,
                            const PlacementOverrides* overrides, bool with_source) {
  return AnalysisTableText(AnalysisToProto(g, a, overrides), with_source);
}

}  // namespace fxdp
