#include "server/job_service.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "analysis/ir/hyperparameters.h"
#include "expansion/data_parallel.h"
#include "server/raw_tensors.h"
#include "server/log.h"

namespace fxdp::server {
namespace {

using Clock = std::chrono::steady_clock;

int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Clock::duration Seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

bool Terminal(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED;
}

// The job a worker message is about (null for heartbeats and registration).
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

const char* RequestKind(const v1::SubmitJobRequest& r) {
  switch (r.msg_case()) {
    case v1::SubmitJobRequest::kSpec: return "a second spec";
    case v1::SubmitJobRequest::kState: return "an initial-state chunk";
    case v1::SubmitJobRequest::kBatch: return "a batch";
    default: return "an empty SubmitJobRequest";
  }
}

// An INPUT placeholder of the single-device graph.
struct InputSpec {
  std::string name;
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;
  int batch_dim = -1;
};

std::vector<InputSpec> GraphInputs(const v1::GraphDef& g) {
  std::vector<InputSpec> out;
  for (const v1::Node& n : g.nodes()) {
    if (n.kind() != v1::PLACEHOLDER || n.placeholder().role() != v1::INPUT || n.outputs_size() == 0 ||
        n.outputs(0).kind() != v1::TENSOR) {
      continue;
    }
    const v1::TensorMeta& t = n.outputs(0).tensor();
    out.push_back({n.placeholder().state_name(), t.dtype(),
                   std::vector<int64_t>(t.shape().begin(), t.shape().end()), n.placeholder().batch_dim()});
  }
  return out;
}

std::string QueueMessage(int world, int registered, int free, int ahead) {
  std::string m = absl::StrCat("waiting for ", world, " idle worker", world == 1 ? "" : "s", "; ",
                               registered, " registered");
  if (registered < world) {
    absl::StrAppend(&m, " (more workers must attach)");
  } else {
    absl::StrAppend(&m, ", ", free, " idle");
  }
  if (ahead > 0) absl::StrAppend(&m, "; ", ahead, " job", ahead == 1 ? "" : "s", " ahead in the queue");
  return m;
}

grpc::Status Invalid(const std::string& msg) { return {grpc::StatusCode::INVALID_ARGUMENT, msg}; }

grpc::Status ValidateSpec(const v1::JobSpec& spec) {
  if (!spec.has_graph()) return Invalid("JobSpec.graph is missing");
  if (spec.world_size() < 1) {
    return Invalid(absl::StrCat("JobSpec.world_size must be >= 1, got ", spec.world_size()));
  }
  if (spec.steps() < 0) {
    return Invalid(absl::StrCat("JobSpec.steps must be >= 0 (0: as many steps as the client sends "
                                "batches for), got ", spec.steps()));
  }
  for (int i = 0; i < spec.data_paths_size(); ++i) {
    if (spec.data_paths(i).empty()) return Invalid(absl::StrCat("JobSpec.data_paths[", i, "] is empty"));
  }
  if (spec.schedule_size() > 0 && spec.steps() == 0) {
    return Invalid("JobSpec.steps must be > 0 with a schedule (JobSpec.schedule gives one value per step)");
  }
  if (spec.data_paths_size() > 0 && spec.steps() == 0) {
    return Invalid("JobSpec.steps must be > 0 with data_paths (the workers read the batches; the client "
                   "sends none)");
  }
  const double t = spec.collective_timeout_s();
  if (!std::isfinite(t) || t < 0 || t > 86400.0 * 365) {
    return Invalid(absl::StrCat("JobSpec.collective_timeout_s must be in [0, one year] (0: 60 s), got ", t));
  }
  return grpc::Status::OK;
}

}  // namespace

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
  // Set before the job is queued, then read-only.
  v1::JobSpec spec;  // without the graph
  v1::ExpandResponse expanded;
  std::vector<InputSpec> inputs;
  ir::PlaceholderNames placeholders;  // of the single-device graph
  ir::Schedule schedule;              // JobSpec.schedule, checked

  std::mutex mu;
  std::condition_variable cv;
  v1::JobInfo info;             // mu
  std::deque<Msg> inbox;        // mu: the ranks' messages
  // mu: the client's messages (with their sizes), and whether its stream
  // ended (half-closed, or a failed read) or the call was cancelled.
  std::deque<std::pair<v1::SubmitJobRequest, size_t>> from_client;
  bool client_ended = false, client_gone = false;
  bool cancel = false;          // mu
  std::string cancel_reason;    // mu
  bool dispatched = false;      // mu; `workers` set
  std::vector<std::string> workers;                // mu; rank order
  std::vector<bool> assigned, confirmed, released;  // mu; per rank
  std::vector<int64_t> handles;  // the service's mu_: registry subscriptions
  Clock::time_point release_at;  // the service's mu_: free unconfirmed ranks then
  // The service's mu_: since when the job (queued) has needed more workers
  // than are registered; unset while enough are.
  std::optional<Clock::time_point> unplaceable_since;

  void SetState(v1::JobState s, int code = 0, const std::string& error = "") {
    {
      std::lock_guard<std::mutex> l(mu);
      info.set_state(s);
      if (!error.empty()) info.set_error(error);
      info.set_error_code(code);
      if (s != v1::JOB_STATE_QUEUED) {
        info.set_queue_position(0);
        info.clear_message();
      }
      if (s == v1::JOB_STATE_RUNNING) info.set_started_unix_ms(UnixMs());
      if (Terminal(s)) info.set_ended_unix_ms(UnixMs());
    }
    cv.notify_all();
  }
  // Asks a running job to stop; false when it ended or was asked already.
  bool Cancel(const std::string& reason) {
    {
      std::lock_guard<std::mutex> l(mu);
      if (Terminal(info.state()) || cancel) return false;
      cancel = true;
      cancel_reason = reason;
    }
    cv.notify_all();
    return true;
  }
  v1::JobEvent Event(v1::JobState state) {
    v1::JobEvent e;
    std::lock_guard<std::mutex> l(mu);
    e.set_job_id(info.job_id());
    e.set_state(state);
    e.set_step(info.steps_done());
    for (const auto& w : workers) e.add_workers(w);
    if (state == v1::JOB_STATE_QUEUED) {
      e.set_queue_position(info.queue_position());
      e.set_message(info.message());
    }
    if (Terminal(state)) e.set_error(info.error());
    return e;
  }
};

// One Submit call (gRPC's callback API): the client's messages are read into
// the job's `from_client` (ahead up to a byte budget the job thread sets),
// events are written in order from a queue, and the job thread (Runner)
// ends the call with its status.
class JobServiceImpl::SubmitCall final : public grpc::ServerBidiReactor<v1::SubmitJobRequest, v1::JobEvent> {
 public:
  explicit SubmitCall(JobServiceImpl* service);

