// Formatting of JobService results shared by `fxdp run` (run_command.cc) and
// `fxdp jobs|job|cancel` (jobs_command.cc): state and status names, a job as
// JSON or text, a run's events as JSON lines, RPC errors as exit codes.
#ifndef FXDP_CLIENT_CLI_JOB_FORMAT_H_
#define FXDP_CLIENT_CLI_JOB_FORMAT_H_

#include <cstdint>
#include <string>

#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "proto/fxdp/v1/jobs.grpc.pb.h"
#include "proto/fxdp/v1/jobs.pb.h"

namespace fxdp::cli {

// "QUEUED", "RUNNING", ...; "UNKNOWN" for anything else.
std::string StateName(v1::JobState s);
// "INVALID_ARGUMENT", ...; "CODE_<n>" past the known codes.
std::string CodeName(grpc::StatusCode c);
// Prints a failed RPC of `cmd` to stderr; kExitIo when the server is
// unreachable, else kExitInvalidInput.
int ReportRpcError(const std::string& cmd, const std::string& server, const grpc::Status& s);
// A job as `fxdp job --json` prints it.
nlohmann::ordered_json InfoJson(const v1::JobInfo& j);
// A job as `fxdp job` prints it, one "field value" line each.
std::string InfoText(const v1::JobInfo& j);
// One JSON line on stdout, flushed.
void PrintLine(const nlohmann::ordered_json& o);
// A Submit event as `fxdp run --json` prints it (`steps`: the job's, 0 when open-ended).
nlohmann::ordered_json EventJson(const v1::JobEvent& e, int64_t steps);
// fetch_command.cc: streams the state job `job_id` kept (FetchState) into
// `out` (safetensors) for `fxdp CMD`; its exit code.
int FetchStateToFile(v1::JobService::Stub* stub, const std::string& cmd, const std::string& server,
                     const std::string& job_id, const std::string& out, bool json);

}  // namespace fxdp::cli

#endif  // FXDP_CLIENT_CLI_JOB_FORMAT_H_
