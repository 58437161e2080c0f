#include "server/workers/worker_registry.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "security/server_auth.h"
#include "server/audit.h"
#include "server/grpc_status.h"
#include "server/log.h"

namespace fxdp::server {
namespace {

// Printable, bounded: ids come from the network.
bool IsPlainId(const std::string& s) {
  if (s.empty() || s.size() > 256) return false;
  for (unsigned char c : s) {
    if (c <= ' ' || c == 0x7f) return false;
  }
  return true;
}

constexpr int kMaxIgnoredLogs = 10;  // per attachment, then silence

// A hostname (RFC 1123 letters, digits, '-', '.', plus '_'), 1..253 bytes.
bool IsHostname(const std::string& s) {
  if (s.empty() || s.size() > 253) return false;
  for (unsigned char c : s) {
    if (!absl::ascii_isalnum(c) && c != '-' && c != '.' && c != '_') return false;
  }
  return true;
}

// Printable ASCII without spaces, at most `max` bytes ("" allowed).
bool IsPlainText(const std::string& s, size_t max) {
  if (s.size() > max) return false;
  for (unsigned char c : s) {
    if (c <= ' ' || c >= 0x7f) return false;
  }
  return true;
}

// "cuda:N", N a decimal < kMaxCudaDevices.
bool IsCudaDevice(absl::string_view d) {
  if (!absl::ConsumePrefix(&d, "cuda:") || d.empty() || d.size() > 3) return false;
  int index = 0;
  for (char c : d) {
    if (!absl::ascii_isdigit(c)) return false;
    index = index * 10 + (c - '0');
  }
  return index < kMaxCudaDevices;
}

// `value` quoted for a message: escaped, cut at 64 bytes (it came from the network).
std::string Quoted(const std::string& value) {
  std::string v = value.size() > 64 ? value.substr(0, 64) + "..." : value;
  return absl::StrCat("'", absl::CHexEscape(v), "'");
}

grpc::Status Invalid(absl::string_view field, absl::string_view rule, absl::string_view got) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                      absl::StrCat("Register.", field, " must be ", rule, ", got ", got));
}

}  // namespace

grpc::Status ValidateRegister(const v1::Register& r) {
  if (!r.worker_id().empty() && !IsPlainId(r.worker_id())) {
    return Invalid("worker_id", "printable without spaces, at most 256 bytes",
                   Quoted(r.worker_id()));
  }
  if (!IsHostname(r.hostname())) {
    return Invalid("hostname", "1 to 253 letters, digits, '-', '.' or '_'", Quoted(r.hostname()));
  }
  if (r.pid() < 0 || r.pid() > kMaxPid) {
    return Invalid("pid", absl::StrCat("in [0, ", kMaxPid, "]"), absl::StrCat(r.pid()));
  }
  if (r.device() != "cpu" && !IsCudaDevice(r.device())) {
    return Invalid("device", absl::StrCat("cpu or cuda:N with 0 <= N < ", kMaxCudaDevices),
                   Quoted(r.device()));
  }
  if (r.capacity() < 1 || r.capacity() > kMaxCapacity) {
    return Invalid("capacity", absl::StrCat("in [1, ", kMaxCapacity, "]"),
                   absl::StrCat(r.capacity()));
  }
  if (r.memory_bytes() < 0 || r.memory_bytes() > kMaxMemoryBytes) {
    return Invalid("memory_bytes", absl::StrCat("in [0, ", kMaxMemoryBytes, "] (0: unknown)"),
                   absl::StrCat(r.memory_bytes()));
  }
  if (r.threads() < 0 || r.threads() > kMaxThreads) {
    return Invalid("threads", absl::StrCat("in [0, ", kMaxThreads, "] (0: unknown)"),
                   absl::StrCat(r.threads()));
  }
  if (!IsPlainText(r.fxdp_version(), 64)) {
    return Invalid("fxdp_version", "printable without spaces, at most 64 bytes",
                   Quoted(r.fxdp_version()));
  }
  if (!IsPlainText(r.torch_version(), 64)) {
    return Invalid("torch_version", "printable without spaces, at most 64 bytes",
                   Quoted(r.torch_version()));
  }
  if (r.memory_source().size() > 64 ||
      !std::all_of(r.memory_source().begin(), r.memory_source().end(),
                   [](unsigned char c) { return c >= 0x20 && c < 0x7f; })) {
    return Invalid("memory_source", "printable, at most 64 bytes", Quoted(r.memory_source()));
  }
  if (!r.busy_with_job_id().empty() && !IsPlainId(r.busy_with_job_id())) {
    return Invalid("busy_with_job_id", "printable without spaces, at most 256 bytes",
                   Quoted(r.busy_with_job_id()));
  }
  return grpc::Status::OK;
}

