// fxdp-worker attach: see attach.h and proto/fxdp/v1/worker.proto.
//
// Threads:
//   main       connects, registers, reads the server's messages in order and
//              routes them (assembling state and batch tensors from chunks);
//              reconnects with backoff.
//   heartbeat  one per attachment: a Heartbeat every interval.
//   job        one per job: rendezvous, load, then one event at a time from
//              the job's queue (a batch, a state fetch, a cancel).
//   signals    waits for SIGTERM/SIGINT (self-pipe) and starts the shutdown.
// Writes to the stream are serialised by Session's mutex. Lock order: the
// worker's mu_ before a Job's mu; Session's mutex is a leaf.
#include "executor/worker/attach.h"
#include "security/credentials.h"
#include "util/flags.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <grpcpp/grpcpp.h>
#include <torch/headeronly/version.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "analysis/ir/proto_codec.h"
#include "util/status_macros.h"
#include "executor/communicator.h"
#include "executor/interpreter.h"
#include "executor/step_runner.h"
#include "executor/safetensors.h"
#include "executor/timed_communicator.h"
#include "executor/worker/common.h"
#include "executor/worker/wire_tensors.h"
#include "proto/fxdp/v1/worker.grpc.pb.h"
#include "proto/fxdp/v1/worker.pb.h"

#ifndef FXDP_VERSION
#define FXDP_VERSION "unknown"
#endif

namespace fxdp::executor {

const char kAttachUsage[] =
    "usage: fxdp-worker attach [--server HOST:PORT] [--device cpu|cuda:N] [--worker-id ID]\n"
    "                          [--heartbeat-ms 1000] [--threads N] [--max-message-mb 1024]\n"
    "                          [--data-root DIR ...] [--max-data-mb 65536]\n"
    "                          [--tls-ca FILE [--tls-cert FILE --tls-key FILE | --token-file FILE]]\n"
    "\n"
    "Serves an fxdp server as a worker daemon (protocol: proto/fxdp/v1/worker.proto,\n"
    "WorkerService.Attach). Connects to the server, registers (device, capacity 1, memory,\n"
    "versions), sends a heartbeat every --heartbeat-ms (or the interval the server asks\n"
    "for), and runs the jobs the server assigns, one at a time: for each, the rank's graph\n"
    "and initial state, a rendezvous with the job's other ranks (c10d TCPStore at the\n"
    "address the server gives, then Gloo), one step per batch the server sends (this\n"
    "rank's shard, or read from the job's data files on this host; each step answered\n"
    "with the global and local loss and timings), the state streamed back in chunks\n"
    "when asked. A failing job (bad graph or state, a kernel error, a lost peer) is\n"
    "reported to the server naming the job, rank and step; the worker stays attached and\n"
    "takes the next job. When the server goes away it reconnects with backoff (0.2 s\n"
    "doubling to 5 s). Logs go to stderr as '[worker ID] ...' and, about a job,\n"
    "'[job J rank R step S/K] ...'.\n"
    "\n"
    "  --server HOST:PORT    the fxdp server's worker endpoint (default $FXDP_SERVER,\n"
    "                        else 127.0.0.1:50051)\n"
    "  --device DEV          default device of the jobs: cpu (default) or cuda:N\n"
    "  --worker-id ID        the id to register with (default HOSTNAME:PID)\n"
    "  --heartbeat-ms MS     heartbeat interval unless the server sets one (default 1000)\n"
    "  --threads N           intra-op CPU threads per step (default: OMP_NUM_THREADS, else\n"
    "                        all cores; give 1 or cores/workers when several workers share\n"
    "                        a host)\n"
    "  --max-message-mb MB   largest message accepted from the server (default 1024: the\n"
    "                        graph travels in one message; state and batches are chunked)\n"
    "  --data-root DIR       a directory whose files jobs may name in data_paths; repeat\n"
    "                        for several. Paths are resolved (symlinks, '..') and must stay\n"
    "                        under a root; only regular files are read. None given: jobs\n"
    "                        cannot read files on this worker\n"
    "  --max-data-mb MB      largest data file read (default 65536)\n"
    "  --tls-ca FILE         TLS: the CA of the server's certificate (docs/security.md)\n"
    "  --tls-cert FILE, --tls-key FILE\n"
    "                        mutual TLS: this worker's certificate (subject O=fxdp:workers)\n"
    "                        and key, signed by the server's --tls-ca\n"
    "  --token-file FILE     the server's worker join token (its --worker-token-file)\n"
    "  --tls-server-name N   the name the server's certificate is checked against (default:\n"
    "                        the host of --server)\n"
    "\n"
    "SIGTERM, SIGINT or the server's Shutdown: the job in progress is reported failed\n"
    "(CANCELLED), the stream is closed, exit status 0. Exit status 2: bad arguments.\n";

namespace {

using Clock = std::chrono::steady_clock;
using v1::ServerMessage;
using v1::WorkerMessage;

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

template <typename... A>
void LogLine(const A&... a) {
  const std::string line = absl::StrCat(a..., "\n");
  std::fputs(line.c_str(), stderr);  // one write per line: workers share a terminal
}

struct AttachOptions {
  std::string server;
  std::string device = "cpu";
  std::string worker_id;
  int heartbeat_ms = 1000;
  int threads = 0;
  int max_message_mb = 1024;
  std::vector<std::string> data_roots;
  int max_data_mb = 65536;
  security::ChannelSecurity creds;  // --tls-ca, --tls-cert/--tls-key, --token-file
};

// One Attach stream. Writes from any thread; after Close() (or a failed
// write) every Write returns false.
class Session {
 public:
  using Stream = grpc::ClientReaderWriter<WorkerMessage, ServerMessage>;
  Session(std::unique_ptr<grpc::ClientContext> ctx, std::unique_ptr<v1::WorkerService::Stub>& stub)
      : ctx_(std::move(ctx)), stream_(stub->Attach(ctx_.get())) {}

