// fxdp run|jobs|job|cancel --server HOST:PORT: jobs on fxdp-server's
// JobService (proto/fxdp/v1/jobs.proto).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/commands.h"
#include "client/cli/safetensors_raw.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "proto/fxdp/v1/jobs.grpc.pb.h"
#include "util/flags.h"

namespace fxdp::cli {
namespace {

constexpr char kDefaultServer[] = "127.0.0.1:50051";
constexpr int kMaxMessageBytes = std::numeric_limits<int>::max();
constexpr int kConnectTimeoutS = 5;

constexpr char kRunUsage[] =
    "usage: fxdp run GRAPH --world-size N --state S.safetensors --data D.safetensors\n"
    "                [--data D2.safetensors ...] --steps K [--out FINAL.safetensors]\n"
    "                [--bucket-mb X] [--name NAME] [--timeout S] [--json] [--server HOST:PORT]\n"
    "\n"
    "Runs a traced training step (GRAPH, what fxdp.trace saved) data-parallel on N\n"
    "workers of fxdp-server (JobService.Submit). S holds the initial state (every\n"
    "non-input placeholder), each D one global batch (every input placeholder by\n"
    "name); step i uses data file i mod (number of --data files). Prints a line per\n"
    "step (step i/K loss L (T ms)) and the job id at the end.\n"
    "\n"
    "  --server HOST:PORT   the fxdp server (default 127.0.0.1:50051)\n"
    "  --world-size N       number of data-parallel ranks (default 1)\n"
    "  --state FILE         initial state, safetensors (required)\n"
    "  --data FILE          a global batch, safetensors (required; repeatable)\n"
    "  --steps K            number of steps (default: the number of --data files)\n"
    "  --out FILE           write the final state (FetchState) as safetensors\n"
    "  --bucket-mb X        gradient bucket cap, MiB (default: DDP's)\n"
    "  --name NAME          a label for `fxdp jobs` (default: GRAPH's file name)\n"
    "  --timeout S          rendezvous / collective timeout, seconds (default 60)\n"
    "  --json               one JSON object per line per event instead of text\n"
    "\n"
    "Exit codes: 0 ok, 1 the job failed or was refused, 2 usage, 3 the server is\n"
    "unreachable or a file cannot be read or written.\n";

constexpr char kJobsUsage[] =
    "usage: fxdp jobs [--json] [--server HOST:PORT]\n"
    "\n"
    "Lists the jobs of fxdp-server, oldest first: id, state, steps done/total,\n"
    "world size, last loss, error.\n"
    "\n"
    "  --server HOST:PORT   the fxdp server (default 127.0.0.1:50051)\n"
    "  --json               print JSON: {\"jobs\": [{...JobInfo...}]}\n"
    "\n"
    "Exit codes: 0 ok, 1 the server refused, 2 usage, 3 the server is unreachable.\n";

constexpr char kJobUsage[] =
    "usage: fxdp job ID [--json] [--server HOST:PORT]\n"
    "\n"
    "Shows one job of fxdp-server (JobService.GetJob): state, steps, workers,\n"
    "losses, error.\n"
    "\n"
    "  --server HOST:PORT   the fxdp server (default 127.0.0.1:50051)\n"
    "  --json               print the job as a JSON object\n"
    "\n"
    "Exit codes: 0 ok, 1 unknown job, 2 usage, 3 the server is unreachable.\n";

constexpr char kCancelUsage[] =
    "usage: fxdp cancel ID [--reason TEXT] [--json] [--server HOST:PORT]\n"
    "\n"
    "Cancels a queued or running job (JobService.CancelJob); a finished job is\n"
    "left as it is. Prints the job's state afterwards.\n"
    "\n"
    "  --server HOST:PORT   the fxdp server (default 127.0.0.1:50051)\n"
    "  --reason TEXT        why (kept in the job's error; default \"fxdp cancel\")\n"
    "  --json               print the job as a JSON object\n"
    "\n"
    "Exit codes: 0 ok, 1 unknown job, 2 usage, 3 the server is unreachable.\n";

std::string StateName(v1::JobState s) {
  switch (s) {
    case v1::JOB_STATE_QUEUED: return "QUEUED";
    case v1::JOB_STATE_RUNNING: return "RUNNING";
    case v1::JOB_STATE_SUCCEEDED: return "SUCCEEDED";
    case v1::JOB_STATE_FAILED: return "FAILED";
    case v1::JOB_STATE_CANCELLED: return "CANCELLED";
    default: return "UNKNOWN";
  }
}

std::string CodeName(grpc::StatusCode c) {
  static const char* kNames[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT",
                                 "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
                                 "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
                                 "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
                                 "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
  const int i = static_cast<int>(c);
  return i >= 0 && i < 17 ? kNames[i] : absl::StrCat("CODE_", i);
}

// Connects to `server`; nullptr (after printing why) when it does not answer.
std::shared_ptr<grpc::Channel> Connect(const std::string& cmd, const std::string& server) {
  grpc::ChannelArguments ch;
  ch.SetMaxReceiveMessageSize(kMaxMessageBytes);
  ch.SetMaxSendMessageSize(kMaxMessageBytes);
  auto channel = grpc::CreateCustomChannel(server, grpc::InsecureChannelCredentials(), ch);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() +
                                 std::chrono::seconds(kConnectTimeoutS))) {
    std::fprintf(stderr, "fxdp %s: server %s is unreachable (no connection within %d s)\n",
                 cmd.c_str(), server.c_str(), kConnectTimeoutS);
    return nullptr;
  }
  return channel;
}

int ReportRpcError(const std::string& cmd, const std::string& server, const grpc::Status& s) {
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
    std::fprintf(stderr, "fxdp %s: server %s: %s\n", cmd.c_str(), server.c_str(),
                 s.error_message().c_str());
    return kExitIo;
  }
  std::fprintf(stderr, "fxdp %s: %s: %s\n", cmd.c_str(), CodeName(s.error_code()).c_str(),
               s.error_message().c_str());
  return kExitInvalidInput;
}

