// WorkerPool: what the job service needs of the attached workers: who is
// registered and idle, writing a message to one, and subscribing to one's
// messages. WorkerRegistry (the WorkerService's Attach streams) is the pool
// of the server; the unit tests of the job runner use an in-process pool
// (no gRPC).
#ifndef FXDP_SERVER_WORKERS_WORKER_POOL_H_
#define FXDP_SERVER_WORKERS_WORKER_POOL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "proto/fxdp/v1/worker.pb.h"

namespace fxdp::server {

class WorkerPool {
 public:
  // Called for each message of the worker (heartbeats included), and once
  // with nullptr when the worker is lost. Must not call Subscribe or
  // Unsubscribe; may call Send.
  using Listener = std::function<void(const std::string& worker_id, const v1::WorkerMessage* msg)>;

  virtual ~WorkerPool() = default;
  // Every known worker (LOST ones included), sorted by id.
  virtual std::vector<v1::WorkerInfo> List() const = 0;
  // Ids of attached IDLE workers, sorted.
  virtual std::vector<std::string> IdleWorkers() const = 0;
  // Writes `msg` to the worker; false when it is not attached (or the write
  // failed).
  virtual bool Send(const std::string& worker_id, const v1::ServerMessage& msg) = 0;
  // Subscribes to the messages of the worker's current attachment; a handle
  // for Unsubscribe, or 0 when the worker is not attached.
  virtual int64_t Subscribe(const std::string& worker_id, Listener listener) = 0;
  virtual void Unsubscribe(int64_t handle) = 0;
};

}  // namespace fxdp::server

#endif  // FXDP_SERVER_WORKERS_WORKER_POOL_H_
