// Resuming a FAILED or CANCELLED job from its checkpoint (the state of its
// last completed step, or its last --checkpoint-every one) (JobSpec.resume_job,
// fxdp.Client.train(resume=JOB)): the checks a resume
// Submit passes (the job exists, the caller may act on it, it FAILED and
// kept a checkpoint, the new spec runs the same graph the same way) and what
// the new job starts from: the checkpoint's state, its step, and the resumed
// job's losses up to it. A job whose workers wrote its checkpoints
// (JobSpec.checkpoints) and that kept no state on the server resumes from the
// newest one they completed (JobInfo.checkpoint_path), read by the new job's
// workers as an initial_checkpoint of every state tensor: on any world size
// and style (resharded as read), its step counter, schedule position and
// random draws going on from that step. The new job has its own id (JobInfo.resumed_from
// names the old one; the old one stays FAILED, with its checkpoint, until it
// leaves the history). No gRPC here.
#ifndef FXDP_SERVER_JOBS_JOB_RESUME_H_
#define FXDP_SERVER_JOBS_JOB_RESUME_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/fxdp/v1/checkpoint.pb.h"
#include "proto/fxdp/v1/graph.pb.h"
#include "proto/fxdp/v1/jobs.pb.h"
#include "proto/fxdp/v1/worker.pb.h"
#include "server/jobs/job.h"
#include "server/jobs/job_store.h"
#include "server/jobs/job_table.h"

namespace fxdp::server {

struct ResumeStart {
  std::string from;                    // the resumed job
  int64_t step = 0;                    // its checkpoint's step
  std::vector<v1::TensorChunk> state;  // the checkpoint (whole tensors)
  // Or the checkpoint the resumed job's workers wrote: every state tensor
  // read from it by the new job's workers (`state` empty).
  std::optional<v1::CheckpointSource> on_workers;
  std::vector<double> losses;          // the resumed job's losses of steps 1 ... step
  std::vector<v1::EvalMetrics> evals;  // its evaluations after steps <= step (JobSpec.eval)
};

// Checks `spec` (as submitted: with its graph; resume_job set) against the
// job it resumes, in this order: NOT_FOUND (unknown job), PERMISSION_DENIED
// (another identity's, docs/security.md), FAILED_PRECONDITION (no
// --state-dir, a job that did not fail and was not cancelled, no checkpoint), INVALID_ARGUMENT
// (state sent, a different graph, world size, style or sync_batchnorm, no
// step left; world size and style may differ for a checkpoint on the workers), naming what differs;
// last, FAILED_PRECONDITION when another job resumes it already (queued, running, or its Submit not
// yet queued) or resumed it and SUCCEEDED, naming that job; a resume that FAILED or was CANCELLED
// leaves the job resumable. Passing claims the job for `self` (the new job). `checkpoint_every`
// (the server's flag) only words the messages.
absl::StatusOr<ResumeStart> PrepareResume(const JobTable& table, JobStore* store,
                                          const JobOwner& caller, const v1::JobSpec& spec,
                                          int64_t checkpoint_every,
                                          const std::shared_ptr<Job>& self);

// The checkpoint at `path` as the initial_checkpoint of every state tensor of
// `graph` (a checkpoint the workers wrote holds each under its state name).
v1::CheckpointSource WholeStateFrom(const std::string& path, const v1::GraphDef& graph);

// "" when the two graphs have the same nodes (producer and metadata are not
// compared), else what differs first: a state tensor or input (its name and
// both types), the number of nodes, or the first node that differs (its
// name, index and target in both).
std::string GraphDifference(const v1::GraphDef& before, const v1::GraphDef& now);

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_JOB_RESUME_H_