  bool Write(const WorkerMessage& m) {
    std::lock_guard<std::mutex> l(mu_);
    if (closed_) return false;
    if (!stream_->Write(m)) closed_ = true;
    return !closed_;
  }
  // No more writes from this side (WritesDone).
  void Close() {
    std::lock_guard<std::mutex> l(mu_);
    if (closed_) return;
    closed_ = true;
    stream_->WritesDone();
  }
  bool Read(ServerMessage* m) { return stream_->Read(m); }
  grpc::Status Finish() { return stream_->Finish(); }
  void Cancel() { ctx_->TryCancel(); }

 private:
  std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<Stream> stream_;
  std::mutex mu_;
  bool closed_ = false;
};

// What the main thread hands a job's thread.
struct JobEvent {
  enum Kind { kState, kBatch, kFetch, kCancel, kError };
  explicit JobEvent(Kind k) : kind(k) {}
  static JobEvent Tensors(Kind k, TensorMap t, int64_t step = 0) {
    JobEvent e(k);
    e.tensors = std::move(t);
    e.step = step;
    return e;
  }
  static JobEvent Error(absl::Status s, int64_t step = 0) {
    JobEvent e(kError);
    e.error = std::move(s);
    e.step = step;
    return e;
  }

  Kind kind;
  TensorMap tensors;     // kState, kBatch
  int64_t step = 0;      // kBatch
  std::vector<std::pair<std::string, double>> hyperparameters;  // kBatch: Batch.hyperparameters
  uint32_t chunk_bytes = 0;  // kFetch
  bool end_job = false;      // kFetch
  std::string reason;        // kCancel
  absl::Status error;        // kError
};

struct Job {
  std::string id;
  int rank = 0;
  int world_size = 1;
  int64_t steps = 0;
  uint32_t num_state = 0;  // AssignJob.num_state_tensors
  v1::AssignJob assign;    // the graph included; the job thread's after the start
  Clock::time_point assigned_at;
  std::shared_ptr<Session> session;  // where its messages go

  // Queue (main thread -> job thread).
  std::mutex mu;
  std::condition_variable cv;
  std::deque<JobEvent> events;
  std::atomic<bool> cancel{false};

  // Progress, for heartbeats and log lines.
  std::atomic<int64_t> steps_done{0};
  std::atomic<int64_t> log_step{0};  // the step in progress, else the last done
  std::atomic<bool> in_step{false};
  // Set by whoever sends the job's final message (JobFailed or JobEnded).
  std::atomic<bool> final_sent{false};

  // Main thread only: tensors being assembled from chunks.
  TensorAssembler state_asm;
  bool state_done = false;
  TensorAssembler batch_asm;
  int64_t batch_step = 0;  // the step whose Batch messages are arriving (0: none)
  std::vector<std::pair<std::string, double>> batch_hyper;  // that step's hyper-parameters
  bool input_failed = false;  // an error was queued: later chunks are ignored

  void Push(JobEvent e) {
    {
      std::lock_guard<std::mutex> l(mu);
      events.push_back(std::move(e));
    }
    cv.notify_all();
  }

  std::string Prefix() const {
    const int64_t s = log_step.load();
    return absl::StrCat("[job ", id, " rank ", rank, " step ", s,
                        steps > 0 ? absl::StrCat("/", steps) : std::string(), "] ");
  }
  std::string StepName(int64_t s) const {
    return steps > 0 ? absl::StrCat(s, "/", steps) : absl::StrCat(s);
  }
};

class AttachedWorker {
 public:
  explicit AttachedWorker(AttachOptions o) : o_(std::move(o)) {}

  // Serves until Shutdown or RequestShutdown; returns the exit code.
  int Serve();
  // From any thread (signals, the Shutdown message). Idempotent.
  void RequestShutdown(const std::string& why);

 private:
  // One attachment: connect, register, read until the stream ends. Whether
  // the server accepted the registration; `status` says why it ended.
  bool ServeOnce(std::string* status);
  void Handle(ServerMessage& m, const std::shared_ptr<Session>& session);
  void HandleAssign(v1::AssignJob& a, const std::shared_ptr<Session>& session);
  // The current job if it is `job_id` (else logs that the message is ignored).
  std::shared_ptr<Job> JobFor(const std::string& job_id, const char* what);
  void HeartbeatLoop(std::shared_ptr<Session> session, int interval_ms);
  WorkerMessage MakeHeartbeat();

  void RunJob(std::shared_ptr<Job> job);
  // The job's AssignJob.data_paths, read and sliced to this rank's shard.
  absl::StatusOr<std::vector<TensorMap>> ReadDataFiles(const Job& job, const Program& program) const;
  absl::Status JobBody(Job& job, std::unique_ptr<Communicator>& comm, bool* leak_comm);
  // Sends the job's final message unless one was sent; frees the job slot
  // first, so a server that answers at once finds the worker IDLE.
  void FinishJob(Job& job, WorkerMessage final_msg);
  void SendJobFailed(Job& job, const absl::Status& s, int64_t step);

  std::string Prefix() const { return absl::StrCat("[worker ", worker_id_, "] "); }

  AttachOptions o_;
  std::string worker_id_;
  std::string hostname_;
  c10::Device device_{c10::kCPU};
  int64_t memory_bytes_ = 0;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;

