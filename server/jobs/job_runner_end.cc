// JobRunner's ends (job_runner.h): the final state collected (the job's
// StateCollector: rank 0's, or FULLY_SHARD's gathered from every rank) and the job SUCCEEDED once
// that state and the job's record are durable (JobTable::Succeed), or FAILED naming what could not
// be saved; and every other end: a failing or lost rank, a cancel, an idle client, bad input. Each
// one ends the job once (Finish): CancelJob to the ranks still assigned, the state, the client's
// last event.
#include <chrono>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/jobs/job_runner.h"
#include "server/log.h"

namespace fxdp::server {

absl::Status JobRunner::Finish(JobChange change, const absl::Status& status, int except) {
  const absl::Status end = stepping_ && KeptBy(job_->state(), change) == StateKept::kLastStep
                               ? KeepLastState(status, except)
                               : status;
  ranks_->CancelAssigned(std::string(end.message()), except);
  job_->Change(change, end).IgnoreError();  // refused: logged, and the event says its state
  client_->Write(job_->Event(job_->state()));
  return end;
}

absl::Status JobRunner::Cancelled() {
  const std::string reason = job_->cancel_reason();
  return Finish(JobChange::kCancel,
                absl::CancelledError(absl::StrCat(
                    "job ", id_, " cancelled: ", reason.empty() ? "CancelJob" : reason)),
                -1);
}

double JobRunner::ClientIdleLeft(Clock::time_point from) const {
  return std::min(3600.0, ctx_.options.client_idle_s -
                              std::chrono::duration<double>(Clock::now() - from).count());
}

absl::Status JobRunner::ClientIdle(absl::string_view waiting_for) {
  return Finish(JobChange::kFail,
                absl::DeadlineExceededError(absl::StrCat(
                    "job ", id_, ": the client sent nothing for ", ctx_.options.client_idle_s,
                    " s while the job waited for ", waiting_for,
                    " (fxdp-server --client-idle-s); its workers are freed")),
                -1);
}

absl::Status JobRunner::BadInput(absl::string_view error) {
  return Finish(JobChange::kFail,
                absl::InvalidArgumentError(absl::StrCat("job ", id_, ": ", error)), -1);
}

absl::Status JobRunner::BadInput(const absl::Status& status) {
  return Finish(JobChange::kFail,
                absl::Status(status.code(), absl::StrCat("job ", id_, ": ", status.message())), -1);
}

std::string JobRunner::LostError(int rank) const {
  return absl::StrCat("job ", id_, ": rank ", rank, " (worker ", ranks_->worker(rank),
                      ") was lost: its stream ended or it missed its heartbeats");
}

absl::Status JobRunner::Lost(int rank) {
  return Finish(JobChange::kFail, absl::UnavailableError(LostError(rank)), rank);
}

// Whether a rank's failure code is what a peer's failure looks like from
// its side (a collective cut short or timed out), not a cause of its own.
static bool PeerSymptom(int code) {
  return code == static_cast<int>(absl::StatusCode::kUnavailable) ||
         code == static_cast<int>(absl::StatusCode::kDeadlineExceeded);
}

// A peer's loss or failure usually shows up as a JobFailed of a survivor
// first or right after: prefer naming the lost rank, or the rank that failed
// for a reason of its own (e.g. RESOURCE_EXHAUSTED), when it comes soon.
absl::Status JobRunner::Failed(const Job::Msg& msg) {
  if (msg.lost) return Lost(msg.rank);
  const v1::JobFailed& f = msg.m.job_failed();
  // A worker's text is kept in the job's record, listed and logged: bounded.
  constexpr size_t kMaxError = 4096;
  const std::string error =
      f.error().size() <= kMaxError
          ? f.error()
          : absl::StrCat(f.error().substr(0, kMaxError), "... (", f.error().size(), " bytes, cut)");
  if (PeerSymptom(f.code())) {
    const auto until = Clock::now() + std::chrono::milliseconds(1500);
    Job::Msg other;
    while (Clock::now() < until) {
      const double left = std::chrono::duration<double>(until - Clock::now()).count();
      if (Next(false, false, left, &other) != Got::kWorker) break;
      if (other.lost) {
        return Finish(JobChange::kFail,
                      absl::UnavailableError(absl::StrCat(LostError(other.rank), " (rank ",
                                                          msg.rank, ": ", error, ")")),
                      other.rank);
      }
      if (other.m.has_job_failed() && !PeerSymptom(other.m.job_failed().code())) {
        return Failed(other);
      }
    }
  }
  int code = f.code();
  if (code <= 0 || code > 16) code = static_cast<int>(absl::StatusCode::kUnknown);
  return Finish(JobChange::kFail,
                absl::Status(static_cast<absl::StatusCode>(code),
                             absl::StrCat("job ", id_, ": rank ", msg.rank, " (worker ",
                                          ranks_->worker(msg.rank), ") failed",
                                          f.step() > 0 ? absl::StrCat(" at step ", f.step()) : "",
                                          ": ", error)),
                msg.rank);
}

absl::Status JobRunner::Succeeded(std::shared_ptr<StateStore::State> state) {
  if (absl::Status s = ctx_.table->Succeed(job_, std::move(state)); !s.ok()) {
    return Finish(JobChange::kFail,
                  absl::Status(s.code(), absl::StrCat("job ", id_, ": ", s.message())), -1);
  }
  if (absl::Status s = job_->Change(JobChange::kSucceed); !s.ok())
    return Finish(JobChange::kFail, s, -1);
  client_->Write(job_->Event(v1::JOB_STATE_SUCCEEDED));
  return absl::OkStatus();
}

absl::Status JobRunner::SucceedOnTheWorkers() {
  const std::string path = job_->Info().checkpoint_path();
  Log(absl::StrCat(id_, ": its final state is the workers' checkpoint ", path, " (not collected)"));
  ranks_->CancelAssigned(
      absl::StrCat("job ", id_, " SUCCEEDED: its final state is the checkpoint ", path), -1);
  std::vector<bool> ended(world_, false);
  int left = world_;
  Job::Msg msg;
  while (left > 0) {
    const Got got = Next(false, true, 3600, &msg);
    if (got == Got::kCancel) break;  // too late to change anything: the state is written
    if (got != Got::kWorker || msg.rank < 0 || msg.rank >= world_) continue;
    if (msg.lost || msg.m.has_job_failed()) return Failed(msg);
    if (msg.m.has_job_ended() && !ended[msg.rank]) {
      ended[msg.rank] = true;
      --left;
    }
  }
  return Succeeded(nullptr);
}

absl::Status JobRunner::End() {
  client_->SetReadBudget(0);
  // Before the final state is asked for (REPLICATE: rank 0's; the others
  // are cancelled, which would cut their checkpoint's files short).
  if (absl::Status s = AwaitLastCheckpoint(); !s.ok()) return s;
  // The workers wrote the checkpoint of the last step: that is the final
  // state, which never passes through the server (issue 27: a model that
  // does not fit one process); the ranks end by CancelJob.
  if (job_->plan().spec.has_checkpoints() && last_checkpoint_ == first_ + steps_)
    return SucceedOnTheWorkers();
  if (const int gone = state_->Request(ranks_.get(), first_ + steps_, /*end_job=*/true); gone >= 0)
    return Lost(gone);
  // Every step ran and the ranks are sending their state: a cancel keeps it
  // (CollectLastState takes the answer to this request), a lost or failed
  // rank keeps the last checkpoint and says so (KeepLastState).
  final_asked_ = true;
  Job::Msg msg;
  while (true) {
    const Got got = Next(false, true, 3600, &msg);
    if (got == Got::kCancel) {
      stepping_ = true;
      return Cancelled();
    }
    if (got != Got::kWorker || !state_->Awaits(msg.rank))
      continue;  // REPLICATE: the others end by CancelJob
    if (msg.lost || msg.m.has_job_failed()) {
      stepping_ = true;
      return Failed(msg);
    }
    if (!msg.m.has_state_chunk()) continue;
    std::optional<StateCollector::Collected> done;
    if (absl::Status s = state_->Add(msg, &done); !s.ok()) return Finish(JobChange::kFail, s, -1);
    if (!done) continue;
    if (!done->state.ok()) {
      const absl::Status& s = done->state.status();
      return Finish(JobChange::kFail,
                    absl::Status(s.code(), absl::StrCat("job ", id_, ": ", s.message())), -1);
    }
    return Succeeded(std::make_shared<StateStore::State>(*std::move(done->state)));
  }
}

}  // namespace fxdp::server
