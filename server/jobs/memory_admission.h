// Admission by memory: before a dispatched job's ranks are assigned, each
// rank's training state (the expansion's ExpandResponse.memory: parameters +
// gradients + optimizer state + other state + gathered units + the largest
// bucket, expansion/state_memory.h) is checked against the memory its worker
// registered (Register.memory_bytes: the smallest of the host's memory, the
// worker's cgroup limit and `fxdp-worker attach --memory-limit`; 0 =
// unknown, not checked). The state is a lower bound of the step's peak, so a
// job refused here could not have run there. No gRPC here.
#ifndef FXDP_SERVER_JOBS_MEMORY_ADMISSION_H_
#define FXDP_SERVER_JOBS_MEMORY_ADMISSION_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/fxdp/v1/compile.pb.h"
#include "proto/fxdp/v1/worker.pb.h"

namespace fxdp::server {

// OK when every rank r's state fits workers[r] (`known`: the pool's
// workers). FAILED_PRECONDITION naming the first rank that does not fit, its
// worker, the bytes needed (and what they are) against the bytes it has and
// where that figure comes from; under REPLICATE it suggests --style
// fully_shard with what each rank would hold of parameters, gradients and
// optimizer state.
absl::Status CheckRanksFit(const std::string& job_id, const v1::ExpandResponse& expanded,
                           const std::vector<std::string>& workers,
                           const std::vector<v1::WorkerInfo>& known);

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_MEMORY_ADMISSION_H_
