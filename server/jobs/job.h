// Job: one submitted job, its plan apart from its progress, behind one lock
// discipline (below); its state changes in job_lifecycle.h. JobClient:
// what the runner sees of the job's client (the Submit stream in the server,
// a test's in-process client in the unit tests). No gRPC here.
#ifndef FXDP_SERVER_JOBS_JOB_H_
#define FXDP_SERVER_JOBS_JOB_H_

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "analysis/ir/declared_tensors.h"
#include "analysis/ir/hyperparameters.h"
#include "proto/fxdp/v1/compile.pb.h"
#include "proto/fxdp/v1/jobs.pb.h"
#include "proto/fxdp/v1/worker.pb.h"
#include "server/jobs/job_lifecycle.h"
#include "server/jobs/job_spec.h"

namespace fxdp::server {

using Clock = std::chrono::steady_clock;

int64_t UnixMs();
Clock::duration Seconds(double s);

// The job's client, from the runner's side. Thread-safe.
class JobClient {
 public:
  virtual ~JobClient() = default;
  // Sends the client an event (in order; dropped once the client is gone).
  virtual void Write(v1::JobEvent event) = 0;
  // Reads continue while fewer than `bytes` are buffered in the job's
  // from_client (0: no new read).
  virtual void SetReadBudget(size_t bytes) = 0;
  // The runner took a message of `bytes` from the job's from_client.
  virtual void Consumed(size_t bytes) = 0;
};

// Who submitted a job: the authenticated identity (empty without
// authentication), how the audit log names it, and the peer address; whether
// the server authenticated it and as an admin (who may act on any job).
struct JobOwner {
  std::string identity, description = "-", peer;
  bool authenticated = false, admin = false;
};

// What a job is to do, fixed before it is queued (Job::SetPlan, by its
// runner or by Recover), then read by every thread without a lock.
struct JobPlan {
  v1::JobSpec spec;             // without the graph
  v1::ExpandResponse expanded;  // graph 0 (a symbolic graph's at its traced example's shapes)
  // A graph with symbolic sizes (PreparedSpec): its ExpandRequest, the traced
  // example's shapes and their compile time; null for a static graph.
  std::shared_ptr<const v1::ExpandRequest> symbolic;
  ir::InputShapes example;
  double compile_ms = 0;
  std::vector<InputSpec> inputs;
  ir::PlaceholderNames placeholders;   // of the single-device graph
  ir::Schedule schedule;               // JobSpec.schedule, checked
  ir::DeclaredTensors declared_state;  // the state tensors the graph declares
  ir::DeclaredTensors declared_sent;   // of those, the ones the client sends (initial_checkpoint)
  ir::DeclaredTensors declared_batch;  // its INPUTs
  v1::ExpandResponse eval;             // JobSpec.eval's graph, expanded (empty: none)
  // Steps done before this run: a job resumed from a checkpoint runs steps
  // first_step + 1 ... JobSpec.steps (numbered 1 ... for its workers).
  int64_t first_step = 0;
  // A job resumed from another's checkpoint (JobSpec.resume_job): that job.
  std::string resumed_from;
  bool recovered = false;  // queued again after a server restart (Recover): no client
};

// A prepared spec (job_spec.h) as a plan: first_step 0, not resumed or recovered.
JobPlan PlanOf(PreparedSpec p);

// A job: its owner and plan (read-only once it is queued) apart from its
// progress, which callers ask it to change and never set: its state (Change:
// the lifecycle table of job_lifecycle.h, nothing else sets JobInfo.state),
// its record (JobInfo: what GetJob/ListJobs show), the messages waiting for
// its runner (the ranks' and the client's), cancellation, and its ranks'
// workers.
//
// Lock discipline, the one for every job:
//   - owner() and plan() take no lock: the owner is set at construction, the
//     plan once before the job is queued (a queued job's plan never changes);
//   - everything else is behind the job's own mutex, taken only inside these
//     methods and never held while calling out, so a job's lock is always the
//     innermost: the scheduler (its mutex) and the table (its mutex) call a
//     job's methods while holding theirs, never the other way round;
//   - the held initial state and the submitted spec belong to the thread that
//     prepares the job (its runner, or Recover before the runner starts);
//   - resumed_by is guarded by job_resume.cc's claim mutex.
// What one subsystem keeps about a job (the scheduler's worker subscriptions
// and release time) it keeps itself, by job.
class Job {
 public:
  struct Msg {
    int rank = -1;
    bool lost = false;
    v1::WorkerMessage m;
  };
  // What a runner waiting on its job got (Next).
  enum class Got { kWorker, kClient, kClientEnd, kCancel, kTimeout };

