// JobSpec.eval (docs/evaluation.md): an evaluation graph the ranks run
// against the job's current state after every `every`-th step and after the
// last, over evaluation batches on the workers. Checked against the training
// graph and expanded like it (the job's world size, style and batch-norm
// setting), so that each rank's evaluation program reads exactly the state
// tensors (whole or its flat shard) its training program holds. No gRPC here.
#ifndef FXDP_SERVER_JOBS_EVAL_SPEC_H_
#define FXDP_SERVER_JOBS_EVAL_SPEC_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "proto/fxdp/v1/compile.pb.h"
#include "proto/fxdp/v1/jobs.pb.h"
#include "server/jobs/job_spec.h"

namespace fxdp::server {

// The most evaluations one job runs (steps / every, plus the last), so that
// JobInfo.evals stays bounded.
inline constexpr int64_t kMaxEvaluations = 10000;

// Whether the ranks evaluate after run step `run_step` of a job whose steps
// before this run are `first_step` and whose run has `steps` steps: every
// `every`-th job step, and the last.
bool EvalDue(const v1::EvalPolicy& eval, int64_t first_step, int64_t run_step, int64_t steps);

// `spec.eval` checked and its graph expanded: INVALID_ARGUMENT naming the
// field for a bad `every`, missing or bad data_paths, a job without a step
// count (JobSpec.steps 0: the last step is not known ahead), or a graph that
// is not an evaluation graph of `train_graph`: an UPDATED_* output (it would
// change the state), a HYPERPARAMETER placeholder, or a state placeholder
// that the training graph lacks or declares with another dtype or shape
// (both named). FULLY_SHARD: every state tensor both graphs read is sharded
// by both or by neither (the rank holds one layout). The expansion's own
// status for a graph it refuses.
absl::StatusOr<v1::ExpandResponse> PrepareEval(const v1::JobSpec& spec,
                                               const v1::GraphDef& train_graph,
                                               const v1::ExpandResponse& train_expanded,
                                               const Expander& expand);

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_EVAL_SPEC_H_
