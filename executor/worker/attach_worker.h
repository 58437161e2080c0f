// Internal to `fxdp-worker attach` (attach.h): the daemon's types, shared
// by its parts:
//   attach_session.cc  the attachment: connect, register, heartbeat,
//                      reconnect with backoff, shutdown
//   attach_routing.cc  the server's messages, routed to the job (main thread)
//   attach_job.cc      the job's thread: rendezvous, load, steps, state
//   attach.cc          `fxdp-worker attach`: flags, signals
//
// Threads:
//   main       connects, registers, reads the server's messages in order and
//              routes them (assembling state and batch tensors from chunks);
//              reconnects with backoff.
//   heartbeat  one per attachment: a Heartbeat every interval.
//   job        one per job: rendezvous, load, then one event at a time from
//              the job's queue (a batch, a state fetch, a cancel).
//   signals    waits for SIGTERM/SIGINT (self-pipe) and starts the shutdown.
// Writes to the stream are serialised by Session's mutex. Lock order: the
// worker's mu_ before an AssignedJob's mu; Session's mutex is a leaf.
#ifndef FXDP_EXECUTOR_WORKER_ATTACH_WORKER_H_
#define FXDP_EXECUTOR_WORKER_ATTACH_WORKER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "executor/communicator.h"
#include "executor/interpreter.h"
#include "executor/socket_abort.h"
#include "executor/step_runner.h"
#include "executor/timed_communicator.h"
#include "executor/worker/common.h"
#include "executor/worker/dataset.h"
#include "executor/worker/evaluation.h"
#include "executor/worker/named_outputs.h"
#include "executor/worker/wire_tensors.h"
#include "proto/fxdp/v1/worker.grpc.pb.h"
#include "proto/fxdp/v1/worker.pb.h"
#include "security/credentials.h"
#include "util/data_roots.h"
#include "util/log.h"

#ifndef FXDP_VERSION
#define FXDP_VERSION "unknown"
#endif

namespace fxdp::executor::attach {

using Clock = std::chrono::steady_clock;
using v1::ServerMessage;
using v1::WorkerMessage;

inline double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct AttachOptions {
  std::string server;
  std::string device = "cpu";
  std::string worker_id;
  int heartbeat_ms = 1000;
  int threads = 0;
  int max_message_mb = 1024;
  std::vector<std::string> data_roots;
  std::vector<std::string> data_excluded;  // --data-exclude
  // The roots opened once with the exclusions (util::DataRoots); null: none.
  std::shared_ptr<const util::DataRoots> data_roots_opened;
  int max_data_mb = 65536;
  int64_t memory_limit = 0;         // --memory-limit (executor/memory_limit.h); 0: none
  security::ChannelSecurity creds;  // --tls-ca, --tls-cert/--tls-key, --token-file
};

// One Attach stream. Writes from any thread; after Close() (or a failed
// write) every Write returns false.
class Session {
 public:
  using Stream = grpc::ClientReaderWriter<WorkerMessage, ServerMessage>;
  Session(std::unique_ptr<grpc::ClientContext> ctx, std::unique_ptr<v1::WorkerService::Stub>& stub)
      : ctx_(std::move(ctx)), stream_(stub->Attach(ctx_.get())) {}

  bool Write(const WorkerMessage& m) {
    std::lock_guard<std::mutex> l(mu_);
    if (closed_) return false;
    if (!stream_->Write(m)) closed_ = true;
    return !closed_;
  }
  // No more writes from this side (WritesDone).
  void Close() {
    std::lock_guard<std::mutex> l(mu_);
    if (closed_) return;
    closed_ = true;
    stream_->WritesDone();
  }
  bool Read(ServerMessage* m) { return stream_->Read(m); }
  grpc::Status Finish() { return stream_->Finish(); }
  void Cancel() { ctx_->TryCancel(); }

