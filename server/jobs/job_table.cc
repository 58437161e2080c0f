#include "server/jobs/job_table.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/log.h"
#include "util/bytes.h"

namespace fxdp::server {

std::string JobTable::NextId() const {
  std::lock_guard<std::mutex> l(mu_);
  return absl::StrCat("job-", next_id_, "-", absl::Hex(UnixMs() & 0xffffff));
}

absl::Status JobTable::Add(const std::shared_ptr<Job>& job, const std::string& id) {
  if (absl::Status s = job->Queue(id); !s.ok()) return s;
  std::lock_guard<std::mutex> l(mu_);
  if (store_ != nullptr) {
    ++next_id_;  // not reused either way
    if (absl::Status s = store_->Insert(next_id_ - 1, job->Info(), job->TakeSubmitted()); !s.ok()) {
      Record(s, id, "record");
      return absl::Status(
          s.code(),
          absl::StrCat("the job cannot be recorded (fxdp-server --state-dir ", store_->dir(),
                       "), so it would be lost after a restart: ", s.message()));
    }

  } else {
    ++next_id_;
  }
  jobs_[id] = job;
  order_.push_back(id);
  return absl::OkStatus();
}

void JobTable::Record(const absl::Status& s, const std::string& id, const char* what) const {
  if (!s.ok())
    Log(absl::StrCat(id, ": cannot ", what, " the job in ", store_->dir(), ": ", s.message()));
}

void JobTable::Update(const std::shared_ptr<Job>& job) {
  if (store_ == nullptr) return;
  v1::JobInfo info = job->Info();
  Record(store_->Update(info, /*ended=*/false), info.job_id(), "update");
}

void JobTable::Restore(const std::vector<std::shared_ptr<Job>>& jobs, int64_t last_seq) {
  std::lock_guard<std::mutex> l(mu_);
  for (const std::shared_ptr<Job>& j : jobs) {
    const std::string id = j->id();
    jobs_[id] = j;
    order_.push_back(id);
    if (Terminal(j->state())) finished_.push_back(id);
    // A SUCCEEDED job's state is a file, a FAILED or CANCELLED job's its
    // checkpoint; another's was kept in memory (KeepState) and is gone.
    const v1::JobInfo info = j->Info();
    const bool checkpoint =
        Resumable(info.state()) && info.checkpoint_step() > 0 && info.checkpoint_path().empty();
    if (!HasFinalState(info.state())) j->SetHasState(checkpoint);
    if (HasFinalState(info.state()) && info.has_state() && store_ != nullptr)
      states_.PutBytes(id, store_->FinalStateBytes(id));
  }
  next_id_ = std::max(next_id_, last_seq + 1);
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
  const v1::JobInfo info = job->Info();  // its checkpoint kept only when it FAILED (ApplyChange)
  const std::string& id = info.job_id();
  std::lock_guard<std::mutex> l(mu_);
  if (store_ != nullptr) Record(store_->Update(info, /*ended=*/true), id, "update");
  finished_.push_back(id);
  while (finished_.size() > std::max<size_t>(options_.max_finished_jobs, 1)) {
    const std::string old = finished_.front();
    finished_.pop_front();
    jobs_.erase(old);
    order_.erase(std::find(order_.begin(), order_.end(), old));
    states_.Erase(old);
    if (store_ != nullptr) Record(store_->Erase(old), old, "forget");
  }
}

absl::Status JobTable::KeepState(const std::shared_ptr<Job>& job,
                                 std::shared_ptr<const StateStore::State> state) {
  const std::string id = job->id();
  const uint64_t bytes = StateStore::Bytes(*state);
  // With a store the file is the state (written outside the lock): only its
  // bytes are counted here. A file that cannot be written: the state in
  // memory, as without a store.
  absl::Status written;
  if (store_ != nullptr && bytes <= states_.max_bytes()) {
    written = store_->WriteFinalState(id, *state);
    Record(written, id, "write the final state of");
  }
  std::lock_guard<std::mutex> l(mu_);
  std::vector<std::string> evicted;
  if (store_ == nullptr || !written.ok()) {
    evicted = states_.Put(id, std::move(state));
  } else {
    evicted = states_.PutBytes(id, bytes);
  }
  Evicted(evicted, id);
  const bool kept = states_.Has(id);
  if (kept) {
    job->SetHasState(true);
  } else {
    Log(absl::StrCat(id, ": final state not kept: larger than --max-state-mb"));
  }
  if (written.ok()) return written;
  return absl::Status(
      written.code(),
      absl::StrCat(
          "state not saved: ", written.message(),
          kept ? "; the final state is kept in memory for FetchState until the server restarts"
               : ""));
}

void JobTable::Evicted(const std::vector<std::string>& evicted, const std::string& id) {
  for (const std::string& gone : evicted) {
    if (store_ != nullptr) Record(store_->EraseFinalState(gone), gone, "erase the final state of");
    auto it = jobs_.find(gone);
    if (it == jobs_.end()) continue;
    if (gone != id) Log(absl::StrCat(gone, ": kept state evicted (--max-state-mb)"));
    it->second->StateEvicted();
    const v1::JobInfo info = it->second->Info();
    if (store_ != nullptr) Record(store_->Update(info, Terminal(info.state())), gone, "update");
  }
}

absl::Status JobTable::KeepLastState(const std::shared_ptr<Job>& job, int64_t step,
                                     std::shared_ptr<const StateStore::State> state) {
  const std::string id = job->id();
  absl::Status written;
  if (store_ != nullptr) {
    written = store_->WriteCheckpoint(id, step, *state);  // outside the lock
    Record(written, id, "write the last state of");
    if (written.ok()) {
      job->SetCheckpointStep(step);
      job->SetHasState(true);
      return written;
    }
  }
  const uint64_t bytes = StateStore::Bytes(*state);
  std::lock_guard<std::mutex> l(mu_);
  Evicted(states_.Put(id, std::move(state)), id);
  const bool kept = states_.Has(id);
  if (kept) {
    job->SetCheckpointStep(step);
    job->SetHasState(true);
  }
  if (!written.ok()) {
    return absl::Status(
        written.code(),
        absl::StrCat("its state after step ", step, " not saved: ", written.message(),
                     kept ? "; kept in memory until the server restarts" : ""));
  }
  if (kept) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("its state after step ", step, " (", util::MiBWithBytes(bytes),
                   ") is larger than this server keeps (fxdp-server --max-state-mb ",
                   states_.max_bytes() >> 20, ")"));
}

