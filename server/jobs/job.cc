#include "server/jobs/job.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "server/log.h"

namespace fxdp::server {

int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Clock::duration Seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

JobPlan PlanOf(PreparedSpec p) {
  JobPlan plan;
  plan.spec = std::move(p.spec);
  plan.expanded = std::move(p.expanded);
  plan.symbolic = std::move(p.symbolic);
  plan.example = std::move(p.example);
  plan.compile_ms = p.compile_ms;
  plan.inputs = std::move(p.inputs);
  plan.placeholders = std::move(p.placeholders);
  plan.schedule = std::move(p.schedule);
  plan.declared_state = std::move(p.state);
  plan.declared_sent = std::move(p.sent);
  plan.declared_batch = std::move(p.batch);
  plan.eval = std::move(p.eval);
  return plan;
}

void Job::HoldInitialState(std::vector<v1::TensorChunk> state) {
  initial_state_ = std::move(state);
  has_initial_state_ = true;
}

std::vector<v1::TensorChunk> Job::TakeInitialState() {
  std::vector<v1::TensorChunk> state = std::move(initial_state_);
  initial_state_.clear();
  return state;
}

void Job::DropInitialState() { std::vector<v1::TensorChunk>().swap(initial_state_); }

std::string Job::id() const {
  std::lock_guard<std::mutex> l(mu_);
  return info_.job_id();
}

v1::JobState Job::state() const {
  std::lock_guard<std::mutex> l(mu_);
  return info_.state();
}

v1::JobInfo Job::Info() const {
  std::lock_guard<std::mutex> l(mu_);
  return info_;
}

absl::Status Job::Change(JobChange change, const absl::Status& status) {
  absl::Status refused;
  {
    std::lock_guard<std::mutex> l(mu_);
    refused = ApplyChange(&info_, change, status);
  }
  if (!refused.ok()) {
    Log(std::string(refused.message()));
    return refused;
  }
  cv_.notify_all();
  return absl::OkStatus();
}

absl::Status Job::Queue(const std::string& id) {
  const v1::JobSpec& spec = plan_.spec;
  std::lock_guard<std::mutex> l(mu_);
  if (absl::Status s = ApplyChange(&info_, JobChange::kQueue, absl::OkStatus()); !s.ok()) return s;
  info_.set_job_id(id);
  info_.set_name(spec.name());
  info_.set_owner(owner_.identity);
  info_.set_world_size(spec.world_size());
  info_.set_style(spec.style());
  info_.set_steps(spec.steps());
  *info_.mutable_data_paths() = spec.data_paths();
  info_.set_submitted_unix_ms(UnixMs());
  info_.set_compile_cached(plan_.expanded.cached());
  for (std::string& h : plan_.placeholders.Hyperparameters())
    info_.add_hyperparameters(std::move(h));
  return absl::OkStatus();
}

bool Job::SetQueuePlace(int position, const std::string& message) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (info_.queue_position() == position && info_.message() == message) return false;
    info_.set_queue_position(position);
    info_.set_message(message);
  }
  cv_.notify_all();
  return true;
}

void Job::StartAt(const std::string& resumed_from, int64_t step, const std::vector<double>& losses,
                  const std::vector<v1::EvalMetrics>& evals) {
  std::lock_guard<std::mutex> l(mu_);
  info_.set_resumed_from(resumed_from);
  info_.set_steps_done(step);
  *info_.mutable_losses() = {losses.begin(), losses.end()};
  *info_.mutable_evals() = {evals.begin(), evals.end()};
}

void Job::StepDone(int64_t step, double loss) {
  std::lock_guard<std::mutex> l(mu_);
  info_.set_steps_done(step);
  info_.add_losses(loss);
}

int64_t Job::steps_done() const {
  std::lock_guard<std::mutex> l(mu_);
  return info_.steps_done();
}

void Job::SetSteps(int64_t steps) {
  std::lock_guard<std::mutex> l(mu_);
  info_.set_steps(steps);
}

void Job::SetCheckpointStep(int64_t step) {
  std::lock_guard<std::mutex> l(mu_);
  info_.set_checkpoint_step(step);
  info_.clear_checkpoint_path();  // the server's state, not the workers' files, is named now
}

void Job::SetWorkerCheckpoint(int64_t step, const std::string& path) {
  std::lock_guard<std::mutex> l(mu_);
  info_.set_checkpoint_step(step);
  info_.set_checkpoint_path(path);
}

void Job::SetShapes(const std::vector<v1::CompiledShape>& shapes) {
  std::lock_guard<std::mutex> l(mu_);
  *info_.mutable_shapes() = {shapes.begin(), shapes.end()};
}

void Job::AddEval(const v1::EvalMetrics& eval) {
  std::lock_guard<std::mutex> l(mu_);
  *info_.add_evals() = eval;
}

void Job::SetHasState(bool kept) {
  std::lock_guard<std::mutex> l(mu_);
  info_.set_has_state(kept);
}

void Job::StateEvicted() {
  std::lock_guard<std::mutex> l(mu_);
  info_.set_has_state(false);
  info_.set_state_evicted(true);
}

v1::JobEvent Job::Event(v1::JobState state) {
  v1::JobEvent e;
  std::lock_guard<std::mutex> l(mu_);
  e.set_job_id(info_.job_id());
  e.set_state(state);
  // A resumed job's events before its first step of this run report none.
  const int64_t done = info_.steps_done();
  e.set_step(Terminal(state) || done > plan_.first_step ? done : 0);
  if (plan_.first_step > 0) e.set_first_step(plan_.first_step);
  for (const auto& w : workers_) e.add_workers(w);
  if (state == v1::JOB_STATE_QUEUED) {
    e.set_queue_position(info_.queue_position());
    e.set_message(info_.message());
  }
  if (Terminal(state)) e.set_error(info_.error());
  return e;
}