std::string PeerHost(absl::string_view peer) {
  std::string host;
  if (absl::ConsumePrefix(&peer, "ipv4:")) {
    host = std::string(peer.substr(0, peer.rfind(':')));
  } else if (absl::ConsumePrefix(&peer, "ipv6:")) {
    // "[::1]:port"; a v4-mapped address ("[::ffff:10.0.0.5]") is the v4 one.
    if (!absl::ConsumePrefix(&peer, "[")) return "";
    host = std::string(peer.substr(0, peer.find(']')));
    absl::string_view h = host;
    if (absl::ConsumePrefix(&h, "::ffff:") && h.find('.') != absl::string_view::npos) {
      host = std::string(h);
    }
    host = absl::StrReplaceAll(host, {{"%25", "%"}});
  } else if (absl::StartsWith(peer, "unix:") || absl::StartsWith(peer, "unix-abstract:")) {
    return "127.0.0.1";  // same host
  } else {
    return "";
  }
  if (host == "::1" || absl::StartsWith(host, "127.")) return "127.0.0.1";
  return host;
}

struct WorkerRegistry::Conn {
  std::string id;
  std::string principal;  // security::Describe of the attaching worker's credentials
  bool lost = false;      // guarded by WorkerRegistry::mu_
  int ignored = 0;        // reader thread only
  std::mutex ctx_mu;
  grpc::ServerContext* ctx = nullptr;  // guarded by ctx_mu; null once the call returned
  std::mutex write_mu;
  grpc::ServerReaderWriter<v1::ServerMessage, v1::WorkerMessage>* stream = nullptr;  // write_mu

  void Cancel() {
    std::lock_guard<std::mutex> l(ctx_mu);
    if (ctx != nullptr) ctx->TryCancel();
  }
  bool Write(const v1::ServerMessage& m) {
    std::lock_guard<std::mutex> l(write_mu);
    return stream != nullptr && stream->Write(m);
  }
  void Ignore(const std::string& why) {
    if (++ignored <= kMaxIgnoredLogs) {
      Log(absl::StrCat("worker ", id, ": ignored ", why,
                       ignored == kMaxIgnoredLogs ? " (further ones not logged)" : ""));
    }
  }
};

WorkerRegistry::WorkerRegistry(WorkerRegistryOptions options,
                               std::shared_ptr<security::CallAuth> auth)
    : options_(options), auth_(std::move(auth)), watchdog_(&WorkerRegistry::Watchdog, this) {}

WorkerRegistry::~WorkerRegistry() { Shutdown(); }

void WorkerRegistry::Shutdown() {
  std::vector<std::shared_ptr<Conn>> conns;
  {
    std::lock_guard<std::mutex> l(mu_);
    shutdown_ = true;
    for (auto& [id, e] : workers_) {
      if (e.conn) conns.push_back(e.conn);
    }
    for (auto& [ctx, deadline] : unregistered_) ctx->TryCancel();
  }
  wake_.notify_all();
  if (watchdog_.joinable() && watchdog_.get_id() != std::this_thread::get_id()) watchdog_.join();
  for (auto& c : conns) c->Cancel();
}

