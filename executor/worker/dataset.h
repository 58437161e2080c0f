// A dataset directory (docs/datasets.md): safetensors shards and an index,
// DIR/index.json, that says where each step's global batch is:
//
//   {"fxdp_dataset": 1,
//    "steps": [{"file": "shard-00000.safetensors", "rows": [0, 8]}, ...]}
//
// An entry may say its global batch's shape, "shape": {"x": [8, 6], ...}
// (every tensor's dims, rows first; fxdp.write_dataset writes it): a job whose
// graph has symbolic sizes learns each step's shape from it (rank 0 reports
// them, AllEntryShapes), and every step checks it against the shard.
//
// Step i (1-based) of a job uses entry (i - 1) mod the number of entries: rows
// [begin, end) along dim 0 of every tensor of `file` named by an INPUT
// placeholder's state name. A rank reads only its rows of those (ir::RankRows:
// its balanced slice, or its share of each micro-batch), as byte ranges of
// the shard, and only when the step runs: one step's rows are held at a time,
// never the epoch.
//
// What comes from the index is untrusted (a job's data_paths name it): the
// index is at most kMaxDatasetIndexBytes, shard names are relative paths
// without "." or ".." components, shards are opened like any data file (under
// the worker's data roots when given: util::DataRoots), and the bytes a step
// reads are checked against the rank's graph (dtype, trailing dims, rows
// present in the shard) and against `max_step_bytes` before any is read.
// Errors name the dataset, the shard, the tensor, the step and the rank, with
// what was expected and what was found.
#ifndef FXDP_EXECUTOR_WORKER_DATASET_H_
#define FXDP_EXECUTOR_WORKER_DATASET_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "analysis/ir/instantiate.h"
#include "analysis/ir/safetensors.h"
#include "executor/interpreter.h"
#include "executor/step_runner.h"
#include "util/data_roots.h"

namespace fxdp::executor {

inline constexpr char kDatasetIndexName[] = "index.json";
inline constexpr uint64_t kMaxDatasetIndexBytes = uint64_t{64} << 20;
inline constexpr int64_t kMaxDatasetSteps = int64_t{1} << 24;

inline constexpr size_t kMaxDatasetShapeTensors = 1024;  // names in one entry's "shape"

struct DatasetStep {
  std::string file;  // relative to the dataset directory
  int64_t begin = 0, end = 0;
  int32_t shape = -1;  // its "shape": an index into DatasetIndex::shapes; -1: none given
};

struct DatasetIndex {
  std::vector<DatasetStep> steps;
  std::vector<ir::InputShapes> shapes;  // the distinct "shape"s, first given first
};

// The index's text parsed and checked (INVALID_ARGUMENT naming `where` and
// the entry otherwise): a "shape" has 1 to kMaxDatasetShapeTensors names of 1
// to 256 bytes, each with 1 to ir::kMaxRank dims, the first its rows.
absl::StatusOr<DatasetIndex> ParseDatasetIndex(const std::string& text, const std::string& where);

class DatasetReader {
 public:
  struct Options {
    const util::DataRoots* roots = nullptr;  // null: files the operator named
    int rank = 0, world_size = 1;
    int64_t step_offset = 0;  // a resumed job's steps done: job step i reads entry i + offset - 1
    uint64_t max_step_bytes = std::numeric_limits<uint64_t>::max();
    std::string what = "--data";  // how errors name the dataset's origin
  };
  // Reads DIR/index.json and checks that every INPUT of `program` has its
  // batch on dim 0 (the dataset's rows).
  static absl::StatusOr<DatasetReader> Open(const std::string& dir, const Program& program,
                                            Options options);
  int64_t num_steps() const { return static_cast<int64_t>(steps_.size()); }
  // This rank's rows of the batch of job step `step` (1-based; entry
  // (step - 1) mod num_steps()), as CPU tensors with the shapes of
  // `program` (the one Open checked, or one of the same INPUTs for another
  // batch shape).
  absl::StatusOr<TensorMap> ReadStep(int64_t step, const Program& program);
  // The global batch of job step `step` as shapes: each INPUT of `program`
  // with the step's row count and the shard's trailing dims (what the graph
  // expanded for this step takes: ir::kInputShapesKey). Reads the header only.
  absl::StatusOr<ir::InputShapes> StepShapes(int64_t step, const Program& program);
  // Every index entry's global batch shape (AssignJob.report_dataset_shapes),
  // each distinct one once: each INPUT of `program` by name, from the
  // entry's "shape" (which must name every INPUT), else as StepShapes.
  struct EntryShapes {
    std::vector<ir::InputShapes> shapes;
    std::vector<uint32_t> entries;  // per index entry, its position in `shapes`
  };
  absl::StatusOr<EntryShapes> AllEntryShapes(const Program& program);

 private:
  DatasetReader() = default;
  absl::Status OpenShard(const std::string& file);
  // Step `step`'s index entry, its shard opened, and how errors name it.
  absl::StatusOr<const DatasetStep*> Locate(int64_t step, std::string* where);
  absl::StatusOr<const DatasetStep*> LocateEntry(size_t index, int64_t step, std::string* where);
  // The step's rows and shard's trailing dims of `program`'s INPUT `in`.
  absl::StatusOr<std::vector<int64_t>> ShardShape(const DatasetStep& s, const ProgramInput& in,
                                                  const std::string& where) const;
  // The entry's "shape" (if given) against its shard, for every INPUT of
  // `program`: INVALID_ARGUMENT naming the step, the tensor and both shapes.
  absl::Status CheckIndexShape(const DatasetStep& s, const Program& program,
                               const std::string& where) const;
  // The open shard's tensor `name`, or INVALID_ARGUMENT naming it.
  absl::StatusOr<const ir::SafetensorsEntry*> Entry(const ProgramInput& in,
                                                    const std::string& where) const;
  std::string dir_;
  Options o_;
  std::vector<DatasetStep> steps_;
  std::vector<ir::InputShapes> shapes_;  // the index's distinct "shape"s
  std::string shard_name_;               // the shard open now ("" none)
  std::unique_ptr<ir::SafetensorsReader> shard_;
};

}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_WORKER_DATASET_H_
