#include "server/jobs/shape_variants.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace fxdp::server {

absl::StatusOr<std::shared_ptr<const v1::ExpandResponse>> ShapeVariants::Get(
    const ir::InputShapes& shapes) {
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    if (it->first != shapes) continue;
    lru_.splice(lru_.begin(), lru_, it);
    ++hits_;
    return lru_.front().second;
  }
  ++misses_;
  absl::StatusOr<v1::GraphDef> graph = ir::InstantiateDef(request_.graph(), shapes);
  if (!graph.ok()) return graph.status();
  v1::ExpandRequest request = request_;
  *request.mutable_graph() = *std::move(graph);
  absl::StatusOr<v1::ExpandResponse> expanded = expand_(request);
  if (!expanded.ok()) {
    return absl::Status(expanded.status().code(),
                        absl::StrCat("the graph at ", ir::InputShapesText(shapes), ": ",
                                     expanded.status().message()));
  }
  lru_.emplace_front(shapes, std::make_shared<const v1::ExpandResponse>(*std::move(expanded)));
  while (static_cast<int>(lru_.size()) > std::max(max_shapes_, 1)) lru_.pop_back();
  return lru_.front().second;
}

}  // namespace fxdp::server
