// JobScheduler: which queued job runs next, on which workers. Jobs wait in a
// JobQueue (strict FIFO, bounded: job_queue.h); the scheduler's thread hands
// the head of the queue its world_size workers as soon as that many are IDLE
// and unreserved (the job's `dispatched` and `workers` are set and its runner
// woken), keeps each queued job's position and message current, and fails a
// job that needs more workers than are registered (not LOST) once that has
// lasted queue_grace_s (FAILED_PRECONDITION; the queue behind it moves on).
// An ended job's workers stay reserved until each confirmed the job's end
// (JobEnded, JobFailed, or lost), or until the job's collective timeout plus
// release_grace_s have passed since it ended; then its worker subscriptions
// are dropped. Thread-safe. No gRPC here.
#ifndef FXDP_SERVER_JOBS_JOB_SCHEDULER_H_
#define FXDP_SERVER_JOBS_JOB_SCHEDULER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/jobs/job.h"
#include "server/jobs/job_options.h"
#include "server/jobs/job_queue.h"
#include "server/jobs/job_table.h"
#include "server/workers/worker_pool.h"

namespace fxdp::server {

class JobScheduler {
 public:
  JobScheduler(WorkerPool* pool, JobTable* table, const JobServiceOptions& options);
  ~JobScheduler();

  // Queues a prepared job: an id and its record in the table, a place in the
  // queue. FAILED_PRECONDITION when the server has been up queue_grace_s and
  // fewer workers are registered than the job needs; RESOURCE_EXHAUSTED when
  // max_queued_jobs wait already. Returns the job's first event: QUEUED, with
  // its place in the queue (0 when it was dispatched at once).
  // RESOURCE_EXHAUSTED too when the job's authenticated owner has
  // max_queued_jobs_per_identity jobs waiting already.
  absl::StatusOr<v1::JobEvent> Enqueue(const std::shared_ptr<Job>& job);
  // Enqueue's check of a job of `world` ranks against the registered
  // workers, alone: a Submit makes it before its graph is expanded.
  absl::Status CheckPlaceable(int world) const;
  // Queues again a job the table holds already (after a server restart,
  // job_recovery.h); RESOURCE_EXHAUSTED when the queue is full.
  absl::StatusOr<v1::JobEvent> Requeue(const std::shared_ptr<Job>& job);
  // Takes a queued job out of the queue and ends it CANCELLED with
  // `status`; false when it is not queued (dispatched, or ended).
  bool CancelQueued(const std::string& id, const std::string& reason, const absl::Status& status);
  // Cancels every queued job ("job ID cancelled while queued: REASON").
  void CancelAllQueued(const std::string& reason);
  // Worker subscriptions of a dispatched job, dropped at its release.
  void AddHandles(const std::shared_ptr<Job>& job, const std::vector<int64_t>& handles);
  // The job ended: a dispatched job's workers are released once confirmed.
  void Ended(const std::shared_ptr<Job>& job);

 private:
  void Wake();
  void Loop();
  // With mu_ held: frees the workers of ended jobs that confirmed (or timed
  // out), starts the jobs that fit, fails the ones that cannot run, and
  // updates the queued jobs' position and message.
  void ReleaseLocked();
  void DispatchLocked();
  bool CancelQueuedLocked(const std::string& id, const std::string& reason,
                          const absl::Status& status);
  // OK, or RESOURCE_EXHAUSTED when `owner` has its quota of queued jobs.
  absl::Status CheckIdentityQuotaLocked(const JobOwner& owner) const;
  // Workers registered and not LOST.
  int RegisteredWorkers() const;
  // Why a job of `world` ranks cannot run on `registered` workers.
  std::string CannotRunMessage(int world, int registered) const;

  WorkerPool* const pool_;
  JobTable* const table_;
  const JobServiceOptions options_;
  const Clock::time_point started_ = Clock::now();
  std::mutex mu_;
  JobQueue queue_;
  std::map<std::string, std::shared_ptr<Job>> queued_;  // by id
  // Ended jobs still holding workers, with when their unconfirmed ranks are freed anyway.
  struct Releasing {
    std::shared_ptr<Job> job;
    Clock::time_point at;
  };
  std::vector<Releasing> releasing_;
  std::map<const Job*, std::vector<int64_t>> handles_;  // dispatched jobs' worker subscriptions
  // Since when a queued job (by id) has needed more workers than are registered.
  std::map<std::string, Clock::time_point> unplaceable_since_;
  bool stop_ = false;
  std::atomic<bool> wake_{false};
  std::condition_variable cv_;
  std::thread thread_;
};

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_JOB_SCHEDULER_H_