nlohmann::ordered_json InfoJson(const v1::JobInfo& j) {
  nlohmann::ordered_json o;
  o["job_id"] = j.job_id();
  o["name"] = j.name();
  o["state"] = StateName(j.state());
  o["world_size"] = j.world_size();
  o["steps"] = j.steps();
  o["steps_done"] = j.steps_done();
  o["workers"] = std::vector<std::string>(j.workers().begin(), j.workers().end());
  o["losses"] = std::vector<double>(j.losses().begin(), j.losses().end());
  o["last_loss"] = j.losses_size() ? nlohmann::ordered_json(j.losses(j.losses_size() - 1))
                                   : nlohmann::ordered_json(nullptr);
  o["error"] = j.error();
  o["error_code"] = j.error_code();
  o["submitted_unix_ms"] = j.submitted_unix_ms();
  o["ended_unix_ms"] = j.ended_unix_ms();
  o["has_state"] = j.has_state();
  return o;
}

std::string InfoText(const v1::JobInfo& j) {
  std::string out;
  absl::StrAppendFormat(&out, "job        %s\n", j.job_id());
  absl::StrAppendFormat(&out, "name       %s\n", j.name().empty() ? "-" : j.name());
  absl::StrAppendFormat(&out, "state      %s\n", StateName(j.state()));
  absl::StrAppendFormat(&out, "world size %d\n", j.world_size());
  absl::StrAppendFormat(&out, "steps      %d/%d\n", j.steps_done(), j.steps());
  std::string workers;
  for (int i = 0; i < j.workers_size(); ++i)
    absl::StrAppend(&workers, i ? ", " : "", "rank ", i, ": ", j.workers(i));
  absl::StrAppendFormat(&out, "workers    %s\n", workers.empty() ? "-" : workers);
  std::string losses;
  for (int i = 0; i < j.losses_size(); ++i)
    absl::StrAppendFormat(&losses, "%s%.6g", i ? " " : "", j.losses(i));
  absl::StrAppendFormat(&out, "losses     %s\n", losses.empty() ? "-" : losses);
  absl::StrAppendFormat(&out, "final state %s\n", j.has_state() ? "kept" : "-");
  if (!j.error().empty()) absl::StrAppendFormat(&out, "error      %s\n", j.error());
  return out;
}

