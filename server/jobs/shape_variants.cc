#include "server/jobs/shape_variants.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "absl/strings/str_cat.h"

namespace fxdp::server {

ShapeVariants::ShapeVariants(v1::ExpandRequest request, Expander expand, int max_shapes)
    : request_(std::move(request)), expand_(std::move(expand)), max_shapes_(max_shapes) {
  graph_.Swap(request_.mutable_graph());
  request_.clear_graph();
}

void ShapeVariants::Pin(const ir::InputShapes& shapes,
                        std::shared_ptr<const v1::ExpandResponse> expanded, double compile_ms) {
  const std::string text = ir::InputShapesText(shapes, " ");
  pinned_ = std::make_unique<Entry>(Entry{shapes, {0, std::move(expanded), text, false, 0}});
  Seen(text)->set_compile_ms(compile_ms);
}

v1::CompiledShape* ShapeVariants::Seen(const std::string& text) {
  auto [it, added] = seen_index_.emplace(text, seen_.size());
  if (added) seen_.emplace_back().set_shape(text);
  return &seen_[it->second];
}

absl::StatusOr<ShapeVariant> ShapeVariants::Get(const ir::InputShapes& shapes) {
  if (pinned_ != nullptr && pinned_->shapes == shapes) {
    ++hits_;
    Seen(pinned_->variant.shape)->set_steps(Seen(pinned_->variant.shape)->steps() + 1);
    return pinned_->variant;
  }
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    if (it->shapes != shapes) continue;
    lru_.splice(lru_.begin(), lru_, it);
    ++hits_;
    v1::CompiledShape* seen = Seen(it->variant.shape);
    seen->set_steps(seen->steps() + 1);
    return it->variant;
  }
  ++misses_;
  const std::string text = ir::InputShapesText(shapes, " ");
  if (max_graphs() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the batch is ", text, ", but JobSpec.max_shapes is ", max_shapes_,
                     ": the job runs its traced shape only (", pinned_->variant.shape,
                     "); raise max_shapes, or pad every batch to the traced shape"));
  }
  absl::StatusOr<ShapeVariant> v = Compile(shapes, text);
  if (!v.ok()) return v.status();
  lru_.push_front({shapes, *v});
  lru_.front().variant.compiled = false;  // what a later Get (a hit) gives
  while (static_cast<int>(lru_.size()) > max_graphs()) {
    Seen(lru_.back().variant.shape)->set_evicted(true);
    lru_.pop_back();
  }
  return v;
}

absl::StatusOr<ShapeVariant> ShapeVariants::Compile(const ir::InputShapes& shapes,
                                                    const std::string& text) {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<v1::GraphDef> graph = ir::InstantiateDef(graph_, shapes);
  if (!graph.ok()) return graph.status();
  v1::ExpandRequest request = request_;
  request.mutable_graph()->Swap(&*graph);
  absl::StatusOr<v1::ExpandResponse> expanded = expand_(request);
  if (!expanded.ok()) {
    return absl::Status(expanded.status().code(),
                        absl::StrCat("the graph at ", ir::InputShapesText(shapes), ": ",
                                     expanded.status().message()));
  }
  if (expanded->graphs_size() == 0) {
    return absl::InternalError(
        absl::StrCat("the expansion at ", ir::InputShapesText(shapes), " returned no graph"));
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  v1::CompiledShape* seen = Seen(text);
  seen->set_steps(seen->steps() + 1);
  seen->set_compile_ms(ms);
  seen->set_evicted(false);
  return ShapeVariant{next_id_++, std::make_shared<const v1::ExpandResponse>(*std::move(expanded)),
                      text, true, ms};
}

RankPrograms::Use RankPrograms::Run(int rank, uint32_t graph_id) {
  if (graph_id == 0) return {};
  std::list<uint32_t>& held = held_[rank];
  for (auto it = held.begin(); it != held.end(); ++it) {
    if (*it != graph_id) continue;
    held.splice(held.end(), held, it);  // most recently used last
    return {};
  }
  Use use{true, 0};
  if (static_cast<int>(held.size()) >= std::max(max_, 1)) {
    use.evict = held.front();
    held.pop_front();
  }
  held.push_back(graph_id);
  return use;
}

}  // namespace fxdp::server
