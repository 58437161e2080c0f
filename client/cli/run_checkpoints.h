// `fxdp run`'s checkpoint flags (docs/checkpoints.md): --initial-checkpoint and
// --checkpoint-dir into the JobSpec, and the newest checkpoint printed.
#ifndef FXDP_CLIENT_CLI_RUN_CHECKPOINTS_H_
#define FXDP_CLIENT_CLI_RUN_CHECKPOINTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "analysis/ir/raw_tensor.h"
#include "proto/fxdp/v1/jobs.grpc.pb.h"

namespace fxdp::cli {

// --initial-checkpoint (every state tensor `state` does not hold, read under
// its own name; "": none) and --checkpoint-dir/-every/--keep-checkpoints
// ("": none) into `spec`.
void AddCheckpointSpec(const std::string& initial_checkpoint, const std::string& checkpoint_dir,
                       int32_t every, int32_t keep, const std::vector<ir::RawTensor>& state,
                       v1::JobSpec* spec);
// The job's newest complete checkpoint written by its workers (JobInfo), a
// line of text or a JSON object; nothing when it has none.
void PrintWorkerCheckpoint(v1::JobService::Stub* stub, bool json, const std::string& job_id);

}  // namespace fxdp::cli

#endif  // FXDP_CLIENT_CLI_RUN_CHECKPOINTS_H_