  // From the job thread.
  void Write(v1::JobEvent e) {
    std::lock_guard<std::mutex> l(wmu_);
    if (finishing_) return;
    writes_.push_back(std::move(e));
    if (!writing_) {
      writing_ = true;
      StartWrite(&writes_.front());
    }
  }
  // Reads continue while fewer than `bytes` are buffered (0: no new read).
  void SetReadBudget(size_t bytes) {
    std::lock_guard<std::mutex> l(rmu_);
    budget_ = bytes;
    MaybeRead();
  }
  // The job thread took a message of `bytes` from the job's from_client.
  void Consumed(size_t bytes) {
    std::lock_guard<std::mutex> l(rmu_);
    buffered_ -= bytes;
    MaybeRead();
  }

 private:
  // Finishes the call once the queued events are written.
  void End(const grpc::Status& s) {
    std::lock_guard<std::mutex> l(wmu_);
    finishing_ = true;
    final_ = s;
    if (!writing_) Finish(s);
  }
  void MaybeRead() {  // rmu_ held
    if (reading_ || read_ended_ || buffered_ >= budget_) return;
    reading_ = true;
    incoming_.Clear();
    StartRead(&incoming_);
  }
  void OnReadDone(bool ok) override {
    std::lock_guard<std::mutex> l(rmu_);
    reading_ = false;
    // Each message counts its overhead too: empty ones must not pile up.
    const size_t bytes = ok ? incoming_.ByteSizeLong() + kMessageOverhead : 0;
    {
      std::lock_guard<std::mutex> jl(job_->mu);
      if (ok) {
        job_->from_client.emplace_back(std::move(incoming_), bytes);
      } else {
        job_->client_ended = true;
      }
    }
    job_->cv.notify_all();
    if (!ok) {
      read_ended_ = true;
      return;
    }
    buffered_ += bytes;
    MaybeRead();
  }
  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> l(wmu_);
    writes_.pop_front();
    if (!ok) writes_.clear();  // the client is gone
    if (!writes_.empty()) {
      StartWrite(&writes_.front());
      return;
    }
    writing_ = false;
    if (finishing_) Finish(final_);
  }
  void OnCancel() override {
    {
      std::lock_guard<std::mutex> l(job_->mu);
      job_->client_gone = true;
    }
    job_->cv.notify_all();
  }
  void OnDone() override {
    { std::lock_guard<std::mutex> l(start_mu_); }  // thread_ is assigned
    thread_.join();
    delete this;
  }

  static constexpr size_t kMessageOverhead = 64;

  JobServiceImpl* const service_;
  const std::shared_ptr<Job> job_ = std::make_shared<Job>();
  std::mutex rmu_;
  v1::SubmitJobRequest incoming_;  // the outstanding read's message
  bool reading_ = false, read_ended_ = false;
  size_t budget_ = 1, buffered_ = 0;  // at first: one message, the spec
  std::mutex wmu_;
  std::deque<v1::JobEvent> writes_;  // the front one is being written
  bool writing_ = false, finishing_ = false;
  grpc::Status final_;
  std::mutex start_mu_;  // held while thread_ is assigned
  std::thread thread_;
};

// One job, on its own thread: the spec, the queue, then the run (see
// job_service.h).
class JobServiceImpl::Runner {
 public:
  Runner(JobServiceImpl* service, SubmitCall* call, std::shared_ptr<Job> job)
      : service_(service), call_(call), job_(std::move(job)) {}

  // Everything from the spec to the end; Submit's status. `queued()` says
  // whether the job got a place in the queue (and so in the history).
  grpc::Status Serve() {
    if (grpc::Status s = TakeSpec(); !s.ok()) return s;
    v1::JobEvent first;
    if (grpc::Status s = service_->Enqueue(job_, &first); !s.ok()) return s;
    queued_ = true;
    {
      std::lock_guard<std::mutex> l(job_->mu);
      id_ = job_->info.job_id();
    }
    const v1::JobSpec& spec = job_->spec;
    Log(absl::StrCat(id_, ": submitted, ", spec.world_size(), " ranks, ",
                     spec.steps() > 0 ? absl::StrCat(spec.steps(), " steps") : "open-ended",
                     spec.data_paths_size() > 0 ? absl::StrCat(", batches from ", absl::StrJoin(spec.data_paths(), ", "))
                                                : "",
                     job_->schedule.empty() ? "" : absl::StrCat(", schedule for ", absl::StrJoin(job_->schedule.names(), ", ")),
                     job_->expanded.cached() ? " (compile cache hit)" : " (compiled: cache miss)"));
    call_->Write(first);
    grpc::Status status;
    if (!WaitInQueue(&status)) return status;
    {
      std::lock_guard<std::mutex> l(job_->mu);
      workers_ = job_->workers;
    }
    world_ = static_cast<int>(workers_.size());
    steps_ = spec.steps();
    Log(absl::StrCat(id_, ": dispatched to ", absl::StrJoin(workers_, ", ")));
    return Run();
  }
  bool queued() const { return queued_; }

 private:
  enum class Got { kWorker, kClient, kClientEnd, kCancel, kTimeout };

