// JobServiceImpl: fxdp.v1.JobService (proto/fxdp/v1/jobs.proto): runs
// submitted training jobs data-parallel on the registry's workers.
//
// Submit is a gRPC callback (reactor) method: each call gets a job thread,
// and the client's messages arrive asynchronously (read ahead up to
// read_ahead_bytes once the job runs), so the job thread waits for "a client
// message, a worker message or a cancellation" at once and never blocks on
// the client while a step's result waits to be reported. The job thread reads
// the spec, expands the graph (through the CompileService's cache: a graph
// the analysis refuses is INVALID_ARGUMENT naming the node) and queues the
// job (JobQueue: strict FIFO, bounded; nothing is read from the client while
// it waits). A dispatcher thread hands the head of the queue its world_size
// workers as soon as that many are IDLE and unreserved. The job thread then
// runs the job: a free rendezvous port, AssignJob to every rank, the client's
// initial state forwarded to every rank in chunks, the client's global
// batches taken at most `steps_ahead` steps ahead of the ranks' results,
// sliced along each INPUT's batch dim and sent to every rank as its own shard
// (or, for data_paths jobs, an empty Batch per step), one JobEvent per step
// from the ranks' StepResults, and finally FetchState{end_job} from rank 0
// (CancelJob ends the other ranks); the final state is kept in a StateStore
// bounded by max_state_bytes. A lost worker or a JobFailed fails the job naming the
// rank; the other ranks get CancelJob. A job's workers stay reserved until
// each confirms the job's end (JobEnded, JobFailed, or lost), or until the
// job's collective timeout plus release_grace_s have passed since it ended.
// The last max_finished_jobs finished jobs are remembered for Get/List.
// Thread-safe. Never includes LibTorch.
#ifndef FXDP_SERVER_JOB_SERVICE_H_
#define FXDP_SERVER_JOB_SERVICE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "proto/fxdp/v1/jobs.grpc.pb.h"
#include "server/compile_service.h"
#include "server/job_queue.h"
#include "server/state_store.h"
#include "server/worker_registry.h"

namespace fxdp::server {

// A TCP port free on 127.0.0.1 right now (bind port 0, read it, close); 0 on error.
int FreeLocalPort();

struct JobServiceOptions {
  // Chunk size of what the server sends workers (state, batches) and of
  // FetchState (unless the request asks for another).
  size_t chunk_bytes = size_t{1} << 20;
  // --max-queued-jobs: more queued jobs are RESOURCE_EXHAUSTED.
  size_t max_queued_jobs = 64;
  // --max-state-mb: bytes of final states kept for FetchState.
  uint64_t max_state_bytes = uint64_t{2048} << 20;
  // --max-finished-jobs: finished jobs remembered (older ones are forgotten).
  size_t max_finished_jobs = 1000;
  // Steps whose batches are sent before the earliest unfinished step's
  // results are in (>= 1).
  int steps_ahead = 2;
  // Client messages buffered per running job (the client's writes wait
  // beyond it).
  size_t read_ahead_bytes = size_t{4} << 20;
  // See the file comment: when an unconfirmed rank's worker is freed anyway.
  double release_grace_s = 10;
  // How often the dispatcher looks at the registry (it also wakes on job
  // ends and submissions).
  double dispatch_interval_s = 0.05;
  // --queue-grace-s: a queued job needing more workers than are registered
  // (not LOST) fails with FAILED_PRECONDITION once that has lasted this long
  // (the queue behind it moves on); a Submit asking for more than are
  // registered fails at once when the server has been up this long (workers
  // had time to attach).
  double queue_grace_s = 10;
  // --client-idle-s: a running job that waits on its client (for its initial
  // state, or for a batch with no step outstanding) fails after this long
  // without a message from it, freeing its workers.
  double client_idle_s = 60;
};

class JobServiceImpl final : public v1::JobService::WithCallbackMethod_Submit<v1::JobService::Service> {
 public:
  JobServiceImpl(CompileServiceImpl* compile, WorkerRegistry* registry, JobServiceOptions options = {});
  ~JobServiceImpl() override;

  grpc::ServerBidiReactor<v1::SubmitJobRequest, v1::JobEvent>* Submit(grpc::CallbackServerContext* context) override;
  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                      v1::JobInfo* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext* context, const v1::CancelJobRequest* request,
                         v1::JobInfo* response) override;
  grpc::Status FetchState(grpc::ServerContext* context, const v1::FetchJobStateRequest* request,
                          grpc::ServerWriter<v1::StateChunk>* writer) override;

  // Cancels every queued and running job (server shutdown).
  void CancelAll(const std::string& reason);

  struct Job;  // public for the .cc's helpers
  class Runner;
  class SubmitCall;

 private:
  // Queues the job: an id, a place in the queue (RESOURCE_EXHAUSTED when
  // full), the first QUEUED event.
  grpc::Status Enqueue(const std::shared_ptr<Job>& job, v1::JobEvent* first);
  // The job ended: history, and its workers' release.
  void Finished(const std::shared_ptr<Job>& job);
  // Keeps a succeeded job's final state (evicting older ones).
  void KeepState(const std::shared_ptr<Job>& job, std::shared_ptr<const StateStore::State> state);
  // The job named `id`, or NOT_FOUND.
  grpc::Status FindJob(const std::string& id, std::shared_ptr<Job>* job);
  void Wake();
  void DispatchLoop();
  // With mu_ held: frees the workers of ended jobs that confirmed (or timed
  // out), starts the jobs that fit, and updates the queued jobs' position
  // and message.
  void ReleaseLocked();
  void DispatchLocked();
  // Workers registered and not LOST.
  int RegisteredWorkers() const;
  // Why a job of `world` ranks cannot run on `registered` workers.
  std::string CannotRunMessage(int world, int registered) const;

  CompileServiceImpl* const compile_;
  WorkerRegistry* const registry_;
  const JobServiceOptions options_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Job>> jobs_;
  std::vector<std::string> order_;     // job ids, submission order
  std::deque<std::string> finished_;   // finished job ids, oldest first
  std::vector<std::shared_ptr<Job>> releasing_;  // ended jobs still holding workers
  JobQueue queue_;
  StateStore states_;
  int64_t next_id_ = 1;
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  bool stop_ = false;
  std::atomic<bool> wake_{false};
  std::condition_variable dispatch_cv_;
  std::thread dispatcher_;
};

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOB_SERVICE_H_
