// Dispatcher: the messages between one job and its workers (its ranks):
// each rank's messages about the job go to the job's inbox (a rank's end,
// JobEnded, JobFailed or lost, is also recorded for the release of its
// worker); AssignJob to every rank with the rendezvous address; a message
// to one rank or to all; CancelJob to the ranks. Sends report the first rank
// that is gone (-1: none). No gRPC here: the workers are a WorkerPool.
#ifndef FXDP_SERVER_JOBS_DISPATCHER_H_
#define FXDP_SERVER_JOBS_DISPATCHER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "proto/fxdp/v1/worker.pb.h"
#include "server/jobs/job.h"
#include "server/workers/worker_pool.h"

namespace fxdp::server {

// A TCP port free on 127.0.0.1 right now (bind port 0, read it, close); 0 on error.
int FreeLocalPort();

class Dispatcher {
 public:
  // `workers` in rank order.
  Dispatcher(WorkerPool* pool, std::shared_ptr<Job> job, std::string job_id,
             std::vector<std::string> workers)
      : pool_(pool), job_(std::move(job)), id_(std::move(job_id)), workers_(std::move(workers)) {}

  int world() const { return static_cast<int>(workers_.size()); }
  const std::string& worker(int rank) const { return workers_[rank]; }

  // Subscribes to every rank's messages about the job (delivered to the
  // job's inbox while the job lives); the subscription handles are appended
  // to `handles`. Returns -1, or the first rank that is not attached.
  int Subscribe(std::vector<int64_t>* handles);
  // Where rank 0 serves the rendezvous store: 127.0.0.1 when it runs on this
  // host, else the hostname it registered with.
  std::string RendezvousHost() const;
  // AssignJob to every rank (its expanded graph, `steps`, the rendezvous
  // address, `max_graphs` (a graph with symbolic sizes: the LoadGraph
  // programs it keeps); a resumed job's data_paths rotated by its first_step,
  // so that its step i reads the file of the job's step first_step + i);
  // marks each rank assigned before sending.
  int Assign(const std::string& host, int port, int64_t steps, uint32_t max_graphs = 0);
  // LoadGraph to `rank`: its graph of `expanded` as program `graph_id`,
  // dropping program `evict` (0: none) first; false when the rank is gone.
  bool LoadGraph(int rank, uint32_t graph_id, const v1::ExpandResponse& expanded, uint32_t evict);
  bool Send(int rank, const v1::ServerMessage& m);
  int SendAll(const v1::ServerMessage& m);
  // CancelJob(reason) to every assigned rank but `except`.
  void CancelAssigned(const std::string& reason, int except);
  // CancelJob(reason) to ranks 1..world-1 (rank 0 ends by itself).
  void CancelOthers(const std::string& reason);

 private:
  // Rank `rank`'s graph of `expanded`, with a resumed job's step offset.
  v1::GraphDef RankGraph(const v1::ExpandResponse& expanded, int rank) const;
  // JobSpec.initial_checkpoint into `a`, each fill with its whole shape,
  // JobSpec.checkpoints, and with either the expansion's sharded_state
  // (docs/checkpoints.md).
  void AddCheckpointFields(v1::AssignJob* a) const;

  WorkerPool* const pool_;
  const std::shared_ptr<Job> job_;
  const std::string id_;
  const std::vector<std::string> workers_;
};

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_DISPATCHER_H_