  // The next of: a rank's message (first), with `want_client` the client's
  // next message or the end of its stream, a cancellation (CancelJob, or
  // with `watch_client` the client went away); kTimeout after timeout_s.
  Got Next(bool want_client, bool watch_client, double timeout_s, Job::Msg* worker,
           v1::SubmitJobRequest* client = nullptr) {
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
        job_->cv.wait_for(l, std::min<Clock::duration>(std::chrono::milliseconds(100), deadline - now));
      }
    }
    if (consumed > 0) call_->Consumed(consumed);
    return got;
  }

  // The first message: the spec, checked and expanded.
  grpc::Status TakeSpec() {
    v1::SubmitJobRequest first;
    Job::Msg unused;
    Got got;
    const double idle = service_->options_.client_idle_s;
    got = Next(true, true, idle, &unused, &first);
    if (got == Got::kTimeout) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          absl::StrCat("the Submit stream sent no JobSpec within ", idle,
                                       " s (fxdp-server --client-idle-s)"));
    }
    call_->SetReadBudget(0);  // nothing more is read while the job waits in the queue
    if (got == Got::kCancel) return {grpc::StatusCode::CANCELLED, "the client went away"};
    if (got == Got::kClientEnd) return Invalid("the Submit stream ended before its first message (the JobSpec)");
    if (!first.has_spec()) {
      return Invalid(absl::StrCat("the first SubmitJobRequest must carry the JobSpec, got ", RequestKind(first)));
    }
    job_->spec.Swap(first.mutable_spec());
    const v1::JobSpec& spec = job_->spec;
    if (grpc::Status s = ValidateSpec(spec); !s.ok()) return s;
    if (grpc::Status s = TakeSchedule(); !s.ok()) return s;
    v1::ExpandRequest xr;
    xr.set_allocated_graph(job_->spec.release_graph());
    xr.set_world_size(spec.world_size());
    xr.set_bucket_cap_mb(spec.bucket_cap_mb());
    xr.set_first_bucket_mb(spec.first_bucket_mb());
    xr.set_sync_batchnorm(spec.sync_batchnorm());
    if (grpc::Status s = service_->compile_->Expand(nullptr, &xr, &job_->expanded); !s.ok()) {
      return {s.error_code(),
              absl::StrCat("expanding the graph for ", spec.world_size(), " ranks: ", s.error_message())};
    }
    if (job_->expanded.graphs_size() == 0) return {grpc::StatusCode::INTERNAL, "the expansion returned no graph"};
    job_->inputs = GraphInputs(xr.graph());
    return grpc::Status::OK;
  }

  // JobSpec.schedule: names of the graph's HYPERPARAMETER placeholders, each
  // with a value per step (checked before anything is compiled).
  grpc::Status TakeSchedule() {
    job_->placeholders = ir::PlaceholderNames::Of(job_->spec.graph());
    std::map<std::string, std::vector<double>> series;
    std::vector<std::string> names;
    for (const v1::HyperparameterSeries& h : job_->spec.schedule()) {
      if (series.count(h.name()) > 0) return Invalid(absl::StrCat("JobSpec.schedule: '", h.name(), "' appears twice"));
      names.push_back(h.name());
      series[h.name()].assign(h.values().begin(), h.values().end());
    }
    if (absl::Status s = job_->placeholders.Check(names, "JobSpec.schedule"); !s.ok()) return Invalid(std::string(s.message()));
    absl::StatusOr<ir::Schedule> schedule =
        ir::Schedule::FromSeries(std::move(series), job_->spec.steps(), "JobSpec.schedule");
    if (!schedule.ok()) return Invalid(std::string(schedule.status().message()));
    job_->schedule = *std::move(schedule);
    job_->spec.clear_schedule();
    return grpc::Status::OK;
  }

  // Waits until the dispatcher gives the job its workers (true), or the job
  // ends while queued (false, `*status` set): CancelJob, or the client went
  // away. A QUEUED event whenever its position or message changes.
  bool WaitInQueue(grpc::Status* status) {
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
          *status = grpc::Status(static_cast<grpc::StatusCode>(job_->info.error_code()), job_->info.error());
        } else if (job_->info.queue_position() != position || job_->info.message() != message) {
          position = job_->info.queue_position();
          message = job_->info.message();
          changed = true;
        }
        gone = job_->client_gone;
      }
      if (!status->ok()) {
        v1::JobState state;
        {
          std::lock_guard<std::mutex> l(job_->mu);
          state = job_->info.state();
        }
        call_->Write(job_->Event(state));
        return false;
      }
      if (changed) call_->Write(job_->Event(v1::JOB_STATE_QUEUED));
      if (gone) {
        std::lock_guard<std::mutex> l(service_->mu_);
        if (service_->queue_.Remove(id_)) {
          const std::string error = absl::StrCat("job ", id_, " cancelled while queued: the client of Submit went away");
          job_->SetState(v1::JOB_STATE_CANCELLED, static_cast<int>(grpc::StatusCode::CANCELLED), error);
          *status = grpc::Status(grpc::StatusCode::CANCELLED, error);
          return false;
        }
        // Dispatched meanwhile: the run sees that the client is gone.
      }
    }
  }

  grpc::Status Run() {
    call_->SetReadBudget(service_->options_.read_ahead_bytes);
    {
      std::lock_guard<std::mutex> l(job_->mu);
      if (job_->client_gone && !job_->cancel) {
        job_->cancel = true;
        job_->cancel_reason = "the client of Submit went away";
      }
    }
    // Nothing is assigned yet: a job cancelled now frees its workers at once.
    if (CancelRequested()) return Cancelled();
    if (grpc::Status s = Subscribe(); !s.ok()) return s;
    job_->SetState(v1::JOB_STATE_RUNNING);
    if (grpc::Status s = Assign(); !s.ok()) return s;
    call_->Write(job_->Event(v1::JOB_STATE_RUNNING));
    for (auto phase : {&Runner::ForwardState, &Runner::AwaitStarted, &Runner::Steps, &Runner::End}) {
      if (grpc::Status s = (this->*phase)(); !s.ok()) return s;
    }
    return grpc::Status::OK;
  }

  // Ends the job: CancelJob to every assigned rank but `except`, the state,
  // the last event; returns Submit's status.
  grpc::Status Finish(v1::JobState state, grpc::StatusCode code, const std::string& error, int except) {
    v1::ServerMessage m;
    m.mutable_cancel_job()->set_job_id(id_);
    m.mutable_cancel_job()->set_reason(error);
    for (int r = 0; r < world_; ++r) {
      if (r != except && Assigned(r)) Send(r, m);
    }
    job_->SetState(state, static_cast<int>(code), error);
    call_->Write(job_->Event(state));
    return grpc::Status(code, error);
  }
  grpc::Status Cancelled() {
    std::string reason;
    {
      std::lock_guard<std::mutex> l(job_->mu);
      reason = job_->cancel_reason;
    }
    return Finish(v1::JOB_STATE_CANCELLED, grpc::StatusCode::CANCELLED,
                  absl::StrCat("job ", id_, " cancelled: ", reason.empty() ? "CancelJob" : reason), -1);
  }
  // Seconds left of --client-idle-s counted from `from`.
  double ClientIdleLeft(Clock::time_point from) const {
    return std::min(3600.0, service_->options_.client_idle_s -
                                std::chrono::duration<double>(Clock::now() - from).count());
  }
  // The client sent nothing for --client-idle-s while the job waited on it.
  grpc::Status ClientIdle(absl::string_view waiting_for) {
    return Finish(v1::JOB_STATE_FAILED, grpc::StatusCode::DEADLINE_EXCEEDED,
                  absl::StrCat("job ", id_, ": the client sent nothing for ", service_->options_.client_idle_s,
                               " s while the job waited for ", waiting_for,
                               " (fxdp-server --client-idle-s); its workers are freed"),
                  -1);
  }
  // The client sent something wrong: the job fails with INVALID_ARGUMENT.
  grpc::Status BadInput(absl::string_view error) {
    return Finish(v1::JOB_STATE_FAILED, grpc::StatusCode::INVALID_ARGUMENT,
                  absl::StrCat("job ", id_, ": ", error), -1);
  }
  std::string LostError(int rank) const {
    return absl::StrCat("job ", id_, ": rank ", rank, " (worker ", workers_[rank],
                        ") was lost: its stream ended or it missed its heartbeats");
  }
  grpc::Status Lost(int rank) {
    return Finish(v1::JOB_STATE_FAILED, grpc::StatusCode::UNAVAILABLE, LostError(rank), rank);
  }
  // A failed rank: a peer's loss usually shows up as a JobFailed of a
  // survivor first or right after; prefer naming the lost rank when it comes
  // soon.
  grpc::Status Failed(const Job::Msg& msg) {
    if (msg.lost) return Lost(msg.rank);
    const v1::JobFailed& f = msg.m.job_failed();
    if (f.code() == static_cast<int>(grpc::StatusCode::UNAVAILABLE) ||
        f.code() == static_cast<int>(grpc::StatusCode::DEADLINE_EXCEEDED)) {
      const auto until = Clock::now() + std::chrono::milliseconds(1500);
      Job::Msg other;
      while (Clock::now() < until) {
        const double left = std::chrono::duration<double>(until - Clock::now()).count();
        if (Next(false, false, left, &other) != Got::kWorker) break;
        if (other.lost) {
          return Finish(v1::JOB_STATE_FAILED, grpc::StatusCode::UNAVAILABLE,
                        absl::StrCat(LostError(other.rank), " (rank ", msg.rank, ": ", f.error(), ")"),
                        other.rank);
        }
      }
    }
    int code = f.code();
    if (code <= 0 || code > 16) code = static_cast<int>(grpc::StatusCode::UNKNOWN);
    return Finish(v1::JOB_STATE_FAILED, static_cast<grpc::StatusCode>(code),
                  absl::StrCat("job ", id_, ": rank ", msg.rank, " (worker ", workers_[msg.rank], ") failed",
                               f.step() > 0 ? absl::StrCat(" at step ", f.step()) : "", ": ", f.error()),
                  msg.rank);
  }
  // A rank's message outside of the steps: a failure ends the job (non-OK),
  // JobStarted is counted, anything else is ignored.
  grpc::Status OnWorker(const Job::Msg& msg) {
    if (msg.lost || msg.m.has_job_failed()) return Failed(msg);
    started_ += msg.m.has_job_started();
    return grpc::Status::OK;
  }

  bool CancelRequested() {
    std::lock_guard<std::mutex> l(job_->mu);
    return job_->cancel;
  }
  bool Assigned(int rank) {
    std::lock_guard<std::mutex> l(job_->mu);
    return job_->assigned[rank];
  }
  bool Send(int rank, const v1::ServerMessage& m) { return service_->registry_->Send(workers_[rank], m); }
  // Sends `m` to every rank; a non-OK status (the job failed) when one is gone.
  grpc::Status SendAll(const v1::ServerMessage& m) {
    for (int r = 0; r < world_; ++r) {
      if (!Send(r, m)) return Lost(r);
    }
    return grpc::Status::OK;
  }

  // Every rank's messages about this job go to the job's inbox; a rank's end
  // (JobEnded, JobFailed, lost) is also recorded for the release of its worker.
  grpc::Status Subscribe() {
    std::vector<int64_t> handles;
    int lost = -1;
    for (int r = 0; r < world_ && lost < 0; ++r) {
      std::weak_ptr<Job> weak = job_;
      const std::string job_id = id_;
      // The dispatcher notices a rank's end at its next tick (no call back
      // into the service: a listener may still run while it is destroyed).
      const int64_t h = service_->registry_->Subscribe(
          workers_[r], [weak, r, job_id](const std::string&, const v1::WorkerMessage* m) {
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
            const bool end = msg.lost || msg.m.has_job_ended() || msg.m.has_job_failed();
            {
              std::lock_guard<std::mutex> l(j->mu);
              j->inbox.push_back(std::move(msg));
              if (end) j->confirmed[r] = true;
            }
            j->cv.notify_all();
          });
      if (h == 0) lost = r;
      handles.push_back(h);
    }
    {
      std::lock_guard<std::mutex> l(service_->mu_);
      for (int64_t h : handles) {
        if (h != 0) job_->handles.push_back(h);
      }
    }
    return lost < 0 ? grpc::Status::OK : Lost(lost);
  }

  grpc::Status Assign() {
    // Rendezvous: rank 0 serves the TCPStore. Loopback when rank 0 runs here.
    std::string host = "127.0.0.1";
    const std::string here = LocalHostname();
    for (const auto& w : service_->registry_->List()) {
      if (w.worker_id() == workers_[0] && !w.hostname().empty() && w.hostname() != here) host = w.hostname();
    }
    const int port = FreeLocalPort();
    if (port == 0) {
      return Finish(v1::JOB_STATE_FAILED, grpc::StatusCode::INTERNAL, "no free rendezvous port", -1);
    }
    const v1::JobSpec& spec = job_->spec;
    const v1::ExpandResponse& expanded = job_->expanded;
    for (int r = 0; r < world_; ++r) {
      v1::ServerMessage m;
      v1::AssignJob* a = m.mutable_assign_job();
      a->set_job_id(id_);
      a->set_rank(r);
      a->set_world_size(world_);
      a->set_rendezvous_host(host);
      a->set_rendezvous_port(port);
      a->set_collective_timeout_s(spec.collective_timeout_s());
      a->set_device("cpu");
      a->set_steps(steps_);
      *a->mutable_graph() = expanded.graphs(r % expanded.graphs_size());
      a->set_num_state_tensors(spec.num_state_tensors());
      a->set_batches_sharded(spec.data_paths_size() == 0);
      *a->mutable_data_paths() = spec.data_paths();
      {
        std::lock_guard<std::mutex> l(job_->mu);
        job_->assigned[r] = true;
      }
      if (!Send(r, m)) return Lost(r);
    }
    return grpc::Status::OK;
  }

  // The client's initial state, forwarded chunk by chunk to every rank.
  grpc::Status ForwardState() {
    const uint32_t n = job_->spec.num_state_tensors();
    v1::ServerMessage m;
    v1::StateChunk* sc = m.mutable_state_chunk();
    sc->set_job_id(id_);
    if (n == 0) {
      sc->set_last(true);
      return SendAll(m);
    }
    ChunkStream stream("initial state", /*keep_data=*/false);
    v1::SubmitJobRequest req;
    Job::Msg msg;
    std::vector<v1::TensorChunk> pieces;
    Clock::time_point idle_from = Clock::now();
    while (stream.complete() < n) {
      const double left = ClientIdleLeft(idle_from);
      if (left <= 0) {
        return ClientIdle(absl::StrCat("its initial state (", stream.complete(), " of the ", n,
                                       " tensors of JobSpec.num_state_tensors received)"));
      }
      const Got got = Next(true, true, left, &msg, &req);
      if (got == Got::kTimeout) continue;
      if (got == Got::kCancel) return Cancelled();
      if (got == Got::kWorker) {
        if (grpc::Status s = OnWorker(msg); !s.ok()) return s;
        continue;
      }
      if (got == Got::kClientEnd) {
        return BadInput(absl::StrCat("the client ended the stream after ", stream.complete(), " of the ", n,
                                     " initial-state tensors (JobSpec.num_state_tensors)"));
      }
      idle_from = Clock::now();
      if (!req.has_state()) {
        return BadInput(absl::StrCat("expected initial-state chunks (", stream.complete(), " of the ", n,
                                     " tensors of JobSpec.num_state_tensors so far), got ", RequestKind(req)));
      }
      if (absl::Status s = stream.Add(req.state()); !s.ok()) return BadInput(s.message());
      pieces.clear();
      RechunkTensor(req.state(), service_->options_.chunk_bytes, &pieces);
      for (size_t i = 0; i < pieces.size(); ++i) {
        sc->mutable_tensor()->Swap(&pieces[i]);
        sc->set_last(stream.complete() == n && i + 1 == pieces.size());
        if (grpc::Status s = SendAll(m); !s.ok()) return s;
      }
    }
    return grpc::Status::OK;
  }

  // Setup: every rank answers JobStarted.
  grpc::Status AwaitStarted() {
    Job::Msg msg;
    while (started_ < world_) {
      const Got got = Next(false, true, 3600, &msg);
      if (got == Got::kCancel) return Cancelled();
      if (got != Got::kWorker) continue;
      if (grpc::Status s = OnWorker(msg); !s.ok()) return s;
    }
    return grpc::Status::OK;
  }

  // The steps: the client's batches are taken (and sent to the ranks) up to
  // steps_ahead steps before the earliest unfinished step's results are in;
  // one event per step, in order, as soon as its results are.
  grpc::Status Steps() {
    const bool from_files = job_->spec.data_paths_size() > 0;
    if (from_files) call_->SetReadBudget(0);
    struct Pending {
      int64_t step;
      std::vector<v1::StepResult> results;
      int got = 0;
    };
    std::deque<Pending> pending;
    int64_t sent = 0;
    bool client_done = false;
    const size_t ahead = static_cast<size_t>(std::max(1, service_->options_.steps_ahead));
    std::unique_ptr<ChunkStream> batch;  // the step being read from the client
    Job::Msg msg;
    v1::SubmitJobRequest req;
    Clock::time_point idle_from = Clock::now();
    while (true) {
      const bool room = !client_done && pending.size() < ahead && (steps_ == 0 || sent < steps_);
      // Nothing outstanding on the workers: the job waits on its client alone.
      const bool on_client = room && !from_files && pending.empty();
      if (!on_client) idle_from = Clock::now();
      const double left = on_client ? ClientIdleLeft(idle_from) : 3600;
      if (left <= 0) return ClientIdle(absl::StrCat("step ", sent + 1, "'s batch"));
      if (room && from_files) {
        v1::ServerMessage m;
        m.mutable_batch()->set_job_id(id_);
        m.mutable_batch()->set_step(++sent);
        AddHyperparameters(job_->schedule.At(sent), m.mutable_batch());
        if (grpc::Status s = SendAll(m); !s.ok()) return s;
        pending.push_back({sent, std::vector<v1::StepResult>(world_), 0});
        continue;
      }
      if (pending.empty() && (client_done || (steps_ > 0 && sent == steps_))) break;
      const Got got = Next(room, true, left, &msg, &req);
      if (got == Got::kTimeout) continue;
      if (got == Got::kClient) idle_from = Clock::now();
      if (got == Got::kCancel) return Cancelled();
      if (got == Got::kClientEnd) {
        if (batch != nullptr) {
          return BadInput(absl::StrCat("the client ended the stream in the middle of step ", sent + 1,
                                       "'s batch (its last StepBatch had more set)"));
        }
        if (steps_ > 0) {
          return BadInput(absl::StrCat("the client ended the stream after the batches of ", sent, " of ", steps_,
                                       " steps (JobSpec.steps)"));
        }
        client_done = true;
        continue;
      }
      if (got == Got::kClient) {
        if (grpc::Status s = TakeBatchMessage(sent + 1, req, batch); !s.ok()) return s;
        if (batch != nullptr) continue;  // more of this step follows
        ++sent;
        pending.push_back({sent, std::vector<v1::StepResult>(world_), 0});
        if (steps_ > 0 && sent == steps_) call_->SetReadBudget(0);
        continue;
      }
      if (msg.lost || msg.m.has_job_failed()) return Failed(msg);
      if (!msg.m.has_step_result()) continue;
      const v1::StepResult& sr = msg.m.step_result();
      for (Pending& p : pending) {
        if (p.step == sr.step() && p.results[msg.rank].step() == 0) {
          p.results[msg.rank] = sr;
          ++p.got;
        }
      }
      while (!pending.empty() && pending.front().got == world_) {
        StepDone(pending.front().step, pending.front().results);
        pending.pop_front();
      }
    }
    if (sent == 0) return BadInput("the client sent no batch: a job needs at least one step");
    if (steps_ == 0) {
      steps_ = sent;
      std::lock_guard<std::mutex> l(job_->mu);
      job_->info.set_steps(sent);
    }
    return grpc::Status::OK;
  }

  void StepDone(int64_t step, const std::vector<v1::StepResult>& results) {
    {
      std::lock_guard<std::mutex> l(job_->mu);
      job_->info.set_steps_done(step);
      job_->info.add_losses(results[0].loss());
    }
    v1::JobEvent e = job_->Event(v1::JOB_STATE_RUNNING);
    e.set_step(step);
    e.set_loss(results[0].loss());
    e.set_step_ms(results[0].step_ms());
    for (const auto& r : results) e.add_local_losses(r.local_loss());
    call_->Write(std::move(e));
  }

  const InputSpec* FindInput(const std::string& name) const {
    for (const InputSpec& in : job_->inputs) {
      if (in.name == name) return &in;
    }
    return nullptr;
  }

  // One client message of step `step`'s batch, checked against the graph's
  // INPUTs; `batch` holds the step's tensors until its last message, which
  // sends every rank its shard and resets `batch`.
  grpc::Status TakeBatchMessage(int64_t step, const v1::SubmitJobRequest& req, std::unique_ptr<ChunkStream>& batch) {
    const std::string what = absl::StrCat("step ", step, "'s batch");
    if (!req.has_batch()) return BadInput(absl::StrCat("expected ", what, ", got ", RequestKind(req)));
    const v1::StepBatch& b = req.batch();
    if (b.step() != step) {
      return BadInput(absl::StrCat("got a StepBatch for step ", b.step(), ", expected step ", step,
                                   " (steps count from 1, consecutively)"));
    }
    if (batch == nullptr) {
      batch = std::make_unique<ChunkStream>(what, /*keep_data=*/true);
      step_hyper_.clear();
    }
    for (const v1::HyperparameterValue& h : b.hyperparameters()) {
      if (absl::Status s = job_->placeholders.Check({h.name()}, absl::StrCat(what, ": StepBatch.hyperparameters"));
          !s.ok()) {
        return BadInput(s.message());
      }
      if (!std::isfinite(h.value())) {
        return BadInput(absl::StrCat(what, ": hyper-parameter '", h.name(), "' is ", h.value(),
                                     ", not a finite number"));
      }
      step_hyper_[h.name()] = h.value();
    }
    for (const v1::TensorChunk& c : b.tensors()) {
      if (!batch->pending()) {
        const InputSpec* in = FindInput(c.name());
        if (in == nullptr) {
          std::vector<std::string> names;
          for (const InputSpec& i : job_->inputs) names.push_back(i.name);
          return BadInput(absl::StrCat(what, ": tensor '", c.name(), "' is not an INPUT of the graph (its inputs: ",
                                       absl::StrJoin(names, ", "), ")"));
        }
        const std::vector<int64_t> shape(c.shape().begin(), c.shape().end());
        if (c.dtype() != in->dtype || shape != in->shape) {
          return BadInput(absl::StrCat(what, ": input '", c.name(), "' is ", TypeString(c.dtype(), shape),
                                       ", the graph expects ", TypeString(in->dtype, in->shape),
                                       " (the global batch)"));
        }
      }
      if (absl::Status s = batch->Add(c); !s.ok()) return BadInput(s.message());
    }
    if (b.more()) return grpc::Status::OK;
    if (batch->pending()) {
      return BadInput(absl::StrCat(what, ": tensor '", batch->pending_name(),
                                   "' is incomplete and StepBatch.more is not set"));
    }
    std::vector<RawTensor> tensors = batch->Take();
    batch.reset();
    for (const InputSpec& in : job_->inputs) {
      if (std::none_of(tensors.begin(), tensors.end(), [&](const RawTensor& t) { return t.name == in.name; })) {
        return BadInput(absl::StrCat(what, " lacks input '", in.name, "' (", TypeString(in.dtype, in.shape), ")"));
      }
    }
    return SendShards(step, tensors);
  }

  // Every rank its slice of each tensor along the INPUT's batch dim (the
  // whole tensor for an input without one).
  grpc::Status SendShards(int64_t step, const std::vector<RawTensor>& tensors) {
    // The step's hyper-parameters: the schedule's, overridden by the batch's.
    std::map<std::string, double> merged;
    for (const auto& [name, value] : job_->schedule.At(step)) merged[name] = value;
    for (const auto& [name, value] : step_hyper_) merged[name] = value;
    const ir::HyperparameterValues hyper(merged.begin(), merged.end());
    std::vector<v1::TensorChunk> chunks;
    for (int r = 0; r < world_; ++r) {
      chunks.clear();
      for (const RawTensor& t : tensors) {
        const InputSpec& in = *FindInput(t.name);
        v1::TensorChunk c;
        c.set_name(t.name);
        c.set_dtype(t.dtype);
        std::vector<int64_t> shape = t.shape;
        if (in.batch_dim >= 0 && in.batch_dim < static_cast<int>(shape.size())) {
          const RankSlice slice = SplitBatch(shape[in.batch_dim], world_)[r];
          absl::StatusOr<std::string> data = SliceDim(t, in.batch_dim, slice.start, slice.size);
          if (!data.ok()) return BadInput(absl::StrCat("step ", step, "'s batch: ", data.status().message()));
          shape[in.batch_dim] = slice.size;
          c.set_data(*std::move(data));
        } else {
          c.set_data(t.data);
        }
        for (int64_t d : shape) c.add_shape(d);
        RechunkTensor(c, service_->options_.chunk_bytes, &chunks);
      }
      if (grpc::Status s = SendBatch(r, step, hyper, chunks); !s.ok()) return s;
    }
    return grpc::Status::OK;
  }

  // A rank's Batch messages: chunks grouped up to chunk_bytes per message,
  // `more` on all but the last.
  grpc::Status SendBatch(int rank, int64_t step, const ir::HyperparameterValues& hyper,
                         std::vector<v1::TensorChunk>& chunks) {
    v1::ServerMessage m;
    v1::Batch* b = m.mutable_batch();
    size_t bytes = 0;
    auto start = [&] {
      b->Clear();
      b->set_job_id(id_);
      b->set_step(step);
      bytes = 0;
    };
    start();
    AddHyperparameters(hyper, b);  // on the step's first message
    for (v1::TensorChunk& c : chunks) {
      if (b->tensors_size() > 0 && bytes + c.data().size() > service_->options_.chunk_bytes) {
        b->set_more(true);
        if (!Send(rank, m)) return Lost(rank);
        start();
      }
      bytes += c.data().size();
      b->add_tensors()->Swap(&c);
    }
    if (!Send(rank, m)) return Lost(rank);
    return grpc::Status::OK;
  }

  // The end: the state from rank 0 (which then ends its job); the other ranks
  // end by CancelJob.
  grpc::Status End() {
    call_->SetReadBudget(0);
    v1::ServerMessage m;
    m.mutable_fetch_state()->set_job_id(id_);
    m.mutable_fetch_state()->set_chunk_bytes(static_cast<uint32_t>(service_->options_.chunk_bytes));
    m.mutable_fetch_state()->set_end_job(true);
    if (!Send(0, m)) return Lost(0);
    for (int r = 1; r < world_; ++r) {
      v1::ServerMessage c;
      c.mutable_cancel_job()->set_job_id(id_);
      c.mutable_cancel_job()->set_reason("the job finished (state fetched from rank 0)");
      Send(r, c);
    }
    auto state = std::make_shared<StateStore::State>();
    Job::Msg msg;
    while (true) {
      const Got got = Next(false, true, 3600, &msg);
      if (got == Got::kCancel) return Cancelled();
      if (got != Got::kWorker || msg.rank != 0) continue;  // the others end by CancelJob
      if (msg.lost || msg.m.has_job_failed()) return Failed(msg);
      if (!msg.m.has_state_chunk()) continue;
      v1::StateChunk& c = *msg.m.mutable_state_chunk();
      if (c.has_tensor()) state->push_back(std::move(*c.mutable_tensor()));
      if (c.last()) break;
    }
    service_->KeepState(job_, std::move(state));
    job_->SetState(v1::JOB_STATE_SUCCEEDED);
    call_->Write(job_->Event(v1::JOB_STATE_SUCCEEDED));
    return grpc::Status::OK;
  }

  static void AddHyperparameters(const ir::HyperparameterValues& values, v1::Batch* b) {
    for (const auto& [name, value] : values) {
      v1::HyperparameterValue* h = b->add_hyperparameters();
      h->set_name(name);
      h->set_value(value);
    }
  }

  JobServiceImpl* const service_;
  SubmitCall* const call_;
  const std::shared_ptr<Job> job_;
  std::map<std::string, double> step_hyper_;  // StepBatch.hyperparameters of the step being read
  bool queued_ = false;
  std::string id_;
  std::vector<std::string> workers_;
  int world_ = 0;
  int started_ = 0;    // ranks that sent JobStarted
  int64_t steps_ = 0;  // 0: until the client half-closes
};

