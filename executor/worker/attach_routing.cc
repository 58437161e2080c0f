// Routing the server's messages (attach_worker.h), on the main thread: state
// and batch chunks are assembled into tensors and queued for the job's
// thread with FetchState and CancelJob; AssignJob starts a job (or is
// refused naming why); Shutdown starts the shutdown.
#include <memory>
#include <utility>

#include "executor/worker/attach_worker.h"

namespace fxdp::executor::attach {

const ir::DeclaredTensors* AssignedJob::DeclaredBatch(uint32_t graph_id) const {
  if (graph_id == 0) return &declared_batch;
  auto it = graph_batches.find(graph_id);
  return it == graph_batches.end() ? nullptr : &it->second;
}

std::string AssignedJob::GraphIds() const {
  std::string ids = "0";
  for (const auto& [id, d] : graph_batches) absl::StrAppend(&ids, ", ", id);
  return ids;
}

std::shared_ptr<AssignedJob> AttachedWorker::JobFor(const std::string& job_id, const char* what) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (job_ && job_->id == job_id) return job_;
  }
  if (last_ignored_ != job_id) {
    util::Log(Prefix(), "ignoring ", what, " for job '", job_id,
              "': not a job this worker holds (finished, failed or unknown)");
    last_ignored_ = job_id;
  }
  return nullptr;
}

void AttachedWorker::Handle(ServerMessage& m, const std::shared_ptr<Session>& session) {
  switch (m.msg_case()) {
    case ServerMessage::kRegistered: util::Log(Prefix(), "ignoring a second Registered"); return;
    case ServerMessage::kAssignJob: HandleAssign(*m.mutable_assign_job(), session); return;
    case ServerMessage::kStateChunk: HandleStateChunk(m.state_chunk()); return;
    case ServerMessage::kBatch: HandleBatch(m.batch()); return;
    case ServerMessage::kLoadGraph: HandleLoadGraph(*m.mutable_load_graph()); return;
    case ServerMessage::kFetchState: HandleFetchState(m.fetch_state()); return;
    case ServerMessage::kCancelJob: HandleCancel(m.cancel_job()); return;
    case ServerMessage::kShutdown:
      RequestShutdown(absl::StrCat(
          "the server asked", m.shutdown().reason().empty() ? "" : ": " + m.shutdown().reason()));
      return;
    case ServerMessage::MSG_NOT_SET:
      util::Log(Prefix(), "ignoring an empty or unknown server message");
      return;
  }
}

void AttachedWorker::HandleStateChunk(const v1::StateChunk& c) {
  std::shared_ptr<AssignedJob> job = JobFor(c.job_id(), "a state chunk");
  if (!job || job->input_failed) return;
  auto fail = [&](absl::Status s) {
    job->input_failed = true;
    job->Push(JobTask::Error(absl::Status(s.code(), absl::StrCat("initial state: ", s.message()))));
  };
  if (job->state_done) return fail(absl::InvalidArgumentError("a state chunk after the last one"));
  if (c.has_tensor()) {
    absl::Status s = job->state_asm.Add(c.tensor());
    if (!s.ok()) return fail(s);
    if (job->state_asm.size() > job->num_state)
      return fail(absl::InvalidArgumentError(absl::StrCat(
          "more than the ", job->num_state, " tensors AssignJob.num_state_tensors announced")));
  }
  if (!c.last()) return;
  if (job->state_asm.pending())
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "the last chunk left tensor '", job->state_asm.pending_name(), "' incomplete")));
  if (job->state_asm.size() != job->num_state)
    return fail(absl::InvalidArgumentError(
        absl::StrCat("got ", job->state_asm.size(), " tensors, AssignJob.num_state_tensors says ",
                     job->num_state)));
  job->state_done = true;
  job->Push(JobTask::Tensors(JobTask::kState, job->state_asm.Take()));
}

void AttachedWorker::HandleFetchState(const v1::FetchState& f) {
  std::shared_ptr<AssignedJob> job = JobFor(f.job_id(), "FetchState");
  if (!job || job->input_failed) return;
  if (!job->state_done) {
    job->input_failed = true;
    job->Push(JobTask::Error(
        absl::InvalidArgumentError("FetchState before the initial state was complete")));
    return;
  }
  JobTask e(JobTask::kFetch);
  e.chunk_bytes = f.chunk_bytes();
  e.end_job = f.end_job();
  job->Push(std::move(e));
}

void AttachedWorker::HandleCancel(const v1::CancelJob& c) {
  std::shared_ptr<AssignedJob> job = JobFor(c.job_id(), "CancelJob");
  if (!job) return;
  job->cancel = true;
  // A step or rendezvous blocked on a peer (one that failed, say) ends
  // now, not at the collective timeout.
  const int aborted = job->connections.Abort();
  util::Log(
      job->Prefix(), "cancel requested", c.reason().empty() ? "" : absl::StrCat(": ", c.reason()),
      aborted > 0 ? absl::StrCat(" (", aborted, " connections to the other ranks shut down)") : "");
  JobTask e(JobTask::kCancel);
  e.reason = c.reason();
  job->Push(std::move(e));
}

