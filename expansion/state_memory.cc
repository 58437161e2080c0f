#include "expansion/state_memory.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "analysis/ir/collectives.h"
#include "nlohmann/json.hpp"
#include "util/bytes.h"

namespace fxdp {
namespace {

int64_t TensorBytes(const ir::ValueType& v) {
  if (!v.is_tensor()) return 0;
  return v.tensor.numel() * ir::DTypeItemSize(v.tensor.dtype);
}

int64_t OutputBytes(const ir::Node& n) { return n.outputs.empty() ? 0 : TensorBytes(n.outputs[0]); }

// The bytes of the node's first tensor argument (a collective's input).
int64_t InputBytes(const ir::Graph& g, const ir::Node& n) {
  if (n.args.empty() || !n.args[0].is_ref()) return 0;
  const ir::ValueRef r = n.args[0].as<ir::ValueRef>();
  const ir::Node& p = g.node(r.node);
  if (r.output < 0 || r.output >= static_cast<int32_t>(p.outputs.size())) return 0;
  return TensorBytes(p.outputs[static_cast<size_t>(r.output)]);
}

}  // namespace

StateMemory RankStateMemory(const ir::Graph& g, DataParallelStyle style, int32_t world) {
  StateMemory m;
  m.world_size = world;
  m.style = style;
  absl::flat_hash_set<std::string> trained;  // parameters with a gradient
  for (int32_t i = 0; i < g.size(); ++i) {
    const ir::Node& n = g.node(ir::NodeId{i});
    if (!n.grad_of.empty()) trained.insert(n.grad_of);
  }
  for (int32_t i = 0; i < g.size(); ++i) {
    const ir::Node& n = g.node(ir::NodeId{i});
    if (n.is_placeholder()) {
      const int64_t bytes = OutputBytes(n);
      switch (n.placeholder.role) {
        case ir::PlaceholderRole::kParameter: {
          m.parameter_bytes = StateMemory::AddBytes(m.parameter_bytes, bytes);
          const bool grad =
              trained.contains(n.placeholder.state_name) ||
              (!n.outputs.empty() && n.outputs[0].is_tensor() && n.outputs[0].tensor.requires_grad);
          if (grad) m.gradient_bytes = StateMemory::AddBytes(m.gradient_bytes, bytes);
          break;
        }
        case ir::PlaceholderRole::kOptimizerState:
          m.optimizer_state_bytes = StateMemory::AddBytes(m.optimizer_state_bytes, bytes);
          break;
        case ir::PlaceholderRole::kInput: break;
        default:  // buffers, hyper-parameters, constants
          m.other_state_bytes = StateMemory::AddBytes(m.other_state_bytes, bytes);
      }
      continue;
    }
    if (!n.is_call()) continue;
    const std::string& op = n.target.name;
    if (op == ir::kAllGather) {
      m.largest_unit_bytes = std::max(m.largest_unit_bytes, OutputBytes(n));
    } else if (op == ir::kAllReduce || op == ir::kReduceScatter) {
      m.largest_bucket_bytes = std::max(m.largest_bucket_bytes, InputBytes(g, n));
    }
  }
  m.gathered_bytes = StateMemory::AddBytes(m.largest_unit_bytes, m.largest_unit_bytes);
  return m;
}

StateMemory ExpansionStateMemory(const Expansion& e) {
  StateMemory best;
  bool first = true;
  for (const ir::Graph& g : e.distinct_graphs) {
    StateMemory m = RankStateMemory(g, e.report.style, e.world_size());
    if (first || m.total_bytes() > best.total_bytes()) best = m;
    first = false;
  }
  return best;
}

std::string FormatBytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (int64_t{1} << 30))
    return absl::StrFormat("%.2f GiB (%d bytes)", b / (1 << 30), bytes);
  if (bytes >= (int64_t{1} << 20)) return util::MiBWithBytes(bytes);
  if (bytes >= (int64_t{1} << 10))
    return absl::StrFormat("%.1f KiB (%d bytes)", b / (1 << 10), bytes);
  return absl::StrFormat("%d bytes", bytes);
}