 private:
  std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<Stream> stream_;
  std::mutex mu_;
  bool closed_ = false;
};

// The most LoadGraph programs a job may keep besides AssignJob.graph
// (AssignJob.max_graphs above it is refused): bounds what a server's
// messages can make a worker hold (docs/shapes.md).
inline constexpr uint32_t kMaxLoadedGraphs = 64;

// What the main thread hands a job's thread: the initial state, a batch, a
// program to load, a state fetch, a cancel or an error. (Not the wire's
// v1::JobEvent, which the server streams to a client.)
struct JobTask {
  enum Kind { kState, kBatch, kLoadGraph, kFetch, kCancel, kError };
  explicit JobTask(Kind k) : kind(k) {}
  static JobTask Tensors(Kind k, TensorMap t, int64_t step = 0) {
    JobTask e(k);
    e.tensors = std::move(t);
    e.step = step;
    return e;
  }
  static JobTask Error(absl::Status s, int64_t step = 0) {
    JobTask e(kError);
    e.error = std::move(s);
    e.step = step;
    return e;
  }

  Kind kind;
  TensorMap tensors;                                            // kState, kBatch
  int64_t step = 0;                                             // kBatch
  std::vector<std::pair<std::string, double>> hyperparameters;  // kBatch: Batch.hyperparameters
  uint32_t graph_id = 0;                // kBatch: the program it runs; kLoadGraph: the new one
  uint32_t evict_graph_id = 0;          // kLoadGraph: dropped first (0: none)
  std::unique_ptr<v1::GraphDef> graph;  // kLoadGraph
  uint32_t chunk_bytes = 0;             // kFetch
  bool end_job = false;                 // kFetch
  std::string reason;                   // kCancel
  absl::Status error;  // kError; kLoadGraph: the router refused it (reported as the next step's)
};

// The job this worker was assigned: one rank of a server's job (the server's
// own record of the whole job is server/'s Job), with its queue of tasks and
// its progress.
struct AssignedJob {
  std::string id;
  int rank = 0;
  int world_size = 1;
  int64_t steps = 0;
  uint32_t num_state = 0;   // AssignJob.num_state_tensors
  uint32_t max_graphs = 0;  // AssignJob.max_graphs (<= kMaxLoadedGraphs)
  int batch_world = 1;      // a Batch tensor may hold this many ranks' rows (1: batches_sharded)
  v1::AssignJob assign;     // the graph included; the job thread's after the start
  Clock::time_point assigned_at;
  std::shared_ptr<Session> session;  // where its messages go

  // Queue (main thread -> job thread).
  std::mutex mu;
  std::condition_variable cv;
  std::deque<JobTask> events;
  std::atomic<bool> cancel{false};
  // The job's connections to its other ranks (the rendezvous store, then the
  // communicator's): a cancel or a failure shuts them down, so that a step
  // or a rendezvous blocked on a peer ends at once, not at the collective
  // timeout, and the communicator can be destroyed ([Aborting a job's
  // connections] in executor/socket_abort.h).
  ConnectionAborter connections;

  // The graph's named 0-d OTHER outputs (StepResult.outputs).
  NamedOutputs outputs;
  // Job thread: AssignJob.eval's program and batches (null: none), the bytes
  // of the data files the job holds (--max-data-mb), a resumed job's steps done.
  std::unique_ptr<Evaluation> eval;
  uint64_t data_bytes = 0;
  int64_t step_offset = 0;
  // The graph's non-persistent buffers (checkpoint_write.h's NonPersistentBuffers), which its
  // checkpoints mark so that `fxdp export` leaves them out.
  std::set<std::string> non_persistent;

  // Progress, for heartbeats and log lines.
  std::atomic<int64_t> steps_done{0};
  std::atomic<int64_t> log_step{0};  // the step in progress, else the last done
  std::atomic<bool> in_step{false};
  // Job thread: the job steps of the complete checkpoints this rank wrote
  // (AssignJob.checkpoints), oldest first; the oldest beyond `keep` go.
  std::deque<int64_t> checkpoints;
  // Set by whoever sends the job's final message (JobFailed or JobEnded).
  std::atomic<bool> final_sent{false};
  // Job thread: the JobEnded to send once the job's communicator is gone.
  std::optional<WorkerMessage> ending;

  // What the rank graph declares (set before any chunk is routed; the
  // assemblers check each tensor against it before allocating it).
  ir::DeclaredTensors declared_state, declared_batch;
  // Main thread only: tensors being assembled from chunks.
  TensorAssembler state_asm;
  bool state_done = false;
  TensorAssembler batch_asm;
  int64_t batch_step = 0;    // the step whose Batch messages are arriving (0: none)
  uint32_t batch_graph = 0;  // the graph_id that step's first message named
  // The LoadGraph programs as routed so far (the job thread loads them in
  // the same order): graph_id -> its INPUTs, which a Batch naming it is
  // assembled against (graph 0's are declared_batch).
  std::map<uint32_t, ir::DeclaredTensors> graph_batches;
  std::vector<std::pair<std::string, double>> batch_hyper;  // that step's hyper-parameters
  bool input_failed = false;  // an error was queued: later chunks are ignored

