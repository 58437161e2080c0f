#include "server/jobs/job_scheduler.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/log.h"

namespace fxdp::server {
namespace {

std::string QueueMessage(int world, int registered, int free, int ahead) {
  std::string m = absl::StrCat("waiting for ", world, " idle worker", world == 1 ? "" : "s", "; ",
                               registered, " registered");
  if (registered < world) {
    absl::StrAppend(&m, " (more workers must attach)");
  } else {
    absl::StrAppend(&m, ", ", free, " idle");
  }
  if (ahead > 0)
    absl::StrAppend(&m, "; ", ahead, " job", ahead == 1 ? "" : "s", " ahead in the queue");
  return m;
}

}  // namespace

JobScheduler::JobScheduler(WorkerPool* pool, JobTable* table, const JobServiceOptions& options)
    : pool_(pool),
      table_(table),
      options_(options),
      queue_(options.max_queued_jobs),
      thread_(&JobScheduler::Loop, this) {}

JobScheduler::~JobScheduler() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  for (auto& r : releasing_) {
    for (int64_t h : handles_[r.job.get()]) pool_->Unsubscribe(h);
  }
}

void JobScheduler::Wake() {
  wake_ = true;
  cv_.notify_all();
}

void JobScheduler::Loop() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    cv_.wait_for(l, Seconds(options_.dispatch_interval_s), [&] { return stop_ || wake_.load(); });
    wake_ = false;
    if (stop_) break;
    ReleaseLocked();
    DispatchLocked();
  }
}

int JobScheduler::RegisteredWorkers() const {
  int registered = 0;
  for (const auto& w : pool_->List()) registered += w.state() != v1::WORKER_STATE_LOST;
  return registered;
}

std::string JobScheduler::CannotRunMessage(int world, int registered) const {
  return absl::StrCat(
      "JobSpec.world_size ", world, " exceeds the ", registered, " worker",
      registered == 1 ? "" : "s", " registered (not LOST), so it cannot run (jobs wait ",
      options_.queue_grace_s, " s for workers to attach: fxdp-server --queue-grace-s)");
}

absl::Status JobScheduler::CheckPlaceable(int world) const {
  if (Clock::now() - started_ < Seconds(options_.queue_grace_s)) return absl::OkStatus();
  const int registered = RegisteredWorkers();
  if (world > registered) return absl::FailedPreconditionError(CannotRunMessage(world, registered));
  return absl::OkStatus();
}

absl::Status JobScheduler::CheckIdentityQuotaLocked(const JobOwner& owner) const {
  if (!owner.authenticated) return absl::OkStatus();
  size_t queued = 0;
  for (const auto& [id, j] : queued_)
    queued += j->owner().authenticated && j->owner().identity == owner.identity;
  if (queued < options_.max_queued_jobs_per_identity) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("identity '", owner.identity, "' has ", queued,
                   " jobs queued, the most one identity may have waiting "
                   "(fxdp-server --max-queued-jobs-per-identity)"));
}

absl::StatusOr<v1::JobEvent> JobScheduler::Enqueue(const std::shared_ptr<Job>& job) {
  const int world = job->plan().spec.world_size();
  if (absl::Status s = CheckPlaceable(world); !s.ok()) return s;
  std::lock_guard<std::mutex> l(mu_);
  if (absl::Status s = CheckIdentityQuotaLocked(job->owner()); !s.ok()) return s;
  const std::string id = table_->NextId();
  if (absl::Status s = queue_.Push(id, world); !s.ok()) return s;
  if (absl::Status s = table_->Add(job, id); !s.ok()) {
    queue_.Remove(id);
    return s;
  }
  queued_[id] = job;
  DispatchLocked();
  // The first event is QUEUED: its place in the queue, or position 0 when
  // it was dispatched at once.
  v1::JobEvent first = job->Event(v1::JOB_STATE_QUEUED);
  first.clear_workers();
  return first;
}

absl::StatusOr<v1::JobEvent> JobScheduler::Requeue(const std::shared_ptr<Job>& job) {
  const std::string id = job->id();
  std::lock_guard<std::mutex> l(mu_);
  if (absl::Status s = queue_.Push(id, job->plan().spec.world_size()); !s.ok()) return s;
  queued_[id] = job;
  DispatchLocked();
  v1::JobEvent first = job->Event(v1::JOB_STATE_QUEUED);
  first.clear_workers();
  return first;
}