absl::Status JobTable::Succeed(const std::shared_ptr<Job>& job,
                               std::shared_ptr<const StateStore::State> state) {
  if (state != nullptr) {  // null: the workers' last checkpoint is the state
    if (absl::Status s = KeepState(job, std::move(state)); !s.ok()) return s;
  }
  if (store_ == nullptr) return absl::OkStatus();
  v1::JobInfo info = job->Info();
  // The record SUCCEEDED (no checkpoint) before the job is (JobRunner::Succeeded).
  if (absl::Status s = ApplyChange(&info, JobChange::kSucceed, absl::OkStatus()); !s.ok()) return s;
  absl::Status s = store_->Update(info, /*ended=*/true);
  if (s.ok()) return s;
  Record(s, info.job_id(), "record the end of");
  return absl::Status(
      s.code(),
      absl::StrCat("state not saved: ", s.message(),
                   info.has_state()
                       ? "; the final state is kept for FetchState until the server restarts"
                       : ""));
}

absl::StatusOr<std::shared_ptr<const StateStore::State>> JobTable::FinalState(
    const std::string& id) const {
  std::string path;
  absl::StatusOr<std::shared_ptr<const StateStore::State>> kept = Kept(id, &path);
  if (!kept.ok() || *kept != nullptr) return kept;
  absl::StatusOr<JobStore::Tensors> read = path == store_->FinalStatePath(id)
                                               ? store_->ReadFinalState(id)
                                               : [&]() -> absl::StatusOr<JobStore::Tensors> {
    absl::StatusOr<JobStore::Checkpoint> c = store_->ReadCheckpoint(id);
    if (!c.ok()) return c.status();
    return std::move(c->state);
  }();  // outside the lock
  if (!read.ok()) {
    return absl::DataLossError(absl::StrCat("job ", id, "'s state cannot be read back from ", path,
                                            ": ", read.status().message()));
  }
  return std::make_shared<const StateStore::State>(*std::move(read));
}

