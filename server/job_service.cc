#include "server/job_service.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fxdp::server {
namespace {

using Clock = std::chrono::steady_clock;

void Log(const std::string& line) {
  std::fprintf(stderr, "fxdp-server: %s\n", line.c_str());
  std::fflush(stderr);
}

int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool Terminal(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED;
}

// The job a worker message is about ("" for heartbeats and registration).
const std::string* JobIdOf(const v1::WorkerMessage& m) {
  switch (m.msg_case()) {
    case v1::WorkerMessage::kJobStarted: return &m.job_started().job_id();
    case v1::WorkerMessage::kJobFailed: return &m.job_failed().job_id();
    case v1::WorkerMessage::kStepResult: return &m.step_result().job_id();
    case v1::WorkerMessage::kStateChunk: return &m.state_chunk().job_id();
    case v1::WorkerMessage::kJobEnded: return &m.job_ended().job_id();
    default: return nullptr;
  }
}

std::string LocalHostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

}  // namespace

void RechunkTensor(const v1::TensorChunk& in, size_t max_bytes, std::vector<v1::TensorChunk>* out) {
  if (max_bytes == 0) max_bytes = 1;
  const std::string& data = in.data();
  if (data.size() <= max_bytes) {
    out->push_back(in);
    return;
  }
  for (size_t off = 0; off < data.size(); off += max_bytes) {
    v1::TensorChunk c;
    c.set_name(in.name());
    c.set_dtype(in.dtype());
    *c.mutable_shape() = in.shape();
    c.set_offset(in.offset() + off);
    c.set_data(data.substr(off, std::min(max_bytes, data.size() - off)));
    out->push_back(std::move(c));
  }
}

int FreeLocalPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  int port = 0;
  socklen_t len = sizeof(a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

struct JobServiceImpl::Job {
  struct Msg {
    int rank = -1;
    bool lost = false;
    v1::WorkerMessage m;
  };
  std::mutex mu;
  std::condition_variable cv;
  v1::JobInfo info;                   // mu
  std::deque<Msg> inbox;              // mu
  bool cancel = false;                // mu
  std::string cancel_reason;          // mu
  std::vector<v1::TensorChunk> state; // the final state; set before SUCCEEDED, then read-only

  void SetState(v1::JobState s, int code = 0, const std::string& error = "") {
    {
      std::lock_guard<std::mutex> l(mu);
      info.set_state(s);
      if (!error.empty()) info.set_error(error);
      info.set_error_code(code);
      if (Terminal(s)) info.set_ended_unix_ms(UnixMs());
      if (s == v1::JOB_STATE_SUCCEEDED) info.set_has_state(true);
    }
    cv.notify_all();
  }
};

namespace {

enum class Wait { kMsg, kCancel, kTimeout };

// The next message from a rank, a cancellation (CancelJob, or the client of
// Submit went away), or nothing within timeout_s.
Wait Next(JobServiceImpl::Job& j, grpc::ServerContext* ctx, double timeout_s,
          JobServiceImpl::Job::Msg* out) {
  const auto deadline = Clock::now() + std::chrono::microseconds(static_cast<int64_t>(timeout_s * 1e6));
  std::unique_lock<std::mutex> l(j.mu);
  while (true) {
    if (!j.cancel && ctx != nullptr && ctx->IsCancelled()) {
      j.cancel = true;
      j.cancel_reason = "the client of Submit went away";
    }
    if (j.cancel) return Wait::kCancel;
    if (!j.inbox.empty()) {
      *out = std::move(j.inbox.front());
      j.inbox.pop_front();
      return Wait::kMsg;
    }
    const auto now = Clock::now();
    if (now >= deadline) return Wait::kTimeout;
    j.cv.wait_for(l, std::min<Clock::duration>(std::chrono::milliseconds(100), deadline - now));
  }
}

}  // namespace

JobServiceImpl::JobServiceImpl(CompileServiceImpl* compile, WorkerRegistry* registry,
                               JobServiceOptions options)
    : compile_(compile), registry_(registry), options_(options) {}

JobServiceImpl::~JobServiceImpl() = default;

void JobServiceImpl::Release(const std::vector<std::string>& workers) {
  std::lock_guard<std::mutex> l(mu_);
  for (const auto& w : workers) reserved_.erase(w);
}

void JobServiceImpl::CancelAll(const std::string& reason) {
  std::vector<std::shared_ptr<Job>> jobs;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& [id, j] : jobs_) jobs.push_back(j);
  }
  for (auto& j : jobs) {
    {
      std::lock_guard<std::mutex> l(j->mu);
      if (Terminal(j->info.state()) || j->cancel) continue;
      j->cancel = true;
      j->cancel_reason = reason;
    }
    j->cv.notify_all();
  }
}

