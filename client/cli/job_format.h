// Formatting of JobService results shared by `fxdp run` (run_command.cc) and
// `fxdp jobs|job|cancel` (jobs_command.cc): state and status names, a job as
// JSON or text, a run's events as JSON lines, RPC errors as exit codes.
#ifndef FXDP_CLIENT_CLI_JOB_FORMAT_H_
#define FXDP_CLIENT_CLI_JOB_FORMAT_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>

#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "proto/fxdp/v1/graph.pb.h"
#include "proto/fxdp/v1/jobs.grpc.pb.h"
#include "proto/fxdp/v1/jobs.pb.h"

namespace fxdp::cli {

// "QUEUED", "RUNNING", ...; "UNKNOWN" for anything else.
std::string StateName(v1::JobState s);
// "INVALID_ARGUMENT", ...; "CODE_<n>" past the known codes.
std::string CodeName(grpc::StatusCode c);
// Prints a failed RPC of `cmd` to stderr, the one mapping of the CLI: a server
// that is unreachable (UNAVAILABLE, with how to start one when gRPC could not
// connect) or did not answer in time (DEADLINE_EXCEEDED) is named by its address,
// kExitIo; any other error with its code name, kExitInvalidInput.
int ReportRpcError(const std::string& cmd, const std::string& server, const grpc::Status& s);
// A job as `fxdp job --json` prints it.
nlohmann::ordered_json InfoJson(const v1::JobInfo& j);
// A job as `fxdp job` prints it, one "field value" line each.
std::string InfoText(const v1::JobInfo& j);
// An evaluation in one line: "step 4: loss=3.1 correct=14" (at most
// `max_metrics` metrics, then "...").
std::string EvalShort(const v1::EvalMetrics& e, int max_metrics);
// One JSON line on stdout, flushed.
void PrintLine(const nlohmann::ordered_json& o);
// A Submit event as `fxdp run --json` prints it (`steps`: the job's, 0 when open-ended).
nlohmann::ordered_json EventJson(const v1::JobEvent& e, int64_t steps);
// One step's global batch from the graph's INPUTs (as fxdp.progress's
// batch_counts): samples, the batch dim's size of the first INPUT with one;
// tokens, the element count of the first integer INPUT of 2+ dims with a
// batch dim (token ids), else 0; a size that varies per batch (a graph with
// symbolic sizes) is not known: 0, until StepCounts reads it from a step's
// shape.
struct BatchCounts {
  int64_t samples = 0, tokens = 0;
  std::string samples_input, tokens_input;  // the INPUTs counted ("": none)
  int samples_dim = -1;                     // samples_input's batch dim
};
BatchCounts CountBatch(const v1::GraphDef& graph);
// A step's counts: `graph`'s (CountBatch), or for a step of a graph with
// symbolic sizes those of its global batch shape `shape` (JobEvent.shape,
// "input_ids=8x60 labels=8x60").
BatchCounts StepCounts(const BatchCounts& graph, const std::string& shape);

// Steps per second over the last `window` steps seen (as fxdp.progress.StepRate),
// and the samples and tokens per second of those steps (each step's own).
class StepRate {
 public:
  explicit StepRate(size_t window = 20) : window_(window) {}
  struct Rates {
    double steps = -1;               // -1 until two steps were seen
    double samples = 0, tokens = 0;  // 0: a step's count is not known
  };
  // Records `step` done now with its batch's counts.
  Rates Add(int64_t step, const BatchCounts& counts = {});

 private:
  struct Seen {
    int64_t step, samples, tokens;
    std::chrono::steady_clock::time_point at;
  };
  const size_t window_;
  std::deque<Seen> seen_;
};

// fetch_command.cc: streams the state job `job_id` kept (FetchState) into
// `out` (safetensors) for `fxdp CMD`; its exit code.
int FetchStateToFile(v1::JobService::Stub* stub, const std::string& cmd, const std::string& server,
                     const std::string& job_id, const std::string& out, bool json);

}  // namespace fxdp::cli

#endif  // FXDP_CLIENT_CLI_JOB_FORMAT_H_
