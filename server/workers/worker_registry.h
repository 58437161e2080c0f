// WorkerRegistry: the server side of fxdp.v1.WorkerService
// (proto/fxdp/v1/worker.proto): the Attach stream of every worker, and
// ListWorkers.
//
// Each worker's Attach runs in one gRPC sync-server thread, which reads the
// stream in a loop: Register first (answered by Registered), then heartbeats
// (IDLE/BUSY, job, step) and job messages, which go to the worker's
// subscribers. Writes to a worker (Send) may come from any thread; they are
// serialized by a per-worker mutex. A worker is listed BUSY with its job from
// the moment Send writes its AssignJob, and its step from each StepResult, not
// only from its next heartbeat. A watchdog thread marks a worker LOST
// when it sent no heartbeat for more than `missed_heartbeats` intervals and
// ends its stream; a worker whose stream ends is LOST at once. LOST entries
// are listed for `lost_retention_s`, then forgotten; a worker that registers
// again with the same id replaces its LOST entry.
//
// Admission (docs/robustness.md): at most max_streams Attach calls at once
// (RESOURCE_EXHAUSTED beyond), each must send a Register within
// register_deadline_s (the watchdog ends it otherwise), and the Register is
// validated (ValidateRegister) before the worker is listed.
//
// A malformed or unexpected message is logged (stderr) and ignored.
// Thread-safe. Never includes LibTorch.
#ifndef FXDP_SERVER_WORKERS_WORKER_REGISTRY_H_
#define FXDP_SERVER_WORKERS_WORKER_REGISTRY_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"
#include "proto/fxdp/v1/worker.grpc.pb.h"
#include "security/call_auth.h"
#include "server/workers/worker_pool.h"

namespace fxdp::server {

// Bounds on what a worker may register (ValidateRegister): a worker is
// trusted only as far as it is checked (docs/robustness.md).
inline constexpr int64_t kMaxPid = 4194304;      // Linux's largest pid_max
inline constexpr int64_t kMaxCudaDevices = 128;  // c10::DeviceIndex is int8_t
inline constexpr int32_t kMaxCapacity = 64;
inline constexpr int64_t kMaxMemoryBytes = int64_t{1} << 50;  // 1 PiB
inline constexpr int32_t kMaxThreads = 4096;

// INVALID_ARGUMENT naming the field, the rule and the value (escaped) for a
// Register message outside those bounds: worker_id (printable, <= 256 bytes,
// may be empty), hostname (1..253 of [A-Za-z0-9._-]), pid, device ("cpu" or
// "cuda:N", N < 128), capacity [1, 64], memory_bytes [0, 2^50], threads
// [0, 4096], fxdp/torch versions (printable, <= 64 bytes), busy_with_job_id.
// The protocol version is checked before (FAILED_PRECONDITION).
grpc::Status ValidateRegister(const v1::Register& reg);

// The host of a gRPC peer string as the server sees the connection
// ("ipv4:10.0.0.5:4711" -> "10.0.0.5", "ipv6:[fe80::1]:4711" -> "fe80::1",
// loopback and unix sockets -> "127.0.0.1"); "" when unknown. What a job's
// rendezvous host is made of (WorkerInfo.address), never the hostname the
// worker declared.
std::string PeerHost(absl::string_view peer);

struct WorkerRegistryOptions {
  // Registered.heartbeat_interval_ms.
  int heartbeat_interval_ms = 1000;
  // LOST after more than this many intervals without a heartbeat.
  int missed_heartbeats = 3;
  // How long LOST workers stay listed.
  double lost_retention_s = 60;
  // --max-worker-streams: Attach calls at once (attached or attaching);
  // more are RESOURCE_EXHAUSTED before they read anything.
  int max_streams = 1024;
  // --register-deadline-s: an Attach that sent no Register after this long
  // is ended (DEADLINE_EXCEEDED), so a silent stream holds no thread.
  double register_deadline_s = 10;
};

class WorkerRegistry final : public v1::WorkerService::Service, public WorkerPool {
 public:
  // Listeners are called on the worker's reader thread for each message
  // after Register (heartbeats included), and once with nullptr when the
  // worker is lost.
  using Listener = WorkerPool::Listener;

  // `auth`: who may call (call_auth.h); null: the server does not authenticate.
  explicit WorkerRegistry(WorkerRegistryOptions options = {},
                          std::shared_ptr<security::CallAuth> auth = nullptr);
  ~WorkerRegistry() override;

