// fxdp jobs|job|cancel --server HOST:PORT: lists, shows and cancels jobs on
// fxdp-server's JobService (proto/fxdp/v1/jobs.proto); `fxdp run` is
// run_command.cc.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/commands.h"
#include "client/cli/connect.h"
#include "client/cli/job_format.h"
#include "expansion/style_proto.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "proto/fxdp/v1/jobs.grpc.pb.h"
#include "util/flags.h"

namespace fxdp::cli {
namespace {

constexpr char kJobsUsage[] =
    "usage: fxdp jobs [--json] [--server HOST:PORT]\n"
    "\n"
    "Lists the jobs of fxdp-server, oldest first: id, state, steps done/total, a\n"
    "running job's steps/s since it started, world size, last loss, the last\n"
    "evaluation's step and loss (JobSpec.eval), and what a queued job waits for or\n"
    "why a job failed.\n"
    "\n"
    "  --server HOST:PORT   the fxdp server (default $FXDP_SERVER, else "
    "127.0.0.1:50051)\n" FXDP_CLI_CREDENTIAL_USAGE
    "  --json               print JSON: {\"jobs\": [{...JobInfo...}]}\n"
    "\n"
    "Exit codes: 0 ok, 1 the server refused, 2 usage, 3 the server is unreachable\n"
    "(or did not answer in time).\n";

constexpr char kJobUsage[] =
    "usage: fxdp job ID [--json] [--server HOST:PORT]\n"
    "\n"
    "Shows one job of fxdp-server (JobService.GetJob): state (a queued job's queue\n"
    "position and what it waits for), steps, workers, losses, shapes, the last\n"
    "evaluations (--json: every one), checkpoints, error.\n"
    "\n"
    "  --server HOST:PORT   the fxdp server (default $FXDP_SERVER, else "
    "127.0.0.1:50051)\n" FXDP_CLI_CREDENTIAL_USAGE
    "  --json               print the job as a JSON object\n"
    "\n"
    "Exit codes: 0 ok, 1 unknown job, 2 usage, 3 the server is unreachable\n"
    "(or did not answer in time).\n";

constexpr char kCancelUsage[] =
    "usage: fxdp cancel ID [--reason TEXT] [--json] [--server HOST:PORT]\n"
    "\n"
    "Cancels a queued or running job (JobService.CancelJob); a finished job is\n"
    "left as it is. Prints the job's state afterwards.\n"
    "\n"
    "  --server HOST:PORT   the fxdp server (default $FXDP_SERVER, else "
    "127.0.0.1:50051)\n" FXDP_CLI_CREDENTIAL_USAGE
    "  --reason TEXT        why (kept in the job's error; default \"fxdp cancel\")\n"
    "  --json               print the job as a JSON object\n"
    "\n"
    "Exit codes: 0 ok, 1 unknown job, 2 usage, 3 the server is unreachable\n"
    "(or did not answer in time).\n";

// A running job's steps per second since it started ("-" for another, or
// a resumed one, whose steps_done counts the resumed job's steps too).
std::string AverageRate(const v1::JobInfo& j, int64_t now_ms) {
  const double s = (now_ms - j.started_unix_ms()) / 1000.0;
  if (j.state() != v1::JOB_STATE_RUNNING || !j.resumed_from().empty() || s <= 0 ||
      j.steps_done() == 0)
    return "-";
  return absl::StrFormat("%.3g", j.steps_done() / s);
}

}  // namespace

int JobsCommand(const std::vector<std::string>& args) {
  util::Flags flags("fxdp jobs", kJobsUsage);
  ServerQuery q;
  AddServerQueryFlags(&flags, DefaultServer(), &q);
  if (int rc = flags.Parse(args, nullptr); rc >= 0) return rc;
  auto channel = Connect("jobs", q.server, q.creds);
  if (!channel) return kExitIo;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ListJobsResponse resp;
  const grpc::Status s =
      v1::JobService::NewStub(channel)->ListJobs(&ctx, v1::ListJobsRequest(), &resp);
  if (!s.ok()) return ReportRpcError("jobs", q.server, s);
  if (q.json) {
    nlohmann::ordered_json o;
    o["jobs"] = nlohmann::ordered_json::array();
    for (const v1::JobInfo& j : resp.jobs()) o["jobs"].push_back(InfoJson(j));
    std::printf("%s\n", o.dump(2).c_str());
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows = {{"id", "name", "state", "steps", "steps/s", "world",
                                                 "shapes", "last loss", "last eval", "detail"}};
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  for (const v1::JobInfo& j : resp.jobs()) {
    std::string detail = j.error().empty() ? "-" : j.error();
    if (j.state() == v1::JOB_STATE_QUEUED)
      detail = absl::StrCat("#", j.queue_position(), ": ", j.message());
    rows.push_back(
        {j.job_id(), j.name().empty() ? "-" : j.name(), StateName(j.state()),
         absl::StrCat(j.steps_done(), "/", j.steps() > 0 ? absl::StrCat(j.steps()) : "?"),
         AverageRate(j, now_ms), absl::StrCat(j.world_size()),
         j.shapes_size() > 0 ? absl::StrCat(j.shapes_size()) : "-",
         j.losses_size() ? absl::StrFormat("%.6g", j.losses(j.losses_size() - 1)) : "-",
         j.evals_size() ? EvalShort(j.evals(j.evals_size() - 1), 1) : "-", detail});
  }
  std::string out = FormatTable(rows);
  if (resp.jobs_size() == 0) out += "(no jobs)\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  return kExitOk;
}

int JobCommand(const std::vector<std::string>& args) {
  util::Flags flags("fxdp job", kJobUsage);
  ServerQuery q;
  AddServerQueryFlags(&flags, DefaultServer(), &q);
  std::vector<std::string> pos;
  if (int rc = flags.Parse(args, &pos); rc >= 0) return rc;
  if (pos.size() != 1) return flags.Usage("expected exactly one job ID");
  auto channel = Connect("job", q.server, q.creds);
  if (!channel) return kExitIo;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::GetJobRequest req;
  req.set_job_id(pos[0]);
  v1::JobInfo info;
  const grpc::Status s = v1::JobService::NewStub(channel)->GetJob(&ctx, req, &info);
  if (!s.ok()) return ReportRpcError("job", q.server, s);
  const std::string out = q.json ? InfoJson(info).dump(2) + "\n" : InfoText(info);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return kExitOk;
}

int CancelCommand(const std::vector<std::string>& args) {
  util::Flags flags("fxdp cancel", kCancelUsage);
  ServerQuery q;
  AddServerQueryFlags(&flags, DefaultServer(), &q);
  std::string reason = "fxdp cancel";
  flags.String("--reason", &reason);
  std::vector<std::string> pos;
  if (int rc = flags.Parse(args, &pos); rc >= 0) return rc;
  if (pos.size() != 1) return flags.Usage("expected exactly one job ID");
  auto channel = Connect("cancel", q.server, q.creds);
  if (!channel) return kExitIo;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::CancelJobRequest req;
  req.set_job_id(pos[0]);
  req.set_reason(reason);
  v1::JobInfo info;
  const grpc::Status s = v1::JobService::NewStub(channel)->CancelJob(&ctx, req, &info);
  if (!s.ok()) return ReportRpcError("cancel", q.server, s);
  if (q.json) {
    std::printf("%s\n", InfoJson(info).dump(2).c_str());
  } else {
    std::printf("job %s %s%s\n", info.job_id().c_str(), StateName(info.state()).c_str(),
                info.error().empty() ? "" : (": " + info.error()).c_str());
  }
  return kExitOk;
}

std::string FormatTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows)
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      absl::StrAppend(&line, c ? "  " : "", row[c]);
      if (c + 1 < row.size()) line.append(width[c] - row[c].size(), ' ');
    }
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

}  // namespace fxdp::cli
