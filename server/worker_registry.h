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
// A malformed or unexpected message is logged (stderr) and ignored.
// Thread-safe. Never includes LibTorch.
#ifndef FXDP_SERVER_WORKER_REGISTRY_H_
#define FXDP_SERVER_WORKER_REGISTRY_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "proto/fxdp/v1/worker.grpc.pb.h"
#include "server/worker_pool.h"

namespace fxdp::server {

struct WorkerRegistryOptions {
  // Registered.heartbeat_interval_ms.
  int heartbeat_interval_ms = 1000;
  // LOST after more than this many intervals without a heartbeat.
  int missed_heartbeats = 3;
  // How long LOST workers stay listed.
  double lost_retention_s = 60;
};

class WorkerRegistry final : public v1::WorkerService::Service, public WorkerPool {
 public:
  // Listeners are called on the worker's reader thread for each message
  // after Register (heartbeats included), and once with nullptr when the
  // worker is lost.
  using Listener = WorkerPool::Listener;

  explicit WorkerRegistry(WorkerRegistryOptions options = {});
  ~WorkerRegistry() override;

  grpc::Status Attach(grpc::ServerContext* context,
                      grpc::ServerReaderWriter<v1::ServerMessage, v1::WorkerMessage>* stream) override;
  grpc::Status ListWorkers(grpc::ServerContext* context, const v1::ListWorkersRequest* request,
                           v1::ListWorkersResponse* response) override;

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

  // Ends every stream (cancels the calls) and stops the watchdog; new
  // attachments are refused. Idempotent.
  void Shutdown();

 private:
  using Clock = std::chrono::steady_clock;
  struct Conn;  // one attachment
  struct Entry {
    v1::Register reg;
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

  void MarkLost(const std::string& id, const std::shared_ptr<Conn>& conn, const std::string& why);
  void Watchdog();
  v1::WorkerInfo InfoOf(const std::string& id, const Entry& e, Clock::time_point now) const;

  const WorkerRegistryOptions options_;
  mutable std::mutex mu_;
  std::map<std::string, Entry> workers_;
  std::map<int64_t, std::pair<std::shared_ptr<Conn>, Listener>> listeners_;
  int64_t next_handle_ = 1, next_anon_id_ = 1;
  bool shutdown_ = false;
  std::condition_variable wake_;
  std::thread watchdog_;
};

}  // namespace fxdp::server

#endif  // FXDP_SERVER_WORKER_REGISTRY_H_
