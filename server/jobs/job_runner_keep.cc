// JobRunner's kept state (job_runner.h): a job that fails or is cancelled
// while it runs keeps the state of its last completed step (job_lifecycle.h,
// StateKept::kLastStep). While its ranks are alive (a cancel, bad client
// input, an idle client) no new step is sent, the steps sent finish (their
// losses recorded, so steps_done is the step kept), and the state after the
// last one is collected through the job's StateCollector (REPLICATE: rank
// 0's; FULLY_SHARD: every rank's shards, reassembled) within
// --keep-state-s, then kept as the job's checkpoint (JobTable::KeepLastState).
// A rank that failed or was lost takes its state with it and the others are
// mid-step with it: the job keeps its last checkpoint, if any, and its error
// says which state is kept or why none is. A job whose workers write its
// checkpoints (JobSpec.checkpoints) collects nothing: the steps sent finish,
// the checkpoint due after them completes, and its newest checkpoint on the
// workers is what it keeps (issue 27: its state never passes through the
// server); its error names it and the completed steps after it, lost.
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/jobs/job_runner.h"
#include "server/log.h"

namespace fxdp::server {

// A rank lost or failing while the job waits for its last steps.
absl::Status JobRunner::RankEnded(const Job::Msg& msg, int64_t step) const {
  return absl::UnavailableError(
      absl::StrCat("rank ", msg.rank, " (worker ", ranks_->worker(msg.rank), ") ",
                   msg.lost ? "was lost" : absl::StrCat("failed: ", msg.m.job_failed().error()),
                   " while it finished step ", step));
}

void JobRunner::TakeDelivered() {
  Job::Msg msg;
  while (job_->NextRank(Clock::now(), &msg)) {
    if (!msg.lost && msg.m.has_step_result()) OnStepResult(msg);
  }
}

absl::Status JobRunner::CollectLastState(int64_t* step, StateStore::State* state) {
  const double wait_s = ctx_.options.keep_state_s;
  const auto deadline = Clock::now() + Seconds(wait_s);
  const int64_t want = first_ + sent_;
  bool asked = final_asked_;  // End's request for the final state is answered first
  Job::Msg msg;
  while (true) {
    // The ranks answer between steps: once every step sent has its results,
    // the state they give is the one after step `want`.
    if (!asked && pending_.empty()) {
      if (const int gone = state_->Request(ranks_.get(), want, /*end_job=*/true); gone >= 0)
        return absl::UnavailableError(absl::StrCat("rank ", gone, " is gone"));
      asked = true;
    }
    if (!job_->NextRank(deadline, &msg)) {
      return absl::DeadlineExceededError(
          absl::StrCat(asked ? absl::StrCat("the ranks did not give their state after step ", want)
                       : first_ + pending_.front().step == want
                           ? absl::StrCat("step ", want, " did not finish")
                           : absl::StrCat("steps ", first_ + pending_.front().step, " ... ", want,
                                          " did not finish"),
                       " within ", wait_s, " s (fxdp-server --keep-state-s)"));
    }
    if (msg.lost || msg.m.has_job_failed()) {
      return RankEnded(msg, want);
    }
    if (msg.m.has_step_result()) OnStepResult(msg);
    if (!msg.m.has_state_chunk()) continue;
    std::optional<StateCollector::Collected> done;
    if (absl::Status s = state_->Add(msg, &done); !s.ok()) return s;
    if (!done) continue;
    if (done->step != want) {  // a --checkpoint-every request made before
      if (done->state.ok()) SaveCheckpoint(done->step, *std::move(done->state));
      continue;
    }
    if (!done->state.ok()) return done->state.status();
    *step = want;
    *state = *std::move(done->state);
    return absl::OkStatus();
  }
}

absl::Status JobRunner::AwaitSentCheckpoints() {
  const int64_t every = job_->plan().spec.checkpoints().every();
  const int64_t last = first_ + sent_;
  const int64_t due = steps_ > 0 && sent_ == steps_ ? last : every > 0 ? last / every * every : 0;
  const double wait_s = ctx_.options.keep_state_s;
  const auto deadline = Clock::now() + Seconds(wait_s);
  Job::Msg msg;
  while (!pending_.empty() || (due > first_ && last_checkpoint_ < due)) {
    if (!job_->NextRank(deadline, &msg)) {
      return absl::DeadlineExceededError(
          absl::StrCat(pending_.empty() ? absl::StrCat("the checkpoint of step ", due)
                                        : absl::StrCat("step ", last),
                       " did not complete within ", wait_s, " s (fxdp-server --keep-state-s)"));
    }
    if (msg.lost || msg.m.has_job_failed()) {
      return RankEnded(msg, last);
    }
    if (msg.m.has_step_result()) OnStepResult(msg);
    if (msg.m.has_checkpoint_written()) OnCheckpointWritten(msg);
  }
  return absl::OkStatus();
}

absl::Status JobRunner::KeepLastState(const absl::Status& status, int except) {
  stepping_ = false;
  const bool sharded = job_->plan().expanded.sharded_state_size() > 0;
  std::string why_not;
  if (except >= 0) {
    TakeDelivered();  // the results already in: steps_done agrees with the error
    why_not =
        absl::StrCat("rank ", except, " took its state with it and the other ranks were ",
                     final_asked_ ? "sending the final state with it; " : "in a step with it; ",
                     sharded ? "a FULLY_SHARD job's state needs every rank's shard"
                             : "a REPLICATE job's state needs a living rank between steps");
  } else if (first_ + sent_ == 0) {
    return status;  // no step ran: the client has the initial state
  } else if (job_->plan().spec.has_checkpoints()) {
    // Its workers write its checkpoints (JobSpec.checkpoints): its state
    // never passes through the server, not even when it ends early (issue
    // 27); its work is kept at the last checkpoint they completed.
    why_not = "its workers write its checkpoints (JobSpec.checkpoints): the server collects none";
    if (absl::Status s = AwaitSentCheckpoints(); !s.ok()) {
      TakeDelivered();  // the results already in: steps_done says which steps are lost
      absl::StrAppend(&why_not, "; ", s.message());
    }
  } else {
    int64_t step = 0;
    StateStore::State state;
    absl::Status s = CollectLastState(&step, &state);
    if (s.ok()) {
      s = ctx_.table->KeepLastState(job_, step,
                                    std::make_shared<const StateStore::State>(std::move(state)));
    }
    if (s.ok() && ctx_.counters != nullptr) ++ctx_.counters->states_kept;
    if (s.ok()) return KeptSaid(status, absl::StrCat("its state after step ", step, " is kept"));
    Log(absl::StrCat(id_, ": the state of its last step is not kept: ", s.message()));
    why_not = std::string(s.message());
  }
  const v1::JobInfo info = job_->Info();
  const int64_t checkpoint = info.checkpoint_step();
  const bool on_workers = job_->plan().spec.has_checkpoints();
  const int64_t done = info.steps_done();
  const std::string lost =
      done > checkpoint
          ? absl::StrCat(done == checkpoint + 1 ? "step " : "steps ", checkpoint + 1,
                         done == checkpoint + 1 ? "" : absl::StrCat(" to ", done), " of the ", done,
                         " completed ", done == checkpoint + 1 ? "is" : "are", " lost")
          : std::string("it is the last completed step");
  if (checkpoint > 0 && !info.checkpoint_path().empty()) {
    return absl::Status(
        status.code(),
        absl::StrCat(status.message(), "; the server keeps no state (", why_not,
                     "); its work is kept in the workers' checkpoint of step ", checkpoint, ", '",
                     info.checkpoint_path(), "' (", lost, "): ",
                     ctx_.store != nullptr
                         ? absl::StrCat("resume it (JobSpec.resume_job '", id_,
                                        "', on any world size and style) or start a job from "
                                        "it with initial_checkpoint")
                         : "start a job from it with initial_checkpoint (JobSpec."
                           "initial_checkpoint; a resume needs fxdp-server --state-dir)"));
  }
  if (on_workers) {
    return absl::Status(
        status.code(),
        absl::StrCat(status.message(), "; no state is kept (", why_not, ") and its workers ",
                     "completed no checkpoint (JobSpec.checkpoints.every ",
                     job_->plan().spec.checkpoints().every(), "): its ", done,
                     " completed steps are lost"));
  }
  if (checkpoint > 0) {
    job_->SetHasState(true);
    return KeptSaid(status, absl::StrCat("its checkpoint of step ", checkpoint,
                                         " is kept, not its last step's (", why_not, ")"));
  }
  return absl::Status(
      status.code(),
      absl::StrCat(status.message(), "; no state is kept (", why_not,
                   ") and it has no checkpoint (fxdp-server --state-dir DIR --checkpoint-every "
                   "K keeps one every K steps)"));
}

absl::Status JobRunner::KeptSaid(const absl::Status& status, const std::string& kept) const {
  return absl::Status(
      status.code(),
      absl::StrCat(status.message(), "; ", kept, " (fxdp fetch ", id_,
                   ctx_.store != nullptr
                       ? absl::StrCat(", or continue it: fxdp run ... --resume ", id_, ")")
                       : std::string(")")));
}

}  // namespace fxdp::server
