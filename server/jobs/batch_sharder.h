// BatchSharder: server-side slicing of a job's global batches. It takes a
// step's StepBatch messages from the client, checks them against the graph's
// INPUTs (names, dtypes, global shapes, chunking, hyper-parameter names and
// values; a graph with symbolic sizes: the static dims only, the step's
// shapes then go to ShapeVariants, whose instantiation checks the rest),
// assembles the global tensors, and cuts each rank its rows along each
// INPUT's batch dim (RankRowsOf: ir::RankRows of the step's batch, the
// balanced split of expansion/ or with micro-batches its share of each, as
// the shape's rank graphs declare them; the whole tensor for an input
// without a batch dim), as Batch messages of at most chunk_bytes of tensor
// data (`more` on all but the last) that carry the step's hyper-parameters
// (the schedule's, overridden by the batch's) and the program that runs it
// (Batch.graph_id). A ragged input (ragged_batch.h) goes to each rank as its
// bags' part, its offsets rebased (CutRagged). Errors are INVALID_ARGUMENT
// naming the step, the tensor and what was expected. Not thread-safe (one per job runner). No gRPC
// here.
#ifndef FXDP_SERVER_JOBS_BATCH_SHARDER_H_
#define FXDP_SERVER_JOBS_BATCH_SHARDER_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "analysis/ir/batch_split.h"
#include "analysis/ir/hyperparameters.h"
#include "analysis/ir/instantiate.h"
#include "proto/fxdp/v1/compile.pb.h"
#include "proto/fxdp/v1/jobs.pb.h"
#include "proto/fxdp/v1/worker.pb.h"
#include "server/jobs/job_spec.h"
#include "server/jobs/ragged_batch.h"
#include "server/jobs/raw_tensors.h"

namespace fxdp::server {

// The micro-batch size (rows) the expansion wrote into the rank graphs of
// `expanded` (ir::kMicroBatchKey), 0 when the step has none. Each shape of a
// symbolic graph has its own (x.chunk(k) of 8 rows: 4; of 6 rows: 3).
// INTERNAL when the key is not a number.
absl::StatusOr<int64_t> MicroBatchOf(const v1::ExpandResponse& expanded);

// Rank r's rows of each batch INPUT with a batch dim (by name; [r]: the
// ranges of the global batch rank r holds, in its graph's order): ir::RankRows
// of the step's global batch (`shapes`) with the micro-batch size of
// `expanded` (MicroBatchOf), checked against the rows each rank graph of
// `expanded` declares (its INPUT placeholder's size along the batch dim).
// INTERNAL when a rank graph lacks the input or declares other rows.
// (RankRows: ragged_batch.h.)
absl::StatusOr<RankRows> RankRowsOf(const v1::ExpandResponse& expanded, int world,
                                    const std::vector<InputSpec>& inputs,
                                    const ir::InputShapes& shapes);

// A global batch input of `dtype` and `shape` against `in`: a static graph's
// exactly, a symbolic one's dtype, rank and static dims (instantiation checks
// the rest); INVALID_ARGUMENT prefixed with `what`, naming both types and what
// to do.
absl::Status CheckInputShape(const std::string& what, const InputSpec& in, v1::DType dtype,
                             const std::vector<int64_t>& shape);

class BatchSharder {
 public:
  // The pointees outlive the sharder.
  BatchSharder(std::string job_id, int world_size, size_t chunk_bytes,
               const std::vector<InputSpec>* inputs, const ir::PlaceholderNames* placeholders,
               const ir::Schedule* schedule)
      : job_id_(std::move(job_id)),
        world_(world_size),
        chunk_bytes_(chunk_bytes),
        inputs_(inputs),
        placeholders_(placeholders),
        schedule_(schedule) {}

  // The most bytes one step's global batch may hold (fxdp-server
  // --max-batch-mb): a graph with symbolic sizes declares no bound itself.
  void set_max_batch_bytes(uint64_t bytes) { max_batch_bytes_ = bytes; }
  // A resumed job runs the job's steps first_step + 1, ...: its client's
  // StepBatch.step and its schedule count them, its workers count from 1.
  void set_first_step(int64_t first_step) { first_ = first_step; }
  // One client message of run step `step`'s batch (steps count from 1,
  // consecutively; the client numbers it first_step + step). True when it
  // completed the step: then RankBatch gives each rank its messages, until
  // the next step's first message.
  absl::StatusOr<bool> Add(int64_t step, const v1::SubmitJobRequest& request);
  // Part of a step's batch was received (its last StepBatch had `more`).
  bool in_step() const { return batch_ != nullptr; }
  // The completed step's global batch shapes (every INPUT by name).
  const ir::InputShapes& shapes() const { return shapes_; }
  // The completed step's ragged inputs `ragged` (RaggedOf of its shape's
  // rank graphs) cut for each rank by its `rows` of their offsets
  // (CutRaggedBatch): RankBatch then sends each rank its bags' part of each
  // and its offsets rebased. INVALID_ARGUMENT naming the step, the inputs and
  // the element. Before the step's first RankBatch, so that no rank gets a
  // message of a step refused.
  absl::Status CutRagged(const ir::RaggedInputs& ragged, const RankRows& rows);
  // The completed step's Batch messages for `rank`: its `rows`
  // (RankRowsOf) and its part of the ragged inputs (CutRagged), run by
  // program `graph_id`.
  absl::StatusOr<std::vector<v1::ServerMessage>> RankBatch(int rank, const RankRows& rows,
                                                           uint32_t graph_id = 0);
  // The completed step's global tensors are no longer needed.
  void Clear() {
    tensors_.clear();
    ragged_ = {};
  }

  // The Batch of a data_paths job's step: no tensors (the workers read their
  // files), the schedule's hyper-parameters of step `schedule_step` (the
  // job's step counted from its start, for a resumed job).
  v1::ServerMessage ScheduleOnlyBatch(int64_t step, int64_t schedule_step) const;

 private:
  const InputSpec* FindInput(const std::string& name) const;
  // The step's batch with the tensor `name` just started, against
  // max_batch_bytes_ (RESOURCE_EXHAUSTED).
  absl::Status CountBytes(const std::string& what, const std::string& name);

  const std::string job_id_;
  const int world_;
  const size_t chunk_bytes_;
  const std::vector<InputSpec>* const inputs_;
  const ir::PlaceholderNames* const placeholders_;
  const ir::Schedule* const schedule_;
  std::unique_ptr<ChunkStream> batch_;        // the step being read
  std::map<std::string, double> step_hyper_;  // its StepBatch.hyperparameters
  int64_t step_ = 0;                          // the completed step (run step)
  int64_t first_ = 0;                         // steps done before this run
  std::vector<RawTensor> tensors_;            // its global tensors
  ir::InputShapes shapes_;                    // their shapes
  RaggedCuts ragged_;                         // its ragged inputs' cuts
  uint64_t step_bytes_ = 0;                   // of the step being read
  uint64_t max_batch_bytes_ = UINT64_MAX;
  ir::HyperparameterValues hyper_;  // its hyper-parameters
};

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_BATCH_SHARDER_H_
