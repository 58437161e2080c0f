#include "server/jobs/job_lifecycle.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/jobs/job.h"

namespace fxdp::server {
namespace {

// What each state means; one row per state.
struct StateFacts {
  v1::JobState state;
  bool terminal, final_state, keeps_checkpoint;
};

constexpr StateFacts kStates[] = {
    // state                   terminal final_state keeps_checkpoint
    {v1::JOB_STATE_UNSPECIFIED, false, false, false}, {v1::JOB_STATE_QUEUED, false, false, true},
    {v1::JOB_STATE_RUNNING, false, false, true},      {v1::JOB_STATE_SUCCEEDED, true, true, false},
    {v1::JOB_STATE_FAILED, true, false, true},        {v1::JOB_STATE_CANCELLED, true, false, true},
};

const StateFacts& Facts(v1::JobState s) {
  for (const StateFacts& f : kStates) {
    if (f.state == s) return f;
  }
  return kStates[0];
}

}  // namespace

const std::vector<JobTransition>& JobTransitions() {
  using C = JobChange;
  using K = StateKept;
  static const std::vector<JobTransition>* const table = new std::vector<JobTransition>{
      {v1::JOB_STATE_UNSPECIFIED, C::kQueue, v1::JOB_STATE_QUEUED, K::kNothing},
      {v1::JOB_STATE_QUEUED, C::kStart, v1::JOB_STATE_RUNNING, K::kNothing},
      {v1::JOB_STATE_QUEUED, C::kFail, v1::JOB_STATE_FAILED, K::kNothing},
      {v1::JOB_STATE_QUEUED, C::kCancel, v1::JOB_STATE_CANCELLED, K::kNothing},
      {v1::JOB_STATE_RUNNING, C::kSucceed, v1::JOB_STATE_SUCCEEDED, K::kFinal},
      {v1::JOB_STATE_RUNNING, C::kFail, v1::JOB_STATE_FAILED, K::kLastStep},
      {v1::JOB_STATE_RUNNING, C::kCancel, v1::JOB_STATE_CANCELLED, K::kLastStep},
      {v1::JOB_STATE_RUNNING, C::kRequeue, v1::JOB_STATE_QUEUED, K::kNothing},
  };
  return *table;
}

std::string StateName(v1::JobState s) {
  if (s == v1::JOB_STATE_UNSPECIFIED) return "NEW";
  std::string name = v1::JobState_Name(s);
  return name.rfind("JOB_STATE_", 0) == 0 ? name.substr(10) : name;
}

absl::string_view ChangeName(JobChange c) {
  switch (c) {
    case JobChange::kQueue: return "queue";
    case JobChange::kStart: return "start";
    case JobChange::kSucceed: return "succeed";
    case JobChange::kFail: return "fail";
    case JobChange::kCancel: return "cancel";
    case JobChange::kRequeue: return "requeue";
  }
  return "?";
}

bool Terminal(v1::JobState s) { return Facts(s).terminal; }
bool HasFinalState(v1::JobState s) { return Facts(s).final_state; }
bool KeepsCheckpoint(v1::JobState s) { return Facts(s).keeps_checkpoint; }
bool Resumable(v1::JobState s) { return Terminal(s) && KeepsCheckpoint(s); }

StateKept KeptBy(v1::JobState from, JobChange change) {
  for (const JobTransition& t : JobTransitions()) {
    if (t.from == from && t.change == change) return t.kept;
  }
  return StateKept::kNothing;
}

absl::Status ApplyChange(v1::JobInfo* info, JobChange change, const absl::Status& status) {
  const v1::JobState from = info->state();
  const JobTransition* row = nullptr;
  std::vector<std::string> allowed;
  for (const JobTransition& t : JobTransitions()) {
    if (t.from != from) continue;
    if (t.change == change) row = &t;
    allowed.push_back(absl::StrCat(ChangeName(t.change), " (to ", StateName(t.to), ")"));
  }
  if (row == nullptr) {
    v1::JobState to = v1::JOB_STATE_UNSPECIFIED;  // where `change` leads from any state
    for (const JobTransition& t : JobTransitions()) {
      if (t.change == change) to = t.to;
    }
    return absl::FailedPreconditionError(
        absl::StrCat("job ", info->job_id().empty() ? "(new)" : info->job_id(), " cannot go from ",
                     StateName(from), " to ", StateName(to), " (", ChangeName(change), "): from ",
                     StateName(from), " ",
                     allowed.empty() ? "no change is allowed (it ended)"
                                     : absl::StrCat("only ", absl::StrJoin(allowed, ", "))));
  }
  const v1::JobState to = row->to;
  info->set_state(to);
  if (!status.ok()) info->set_error(std::string(status.message()));
  info->set_error_code(static_cast<int>(status.code()));
  if (to != v1::JOB_STATE_QUEUED) {
    info->set_queue_position(0);
    info->clear_message();
  }
  if (to == v1::JOB_STATE_RUNNING) info->set_started_unix_ms(UnixMs());
  if (Terminal(to)) info->set_ended_unix_ms(UnixMs());
  // A checkpoint the workers wrote (checkpoint_path) stays on their filesystem.
  if (Terminal(to) && !KeepsCheckpoint(to) && info->checkpoint_path().empty())
    info->clear_checkpoint_step();
  return absl::OkStatus();
}

}  // namespace fxdp::server