bool Job::Cancel(const std::string& reason) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (Terminal(info_.state()) || cancel_) return false;
    cancel_ = true;
    cancel_reason_ = reason;
  }
  cv_.notify_all();
  return true;
}

void Job::CancelQueued(const std::string& reason) {
  std::lock_guard<std::mutex> l(mu_);
  cancel_ = true;
  cancel_reason_ = reason;
}

bool Job::cancel_requested() const {
  std::lock_guard<std::mutex> l(mu_);
  return cancel_;
}

std::string Job::cancel_reason() const {
  std::lock_guard<std::mutex> l(mu_);
  return cancel_reason_;
}

void Job::CancelIfClientGone() {
  std::lock_guard<std::mutex> l(mu_);
  if (client_gone_ && !cancel_) {
    cancel_ = true;
    cancel_reason_ = "the client of Submit went away";
  }
}

void Job::FromClient(v1::SubmitJobRequest request, size_t bytes) {
  {
    std::lock_guard<std::mutex> l(mu_);
    from_client_.emplace_back(std::move(request), bytes);
  }
  cv_.notify_all();
}

void Job::ClientEnded() {
  {
    std::lock_guard<std::mutex> l(mu_);
    client_ended_ = true;
  }
  cv_.notify_all();
}

void Job::ClientGone() {
  {
    std::lock_guard<std::mutex> l(mu_);
    client_gone_ = true;
  }
  cv_.notify_all();
}

void Job::Dispatch(std::vector<std::string> workers) {
  {
    std::lock_guard<std::mutex> l(mu_);
    assigned_.assign(workers.size(), false);
    confirmed_.assign(workers.size(), false);
    released_.assign(workers.size(), false);
    info_.clear_workers();
    for (const auto& w : workers) info_.add_workers(w);
    workers_ = std::move(workers);
    dispatched_ = true;
  }
  cv_.notify_all();
}

bool Job::dispatched() const {
  std::lock_guard<std::mutex> l(mu_);
  return dispatched_;
}

std::vector<std::string> Job::workers() const {
  std::lock_guard<std::mutex> l(mu_);
  return workers_;
}

void Job::MarkAssigned(int rank) {
  std::lock_guard<std::mutex> l(mu_);
  assigned_[rank] = true;
}

bool Job::assigned(int rank) const {
  std::lock_guard<std::mutex> l(mu_);
  return assigned_[rank];
}

void Job::FromRank(Msg msg) {
  const bool end = msg.lost || msg.m.has_job_ended() || msg.m.has_job_failed();
  {
    std::lock_guard<std::mutex> l(mu_);
    if (end) confirmed_[msg.rank] = true;
    inbox_.push_back(std::move(msg));
  }
  cv_.notify_all();
}

bool Job::ReleaseRanks(
    bool timed_out,
    const std::function<void(int rank, const std::string& worker, bool unconfirmed)>& release) {
  std::lock_guard<std::mutex> l(mu_);
  bool all = true;
  for (size_t r = 0; r < workers_.size(); ++r) {
    if (released_[r]) continue;
    const bool unconfirmed = assigned_[r] && !confirmed_[r];
    if (unconfirmed && !timed_out) {
      all = false;
      continue;
    }
    release(static_cast<int>(r), workers_[r], unconfirmed);
    released_[r] = true;
  }
  if (all) inbox_.clear();
  return all;
}

Job::Got Job::Next(bool want_client, bool watch_client, Clock::time_point deadline, Msg* worker,
                   v1::SubmitJobRequest* client, size_t* consumed) {
  std::unique_lock<std::mutex> l(mu_);
  while (true) {
    if (!cancel_ && watch_client && client_gone_) {
      cancel_ = true;
      cancel_reason_ = "the client of Submit went away";
    }
    if (cancel_) return Got::kCancel;
    if (!inbox_.empty()) {
      *worker = std::move(inbox_.front());
      inbox_.pop_front();
      return Got::kWorker;
    }
    if (want_client && !from_client_.empty()) {
      client->Swap(&from_client_.front().first);
      *consumed = from_client_.front().second;
      from_client_.pop_front();
      return Got::kClient;
    }
    if (want_client && client_ended_) return Got::kClientEnd;
    const auto now = Clock::now();
    if (now >= deadline) return Got::kTimeout;
    cv_.wait_for(l, std::min<Clock::duration>(std::chrono::milliseconds(100), deadline - now));
  }
}

bool Job::NextRank(Clock::time_point deadline, Msg* worker) {
  std::unique_lock<std::mutex> l(mu_);
  if (!cv_.wait_until(l, deadline, [&] { return !inbox_.empty(); })) return false;
  *worker = std::move(inbox_.front());
  inbox_.pop_front();
  return true;
}

Job::QueueWatch Job::WatchQueued(int* position, std::string* message, Clock::duration wait) {
  QueueWatch w;
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait_for(l, wait, [&] {
    return dispatched_ || Terminal(info_.state()) || client_gone_ ||
           info_.queue_position() != *position || info_.message() != *message;
  });
  if (dispatched_) {
    w.dispatched = true;
    return w;
  }
  if (Terminal(info_.state())) {
    w.ended = absl::Status(static_cast<absl::StatusCode>(info_.error_code()), info_.error());
  } else if (info_.queue_position() != *position || info_.message() != *message) {
    *position = info_.queue_position();
    *message = info_.message();
    w.changed = true;
  }
  w.client_gone = client_gone_;
  return w;
}

v1::JobInfo Job::WaitEnded(Clock::duration wait) {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait_for(l, wait, [&] { return Terminal(info_.state()); });
  return info_;
}

}  // namespace fxdp::server
