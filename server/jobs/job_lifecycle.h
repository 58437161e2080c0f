// A job's lifecycle, in one place: every state a job can be in, what each
// state means for its record (terminal, a final state, a checkpoint kept),
// and every change (JobChange) with the states it moves between. Nothing else
// sets JobInfo.state: Job::Change applies a change here under the job's lock,
// and a change the table does not list is refused with a message naming
// both states (the job keeps its state).
//
//   from         change     to          kept             made by
//   (new)        kQueue     QUEUED      -                JobTable::Add: the Submit was queued
//   QUEUED       kStart     RUNNING     -                JobRunner::Run: its workers are assigned
//   QUEUED       kFail      FAILED      -                the scheduler (too few workers), the
//                                                        runner before it started (memory, a lost
//                                                        worker), Recover (the queue is full)
//   QUEUED       kCancel    CANCELLED   -                CancelJob, or the client went away
//   RUNNING      kSucceed   SUCCEEDED   final state      JobRunner: the final state and the
//                                                        record are durable
//   RUNNING      kFail      FAILED      last step's      JobRunner: a rank failed or was lost, bad
//                                                        client input, an idle client, the state
//                                                        not saved; a server restart
//   RUNNING      kCancel    CANCELLED   last step's      CancelJob, or the client went away
//   RUNNING      kRequeue   QUEUED      -                a server restart: a data_paths job
//                                                        resumes from its checkpoint
//
// "kept" is what the change keeps of the job's state (StateKept): the final
// state, or the state of its last completed step (kLastStep): collected from
// the ranks before they are let go when they can give it (they are alive and
// between steps: the runner lets the steps sent finish first), else its last
// checkpoint; kept as its checkpoint (JobInfo.checkpoint_step names the
// step, has_state says it can be fetched). A job whose workers write its
// checkpoints (JobSpec.checkpoints) keeps the newest checkpoint they
// completed instead, on their filesystem (JobInfo.checkpoint_path): none of
// its state is collected, and its error names the steps after it as lost.
//
// SUCCEEDED, FAILED and CANCELLED are terminal: no change leaves them. Only
// a SUCCEEDED job has a final state; a FAILED or CANCELLED one keeps its
// checkpoint (to be fetched, FetchState, and resumed: job_resume.h).
#ifndef FXDP_SERVER_JOBS_JOB_LIFECYCLE_H_
#define FXDP_SERVER_JOBS_JOB_LIFECYCLE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/fxdp/v1/jobs.pb.h"

namespace fxdp::server {

// What happens to a job (not the wire's v1::JobEvent, which tells a client).
enum class JobChange { kQueue, kStart, kSucceed, kFail, kCancel, kRequeue };

// One row of the lifecycle: `change` moves a job in state `from` to `to`.
// What a change keeps of the job's state (the table's "kept").
enum class StateKept { kNothing, kFinal, kLastStep };

// One row of the lifecycle: `change` moves a job in state `from` to `to`,
// keeping `kept` of its state.
struct JobTransition {
  v1::JobState from;
  JobChange change;
  v1::JobState to;
  StateKept kept;
};

// Every allowed change, the table above.
const std::vector<JobTransition>& JobTransitions();

// "QUEUED" (a new job, JOB_STATE_UNSPECIFIED: "NEW"); "kFail" -> "fail".
std::string StateName(v1::JobState s);
absl::string_view ChangeName(JobChange c);

// What a state means.
bool Terminal(v1::JobState s);         // SUCCEEDED, FAILED, CANCELLED
bool HasFinalState(v1::JobState s);    // SUCCEEDED: its final state is kept
bool KeepsCheckpoint(v1::JobState s);  // FAILED, CANCELLED: its checkpoint, to fetch and resume
bool Resumable(v1::JobState s);        // FAILED, CANCELLED (job_resume.h)
// What `change` from state `from` keeps of the state (kNothing when the
// table has no such row).
StateKept KeptBy(v1::JobState from, JobChange change);

// Applies `change` to a job's info: its state and what each state shows
// (the error and its code from `status`, the queue place and message only
// while QUEUED, the start and end times, no checkpoint once it ended in a
// state that keeps none). FAILED_PRECONDITION naming both states when the
// table has no such row; then `info` is unchanged.
absl::Status ApplyChange(v1::JobInfo* info, JobChange change, const absl::Status& status);

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_JOB_LIFECYCLE_H_
