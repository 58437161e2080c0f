// JobTable: the jobs the server knows, by id and in submission order: the
// queued and running ones and the last max_finished_jobs finished ones (older
// ones are forgotten, with their final states), and the final states of
// succeeded jobs kept for FetchState within max_state_bytes (StateStore:
// the oldest is evicted first). Lookups of unknown ids are NOT_FOUND naming
// the history limit. With a JobStore (--state-dir) every change is also
// recorded there and final states are files (StateStore counts their bytes);
// Restore rebuilds the table after a restart. Thread-safe. No gRPC here.
#ifndef FXDP_SERVER_JOBS_JOB_TABLE_H_
#define FXDP_SERVER_JOBS_JOB_TABLE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/fxdp/v1/jobs.pb.h"
#include "server/jobs/job.h"
#include "server/jobs/job_options.h"
#include "server/jobs/job_store.h"
#include "server/jobs/state_reader.h"
#include "server/jobs/state_store.h"

namespace fxdp::server {

class JobTable {
 public:
  // `store` (may be null: in memory only) outlives the table.
  explicit JobTable(const JobServiceOptions& options, JobStore* store = nullptr)
      : options_(options), store_(store), states_(options.max_state_bytes) {}

  // The id the next Add records ("job-N-HEX": a counter and a clock tag).
  std::string NextId() const;
  // Records a job that was just queued under `id` (NextId()'s): its JobInfo
  // (id, name, QUEUED, world size, steps, data paths, times, hyper-parameter
  // names) from its spec; in the store with its submitted spec (which the
  // job then no longer holds). A store that cannot record it (a full disk)
  // is the error, naming the path, and the job is not added: it would be
  // gone after a restart.
  absl::Status Add(const std::shared_ptr<Job>& job, const std::string& id);
  // The job's info changed (RUNNING, a step): recorded in the store.
  void Update(const std::shared_ptr<Job>& job);
  // After a restart: the store's records (see job_recovery.h) back in the
  // table in submission order, finished ones in the history; ids continue
  // after the last one.
  void Restore(const std::vector<std::shared_ptr<Job>>& jobs, int64_t last_seq);
  // The job named `id`, or NOT_FOUND.
  absl::StatusOr<std::shared_ptr<Job>> Find(const std::string& id) const;
  // Every known job, in submission order.
  std::vector<std::shared_ptr<Job>> All() const;
  // The job ended: it joins the finished history (forgetting the oldest
  // beyond max_finished_jobs).
  void Finished(const std::shared_ptr<Job>& job);
  // Keeps a job's final state (evicting older ones; has_state and
  // state_evicted of the jobs concerned updated). With a store the state is
  // its file, written and synced first; a file that cannot be written is the
  // error ("state not saved: PATH: No space left on device (needed N
  // bytes); ..."), and the state is kept in memory instead (until a restart).
  absl::Status KeepState(const std::shared_ptr<Job>& job,
                         std::shared_ptr<const StateStore::State> state);
  // A job that ran all its steps: its final state kept (KeepState) and, with
  // a store, its record SUCCEEDED and synced, in that order; only then (OK)
  // may it be SUCCEEDED anywhere. Otherwise the error names the file that
  // could not be written and the job must fail with it; its state stays
  // fetchable (FinalState) while the server runs.
  absl::Status Succeed(const std::shared_ptr<Job>& job,
                       std::shared_ptr<const StateStore::State> state);
  // A job that fails or is cancelled while running (job_lifecycle.h,
  // kLastStep): the state after job step `step`, collected from its ranks,
  // kept as its checkpoint (checkpoint_step, has_state): with a store its
  // checkpoint file (replacing an older one), else (or when the file cannot
  // be written: the error) in memory within max_state_bytes, as final states.
  absl::Status KeepLastState(const std::shared_ptr<Job>& job, int64_t step,
                             std::shared_ptr<const StateStore::State> state);
  // A job's kept state: a SUCCEEDED job's final state, one that could not be
  // saved (Succeed), or a FAILED or CANCELLED job's checkpoint (its last
  // step's, KeepLastState, or its last --checkpoint-every one).
  // FAILED_PRECONDITION when the job keeps none or its state was evicted,
  // NOT_FOUND for an unknown job.
  absl::StatusOr<std::shared_ptr<const StateStore::State>> FinalState(const std::string& id) const;
  // The same, to be read chunk by chunk (FetchState): the kept state shared,
  // or its file in the store opened (only its header read).
  absl::StatusOr<StateReader> OpenFinalState(const std::string& id) const;
  // What Find says of an unknown job: also said to a caller asking for
  // another identity's job (it must not learn that the job exists).
  absl::Status NotFound(const std::string& id) const;

 private:
  // FinalState's checks: the state kept in memory, or null when it is in the
  // store (`*path`: its file).
  absl::StatusOr<std::shared_ptr<const StateStore::State>> Kept(const std::string& id,
                                                                std::string* path) const;
  // Evicted states: their jobs and files updated (mu_ held).
  void Evicted(const std::vector<std::string>& evicted, const std::string& id);
  void Record(const absl::Status& s, const std::string& id, const char* what) const;

  const JobServiceOptions options_;
  JobStore* const store_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Job>> jobs_;
  std::vector<std::string> order_;    // job ids, submission order
  std::deque<std::string> finished_;  // finished job ids, oldest first
  StateStore states_;
  int64_t next_id_ = 1;
};

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_JOB_TABLE_H_
