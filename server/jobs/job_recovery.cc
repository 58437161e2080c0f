#include "server/jobs/job_recovery.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/jobs/job_resume.h"
#include "server/log.h"

namespace fxdp::server {
namespace {

// The job failed because of the restart: recorded as FAILED (UNAVAILABLE).
void FailRecovered(JobStore* store, v1::JobInfo* info, const std::string& why) {
  const std::string id = info->job_id();
  if (absl::Status s = ApplyChange(info, JobChange::kFail,
                                   absl::UnavailableError(absl::StrCat("job ", id, ": ", why)));
      !s.ok()) {
    Log(std::string(s.message()));
  }
  if (absl::Status s = store->Update(*info, /*ended=*/true); !s.ok()) {
    Log(absl::StrCat(id, ": cannot update the job in ", store->dir(), ": ", s.message()));
  }
  Log(absl::StrCat(id, ": ", info->error()));
}

// The owner of a recorded job: the identity that submitted it (JobInfo.owner).
JobOwner RecordedOwner(const v1::JobInfo& info) {
  JobOwner owner;
  owner.identity = info.owner();
  if (!owner.identity.empty()) owner.description = owner.identity;
  owner.peer = "(before the restart)";
  return owner;
}

// Why a job cut short in `state` cannot be queued again ("" when it can):
// a running one without a checkpoint to resume from, or one whose batches
// came over its Submit stream, or whose initial state was not recorded.
std::string WhyNotAgain(v1::JobState state, const JobStore::Record& r, bool resume,
                        const std::string& again) {
  if (state != v1::JOB_STATE_QUEUED && !resume) {
    return absl::StrCat(
        "the server restarted while the job ran (its Submit stream ended with the server "
        "and its workers were released); ",
        again);
  }
  if (r.spec.data_paths_size() == 0) {
    return absl::StrCat(
        "the server restarted while the job was queued; its batches came over its Submit "
        "stream, which ended with the server: ",
        again);
  }
  if (!resume && !r.has_initial_state) {
    return "the server restarted before the job's initial state was recorded: submit it again";
  }
  return "";
}

// A job that was queued or running when the server stopped: failed (in
// `info`, recorded), or its plan and initial state to run again (null).
std::shared_ptr<Job> RecoverCutShort(JobStore* store, const Expander& expand, JobStore::Record& r,
                                     v1::JobInfo* info) {
  const v1::JobState state = info->state();
  const std::string id = info->job_id();
  // Its checkpoint file names the step it holds (the database's may lag it
  // by one checkpoint).
  std::optional<JobStore::Checkpoint> checkpoint;
  if (r.checkpoint_step > 0) {
    absl::StatusOr<JobStore::Checkpoint> c = store->ReadCheckpoint(id);
    if (c.ok()) {
      checkpoint = *std::move(c);
    } else {
      Log(absl::StrCat(id, ": its checkpoint cannot be read: ", c.status().message()));
    }
  }
  const int64_t k = checkpoint ? checkpoint->step : 0;
  // A checkpoint its workers wrote (JobSpec.checkpoints) stays where it is:
  // the job fails naming it, for a resume (job_resume.h) to read it.
  const bool on_workers = k == 0 && info->checkpoint_step() > 0 && !info->checkpoint_path().empty();
  if (!on_workers) info->set_checkpoint_step(k);
  // A data_paths job with a checkpoint resumes from it (a job queued as a
  // resume of another has that one's checkpoint as its own), its workers'
  // one read by the new workers (every state tensor, as a resume of it).
  const bool from_workers = on_workers && r.spec.data_paths_size() > 0;
  const bool resume = r.spec.data_paths_size() > 0 && (k > 0 || from_workers);
  // A streamed one fails; with a checkpoint its client can resume it.
  std::string again =
      k > 0 ? absl::StrCat("resume it from its checkpoint of step ", k, " (fxdp run --resume ", id,
                           ", or fxdp.Client.train(resume=...))")
            : "submit it again";
  if (on_workers) {
    again = absl::StrCat("resume it from its workers' checkpoint of step ", info->checkpoint_step(),
                         ", '", info->checkpoint_path(), "' (fxdp.Client.train(resume='", id,
                         "'), on any world size and style)");
  }
  if (const std::string why = WhyNotAgain(state, r, resume, again); !why.empty()) {
    FailRecovered(store, info, why);
    return nullptr;
  }
  // A running job resumes from its checkpoint, a queued one starts.
  absl::StatusOr<JobStore::Tensors> initial = from_workers ? JobStore::Tensors{}
                                              : resume     ? std::move(checkpoint->state)
                                                           : store->ReadInitialState(id);
  if (from_workers) {
    *r.spec.mutable_initial_checkpoint() = WholeStateFrom(info->checkpoint_path(), r.spec.graph());
    r.spec.set_num_state_tensors(0);
  }
  absl::StatusOr<PreparedSpec> p = initial.ok() ? PrepareJobSpec(std::move(r.spec), expand)
                                                : absl::StatusOr<PreparedSpec>(initial.status());
  if (!p.ok()) {
    FailRecovered(
        store, info,
        absl::StrCat(
            "the server restarted while the job was queued, and it cannot be queued again: ",
            p.status().message()));
    return nullptr;
  }
  JobPlan plan = PlanOf(*std::move(p));
  plan.recovered = true;
  info->set_queue_position(0);
  info->set_message("queued again after a server restart");
  if (resume) {
    const int64_t at = from_workers ? info->checkpoint_step() : k;
    plan.first_step = at;
    if (!from_workers) {
      // The checkpoint holds the whole state: nothing is read by the workers.
      plan.spec.set_num_state_tensors(static_cast<uint32_t>(initial->size()));
      plan.spec.clear_initial_checkpoint();
      plan.declared_sent = plan.declared_state;
    }
    if (state == v1::JOB_STATE_RUNNING) {
      ApplyChange(info, JobChange::kRequeue, absl::OkStatus()).IgnoreError();
    }
    info->set_steps_done(at);
    info->mutable_losses()->Truncate(static_cast<int>(std::min<int64_t>(at, info->losses_size())));
    info->clear_workers();
    info->set_message(absl::StrCat("resumed from ",
                                   from_workers
                                       ? absl::StrCat("its workers' checkpoint of step ", at, ", '",
                                                      info->checkpoint_path(), "',")
                                       : absl::StrCat("the checkpoint of step ", at),
                                   " after a server restart"));
    Log(absl::StrCat(id, ": ", info->message()));
  }
  auto job = std::make_shared<Job>(RecordedOwner(*info), *info);
  job->SetPlan(std::move(plan));
  job->HoldInitialState(*std::move(initial));
  return job;
}

}  // namespace

absl::StatusOr<RecoveredJobs> RecoverJobs(JobStore* store, const Expander& expand) {
  absl::StatusOr<std::vector<JobStore::Record>> records = store->Load();
  if (!records.ok()) return records.status();
  RecoveredJobs out;
  for (JobStore::Record& r : *records) {
    v1::JobInfo info = std::move(r.info);
    info.set_has_state(r.has_final_state);
    // The server's checkpoint; one its workers wrote is the info's (checkpoint_path).
    if (info.checkpoint_path().empty()) info.set_checkpoint_step(r.checkpoint_step);
    out.last_seq = std::max(out.last_seq, r.seq);
    std::shared_ptr<Job> run;
    if (!Terminal(info.state())) run = RecoverCutShort(store, expand, r, &info);
    if (run != nullptr) {
      out.jobs.push_back(run);
      out.to_run.push_back(run);
    } else {
      out.jobs.push_back(std::make_shared<Job>(RecordedOwner(info), std::move(info)));
    }
  }
  return out;
}

}  // namespace fxdp::server