JobServiceImpl::SubmitCall::SubmitCall(JobServiceImpl* service) : service_(service) {
  {
    std::lock_guard<std::mutex> l(rmu_);
    MaybeRead();  // the spec (budget_ 1, buffered_ 0)
  }
  std::lock_guard<std::mutex> l(start_mu_);
  thread_ = std::thread([this] {
    Runner runner(service_, this, job_);
    const grpc::Status status = runner.Serve();
    if (runner.queued()) {
      service_->Finished(job_);
      std::lock_guard<std::mutex> l(job_->mu);
      Log(absl::StrCat(job_->info.job_id(), ": ", v1::JobState_Name(job_->info.state()),
                       job_->info.error().empty() ? "" : ": ", job_->info.error()));
    }
    End(status);
  });
}

JobServiceImpl::JobServiceImpl(CompileServiceImpl* compile, WorkerRegistry* registry,
                               JobServiceOptions options)
    : compile_(compile),
      registry_(registry),
      options_(options),
      queue_(options.max_queued_jobs),
      states_(options.max_state_bytes),
      dispatcher_(&JobServiceImpl::DispatchLoop, this) {}

JobServiceImpl::~JobServiceImpl() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  dispatch_cv_.notify_all();
  dispatcher_.join();
  for (auto& j : releasing_) {
    for (int64_t h : j->handles) registry_->Unsubscribe(h);
  }
}

