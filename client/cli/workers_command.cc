// fxdp workers [--json] [--server HOST:PORT]: the workers fxdp-server knows
// (WorkerService.ListWorkers, proto/fxdp/v1/worker.proto).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/commands.h"
#include "client/cli/connect.h"
#include "client/cli/job_format.h"
#include "grpcpp/grpcpp.h"
#include "proto/fxdp/v1/worker.grpc.pb.h"
#include "util/bytes.h"
#include "util/flags.h"

namespace fxdp::cli {
namespace {

constexpr char kWorkersUsage[] =
    "usage: fxdp workers [--json] [--server HOST:PORT]\n"
    "\n"
    "Lists the workers attached to fxdp-server (and the ones it lost in the last\n"
    "minute): id, state (IDLE, BUSY, LOST), device, host, pid, job, step, the\n"
    "time since the last heartbeat and the memory it offers jobs (and where that\n"
    "figure comes from: physical memory, cgroup memory limit, --memory-limit). A\n"
    "worker is BUSY with its job from the moment the server assigns it, and its step\n"
    "is the last one it reported done.\n"
    "\n"
    "  --server HOST:PORT   the fxdp server (default $FXDP_SERVER, else "
    "127.0.0.1:50051)\n" FXDP_CLI_CREDENTIAL_USAGE
    "  --json               print JSON: {\"workers\": [{\"id\", \"state\", \"device\",\n"
    "                       \"hostname\", \"pid\", \"job\", \"step\", \"last_heartbeat_s\",\n"
    "                       \"attached_s\", \"capacity\", \"fxdp_version\", \"torch_version\",\n"
    "                       \"lost_reason\", \"memory_bytes\", \"memory_source\"}]}\n"
    "\n"
    "Exit codes: 0 ok, 1 the server refused, 2 usage, 3 the server is unreachable\n"
    "(or did not answer in time).\n";

std::string StateName(v1::WorkerState s) {
  switch (s) {
    case v1::WORKER_STATE_IDLE: return "IDLE";
    case v1::WORKER_STATE_BUSY: return "BUSY";
    case v1::WORKER_STATE_LOST: return "LOST";
    default: return "UNKNOWN";
  }
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string ToJson(const v1::ListWorkersResponse& r) {
  std::string out = "{\"workers\": [";
  for (int i = 0; i < r.workers_size(); ++i) {
    const v1::WorkerInfo& w = r.workers(i);
    absl::StrAppend(&out, i ? ",\n  " : "\n  ");
    absl::StrAppendFormat(
        &out,
        "{\"id\": %s, \"state\": \"%s\", \"device\": %s, \"hostname\": %s, \"pid\": %d, "
        "\"job\": %s, \"step\": %d, \"last_heartbeat_s\": %.3f, \"attached_s\": %.3f, "
        "\"capacity\": %d, \"fxdp_version\": %s, \"torch_version\": %s, \"lost_reason\": %s, "
        "\"memory_bytes\": %d, \"memory_source\": %s}",
        JsonString(w.worker_id()), StateName(w.state()), JsonString(w.device()),
        JsonString(w.hostname()), w.pid(), JsonString(w.job_id()), w.step(), w.last_heartbeat_s(),
        w.attached_s(), w.capacity(), JsonString(w.fxdp_version()), JsonString(w.torch_version()),
        JsonString(w.lost_reason()), w.memory_bytes(), JsonString(w.memory_source()));
  }
  absl::StrAppend(&out, r.workers_size() ? "\n]}\n" : "]}\n");
  return out;
}

std::string ToTable(const v1::ListWorkersResponse& r) {
  std::vector<std::vector<std::string>> rows = {
      {"id", "state", "device", "host", "pid", "job", "step", "last heartbeat", "memory"}};
  for (const v1::WorkerInfo& w : r.workers()) {
    const bool busy = w.state() == v1::WORKER_STATE_BUSY;
    rows.push_back({w.worker_id(), StateName(w.state()), w.device(), w.hostname(),
                    absl::StrCat(w.pid()), w.job_id().empty() ? "-" : w.job_id(),
                    busy ? absl::StrCat(w.step()) : "-",
                    absl::StrFormat("%.1f s ago", w.last_heartbeat_s()) +
                        (w.lost_reason().empty() ? "" : " (" + w.lost_reason() + ")"),
                    w.memory_bytes() > 0
                        ? absl::StrCat(util::MiB(w.memory_bytes()), " (",
                                       w.memory_source().empty() ? "?" : w.memory_source(), ")")
                        : "-"});
  }
  std::string out = FormatTable(rows);
  if (r.workers_size() == 0) absl::StrAppend(&out, "(no workers)\n");
  return out;
}

}  // namespace

int WorkersCommand(const std::vector<std::string>& args) {
  util::Flags flags("fxdp workers", kWorkersUsage);
  ServerQuery q;
  AddServerQueryFlags(&flags, DefaultServer(), &q);
  if (int rc = flags.Parse(args, nullptr); rc >= 0) return rc;
  if (q.server.empty()) return flags.Usage("--server must not be empty");
  auto channel = Connect("workers", q.server, q.creds, /*wait_ready=*/false);
  if (!channel) return kExitUsage;
  auto stub = v1::WorkerService::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ListWorkersResponse resp;
  const grpc::Status s = stub->ListWorkers(&ctx, v1::ListWorkersRequest(), &resp);
  if (!s.ok()) return ReportRpcError("workers", q.server, s);
  const std::string out = q.json ? ToJson(resp) : ToTable(resp);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return kExitOk;
}

}  // namespace fxdp::cli