grpc::Status WorkerRegistry::Attach(grpc::ServerContext* context, AttachStream* stream) {
  absl::StatusOr<std::optional<security::Principal>> who =
      security::CallPrincipal(auth_.get(), *context, security::kAttachMethod);
  if (!who.ok()) return ToGrpcStatus(who.status());
  if (grpc::Status s = Admit(context); !s.ok()) return s;
  struct StreamSlot {
    WorkerRegistry* r;
    ~StreamSlot() {
      std::lock_guard<std::mutex> l(r->mu_);
      --r->streams_;
    }
  } slot{this};
  std::optional<v1::Register> reg;
  if (grpc::Status s = ReadRegister(context, stream, &reg); !s.ok() || !reg) return s;
  std::shared_ptr<Conn> conn;
  if (grpc::Status s = Enroll(security::Describe(*who), context, stream, &*reg, &conn); !s.ok()) {
    return s;
  }
  const std::string why = Serve(conn, context, stream);
  MarkLost(conn->id, conn, why);
  {
    std::lock_guard<std::mutex> l(conn->ctx_mu);
    conn->ctx = nullptr;
  }
  std::lock_guard<std::mutex> l(conn->write_mu);
  conn->stream = nullptr;
  return grpc::Status::OK;
}

// At most max_streams calls; each must register in time (the watchdog
// cancels one that does not, which ends ReadRegister's Read).
grpc::Status WorkerRegistry::Admit(grpc::ServerContext* context) {
  std::lock_guard<std::mutex> l(mu_);
  if (shutdown_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down");
  if (streams_ >= options_.max_streams) {
    if (++refused_streams_ <= kMaxIgnoredLogs) {
      Log(absl::StrCat("attach from ", context->peer(), ": refused: ", streams_,
                       " Attach streams open (--max-worker-streams)"));
    }
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat("this server takes at most ", options_.max_streams,
                                     " Attach streams at once (fxdp-server --max-worker-streams)"));
  }
  ++streams_;
  unregistered_[context] =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(options_.register_deadline_s));
  return grpc::Status::OK;
}

grpc::Status WorkerRegistry::ReadRegister(grpc::ServerContext* context, AttachStream* stream,
                                          std::optional<v1::Register>* reg) {
  v1::WorkerMessage m;
  const bool got = stream->Read(&m);
  bool late = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    late = unregistered_.at(context) == Clock::time_point::min();
    unregistered_.erase(context);
  }
  if (late) {
    Log(absl::StrFormat("attach from %s: no register_worker within %g s, closed", context->peer(),
                        options_.register_deadline_s));
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        absl::StrFormat("no register_worker within %g s (fxdp-server "
                                        "--register-deadline-s)",
                                        options_.register_deadline_s));
  }
  if (!got) return grpc::Status::OK;  // closed before registering
  if (m.msg_case() != v1::WorkerMessage::kRegisterWorker) {
    Log(absl::StrCat("attach from ", context->peer(), ": first message is not register_worker"));
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "the first message on Attach must be register_worker");
  }
  const v1::Register& r = m.register_worker();
  if (r.protocol_version() != v1::WORKER_PROTOCOL_VERSION_2) {
    Log(absl::StrCat("attach from ", context->peer(), ": protocol version ", r.protocol_version(),
                     " not supported"));
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("worker protocol version ", r.protocol_version(),
                                     " is not supported (this server speaks 2): run the "
                                     "fxdp-worker built with this fxdp-server"));
  }
  if (grpc::Status bad = ValidateRegister(r); !bad.ok()) {
    Log(absl::StrCat("attach from ", context->peer(), ": refused: ", bad.error_message()));
    return bad;
  }
  *reg = r;
  return grpc::Status::OK;
}