void JobServiceImpl::Wake() {
  wake_ = true;
  dispatch_cv_.notify_all();
}

void JobServiceImpl::DispatchLoop() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    dispatch_cv_.wait_for(l, Seconds(options_.dispatch_interval_s), [&] { return stop_ || wake_.load(); });
    wake_ = false;
    if (stop_) break;
    ReleaseLocked();
    DispatchLocked();
  }
}

void JobServiceImpl::ReleaseLocked() {
  const auto now = Clock::now();
  std::vector<int64_t> unsubscribe;
  for (auto it = releasing_.begin(); it != releasing_.end();) {
    Job& j = **it;
    bool all = true;
    {
      std::lock_guard<std::mutex> l(j.mu);
      for (size_t r = 0; r < j.workers.size(); ++r) {
        if (j.released[r]) continue;
        if (j.assigned[r] && !j.confirmed[r] && now < j.release_at) {
          all = false;
          continue;
        }
        if (j.assigned[r] && !j.confirmed[r]) {
          Log(absl::StrCat(j.info.job_id(), ": worker ", j.workers[r], " (rank ", r,
                           ") did not confirm the end of the job; freeing it anyway"));
        }
        queue_.Release(j.workers[r], j.info.job_id());
        j.released[r] = true;
      }
      if (all) j.inbox.clear();
    }
    if (!all) {
      ++it;
      continue;
    }
    unsubscribe.insert(unsubscribe.end(), j.handles.begin(), j.handles.end());
    j.handles.clear();
    it = releasing_.erase(it);
  }
  for (int64_t h : unsubscribe) registry_->Unsubscribe(h);
}