grpc::Status JobServiceImpl::Submit(grpc::ServerContext* context, const v1::SubmitJobRequest* request,
                                    grpc::ServerWriter<v1::JobEvent>* writer) {
  if (!request->has_graph()) return {grpc::StatusCode::INVALID_ARGUMENT, "the job has no graph"};
  const int world = request->world_size();
  if (world < 1) {
    return {grpc::StatusCode::INVALID_ARGUMENT, absl::StrCat("world_size must be >= 1, got ", world)};
  }
  if (!request->data_path().empty()) {
    return {grpc::StatusCode::UNIMPLEMENTED,
            "data_path (batches read by the workers from a file) is not implemented yet: send the "
            "batches inline"};
  }
  const int64_t steps = request->steps() > 0 ? request->steps() : request->batches_size();
  if (request->steps() < 0 || steps < 1 || steps != request->batches_size()) {
    return {grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("the job needs one batch per step: steps = ", request->steps(), ", ",
                         request->batches_size(), " batches")};
  }
  v1::ExpandRequest xr;
  *xr.mutable_graph() = request->graph();
  xr.set_world_size(world);
  xr.set_bucket_cap_mb(request->bucket_cap_mb());
  xr.set_first_bucket_mb(request->first_bucket_mb());
  v1::ExpandResponse expanded;
  if (grpc::Status s = compile_->Expand(context, &xr, &expanded); !s.ok()) {
    return {s.error_code(), absl::StrCat("expanding the graph for ", world, " ranks: ", s.error_message())};
  }
  if (expanded.graphs_size() == 0) return {grpc::StatusCode::INTERNAL, "the expansion returned no graph"};

  auto job = std::make_shared<Job>();
  std::vector<std::string> workers;
  {
    std::lock_guard<std::mutex> l(mu_);
    std::vector<std::string> idle;
    for (const std::string& w : registry_->IdleWorkers()) {
      if (!reserved_.count(w)) idle.push_back(w);
    }
    if (static_cast<int>(idle.size()) < world) {
      int attached = 0;
      for (const auto& w : registry_->List()) attached += w.state() != v1::WORKER_STATE_LOST;
      return {grpc::StatusCode::RESOURCE_EXHAUSTED,
              absl::StrCat("the job needs ", world, " idle workers, but only ", idle.size(),
                           " are idle (", attached, " attached); jobs are not queued yet")};
    }
    workers.assign(idle.begin(), idle.begin() + world);
    for (const auto& w : workers) reserved_.insert(w);
    const std::string id = absl::StrCat("job-", next_id_++, "-", absl::Hex(UnixMs() & 0xffffff));
    job->info.set_job_id(id);
    job->info.set_name(request->name());
    job->info.set_state(v1::JOB_STATE_QUEUED);
    job->info.set_world_size(world);
    job->info.set_steps(steps);
    for (const auto& w : workers) job->info.add_workers(w);
    job->info.set_submitted_unix_ms(UnixMs());
    jobs_[id] = job;
    order_.push_back(id);
  }
  Log(absl::StrCat(job->info.job_id(), ": ", world, " ranks on ", absl::StrJoin(workers, ", "), ", ",
                   steps, " steps"));
  grpc::Status status = Run(context, job, *request, expanded, writer);
  Release(workers);
  {
    std::lock_guard<std::mutex> l(job->mu);
    Log(absl::StrCat(job->info.job_id(), ": ", v1::JobState_Name(job->info.state()),
                     job->info.error().empty() ? "" : ": ", job->info.error()));
  }
  return status;
}

