// What `fxdp-server --metrics-port` exports (server/metrics_http.h), as
// Prometheus text: the jobs the server remembers by state, its workers by
// state, and counters since the server started: steps, their time on rank 0,
// bytes read from clients and moved by the ranks' collectives, states kept.
// Only aggregates: no job ids, names or owners (the endpoint is not
// authenticated; docs/security.md).
#ifndef FXDP_SERVER_JOBS_JOB_METRICS_H_
#define FXDP_SERVER_JOBS_JOB_METRICS_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "proto/fxdp/v1/jobs.pb.h"
#include "proto/fxdp/v1/worker.pb.h"

namespace fxdp::server {

// Counted by the job runners (JobContext::counters).
struct JobCounters {
  std::atomic<int64_t> steps{0};
  std::atomic<int64_t> step_us{0};  // rank 0's step times, summed
  std::atomic<uint64_t> client_bytes{0};
  std::atomic<uint64_t> collective_bytes{0};
  std::atomic<int64_t> states_kept{0};  // last-step states kept by ended jobs
};

// The metrics text of `jobs` (their states), `workers` and `counters`.
std::string MetricsText(const std::vector<v1::JobState>& jobs,
                        const std::vector<v1::WorkerInfo>& workers, const JobCounters& counters);

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_JOB_METRICS_H_