grpc::Status WorkerRegistry::Enroll(const std::string& principal, grpc::ServerContext* context,
                                    AttachStream* stream, v1::Register* reg,
                                    std::shared_ptr<Conn>* out) {
  const std::string address = PeerHost(context->peer());
  auto conn = std::make_shared<Conn>();
  conn->principal = principal;
  conn->ctx = context;
  conn->stream = stream;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (shutdown_)
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down");
    if (reg->worker_id().empty()) {
      do {
        reg->set_worker_id(absl::StrCat("worker-", next_anon_id_++));
      } while (workers_.count(reg->worker_id()));
    }
    auto it = workers_.find(reg->worker_id());
    if (it != workers_.end() && it->second.conn) {
      Log(absl::StrCat("attach from ", context->peer(), ": worker id '", reg->worker_id(),
                       "' is in use"));
      return grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                          absl::StrCat("worker id '", reg->worker_id(), "' is attached already"));
    }
    conn->id = reg->worker_id();
    Entry& e = workers_[conn->id];
    e = Entry{};
    e.reg = *reg;
    e.address = address;
    e.state = reg->busy_with_job_id().empty() ? v1::WORKER_STATE_IDLE : v1::WORKER_STATE_BUSY;
    e.job_id = reg->busy_with_job_id();
    e.attached = e.last_heartbeat = Clock::now();
    e.conn = conn;
  }
  Audit("worker_join", {{"identity", conn->principal},
                        {"peer", context->peer()},
                        {"worker", conn->id},
                        {"hostname", reg->hostname()},
                        {"device", reg->device()}});
  Log(absl::StrFormat(
      "worker %s attached: host %s pid %d device %s capacity %d (fxdp %s, torch %s) from %s",
      conn->id, reg->hostname(), reg->pid(), reg->device(), reg->capacity(), reg->fxdp_version(),
      reg->torch_version(), context->peer()));
  *out = std::move(conn);
  return grpc::Status::OK;
}

std::string WorkerRegistry::Serve(const std::shared_ptr<Conn>& conn, grpc::ServerContext* context,
                                  AttachStream* stream) {
  v1::ServerMessage hello;
  hello.mutable_registered()->set_worker_id(conn->id);
  hello.mutable_registered()->set_heartbeat_interval_ms(options_.heartbeat_interval_ms);
  if (!conn->Write(hello)) return "could not send Registered";
  v1::WorkerMessage m;
  while (stream->Read(&m)) {
    if (!OnMessage(conn, m)) continue;
    std::vector<Listener> ls;
    {
      std::lock_guard<std::mutex> l(mu_);
      for (auto& [h, p] : listeners_) {
        if (p.first == conn) ls.push_back(p.second);
      }
    }
    for (auto& f : ls) f(conn->id, &m);
  }
  return context->IsCancelled() ? "stream cancelled" : "stream ended";
}

bool WorkerRegistry::OnMessage(const std::shared_ptr<Conn>& conn, const v1::WorkerMessage& m) {
  switch (m.msg_case()) {
    case v1::WorkerMessage::kHeartbeat: {
      const v1::Heartbeat& h = m.heartbeat();
      if (h.state() != v1::WORKER_STATE_IDLE && h.state() != v1::WORKER_STATE_BUSY) {
        conn->Ignore(absl::StrCat("a heartbeat with state ", h.state()));
        return false;
      }
      std::lock_guard<std::mutex> l(mu_);
      if (!conn->lost) OnHeartbeat(&workers_[conn->id], h);
      return true;
    }
    case v1::WorkerMessage::kStepResult: {
      std::lock_guard<std::mutex> l(mu_);
      if (conn->lost) return true;
      Entry& e = workers_[conn->id];
      if (e.state == v1::WORKER_STATE_BUSY && e.job_id == m.step_result().job_id()) {
        e.step = std::max(e.step, m.step_result().step());
      }
      return true;
    }
    case v1::WorkerMessage::kJobEnded:
    case v1::WorkerMessage::kJobFailed: {
      // The worker frees its job slot before it says so: it is IDLE now,
      // not only at its next heartbeat (a job submitted right after would
      // otherwise find it busy). The message still goes to the subscribers.
      const std::string& job = m.has_job_ended() ? m.job_ended().job_id() : m.job_failed().job_id();
      std::lock_guard<std::mutex> l(mu_);
      if (conn->lost) return true;
      Entry& e = workers_[conn->id];
      // Only the job it is running: a refused second job leaves it busy.
      if (e.job_id.empty() || e.job_id == job) {
        e.state = v1::WORKER_STATE_IDLE;
        e.job_id.clear();
        e.step = 0;
      }
      if (e.assigned_job == job) e.assigned_job.clear();
      return true;
    }
    case v1::WorkerMessage::kRegisterWorker: conn->Ignore("a second register_worker"); return false;
    case v1::WorkerMessage::MSG_NOT_SET: conn->Ignore("an empty or unknown message"); return false;
    default: return true;
  }
}

