// JobServiceImpl: fxdp.v1.JobService (proto/fxdp/v1/jobs.proto), the gRPC
// layer over the job service's parts, none of which includes gRPC:
//   job.h            one job: its plan, its progress, the lock discipline
//   job_lifecycle.h  every state and every change of state, one table
//   job_runner.h     one job from its spec to its end (a thread per job)
//   state_collector.h  checkpoints and the final state out of the ranks
//   job_spec.h       spec validation, schedule, expansion
//   job_scheduler.h  the FIFO queue, dispatch to idle workers, releases
//   dispatcher.h     messages between a job and its ranks
//   batch_sharder.h  a step's global batch sliced into each rank's shard
//   job_table.h      the jobs by id, the finished history, final states
//   job_store.h      --state-dir: the jobs in SQLite, states as files
//   job_recovery.h   --state-dir: the recorded jobs after a restart
// Submit is a gRPC callback (reactor) method (submit_call.h): each call gets
// a job thread running RunJob; FetchState too (fetch_call.h: a chunk at a
// time, no thread); GetJob, ListJobs and CancelJob read the table. absl::Status from the parts is
// mapped to grpc::Status here (ToGrpcStatus, the one mapping of the server). Thread-safe. Never
// includes LibTorch.
#ifndef FXDP_SERVER_JOBS_JOB_SERVICE_H_
#define FXDP_SERVER_JOBS_JOB_SERVICE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "proto/fxdp/v1/jobs.grpc.pb.h"
#include "security/call_auth.h"
#include "server/compile/compile_service.h"
#include "server/jobs/dispatcher.h"
#include "server/jobs/identity_quota.h"
#include "server/jobs/job_options.h"
#include "server/jobs/job_recovery.h"
#include "server/jobs/job_runner.h"
#include "server/jobs/job_scheduler.h"
#include "server/jobs/job_store.h"
#include "server/jobs/job_table.h"
#include "server/workers/worker_pool.h"

namespace fxdp::server {

class JobServiceImpl final
    : public v1::JobService::WithCallbackMethod_FetchState<
          v1::JobService::WithCallbackMethod_Submit<v1::JobService::Service>> {
 public:
  // `store` (--state-dir; null: in memory only) outlives the service.
  // `auth`: who may call (call_auth.h); null: the server does not authenticate.
  JobServiceImpl(CompileServiceImpl* compile, WorkerPool* workers, JobServiceOptions options = {},
                 JobStore* store = nullptr, std::shared_ptr<security::CallAuth> auth = nullptr);
  // Cancels the jobs still running (CancelAll) and waits for the ones queued
  // again after a restart.
  ~JobServiceImpl() override;

  // With a store: the recorded jobs back in the table after a restart
  // (job_recovery.h), the data_paths jobs that were queued queued again.
  // Call once, before serving.
  absl::Status Recover();

  grpc::ServerBidiReactor<v1::SubmitJobRequest, v1::JobEvent>* Submit(
      grpc::CallbackServerContext* context) override;
  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                      v1::JobInfo* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext* context, const v1::CancelJobRequest* request,
                         v1::JobInfo* response) override;
  // The state is written a chunk at a time (fetch_call.h); over
  // --max-fetch-streams (or its per-identity limit) RESOURCE_EXHAUSTED.
  grpc::ServerWriteReactor<v1::StateChunk>* FetchState(
      grpc::CallbackServerContext* context, const v1::FetchJobStateRequest* request) override;

  // Cancels every queued and running job (server shutdown).
  void CancelAll(const std::string& reason);
  // The identity that owns job `id` ("" when unknown or unauthenticated),
  // for ListWorkers (WorkerRegistry::SetJobOwners).
  std::string OwnerOf(const std::string& id) const;
  // The Prometheus text of --metrics-port (job_metrics.h).
  std::string Metrics() const;

 private:
  const std::shared_ptr<security::CallAuth> auth_;
  JobTable table_;
  JobScheduler scheduler_;
  JobContext context_;
  NoClient no_client_;
  std::vector<std::thread> recovered_;  // runners of the jobs queued again
  IdentityQuota submit_streams_;        // SubmitCalls alive (--max-submit-streams, per identity)
  IdentityQuota fetch_streams_;         // FetchCalls alive (--max-fetch-streams, per identity)
  std::atomic<uint64_t> held_state_bytes_{0};  // initial states held (--max-initial-state-mb)
  std::atomic<int64_t> refused_submits_{0};
  JobCounters counters_;
};

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_JOB_SERVICE_H_