  void Push(JobTask e) {
    {
      std::lock_guard<std::mutex> l(mu);
      events.push_back(std::move(e));
    }
    cv.notify_all();
  }

  // "[job J rank R step S/K] ": the start of its log lines (util::Log).
  std::string Prefix() const { return util::JobLogPrefix(id, rank, log_step.load(), steps); }
  std::string StepName(int64_t s) const {
    return steps > 0 ? absl::StrCat(s, "/", steps) : absl::StrCat(s);
  }
  // The job thread's next event (blocks); a cancel jumps the queue.
  JobTask Next();
  // Main thread: the INPUTs of program `graph_id` as routed (null: not
  // held), and the ids held ("0, 3, 4").
  const ir::DeclaredTensors* DeclaredBatch(uint32_t graph_id) const;
  std::string GraphIds() const;
};

class AttachedWorker {
 public:
  explicit AttachedWorker(AttachOptions o) : o_(std::move(o)) {}

  // Serves until Shutdown or RequestShutdown; returns the exit code.
  int Serve();
  // From any thread (signals, the Shutdown message). Idempotent.
  void RequestShutdown(const std::string& why);

 private:
  // attach_session.cc: the attachment. Serve's steps: the worker's identity,
  // device, memory figure and threads (an exit code: 2 for a bad --device);
  // the channel (its reconnect backoff capped at ours, the credentials); the
  // attachments, reattaching with backoff until shutdown; then a short wait for
  // the job thread (the exit code).
  int SetUp();
  void Connect();
  void AttachUntilShutdown();
  int Stop();
  // One attachment: connect, register, read until the stream ends. Whether
  // the server accepted the registration; `status` says why it ended.
  bool ServeOnce(std::string* status);
  WorkerMessage MakeRegister();
  void HeartbeatLoop(std::shared_ptr<Session> session, int interval_ms);
  WorkerMessage MakeHeartbeat();

  // attach_routing.cc: the server's messages, on the main thread.
  void Handle(ServerMessage& m, const std::shared_ptr<Session>& session);
  void HandleAssign(v1::AssignJob& a, const std::shared_ptr<Session>& session);
  // The initial state's chunks, assembled; checked against
  // AssignJob.num_state_tensors when the last one comes.
  void HandleStateChunk(const v1::StateChunk& c);
  void HandleBatch(const v1::Batch& b);
  void HandleFetchState(const v1::FetchState& f);
  // Ends a blocked step or rendezvous at once (the job's connections shut down).
  void HandleCancel(const v1::CancelJob& c);
  // LoadGraph's bounds (graph_id, evict_graph_id, max_graphs), then the
  // program is queued for the job's thread.
  void HandleLoadGraph(v1::LoadGraph& lg);
  // The current job if it is `job_id` (else logs that the message is ignored).
  std::shared_ptr<AssignedJob> JobFor(const std::string& job_id, const char* what);