bool JobScheduler::CancelQueuedLocked(const std::string& id, const std::string& reason,
                                      const absl::Status& status) {
  if (!queue_.Remove(id)) return false;
  std::shared_ptr<Job> j = std::move(queued_[id]);
  queued_.erase(id);
  unplaceable_since_.erase(id);
  j->CancelQueued(reason);
  j->Change(JobChange::kCancel, status).IgnoreError();  // refused: logged
  return true;
}

bool JobScheduler::CancelQueued(const std::string& id, const std::string& reason,
                                const absl::Status& status) {
  std::lock_guard<std::mutex> l(mu_);
  return CancelQueuedLocked(id, reason, status);
}

void JobScheduler::CancelAllQueued(const std::string& reason) {
  std::lock_guard<std::mutex> l(mu_);
  for (const std::string& id : queue_.Ids()) {
    CancelQueuedLocked(
        id, reason,
        absl::CancelledError(absl::StrCat("job ", id, " cancelled while queued: ", reason)));
  }
}

void JobScheduler::AddHandles(const std::shared_ptr<Job>& job,
                              const std::vector<int64_t>& handles) {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<int64_t>& mine = handles_[job.get()];
  mine.insert(mine.end(), handles.begin(), handles.end());
}

void JobScheduler::Ended(const std::shared_ptr<Job>& job) {
  const bool dispatched = job->dispatched();
  std::lock_guard<std::mutex> l(mu_);
  if (dispatched) {
    const double t = job->plan().spec.collective_timeout_s();
    const double timeout = t > 0 ? t : 60;
    releasing_.push_back({job, Clock::now() + Seconds(timeout + options_.release_grace_s)});
  }
  Wake();
}

void JobScheduler::ReleaseLocked() {
  const auto now = Clock::now();
  std::vector<int64_t> unsubscribe;
  for (auto it = releasing_.begin(); it != releasing_.end();) {
    Job& j = *it->job;
    const std::string id = j.id();
    const bool all =
        j.ReleaseRanks(now >= it->at, [&](int rank, const std::string& worker, bool unconfirmed) {
          if (unconfirmed) {
            Log(absl::StrCat(id, ": worker ", worker, " (rank ", rank,
                             ") did not confirm the end of the job; freeing it anyway"));
          }
          queue_.Release(worker, id);
        });
    if (!all) {
      ++it;
      continue;
    }
    auto h = handles_.find(&j);
    if (h != handles_.end()) {
      unsubscribe.insert(unsubscribe.end(), h->second.begin(), h->second.end());
      handles_.erase(h);
    }
    it = releasing_.erase(it);
  }
  for (int64_t h : unsubscribe) pool_->Unsubscribe(h);
}

void JobScheduler::DispatchLocked() {
  if (queue_.size() == 0) return;
  const std::vector<std::string> idle = pool_->IdleWorkers();
  for (JobQueue::Dispatch& d : queue_.Take(idle)) {
    std::shared_ptr<Job> j = std::move(queued_[d.job_id]);
    queued_.erase(d.job_id);
    unplaceable_since_.erase(d.job_id);
    j->Dispatch(std::move(d.workers));
  }
  if (queue_.size() == 0) return;
  const int registered = RegisteredWorkers();
  // Jobs that cannot run on the registered workers: failed after the grace
  // period, so that the queue behind them moves on.
  const Clock::time_point now = Clock::now();
  bool removed = false;
  for (const std::string& id : queue_.Ids()) {
    std::shared_ptr<Job> j = queued_[id];
    const int world = j->plan().spec.world_size();
    if (world <= registered) {
      unplaceable_since_.erase(id);
      continue;
    }
    const Clock::time_point since = unplaceable_since_.emplace(id, now).first->second;
    if (now - since < Seconds(options_.queue_grace_s)) continue;
    queue_.Remove(id);
    queued_.erase(id);
    unplaceable_since_.erase(id);
    removed = true;
    j->Change(JobChange::kFail,
              absl::FailedPreconditionError(absl::StrCat(
                  "job ", id, " failed while queued: ", CannotRunMessage(world, registered))))
        .IgnoreError();  // refused: logged
  }
  if (removed) {
    DispatchLocked();
    return;
  }
  const int free = static_cast<int>(queue_.Free(idle).size());
  int position = 0;
  for (const std::string& id : queue_.Ids()) {
    std::shared_ptr<Job> j = queued_[id];
    ++position;
    j->SetQueuePlace(position,
                     QueueMessage(j->plan().spec.world_size(), registered, free, position - 1));
  }
}

}  // namespace fxdp::server