  // A new job of `owner`; after a restart (Recover) one with its `recorded` info.
  explicit Job(JobOwner owner = {}, v1::JobInfo recorded = {})
      : owner_(std::move(owner)), info_(std::move(recorded)) {}
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  const JobOwner& owner() const { return owner_; }
  const JobPlan& plan() const { return plan_; }
  // Once, before the job is queued.
  void SetPlan(JobPlan plan) { plan_ = std::move(plan); }

  // Before it is queued, the preparing thread's: with --state-dir the spec as
  // submitted (graph, schedule), until the table recorded it (TakeSubmitted);
  // the initial state (whole tensors) taken before the job is queued (or a
  // checkpoint's, or read back after a restart), forwarded to the ranks.
  void SetSubmitted(v1::JobSpec spec) { submitted_ = std::move(spec); }
  v1::JobSpec TakeSubmitted() { return std::move(submitted_); }
  void HoldInitialState(std::vector<v1::TensorChunk> state);
  bool has_initial_state() const { return has_initial_state_; }
  const std::vector<v1::TensorChunk>& initial_state() const { return initial_state_; }
  std::vector<v1::TensorChunk> TakeInitialState();  // has_initial_state stays true
  void DropInitialState();                          // frees it

  // The latest job whose resume of this one passed PrepareResume
  // (job_resume.h; under its claim mutex): one resume of a job at a time.
  std::shared_ptr<Job> resumed_by() const { return resumed_by_.lock(); }
  void set_resumed_by(const std::shared_ptr<Job>& job) { resumed_by_ = job; }

  // Its record.
  std::string id() const;
  v1::JobState state() const;
  v1::JobInfo Info() const;  // a copy
  // Changes the job's state (job_lifecycle.h: the one table of states and
  // changes), with `status` a terminal state's error; a change the table
  // does not allow is refused (FAILED_PRECONDITION naming both states,
  // logged) and the job keeps its state.
  absl::Status Change(JobChange change, const absl::Status& status = absl::OkStatus());
  // JobTable::Add: the job is QUEUED as `id`, its record filled from its
  // plan and owner (name, world size, steps, data paths, times,
  // hyper-parameter names).
  absl::Status Queue(const std::string& id);
  // The scheduler: its place in the queue and why it waits; true when either changed.
  bool SetQueuePlace(int position, const std::string& message);
  // The runner's progress: a resume's start (the checkpoint's job, step,
  // losses and evaluations), a step done with its loss, an open-ended job's step count, the
  // latest checkpoint's step.
  void StartAt(const std::string& resumed_from, int64_t step, const std::vector<double>& losses,
               const std::vector<v1::EvalMetrics>& evals);
  void StepDone(int64_t step, double loss);
  int64_t steps_done() const;
  void SetSteps(int64_t steps);
  // The state the server kept (--checkpoint-every, a failed job's last
  // step): checkpoint_path cleared. A complete checkpoint the workers wrote
  // (JobSpec.checkpoints): its step and directory.
  void SetCheckpointStep(int64_t step);
  void SetWorkerCheckpoint(int64_t step, const std::string& path);
  // JobSpec.eval: an evaluation of the state after its step (JobInfo.evals).
  void AddEval(const v1::EvalMetrics& eval);
  // A graph with symbolic sizes: the shapes compiled so far (JobInfo.shapes).
  void SetShapes(const std::vector<v1::CompiledShape>& shapes);
  // The table: whether its final state is kept (for FetchState); evicted.
  void SetHasState(bool kept);
  void StateEvicted();
  // An event of `state` carrying the job's id, step, workers (and queue place
  // or error; a resumed job's first_step).
  v1::JobEvent Event(v1::JobState state);

