// Job: one submitted job's shared state: its checked spec and expansion, its
// JobInfo (what GetJob/ListJobs show), the messages waiting for its runner
// (the ranks' and the client's), cancellation, and its workers. JobClient:
// what the runner sees of the job's client (the Submit stream in the server,
// a test's in-process client in the unit tests). No gRPC here.
#ifndef FXDP_SERVER_JOBS_JOB_H_
#define FXDP_SERVER_JOBS_JOB_H_

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
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

struct Job {
  struct Msg {
    int rank = -1;
    bool lost = false;
    v1::WorkerMessage m;
  };
  // Set before the job is queued, then read-only.
  v1::JobSpec spec;  // without the graph
  v1::ExpandResponse expanded;
  std::vector<InputSpec> inputs;
  ir::PlaceholderNames placeholders;   // of the single-device graph
  ir::Schedule schedule;               // JobSpec.schedule, checked
  ir::DeclaredTensors declared_state;  // the state tensors the graph declares
  ir::DeclaredTensors declared_batch;  // its INPUTs
  JobOwner owner;                      // set by the Submit call before the job thread starts
  // With --state-dir, for a data_paths job: the spec as submitted (graph,
  // schedule) until the table recorded it, and its initial state (whole
  // tensors), taken before it is queued (or read back after a restart) and
  // forwarded to the ranks from here.
  v1::JobSpec submitted;
  std::vector<v1::TensorChunk> initial_state;
  bool has_initial_state = false;
  bool recovered = false;  // queued again after a server restart (by Recover): no client
  // Steps done before this run: a job resumed from its checkpoint runs steps
  // first_step + 1 ... JobSpec.steps (numbered 1 ... for its workers).
  int64_t first_step = 0;
  // A job resumed from another's checkpoint (JobSpec.resume_job): that job.
  std::string resumed_from;
  // The latest job whose resume of this one passed PrepareResume (job_resume.h;
  // guarded by its claim mutex, not mu): one resume of a job at a time.
  std::weak_ptr<Job> resumed_by;

  std::mutex mu;
  std::condition_variable cv;
  v1::JobInfo info;       // mu
  std::deque<Msg> inbox;  // mu: the ranks' messages
  // mu: the client's messages (with their sizes), and whether its stream
  // ended (half-closed, or a failed read) or the call was cancelled.
  std::deque<std::pair<v1::SubmitJobRequest, size_t>> from_client;
  bool client_ended = false, client_gone = false;
  bool cancel = false;                              // mu
  std::string cancel_reason;                        // mu
  bool dispatched = false;                          // mu; `workers` set
  std::vector<std::string> workers;                 // mu; rank order
  std::vector<bool> assigned, confirmed, released;  // mu; per rank
  std::vector<int64_t> handles;                     // the scheduler's mutex: worker subscriptions
  Clock::time_point release_at;  // the scheduler's mutex: free unconfirmed ranks then
  // The scheduler's mutex: since when the job (queued) has needed more
  // workers than are registered; unset while enough are.
  std::optional<Clock::time_point> unplaceable_since;

  // Changes the job's state (job_lifecycle.h: the one table of states and
  // changes), with `status` a terminal state's error; a change the table
  // does not allow is refused (FAILED_PRECONDITION naming both states,
  // logged) and the job keeps its state.
  absl::Status Change(JobChange change, const absl::Status& status = absl::OkStatus());
  // Asks a running job to stop; false when it ended or was asked already.
  bool Cancel(const std::string& reason);
  // An event of `state` carrying the job's id, step, workers (and queue place
  // or error; a resumed job's first_step).
  v1::JobEvent Event(v1::JobState state);
  std::string id();
  v1::JobInfo Info();  // a copy, under mu
  v1::JobState state();

  // From the client's side (the Submit reactor, tests): a message arrived,
  // the stream ended, the client went away.
  void FromClient(v1::SubmitJobRequest request, size_t bytes);
  void ClientEnded();
  void ClientGone();
};

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_JOB_H_