int JobServiceImpl::RegisteredWorkers() const {
  int registered = 0;
  for (const auto& w : registry_->List()) registered += w.state() != v1::WORKER_STATE_LOST;
  return registered;
}

std::string JobServiceImpl::CannotRunMessage(int world, int registered) const {
  return absl::StrCat("JobSpec.world_size ", world, " exceeds the ", registered, " worker",
                      registered == 1 ? "" : "s", " registered (not LOST), so it cannot run (jobs wait ",
                      options_.queue_grace_s, " s for workers to attach: fxdp-server --queue-grace-s)");
}

void JobServiceImpl::DispatchLocked() {
  if (queue_.size() == 0) return;
  const std::vector<std::string> idle = registry_->IdleWorkers();
  for (JobQueue::Dispatch& d : queue_.Take(idle)) {
    std::shared_ptr<Job> j = jobs_[d.job_id];
    {
      std::lock_guard<std::mutex> l(j->mu);
      j->workers = d.workers;
      j->assigned.assign(d.workers.size(), false);
      j->confirmed.assign(d.workers.size(), false);
      j->released.assign(d.workers.size(), false);
      j->info.clear_workers();
      for (const auto& w : d.workers) j->info.add_workers(w);
      j->dispatched = true;
    }
    j->cv.notify_all();
  }
  if (queue_.size() == 0) return;
  const int registered = RegisteredWorkers();
  // Jobs that cannot run on the registered workers: failed after the grace
  // period, so that the queue behind them moves on.
  const Clock::time_point now = Clock::now();
  bool removed = false;
  for (const std::string& id : queue_.Ids()) {
    std::shared_ptr<Job> j = jobs_[id];
    const int world = j->spec.world_size();
    if (world <= registered) {
      j->unplaceable_since.reset();
      continue;
    }
    if (!j->unplaceable_since) j->unplaceable_since = now;
    if (now - *j->unplaceable_since < Seconds(options_.queue_grace_s)) continue;
    queue_.Remove(id);
    removed = true;
    j->SetState(v1::JOB_STATE_FAILED, static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION),
                absl::StrCat("job ", id, " failed while queued: ", CannotRunMessage(world, registered)));
  }
  if (removed) {
    DispatchLocked();
    return;
  }
  const int free = static_cast<int>(queue_.Free(idle).size());
  int position = 0;
  for (const std::string& id : queue_.Ids()) {
    std::shared_ptr<Job> j = jobs_[id];
    ++position;
    {
      std::lock_guard<std::mutex> l(j->mu);
      const std::string msg = QueueMessage(j->info.world_size(), registered, free, position - 1);
      if (j->info.queue_position() == position && j->info.message() == msg) continue;
      j->info.set_queue_position(position);
      j->info.set_message(msg);
    }
    j->cv.notify_all();
  }
}

