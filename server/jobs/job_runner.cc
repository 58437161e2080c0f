#include "server/jobs/job_runner.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/audit.h"
#include "server/jobs/job_resume.h"
#include "server/jobs/memory_admission.h"
#include "server/jobs/raw_tensors.h"
#include "server/log.h"

namespace fxdp::server {

absl::Status RunJob(const JobContext& context, JobClient* client, std::shared_ptr<Job> job) {
  JobRunner runner(context, client, job);
  absl::Status status = runner.Serve();
  runner.ReleaseHeldState();  // a job that ended before it started
  if (runner.queued()) {
    context.table->Finished(job);
    context.scheduler->Ended(job);
    std::lock_guard<std::mutex> l(job->mu);
    Log(absl::StrCat(job->info.job_id(), ": ", v1::JobState_Name(job->info.state()),
                     job->info.error().empty() ? "" : ": ", job->info.error()));
  }
  return status;
}

absl::Status JobRunner::Serve() {
  absl::StatusOr<v1::JobEvent> first;
  if (job_->recovered) {  // queued again after a restart (JobServiceImpl::Recover)
    first = job_->Event(v1::JOB_STATE_QUEUED);
  } else {
    if (absl::Status s = TakeSpec(); !s.ok()) return s;
    first = ctx_.scheduler->Enqueue(job_);
    if (!first.ok()) return first.status();
  }
  queued_ = true;
  id_ = job_->id();
  if (ctx_.store != nullptr && !job_->resumed_from.empty() && !job_->recovered) {
    // Its state is the resumed job's checkpoint: its own from the start, so
    // that it can be resumed (or, reading files, run after a restart) too.
    if (absl::Status s = ctx_.store->ShareCheckpoint(job_->resumed_from, id_, job_->first_step);
        !s.ok()) {
      Log(absl::StrCat(id_, ": cannot record its checkpoint of step ", job_->first_step, " in ",
                       ctx_.store->dir(), ": ", s.message()));
    } else {
      std::lock_guard<std::mutex> l(job_->mu);
      job_->info.set_checkpoint_step(job_->first_step);
    }
  } else if (ctx_.store != nullptr && job_->has_initial_state && !job_->recovered) {
    // Recorded (outside the table's lock) so that the job can run after a restart.
    if (absl::Status s = ctx_.store->WriteInitialState(id_, job_->initial_state); !s.ok()) {
      Log(absl::StrCat(id_, ": cannot record the initial state in ", ctx_.store->dir(),
                       " (the job cannot run "
                       "again after a restart): ",
                       s.message()));
    }
  }
  const v1::JobSpec& spec = job_->spec;
  Log(absl::StrCat(
      id_, ": submitted, ", spec.world_size(), " ranks, ",
      spec.steps() > 0 ? absl::StrCat(spec.steps(), " steps") : "open-ended",
      spec.data_paths_size() > 0
          ? absl::StrCat(", batches from ", absl::StrJoin(spec.data_paths(), ", "))
          : "",
      job_->schedule.empty()
          ? ""
          : absl::StrCat(", schedule for ", absl::StrJoin(job_->schedule.names(), ", ")),
      job_->resumed_from.empty() ? ""
                                 : absl::StrCat(", resuming ", job_->resumed_from,
                                                " from its checkpoint of step ", job_->first_step),
      job_->expanded.cached() ? " (compile cache hit)" : " (compiled: cache miss)"));
  const std::string world = absl::StrCat(spec.world_size());
  if (job_->resumed_from.empty()) {
    Audit("submit", {{"identity", job_->owner.description},
                     {"peer", job_->owner.peer},
                     {"job", id_},
                     {"name", spec.name()},
                     {"world_size", world}});
  } else {
    Audit("submit", {{"identity", job_->owner.description},
                     {"peer", job_->owner.peer},
                     {"job", id_},
                     {"name", spec.name()},
                     {"world_size", world},
                     {"resumes", job_->resumed_from}});
  }
  client_->Write(*std::move(first));
  absl::Status status;
  if (!WaitInQueue(&status)) return status;
  std::vector<std::string> workers;
  {
    std::lock_guard<std::mutex> l(job_->mu);
    workers = job_->workers;
  }
  world_ = static_cast<int>(workers.size());
  first_ = job_->first_step;
  steps_ = spec.steps() > 0 ? spec.steps() - first_ : 0;
  Log(absl::StrCat(id_, ": dispatched to ", absl::StrJoin(workers, ", ")));
  ranks_ = std::make_unique<Dispatcher>(ctx_.pool, job_, id_, std::move(workers));
  sharder_ = std::make_unique<BatchSharder>(id_, world_, ctx_.options.chunk_bytes, &job_->inputs,
                                            &job_->placeholders, &job_->schedule);
  sharder_->set_first_step(first_);
  state_ = MakeStateCollector(id_, world_, job_->expanded, &job_->declared_state,
                              ctx_.options.chunk_bytes);
  return Run();
}

JobRunner::Got JobRunner::Next(bool want_client, bool watch_client, double timeout_s,
                               Job::Msg* worker, v1::SubmitJobRequest* client) {
  const auto deadline = Clock::now() + Seconds(timeout_s);
  size_t consumed = 0;
  Got got = Got::kTimeout;
  {
    std::unique_lock<std::mutex> l(job_->mu);
    while (true) {
      if (!job_->cancel && watch_client && job_->client_gone) {
        job_->cancel = true;
        job_->cancel_reason = "the client of Submit went away";
      }
      if (job_->cancel) {
        got = Got::kCancel;
        break;
      }
      if (!job_->inbox.empty()) {
        *worker = std::move(job_->inbox.front());
        job_->inbox.pop_front();
        got = Got::kWorker;
        break;
      }
      if (want_client && !job_->from_client.empty()) {
        client->Swap(&job_->from_client.front().first);
        consumed = job_->from_client.front().second;
        job_->from_client.pop_front();
        got = Got::kClient;
        break;
      }
      if (want_client && job_->client_ended) {
        got = Got::kClientEnd;
        break;
      }
      const auto now = Clock::now();
      if (now >= deadline) break;
      job_->cv.wait_for(l,
                        std::min<Clock::duration>(std::chrono::milliseconds(100), deadline - now));
    }
  }
  if (consumed > 0) client_->Consumed(consumed);
  return got;
}

absl::Status JobRunner::TakeSpec() {
  v1::SubmitJobRequest first;
  Job::Msg unused;
  const double idle = ctx_.options.client_idle_s;
  const Got got = Next(true, true, idle, &unused, &first);
  if (got == Got::kTimeout) {
    return absl::DeadlineExceededError(absl::StrCat("the Submit stream sent no JobSpec within ",
                                                    idle, " s (fxdp-server --client-idle-s)"));
  }
  client_->SetReadBudget(0);  // nothing more is read while the job waits in the queue
  if (got == Got::kCancel) return absl::CancelledError("the client went away");
  if (got == Got::kClientEnd) {
    return absl::InvalidArgumentError(
        "the Submit stream ended before its first message (the JobSpec)");
  }
  if (!first.has_spec()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the first SubmitJobRequest must carry the JobSpec, got ", SubmitRequestKind(first)));
  }
  // With --state-dir a data_paths job is recorded as submitted, to be run
  // again after a restart; so is a job that is checkpointed or resumes
  // another, to check a resume of it against (job_resume.h).
  const v1::JobSpec& submitted = first.spec();
  if (absl::Status s = CheckDataPathsExcluded(submitted, ctx_.options.data_excluded); !s.ok())
    return s;
  const bool from_files = ctx_.store != nullptr && submitted.data_paths_size() > 0;
  const bool resume = !submitted.resume_job().empty();
  if (ctx_.store != nullptr && (from_files || resume || ctx_.options.checkpoint_every > 0)) {
    job_->submitted = submitted;
  }
  // More ranks than workers fail before the graph is expanded for them.
  if (absl::Status s = ctx_.scheduler->CheckPlaceable(submitted.world_size()); !s.ok()) return s;
  // What the graph declares, against the limits, before anything is
  // compiled or held (a data_paths job's state; a resume's checkpoint).
  job_->declared_state =
      ir::DeclaredTensors::Of(submitted.graph(), ir::DeclaredTensors::Kind::kState);
  job_->declared_batch =
      ir::DeclaredTensors::Of(submitted.graph(), ir::DeclaredTensors::Kind::kBatch);
  if (absl::Status s = CheckCollectiveTimeout(submitted, ctx_.options.max_collective_timeout_s);
      !s.ok())
    return s;
  if (absl::Status s = CheckDeclaredSizes(submitted, from_files || resume); !s.ok()) return s;
  std::optional<ResumeStart> start;
  if (resume) {
    absl::StatusOr<ResumeStart> r = PrepareResume(*ctx_.table, ctx_.store, job_->owner, submitted,
                                                  ctx_.options.checkpoint_every, job_);
    if (!r.ok()) return r.status();
    start = *std::move(r);
  }
  absl::StatusOr<PreparedSpec> p = PrepareJobSpec(std::move(*first.mutable_spec()), ctx_.expand);
  if (!p.ok()) return p.status();
  job_->spec = std::move(p->spec);
  job_->expanded = std::move(p->expanded);
  job_->inputs = std::move(p->inputs);
  job_->placeholders = std::move(p->placeholders);
  job_->schedule = std::move(p->schedule);
  if (start) {
    StartFromCheckpoint(*std::move(start));
    return absl::OkStatus();
  }
  return from_files ? TakeInitialState() : absl::OkStatus();
}

void JobRunner::StartFromCheckpoint(ResumeStart start) {
  job_->spec.set_num_state_tensors(static_cast<uint32_t>(start.state.size()));
  job_->initial_state = std::move(start.state);
  job_->has_initial_state = true;
  job_->first_step = start.step;
  job_->resumed_from = start.from;
  std::lock_guard<std::mutex> l(job_->mu);
  job_->info.set_resumed_from(start.from);
  job_->info.set_steps_done(start.step);
  *job_->info.mutable_losses() = {start.losses.begin(), start.losses.end()};
}

bool JobRunner::WaitInQueue(absl::Status* status) {
  int position = -1;
  std::string message;
  {
    std::lock_guard<std::mutex> l(job_->mu);
    position = job_->info.queue_position();
    message = job_->info.message();
  }
  while (true) {
    bool changed = false, gone = false;
    {
      std::unique_lock<std::mutex> l(job_->mu);
      job_->cv.wait_for(l, std::chrono::milliseconds(100), [&] {
        return job_->dispatched || Terminal(job_->info.state()) || job_->client_gone ||
               job_->info.queue_position() != position || job_->info.message() != message;
      });
      if (job_->dispatched) return true;
      if (Terminal(job_->info.state())) {
        *status = absl::Status(static_cast<absl::StatusCode>(job_->info.error_code()),
                               job_->info.error());
      } else if (job_->info.queue_position() != position || job_->info.message() != message) {
        position = job_->info.queue_position();
        message = job_->info.message();
        changed = true;
      }
      gone = job_->client_gone;
    }
    if (!status->ok()) {
      client_->Write(job_->Event(job_->state()));
      return false;
    }
    if (changed) client_->Write(job_->Event(v1::JOB_STATE_QUEUED));
    if (gone) {
      const absl::Status cancelled = absl::CancelledError(
          absl::StrCat("job ", id_, " cancelled while queued: the client of Submit went away"));
      if (ctx_.scheduler->CancelQueued(id_, "the client of Submit went away", cancelled)) {
        *status = cancelled;
        return false;
      }
      // Dispatched meanwhile: the run sees that the client is gone.
    }
  }
}

absl::Status JobRunner::Run() {
  client_->SetReadBudget(ctx_.options.read_ahead_bytes);
  {
    std::lock_guard<std::mutex> l(job_->mu);
    if (job_->client_gone && !job_->cancel) {
      job_->cancel = true;
      job_->cancel_reason = "the client of Submit went away";
    }
  }
  // Nothing is assigned yet: a job cancelled now frees its workers at once.
  if (CancelRequested()) return Cancelled();
  if (absl::Status s = CheckMemory(); !s.ok()) return Finish(JobChange::kFail, s, -1);
  std::vector<int64_t> handles;
  const int lost = ranks_->Subscribe(&handles);
  ctx_.scheduler->AddHandles(job_, handles);
  if (lost >= 0) return Lost(lost);
  if (absl::Status s = job_->Change(JobChange::kStart); !s.ok())
    return Finish(JobChange::kFail, s, -1);
  ctx_.table->Update(job_);
  if (absl::Status s = Assign(); !s.ok()) return s;
  client_->Write(job_->Event(v1::JOB_STATE_RUNNING));
  for (auto phase :
       {&JobRunner::ForwardState, &JobRunner::AwaitStarted, &JobRunner::Steps, &JobRunner::End}) {
    if (absl::Status s = (this->*phase)(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status JobRunner::CheckMemory() {
  std::vector<std::string> workers;
  for (int r = 0; r < ranks_->world(); ++r) workers.push_back(ranks_->worker(r));
  return CheckRanksFit(id_, job_->expanded, workers, ctx_.pool->List());
}

// A rank's message outside of the steps: a failure ends the job, JobStarted
// is counted, anything else is ignored.
absl::Status JobRunner::OnWorker(const Job::Msg& msg) {
  if (msg.lost || msg.m.has_job_failed()) return Failed(msg);
  started_ += msg.m.has_job_started();
  return absl::OkStatus();
}

bool JobRunner::CancelRequested() {
  std::lock_guard<std::mutex> l(job_->mu);
  return job_->cancel;
}

absl::Status JobRunner::SendAll(const v1::ServerMessage& m) {
  const int gone = ranks_->SendAll(m);
  return gone < 0 ? absl::OkStatus() : Lost(gone);
}

absl::Status JobRunner::Assign() {
  const int port = FreeLocalPort();
  if (port == 0)
    return Finish(JobChange::kFail, absl::InternalError("no free rendezvous port"), -1);
  const int gone = ranks_->Assign(ranks_->RendezvousHost(), port, steps_);
  return gone < 0 ? absl::OkStatus() : Lost(gone);
}

absl::Status JobRunner::AwaitStarted() {
  Job::Msg msg;
  while (started_ < world_) {
    const Got got = Next(false, true, 3600, &msg);
    if (got == Got::kCancel) return Cancelled();
    if (got != Got::kWorker) continue;
    if (absl::Status s = OnWorker(msg); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace fxdp::server