void AttachedWorker::HandleBatch(const v1::Batch& b) {
  std::shared_ptr<AssignedJob> job = JobFor(b.job_id(), "a batch");
  if (!job || job->input_failed) return;
  auto fail = [&](absl::Status s) {
    job->input_failed = true;
    job->Push(JobTask::Error(
        absl::Status(s.code(), absl::StrCat("batch for step ", b.step(), ": ", s.message())),
        b.step()));
  };
  if (!job->state_done)
    return fail(absl::InvalidArgumentError("sent before the initial state was complete"));
  if (job->batch_step != 0 && job->batch_step != b.step())
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "step ", job->batch_step, "'s batch was not complete (its last message had more set)")));
  if (job->batch_step == 0) {
    // The step's first message: its tensors are the INPUTs of the program it names.
    const ir::DeclaredTensors* declared = job->DeclaredBatch(b.graph_id());
    if (declared == nullptr)
      return fail(absl::InvalidArgumentError(absl::StrCat(
          "graph_id ", b.graph_id(), " is not a program this worker holds for the job (it holds ",
          job->GraphIds(), "): a LoadGraph must come before the first Batch naming it")));
    job->batch_asm.Expect(declared, job->batch_world);
    job->batch_graph = b.graph_id();
  } else if (b.graph_id() != job->batch_graph) {
    return fail(absl::InvalidArgumentError(absl::StrCat("a message names graph_id ", b.graph_id(),
                                                        ", the step's first one named ",
                                                        job->batch_graph)));
  }
  job->batch_step = b.step();
  for (const v1::HyperparameterValue& h : b.hyperparameters())
    job->batch_hyper.emplace_back(h.name(), h.value());
  for (const v1::TensorChunk& t : b.tensors()) {
    absl::Status s = job->batch_asm.Add(t);
    if (!s.ok()) return fail(s);
  }
  if (b.more()) return;
  if (job->batch_asm.pending())
    return fail(absl::InvalidArgumentError(absl::StrCat("tensor '", job->batch_asm.pending_name(),
                                                        "' is incomplete and more is not set")));
  job->batch_step = 0;
  JobTask e = JobTask::Tensors(JobTask::kBatch, job->batch_asm.Take(), b.step());
  e.hyperparameters = std::move(job->batch_hyper);
  e.graph_id = b.graph_id();
  job->batch_hyper.clear();
  job->Push(std::move(e));
}

// Only bounds and bookkeeping here (the main thread reads the stream): the
// program is decoded, loaded and checked against program 0 by the job's
// thread (AttachedWorker::LoadGraph), in order with the batches.
void AttachedWorker::HandleLoadGraph(v1::LoadGraph& lg) {
  std::shared_ptr<AssignedJob> job = JobFor(lg.job_id(), "LoadGraph");
  if (!job || job->input_failed) return;
  const uint32_t id = lg.graph_id(), evict = lg.evict_graph_id();
  auto fail = [&](absl::Status s) {  // reported by the job's thread, naming the step it precedes
    job->input_failed = true;
    JobTask e(JobTask::kLoadGraph);
    e.graph_id = id;
    e.error = absl::Status(s.code(), absl::StrCat("LoadGraph graph_id ", id, ": ", s.message()));
    job->Push(std::move(e));
  };
  if (!job->state_done) {  // the job's thread waits for the state: an error, not a program
    job->input_failed = true;
    job->Push(JobTask::Error(absl::InvalidArgumentError(
        absl::StrCat("LoadGraph graph_id ", id, ": sent before the initial state was complete"))));
    return;
  }
  if (job->batch_step != 0)
    return fail(
        absl::InvalidArgumentError(absl::StrCat("sent while step ", job->batch_step,
                                                "'s batch was incomplete (its last message had "
                                                "more set)")));
  if (id == 0)
    return fail(absl::InvalidArgumentError(
        "graph_id 0 names AssignJob.graph; a LoadGraph's graph_id is at least 1"));
  if (job->graph_batches.count(id) > 0)
    return fail(absl::InvalidArgumentError(absl::StrCat("the worker already holds program ", id,
                                                        " for the job (it holds ", job->GraphIds(),
                                                        "): graph ids are unique per job")));
  if (evict != 0 && job->graph_batches.count(evict) == 0)
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "evict_graph_id ", evict, " is not a program this worker holds for the job (it holds ",
        job->GraphIds(), ")")));
  const size_t held = job->graph_batches.size() - (evict != 0 ? 1 : 0);
  if (held + 1 > job->max_graphs)
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "the job would hold ", held + 1,
        " programs besides graph 0, more than AssignJob.max_graphs ", job->max_graphs,
        " (it holds ", job->GraphIds(),
        evict != 0 ? absl::StrCat(", evicting ", evict) : std::string(" and evicts none"), ")")));
  if (evict != 0) job->graph_batches.erase(evict);
  job->graph_batches.emplace(
      id, ir::DeclaredTensors::Of(lg.graph(), ir::DeclaredTensors::Kind::kBatch));
  JobTask e(JobTask::kLoadGraph);
  e.graph_id = id;
  e.evict_graph_id = evict;
  e.graph = std::make_unique<v1::GraphDef>();
  e.graph->Swap(lg.mutable_graph());
  job->Push(std::move(e));
}