grpc::ServerBidiReactor<v1::SubmitJobRequest, v1::JobEvent>* JobServiceImpl::Submit(grpc::CallbackServerContext*) {
  return new SubmitCall(this);
}

grpc::Status JobServiceImpl::Enqueue(const std::shared_ptr<Job>& job, v1::JobEvent* first) {
  const v1::JobSpec& spec = job->spec;
  std::lock_guard<std::mutex> l(mu_);
  const std::string id = absl::StrCat("job-", next_id_, "-", absl::Hex(UnixMs() & 0xffffff));
  if (Clock::now() - started_ >= Seconds(options_.queue_grace_s)) {
    const int registered = RegisteredWorkers();
    if (spec.world_size() > registered) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, CannotRunMessage(spec.world_size(), registered));
    }
  }
  if (absl::Status s = queue_.Push(id, spec.world_size()); !s.ok()) return ToGrpcStatus(s);
  ++next_id_;
  {
    std::lock_guard<std::mutex> jl(job->mu);
    v1::JobInfo& info = job->info;
    info.set_job_id(id);
    info.set_name(spec.name());
    info.set_state(v1::JOB_STATE_QUEUED);
    info.set_world_size(spec.world_size());
    info.set_steps(spec.steps());
    *info.mutable_data_paths() = spec.data_paths();
    info.set_submitted_unix_ms(UnixMs());
    info.set_compile_cached(job->expanded.cached());
    for (std::string& h : job->placeholders.Hyperparameters()) info.add_hyperparameters(std::move(h));
  }
  jobs_[id] = job;
  order_.push_back(id);
  DispatchLocked();
  // The first event is QUEUED: its place in the queue, or position 0 when
  // it was dispatched at once.
  *first = job->Event(v1::JOB_STATE_QUEUED);
  first->clear_workers();
  return grpc::Status::OK;
}

