// JobRunner: one job, on its own thread, from its client's first message to
// its end:
//   1. the spec (the first message): checked and expanded (job_spec.h);
//      with --state-dir, a data_paths job's initial state is taken too, so
//      that it can run again after a restart (job_recovery.h);
//   2. a place in the queue (JobScheduler), the first QUEUED event, then a
//      QUEUED event whenever its place or message changes, until the
//      scheduler gives it its workers (nothing is read from the client
//      meanwhile; a client that goes away cancels the queued job);
//   3. the run on its ranks (Dispatcher): each rank's state checked against
//      its worker's registered memory (server/jobs/memory_admission.h), a free
//      rendezvous port, AssignJob
//      to every rank, the client's initial state forwarded chunk by chunk to
//      every rank, every rank's JobStarted;
//   4. the steps: the client's global batches (read ahead up to
//      read_ahead_bytes) taken at most steps_ahead steps before the earliest
//      unfinished step's results are in, each rank sent its shard
//      (BatchSharder; a data_paths job gets a tensor-free Batch per step),
//      one RUNNING event per step from the ranks' StepResults, in order;
//      with --checkpoint-every the state after every K-th step; with
//      JobSpec.eval an EVAL event after every due step (job_runner_eval.cc);
//   5. the end: the final state (FetchState{end_job}) into the JobTable,
//      SUCCEEDED once it and the job's record are durable (with
//      --state-dir: written and synced; else FAILED naming the file, the
//      state kept in memory for FetchState).
// The state in 4 and 5 comes out of the ranks through a StateCollector
// (state_collector.h): REPLICATE asks rank 0 (the other ranks end by
// CancelJob), FULLY_SHARD every rank and reassembles the whole tensors. In 3
// a FULLY_SHARD rank gets only its flat shard of every sharded tensor
// (server/jobs/state_shards.h). Every change of the job's state goes through
// Job::Change (job_lifecycle.h).
// A lost worker or a JobFailed fails the job naming the rank (the other
// ranks get CancelJob); CancelJob or a client that goes away cancels it; a
// client that sends nothing for client_idle_s while the job waits on it
// fails it (DEADLINE_EXCEEDED); bad client input fails it INVALID_ARGUMENT
// naming what is wrong. Every outcome is an absl::Status (the gRPC layer maps
// it once). No gRPC here: the client is a JobClient, the workers a WorkerPool.
// job_runner.cc has phases 1-3, job_runner_state.cc the state transfers in,
// job_runner_steps.cc phase 4, job_runner_end.cc the ends (the final state,
// failures, cancels), job_runner_keep.cc the state an ended job keeps.
#ifndef FXDP_SERVER_JOBS_JOB_RUNNER_H_
#define FXDP_SERVER_JOBS_JOB_RUNNER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/jobs/batch_sharder.h"
#include "server/jobs/dataset_shapes.h"
#include "server/jobs/dispatcher.h"
#include "server/jobs/job.h"
#include "server/jobs/job_metrics.h"
#include "server/jobs/job_options.h"
#include "server/jobs/job_resume.h"
#include "server/jobs/job_scheduler.h"
#include "server/jobs/job_spec.h"
#include "server/jobs/job_store.h"
#include "server/jobs/job_table.h"
#include "server/jobs/shape_variants.h"
#include "server/jobs/state_collector.h"
#include "server/jobs/state_shards.h"
#include "server/workers/worker_pool.h"

namespace fxdp::server {

// What every runner of a service shares.
struct JobContext {
  JobServiceOptions options;
  Expander expand;
  WorkerPool* pool = nullptr;
  JobTable* table = nullptr;
  JobScheduler* scheduler = nullptr;
  JobStore* store = nullptr;  // --state-dir (null: in memory only)
  // Bytes of initial states held (JobServiceOptions::max_initial_state_bytes).
  std::atomic<uint64_t>* held_state_bytes = nullptr;
  JobCounters* counters = nullptr;  // --metrics-port (job_metrics.h); null: not counted
};

// Runs `job` for `client` to its end (see above); the job's Submit status. A
// job that got a place in the queue is recorded as finished in the table and
// handed to the scheduler for the release of its workers.
absl::Status RunJob(const JobContext& context, JobClient* client, std::shared_ptr<Job> job);

class JobRunner {
 public:
  JobRunner(const JobContext& context, JobClient* client, std::shared_ptr<Job> job)
      : ctx_(context), client_(client), job_(std::move(job)) {}

  // Everything from the spec to the end.
  absl::Status Serve();
  // Whether the job got a place in the queue (and so in the table).
  bool queued() const { return queued_; }
  // Drops the initial state held for the job (--state-dir) and gives back
  // its reservation (JobServiceOptions::max_initial_state_bytes).
  void ReleaseHeldState();

 private:
  using Got = Job::Got;