  std::mutex mu_;
  std::condition_variable cv_;  // shutdown_, job_ changes
  bool shutdown_ = false;
  std::string shutdown_reason_;
  std::shared_ptr<Session> session_;  // the current attachment
  std::shared_ptr<Job> job_;          // the job held (capacity 1)
  std::thread job_thread_;
  int running_jobs_ = 0;              // job threads not yet returned
  bool leaked_ = false;               // a communicator was left behind

  // Heartbeat thread of the current attachment.
  std::mutex hb_mu_;
  std::condition_variable hb_cv_;
  bool hb_stop_ = false;

  std::string last_ignored_;  // main thread: the last job id whose messages were ignored
};

// ---------------------------------------------------------------------------
// Connection

int AttachedWorker::Serve() {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') std::snprintf(host, sizeof(host), "localhost");
  hostname_ = host;
  worker_id_ = o_.worker_id.empty() ? absl::StrCat(hostname_, ":", getpid()) : o_.worker_id;
  absl::StatusOr<c10::Device> dev = ParseWorkerDevice(o_.device, 0, "--device");
  if (!dev.ok()) {
    std::fprintf(stderr, "fxdp-worker attach: %s\n", std::string(dev.status().message()).c_str());
    return 2;
  }
  device_ = *dev;
  if (device_.is_cuda() && !at::hasCUDA()) {
    std::fprintf(stderr, "fxdp-worker attach: --device %s: this LibTorch build has no CUDA\n",
                 device_.str().c_str());
    return 2;
  }
  if (device_.is_cpu()) {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) memory_bytes_ = static_cast<int64_t>(pages) * page;
  }
  if (o_.threads > 0) at::set_num_threads(o_.threads);
  LogLine(Prefix(), "fxdp ", FXDP_VERSION, ", torch ", TORCH_VERSION, ", device ", device_.str(),
          ", intra-op threads ", at::get_num_threads(), "; server ", o_.server);

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(o_.max_message_mb >= 2047 ? INT32_MAX : o_.max_message_mb << 20);
  args.SetMaxSendMessageSize(-1);
  // The channel's own reconnect backoff (default up to 2 minutes) must not
  // outlast ours.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 5000);
  // AttachCommand checked the credential files; a file changed since then
  // fails every attach attempt, naming it.
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
      security::MakeChannelCredentials(o_.creds, &args);
  if (!creds.ok()) {
    LogLine(Prefix(), "credentials: ", creds.status().message());
    creds = grpc::InsecureChannelCredentials();
  }
  channel_ = grpc::CreateCustomChannel(o_.server, *creds, args);
  stub_ = v1::WorkerService::NewStub(channel_);

  auto backoff = std::chrono::milliseconds(200);
  bool ever = false;
  while (true) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (shutdown_) break;
    }
    std::string status;
    const bool registered = ServeOnce(&status);
    if (registered) {
      ever = true;
      backoff = std::chrono::milliseconds(200);
    }
    std::unique_lock<std::mutex> l(mu_);
    if (shutdown_) break;
    LogLine(Prefix(),
            registered ? "lost the server connection" : (ever ? "cannot reattach to " : "cannot attach to "),
            registered ? "" : o_.server, " (", status, "); retrying in ",
            absl::StrFormat("%.1f", backoff.count() / 1000.0), " s");
    cv_.wait_for(l, backoff, [&] { return shutdown_; });
    backoff = std::min<std::chrono::milliseconds>(backoff * 2, std::chrono::seconds(5));
  }

  // Shutting down: wait briefly for the job thread (it was told to stop).
  std::unique_lock<std::mutex> l(mu_);
  LogLine(Prefix(), "shutting down (", shutdown_reason_, ")");
  const bool done = cv_.wait_for(l, std::chrono::seconds(3), [&] { return running_jobs_ == 0; });
  const bool leaked = leaked_;
  std::thread t = std::move(job_thread_);
  l.unlock();
  if (!done || leaked) {
    // A step blocked on a collective, or a communicator left behind with its
    // threads: do not run destructors under them.
    if (!done) LogLine(Prefix(), "a step is still blocked; exiting without waiting for it");
    std::fflush(stderr);
    std::fflush(stdout);
    std::_Exit(0);
  }
  if (t.joinable()) t.join();
  return 0;
}