  // Cancellation: asks a running job to stop; false when it ended or was
  // asked already. CancelQueued: the scheduler's, as it ends a queued job.
  bool Cancel(const std::string& reason);
  void CancelQueued(const std::string& reason);
  bool cancel_requested() const;
  std::string cancel_reason() const;
  // A job whose client went away is cancelled ("the client of Submit went away").
  void CancelIfClientGone();

  // From the client's side (the Submit reactor, tests): a message arrived,
  // the stream ended, the client went away.
  void FromClient(v1::SubmitJobRequest request, size_t bytes);
  void ClientEnded();
  void ClientGone();

  // Its ranks. The scheduler dispatches it to `workers` (rank order); the
  // dispatcher marks a rank assigned before sending it AssignJob and
  // delivers the ranks' messages (a rank's end, JobEnded, JobFailed or lost,
  // confirms it, for the release of its worker).
  void Dispatch(std::vector<std::string> workers);
  bool dispatched() const;
  std::vector<std::string> workers() const;
  void MarkAssigned(int rank);
  bool assigned(int rank) const;
  void FromRank(Msg msg);
  // The scheduler's release of an ended job's workers: `release` is called
  // for every rank not yet released that confirmed its end, was never
  // assigned, or (with `timed_out`) did not confirm (`unconfirmed`); true
  // once every rank is released (its undelivered messages are dropped).
  bool ReleaseRanks(
      bool timed_out,
      const std::function<void(int rank, const std::string& worker, bool unconfirmed)>& release);

  // The runner's waits. Next: a rank's message (first), with `want_client`
  // the client's next message (its size in `consumed`) or the end of its
  // stream, a cancellation (with `watch_client` a client that went away
  // cancels the job); kTimeout at `deadline` (checked every 100 ms).
  Got Next(bool want_client, bool watch_client, Clock::time_point deadline, Msg* worker,
           v1::SubmitJobRequest* client, size_t* consumed);
  // A rank's message only, whether or not the job was cancelled (its ranks'
  // last messages as it ends); false at `deadline`.
  bool NextRank(Clock::time_point deadline, Msg* worker);
  // While queued, up to `wait`: whether it was dispatched, its place or
  // message changed from `*position`, `*message` (updated), its client went
  // away, or it ended (then `ended` is its error).
  struct QueueWatch {
    bool dispatched = false, changed = false, client_gone = false;
    absl::Status ended;
  };
  QueueWatch WatchQueued(int* position, std::string* message, Clock::duration wait);
  // CancelJob: its record once it ended, or after `wait`.
  v1::JobInfo WaitEnded(Clock::duration wait);

 private:
  const JobOwner owner_;
  JobPlan plan_;
  v1::JobSpec submitted_;
  std::vector<v1::TensorChunk> initial_state_;
  bool has_initial_state_ = false;
  std::weak_ptr<Job> resumed_by_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  v1::JobInfo info_;
  std::deque<Msg> inbox_;  // the ranks' messages
  // The client's messages (with their sizes), and whether its stream ended
  // (half-closed, or a failed read) or the call was cancelled.
  std::deque<std::pair<v1::SubmitJobRequest, size_t>> from_client_;
  bool client_ended_ = false, client_gone_ = false;
  bool cancel_ = false;
  std::string cancel_reason_;
  bool dispatched_ = false;                            // workers_ set
  std::vector<std::string> workers_;                   // rank order
  std::vector<bool> assigned_, confirmed_, released_;  // per rank
};

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_JOB_H_