  // The next of: a rank's message (first), with `want_client` the client's
  // next message or the end of its stream, a cancellation (CancelJob, or
  // with `watch_client` the client went away); kTimeout after timeout_s.
  Got Next(bool want_client, bool watch_client, double timeout_s, Job::Msg* worker,
           v1::SubmitJobRequest* client = nullptr);
  absl::Status ReadSpec(v1::SubmitJobRequest* first);
  absl::Status TakeSpec();
  // With --state-dir, once queued: a resume's checkpoint shared as its own,
  // or a data_paths job's initial state recorded (to run after a restart).
  void RecordStart();
  void LogSubmitted();  // and audit-logged
  // A resume (JobSpec.resume_job, checked): the job starts from the
  // checkpoint's state, step and losses.
  void StartFromCheckpoint(JobPlan plan, ResumeStart start);
  absl::Status TakeInitialState();
  // What the graph declares against the server's limits (a step's batch;
  // the state to hold), before anything of it is read: RESOURCE_EXHAUSTED
  // naming the bytes, the limit and its flag.
  absl::Status CheckDeclaredSizes(const v1::JobSpec& spec, const ir::DeclaredTensors& state,
                                  const ir::DeclaredTensors& batch, bool hold_state);
  // JobSpec.num_state_tensors against the graph's state tensors, before the
  // client's state is read.
  absl::Status CheckStateCount() const;
  bool WaitInQueue(absl::Status* status);
  absl::Status Run();
  // Every rank's state fits its worker's memory (server/jobs/memory_admission.h).
  absl::Status CheckMemory();
  absl::Status Assign();
  absl::Status ForwardState();
  absl::Status AwaitStarted();
  // The steps (job_runner_steps.cc): batches fed ahead of the results
  // (a data_paths job's from its files, SendFileStep; a streamed one's as
  // the client's arrive, OnBatch and OnClientEnd), the ranks' messages
  // (OnStepMessage: results, in order, and checkpoint chunks for state_).
  absl::Status Steps();
  absl::Status SendFileStep();
  absl::Status OnBatch(const v1::SubmitJobRequest& req);
  absl::Status OnClientEnd();
  // Run step `step`'s batch to every rank: its shape's program (a graph
  // with symbolic sizes: compiled on a miss, LoadGraph to the ranks that
  // lack it), each rank its rows; `*shape` the step's shape ("": static).
  absl::Status SendStep(int64_t step, std::string* shape);
  // A graph with symbolic sizes: the program of the step's batch shape
  // (ShapeVariants), a batch its guards refuse failing the step; a newly
  // compiled one checked against the workers' memory.
  absl::Status StepVariant(int64_t step, const ir::InputShapes& shapes, const std::string& what,
                           ShapeVariant* variant);
  // Every rank that lacks `variant`'s program is sent it (LoadGraph).
  absl::Status LoadPrograms(const ShapeVariant& variant);
  // A symbolic data_paths job: rank 0's JobStarted.dataset_shapes checked
  // (dataset_shapes.h) into data_shapes_.
  absl::Status TakeDatasetShapes(const v1::DatasetShapes& report);
  // --checkpoint-every: after run step sent_ the ranks are asked for their state.
  absl::Status MaybeCheckpoint();
  absl::Status OnStepMessage(Job::Msg& msg);
  // A rank's StepResult: recorded, and the steps whose results are all in reported.
  void OnStepResult(const Job::Msg& msg);
  // JobSpec.checkpoints: a rank's CheckpointWritten counted; once every
  // rank's for a step is in, the checkpoint is complete (JobInfo.
  // checkpoint_step and checkpoint_path). AwaitLastCheckpoint: at the end,
  // until the checkpoint of the last step (when one is due) is complete, or
  // a rank fails.
  void OnCheckpointWritten(const Job::Msg& msg);
  absl::Status AwaitLastCheckpoint();
  void StepDone(int64_t step, const std::vector<v1::StepResult>& results, const std::string& shape);
  // --checkpoint-every: records the state after job step `step` once that
  // step's loss is recorded too (rank 0's state can arrive before the other
  // ranks' results of the step), so the store never holds a checkpoint newer
  // than its losses; until then it waits in deferred_checkpoints_.
  void SaveCheckpoint(int64_t step, StateStore::State state);
  void WriteCheckpoint(int64_t step, const StateStore::State& state);
  // JobSpec.eval (job_runner_eval.cc): whether the ranks evaluate after run
  // step `run_step`; StepSent counts run step sent_'s evaluation as due;
  // rank 0's EvalResult checked and recorded, reported (ReportEvals) once
  // the event of the step it evaluated is sent.
  bool EvalDueAfter(int64_t run_step) const;
  void StepSent();
  absl::Status OnEvalResult(const Job::Msg& msg);
  void ReportEvals();
  absl::Status End();
  // The final state in: SUCCEEDED once it and the job's record are durable
  // (JobTable::Succeed), else FAILED naming what could not be saved. Null:
  // the final state is the workers' checkpoint of the last step, which the
  // server does not collect (JobSpec.checkpoints; FetchState names it).
  absl::Status Succeeded(std::shared_ptr<StateStore::State> state);
  // The workers wrote the checkpoint of the last step: the ranks are ended by
  // CancelJob, and the job SUCCEEDS without a state once every rank answered
  // JobEnded (each removed its checkpoints past `keep` before it did).
  absl::Status SucceedOnTheWorkers();
  // FULLY_SHARD (the expansion's sharded_state): a piece of the initial state
  // split into the ranks' shards (`held`: each rank's latest piece, sent
  // with the next one, or with `last` once the state is `complete`).
  absl::Status SendShards(const StateSplitter& splitter, const v1::TensorChunk& chunk,
                          bool complete, std::vector<std::optional<v1::TensorChunk>>* held);