bool AttachedWorker::ServeOnce(std::string* status) {
  auto session = std::make_shared<Session>(std::make_unique<grpc::ClientContext>(), stub_);
  bool registered = false;
  {
    // Visible to RequestShutdown from here on, so a signal can end even a
    // registration the server never answers.
    std::lock_guard<std::mutex> l(mu_);
    if (shutdown_) {
      session->Cancel();
      session->Finish();
      *status = "shutting down";
      return false;
    }
    session_ = session;
  }

  WorkerMessage reg;
  {
    v1::Register* r = reg.mutable_register_worker();
    r->set_protocol_version(v1::WORKER_PROTOCOL_VERSION_1);
    r->set_worker_id(worker_id_);
    r->set_hostname(hostname_);
    r->set_pid(getpid());
    r->set_device(device_.str());
    r->set_capacity(1);
    r->set_memory_bytes(memory_bytes_);
    r->set_threads(at::get_num_threads());
    r->set_fxdp_version(FXDP_VERSION);
    r->set_torch_version(TORCH_VERSION);
    std::lock_guard<std::mutex> l(mu_);
    if (job_) r->set_busy_with_job_id(job_->id);
  }
  ServerMessage m;
  std::string protocol_error;
  if (session->Write(reg) && session->Read(&m)) {
    if (m.msg_case() != ServerMessage::kRegistered) {
      protocol_error = absl::StrCat(
          "protocol error: the server's first message is not Registered (message case ",
          static_cast<int>(m.msg_case()), ")");
      session->Cancel();
    }
  }
  if (m.msg_case() == ServerMessage::kRegistered) {
    registered = true;
    const int interval =
        m.registered().heartbeat_interval_ms() > 0 ? m.registered().heartbeat_interval_ms() : o_.heartbeat_ms;
    LogLine(Prefix(), "attached to ", o_.server, " (heartbeat every ", interval, " ms",
            m.registered().worker_id().empty() || m.registered().worker_id() == worker_id_
                ? ""
                : absl::StrCat("; the server calls this worker '", m.registered().worker_id(), "'"),
            ")");
    {
      std::lock_guard<std::mutex> l(hb_mu_);
      hb_stop_ = false;
    }
    std::thread hb(&AttachedWorker::HeartbeatLoop, this, session, interval);
    while (session->Read(&m)) {
      Handle(m, session);
    }
    {
      std::lock_guard<std::mutex> l(hb_mu_);
      hb_stop_ = true;
    }
    hb_cv_.notify_all();
    hb.join();
  }
  // The stream is over (the server ended it, the connection broke, or we
  // cancelled it while shutting down).
  std::shared_ptr<Job> orphan;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (session_ == session) session_.reset();
    if (job_ && job_->session == session) orphan = job_;
  }
  session->Close();
  const grpc::Status st = session->Finish();
  *status = !protocol_error.empty() ? protocol_error
            : st.ok()                 ? "the server closed the stream"
                                      : absl::StrCat(absl::StatusCodeToString(static_cast<absl::StatusCode>(st.error_code())),
                                   ": ", st.error_message());
  if (orphan && !orphan->cancel.exchange(true)) {
    LogLine(orphan->Prefix(), "abandoning the job: its server connection is gone");
    JobEvent e(JobEvent::kCancel);
    e.reason = "lost the server connection";
    orphan->Push(std::move(e));
  }
  return registered;
}

void AttachedWorker::RequestShutdown(const std::string& why) {
  std::shared_ptr<Session> session, job_session;
  WorkerMessage f;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (shutdown_) return;
    shutdown_ = true;
    shutdown_reason_ = why;
    session = session_;
    if (job_) {
      Job& j = *job_;
      j.cancel = true;
      JobEvent e(JobEvent::kCancel);
      e.reason = why;
      j.Push(std::move(e));
      if (!j.final_sent.exchange(true)) {
        job_session = j.session;
        v1::JobFailed* jf = f.mutable_job_failed();
        jf->set_job_id(j.id);
        jf->set_rank(j.rank);
        jf->set_step(j.in_step ? j.log_step.load() : 0);
        jf->set_code(static_cast<int>(absl::StatusCode::kCancelled));
        jf->set_error(absl::StrCat("job ", j.id, " rank ", j.rank, " step ",
                                   j.StepName(j.log_step.load()), ": worker ", worker_id_,
                                   " is shutting down (", why, ")"));
      }
    }
  }
  if (job_session) job_session->Write(f);
  cv_.notify_all();
  if (session) {
    // Half-close, give the server a moment to end the stream, then cancel it.
    session->Close();
    std::weak_ptr<Session> weak = session;
    std::thread([weak] {
      std::this_thread::sleep_for(std::chrono::seconds(2));
      if (auto s = weak.lock()) s->Cancel();
    }).detach();
  }
}

void AttachedWorker::HeartbeatLoop(std::shared_ptr<Session> session, int interval_ms) {
  std::unique_lock<std::mutex> l(hb_mu_);
  while (!hb_stop_) {
    l.unlock();
    const bool ok = session->Write(MakeHeartbeat());
    l.lock();
    if (!ok) break;
    hb_cv_.wait_for(l, std::chrono::milliseconds(interval_ms), [&] { return hb_stop_; });
  }
}

WorkerMessage AttachedWorker::MakeHeartbeat() {
  WorkerMessage m;
  v1::Heartbeat* h = m.mutable_heartbeat();
  h->set_unix_time_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count());
  std::lock_guard<std::mutex> l(mu_);
  if (job_) {
    h->set_state(v1::WORKER_STATE_BUSY);
    h->set_job_id(job_->id);
    h->set_step(job_->steps_done.load());
    h->set_in_step(job_->in_step.load());
  } else {
    h->set_state(v1::WORKER_STATE_IDLE);
  }
  return m;
}

// ---------------------------------------------------------------------------
// Routing the server's messages (main thread)

std::shared_ptr<Job> AttachedWorker::JobFor(const std::string& job_id, const char* what) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (job_ && job_->id == job_id) return job_;
  }
  if (last_ignored_ != job_id) {
    LogLine(Prefix(), "ignoring ", what, " for job '", job_id,
            "': not a job this worker holds (finished, failed or unknown)");
    last_ignored_ = job_id;
  }
  return nullptr;
}

