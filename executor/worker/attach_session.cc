// The attachment of `fxdp-worker attach` (attach_worker.h): connect,
// register, heartbeat from its own thread, reconnect with backoff (0.2 s
// doubling to 5 s), shut down cleanly.
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <torch/headeronly/version.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_format.h"
#include "executor/memory_limit.h"
#include "executor/worker/attach_worker.h"
#include "executor/worker/common.h"

namespace fxdp::executor::attach {

int AttachedWorker::Serve() {
  if (const int rc = SetUp(); rc != 0) return rc;
  Connect();
  AttachUntilShutdown();
  return Stop();
}

int AttachedWorker::SetUp() {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0')
    std::snprintf(host, sizeof(host), "localhost");
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
  if (o_.memory_limit > 0) InstallCpuMemoryLimit(o_.memory_limit);
  if (device_.is_cpu()) {
    const MemoryFigure memory = CpuMemoryFigure(o_.memory_limit);
    memory_bytes_ = memory.bytes;
    memory_source_ = memory.source;
  }
  if (o_.threads > 0) at::set_num_threads(o_.threads);
  util::Log(Prefix(), "fxdp ", FXDP_VERSION, ", torch ", TORCH_VERSION, ", device ", device_.str(),
            ", intra-op threads ", at::get_num_threads(), "; server ", o_.server);
  return 0;
}

void AttachedWorker::Connect() {
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
    util::Log(Prefix(), "credentials: ", creds.status().message());
    creds = grpc::InsecureChannelCredentials();
  }
  channel_ = grpc::CreateCustomChannel(o_.server, *creds, args);
  stub_ = v1::WorkerService::NewStub(channel_);
}

void AttachedWorker::AttachUntilShutdown() {
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
    util::Log(Prefix(),
              registered ? "lost the server connection"
                         : (ever ? "cannot reattach to " : "cannot attach to "),
              registered ? "" : o_.server, " (", status, "); retrying in ",
              absl::StrFormat("%.1f", backoff.count() / 1000.0), " s");
    cv_.wait_for(l, backoff, [&] { return shutdown_; });
    backoff = std::min<std::chrono::milliseconds>(backoff * 2, std::chrono::seconds(5));
  }
}

int AttachedWorker::Stop() {
  // Shutting down: wait briefly for the job thread (it was told to stop).
  std::unique_lock<std::mutex> l(mu_);
  util::Log(Prefix(), "shutting down (", shutdown_reason_, ")");
  const bool done = cv_.wait_for(l, std::chrono::seconds(3), [&] { return running_jobs_ == 0; });
  std::thread t = std::move(job_thread_);
  l.unlock();
  if (!done) {
    // A step still blocked (on a kernel, say): do not run destructors under it.
    util::Log(Prefix(), "a step is still blocked; exiting without waiting for it");
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

  const WorkerMessage reg = MakeRegister();
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
    const int interval = m.registered().heartbeat_interval_ms() > 0
                             ? m.registered().heartbeat_interval_ms()
                             : o_.heartbeat_ms;
    util::Log(
        Prefix(), "attached to ", o_.server, " (heartbeat every ", interval, " ms",
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
  std::shared_ptr<AssignedJob> orphan;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (session_ == session) session_.reset();
    if (job_ && job_->session == session) orphan = job_;
  }
  session->Close();
  const grpc::Status st = session->Finish();
  *status =
      !protocol_error.empty() ? protocol_error
      : st.ok()
          ? "the server closed the stream"
          : absl::StrCat(absl::StatusCodeToString(static_cast<absl::StatusCode>(st.error_code())),
                         ": ", st.error_message());
  if (orphan && !orphan->cancel.exchange(true)) {
    util::Log(orphan->Prefix(), "abandoning the job: its server connection is gone");
    JobTask e(JobTask::kCancel);
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
      AssignedJob& j = *job_;
      j.cancel = true;
      j.connections.Abort();  // a step or rendezvous blocked on a peer ends now
      JobTask e(JobTask::kCancel);
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

WorkerMessage AttachedWorker::MakeRegister() {
  WorkerMessage reg;
  v1::Register* r = reg.mutable_register_worker();
  r->set_protocol_version(v1::WORKER_PROTOCOL_VERSION_2);
  r->set_worker_id(worker_id_);
  r->set_hostname(hostname_);
  r->set_pid(getpid());
  r->set_device(device_.str());
  r->set_capacity(1);
  r->set_memory_bytes(memory_bytes_);
  r->set_memory_source(memory_source_);
  r->set_threads(at::get_num_threads());
  r->set_fxdp_version(FXDP_VERSION);
  r->set_torch_version(TORCH_VERSION);
  std::lock_guard<std::mutex> l(mu_);
  if (job_) r->set_busy_with_job_id(job_->id);
  return reg;
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

}  // namespace fxdp::executor::attach