absl::StatusOr<StateReader> JobTable::OpenFinalState(const std::string& id) const {
  std::string path;
  absl::StatusOr<std::shared_ptr<const StateStore::State>> kept = Kept(id, &path);
  if (!kept.ok()) return kept.status();
  if (*kept != nullptr) return StateReader(*std::move(kept));
  absl::StatusOr<StateReader> file = StateReader::OpenFile(path);  // outside the lock
  if (!file.ok()) {
    return absl::DataLossError(
        absl::StrCat("job ", id, "'s state cannot be read back: ", file.status().message()));
  }
  return file;
}

absl::StatusOr<std::shared_ptr<const StateStore::State>> JobTable::Kept(const std::string& id,
                                                                        std::string* path) const {
  std::shared_ptr<const StateStore::State> kept;
  bool on_disk = false, succeeded = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return NotFound(id);
    const v1::JobInfo info = it->second->Info();
    const v1::JobState state = info.state();
    // A FAILED or CANCELLED job's checkpoint (job_lifecycle.h): in memory, or its file.
    const bool checkpoint = KeepsCheckpoint(state) && Terminal(state) &&
                            info.checkpoint_step() > 0 && info.checkpoint_path().empty();
    if (checkpoint && store_ != nullptr && !states_.Has(id)) {
      *path = store_->CheckpointPath(id);
      return kept;
    }
    // A job whose workers wrote its last step's checkpoint SUCCEEDED without
    // its state passing through the server (JobRunner::End).
    if (HasFinalState(state) && !info.has_state() && !info.checkpoint_path().empty() &&
        !states_.Has(id)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", id, " SUCCEEDED and its final state is the checkpoint its workers wrote, ",
          info.checkpoint_path(), " (step ", info.checkpoint_step(),
          ", JobSpec.checkpoints): it stays on their filesystem, the server holds no copy; "
          "read it there (fxdp export ",
          id,
          " --hf DIR), or start a job from it "
          "(initial_checkpoint)"));
    }
    // Nor did a FAILED or CANCELLED one's (JobRunner::KeepLastState): its
    // work is kept in the newest checkpoint its workers completed.
    if (Terminal(state) && !info.has_state() && !info.checkpoint_path().empty() &&
        !states_.Has(id)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", id, " is ", v1::JobState_Name(state), " and its work is kept in the checkpoint ",
          "its workers wrote, ", info.checkpoint_path(), " (step ", info.checkpoint_step(), " of ",
          info.steps_done(), " completed, JobSpec.checkpoints): it stays on their filesystem, ",
          "the server holds no copy; start a job from it (initial_checkpoint)"));
    }
    // With a store, a job that failed because its state could not be saved
    // keeps it (Succeed).
    if (!HasFinalState(state) && !checkpoint && !(store_ != nullptr && states_.Has(id))) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", id, " is ", v1::JobState_Name(state), " and keeps no state: ",
          Terminal(state) ? absl::StrCat("it ended after ", info.steps_done(),
                                         " steps without a state to keep (its error says why)")
                          : "it has not ended (a SUCCEEDED job has a final state, a FAILED or "
                            "CANCELLED one the state of its last completed step)"));
    }
    kept = states_.Get(id);
    on_disk = kept == nullptr && states_.Has(id) && store_ != nullptr;
    succeeded = HasFinalState(state);
  }
  if (on_disk) *path = store_->FinalStatePath(id);
  if (kept == nullptr && !on_disk) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", id, succeeded ? "'s final" : "'s kept",
        " state was evicted: the server keeps at most ", options_.max_state_bytes >> 20,
        " MiB of job states (--max-state-mb) and evicts the oldest first; fetch it "
        "sooner or raise --max-state-mb"));
  }
  return kept;
}

}  // namespace fxdp::server