void WorkerRegistry::OnHeartbeat(Entry* e, const v1::Heartbeat& h) {
  e->last_heartbeat = Clock::now();
  if (!e->assigned_job.empty()) {
    // Sent before the worker saw its assignment: keep BUSY.
    if (h.state() != v1::WORKER_STATE_BUSY || h.job_id() != e->assigned_job) return;
    e->assigned_job.clear();
  }
  // A heartbeat may be older than the last StepResult of the same job.
  const bool same_job = e->state == v1::WORKER_STATE_BUSY && e->job_id == h.job_id();
  e->step = same_job ? std::max(e->step, h.step()) : h.step();
  e->state = h.state();
  e->job_id = h.job_id();
}

void WorkerRegistry::MarkLost(const std::string& id, const std::shared_ptr<Conn>& conn,
                              const std::string& why) {
  std::vector<Listener> ls;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (conn->lost) return;
    conn->lost = true;
    auto it = workers_.find(id);
    if (it != workers_.end() && it->second.conn == conn) {
      Entry& e = it->second;
      e.state = v1::WORKER_STATE_LOST;
      e.lost_reason = why;
      e.lost_at = Clock::now();
      e.conn = nullptr;
    }
    for (auto i = listeners_.begin(); i != listeners_.end();) {
      if (i->second.first == conn) {
        ls.push_back(std::move(i->second.second));
        i = listeners_.erase(i);
      } else {
        ++i;
      }
    }
  }
  Log(absl::StrCat("worker ", id, " lost: ", why));
  Audit("worker_leave", {{"identity", conn->principal}, {"worker", id}, {"reason", why}});
  conn->Cancel();
  for (auto& f : ls) f(id, nullptr);
}

void WorkerRegistry::Watchdog() {
  const auto limit = std::chrono::milliseconds(int64_t{options_.heartbeat_interval_ms} *
                                               options_.missed_heartbeats);
  const auto retention = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options_.lost_retention_s));
  std::unique_lock<std::mutex> l(mu_);
  while (!shutdown_) {
    wake_.wait_for(l, std::chrono::milliseconds(100));
    if (shutdown_) break;
    const auto now = Clock::now();
    std::vector<std::pair<std::shared_ptr<Conn>, double>> late;
    for (auto it = workers_.begin(); it != workers_.end();) {
      Entry& e = it->second;
      if (e.conn && now - e.last_heartbeat > limit) {
        late.emplace_back(e.conn, std::chrono::duration<double>(now - e.last_heartbeat).count());
      } else if (!e.conn && now - e.lost_at > retention) {
        it = workers_.erase(it);
        continue;
      }
      ++it;
    }
    // Attach calls that did not register in time: cancelled (their Read
    // returns); min() marks them for the handler.
    for (auto& [ctx, deadline] : unregistered_) {
      if (deadline != Clock::time_point::min() && now > deadline) {
        deadline = Clock::time_point::min();
        ctx->TryCancel();
      }
    }
    if (late.empty()) continue;
    l.unlock();
    for (auto& [c, s] : late) MarkLost(c->id, c, absl::StrFormat("no heartbeat for %.1f s", s));
    l.lock();
  }
}

