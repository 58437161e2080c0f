// JobRunner's steps (job_runner.h, phase 4): batches fed to the ranks at
// most steps_ahead steps ahead of their results (a data_paths job's from its
// files, a streamed job's as its client sends them), each step's results
// reported once every rank's is in, in order, and the checkpoints
// (--checkpoint-every) taken through the job's StateCollector and recorded
// once their step's loss is.
#include <algorithm>
#include <deque>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "analysis/ir/checkpoint_index.h"
#include "server/jobs/job_runner.h"
#include "server/jobs/memory_admission.h"
#include "server/log.h"

namespace fxdp::server {

absl::Status JobRunner::Steps() {
  stepping_ = true;
  const bool from_files = job_->plan().spec.data_paths_size() > 0;
  if (from_files) client_->SetReadBudget(0);
  const size_t ahead = static_cast<size_t>(std::max(1, ctx_.options.steps_ahead));
  Job::Msg msg;
  v1::SubmitJobRequest req;
  Clock::time_point idle_from = Clock::now();
  while (true) {
    const bool room = !client_done_ && pending_.size() < ahead && (steps_ == 0 || sent_ < steps_);
    // Nothing outstanding on the workers: the job waits on its client alone.
    const bool on_client = room && !from_files && pending_.empty();
    if (!on_client) idle_from = Clock::now();
    const double left = on_client ? ClientIdleLeft(idle_from) : 3600;
    if (left <= 0) return ClientIdle(absl::StrCat("step ", sent_ + 1, "'s batch"));
    if (room && from_files) {
      if (absl::Status s = SendFileStep(); !s.ok()) return s;
      continue;
    }
    if (pending_.empty() && !state_->pending() && evals_got_ == evals_due_ &&
        (client_done_ || (steps_ > 0 && sent_ == steps_)))
      break;
    const Got got = Next(room, true, left, &msg, &req);
    if (got == Got::kTimeout) continue;
    if (got == Got::kClient) idle_from = Clock::now();
    if (got == Got::kCancel) return Cancelled();
    absl::Status s = got == Got::kClientEnd ? OnClientEnd()
                     : got == Got::kClient  ? OnBatch(req)
                                            : OnStepMessage(msg);
    if (!s.ok()) return s;
  }
  stepping_ = false;
  if (sent_ == 0) return BadInput("the client sent no batch: a job needs at least one step");
  if (steps_ == 0) {
    steps_ = sent_;
    job_->SetSteps(first_ + sent_);
  }
  return absl::OkStatus();
}

// A data_paths job's step: no tensors (the workers read them); a graph with
// symbolic sizes gets the program of the step's shape (a dataset's entry's,
// rank 0's report; files: graph 0's, checked by the workers at set-up).
absl::Status JobRunner::SendFileStep() {
  ShapeVariant variant;
  if (variants_ != nullptr) {
    const int64_t job_step = first_ + sent_ + 1;
    const std::string& dataset = job_->plan().spec.data_paths(0);
    const std::string what =
        data_shapes_ == nullptr
            ? absl::StrCat("step ", job_step, "'s batch")
            : absl::StrCat("step ", job_step, "'s batch (dataset '", dataset, "' index entry ",
                           (job_step - 1) % data_shapes_->entries(), ")");
    const ir::InputShapes& shapes =
        data_shapes_ != nullptr ? data_shapes_->At(job_step) : job_->plan().example;
    if (absl::Status s = StepVariant(sent_ + 1, shapes, what, &variant); !s.ok()) return s;
    if (absl::Status s = LoadPrograms(variant); !s.ok()) return s;
  }
  ++sent_;
  StepSent();
  v1::ServerMessage batch = sharder_->ScheduleOnlyBatch(sent_, first_ + sent_);
  batch.mutable_batch()->set_graph_id(variant.graph_id);
  if (absl::Status s = SendAll(batch); !s.ok()) return s;
  pending_.push_back({sent_, std::vector<v1::StepResult>(world_), 0, variant.shape});
  return MaybeCheckpoint();
}

absl::Status JobRunner::OnBatch(const v1::SubmitJobRequest& req) {
  absl::StatusOr<bool> complete = sharder_->Add(sent_ + 1, req);
  if (!complete.ok()) return BadInput(complete.status());
  if (!*complete) return absl::OkStatus();  // more of this step follows
  std::string shape;
  if (absl::Status s = SendStep(sent_ + 1, &shape); !s.ok()) return s;
  ++sent_;
  StepSent();
  pending_.push_back({sent_, std::vector<v1::StepResult>(world_), 0, std::move(shape)});
  if (steps_ > 0 && sent_ == steps_) client_->SetReadBudget(0);
  return MaybeCheckpoint();
}

absl::Status JobRunner::OnClientEnd() {
  if (sharder_->in_step()) {
    return BadInput(absl::StrCat("the client ended the stream in the middle of step ",
                                 first_ + sent_ + 1, "'s batch (its last StepBatch had more set)"));
  }
  if (steps_ > 0) {
    return BadInput(absl::StrCat("the client ended the stream after the batches of ",
                                 first_ + sent_, " of ", first_ + steps_,
                                 " steps (JobSpec.steps)"));
  }
  client_done_ = true;
  return absl::OkStatus();
}

// --checkpoint-every (with --state-dir): after run step sent_ was sent, the
// ranks are asked for their state (they answer between steps: the state
// after exactly that step); not after the last step, whose state End fetches.
absl::Status JobRunner::MaybeCheckpoint() {
  // A job whose workers write its checkpoints (JobSpec.checkpoints) has no others.
  const bool server_side = ctx_.store != nullptr && !job_->plan().spec.has_checkpoints();
  const int64_t every = server_side ? ctx_.options.checkpoint_every : 0;
  if (every <= 0 || (first_ + sent_) % every != 0 || (steps_ > 0 && sent_ >= steps_))
    return absl::OkStatus();
  const int gone = state_->Request(ranks_.get(), first_ + sent_, /*end_job=*/false);
  return gone < 0 ? absl::OkStatus() : Lost(gone);
}

absl::Status JobRunner::OnStepMessage(Job::Msg& msg) {
  if (msg.lost || msg.m.has_job_failed()) return Failed(msg);
  if (msg.m.has_state_chunk()) {
    std::optional<StateCollector::Collected> done;
    if (absl::Status s = state_->Add(msg, &done); !s.ok()) return Finish(JobChange::kFail, s, -1);
    if (!done) return absl::OkStatus();
    if (!done->state.ok()) {
      Log(absl::StrCat(id_, ": cannot write the checkpoint of step ", done->step, ": ",
                       done->state.status().message()));
      return absl::OkStatus();
    }
    SaveCheckpoint(done->step, *std::move(done->state));
    return absl::OkStatus();
  }
  if (msg.m.has_eval_result()) return OnEvalResult(msg);
  if (msg.m.has_step_result()) OnStepResult(msg);
  if (msg.m.has_checkpoint_written()) OnCheckpointWritten(msg);
  return absl::OkStatus();
}

void JobRunner::OnCheckpointWritten(const Job::Msg& msg) {
  const int64_t k = msg.m.checkpoint_written().step();
  if (k <= last_checkpoint_ || k > first_ + sent_ || msg.rank < 0 || msg.rank >= world_) {
    Log(absl::StrCat(id_, ": ignoring rank ", msg.rank, "'s CheckpointWritten for step ", k,
                     " (steps ", last_checkpoint_ + 1, " to ", first_ + sent_, " expected)"));
    return;
  }
  std::set<int>& ranks = checkpoint_ranks_[k];
  ranks.insert(msg.rank);
  if (static_cast<int>(ranks.size()) < world_) return;
  checkpoint_ranks_.erase(checkpoint_ranks_.begin(), checkpoint_ranks_.upper_bound(k));
  last_checkpoint_ = k;
  // The server's own spelling of the directory, not a worker's text.
  const std::string path =
      ir::JoinCheckpointPath(job_->plan().spec.checkpoints().dir(), ir::CheckpointStepDir(k));
  job_->SetWorkerCheckpoint(k, path);
  ctx_.table->Update(job_);
  Log(absl::StrCat(id_, ": the checkpoint of step ", k, " is complete (", world_,
                   " ranks wrote theirs): ", path));
}

absl::Status JobRunner::AwaitLastCheckpoint() {
  const v1::JobSpec& spec = job_->plan().spec;
  const int64_t last = first_ + steps_;
  const int64_t every = spec.checkpoints().every();
  if (!spec.has_checkpoints() || !(spec.steps() > 0 || (every > 0 && last % every == 0)))
    return absl::OkStatus();
  Job::Msg msg;
  while (last_checkpoint_ < last) {
    const Got got = Next(false, true, 3600, &msg);
    if (got == Got::kCancel) return Cancelled();
    if (got != Got::kWorker) continue;
    if (msg.lost || msg.m.has_job_failed()) {
      stepping_ = true;  // the state of the last step is kept
      return Failed(msg);
    }
    if (msg.m.has_checkpoint_written()) OnCheckpointWritten(msg);
  }
  return absl::OkStatus();
}

void JobRunner::OnStepResult(const Job::Msg& msg) {
  const v1::StepResult& sr = msg.m.step_result();
  for (PendingStep& p : pending_) {
    if (p.step == sr.step() && p.results[msg.rank].step() == 0) {
      p.results[msg.rank] = sr;
      ++p.got;
    }
  }
  while (!pending_.empty() && pending_.front().got == world_) {
    StepDone(pending_.front().step, pending_.front().results, pending_.front().shape);
    pending_.pop_front();
  }
}

absl::Status JobRunner::SendStep(int64_t step, std::string* shape) {
  ShapeVariant variant;
  if (variants_ != nullptr) {
    const std::string what = absl::StrCat("step ", first_ + step, "'s batch");
    if (absl::Status s = StepVariant(step, sharder_->shapes(), what, &variant); !s.ok()) return s;
    if (absl::Status s = LoadPrograms(variant); !s.ok()) return s;
    *shape = variant.shape;
  }
  const v1::ExpandResponse& expanded =
      variant.expanded != nullptr ? *variant.expanded : job_->plan().expanded;
  absl::StatusOr<RankRows> rows =
      RankRowsOf(expanded, world_, job_->plan().inputs, sharder_->shapes());
  if (!rows.ok()) return Finish(JobChange::kFail, rows.status(), -1);
  absl::StatusOr<ir::RaggedInputs> ragged = RaggedOf(expanded);
  if (!ragged.ok()) return Finish(JobChange::kFail, ragged.status(), -1);
  // Before any rank gets a message: a refused step sends nothing.
  if (absl::Status s = sharder_->CutRagged(*ragged, *rows); !s.ok()) return BadInput(s);
  for (int r = 0; r < world_; ++r) {
    absl::StatusOr<std::vector<v1::ServerMessage>> batch =
        sharder_->RankBatch(r, *rows, variant.graph_id);
    if (!batch.ok()) return BadInput(batch.status());
    for (const v1::ServerMessage& m : *batch) {
      if (!ranks_->Send(r, m)) return Lost(r);
    }
  }
  sharder_->Clear();
  return absl::OkStatus();
}

absl::Status JobRunner::LoadPrograms(const ShapeVariant& variant) {
  for (int r = 0; r < world_; ++r) {
    const RankPrograms::Use use = programs_->Run(r, variant.graph_id);
    if (use.load && !ranks_->LoadGraph(r, variant.graph_id, *variant.expanded, use.evict))
      return Lost(r);
  }
  return absl::OkStatus();
}

absl::Status JobRunner::StepVariant(int64_t step, const ir::InputShapes& shapes,
                                    const std::string& what, ShapeVariant* variant) {
  const int64_t job_step = first_ + step;
  absl::StatusOr<ShapeVariant> v = variants_->Get(shapes);
  job_->SetShapes(variants_->compiled());
  if (!v.ok()) {
    return BadInput(
        absl::Status(v.status().code(), absl::StrCat(what, ": ", v.status().message())));
  }
  *variant = *std::move(v);
  if (!variant->compiled) return absl::OkStatus();
  Log(absl::StrCat(id_, ": step ", job_step, ": compiled shape ", variant->shape, " as graph ",
                   variant->graph_id, absl::StrFormat(" in %.1f ms", variant->compile_ms)));
  std::vector<std::string> workers;
  for (int r = 0; r < world_; ++r) workers.push_back(ranks_->worker(r));
  if (absl::Status s = CheckRanksFit(id_, *variant->expanded, workers, ctx_.pool->List());
      !s.ok()) {
    return Finish(JobChange::kFail,
                  absl::Status(s.code(), absl::StrCat("step ", job_step, "'s batch (",
                                                      variant->shape, "): ", s.message())),
                  -1);
  }
  return absl::OkStatus();
}

void JobRunner::StepDone(int64_t run_step, const std::vector<v1::StepResult>& results,
                         const std::string& shape) {
  const int64_t step = first_ + run_step;  // the job's step
  job_->StepDone(step, results[0].loss());
  if (JobCounters* c = ctx_.counters; c != nullptr) {
    ++c->steps;
    c->step_us += static_cast<int64_t>(results[0].step_ms() * 1000);
    for (const v1::StepResult& r : results) c->collective_bytes += r.comm_bytes();
  }
  v1::JobEvent e = job_->Event(v1::JOB_STATE_RUNNING);
  e.set_step(step);
  e.set_loss(results[0].loss());
  e.set_step_ms(results[0].step_ms());
  e.set_shape(shape);
  for (const auto& r : results) e.add_local_losses(r.local_loss());
  *e.mutable_outputs() = results[0].outputs();  // the same on every rank
  client_->Write(std::move(e));
  ctx_.table->Update(job_);  // the losses up to `step` are in the store now
  while (!deferred_checkpoints_.empty() && deferred_checkpoints_.front().first <= step) {
    WriteCheckpoint(deferred_checkpoints_.front().first, deferred_checkpoints_.front().second);
    deferred_checkpoints_.pop_front();
  }
  ReportEvals();
}

void JobRunner::SaveCheckpoint(int64_t step, StateStore::State state) {
  const int64_t done = job_->steps_done();
  if (done < step || !deferred_checkpoints_.empty()) {
    deferred_checkpoints_.emplace_back(step, std::move(state));
    return;
  }
  WriteCheckpoint(step, state);
}

void JobRunner::WriteCheckpoint(int64_t step, const StateStore::State& state) {
  if (absl::Status s = ctx_.store->WriteCheckpoint(id_, step, state); !s.ok()) {
    Log(absl::StrCat(id_, ": cannot write the checkpoint of step ", step, ": ", s.message()));
    return;
  }
  job_->SetCheckpointStep(step);
  ctx_.table->Update(job_);
}

}  // namespace fxdp::server
