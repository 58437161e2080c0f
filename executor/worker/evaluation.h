// Evaluation while a job trains (AssignJob.eval, docs/evaluation.md): this
// rank's evaluation program (the expanded graph of fxdp.trace_eval: forward
// and metrics, no UPDATED_* output), run over this rank's rows of every
// evaluation batch against the training state as it is, untouched: its
// tensors are read, never moved or written (the interpreter overwrites an
// input in place only when nothing else holds it, interpreter.h, and the
// training StepRunner holds every state tensor). A FULLY_SHARD rank holds
// flat shards, which the evaluation graph, expanded like the training graph,
// all-gathers before use as the forward does.
#ifndef FXDP_EXECUTOR_WORKER_EVALUATION_H_
#define FXDP_EXECUTOR_WORKER_EVALUATION_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/interpreter.h"
#include "executor/worker/dataset.h"
#include "executor/worker/named_outputs.h"
#include "proto/fxdp/v1/worker.pb.h"

namespace fxdp::executor {

class Evaluation {
 public:
  // `every` as EvalPolicy.every; `program` with the names of its metrics.
  Evaluation(Program program, NamedOutputs names, int64_t every)
      : program_(std::move(program)), names_(std::move(names)), every_(every) {}

  // Whether the state after job step `job_step` is evaluated: every
  // `every`-th step, and the job's last.
  bool Due(int64_t job_step, bool last) const {
    return last || (every_ > 0 && job_step % every_ == 0);
  }
  const Program& program() const { return program_; }
  // The evaluation batches: files (this rank's shard of each), or a dataset
  // read batch by batch.
  void SetData(std::vector<TensorMap> files, std::optional<DatasetReader> dataset) {
    files_ = std::move(files);
    dataset_ = std::move(dataset);
  }
  int64_t num_batches() const {
    return dataset_ ? dataset_->num_steps() : static_cast<int64_t>(files_.size());
  }

  // Every batch run against `state` (by state name; only read): the LOSS
  // output as "loss", then the named 0-d outputs, each summed over the
  // batches in batch order (EvalResult.metrics; its step, batches and
  // eval_ms are the caller's). A state tensor the graph reads that `state`
  // lacks is FAILED_PRECONDITION naming it; a batch error names the batch.
  absl::StatusOr<std::vector<std::pair<std::string, double>>> Run(const TensorMap& state);

 private:
  absl::StatusOr<std::vector<c10::IValue>> Inputs(const TensorMap& state, const TensorMap& batch,
                                                  int64_t b) const;

  Program program_;
  NamedOutputs names_;
  int64_t every_ = 0;
  std::vector<TensorMap> files_;
  std::optional<DatasetReader> dataset_;
};

}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_WORKER_EVALUATION_H_
