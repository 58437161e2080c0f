// The global batch shapes of a dataset's steps, for a job whose graph has
// symbolic sizes and whose workers read its batches from a dataset directory
// (docs/datasets.md, docs/shapes.md): rank 0 reads them from the dataset's
// index (each entry's "shape", else its shard's header) and reports them in
// its JobStarted (DatasetShapes); the server gives each step the program of
// its entry's shape (ShapeVariants) before it sends the step's Batch. What a
// worker reports is checked here before any of it is used: bounded counts,
// every shape naming exactly the graph's INPUTs with their rank and static
// dims (INVALID_ARGUMENT naming the dataset, the entry, the input and both
// shapes). Each rank still checks every step's rows against the program it
// runs, so a report that lies fails that step, naming it.
#ifndef FXDP_SERVER_JOBS_DATASET_SHAPES_H_
#define FXDP_SERVER_JOBS_DATASET_SHAPES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "analysis/ir/instantiate.h"
#include "proto/fxdp/v1/worker.pb.h"
#include "server/jobs/job_spec.h"

namespace fxdp::server {

// The most index entries a dataset has (the worker's bound, executor/worker/dataset.h).
inline constexpr int64_t kMaxDatasetEntries = int64_t{1} << 24;

class DatasetStepShapes {
 public:
  // `report` (rank 0's JobStarted.dataset_shapes of dataset `dataset`)
  // against the graph's `inputs`.
  static absl::StatusOr<DatasetStepShapes> Of(const v1::DatasetShapes& report,
                                              const std::vector<InputSpec>& inputs,
                                              const std::string& dataset);
  // Job step `job_step`'s (1-based) global batch: entry (job_step - 1) mod entries().
  const ir::InputShapes& At(int64_t job_step) const;
  int64_t entries() const { return static_cast<int64_t>(entries_.size()); }
  size_t distinct() const { return shapes_.size(); }

 private:
  std::vector<ir::InputShapes> shapes_;
  std::vector<uint32_t> entries_;
};

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_DATASET_SHAPES_H_
