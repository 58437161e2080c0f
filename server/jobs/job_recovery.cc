#include "server/jobs/job_recovery.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/log.h"

namespace fxdp::server {
namespace {

// The job failed because of the restart: recorded as FAILED (UNAVAILABLE).
void FailRecovered(JobStore* store, const std::shared_ptr<Job>& job, const std::string& why) {
  const std::string id = job->id();
  job->Change(JobChange::kFail, absl::UnavailableError(absl::StrCat("job ", id, ": ", why)))
      .IgnoreError();  // refused: logged
  v1::JobInfo info;
  {
    std::lock_guard<std::mutex> l(job->mu);
    info = job->info;
  }
  if (absl::Status s = store->Update(info, /*ended=*/true); !s.ok()) {
    Log(absl::StrCat(id, ": cannot update the job in ", store->dir(), ": ", s.message()));
  }
  Log(absl::StrCat(id, ": ", info.error()));
}

}  // namespace

absl::StatusOr<RecoveredJobs> RecoverJobs(JobStore* store, const Expander& expand) {
  absl::StatusOr<std::vector<JobStore::Record>> records = store->Load();
  if (!records.ok()) return records.status();
  RecoveredJobs out;
  for (JobStore::Record& r : *records) {
    auto job = std::make_shared<Job>();
    job->info = std::move(r.info);
    job->info.set_has_state(r.has_final_state);
    job->info.set_checkpoint_step(r.checkpoint_step);
    // Ownership survives: the identity that submitted it (JobInfo.owner).
    job->owner.identity = job->info.owner();
    if (!job->owner.identity.empty()) job->owner.description = job->owner.identity;
    job->owner.peer = "(before the restart)";
    out.last_seq = std::max(out.last_seq, r.seq);
    out.jobs.push_back(job);
    const v1::JobState state = job->info.state();
    if (Terminal(state)) continue;
    // The job was cut short: its checkpoint file names the step it holds
    // (the database's may lag it by one checkpoint).
    std::optional<JobStore::Checkpoint> checkpoint;
    if (r.checkpoint_step > 0) {
      absl::StatusOr<JobStore::Checkpoint> c = store->ReadCheckpoint(job->info.job_id());
      if (c.ok()) {
        checkpoint = *std::move(c);
      } else {
        Log(absl::StrCat(job->info.job_id(),
                         ": its checkpoint cannot be read: ", c.status().message()));
      }
    }
    const int64_t k = checkpoint ? checkpoint->step : 0;
    job->info.set_checkpoint_step(k);
    // A data_paths job with a checkpoint resumes from it (a job queued as a
    // resume of another has that one's checkpoint as its own).
    const bool resume = r.spec.data_paths_size() > 0 && k > 0;
    // A streamed one fails; with a checkpoint its client can resume it.
    const std::string again =
        k > 0 ? absl::StrCat("resume it from its checkpoint of step ", k, " (fxdp run --resume ",
                             job->info.job_id(), ", or fxdp.Client.train(resume=...))")
              : "submit it again";
    if (state != v1::JOB_STATE_QUEUED && !resume) {
      FailRecovered(
          store, job,
          absl::StrCat(
              "the server restarted while the job ran (its Submit stream ended with the server "
              "and its workers were released); ",
              again));
      continue;
    }
    if (r.spec.data_paths_size() == 0) {
      FailRecovered(
          store, job,
          absl::StrCat(
              "the server restarted while the job was queued; its batches came over its Submit "
              "stream, which ended with the server: ",
              again));
      continue;
    }
    if (!resume && !r.has_initial_state) {
      FailRecovered(
          store, job,
          "the server restarted before the job's initial state was recorded: submit it again");
      continue;
    }
    // A running job resumes from its checkpoint, a queued one starts.
    absl::StatusOr<JobStore::Tensors> initial =
        resume ? std::move(checkpoint->state) : store->ReadInitialState(job->info.job_id());
    absl::StatusOr<PreparedSpec> p = initial.ok() ? PrepareJobSpec(std::move(r.spec), expand)
                                                  : absl::StatusOr<PreparedSpec>(initial.status());
    if (!p.ok()) {
      FailRecovered(
          store, job,
          absl::StrCat(
              "the server restarted while the job was queued, and it cannot be queued again: ",
              p.status().message()));
      continue;
    }
    job->spec = std::move(p->spec);
    job->expanded = std::move(p->expanded);
    job->inputs = std::move(p->inputs);
    job->placeholders = std::move(p->placeholders);
    job->schedule = std::move(p->schedule);
    job->declared_state = std::move(p->state);
    job->declared_batch = std::move(p->batch);
    job->initial_state = *std::move(initial);
    job->has_initial_state = true;
    job->recovered = true;
    job->info.set_queue_position(0);
    job->info.set_message("queued again after a server restart");
    if (resume) {
      job->first_step = k;
      job->spec.set_num_state_tensors(static_cast<uint32_t>(job->initial_state.size()));
      if (state == v1::JOB_STATE_RUNNING) {
        ApplyChange(&job->info, JobChange::kRequeue, absl::OkStatus()).IgnoreError();
      }
      job->info.set_steps_done(k);
      job->info.mutable_losses()->Truncate(
          static_cast<int>(std::min<int64_t>(k, job->info.losses_size())));
      job->info.clear_workers();
      job->info.set_message(
          absl::StrCat("resumed from the checkpoint of step ", k, " after a server restart"));
      Log(absl::StrCat(job->info.job_id(), ": ", job->info.message()));
    }
    out.to_run.push_back(job);
  }
  return out;
}

}  // namespace fxdp::server