  // Ends the job: during the steps the state of its last completed step kept
  // (KeepLastState) when the change keeps it (job_lifecycle.h), CancelJob to
  // every assigned rank but `except`, the change (kFail or kCancel), the last
  // event; returns `status` saying what state was kept.
  absl::Status Finish(JobChange change, const absl::Status& status, int except);
  absl::Status Cancelled();
  // job_runner_keep.cc: the state of the last completed step kept (collected
  // from the ranks unless rank `except` failed or was lost; else the last
  // checkpoint): `status` with what was kept, or why nothing was, said.
  absl::Status KeepLastState(const absl::Status& status, int except);
  // Every step sent finished, then the state after the last one collected
  // (job step `*step`), within --keep-state-s.
  absl::Status CollectLastState(int64_t* step, StateStore::State* state);
  // A job whose workers write its checkpoints (JobSpec.checkpoints), its
  // ranks alive: the steps sent finish and the checkpoint due after the last
  // of them is complete (within --keep-state-s), so the checkpoint named is
  // the newest the workers keep; none of the state comes to the server.
  absl::Status AwaitSentCheckpoints();
  // UNAVAILABLE: rank msg.rank was lost or failed while it finished `step`.
  absl::Status RankEnded(const Job::Msg& msg, int64_t step) const;
  // The ranks' results already delivered, recorded.
  void TakeDelivered();
  absl::Status KeptSaid(const absl::Status& status, const std::string& kept) const;
  // Seconds left of client_idle_s counted from `from`.
  double ClientIdleLeft(Clock::time_point from) const;
  absl::Status ClientIdle(absl::string_view waiting_for);
  absl::Status BadInput(absl::string_view error);
  // Fails the job with `status`'s code and message (prefixed with the job).
  absl::Status BadInput(const absl::Status& status);
  std::string LostError(int rank) const;
  absl::Status Lost(int rank);
  absl::Status Failed(const Job::Msg& msg);
  absl::Status OnWorker(const Job::Msg& msg);
  absl::Status SendAll(const v1::ServerMessage& m);

  const JobContext& ctx_;
  JobClient* const client_;
  const std::shared_ptr<Job> job_;
  std::unique_ptr<Dispatcher> ranks_;
  std::unique_ptr<BatchSharder> sharder_;
  // A graph with symbolic sizes: its programs per batch shape and which of
  // them each rank holds (null: a static graph).
  std::unique_ptr<ShapeVariants> variants_;
  std::unique_ptr<RankPrograms> programs_;
  // A symbolic job reading a dataset directory: each step's shape (rank 0's
  // report); null: streamed, or files of graph 0's shape.
  std::unique_ptr<DatasetStepShapes> data_shapes_;
  std::unique_ptr<StateCollector> state_;  // checkpoints and the final state out of the ranks
  bool queued_ = false;
  std::string id_;
  int world_ = 0;
  int started_ = 0;    // ranks that sent JobStarted
  int64_t steps_ = 0;  // 0: until the client half-closes; this run's steps
  int64_t first_ = 0;  // steps done before this run (the plan's first_step)
  std::deque<std::pair<int64_t, StateStore::State>> deferred_checkpoints_;  // oldest first
  // The steps sent (run steps 1 ... sent_) whose results are not all in, oldest first.
  struct PendingStep {
    int64_t step;
    std::vector<v1::StepResult> results;  // per rank
    int got = 0;
    std::string shape;  // JobEvent.shape
  };
  std::deque<PendingStep> pending_;
  std::map<int64_t, std::set<int>> checkpoint_ranks_;  // job step -> ranks that wrote theirs
  int64_t last_checkpoint_ = 0;                        // the newest complete one's job step
  int64_t sent_ = 0;
  int64_t evals_due_ = 0, evals_got_ = 0;  // JobSpec.eval: of the steps sent, rank 0's results in
  std::deque<v1::EvalMetrics> evals_waiting_;  // for their step's event, oldest first
  bool client_done_ = false;                   // an open-ended job's client half-closed
  bool stepping_ = false;                      // in Steps(): an end keeps the last step's state
  bool final_asked_ = false;    // End asked for the final state: a cancel waits for it
  uint64_t held_reserved_ = 0;  // of ctx_.held_state_bytes
};

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_JOB_RUNNER_H_