  // attach_job.cc: the job's thread.
  void JobThread(std::shared_ptr<AssignedJob> job);
  // The files `paths` (AssignJob.data_paths or eval.data_paths, named
  // `field` in errors), read and sliced to this rank's shard of `program`'s
  // inputs; `held`: the bytes the job's files hold (--max-data-mb), updated.
  using DataPaths = google::protobuf::RepeatedPtrField<std::string>;
  absl::StatusOr<std::vector<TensorMap>> ReadDataFiles(const AssignedJob& job,
                                                       const Program& program,
                                                       const DataPaths& paths, const char* field,
                                                       uint64_t* held) const;
  // `paths` whose only entry is a directory: that dataset (dataset.h), read
  // per step; nullopt for files. A directory among several entries is
  // INVALID_ARGUMENT. `step_offset`: a resumed job's steps done.
  absl::StatusOr<std::optional<DatasetReader>> OpenDataset(const AssignedJob& job,
                                                           const Program& program,
                                                           int64_t step_offset,
                                                           const DataPaths& paths,
                                                           const char* field = "data_paths") const;
  // attach_eval.cc: AssignJob.eval's program loaded (its collectives through
  // `comm`, the job's) and its batches read or opened, into job.eval.
  absl::Status SetUpEval(AssignedJob& job, const RankSetup& setup, Communicator* comm);
  // After run step `step`: when due, every evaluation batch run against the
  // runner's state, answered by an EvalResult.
  absl::Status MaybeEvaluate(AssignedJob& job, const StepRunner& runner, int64_t step);
  // AssignJob.initial_checkpoint read and filled into `state` (checkpoint_read.h).
  absl::Status AddCheckpointState(const AssignedJob& job, TensorMap* state) const;
  // Rendezvous, load, then the job's events until it ends (EndJob: OK) or
  // fails (the status). `comm` is the job's communicator: JobThread destroys
  // it (its connections shut down first unless rank 0 ended it cleanly),
  // then sends the JobEnded; a JobFailed goes before.
  absl::Status JobBody(AssignedJob& job, std::unique_ptr<Communicator>& comm);
  // The job's StepRunner over its initial state, announced by a JobStarted.
  // `dataset_shapes` (rank 0's, AssignJob.report_dataset_shapes) rides on it.
  absl::StatusOr<StepRunner> StartJob(AssignedJob& job, Program program, TensorMap state,
                                      const c10::Device& device, const std::string& comm_name,
                                      v1::DatasetShapes dataset_shapes = {});
  // A dataset's index entries' shapes for the server (DatasetReader::AllEntryShapes).
  absl::StatusOr<v1::DatasetShapes> ReportShapes(const AssignedJob& job, DatasetReader& dataset,
                                                 const Program& program) const;
  // One Batch event: shard, step, StepResult (with the program it names).
  absl::Status RunBatch(AssignedJob& job, JobTask& e, StepRunner& runner, TimedCommunicator& timed,
                        const std::vector<TensorMap>& files, DatasetReader* dataset);
  // A LoadGraph event: evict, decode, load, check against program 0 (the
  // state it shares, `first`: graph 0's SharedMetadata), add.
  absl::Status LoadGraph(AssignedJob& job, JobTask& e, StepRunner& runner, const RankSetup& setup,
                         TimedCommunicator& timed, const GraphMetadata& first);
  // attach_checkpoint.cc: after run step `step`, this rank's part of the
  // checkpoint AssignJob.checkpoints wants (none: OK), agreed on by every
  // rank (an all-reduce of whether each wrote its part), answered by
  // CheckpointWritten, the oldest beyond `keep` removed.
  absl::Status MaybeCheckpoint(AssignedJob& job, const StepRunner& runner, Communicator& comm,
                               int64_t step);
  // A FetchState event: the state in chunks, the last one marked.
  absl::Status StreamState(AssignedJob& job, const JobTask& e, const StepRunner& runner);
  // The job ended (cancelled or not): logged, and its JobEnded kept for
  // JobThread to send once the communicator is destroyed; OK.
  absl::Status EndJob(AssignedJob& job, bool cancelled, const std::string& why);
  // Sends the job's final message unless one was sent; frees the job slot
  // first, so a server that answers at once finds the worker IDLE.
  void FinishJob(AssignedJob& job, WorkerMessage final_msg);
  void SendJobFailed(AssignedJob& job, const absl::Status& s, int64_t step);

  std::string Prefix() const { return absl::StrCat("[worker ", worker_id_, "] "); }

  AttachOptions o_;
  std::string worker_id_;
  std::string hostname_;
  c10::Device device_{c10::kCPU};
  int64_t memory_bytes_ = 0;
  std::string memory_source_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;

  std::mutex mu_;
  std::condition_variable cv_;  // shutdown_, job_ changes
  bool shutdown_ = false;
  std::string shutdown_reason_;
  std::shared_ptr<Session> session_;  // the current attachment
  std::shared_ptr<AssignedJob> job_;  // the job held (capacity 1)
  std::thread job_thread_;
  int running_jobs_ = 0;  // job threads not yet returned

  // Heartbeat thread of the current attachment.
  std::mutex hb_mu_;
  std::condition_variable hb_cv_;
  bool hb_stop_ = false;

  std::string last_ignored_;  // main thread: the last job id whose messages were ignored
};

}  // namespace fxdp::executor::attach

#endif  // FXDP_EXECUTOR_WORKER_ATTACH_WORKER_H_