void JobServiceImpl::Finished(const std::shared_ptr<Job>& job) {
  std::lock_guard<std::mutex> l(mu_);
  const std::string& id = job->info.job_id();  // set before the job was shared
  finished_.push_back(id);
  while (finished_.size() > std::max<size_t>(options_.max_finished_jobs, 1)) {
    const std::string old = finished_.front();
    finished_.pop_front();
    jobs_.erase(old);
    order_.erase(std::find(order_.begin(), order_.end(), old));
    states_.Erase(old);
  }
  bool dispatched = false;
  {
    std::lock_guard<std::mutex> jl(job->mu);
    dispatched = job->dispatched;
  }
  if (dispatched) {
    const double timeout = job->spec.collective_timeout_s() > 0 ? job->spec.collective_timeout_s() : 60;
    job->release_at = Clock::now() + Seconds(timeout + options_.release_grace_s);
    releasing_.push_back(job);
  }
  Wake();
}

void JobServiceImpl::KeepState(const std::shared_ptr<Job>& job, std::shared_ptr<const StateStore::State> state) {
  std::lock_guard<std::mutex> l(mu_);
  const std::string& id = job->info.job_id();
  for (const std::string& gone : states_.Put(id, std::move(state))) {
    auto it = jobs_.find(gone);
    if (it == jobs_.end()) continue;
    if (gone != id) Log(absl::StrCat(gone, ": final state evicted (--max-state-mb)"));
    std::lock_guard<std::mutex> jl(it->second->mu);
    it->second->info.set_has_state(false);
    it->second->info.set_state_evicted(true);
  }
  if (states_.Get(id) != nullptr) {
    std::lock_guard<std::mutex> jl(job->mu);
    job->info.set_has_state(true);
  } else {
    Log(absl::StrCat(id, ": final state not kept: larger than --max-state-mb"));
  }
}

grpc::Status JobServiceImpl::FindJob(const std::string& id, std::shared_ptr<Job>* job) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) {
    return {grpc::StatusCode::NOT_FOUND,
            absl::StrCat("no job '", id, "' (the server remembers the last ",
                         std::max<size_t>(options_.max_finished_jobs, 1), " finished jobs: --max-finished-jobs)")};
  }
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
  const std::string reason = request->reason().empty() ? "CancelJob" : "CancelJob: " + request->reason();
  {
    std::lock_guard<std::mutex> l(mu_);
    if (queue_.Remove(request->job_id())) {
      {
        std::lock_guard<std::mutex> jl(j->mu);
        j->cancel = true;
        j->cancel_reason = reason;
      }
      j->SetState(v1::JOB_STATE_CANCELLED, static_cast<int>(grpc::StatusCode::CANCELLED),
                  absl::StrCat("job ", request->job_id(), " cancelled while queued: ", reason));
    }
  }
  j->Cancel(reason);
  std::unique_lock<std::mutex> l(j->mu);
  j->cv.wait_for(l, std::chrono::seconds(5), [&] { return Terminal(j->info.state()); });
  *response = j->info;
  return grpc::Status::OK;
}

void JobServiceImpl::CancelAll(const std::string& reason) {
  std::vector<std::shared_ptr<Job>> jobs;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& [id, j] : jobs_) {
      if (queue_.Remove(id)) {
        j->SetState(v1::JOB_STATE_CANCELLED, static_cast<int>(grpc::StatusCode::CANCELLED),
                    absl::StrCat("job ", id, " cancelled while queued: ", reason));
      }
      jobs.push_back(j);
    }
  }
  for (auto& j : jobs) j->Cancel(reason);
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
  std::shared_ptr<const StateStore::State> state;
  {
    std::lock_guard<std::mutex> l(mu_);
    state = states_.Get(request->job_id());
  }
  if (state == nullptr) {
    return {grpc::StatusCode::FAILED_PRECONDITION,
            absl::StrCat("job ", request->job_id(), "'s final state was evicted: the server keeps at most ",
                         options_.max_state_bytes >> 20,
                         " MiB of final states (--max-state-mb) and evicts the oldest first; fetch it "
                         "sooner or raise --max-state-mb")};
  }
  const size_t max = request->chunk_bytes() > 0 ? request->chunk_bytes() : options_.chunk_bytes;
  auto write = [&](v1::StateChunk& s) {
    s.set_job_id(request->job_id());
    return writer->Write(s);
  };
  if (state->empty()) {
    v1::StateChunk s;
    s.set_last(true);
    if (!write(s)) return {grpc::StatusCode::CANCELLED, "the client went away"};
  }
  std::vector<v1::TensorChunk> chunks;
  for (size_t t = 0; t < state->size(); ++t) {
    // One stored chunk at a time: the whole state is never copied.
    chunks.clear();
    RechunkTensor((*state)[t], max, &chunks);
    for (size_t i = 0; i < chunks.size(); ++i) {
      v1::StateChunk s;
      s.mutable_tensor()->Swap(&chunks[i]);
      s.set_last(t + 1 == state->size() && i + 1 == chunks.size());
      if (!write(s)) return {grpc::StatusCode::CANCELLED, "the client went away"};
    }
  }
  return grpc::Status::OK;
}

}  // namespace fxdp::server
