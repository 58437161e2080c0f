// ShapeVariants: one job's graph compiled per batch shape (docs/shapes.md,
// build plan step 5). A job submitted with a graph traced with symbolic sizes
// runs every batch shape its guards allow; each shape's rank graphs are the
// symbolic graph instantiated at it (analysis/ir/instantiate.h), then
// analysed and expanded as any static graph (the job's Expander, the compile
// service's cached Expand). The last `max_shapes` shapes are kept (least
// recently used first out), so a shape seen again costs a lookup. Every
// variant has the same state (instantiation refuses a symbolic size on
// state), so the state never moves between them. A static graph has one
// variant: its own shape. Not thread-safe (one per job runner).
#ifndef FXDP_SERVER_JOBS_SHAPE_VARIANTS_H_
#define FXDP_SERVER_JOBS_SHAPE_VARIANTS_H_

#include <cstdint>
#include <list>
#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "analysis/ir/instantiate.h"
#include "proto/fxdp/v1/compile.pb.h"
#include "server/jobs/job_spec.h"

namespace fxdp::server {

inline constexpr int kDefaultMaxShapes = 16;

class ShapeVariants {
 public:
  // `request`: the job's ExpandRequest with its (symbolic) graph; `expand`
  // outlives this object.
  ShapeVariants(v1::ExpandRequest request, Expander expand, int max_shapes = kDefaultMaxShapes)
      : request_(std::move(request)), expand_(std::move(expand)), max_shapes_(max_shapes) {}

  // The rank graphs at `shapes` (every INPUT with a symbolic dim named), from
  // the cache or compiled now. Errors: instantiation's (INVALID_ARGUMENT naming
  // the shapes, the guard and what to do) and the expansion's, prefixed with
  // the shapes.
  absl::StatusOr<std::shared_ptr<const v1::ExpandResponse>> Get(const ir::InputShapes& shapes);

  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }
  int size() const { return static_cast<int>(lru_.size()); }

 private:
  using Entry = std::pair<ir::InputShapes, std::shared_ptr<const v1::ExpandResponse>>;
  const v1::ExpandRequest request_;
  const Expander expand_;
  const int max_shapes_;
  std::list<Entry> lru_;  // front: most recently used; at most max_shapes_ (<= 64 by default)
  int64_t hits_ = 0, misses_ = 0;
};

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_SHAPE_VARIANTS_H_