grpc::Status JobServiceImpl::Run(grpc::ServerContext* context, const std::shared_ptr<Job>& job,
                                 const v1::SubmitJobRequest& request,
                                 const v1::ExpandResponse& expanded,
                                 grpc::ServerWriter<v1::JobEvent>* writer) {
  std::vector<std::string> workers;
  std::string job_id;
  int64_t steps = 0;
  {
    std::lock_guard<std::mutex> l(job->mu);
    workers.assign(job->info.workers().begin(), job->info.workers().end());
    job_id = job->info.job_id();
    steps = job->info.steps();
  }
  const int world = static_cast<int>(workers.size());
  auto event = [&](v1::JobState state) {
    v1::JobEvent e;
    e.set_job_id(job_id);
    e.set_state(state);
    for (const auto& w : workers) e.add_workers(w);
    return e;
  };
  writer->Write(event(v1::JOB_STATE_QUEUED));

  // Subscriptions: every rank's job messages and its loss go to the job's inbox.
  std::vector<int64_t> handles;
  struct Unsub {
    WorkerRegistry* reg;
    std::vector<int64_t>* hs;
    ~Unsub() {
      for (int64_t h : *hs) reg->Unsubscribe(h);
    }
  } unsub{registry_, &handles};
  auto send = [&](int rank, const v1::ServerMessage& m) { return registry_->Send(workers[rank], m); };
  auto cancel_ranks = [&](const std::string& reason, int except) {
    v1::ServerMessage m;
    m.mutable_cancel_job()->set_job_id(job_id);
    m.mutable_cancel_job()->set_reason(reason);
    for (int r = 0; r < world; ++r) {
      if (r != except) send(r, m);
    }
  };
  auto finish = [&](v1::JobState state, grpc::StatusCode code, const std::string& error, int except) {
    cancel_ranks(error, except);
    job->SetState(state, static_cast<int>(code), error);
    v1::JobEvent e = event(state);
    e.set_error(error);
    {
      std::lock_guard<std::mutex> l(job->mu);
      e.set_step(job->info.steps_done());
    }
    writer->Write(e);
    return grpc::Status(code, error);
  };
  auto lost_error = [&](int rank) {
    return absl::StrCat("job ", job_id, ": rank ", rank, " (worker ", workers[rank],
                        ") was lost: its stream ended or it missed its heartbeats");
  };
  auto cancelled = [&]() {
    std::string reason;
    {
      std::lock_guard<std::mutex> l(job->mu);
      reason = job->cancel_reason;
    }
    return finish(v1::JOB_STATE_CANCELLED, grpc::StatusCode::CANCELLED,
                  absl::StrCat("job ", job_id, " cancelled: ", reason.empty() ? "CancelJob" : reason), -1);
  };
  // A failed rank: a peer's loss usually shows up as a JobFailed of a survivor
  // first or right after; prefer naming the lost rank when it comes soon.
  auto failed = [&](const Job::Msg& msg) {
    if (msg.lost) {
      return finish(v1::JOB_STATE_FAILED, grpc::StatusCode::UNAVAILABLE, lost_error(msg.rank), msg.rank);
    }
    const v1::JobFailed& f = msg.m.job_failed();
    if (f.code() == static_cast<int>(grpc::StatusCode::UNAVAILABLE) ||
        f.code() == static_cast<int>(grpc::StatusCode::DEADLINE_EXCEEDED)) {
      const auto until = Clock::now() + std::chrono::milliseconds(1500);
      Job::Msg other;
      while (Clock::now() < until) {
        const double left = std::chrono::duration<double>(until - Clock::now()).count();
        if (Next(*job, nullptr, left, &other) != Wait::kMsg) break;
        if (other.lost) {
          return finish(v1::JOB_STATE_FAILED, grpc::StatusCode::UNAVAILABLE,
                        absl::StrCat(lost_error(other.rank), " (rank ", msg.rank, ": ", f.error(), ")"),
                        other.rank);
        }
      }
    }
    int code = f.code();
    if (code <= 0 || code > 16) code = static_cast<int>(grpc::StatusCode::UNKNOWN);
    return finish(v1::JOB_STATE_FAILED, static_cast<grpc::StatusCode>(code),
                  absl::StrCat("job ", job_id, ": rank ", msg.rank, " (worker ", workers[msg.rank],
                               ") failed", f.step() > 0 ? absl::StrCat(" at step ", f.step()) : "",
                               ": ", f.error()),
                  msg.rank);
  };

  for (int r = 0; r < world; ++r) {
    std::weak_ptr<Job> weak = job;
    const int64_t h = registry_->Subscribe(
        workers[r], [weak, r, job_id](const std::string&, const v1::WorkerMessage* m) {
          std::shared_ptr<Job> j = weak.lock();
          if (!j) return;
          Job::Msg msg;
          msg.rank = r;
          if (m == nullptr) {
            msg.lost = true;
          } else {
            const std::string* id = JobIdOf(*m);
            if (id == nullptr || *id != job_id) return;
            msg.m = *m;
          }
          {
            std::lock_guard<std::mutex> l(j->mu);
            j->inbox.push_back(std::move(msg));
          }
          j->cv.notify_all();
        });
    if (h == 0) {
      return finish(v1::JOB_STATE_FAILED, grpc::StatusCode::UNAVAILABLE, lost_error(r), r);
    }
    handles.push_back(h);
  }

  // Rendezvous: rank 0 serves the TCPStore. Loopback when rank 0 runs here.
  std::string host = "127.0.0.1";
  const std::string here = LocalHostname();
  for (const auto& w : registry_->List()) {
    if (w.worker_id() == workers[0] && !w.hostname().empty() && w.hostname() != here) host = w.hostname();
  }
  const int port = FreeLocalPort();
  if (port == 0) {
    return finish(v1::JOB_STATE_FAILED, grpc::StatusCode::INTERNAL, "no free rendezvous port", -1);
  }

  std::vector<v1::TensorChunk> state_chunks;
  uint32_t num_state = 0;
  for (const auto& c : request.initial_state()) {
    num_state += c.offset() == 0;
    RechunkTensor(c, options_.chunk_bytes, &state_chunks);
  }
  job->SetState(v1::JOB_STATE_RUNNING);
  for (int r = 0; r < world; ++r) {
    v1::ServerMessage m;
    v1::AssignJob* a = m.mutable_assign_job();
    a->set_job_id(job_id);
    a->set_rank(r);
    a->set_world_size(world);
    a->set_rendezvous_host(host);
    a->set_rendezvous_port(port);
    a->set_collective_timeout_s(request.collective_timeout_s());
    a->set_device("cpu");
    a->set_steps(steps);
    *a->mutable_graph() = expanded.graphs(r % expanded.graphs_size());
    a->set_num_state_tensors(num_state);
    bool ok = send(r, m);
    for (size_t i = 0; ok && i < std::max<size_t>(state_chunks.size(), 1); ++i) {
      v1::ServerMessage s;
      v1::StateChunk* sc = s.mutable_state_chunk();
      sc->set_job_id(job_id);
      if (i < state_chunks.size()) *sc->mutable_tensor() = state_chunks[i];
      sc->set_last(i + 1 >= state_chunks.size());
      ok = send(r, s);
    }
    if (!ok) return finish(v1::JOB_STATE_FAILED, grpc::StatusCode::UNAVAILABLE, lost_error(r), r);
  }
  writer->Write(event(v1::JOB_STATE_RUNNING));

  Job::Msg msg;
  // Setup: every rank answers JobStarted.
  for (int started = 0; started < world;) {
    const Wait w = Next(*job, context, 3600, &msg);
    if (w == Wait::kCancel) return cancelled();
    if (w == Wait::kTimeout) continue;
    if (msg.lost || msg.m.has_job_failed()) return failed(msg);
    started += msg.m.has_job_started();
  }
  // Steps: the global batch to every rank; each takes its slice.
  for (int64_t step = 1; step <= steps; ++step) {
    v1::ServerMessage m;
    v1::Batch* b = m.mutable_batch();
    b->set_job_id(job_id);
    b->set_step(step);
    *b->mutable_tensors() = request.batches(static_cast<int>(step - 1)).tensors();
    for (int r = 0; r < world; ++r) {
      if (!send(r, m)) return finish(v1::JOB_STATE_FAILED, grpc::StatusCode::UNAVAILABLE, lost_error(r), r);
    }
    std::vector<v1::StepResult> results(world);
    for (int got = 0; got < world;) {
      const Wait w = Next(*job, context, 3600, &msg);
      if (w == Wait::kCancel) return cancelled();
      if (w == Wait::kTimeout) continue;
      if (msg.lost || msg.m.has_job_failed()) return failed(msg);
      if (msg.m.has_step_result() && msg.m.step_result().step() == step) {
        results[msg.rank] = msg.m.step_result();
        ++got;
      }
    }
    v1::JobEvent e = event(v1::JOB_STATE_RUNNING);
    e.set_step(step);
    e.set_loss(results[0].loss());
    e.set_step_ms(results[0].step_ms());
    for (const auto& r : results) e.add_local_losses(r.local_loss());
    {
      std::lock_guard<std::mutex> l(job->mu);
      job->info.set_steps_done(step);
      job->info.add_losses(results[0].loss());
    }
    writer->Write(e);
  }
  // The end: the state from rank 0 (which then ends its job); the others end by CancelJob.
  {
    v1::ServerMessage m;
    m.mutable_fetch_state()->set_job_id(job_id);
    m.mutable_fetch_state()->set_chunk_bytes(static_cast<uint32_t>(options_.chunk_bytes));
    m.mutable_fetch_state()->set_end_job(true);
    if (!send(0, m)) return finish(v1::JOB_STATE_FAILED, grpc::StatusCode::UNAVAILABLE, lost_error(0), 0);
    for (int r = 1; r < world; ++r) {
      v1::ServerMessage c;
      c.mutable_cancel_job()->set_job_id(job_id);
      c.mutable_cancel_job()->set_reason("the job finished (state fetched from rank 0)");
      send(r, c);
    }
  }
  std::vector<v1::TensorChunk> final_state;
  bool have_state = false;
  std::vector<bool> ended(world, false);
  int num_ended = 0;
  auto end_deadline = Clock::time_point::max();
  while (!have_state || num_ended < world) {
    double left = 3600;
    if (have_state) {
      left = std::chrono::duration<double>(end_deadline - Clock::now()).count();
      if (left <= 0) {
        Log(absl::StrCat(job_id, ": ", world - num_ended, " rank(s) did not confirm the end of the job"));
        break;
      }
    }
    const Wait w = Next(*job, have_state ? nullptr : context, left, &msg);
    if (w == Wait::kCancel) return cancelled();
    if (w == Wait::kTimeout) continue;
    if (msg.lost || msg.m.has_job_failed()) {
      if (msg.rank == 0 && !have_state) return failed(msg);
      if (!ended[msg.rank]) ended[msg.rank] = true, ++num_ended;
      continue;
    }
    if (msg.rank == 0 && msg.m.has_state_chunk() && !have_state) {
      const v1::StateChunk& c = msg.m.state_chunk();
      if (c.has_tensor()) final_state.push_back(c.tensor());
      if (c.last()) {
        have_state = true;
        end_deadline = Clock::now() + std::chrono::microseconds(static_cast<int64_t>(options_.end_wait_s * 1e6));
      }
    } else if (msg.m.has_job_ended() && !ended[msg.rank]) {
      ended[msg.rank] = true;
      ++num_ended;
    }
  }
  job->state = std::move(final_state);
  job->SetState(v1::JOB_STATE_SUCCEEDED);
  v1::JobEvent e = event(v1::JOB_STATE_SUCCEEDED);
  e.set_step(steps);
  writer->Write(e);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::FindJob(const std::string& id, std::shared_ptr<Job>* job) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return {grpc::StatusCode::NOT_FOUND, "no job '" + id + "'"};
  *job = it->second;
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext*, const v1::GetJobRequest* request,
                                    v1::JobInfo* response) {
  std::shared_ptr<Job> j;
  if (grpc::Status s = FindJob(request->job_id(), &j); !s.ok()) return s;
  std::lock_guard<std::mutex> l(j->mu);
  *response = j->info;
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*,
                                      v1::ListJobsResponse* response) {
  std::vector<std::shared_ptr<Job>> jobs;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& id : order_) jobs.push_back(jobs_[id]);
  }
  for (auto& j : jobs) {
    std::lock_guard<std::mutex> l(j->mu);
    *response->add_jobs() = j->info;
  }
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext*, const v1::CancelJobRequest* request,
                                       v1::JobInfo* response) {
  std::shared_ptr<Job> j;
  if (grpc::Status s = FindJob(request->job_id(), &j); !s.ok()) return s;
  std::unique_lock<std::mutex> l(j->mu);
  if (!Terminal(j->info.state()) && !j->cancel) {
    j->cancel = true;
    j->cancel_reason = request->reason().empty() ? "CancelJob" : "CancelJob: " + request->reason();
    j->cv.notify_all();
  }
  j->cv.wait_for(l, std::chrono::seconds(5), [&] { return Terminal(j->info.state()); });
  *response = j->info;
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::FetchState(grpc::ServerContext*, const v1::FetchJobStateRequest* request,
                                        grpc::ServerWriter<v1::StateChunk>* writer) {
  std::shared_ptr<Job> j;
  if (grpc::Status s = FindJob(request->job_id(), &j); !s.ok()) return s;
  {
    std::lock_guard<std::mutex> l(j->mu);
    if (j->info.state() != v1::JOB_STATE_SUCCEEDED) {
      return {grpc::StatusCode::FAILED_PRECONDITION,
              absl::StrCat("job ", request->job_id(), " is ", v1::JobState_Name(j->info.state()),
                           ": only a SUCCEEDED job has a final state")};
    }
  }
  const size_t max = request->chunk_bytes() > 0 ? request->chunk_bytes() : options_.chunk_bytes;
  std::vector<v1::TensorChunk> chunks;
  for (const auto& c : j->state) RechunkTensor(c, max, &chunks);
  for (size_t i = 0; i < std::max<size_t>(chunks.size(), 1); ++i) {
    v1::StateChunk s;
    s.set_job_id(request->job_id());
    if (i < chunks.size()) *s.mutable_tensor() = std::move(chunks[i]);
    s.set_last(i + 1 >= chunks.size());
    if (!writer->Write(s)) return {grpc::StatusCode::CANCELLED, "the client went away"};
  }
  return grpc::Status::OK;
}

}  // namespace fxdp::server
