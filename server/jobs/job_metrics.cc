#include "server/jobs/job_metrics.h"

#include <cstring>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace fxdp::server {
namespace {

void Head(std::string* out, const char* name, const char* type, const char* help) {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

// "JOB_STATE_RUNNING" -> "running".
std::string Lower(const std::string& enum_name, const char* prefix) {
  std::string s = enum_name.rfind(prefix, 0) == 0 ? enum_name.substr(strlen(prefix)) : enum_name;
  return absl::AsciiStrToLower(s);
}

}  // namespace

std::string MetricsText(const std::vector<v1::JobState>& jobs,
                        const std::vector<v1::WorkerInfo>& workers, const JobCounters& c) {
  std::string out;
  Head(&out, "fxdp_jobs", "gauge", "Jobs the server remembers, by state.");
  std::map<std::string, int> by_state;
  for (v1::JobState s : {v1::JOB_STATE_QUEUED, v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED,
                         v1::JOB_STATE_FAILED, v1::JOB_STATE_CANCELLED}) {
    by_state[Lower(v1::JobState_Name(s), "JOB_STATE_")] = 0;
  }
  for (v1::JobState s : jobs) ++by_state[Lower(v1::JobState_Name(s), "JOB_STATE_")];
  for (const auto& [state, n] : by_state)
    absl::StrAppend(&out, "fxdp_jobs{state=\"", state, "\"} ", n, "\n");
  Head(&out, "fxdp_workers", "gauge", "Workers attached (or lost), by state.");
  std::map<std::string, int> workers_by;
  for (v1::WorkerState s : {v1::WORKER_STATE_IDLE, v1::WORKER_STATE_BUSY, v1::WORKER_STATE_LOST})
    workers_by[Lower(v1::WorkerState_Name(s), "WORKER_STATE_")] = 0;
  for (const v1::WorkerInfo& w : workers)
    ++workers_by[Lower(v1::WorkerState_Name(w.state()), "WORKER_STATE_")];
  for (const auto& [state, n] : workers_by)
    absl::StrAppend(&out, "fxdp_workers{state=\"", state, "\"} ", n, "\n");
  Head(&out, "fxdp_steps_total", "counter", "Training steps completed by all jobs.");
  absl::StrAppend(&out, "fxdp_steps_total ", c.steps.load(), "\n");
  Head(&out, "fxdp_step_seconds", "summary", "Step time on rank 0 (StepResult.step_ms).");
  absl::StrAppend(&out, "fxdp_step_seconds_sum ", absl::StrFormat("%.6f", c.step_us.load() / 1e6),
                  "\nfxdp_step_seconds_count ", c.steps.load(), "\n");
  Head(&out, "fxdp_client_bytes_total", "counter",
       "Bytes of Submit messages (specs, states, batches) the job runners took from clients.");
  absl::StrAppend(&out, "fxdp_client_bytes_total ", c.client_bytes.load(), "\n");
  Head(&out, "fxdp_collective_bytes_total", "counter",
       "Bytes the ranks' collectives moved (StepResult.comm_bytes, every rank).");
  absl::StrAppend(&out, "fxdp_collective_bytes_total ", c.collective_bytes.load(), "\n");
  Head(&out, "fxdp_kept_states_total", "counter",
       "States of the last completed step kept by jobs that failed or were cancelled.");
  absl::StrAppend(&out, "fxdp_kept_states_total ", c.states_kept.load(), "\n");
  return out;
}

}  // namespace fxdp::server
