// Evaluation while a job trains, on the job's thread (AssignJob.eval,
// evaluation.h, docs/evaluation.md): the evaluation program loaded and its
// batches read with the job's set-up; after every due step, right after the
// step's StepResult and before the job's next event (a Batch, a FetchState),
// every rank runs it against its current state and answers an EvalResult.
// Every rank evaluates after the same steps, so the evaluation graph's
// collectives meet as the training graph's do.
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "analysis/ir/proto_codec.h"
#include "executor/worker/attach_worker.h"
#include "util/status_macros.h"

namespace fxdp::executor::attach {

absl::Status AttachedWorker::SetUpEval(AssignedJob& job, const RankSetup& setup,
                                       Communicator* comm) {
  const v1::EvalPolicy& policy = job.assign.eval();
  if (policy.every() < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("AssignJob.eval.every must be >= 0, got ", policy.every()));
  absl::StatusOr<ir::Graph> graph = ir::DecodeGraph(policy.graph());
  if (!graph.ok())
    return absl::Status(
        graph.status().code(),
        absl::StrCat("the evaluation graph does not decode or verify: ", graph.status().message()));
  FXDP_ASSIGN_OR_RETURN(Program program, LoadRankProgram(*graph, setup, comm));
  FXDP_ASSIGN_OR_RETURN(NamedOutputs names, NamedOutputs::Of(*graph, program.output_specs()));
  graph = absl::StatusOr<ir::Graph>();
  auto eval = std::make_unique<Evaluation>(std::move(program), std::move(names), policy.every());
  FXDP_ASSIGN_OR_RETURN(
      std::optional<DatasetReader> dataset,
      OpenDataset(job, eval->program(), /*step_offset=*/0, policy.data_paths(), "eval.data_paths"));
  std::vector<TensorMap> files;
  if (!dataset) {
    FXDP_ASSIGN_OR_RETURN(files, ReadDataFiles(job, eval->program(), policy.data_paths(),
                                               "eval.data_paths", &job.data_bytes));
  }
  eval->SetData(std::move(files), std::move(dataset));
  util::Log(job.Prefix(), "evaluation: ", eval->program().num_nodes(), " ops, ",
            eval->num_batches(), " batches, every ", policy.every(), " steps and after the last");
  job.eval = std::move(eval);
  job.assign.mutable_eval()->clear_graph();
  return absl::OkStatus();
}

absl::Status AttachedWorker::MaybeEvaluate(AssignedJob& job, const StepRunner& runner,
                                           int64_t step) {
  if (!job.eval || !job.eval->Due(job.step_offset + step, job.steps > 0 && step == job.steps))
    return absl::OkStatus();
  job.in_step = true;  // a failure names the step
  const auto t0 = Clock::now();
  absl::StatusOr<std::vector<std::pair<std::string, double>>> metrics =
      job.eval->Run(runner.state());
  if (!metrics.ok()) return metrics.status();
  const double ms = MsSince(t0);
  job.in_step = false;
  WorkerMessage m;
  v1::EvalResult* r = m.mutable_eval_result();
  r->set_job_id(job.id);
  r->set_rank(job.rank);
  r->set_step(step);
  r->set_batches(job.eval->num_batches());
  r->set_eval_ms(ms);
  AddNamedValues(*metrics, r->mutable_metrics());
  job.session->Write(m);
  util::Log(job.Prefix(), "evaluated", NamedValuesText(*metrics), " (summed over ",
            job.eval->num_batches(), " batches, ", absl::StrFormat("%.1f", ms), " ms)");
  return absl::OkStatus();
}

}  // namespace fxdp::executor::attach
