// A job's lifecycle, in one place: every state a job can be in, what each
// state means for its record (terminal, a final state, a checkpoint kept),
// and every change (JobChange) with the states it moves between. Nothing else
// sets JobInfo.state: Job::Change applies a change here under the job's lock,
// and a change the table does not list is refused with a message naming
// both states (the job keeps its state).
//
//   from         change     to          made by
//   (new)        kQueue     QUEUED      JobTable::Add: the Submit was queued
//   QUEUED       kStart     RUNNING     JobRunner::Run: its workers are assigned
//   QUEUED       kFail      FAILED      the scheduler (too few workers), the runner before it
//                                       started (memory, a lost worker), Recover (the queue is
//                                       full)
//   QUEUED       kCancel    CANCELLED   CancelJob, or the client went away, while queued
//   RUNNING      kSucceed   SUCCEEDED   JobRunner: the final state and the record are durable
//   RUNNING      kFail      FAILED      JobRunner: a rank failed or was lost, bad client input,
//                                       an idle client, the state not saved; a server restart
//   RUNNING      kCancel    CANCELLED   CancelJob, or the client went away
//   RUNNING      kRequeue   QUEUED      a server restart: a data_paths job resumes from its
//   checkpoint
//
// SUCCEEDED, FAILED and CANCELLED are terminal: no change leaves them. Only
// a SUCCEEDED job has a final state (FetchState); only a FAILED job keeps its
// checkpoint (to be resumed: job_resume.h).
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
struct JobTransition {
  v1::JobState from;
  JobChange change;
  v1::JobState to;
};

// Every allowed change, the table above.
const std::vector<JobTransition>& JobTransitions();

// "QUEUED" (a new job, JOB_STATE_UNSPECIFIED: "NEW"); "kFail" -> "fail".
std::string StateName(v1::JobState s);
absl::string_view ChangeName(JobChange c);

// What a state means.
bool Terminal(v1::JobState s);         // SUCCEEDED, FAILED, CANCELLED
bool HasFinalState(v1::JobState s);    // SUCCEEDED: its final state is kept
bool KeepsCheckpoint(v1::JobState s);  // FAILED: its checkpoint is kept, to be resumed
bool Resumable(v1::JobState s);        // FAILED (job_resume.h)

// Applies `change` to a job's info: its state and what each state shows
// (the error and its code from `status`, the queue place and message only
// while QUEUED, the start and end times, no checkpoint once it ended in a
// state that keeps none). FAILED_PRECONDITION naming both states when the
// table has no such row; then `info` is unchanged.
absl::Status ApplyChange(v1::JobInfo* info, JobChange change, const absl::Status& status);

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_JOB_LIFECYCLE_H_