void AttachedWorker::Handle(ServerMessage& m, const std::shared_ptr<Session>& session) {
  switch (m.msg_case()) {
    case ServerMessage::kRegistered:
      LogLine(Prefix(), "ignoring a second Registered");
      return;
    case ServerMessage::kAssignJob:
      HandleAssign(*m.mutable_assign_job(), session);
      return;
    case ServerMessage::kStateChunk: {
      const v1::StateChunk& c = m.state_chunk();
      std::shared_ptr<Job> job = JobFor(c.job_id(), "a state chunk");
      if (!job || job->input_failed) return;
      auto fail = [&](absl::Status s) {
        job->input_failed = true;
        job->Push(JobEvent::Error(
            absl::Status(s.code(), absl::StrCat("initial state: ", s.message()))));
      };
      if (job->state_done) return fail(absl::InvalidArgumentError("a state chunk after the last one"));
      if (c.has_tensor()) {
        absl::Status s = job->state_asm.Add(c.tensor());
        if (!s.ok()) return fail(s);
        if (job->state_asm.size() > job->num_state)
          return fail(absl::InvalidArgumentError(
              absl::StrCat("more than the ", job->num_state,
                           " tensors AssignJob.num_state_tensors announced")));
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
      job->Push(JobEvent::Tensors(JobEvent::kState, job->state_asm.Take()));
      return;
    }
    case ServerMessage::kBatch: {
      const v1::Batch& b = m.batch();
      std::shared_ptr<Job> job = JobFor(b.job_id(), "a batch");
      if (!job || job->input_failed) return;
      auto fail = [&](absl::Status s) {
        job->input_failed = true;
        job->Push(JobEvent::Error(
            absl::Status(s.code(), absl::StrCat("batch for step ", b.step(), ": ", s.message())),
            b.step()));
      };
      if (!job->state_done)
        return fail(absl::InvalidArgumentError("sent before the initial state was complete"));
      if (job->batch_step != 0 && job->batch_step != b.step())
        return fail(absl::InvalidArgumentError(absl::StrCat(
            "step ", job->batch_step, "'s batch was not complete (its last message had more set)")));
      job->batch_step = b.step();
      for (const v1::HyperparameterValue& h : b.hyperparameters())
        job->batch_hyper.emplace_back(h.name(), h.value());
      for (const v1::TensorChunk& t : b.tensors()) {
        absl::Status s = job->batch_asm.Add(t);
        if (!s.ok()) return fail(s);
      }
      if (b.more()) return;
      if (job->batch_asm.pending())
        return fail(absl::InvalidArgumentError(absl::StrCat(
            "tensor '", job->batch_asm.pending_name(), "' is incomplete and more is not set")));
      job->batch_step = 0;
      JobEvent e = JobEvent::Tensors(JobEvent::kBatch, job->batch_asm.Take(), b.step());
      e.hyperparameters = std::move(job->batch_hyper);
      job->batch_hyper.clear();
      job->Push(std::move(e));
      return;
    }
    case ServerMessage::kFetchState: {
      std::shared_ptr<Job> job = JobFor(m.fetch_state().job_id(), "FetchState");
      if (!job || job->input_failed) return;
      if (!job->state_done) {
        job->input_failed = true;
        job->Push(JobEvent::Error(
            absl::InvalidArgumentError("FetchState before the initial state was complete")));
        return;
      }
      JobEvent e(JobEvent::kFetch);
      e.chunk_bytes = m.fetch_state().chunk_bytes();
      e.end_job = m.fetch_state().end_job();
      job->Push(std::move(e));
      return;
    }
    case ServerMessage::kCancelJob: {
      std::shared_ptr<Job> job = JobFor(m.cancel_job().job_id(), "CancelJob");
      if (!job) return;
      LogLine(job->Prefix(), "cancel requested",
              m.cancel_job().reason().empty() ? "" : absl::StrCat(": ", m.cancel_job().reason()),
              job->in_step ? " (after the step in progress)" : "");
      job->cancel = true;
      JobEvent e(JobEvent::kCancel);
      e.reason = m.cancel_job().reason();
      job->Push(std::move(e));
      return;
    }
    case ServerMessage::kShutdown:
      RequestShutdown(absl::StrCat("the server asked",
                                   m.shutdown().reason().empty() ? "" : ": " + m.shutdown().reason()));
      return;
    case ServerMessage::MSG_NOT_SET:
      LogLine(Prefix(), "ignoring an empty or unknown server message");
      return;
  }
}

void AttachedWorker::HandleAssign(v1::AssignJob& a, const std::shared_ptr<Session>& session) {
  auto reject = [&](absl::Status s, int rank) {
    LogLine(Prefix(), "refusing job '", a.job_id(), "': ", s.message());
    WorkerMessage f;
    v1::JobFailed* jf = f.mutable_job_failed();
    jf->set_job_id(a.job_id());
    jf->set_rank(rank);
    jf->set_code(static_cast<int>(s.code()));
    jf->set_error(absl::StrCat("job ", a.job_id(), " rank ", rank, ": ", s.message()));
    session->Write(f);
  };
  const bool rank_ok = a.world_size() >= 1 && a.rank() >= 0 && a.rank() < a.world_size();
  if (a.job_id().empty()) return reject(absl::InvalidArgumentError("AssignJob without a job_id"), a.rank());
  if (!rank_ok)
    return reject(absl::InvalidArgumentError(absl::StrCat("rank ", a.rank(), " is not in [0, world_size ",
                                                          a.world_size(), ")")),
                  -1);
  if (a.world_size() > 1 &&
      (a.rendezvous_host().empty() || a.rendezvous_port() <= 0 || a.rendezvous_port() > 65535))
    return reject(absl::InvalidArgumentError(absl::StrCat(
                      "world size ", a.world_size(), " needs a rendezvous host and port (got '",
                      a.rendezvous_host(), "' port ", a.rendezvous_port(), ")")),
                  a.rank());
  if (!(a.collective_timeout_s() >= 0) || a.collective_timeout_s() > 86400.0 * 365)
    return reject(absl::InvalidArgumentError(absl::StrCat("collective_timeout_s ",
                                                          a.collective_timeout_s(), " is not valid")),
                  a.rank());
  if (a.steps() < 0)
    return reject(absl::InvalidArgumentError(absl::StrCat("steps ", a.steps(), " < 0")), a.rank());

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
  auto job = std::make_shared<Job>();
  job->id = a.job_id();
  job->rank = a.rank();
  job->world_size = a.world_size();
  job->steps = a.steps();
  job->num_state = a.num_state_tensors();
  job->assign.Swap(&a);
  job->assigned_at = Clock::now();
  job->session = session;
  job_ = job;
  ++running_jobs_;
  old = std::move(job_thread_);
  l.unlock();
  if (old.joinable()) old.join();  // the previous job's thread, already past its final message
  last_ignored_.clear();
  LogLine(job->Prefix(), "assigned: rank ", job->rank, " of ", job->world_size, ", ",
          job->assign.graph().nodes_size(), " nodes, ", job->num_state,
          " state tensors", job->steps > 0 ? absl::StrCat(", ", job->steps, " steps") : "");
  std::lock_guard<std::mutex> l2(mu_);
  job_thread_ = std::thread(&AttachedWorker::RunJob, this, job);
}

// ---------------------------------------------------------------------------
// The job's thread

void AttachedWorker::FinishJob(Job& job, WorkerMessage final_msg) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (job_.get() == &job) job_.reset();
  }
  cv_.notify_all();
  if (!job.final_sent.exchange(true)) job.session->Write(final_msg);
}

