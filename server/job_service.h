// JobServiceImpl: fxdp.v1.JobService (proto/fxdp/v1/jobs.proto): runs a
// submitted training job data-parallel on the registry's IDLE workers.
//
// Submit runs the whole job on its RPC's thread: expand (through the
// CompileService's cache), reserve world_size IDLE workers (RESOURCE_EXHAUSTED
// when too few), pick a free rendezvous port, AssignJob + initial state to
// every rank, then step by step the global batch to every rank (each worker
// takes its balanced slice) and one JobEvent per step from the StepResults;
// finally FetchState{end_job} from rank 0 (CancelJob ends the other ranks).
// A lost worker or a JobFailed fails the job naming the rank; the other ranks
// get CancelJob. Thread-safe. Never includes LibTorch.
#ifndef FXDP_SERVER_JOB_SERVICE_H_
#define FXDP_SERVER_JOB_SERVICE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "proto/fxdp/v1/jobs.grpc.pb.h"
#include "server/compile_service.h"
#include "server/worker_registry.h"

namespace fxdp::server {

// Splits a tensor chunk's raw bytes into chunks of at most `max_bytes` data
// bytes (offsets adjusted; an empty chunk stays one chunk) appended to `out`.
void RechunkTensor(const v1::TensorChunk& in, size_t max_bytes, std::vector<v1::TensorChunk>* out);

// A TCP port free on 127.0.0.1 right now (bind port 0, read it, close); 0 on error.
int FreeLocalPort();

struct JobServiceOptions {
  // Chunk size of the initial state sent to workers and of FetchState.
  size_t chunk_bytes = size_t{1} << 20;
  // How long to wait for the ranks' JobEnded after the state was fetched.
  double end_wait_s = 10;
};

class JobServiceImpl final : public v1::JobService::Service {
 public:
  JobServiceImpl(CompileServiceImpl* compile, WorkerRegistry* registry, JobServiceOptions options = {});
  ~JobServiceImpl() override;

  grpc::Status Submit(grpc::ServerContext* context, const v1::SubmitJobRequest* request,
                      grpc::ServerWriter<v1::JobEvent>* writer) override;
  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                      v1::JobInfo* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext* context, const v1::CancelJobRequest* request,
                         v1::JobInfo* response) override;
  grpc::Status FetchState(grpc::ServerContext* context, const v1::FetchJobStateRequest* request,
                          grpc::ServerWriter<v1::StateChunk>* writer) override;

  // Cancels every running job (server shutdown).
  void CancelAll(const std::string& reason);

  struct Job;  // public for the .cc's helpers

 private:
  grpc::Status Run(grpc::ServerContext* context, const std::shared_ptr<Job>& job,
                   const v1::SubmitJobRequest& request, const v1::ExpandResponse& expanded,
                   grpc::ServerWriter<v1::JobEvent>* writer);
  void Release(const std::vector<std::string>& workers);
  // The job named `id`, or NOT_FOUND.
  grpc::Status FindJob(const std::string& id, std::shared_ptr<Job>* job);

  CompileServiceImpl* const compile_;
  WorkerRegistry* const registry_;
  const JobServiceOptions options_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Job>> jobs_;
  std::vector<std::string> order_;    // job ids, submission order
  std::set<std::string> reserved_;    // workers held by a job of ours
  int64_t next_id_ = 1;
};

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOB_SERVICE_H_
