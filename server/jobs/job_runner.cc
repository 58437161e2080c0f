#include "server/jobs/job_runner.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/audit.h"
#include "server/jobs/eval_kept.h"
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
    const v1::JobInfo info = job->Info();
    Log(absl::StrCat(info.job_id(), ": ", v1::JobState_Name(info.state()),
                     info.error().empty() ? "" : ": ", info.error()));
  }
  return status;
}

absl::Status JobRunner::Serve() {
  absl::StatusOr<v1::JobEvent> first;
  if (job_->plan().recovered) {  // queued again after a restart (JobServiceImpl::Recover)
    first = job_->Event(v1::JOB_STATE_QUEUED);
  } else {
    if (absl::Status s = TakeSpec(); !s.ok()) return s;
    first = ctx_.scheduler->Enqueue(job_);
    if (!first.ok()) return first.status();
  }
  queued_ = true;
  id_ = job_->id();
  RecordStart();
  LogSubmitted();
  client_->Write(*std::move(first));
  absl::Status status;
  if (!WaitInQueue(&status)) return status;
  const JobPlan& plan = job_->plan();
  std::vector<std::string> workers = job_->workers();
  world_ = static_cast<int>(workers.size());
  first_ = plan.first_step;
  steps_ = plan.spec.steps() > 0 ? plan.spec.steps() - first_ : 0;
  Log(absl::StrCat(id_, ": dispatched to ", absl::StrJoin(workers, ", ")));
  ranks_ = std::make_unique<Dispatcher>(ctx_.pool, job_, id_, std::move(workers));
  sharder_ = std::make_unique<BatchSharder>(id_, world_, ctx_.options.chunk_bytes, &plan.inputs,
                                            &plan.placeholders, &plan.schedule);
  sharder_->set_first_step(first_);
  sharder_->set_max_batch_bytes(ctx_.options.max_batch_bytes);
  if (plan.symbolic != nullptr) {
    const int max_shapes = plan.spec.max_shapes() > 0 ? plan.spec.max_shapes() : kDefaultMaxShapes;
    variants_ = std::make_unique<ShapeVariants>(*plan.symbolic, ctx_.expand, max_shapes);
    // Graph 0, the plan's (aliased: the job outlives the runner).
    variants_->Pin(plan.example, std::shared_ptr<const v1::ExpandResponse>(job_, &plan.expanded),
                   plan.compile_ms);
    programs_ = std::make_unique<RankPrograms>(world_, variants_->max_graphs());
    job_->SetShapes(variants_->compiled());
  }
  state_ = MakeStateCollector(id_, world_, plan.expanded, &plan.declared_state,
                              ctx_.options.chunk_bytes);
  return Run();
}

void JobRunner::RecordStart() {
  const JobPlan& plan = job_->plan();
  if (ctx_.store == nullptr || plan.recovered) return;
  if (!plan.resumed_from.empty() && plan.spec.has_initial_checkpoint()) {
    // Until its own first checkpoint, the workers' checkpoint it started from
    // is where its work is (a resume of it starts there too).
    job_->SetWorkerCheckpoint(plan.first_step, plan.spec.initial_checkpoint().path());
  } else if (!plan.resumed_from.empty()) {
    // Its state is the resumed job's checkpoint: its own from the start, so
    // that it can be resumed (or, reading files, run after a restart) too.
    if (absl::Status s = ctx_.store->ShareCheckpoint(plan.resumed_from, id_, plan.first_step);
        !s.ok()) {
      Log(absl::StrCat(id_, ": cannot record its checkpoint of step ", plan.first_step, " in ",
                       ctx_.store->dir(), ": ", s.message()));
    } else {
      job_->SetCheckpointStep(plan.first_step);
    }
  } else if (job_->has_initial_state()) {
    // Recorded (outside the table's lock) so that the job can run after a restart.
    if (absl::Status s = ctx_.store->WriteInitialState(id_, job_->initial_state()); !s.ok()) {
      Log(absl::StrCat(id_, ": cannot record the initial state in ", ctx_.store->dir(),
                       " (the job cannot run "
                       "again after a restart): ",
                       s.message()));
    }
  }
}