std::string StateMemoryToTable(const StateMemory& m) {
  const bool fs = m.style == DataParallelStyle::kFullyShard;
  std::string out =
      absl::StrFormat("\nstate per rank (%s, %d rank%s): %s\n", DataParallelStyleName(m.style),
                      m.world_size, m.world_size == 1 ? "" : "s", FormatBytes(m.total_bytes()));
  auto line = [&](absl::string_view what, int64_t bytes, absl::string_view note) {
    absl::StrAppendFormat(&out, "  %-18s %s%s\n", what, FormatBytes(bytes), note);
  };
  line("parameters", m.parameter_bytes, fs ? " (flat shards)" : "");
  line("gradients", m.gradient_bytes, fs ? " (shards, after the reduce-scatter)" : "");
  line("optimizer state", m.optimizer_state_bytes, "");
  line("other state", m.other_state_bytes, " (buffers, hyper-parameters, constants)");
  if (fs) {
    line("gathered", m.gathered_bytes,
         absl::StrCat(" (2 x the largest unit, ", FormatBytes(m.largest_unit_bytes),
                      ": a unit and its prefetched successor)"));
  }
  line("largest bucket", m.largest_bucket_bytes,
       fs ? " (whole, while reduce-scattered)" : " (while all-reduced)");
  absl::StrAppend(
      &out,
      "  activations and temporaries come on top: the total is a lower bound of the step's "
      "peak; fxdp-server refuses a job whose total exceeds a worker's registered memory\n");
  return out;
}

std::string ShardedStateReason(const ShardedState& s) {
  return s.role == ir::PlaceholderRole::kParameter
             ? "parameter: each rank holds its flat shard; all-gathered whole before forward and "
               "again before backward, updated on the shard"
             : "optimizer state with its parameter's numel: updated elementwise on the shard, "
               "next to the parameter's";
}

absl::StatusOr<StyledAnalysis> AnalyzeStyle(const ir::Graph& graph, const BatchDimAnalysis& a,
                                            const ExpandOptions& options) {
  absl::StatusOr<Expansion> e = ExpandDataParallel(graph, a, options);
  if (!e.ok()) return e.status();
  StyledAnalysis s;
  s.style = options.style;
  s.sharded_state = e->sharded_state;
  s.memory = ExpansionStateMemory(*e);
  absl::flat_hash_map<std::string, const ShardedState*> by_name;
  for (const ShardedState& x : s.sharded_state) by_name[x.state_name] = &x;
  for (int32_t i = 0; i < graph.size(); ++i) {
    const ir::Node& n = graph.node(ir::NodeId{i});
    if (!n.is_placeholder()) continue;
    auto it = by_name.find(n.placeholder.state_name);
    if (it == by_name.end()) continue;
    const ShardedState& x = *it->second;
    int64_t numel = 1;
    for (int64_t d : x.shape) numel *= d;
    s.overrides[i] = {"S(0)", absl::StrCat("fully_shard: flat shard of ", x.shard_numel, " of ",
                                           numel, " elements per rank (ceil(", numel, " / ",
                                           options.world_size, ")); ", ShardedStateReason(x))};
  }
  return s;
}

std::string StyledAnalysisToJson(const ir::Graph& graph, const BatchDimAnalysis& a,
                                 const StyledAnalysis& s) {
  nlohmann::json j = nlohmann::json::parse(AnalysisToJson(graph, a, &s.overrides));
  j["style"] = std::string(DataParallelStyleName(s.style));
  const StateMemory& m = s.memory;
  j["memory"] = {{"parameter_bytes", m.parameter_bytes},
                 {"gradient_bytes", m.gradient_bytes},
                 {"optimizer_state_bytes", m.optimizer_state_bytes},
                 {"other_state_bytes", m.other_state_bytes},
                 {"largest_unit_bytes", m.largest_unit_bytes},
                 {"gathered_bytes", m.gathered_bytes},
                 {"largest_bucket_bytes", m.largest_bucket_bytes},
                 {"total_bytes", m.total_bytes()}};
  return j.dump(1) + "\n";
}

std::string StyledAnalysisToTable(const ir::Graph& graph, const BatchDimAnalysis& a,
                                  const StyledAnalysis& s, bool with_source) {
  return AnalysisToTable(graph, a, &s.overrides, with_source) + StateMemoryToTable(s.memory);
}

}  // namespace fxdp