void AttachedWorker::HandleAssign(v1::AssignJob& a, const std::shared_ptr<Session>& session) {
  auto reject = [&](absl::Status s, int rank) {
    util::Log(Prefix(), "refusing job '", a.job_id(), "': ", s.message());
    WorkerMessage f;
    v1::JobFailed* jf = f.mutable_job_failed();
    jf->set_job_id(a.job_id());
    jf->set_rank(rank);
    jf->set_code(static_cast<int>(s.code()));
    jf->set_error(absl::StrCat("job ", a.job_id(), " rank ", rank, ": ", s.message()));
    session->Write(f);
  };
  const bool rank_ok = a.world_size() >= 1 && a.rank() >= 0 && a.rank() < a.world_size();
  if (a.job_id().empty())
    return reject(absl::InvalidArgumentError("AssignJob without a job_id"), a.rank());
  if (!rank_ok)
    return reject(absl::InvalidArgumentError(absl::StrCat(
                      "rank ", a.rank(), " is not in [0, world_size ", a.world_size(), ")")),
                  -1);
  if (a.world_size() > 1 &&
      (a.rendezvous_host().empty() || a.rendezvous_port() <= 0 || a.rendezvous_port() > 65535))
    return reject(absl::InvalidArgumentError(absl::StrCat(
                      "world size ", a.world_size(), " needs a rendezvous host and port (got '",
                      a.rendezvous_host(), "' port ", a.rendezvous_port(), ")")),
                  a.rank());
  if (!(a.collective_timeout_s() >= 0) || a.collective_timeout_s() > 86400.0 * 365)
    return reject(absl::InvalidArgumentError(absl::StrCat(
                      "collective_timeout_s ", a.collective_timeout_s(), " is not valid")),
                  a.rank());
  if (a.steps() < 0)
    return reject(absl::InvalidArgumentError(absl::StrCat("steps ", a.steps(), " < 0")), a.rank());
  if (a.max_graphs() > kMaxLoadedGraphs)
    return reject(absl::InvalidArgumentError(absl::StrCat(
                      "max_graphs ", a.max_graphs(), " is more than this worker keeps (",
                      kMaxLoadedGraphs, " programs besides graph 0)")),
                  a.rank());

  std::thread old;
  std::unique_lock<std::mutex> l(mu_);
  if (shutdown_) return;
  if (job_) {
    const std::string busy = job_->id;
    l.unlock();
    return reject(absl::ResourceExhaustedError(absl::StrCat(
                      "worker ", worker_id_, " is busy with job '", busy, "' (capacity 1)")),
                  a.rank());
  }
  auto job = std::make_shared<AssignedJob>();
  job->id = a.job_id();
  job->rank = a.rank();
  job->world_size = a.world_size();
  job->steps = a.steps();
  job->num_state = a.num_state_tensors();
  job->max_graphs = a.max_graphs();
  job->batch_world = a.batches_sharded() ? 1 : a.world_size();
  job->assign.Swap(&a);
  job->declared_state =
      ir::DeclaredTensors::Of(job->assign.graph(), ir::DeclaredTensors::Kind::kState);
  job->declared_batch =
      ir::DeclaredTensors::Of(job->assign.graph(), ir::DeclaredTensors::Kind::kBatch);
  job->state_asm.Expect(&job->declared_state);
  job->assigned_at = Clock::now();
  job->session = session;
  job_ = job;
  ++running_jobs_;
  old = std::move(job_thread_);
  l.unlock();
  if (old.joinable()) old.join();  // the previous job's thread, already past its final message
  last_ignored_.clear();
  util::Log(job->Prefix(), "assigned: rank ", job->rank, " of ", job->world_size, ", ",
            job->assign.graph().nodes_size(), " nodes, ", job->num_state, " state tensors",
            job->steps > 0 ? absl::StrCat(", ", job->steps, " steps") : "");
  std::lock_guard<std::mutex> l2(mu_);
  job_thread_ = std::thread(&AttachedWorker::JobThread, this, job);
}

}  // namespace fxdp::executor::attach