void AttachedWorker::SendJobFailed(Job& job, const absl::Status& s, int64_t step) {
  const std::string error =
      absl::StrCat("job ", job.id, " rank ", job.rank, " step ", job.StepName(step), ": ", s.message());
  LogLine(job.Prefix(), "failed: ", absl::StatusCodeToString(s.code()), ": ", s.message());
  WorkerMessage f;
  v1::JobFailed* jf = f.mutable_job_failed();
  jf->set_job_id(job.id);
  jf->set_rank(job.rank);
  jf->set_step(step);
  jf->set_code(static_cast<int>(s.code()));
  jf->set_error(error);
  FinishJob(job, std::move(f));
}

void AttachedWorker::RunJob(std::shared_ptr<Job> job) {
  std::unique_ptr<Communicator> comm;
  bool leak = false;
  absl::Status s = JobBody(*job, comm, &leak);
  if (comm != nullptr && leak && comm->world_size() > 1) {
    // A step failed, perhaps with collectives still queued: ProcessGroupGloo's
    // destructor drains its queue, which behind a lost or hung peer blocks for
    // another timeout. Leave it (its threads go idle; rank 0's store keeps
    // its port).
    comm.release();
    std::lock_guard<std::mutex> l(mu_);
    leaked_ = true;
  }
  comm.reset();
  if (!s.ok()) SendJobFailed(*job, s, job->in_step ? job->log_step.load() : 0);
  // else JobBody sent JobEnded.
  {
    std::lock_guard<std::mutex> l(mu_);
    if (job_ == job) job_.reset();  // e.g. the final message was sent at shutdown
    --running_jobs_;
  }
  cv_.notify_all();
}

absl::StatusOr<std::vector<TensorMap>> AttachedWorker::ReadDataFiles(const Job& job,
                                                                     const Program& program) const {
  std::vector<TensorMap> files;
  for (const std::string& path : job.assign.data_paths()) {
    const std::string where = absl::StrCat("data_paths file '", path, "' (on worker ", worker_id_, ")");
    SafetensorsReadOptions read;
    read.confine = true;
    read.roots = o_.data_roots;
    read.max_bytes = static_cast<uint64_t>(o_.max_data_mb) << 20;
    absl::StatusOr<SafetensorsFile> f = ReadSafetensors(path, read);
    if (!f.ok()) {
      // The message names the path; a corrupt file is the client's bad
      // input, a path outside the roots is denied, anything else (missing,
      // not a regular file, too large) is the file's state on this worker.
      const absl::StatusCode code = f.status().code();
      const absl::StatusCode mapped = code == absl::StatusCode::kInvalidArgument ||
                                              code == absl::StatusCode::kUnimplemented
                                          ? absl::StatusCode::kInvalidArgument
                                      : code == absl::StatusCode::kPermissionDenied
                                          ? absl::StatusCode::kPermissionDenied
                                          : absl::StatusCode::kFailedPrecondition;
      return absl::Status(mapped, absl::StrCat("data_paths file on worker ", worker_id_, ": ",
                                               f.status().message()));
    }
    absl::StatusOr<TensorMap> shard = ShardBatch(f->tensors, program, job.rank, job.world_size);
    absl::Status s = shard.ok() ? CheckBatch(*shard, program) : shard.status();
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(where, ": ", s.message()));
    LogLine(job.Prefix(), "read ", path, ": ", shard->size(), " tensors, this rank's shard kept");
    files.push_back(*std::move(shard));
  }
  return files;
}