v1::WorkerInfo WorkerRegistry::InfoOf(const std::string& id, const Entry& e,
                                      Clock::time_point now) const {
  v1::WorkerInfo w;
  w.set_worker_id(id);
  w.set_state(e.state);
  w.set_device(e.reg.device());
  w.set_hostname(e.reg.hostname());
  w.set_pid(e.reg.pid());
  w.set_job_id(e.job_id);
  w.set_step(e.step);
  w.set_last_heartbeat_s(std::chrono::duration<double>(now - e.last_heartbeat).count());
  w.set_capacity(e.reg.capacity());
  w.set_fxdp_version(e.reg.fxdp_version());
  w.set_torch_version(e.reg.torch_version());
  w.set_attached_s(std::chrono::duration<double>(now - e.attached).count());
  w.set_lost_reason(e.lost_reason);
  w.set_address(e.address);
  w.set_memory_bytes(e.reg.memory_bytes());
  w.set_memory_source(e.reg.memory_source());
  return w;
}

std::vector<v1::WorkerInfo> WorkerRegistry::List() const {
  std::lock_guard<std::mutex> l(mu_);
  const auto now = Clock::now();
  std::vector<v1::WorkerInfo> out;
  for (const auto& [id, e] : workers_) out.push_back(InfoOf(id, e, now));
  return out;
}

std::vector<std::string> WorkerRegistry::IdleWorkers() const {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<std::string> out;
  for (const auto& [id, e] : workers_) {
    if (e.conn && e.state == v1::WORKER_STATE_IDLE) out.push_back(id);
  }
  return out;
}

bool WorkerRegistry::Send(const std::string& worker_id, const v1::ServerMessage& msg) {
  std::shared_ptr<Conn> c;
  const std::string* job = msg.has_assign_job() ? &msg.assign_job().job_id() : nullptr;
  bool assigned = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = workers_.find(worker_id);
    if (it == workers_.end() || !it->second.conn) return false;
    c = it->second.conn;
    Entry& e = it->second;
    // BUSY before the write: the worker may answer (JobFailed) before Write
    // returns. A worker already busy refuses the job and stays as it is.
    if (job != nullptr && e.state == v1::WORKER_STATE_IDLE) {
      e.state = v1::WORKER_STATE_BUSY;
      e.job_id = e.assigned_job = *job;
      e.step = 0;
      assigned = true;
    }
  }
  if (c->Write(msg)) return true;
  if (assigned) {
    std::lock_guard<std::mutex> l(mu_);
    auto it = workers_.find(worker_id);
    if (it != workers_.end() && it->second.conn == c && it->second.assigned_job == *job) {
      Entry& e = it->second;
      e.state = v1::WORKER_STATE_IDLE;
      e.job_id.clear();
      e.assigned_job.clear();
      e.step = 0;
    }
  }
  return false;
}

int64_t WorkerRegistry::Subscribe(const std::string& worker_id, Listener listener) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || !it->second.conn) return 0;
  const int64_t h = next_handle_++;
  listeners_[h] = {it->second.conn, std::move(listener)};
  return h;
}

void WorkerRegistry::Unsubscribe(int64_t handle) {
  std::lock_guard<std::mutex> l(mu_);
  listeners_.erase(handle);
}

grpc::Status WorkerRegistry::ListWorkers(grpc::ServerContext* context,
                                         const v1::ListWorkersRequest*,
                                         v1::ListWorkersResponse* response) {
  absl::StatusOr<std::optional<security::Principal>> who =
      security::CallPrincipal(auth_.get(), *context, "/fxdp.v1.WorkerService/ListWorkers");
  if (!who.ok()) return ToGrpcStatus(who.status());
  for (v1::WorkerInfo& w : List()) {
    // Another identity's job id would tell that the job exists (issue 25).
    if (!w.job_id().empty() &&
        !security::MayAccess(*who, job_owners_ ? job_owners_(w.job_id()) : std::string())) {
      w.clear_job_id();
      w.clear_step();
    }
    *response->add_workers() = std::move(w);
  }
  return grpc::Status::OK;
}

}  // namespace fxdp::server
