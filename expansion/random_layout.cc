// AddRandomLayouts (random_layout.h).
#include "expansion/random_layout.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "analysis/ir/node_error.h"
#include "analysis/ir/random_ops.h"

namespace fxdp {

absl::Status AddRandomLayouts(const ir::Graph& g, const BatchDimAnalysis& a,
                              ir::GraphHeader& header) {
  std::vector<ir::RandomLayout> layouts;
  for (int32_t i = 0; i < g.size(); ++i) {
    const ir::Node& n = g.nodes()[i];
    if (!n.is_call() || ir::FindRandomOp(n.target) == nullptr) continue;
    const ValueInfo& v = a.value(ir::ValueRef{ir::NodeId{i}, 0});
    if (!v.placement.is_shard()) continue;
    if (v.order > 0)
      return ir::NodeError(n,
                           "draws random values for rows each rank holds in its own sorted order, "
                           "not as a slice of one device's rows: no rank can draw one device's "
                           "values for them");
    const int32_t d = v.placement.dim;
    layouts.push_back({n.name, d, v.outer, n.outputs[0].tensor.shape[d]});
  }
  if (layouts.empty()) return absl::OkStatus();
  header.metadata.emplace_back(std::string(ir::kBatchSizeKey), absl::StrCat(a.batch_size()));
  header.metadata.emplace_back(std::string(ir::kRandomLayoutKey), ir::FormatRandomLayouts(layouts));
  return absl::OkStatus();
}

}  // namespace fxdp