absl::Status AttachedWorker::JobBody(Job& job, std::unique_ptr<Communicator>& comm, bool* leak) {
  const v1::AssignJob& a = job.assign;
  auto ended = [&](bool cancelled, const std::string& why) {
    LogLine(job.Prefix(), cancelled ? "cancelled" : "ended", why.empty() ? "" : ": ", why, " (",
            job.steps_done.load(), " steps done)");
    WorkerMessage m;
    v1::JobEnded* e = m.mutable_job_ended();
    e->set_job_id(job.id);
    e->set_rank(job.rank);
    e->set_cancelled(cancelled);
    e->set_steps_done(job.steps_done.load());
    FinishJob(job, std::move(m));
    return absl::OkStatus();
  };
  // The next event; a cancel jumps the queue.
  auto next = [&]() -> JobEvent {
    std::unique_lock<std::mutex> l(job.mu);
    job.cv.wait(l, [&] { return job.cancel.load() || !job.events.empty(); });
    if (job.cancel) {
      for (JobEvent& e : job.events)
        if (e.kind == JobEvent::kCancel) return std::move(e);
      return JobEvent(JobEvent::kCancel);
    }
    JobEvent e = std::move(job.events.front());
    job.events.pop_front();
    return e;
  };

  // Device and graph.
  FXDP_ASSIGN_OR_RETURN(c10::Device device,
                        ParseWorkerDevice(a.device().empty() ? device_.str() : a.device(),
                                          device_.is_cuda() ? device_.index() : 0, "AssignJob.device"));
  absl::StatusOr<ir::Graph> graph = ir::DecodeGraph(a.graph());
  if (!graph.ok())
    return absl::Status(graph.status().code(),
                        absl::StrCat("the graph does not decode or verify: ", graph.status().message()));
  const double timeout_s = a.collective_timeout_s() > 0 ? a.collective_timeout_s() : 60.0;
  const auto timeout = std::chrono::milliseconds(std::max<int64_t>(1, std::llround(timeout_s * 1000)));

  // Rendezvous.
  RendezvousOptions ro;
  ro.host = a.rendezvous_host().empty() ? "127.0.0.1" : a.rendezvous_host();
  ro.port = a.rendezvous_port();
  ro.rank = job.rank;
  ro.world_size = job.world_size;
  ro.timeout = timeout;
  if (job.world_size > 1)
    LogLine(job.Prefix(), "rendezvous at ", ro.host, ":", ro.port, " (world size ", ro.world_size,
            ", timeout ", absl::StrFormat("%.3g", timeout_s), " s)");
  FXDP_ASSIGN_OR_RETURN(comm, ConnectCommunicator(ro, device));
  if (job.cancel) return ended(true, "before the first step");

  // Program.
  TimedCommunicator timed(comm.get());
  ProgramOptions po;
  po.device = device;
  po.communicator = &timed;
  po.collective_timeout = timeout;
  po.check_outputs = a.check_outputs();
  FXDP_ASSIGN_OR_RETURN(Program program, Program::Load(*graph, po));
  graph = absl::StatusOr<ir::Graph>();  // the program holds what it needs
  job.assign.clear_graph();
  const int local_loss = LocalLossIndex(program);
  const int num_ops = program.num_nodes();
  FXDP_ASSIGN_OR_RETURN(std::vector<TensorMap> files, ReadDataFiles(job, program));

  // Initial state.
  JobEvent e = next();
  if (e.kind == JobEvent::kCancel) return ended(true, e.reason);
  if (e.kind == JobEvent::kError) return e.error;
  if (e.kind != JobEvent::kState)
    return absl::InternalError("the initial state was expected first");  // the router ensures it
  absl::StatusOr<StepRunner> created = StepRunner::Create(std::move(program), std::move(e.tensors));
  if (!created.ok())
    return absl::Status(created.status().code(),
                        absl::StrCat("initial state: ", created.status().message()));
  StepRunner runner = *std::move(created);
  {
    const double setup_ms = MsSince(job.assigned_at);
    LogLine(job.Prefix(), "started: ", num_ops, " ops on ", device.str(), ", ", comm->name(), ", ",
            runner.state().size(), " state tensors (setup ", absl::StrFormat("%.1f", setup_ms), " ms)");
    WorkerMessage m;
    v1::JobStarted* js = m.mutable_job_started();
    js->set_job_id(job.id);
    js->set_rank(job.rank);
    js->set_world_size(job.world_size);
    js->set_device(device.str());
    js->set_num_ops(num_ops);
    js->set_setup_ms(setup_ms);
    job.session->Write(m);
  }

  while (true) {
    e = next();
    switch (e.kind) {
      case JobEvent::kCancel:
        return ended(true, e.reason);
      case JobEvent::kError:
        if (e.step > 0) {
          job.log_step = e.step;
          job.in_step = true;
        }
        return e.error;
      case JobEvent::kState:
        return absl::InternalError("a second initial state");  // the router prevents this
      case JobEvent::kBatch: {
        const int64_t step = e.step;
        job.log_step = step;
        job.in_step = true;
        if (step != job.steps_done + 1)
          return absl::InvalidArgumentError(absl::StrCat("got the batch for step ", step, ", expected step ",
                                                         job.steps_done + 1));
        if (job.steps > 0 && step > job.steps)
          return absl::InvalidArgumentError(
              absl::StrCat("a batch for step ", step, " of a job of ", job.steps, " steps"));
        const auto t0 = Clock::now();
        TensorMap shard;
        if (files.empty()) {
          if (job.assign.batches_sharded()) {
            shard = std::move(e.tensors);
          } else {
            FXDP_ASSIGN_OR_RETURN(shard, ShardBatch(e.tensors, runner.program(), job.rank, job.world_size));
          }
          if (absl::Status s = CheckBatch(shard, runner.program()); !s.ok())
            return absl::InvalidArgumentError(absl::StrCat("the batch of step ", step, ": ", s.message()));
        } else if (!e.tensors.empty()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "a Batch with tensors for a job that reads its batches from AssignJob.data_paths"));
        }
        e.tensors.clear();
        // Batch.hyperparameters; the error's prefix names the job, rank and step.
        FXDP_RETURN_IF_ERROR(runner.SetHyperparameters(e.hyperparameters));
        const TensorMap& batch = files.empty() ? shard : files[(step - 1) % files.size()];
        timed.TakeStats();
        absl::StatusOr<at::Tensor> loss = runner.Step(batch);
        if (!loss.ok()) {
          *leak = true;
          return loss.status();
        }
        double value = 0, local = 0;
        try {
          value = LossValue(*loss);
          local = value;
          if (local_loss >= 0 && local_loss < static_cast<int>(runner.other_outputs().size()) &&
              runner.other_outputs()[local_loss].isTensor())
            local = LossValue(runner.other_outputs()[local_loss].toTensor());
        } catch (const std::exception& ex) {
          return absl::InternalError(absl::StrCat("reading the loss: ", ex.what()));
        }
        const double ms = MsSince(t0);
        const CollectiveStats cs = timed.TakeStats();
        job.steps_done = step;
        job.in_step = false;
        WorkerMessage m;
        v1::StepResult* r = m.mutable_step_result();
        r->set_job_id(job.id);
        r->set_rank(job.rank);
        r->set_step(step);
        r->set_loss(value);
        r->set_local_loss(local);
        r->set_step_ms(ms);
        r->set_comm_wait_ms(cs.wait_ms);
        r->set_collectives(static_cast<int32_t>(cs.collectives));
        r->set_comm_bytes(cs.bytes);
        job.session->Write(m);
        LogLine(job.Prefix(), "loss ", absl::StrFormat("%.8g", value), " (local ",
                absl::StrFormat("%.8g", local), ", ", absl::StrFormat("%.1f", ms), " ms, comm wait ",
                absl::StrFormat("%.1f", cs.wait_ms), " ms)");
        break;
      }
      case JobEvent::kFetch: {
        // Stream the state: every chunk is written when the next one exists,
        // so the final one can carry `last`.
        std::optional<WorkerMessage> held;
        bool ok = true;
        int64_t bytes = 0;
        const size_t chunk = e.chunk_bytes > 0 ? e.chunk_bytes : kDefaultChunkBytes;
        for (const auto& [name, t] : runner.state()) {
          absl::Status s = ChunkTensor(name, t, chunk, [&](v1::TensorChunk& c) {
            if (held) ok = job.session->Write(*held);
            bytes += static_cast<int64_t>(c.data().size());
            held.emplace();
            held->mutable_state_chunk()->set_job_id(job.id);
            held->mutable_state_chunk()->mutable_tensor()->Swap(&c);
            return ok;
          });
          if (!ok) break;
          if (!s.ok())
            return absl::Status(s.code(), absl::StrCat("fetching the state: ", s.message()));
        }
        if (ok) {
          if (!held) {
            held.emplace();
            held->mutable_state_chunk()->set_job_id(job.id);
          }
          held->mutable_state_chunk()->set_last(true);
          ok = job.session->Write(*held);
        }
        LogLine(job.Prefix(), ok ? "sent" : "could not send", " the state (", runner.state().size(),
                " tensors, ", bytes, " bytes)");
        if (e.end_job) return ended(false, "after FetchState");
        break;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Signals: a handler writes to a pipe; a thread reads it.

int g_signal_pipe[2] = {-1, -1};

void OnSignal(int sig) {
  const char c = static_cast<char>(sig);
  if (g_signal_pipe[1] >= 0) (void)!write(g_signal_pipe[1], &c, 1);
}

}  // namespace

int AttachCommand(const std::vector<std::string>& argv) {
  AttachOptions o;
  // The same default as every `fxdp` subcommand: $FXDP_SERVER, else fxdp-server's default.
  const char* env_server = std::getenv("FXDP_SERVER");
  o.server = env_server != nullptr && *env_server != '\0' ? env_server : "127.0.0.1:50051";
  util::Flags flags("fxdp-worker attach", kAttachUsage);
  flags.Custom("--server", "HOST:PORT", [&o](const std::string& v) {
    o.server = v;
    return !v.empty();
  });
  flags.String("--device", &o.device);
  flags.Custom("--worker-id", "an id without spaces or control characters",
               [&o](const std::string& v) {
                 o.worker_id = v;
                 return util::IsPlainName(v);
               });
  auto in_range = [](int* out, int max) {
    return [out, max](const std::string& v) {
      return absl::SimpleAtoi(v, out) && *out >= 1 && *out <= max;
    };
  };
  flags.Custom("--heartbeat-ms", "a positive number of milliseconds",
               in_range(&o.heartbeat_ms, 3600 * 1000));
  flags.Custom("--threads", "a positive integer", in_range(&o.threads, 4096));
  flags.Custom("--max-message-mb", "a positive integer", in_range(&o.max_message_mb, 1 << 20));
  flags.Custom("--data-root", "an existing directory", [&o](const std::string& v) {
    struct stat st {};
    if (v.empty() || stat(v.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return false;
    o.data_roots.push_back(v);
    return true;
  });
  flags.Custom("--max-data-mb", "a positive integer", in_range(&o.max_data_mb, 1 << 30));
  flags.String("--tls-ca", &o.creds.tls_ca);
  flags.String("--tls-cert", &o.creds.tls_cert);
  flags.String("--tls-key", &o.creds.tls_key);
  flags.String("--token-file", &o.creds.token_file);
  flags.String("--tls-server-name", &o.creds.server_name);
  if (int rc = flags.Parse(argv, nullptr); rc >= 0) return rc;
  if (absl::Status s = security::MakeChannelCredentials(o.creds, nullptr).status(); !s.ok()) {
    return flags.Usage(std::string(s.message()));
  }

  AttachedWorker worker(o);
  // SIGTERM / SIGINT: a clean shutdown, from a thread (handlers cannot take
  // locks or touch gRPC).
  if (pipe(g_signal_pipe) != 0) {
    std::perror("fxdp-worker attach: pipe");
    return 1;
  }
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  std::thread signals([&worker] {
    char c = 0;
    while (true) {
      const ssize_t n = read(g_signal_pipe[0], &c, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0 || c == 0) return;  // 0: Serve returned
      worker.RequestShutdown(c == SIGINT ? "SIGINT" : "SIGTERM");
    }
  });
  const int code = worker.Serve();
  const char stop = 0;
  (void)!write(g_signal_pipe[1], &stop, 1);
  signals.join();
  std::fflush(stderr);
  return code;
}

}  // namespace fxdp::executor