void JobRunner::LogSubmitted() {
  const JobPlan& plan = job_->plan();
  const v1::JobSpec& spec = plan.spec;
  Log(absl::StrCat(
      id_, ": submitted, ", spec.world_size(), " ranks, ",
      spec.steps() > 0 ? absl::StrCat(spec.steps(), " steps") : "open-ended",
      spec.data_paths_size() > 0
          ? absl::StrCat(", batches from ", absl::StrJoin(spec.data_paths(), ", "))
          : "",
      plan.schedule.empty()
          ? ""
          : absl::StrCat(", schedule for ", absl::StrJoin(plan.schedule.names(), ", ")),
      plan.resumed_from.empty() ? ""
                                : absl::StrCat(", resuming ", plan.resumed_from,
                                               " from its checkpoint of step ", plan.first_step),
      plan.expanded.cached() ? " (compile cache hit)" : " (compiled: cache miss)"));
  const std::string world = absl::StrCat(spec.world_size());
  const JobOwner& owner = job_->owner();
  if (plan.resumed_from.empty()) {
    Audit("submit", {{"identity", owner.description},
                     {"peer", owner.peer},
                     {"job", id_},
                     {"name", spec.name()},
                     {"world_size", world}});
  } else {
    Audit("submit", {{"identity", owner.description},
                     {"peer", owner.peer},
                     {"job", id_},
                     {"name", spec.name()},
                     {"world_size", world},
                     {"resumes", plan.resumed_from}});
  }
}

JobRunner::Got JobRunner::Next(bool want_client, bool watch_client, double timeout_s,
                               Job::Msg* worker, v1::SubmitJobRequest* client) {
  size_t consumed = 0;
  const Got got = job_->Next(want_client, watch_client, Clock::now() + Seconds(timeout_s), worker,
                             client, &consumed);
  if (consumed > 0) client_->Consumed(consumed);
  if (consumed > 0 && ctx_.counters != nullptr) ctx_.counters->client_bytes += consumed;
  return got;
}

absl::Status JobRunner::ReadSpec(v1::SubmitJobRequest* first) {
  Job::Msg unused;
  const double idle = ctx_.options.client_idle_s;
  const Got got = Next(true, true, idle, &unused, first);
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
  if (!first->has_spec()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the first SubmitJobRequest must carry the JobSpec, got ", SubmitRequestKind(*first)));
  }
  return absl::OkStatus();
}

absl::Status JobRunner::TakeSpec() {
  v1::SubmitJobRequest first;
  if (absl::Status s = ReadSpec(&first); !s.ok()) return s;
  // With --state-dir every job is recorded as submitted: a data_paths job to
  // be run again after a restart, any job to check a resume of it against
  // (job_resume.h: a FAILED or CANCELLED job keeps its last step's state).
  const v1::JobSpec& submitted = first.spec();
  if (absl::Status s = CheckDataPathsExcluded(submitted, ctx_.options.data_excluded); !s.ok())
    return s;
  const bool from_files = ctx_.store != nullptr && submitted.data_paths_size() > 0;
  const bool resume = !submitted.resume_job().empty();
  if (ctx_.store != nullptr) job_->SetSubmitted(submitted);
  // More ranks than workers fail before the graph is expanded for them.
  if (absl::Status s = ctx_.scheduler->CheckPlaceable(submitted.world_size()); !s.ok()) return s;
  // What the graph declares, against the limits, before anything is
  // compiled or held (a data_paths job's state; a resume's checkpoint).
  ir::DeclaredTensors state =
      ir::DeclaredTensors::Of(submitted.graph(), ir::DeclaredTensors::Kind::kState);
  ir::DeclaredTensors batch =
      ir::DeclaredTensors::Of(submitted.graph(), ir::DeclaredTensors::Kind::kBatch);
  if (absl::Status s = CheckCollectiveTimeout(submitted, ctx_.options.max_collective_timeout_s);
      !s.ok())
    return s;
  // Held before the job starts: what the client sends (a checkpoint gives the rest).
  absl::StatusOr<ir::DeclaredTensors> sent = SentStateOf(submitted, state);
  if (!sent.ok()) return sent.status();
  if (absl::Status s = CheckDeclaredSizes(submitted, *sent, batch, from_files || resume); !s.ok())
    return s;
  std::optional<ResumeStart> start;
  std::optional<StateStore::State> kept;  // an evaluation of a finished job's state (eval_kept.h)
  if (resume && IsEvaluationGraph(submitted.graph())) {
    absl::StatusOr<StateStore::State> k =
        KeptStateToEvaluate(*ctx_.table, job_->owner(), submitted);
    if (!k.ok()) return k.status();
    kept = *std::move(k);
  } else if (resume) {
    absl::StatusOr<ResumeStart> r = PrepareResume(*ctx_.table, ctx_.store, job_->owner(), submitted,
                                                  ctx_.options.checkpoint_every, job_);
    if (!r.ok()) return r.status();
    start = *std::move(r);
    if (start->on_workers) {
      // Its workers read the checkpoint as a job started from it does (checked as one).
      *first.mutable_spec()->mutable_initial_checkpoint() = *std::move(start->on_workers);
      first.mutable_spec()->clear_resume_job();
    }
  }
  absl::StatusOr<PreparedSpec> p = PrepareJobSpec(std::move(*first.mutable_spec()), ctx_.expand);
  if (!p.ok()) return p.status();
  JobPlan plan = PlanOf(*std::move(p));
  plan.declared_state = std::move(state);
  plan.declared_batch = std::move(batch);
  if (start) {
    StartFromCheckpoint(std::move(plan), *std::move(start));
    return absl::OkStatus();
  }
  if (kept) {
    plan.spec.set_num_state_tensors(static_cast<uint32_t>(plan.declared_state.size()));
    Log(absl::StrCat(id_, ": evaluates the state job ", plan.spec.resume_job(), " kept"));
    job_->SetPlan(std::move(plan));
    job_->HoldInitialState(*std::move(kept));
    return absl::OkStatus();
  }
  job_->SetPlan(std::move(plan));
  return from_files ? TakeInitialState() : absl::OkStatus();
}

