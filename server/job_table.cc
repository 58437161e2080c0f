#include "server/job_table.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/log.h"

namespace fxdp::server {

std::string JobTable::NextId() const {
  std::lock_guard<std::mutex> l(mu_);
  return absl::StrCat("job-", next_id_, "-", absl::Hex(UnixMs() & 0xffffff));
}

void JobTable::Add(const std::shared_ptr<Job>& job, const std::string& id) {
  const v1::JobSpec& spec = job->spec;
  {
    std::lock_guard<std::mutex> jl(job->mu);
    v1::JobInfo& info = job->info;
    info.set_job_id(id);
    info.set_name(spec.name());
    info.set_owner(job->owner.identity);
    info.set_state(v1::JOB_STATE_QUEUED);
    info.set_world_size(spec.world_size());
    info.set_steps(spec.steps());
    *info.mutable_data_paths() = spec.data_paths();
    info.set_submitted_unix_ms(UnixMs());
    info.set_compile_cached(job->expanded.cached());
    for (std::string& h : job->placeholders.Hyperparameters()) info.add_hyperparameters(std::move(h));
  }
  std::lock_guard<std::mutex> l(mu_);
  ++next_id_;
  jobs_[id] = job;
  order_.push_back(id);
}

absl::Status JobTable::NotFound(const std::string& id) const {
  return absl::NotFoundError(absl::StrCat("no job '", id, "' (the server remembers the last ",
                                          std::max<size_t>(options_.max_finished_jobs, 1),
                                          " finished jobs: --max-finished-jobs)"));
}

absl::StatusOr<std::shared_ptr<Job>> JobTable::Find(const std::string& id) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return NotFound(id);
  return it->second;
}

std::vector<std::shared_ptr<Job>> JobTable::All() const {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<std::shared_ptr<Job>> out;
  for (const auto& id : order_) out.push_back(jobs_.at(id));
  return out;
}

void JobTable::Finished(const std::shared_ptr<Job>& job) {
  const std::string id = job->id();
  std::lock_guard<std::mutex> l(mu_);
  finished_.push_back(id);
  while (finished_.size() > std::max<size_t>(options_.max_finished_jobs, 1)) {
    const std::string old = finished_.front();
    finished_.pop_front();
    jobs_.erase(old);
    order_.erase(std::find(order_.begin(), order_.end(), old));
    states_.Erase(old);
  }
}

void JobTable::KeepState(const std::shared_ptr<Job>& job, std::shared_ptr<const StateStore::State> state) {
  const std::string id = job->id();
  std::lock_guard<std::mutex> l(mu_);
  for (const std::string& gone : states_.Put(id, std::move(state))) {
    auto it = jobs_.find(gone);
    if (it == jobs_.end()) continue;
    if (gone != id) Log(absl::StrCat(gone, ": final state evicted (--max-state-mb)"));
    std::lock_guard<std::mutex> jl(it->second->mu);
    it->second->info.set_has_state(false);
    it->second->info.set_state_evicted(true);
  }
  if (states_.Get(id) != nullptr) {
    std::lock_guard<std::mutex> jl(job->mu);
    job->info.set_has_state(true);
  } else {
    Log(absl::StrCat(id, ": final state not kept: larger than --max-state-mb"));
  }
}

absl::StatusOr<std::shared_ptr<const StateStore::State>> JobTable::FinalState(const std::string& id) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return NotFound(id);
  const v1::JobState state = it->second->state();
  if (state != v1::JOB_STATE_SUCCEEDED) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id, " is ", v1::JobState_Name(state),
                                                      ": only a SUCCEEDED job has a final state"));
  }
  std::shared_ptr<const StateStore::State> kept = states_.Get(id);
  if (kept == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id, "'s final state was evicted: the server keeps at most ",
                     options_.max_state_bytes >> 20,
                     " MiB of final states (--max-state-mb) and evicts the oldest first; fetch it "
                     "sooner or raise --max-state-mb"));
  }
  return kept;
}

}  // namespace fxdp::server
