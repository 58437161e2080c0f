// What the server tests share: an in-process fxdp-server (CompileService,
// WorkerService, JobService) on an ephemeral 127.0.0.1 port, and FakeWorker,
// a worker speaking proto/fxdp/v1/worker.proto without LibTorch: it records
// what the server sends it (AssignJob, state, each step's batch, LoadGraphs) and answers
// like fxdp-worker attach (JobStarted once the state is complete, a
// StepResult per step with loss = step, before it a CheckpointWritten when
// AssignJob.checkpoints makes one due, the initial state back on FetchState,
// JobEnded on end_job and CancelJob).
#ifndef FXDP_TESTS_SERVER_TEST_SERVER_H_
#define FXDP_TESTS_SERVER_TEST_SERVER_H_

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
#include "proto/fxdp/v1/jobs.grpc.pb.h"
#include "proto/fxdp/v1/worker.grpc.pb.h"
#include "security/server_auth.h"
#include "server/compile/compile_service.h"
#include "server/jobs/job_service.h"
#include "server/workers/worker_registry.h"

namespace fxdp::testing {

class TestServer {
 public:
  // `security` (security/server_auth.h): its credentials and CallAuth;
  // null: plain text without authentication. With TLS, channel() is null
  // (the test makes its own with the CA). `limits`: the compile service's.
  explicit TestServer(server::JobServiceOptions jobs = {},
                      server::WorkerRegistryOptions workers = {},
                      const security::ServerSecurity* security = nullptr,
                      server::CompileLimits limits = {});
  ~TestServer();

  const std::string& address() const { return address_; }
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  server::WorkerRegistry& registry() { return registry_; }
  // Compiles (cache misses) and cache hits so far (jobs expand through it).
  server::CompileCacheStats cache_stats() const { return compile_.cache_stats(); }
  std::unique_ptr<v1::JobService::Stub> jobs() const { return v1::JobService::NewStub(channel_); }
  std::unique_ptr<v1::WorkerService::Stub> workers() const {
    return v1::WorkerService::NewStub(channel_);
  }

 private:
  server::CompileServiceImpl compile_;
  server::WorkerRegistry registry_;
  server::JobServiceImpl job_service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
};

// Polls `pred` every 5 ms until it holds (true) or `timeout_s` passed (false).
bool WaitUntil(const std::function<bool()>& pred, double timeout_s = 5);

class FakeWorker {
 public:
  struct Tensor {
    v1::DType dtype = v1::DTYPE_UNSPECIFIED;
    std::vector<int64_t> shape;
    std::string data;
  };
  using Tensors = std::map<std::string, Tensor>;
  struct JobRecord {
    v1::AssignJob assign;  // without the graph
    Tensors state;
    std::map<int64_t, Tensors> batches;     // by step
    std::map<int64_t, int> batch_messages;  // Batch messages per step
    std::map<int64_t, std::map<std::string, double>>
        hyperparameters;         // Batch.hyperparameters by step
    size_t max_chunk_bytes = 0;  // largest TensorChunk data received
    bool cancelled = false;
    int fetches = 0;  // FetchState messages received
    // A job of several batch shapes: its LoadGraphs in order, each step's
    // Batch.graph_id, the LoadGraph programs held, and what broke the
    // protocol (a Batch naming a program not held, more than max_graphs).
    std::vector<v1::LoadGraph> loads;
    std::map<int64_t, uint32_t> graph_ids;
    std::vector<uint32_t> held_graphs;
    std::vector<std::string> errors;
  };

  FakeWorker(const std::string& address, std::string id, int heartbeat_ms = 50);
  // On `channel` (TLS), attaching with the join token `token`.
  FakeWorker(std::shared_ptr<grpc::Channel> channel, const std::string& token, std::string id,
             int heartbeat_ms = 50);
  ~FakeWorker();

  // Until the server answered Registered (true) or the stream ended (false).
  bool WaitRegistered(double timeout_s = 5);
  // Whether the Attach stream has ended (the server ended it, or Kill()).
  bool ended() const;
  grpc::Status status() const;
  // A hung worker: no more heartbeats (the stream stays open).
  void StopHeartbeats();
  // A dead worker: the stream is cancelled.
  void Kill();
  // Holds StepResults back until Release() (keeps a job running).
  void Hold();
  void Release();
  // Steps held back.
  size_t held() const;
  // Holds CheckpointWritten messages back until ReleaseCheckpoints() (its
  // checkpoints are never complete until then).
  void HoldCheckpoints();
  void ReleaseCheckpoints();
  // Answers step `step` of the next job with JobFailed(code, error).
  void FailAt(int64_t step, grpc::StatusCode code, std::string error);

  // What JobStarted reports when AssignJob.report_dataset_shapes asks.
  void SetDatasetShapes(v1::DatasetShapes shapes) {
    std::lock_guard<std::mutex> l(mu_);
    dataset_shapes_ = std::move(shapes);
  }

  std::vector<JobRecord> jobs() const;
  const std::string& id() const { return id_; }

 private:
  void Start();
  void Write(const v1::WorkerMessage& m);
  void ReadLoop();
  void HeartbeatLoop();
  void Handle(v1::ServerMessage& m);
  void AnswerStep(const v1::AssignJob& a, int64_t step);
  JobRecord* Current(const std::string& job_id);

  const std::string id_;
  const int heartbeat_ms_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::ServerMessage>> stream_;
  std::mutex write_mu_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool registered_ = false, ended_ = false, stop_ = false, heartbeats_ = true, hold_ = false;
  grpc::Status status_;
  std::string job_id_;  // the job held ("" when idle)
  std::vector<JobRecord> jobs_;
  std::vector<int64_t> held_;  // steps whose results are held back
  bool hold_checkpoints_ = false;
  std::vector<v1::WorkerMessage> held_checkpoints_;
  int64_t fail_step_ = 0;
  grpc::StatusCode fail_code_ = grpc::StatusCode::OK;
  std::string fail_error_;
  v1::DatasetShapes dataset_shapes_;
  std::thread reader_, heartbeat_;
};

}  // namespace fxdp::testing

#endif  // FXDP_TESTS_SERVER_TEST_SERVER_H_