void JobRunner::StartFromCheckpoint(JobPlan plan, ResumeStart start) {
  const bool on_workers = plan.spec.has_initial_checkpoint();
  if (!on_workers) plan.spec.set_num_state_tensors(static_cast<uint32_t>(start.state.size()));
  plan.first_step = start.step;
  plan.resumed_from = start.from;
  job_->SetPlan(std::move(plan));
  if (!on_workers) job_->HoldInitialState(std::move(start.state));
  job_->StartAt(start.from, start.step, start.losses, start.evals);
}

bool JobRunner::WaitInQueue(absl::Status* status) {
  const v1::JobInfo info = job_->Info();
  int position = info.queue_position();
  std::string message = info.message();
  while (true) {
    const Job::QueueWatch w =
        job_->WatchQueued(&position, &message, std::chrono::milliseconds(100));
    if (w.dispatched) return true;
    if (!w.ended.ok()) {
      *status = w.ended;
      client_->Write(job_->Event(job_->state()));
      return false;
    }
    if (w.changed) client_->Write(job_->Event(v1::JOB_STATE_QUEUED));
    if (w.client_gone) {
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
  job_->CancelIfClientGone();
  // Nothing is assigned yet: a job cancelled now frees its workers at once.
  if (job_->cancel_requested()) return Cancelled();
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
  return CheckRanksFit(id_, job_->plan().expanded, workers, ctx_.pool->List());
}

// A rank's message outside of the steps: a failure ends the job, JobStarted
// is counted, anything else is ignored.
absl::Status JobRunner::OnWorker(const Job::Msg& msg) {
  if (msg.lost || msg.m.has_job_failed()) return Failed(msg);
  if (!msg.m.has_job_started()) return absl::OkStatus();
  ++started_;
  if (msg.rank != 0 || !msg.m.job_started().has_dataset_shapes() || variants_ == nullptr)
    return absl::OkStatus();
  return TakeDatasetShapes(msg.m.job_started().dataset_shapes());
}

absl::Status JobRunner::TakeDatasetShapes(const v1::DatasetShapes& report) {
  const JobPlan& plan = job_->plan();
  absl::StatusOr<DatasetStepShapes> shapes =
      DatasetStepShapes::Of(report, plan.inputs, plan.spec.data_paths(0));
  if (!shapes.ok()) return BadInput(shapes.status());
  data_shapes_ = std::make_unique<DatasetStepShapes>(*std::move(shapes));
  Log(absl::StrCat(id_, ": dataset ", plan.spec.data_paths(0), ": ", data_shapes_->entries(),
                   " index entries of ", data_shapes_->distinct(), " batch shapes"));
  return absl::OkStatus();
}

absl::Status JobRunner::SendAll(const v1::ServerMessage& m) {
  const int gone = ranks_->SendAll(m);
  return gone < 0 ? absl::OkStatus() : Lost(gone);
}

absl::Status JobRunner::Assign() {
  const int port = FreeLocalPort();
  if (port == 0)
    return Finish(JobChange::kFail, absl::InternalError("no free rendezvous port"), -1);
  const int gone = ranks_->Assign(ranks_->RendezvousHost(), port, steps_,
                                  variants_ ? static_cast<uint32_t>(variants_->max_graphs()) : 0);
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
