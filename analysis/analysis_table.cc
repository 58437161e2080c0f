#include "analysis/analysis_table.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace fxdp {
namespace {

void AddNode(const ir::Graph& g, const BatchDimAnalysis& a, const PlacementOverrides* overrides,
             ir::NodeId id, v1::NodePlacement* p) {
  const ir::Node& n = g.node(id);
  p->set_name(n.name);
  p->set_target(n.is_call() ? n.target.ToString() : std::string(ir::NodeKindName(n.kind)));
  const bool tensor = !n.outputs.empty() && n.outputs[0].is_tensor();
  const int32_t bd = a.primary(id).batch_dim();
  p->set_batch_dim(tensor && bd >= 0 ? bd : -1);
  p->set_source(n.source);
  const auto o =
      overrides != nullptr ? overrides->find(id.value) : PlacementOverrides::const_iterator();
  if (overrides != nullptr && o != overrides->end()) {  // sharded state (AnalyzeStyle)
    p->set_placement(o->second.first);
    p->set_reason(o->second.second);
  } else {
    p->set_placement(PlacementsString(g, a, id));
    p->set_reason(DescribeDecision(g, a, id));
  }
}

}  // namespace

v1::AnalyzeResponse AnalysisToProto(const ir::Graph& g, const BatchDimAnalysis& a,
                                    const PlacementOverrides* overrides) {
  v1::AnalyzeResponse r;
  r.set_world_size(a.world_size());
  r.set_batch_size(a.batch_size());
  r.mutable_nodes()->Reserve(g.size());
  for (int32_t i = 0; i < g.size(); ++i) AddNode(g, a, overrides, ir::NodeId{i}, r.add_nodes());
  for (const Reduction& red : a.reductions()) {
    v1::Reduction* x = r.add_reductions();
    x->set_value(g.node(red.value.node).name);
    x->set_output(red.value.output);
    x->set_op(ReduceOpName(red.op));
    x->set_first_use(red.first_use.valid() ? g.node(red.first_use).name : std::string());
    x->set_grad_of(red.grad_of);
  }
  for (const ShardedRead& s : a.sharded_reads()) {
    v1::ShardedRead* x = r.add_sharded_reads();
    x->set_value(g.node(s.value.node).name);
    x->set_output(s.value.output);
    x->set_dim(s.dim);
    x->set_user(g.node(s.user).name);
  }
  for (const std::string& w : a.warnings()) r.add_warnings(w);
  for (const std::string& w : a.notes()) r.add_notes(w);
  return r;
}

std::string AnalysisTableText(const v1::AnalyzeResponse& r, bool with_source) {
  size_t w[4] = {4, 2, 9, 9};
  for (const v1::NodePlacement& n : r.nodes()) {
    w[0] = std::max(w[0], n.name().size());
    w[1] = std::max(w[1], n.target().size());
    w[3] = std::max(w[3], n.placement().size());
  }
  std::string out = absl::StrFormat("world size %d, batch size %d, %d nodes\n\n", r.world_size(),
                                    r.batch_size(), r.nodes_size());
  auto line = [&](const std::string& a0, const std::string& a1, const std::string& a2,
                  const std::string& a3, const std::string& a4) {
    absl::StrAppendFormat(&out, "%-*s  %-*s  %-*s  %-*s  %s\n", w[0], a0, w[1], a1, w[2], a2, w[3],
                          a3, a4);
  };
  line("name", "op", "batch dim", "placement", "reason");
  for (const v1::NodePlacement& n : r.nodes()) {
    line(n.name(), n.target(), n.batch_dim() >= 0 ? absl::StrCat(n.batch_dim()) : "-",
         n.placement(),
         with_source && !n.source().empty() ? absl::StrCat(n.reason(), "  <- ", n.source())
                                            : n.reason());
  }
  absl::StrAppendFormat(&out, "\nreductions (%d):\n", r.reductions_size());
  for (const v1::Reduction& x : r.reductions()) {
    absl::StrAppendFormat(
        &out, "  all-reduce %s of %s:%d before %s%s\n", x.op(), x.value(), x.output(),
        x.first_use().empty() ? "-" : x.first_use(),
        x.grad_of().empty() ? "" : absl::StrCat(" (gradient of ", x.grad_of(), ")"));
  }
  if (r.sharded_reads_size() > 0) {
    absl::StrAppendFormat(&out, "\nsharded reads of replicated values (%d):\n",
                          r.sharded_reads_size());
    for (const v1::ShardedRead& x : r.sharded_reads()) {
      absl::StrAppendFormat(&out, "  %s:%d sliced on dim %d for %s\n", x.value(), x.output(),
                            x.dim(), x.user());
    }
  }
  absl::StrAppendFormat(&out, "\nwarnings (%d):\n", r.warnings_size());
  for (const std::string& s : r.warnings()) absl::StrAppend(&out, "  ", s, "\n");
  if (r.notes_size() > 0) {
    absl::StrAppendFormat(&out, "\nnotes (%d):\n", r.notes_size());
    for (const std::string& s : r.notes()) absl::StrAppend(&out, "  ", s, "\n");
  }
  return out;
}

}  // namespace fxdp