  using AttachStream = grpc::ServerReaderWriter<v1::ServerMessage, v1::WorkerMessage>;
  // One worker's attachment, from its admission to its loss (the steps below).
  grpc::Status Attach(grpc::ServerContext* context, AttachStream* stream) override;
  // Every worker; an authenticated caller that is no admin sees the job id
  // and step of its own jobs only (job_owners), never another identity's.
  grpc::Status ListWorkers(grpc::ServerContext* context, const v1::ListWorkersRequest* request,
                           v1::ListWorkersResponse* response) override;
  // The owner of a job by id (JobServiceImpl::OwnerOf), for ListWorkers. Set
  // once before serving; unset, no job id is shown to a non-admin caller.
  void SetJobOwners(std::function<std::string(const std::string& job_id)> owner_of) {
    job_owners_ = std::move(owner_of);
  }

  // Every known worker (LOST ones included), sorted by id.
  std::vector<v1::WorkerInfo> List() const override;
  // Ids of attached IDLE workers, sorted.
  std::vector<std::string> IdleWorkers() const override;
  // Writes `msg` to the worker's stream; false when it is not attached (or
  // the write failed: the stream is broken).
  bool Send(const std::string& worker_id, const v1::ServerMessage& msg) override;
  // Subscribes to the messages of the worker's current attachment; returns a
  // handle for Unsubscribe, or 0 when the worker is not attached.
  int64_t Subscribe(const std::string& worker_id, Listener listener) override;
  void Unsubscribe(int64_t handle) override;

  // Attach calls in their handler now (admitted, not yet returned): at most
  // max_streams. A call's client may see its end before its slot is free.
  int OpenStreams() const {
    std::lock_guard<std::mutex> l(mu_);
    return streams_;
  }

  // Ends every stream (cancels the calls) and stops the watchdog; new
  // attachments are refused. Idempotent.
  void Shutdown();

 private:
  using Clock = std::chrono::steady_clock;
  struct Conn;  // one attachment
  struct Entry {
    v1::Register reg;
    std::string address;  // PeerHost of the attachment's connection
    v1::WorkerState state = v1::WORKER_STATE_IDLE;
    std::string job_id, lost_reason;
    int64_t step = 0;
    // The job Send(AssignJob) gave the worker, until a heartbeat says BUSY
    // with it (or the job ends): heartbeats sent before the worker saw the
    // assignment still say IDLE and must not undo it.
    std::string assigned_job;
    Clock::time_point attached, last_heartbeat, lost_at;
    std::shared_ptr<Conn> conn;  // null once LOST
  };

  // Attach's steps: admission (max_streams, the register deadline), the
  // Register read and validated (OK with none: the stream closed first), the
  // worker listed (its id, unique), its messages served until the stream
  // ends (why it ended), then MarkLost.
  grpc::Status Admit(grpc::ServerContext* context);
  grpc::Status ReadRegister(grpc::ServerContext* context, AttachStream* stream,
                            std::optional<v1::Register>* reg);
  grpc::Status Enroll(const std::string& principal, grpc::ServerContext* context,
                      AttachStream* stream, v1::Register* reg, std::shared_ptr<Conn>* conn);
  std::string Serve(const std::shared_ptr<Conn>& conn, grpc::ServerContext* context,
                    AttachStream* stream);
  // A message of an attached worker applied to its entry; false when it is
  // ignored (not for the subscribers).
  bool OnMessage(const std::shared_ptr<Conn>& conn, const v1::WorkerMessage& m);
  void OnHeartbeat(Entry* e, const v1::Heartbeat& h);  // mu_ held
  void MarkLost(const std::string& id, const std::shared_ptr<Conn>& conn, const std::string& why);
  void Watchdog();
  v1::WorkerInfo InfoOf(const std::string& id, const Entry& e, Clock::time_point now) const;

  const WorkerRegistryOptions options_;
  const std::shared_ptr<security::CallAuth> auth_;
  std::function<std::string(const std::string&)> job_owners_;  // set before serving
  mutable std::mutex mu_;
  std::map<std::string, Entry> workers_;
  std::map<int64_t, std::pair<std::shared_ptr<Conn>, Listener>> listeners_;
  int64_t next_handle_ = 1, next_anon_id_ = 1;
  bool shutdown_ = false;
  int streams_ = 0;  // Attach calls in their handler
  int64_t refused_streams_ = 0;
  // Attach calls before their Register, with their deadline (min(): past it,
  // cancelled by the watchdog).
  std::map<grpc::ServerContext*, Clock::time_point> unregistered_;
  std::condition_variable wake_;
  std::thread watchdog_;
};

}  // namespace fxdp::server

#endif  // FXDP_SERVER_WORKERS_WORKER_REGISTRY_H_
