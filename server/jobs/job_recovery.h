// What a restarted `fxdp-server --state-dir DIR` makes of the jobs recorded
// in DIR (JobStore):
//   - finished jobs stay as they ended (a SUCCEEDED one's final state is a
//     file, fetchable while the history and --max-state-mb keep it);
//   - jobs that were RUNNING are FAILED (UNAVAILABLE): their workers were
//     told nothing and their client's stream ended with the server; except
//     data_paths jobs with a checkpoint (--checkpoint-every), which are
//     queued again to resume after the checkpoint's step (first_step) from
//     its state (a QUEUED resume of another job too: its checkpoint is that
//     job's), or with one their workers wrote (JobSpec.checkpoints), which
//     the new workers read (every state tensor, job_resume.h's WholeStateFrom);
//   - QUEUED jobs whose batches came over their Submit stream are FAILED
//     (UNAVAILABLE): that stream ended with the server; a FAILED job with a
//     checkpoint keeps it, and its error says how to resume it
//     (JobSpec.resume_job, job_resume.h);
//   - QUEUED data_paths jobs (their spec and initial state were recorded
//     before they were queued) are expanded again and queued again, to run
//     without a client (GetJob/ListJobs/FetchState follow them).
// No gRPC here.
#ifndef FXDP_SERVER_JOBS_JOB_RECOVERY_H_
#define FXDP_SERVER_JOBS_JOB_RECOVERY_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "server/jobs/job.h"
#include "server/jobs/job_spec.h"
#include "server/jobs/job_store.h"

namespace fxdp::server {

struct RecoveredJobs {
  std::vector<std::shared_ptr<Job>> jobs;    // every recorded job, in submission order
  std::vector<std::shared_ptr<Job>> to_run;  // the data_paths jobs queued again (`recovered`)
  int64_t last_seq = 0;                      // the last submission number used
};

// The client of a job queued again after a restart: there is none (its
// events go nowhere; GetJob and ListJobs show its progress).
class NoClient final : public JobClient {
 public:
  void Write(v1::JobEvent) override {}
  void SetReadBudget(size_t) override {}
  void Consumed(size_t) override {}
};

// Reads the store and records the jobs' new states in it.
absl::StatusOr<RecoveredJobs> RecoverJobs(JobStore* store, const Expander& expand);

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_JOB_RECOVERY_H_