std::string Table(const std::vector<std::vector<std::string>>& rows) {
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

void AddChunks(const std::vector<RawTensor>& tensors,
               google::protobuf::RepeatedPtrField<v1::TensorChunk>* out) {
  for (const RawTensor& t : tensors) {
    v1::TensorChunk* c = out->Add();
    c->set_name(t.name);
    c->set_dtype(DTypeToProto(t.dtype));
    for (int64_t d : t.shape) c->add_shape(d);
    c->set_offset(0);
    c->set_data(t.data);
  }
}

void PrintLine(const nlohmann::ordered_json& o) {
  const std::string s = o.dump() + "\n";
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

nlohmann::ordered_json EventJson(const v1::JobEvent& e, int64_t steps) {
  nlohmann::ordered_json o;
  o["event"] = "job";
  o["job_id"] = e.job_id();
  o["state"] = StateName(e.state());
  o["step"] = e.step();
  o["steps"] = steps;
  if (e.step() > 0 && e.state() == v1::JOB_STATE_RUNNING) {
    o["loss"] = e.loss();
    o["step_ms"] = e.step_ms();
    o["local_losses"] = std::vector<double>(e.local_losses().begin(), e.local_losses().end());
  }
  o["workers"] = std::vector<std::string>(e.workers().begin(), e.workers().end());
  if (!e.error().empty()) o["error"] = e.error();
  return o;
}

std::string Basename(const std::string& p) {
  const size_t s = p.find_last_of('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}

}  // namespace

int RunCommand(const std::vector<std::string>& args) {
  util::Flags flags("fxdp run", kRunUsage);
  std::string server = kDefaultServer, state_path, out, name;
  std::vector<std::string> data;
  int32_t world = 1, steps = 0;
  double bucket_mb = 0, timeout_s = 0;
  bool json = false;
  flags.String("--server", &server);
  flags.Int("--world-size", &world);
  flags.String("--state", &state_path);
  flags.Strings("--data", &data);
  flags.Int("--steps", &steps);
  flags.String("--out", &out, "-o");
  flags.Double("--bucket-mb", &bucket_mb);
  flags.String("--name", &name);
  flags.Double("--timeout", &timeout_s);
  flags.Bool("--json", &json);
  std::vector<std::string> pos;
  if (int rc = flags.Parse(args, &pos); rc >= 0) return rc;
  if (pos.size() != 1) return flags.Usage("expected exactly one GRAPH");
  if (world < 1) return flags.Usage("--world-size must be >= 1");
  if (state_path.empty()) return flags.Usage("--state is required");
  if (data.empty()) return flags.Usage("--data is required");
  if (steps < 0) return flags.Usage("--steps must be >= 0");
  if (steps == 0) steps = static_cast<int32_t>(data.size());
  if (bucket_mb < 0) return flags.Usage("--bucket-mb must be >= 0");

  v1::SubmitJobRequest req;
  {
    std::ifstream in(pos[0], std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "fxdp run: cannot read %s\n", pos[0].c_str());
      return kExitIo;
    }
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!req.mutable_graph()->ParseFromString(bytes)) {
      std::fprintf(stderr, "fxdp run: %s: not a serialized GraphDef\n", pos[0].c_str());
      return kExitInvalidInput;
    }
  }
  auto read = [&](const std::string& p) -> absl::StatusOr<std::vector<RawTensor>> {
    return ReadSafetensors(p);
  };
  auto state = read(state_path);
  if (!state.ok()) return ReportError("run", state.status());
  AddChunks(*state, req.mutable_initial_state());
  std::vector<v1::StepBatch> batches;
  for (const std::string& d : data) {
    auto b = read(d);
    if (!b.ok()) return ReportError("run", b.status());
    v1::StepBatch sb;
    AddChunks(*b, sb.mutable_tensors());
    batches.push_back(std::move(sb));
  }
  for (int i = 0; i < steps; ++i) *req.add_batches() = batches[i % batches.size()];
  req.set_world_size(world);
  req.set_steps(steps);
  req.set_bucket_cap_mb(bucket_mb);
  req.set_collective_timeout_s(timeout_s);
  req.set_name(name.empty() ? Basename(pos[0]) : name);

  auto channel = Connect("run", server);
  if (!channel) return kExitIo;
  auto stub = v1::JobService::NewStub(channel);
  grpc::ClientContext ctx;
  auto reader = stub->Submit(&ctx, req);
  const bool tty = !json && isatty(fileno(stdout));
  v1::JobEvent e, last;
  bool any = false;
  while (reader->Read(&e)) {
    any = true;
    last = e;
    if (json) {
      PrintLine(EventJson(e, steps));
      continue;
    }
    if (e.step() > 0 && e.state() == v1::JOB_STATE_RUNNING) {
      const std::string text =
          absl::StrFormat("step %d/%d loss %.6g (%.1f ms)", e.step(), steps, e.loss(), e.step_ms());
      if (tty) {
        constexpr int kBar = 30;
        const int filled = static_cast<int>(kBar * e.step() / std::max<int64_t>(steps, 1));
        std::printf("\r[%s%s] %s\x1b[K", std::string(filled, '#').c_str(),
                    std::string(kBar - filled, ' ').c_str(), text.c_str());
        if (e.step() == steps) std::printf("\n");
      } else {
        std::printf("%s\n", text.c_str());
      }
      std::fflush(stdout);
    }
  }
  const grpc::Status s = reader->Finish();
  if (tty && any && last.step() < steps) std::printf("\n");
  const std::string job_id = last.job_id();
  if (!s.ok()) {
    if (!any) {
      if (json) {
        nlohmann::ordered_json o;
        o["event"] = "error";
        o["code"] = CodeName(s.error_code());
        o["error"] = s.error_message();
        PrintLine(o);
      }
      return ReportRpcError("run", server, s);
    }
    const std::string st = s.error_code() == grpc::StatusCode::CANCELLED ? "CANCELLED" : "FAILED";
    if (json && last.state() != v1::JOB_STATE_FAILED && last.state() != v1::JOB_STATE_CANCELLED) {
      nlohmann::ordered_json o;
      o["event"] = "job";
      o["job_id"] = job_id;
      o["state"] = st;
      o["code"] = CodeName(s.error_code());
      o["error"] = s.error_message();
      PrintLine(o);
    }
    std::fprintf(stderr, "fxdp run: job %s %s (%s): %s\n", job_id.c_str(), st.c_str(),
                 CodeName(s.error_code()).c_str(), s.error_message().c_str());
    return kExitInvalidInput;
  }
  if (last.state() != v1::JOB_STATE_SUCCEEDED) {
    std::fprintf(stderr, "fxdp run: job %s ended %s: %s\n", job_id.c_str(),
                 StateName(last.state()).c_str(), last.error().c_str());
    return kExitInvalidInput;
  }
  if (!out.empty()) {
    grpc::ClientContext fctx;
    v1::FetchJobStateRequest freq;
    freq.set_job_id(job_id);
    auto fr = stub->FetchState(&fctx, freq);
    std::vector<RawTensor> tensors;
    std::map<std::string, size_t> index;
    v1::StateChunk c;
    while (fr->Read(&c)) {
      if (!c.has_tensor()) continue;
      const v1::TensorChunk& t = c.tensor();
      auto [it, fresh] = index.emplace(t.name(), tensors.size());
      if (fresh) {
        RawTensor r;
        r.name = t.name();
        r.dtype = DTypeFromProto(t.dtype());
        r.shape.assign(t.shape().begin(), t.shape().end());
        tensors.push_back(std::move(r));
      }
      RawTensor& r = tensors[it->second];
      if (t.offset() != r.data.size()) {
        fctx.TryCancel();
        std::fprintf(stderr, "fxdp run: final state of %s: chunk of '%s' at offset %llu, expected %zu\n",
                     job_id.c_str(), t.name().c_str(),
                     static_cast<unsigned long long>(t.offset()), r.data.size());
        return kExitInvalidInput;
      }
      r.data += t.data();
    }
    const grpc::Status fs = fr->Finish();
    if (!fs.ok()) return ReportRpcError("run", server, fs);
    if (absl::Status w = WriteSafetensors(out, tensors); !w.ok()) {
      std::fprintf(stderr, "fxdp run: %s\n", std::string(w.message()).c_str());
      return kExitIo;
    }
    if (json) {
      nlohmann::ordered_json o;
      o["event"] = "state_written";
      o["job_id"] = job_id;
      o["path"] = out;
      o["tensors"] = tensors.size();
      PrintLine(o);
    } else {
      std::fprintf(stderr, "fxdp run: wrote %s (%zu tensors)\n", out.c_str(), tensors.size());
    }
  }
  if (!json) std::printf("job %s SUCCEEDED (%d steps on %d workers)\n", job_id.c_str(), steps, world);
  return kExitOk;
}

int JobsCommand(const std::vector<std::string>& args) {
  util::Flags flags("fxdp jobs", kJobsUsage);
  std::string server = kDefaultServer;
  bool json = false;
  flags.String("--server", &server);
  flags.Bool("--json", &json);
  if (int rc = flags.Parse(args, nullptr); rc >= 0) return rc;
  auto channel = Connect("jobs", server);
  if (!channel) return kExitIo;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ListJobsResponse resp;
  const grpc::Status s = v1::JobService::NewStub(channel)->ListJobs(&ctx, v1::ListJobsRequest(), &resp);
  if (!s.ok()) return ReportRpcError("jobs", server, s);
  if (json) {
    nlohmann::ordered_json o;
    o["jobs"] = nlohmann::ordered_json::array();
    for (const v1::JobInfo& j : resp.jobs()) o["jobs"].push_back(InfoJson(j));
    std::printf("%s\n", o.dump(2).c_str());
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows = {
      {"id", "name", "state", "steps", "world", "last loss", "error"}};
  for (const v1::JobInfo& j : resp.jobs()) {
    rows.push_back({j.job_id(), j.name().empty() ? "-" : j.name(), StateName(j.state()),
                    absl::StrCat(j.steps_done(), "/", j.steps()), absl::StrCat(j.world_size()),
                    j.losses_size() ? absl::StrFormat("%.6g", j.losses(j.losses_size() - 1)) : "-",
                    j.error().empty() ? "-" : j.error()});
  }
  std::string out = Table(rows);
  if (resp.jobs_size() == 0) out += "(no jobs)\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  return kExitOk;
}

int JobCommand(const std::vector<std::string>& args) {
  util::Flags flags("fxdp job", kJobUsage);
  std::string server = kDefaultServer;
  bool json = false;
  flags.String("--server", &server);
  flags.Bool("--json", &json);
  std::vector<std::string> pos;
  if (int rc = flags.Parse(args, &pos); rc >= 0) return rc;
  if (pos.size() != 1) return flags.Usage("expected exactly one job ID");
  auto channel = Connect("job", server);
  if (!channel) return kExitIo;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::GetJobRequest req;
  req.set_job_id(pos[0]);
  v1::JobInfo info;
  const grpc::Status s = v1::JobService::NewStub(channel)->GetJob(&ctx, req, &info);
  if (!s.ok()) return ReportRpcError("job", server, s);
  const std::string out = json ? InfoJson(info).dump(2) + "\n" : InfoText(info);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return kExitOk;
}

int CancelCommand(const std::vector<std::string>& args) {
  util::Flags flags("fxdp cancel", kCancelUsage);
  std::string server = kDefaultServer, reason = "fxdp cancel";
  bool json = false;
  flags.String("--server", &server);
  flags.String("--reason", &reason);
  flags.Bool("--json", &json);
  std::vector<std::string> pos;
  if (int rc = flags.Parse(args, &pos); rc >= 0) return rc;
  if (pos.size() != 1) return flags.Usage("expected exactly one job ID");
  auto channel = Connect("cancel", server);
  if (!channel) return kExitIo;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::CancelJobRequest req;
  req.set_job_id(pos[0]);
  req.set_reason(reason);
  v1::JobInfo info;
  const grpc::Status s = v1::JobService::NewStub(channel)->CancelJob(&ctx, req, &info);
  if (!s.ok()) return ReportRpcError("cancel", server, s);
  if (json) {
    std::printf("%s\n", InfoJson(info).dump(2).c_str());
  } else {
    std::printf("job %s %s%s\n", info.job_id().c_str(), StateName(info.state()).c_str(),
                info.error().empty() ? "" : (": " + info.error()).c_str());
  }
  return kExitOk;
}

}  // namespace fxdp::cli
