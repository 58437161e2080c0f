// ShapeVariants: one job's graph compiled per batch shape (docs/shapes.md,
// build plan step 5). A job submitted with a graph traced with symbolic sizes
// runs every batch shape its guards allow; each shape's rank graphs are the
// symbolic graph instantiated at it (analysis/ir/instantiate.h), then
// analysed and expanded as any static graph (the job's Expander, the compile
// service's cached Expand). The job's traced example shape is pinned (Pin:
// graph 0, the one AssignJob carries, which every worker keeps); the other
// shapes take ids 1, 2, ... (LoadGraph.graph_id, a new id per compile) and the
// least recently used go once max_shapes are kept in all, so a shape seen
// again costs a lookup, one evicted a compile. Every variant has the same
// state (instantiation refuses a symbolic size on state), so the state never
// moves between them. RankPrograms: which of those programs each rank holds,
// so that a rank is sent a LoadGraph once per program and never holds more
// than its AssignJob.max_graphs. Neither is thread-safe (one per job runner).
#ifndef FXDP_SERVER_JOBS_SHAPE_VARIANTS_H_
#define FXDP_SERVER_JOBS_SHAPE_VARIANTS_H_

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "analysis/ir/instantiate.h"
#include "proto/fxdp/v1/compile.pb.h"
#include "proto/fxdp/v1/jobs.pb.h"
#include "server/jobs/job_spec.h"

namespace fxdp::server {

// One shape's rank graphs, as ShapeVariants::Get gives them.
struct ShapeVariant {
  uint32_t graph_id = 0;  // 0: the pinned shape's (AssignJob.graph); else a LoadGraph's
  std::shared_ptr<const v1::ExpandResponse> expanded;
  std::string shape;      // "input_ids=8x60 labels=8x60" (JobEvent.shape)
  bool compiled = false;  // compiled by this Get (a miss)
  double compile_ms = 0;  // then: instantiate + analyze + expand
};

class ShapeVariants {
 public:
  // `request`: the job's ExpandRequest with its (symbolic) graph; at most
  // `max_shapes` shapes kept compiled, the pinned one included.
  ShapeVariants(v1::ExpandRequest request, Expander expand, int max_shapes = kDefaultMaxShapes);

  // The shape of graph 0 (AssignJob's), compiled in `compile_ms`: kept while
  // the job lives.
  void Pin(const ir::InputShapes& shapes, std::shared_ptr<const v1::ExpandResponse> expanded,
           double compile_ms);
  // The rank graphs at `shapes` (the batch's every INPUT named), from the
  // cache or compiled now; one step counted for the shape. Errors:
  // instantiation's (INVALID_ARGUMENT naming the shapes, the guard and what to
  // do), the expansion's prefixed with the shapes, and INVALID_ARGUMENT for a
  // new shape when max_shapes is 1 and a shape is pinned.
  absl::StatusOr<ShapeVariant> Get(const ir::InputShapes& shapes);

  // Every shape compiled, first seen first (JobInfo.shapes).
  const std::vector<v1::CompiledShape>& compiled() const { return seen_; }
  // The programs a worker keeps besides graph 0 (AssignJob.max_graphs).
  int max_graphs() const { return std::max(max_shapes_ - (pinned_ ? 1 : 0), 0); }
  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }
  int size() const { return static_cast<int>(lru_.size()) + (pinned_ ? 1 : 0); }

 private:
  struct Entry {
    ir::InputShapes shapes;
    ShapeVariant variant;
  };
  absl::StatusOr<ShapeVariant> Compile(const ir::InputShapes& shapes, const std::string& text);
  // The shape's entry in seen_ (added when new).
  v1::CompiledShape* Seen(const std::string& text);

  v1::GraphDef graph_;         // the symbolic graph
  v1::ExpandRequest request_;  // the rest of the request
  const Expander expand_;
  const int max_shapes_;
  std::unique_ptr<Entry> pinned_;
  std::list<Entry> lru_;  // front: most recently used; at most max_graphs()
  std::vector<v1::CompiledShape> seen_;
  std::map<std::string, size_t> seen_index_;  // shape text -> index in seen_
  uint32_t next_id_ = 1;
  int64_t hits_ = 0, misses_ = 0;
};

// The LoadGraph programs each rank of a job holds besides graph 0, least
// recently used first out once a rank holds `max_graphs`.
class RankPrograms {
 public:
  RankPrograms(int world, int max_graphs) : held_(world), max_(max_graphs) {}
  struct Use {
    bool load = false;   // the rank lacks the program: send it a LoadGraph first
    uint32_t evict = 0;  // with it, the program it drops (LoadGraph.evict_graph_id; 0: none)
  };
  // Rank `rank` runs program `graph_id` next (0: AssignJob's, always held).
  Use Run(int rank, uint32_t graph_id);
  // The programs `rank` holds, least recently used first.
  const std::list<uint32_t>& held(int rank) const { return held_[rank]; }

 private:
  std::vector<std::list<uint32_t>> held_;
  const int max_;
};

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_SHAPE_VARIANTS_H_
