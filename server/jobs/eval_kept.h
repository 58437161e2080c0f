// Evaluating a finished job's kept state on the workers, the state never
// passing through the client (docs/evaluation.md): a Submit whose
// JobSpec.resume_job names the job and whose graph is an evaluation graph
// (fxdp.trace_eval: no UPDATED_* output). The new job starts from the state
// that job kept (a SUCCEEDED job's final state; a FAILED or CANCELLED one's
// last completed step's), only the tensors the evaluation graph reads, and
// runs its steps (one per evaluation batch: streamed, data_paths or a
// dataset) as any job; its state comes back unchanged. Unlike a resume
// (job_resume.h) it claims nothing (a state may be evaluated many times, also
// while another job resumes it), needs no --state-dir, and counts its own
// steps from 1. No gRPC here.
#ifndef FXDP_SERVER_JOBS_EVAL_KEPT_H_
#define FXDP_SERVER_JOBS_EVAL_KEPT_H_

#include "absl/status/statusor.h"
#include "proto/fxdp/v1/graph.pb.h"
#include "proto/fxdp/v1/jobs.pb.h"
#include "server/jobs/job.h"
#include "server/jobs/job_table.h"
#include "server/jobs/state_store.h"

namespace fxdp::server {

// Whether `graph` changes no state: no UPDATED_* output.
bool IsEvaluationGraph(const v1::GraphDef& graph);

// The state job `spec.resume_job` kept, limited to the tensors `spec.graph`
// reads: NOT_FOUND for an unknown job or another identity's (as GetJob),
// FAILED_PRECONDITION when it keeps no state (its reason), INVALID_ARGUMENT
// when the client sends state too (JobSpec.num_state_tensors) or a tensor the
// graph reads is missing from the kept state or declared differently (both
// named).
absl::StatusOr<StateStore::State> KeptStateToEvaluate(const JobTable& table, const JobOwner& caller,
                                                      const v1::JobSpec& spec);

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_EVAL_KEPT_H_
