#include "client/cli/remote.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "analysis/analysis_table.h"
#include "client/cli/commands.h"
#include "client/cli/connect.h"
#include "client/cli/job_format.h"
#include "expansion/style_proto.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "proto/fxdp/v1/compile.grpc.pb.h"

namespace fxdp::cli {
namespace {

// A stub on a channel to `server`; nullptr after printing why a credential
// file is unusable.
std::unique_ptr<v1::CompileService::Stub> Stub(const std::string& cmd, const std::string& server,
                                               const security::ChannelSecurity& creds) {
  auto channel = Connect(cmd, server, creds, /*wait_ready=*/false);
  return channel ? v1::CompileService::NewStub(channel) : nullptr;
}

// Reads GRAPH into `def`; prints the error and returns the exit code, or -1.
// The GraphDef at `path`; with `shapes`, instantiated at them here
// (CompileService takes static graphs: analysis/ir/instantiate.h).
int ReadGraphDef(const std::string& cmd, const std::string& path, const ir::InputShapes& shapes,
                 v1::GraphDef* def) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "fxdp %s: cannot read %s\n", cmd.c_str(), path.c_str());
    return kExitIo;
  }
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!def->ParseFromString(bytes)) {
    std::fprintf(stderr, "fxdp %s: %s: not a serialized GraphDef\n", cmd.c_str(), path.c_str());
    return kExitInvalidInput;
  }
  if (shapes.empty()) return -1;
  absl::StatusOr<v1::GraphDef> at = ir::InstantiateDef(*def, shapes);
  if (!at.ok()) {
    return ReportError(
        cmd, absl::Status(at.status().code(), absl::StrCat(path, ": ", at.status().message())));
  }
  *def = *std::move(at);
  return -1;
}

}  // namespace

std::string DefaultServer() {
  const char* env = std::getenv("FXDP_SERVER");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string(kDefaultServerAddress);
}

std::string RankPath(const std::string& out, int r) {
  const size_t slash = out.find_last_of('/');
  const size_t dot = out.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) {
    return absl::StrCat(out, ".rank", r);
  }
  return absl::StrCat(out.substr(0, dot), ".rank", r, out.substr(dot));
}

std::vector<std::string> ExpandOutputPaths(const std::string& out, bool identical, int num_graphs) {
  if (identical) return {out};
  std::vector<std::string> paths;
  for (int r = 0; r < num_graphs; ++r) paths.push_back(RankPath(out, r));
  return paths;
}

std::string ReportJsonWithFiles(const std::string& report_json,
                                const std::vector<std::string>& paths, int world_size) {
  nlohmann::json j = nlohmann::json::parse(report_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return report_json;  // not JSON: leave it as it is
  nlohmann::json files = nlohmann::json::array();
  for (size_t i = 0; i < paths.size(); ++i) {
    nlohmann::json ranks = nlohmann::json::array();
    if (paths.size() == 1) {
      for (int r = 0; r < world_size; ++r) ranks.push_back(r);
    } else {
      ranks.push_back(static_cast<int>(i));
    }
    files.push_back({{"path", paths[i]}, {"ranks", std::move(ranks)}});
  }
  j["files"] = std::move(files);
  return j.dump(1) + "\n";
}

std::string AnalyzeResponseToTable(const v1::AnalyzeResponse& r, bool with_source) {
  std::string out = AnalysisTableText(r, with_source);
  if (r.has_memory()) absl::StrAppend(&out, StateMemoryToTable(StateMemoryFromProto(r.memory())));
  return out;
}

int RemoteAnalyze(const RemoteAnalyzeArgs& a) {
  v1::AnalyzeRequest req;
  if (int rc = ReadGraphDef("analyze", a.path, a.shapes, req.mutable_graph()); rc >= 0) return rc;
  req.set_world_size(a.world);
  req.set_include_json(a.json);
  req.set_sync_batchnorm(a.sync_batchnorm);
  if (a.style) req.set_style(*a.style);
  req.set_bucket_cap_mb(a.bucket_cap_mb);
  v1::AnalyzeResponse resp;
  grpc::ClientContext ctx;
  auto stub = Stub("analyze", a.server, a.creds);
  if (stub == nullptr) return kExitUsage;
  grpc::Status s = stub->Analyze(&ctx, req, &resp);
  if (!s.ok()) return ReportRpcError("analyze", a.server, s);
  const std::string out = a.json ? resp.json() : AnalyzeResponseToTable(resp, a.with_source);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return kExitOk;
}

int RemoteExpand(const RemoteExpandArgs& a) {
  v1::ExpandRequest req;
  if (int rc = ReadGraphDef("expand", a.path, a.shapes, req.mutable_graph()); rc >= 0) return rc;
  req.set_world_size(a.world);
  req.set_bucket_cap_mb(a.bucket_cap_mb);
  req.set_first_bucket_mb(a.first_bucket_mb);
  req.set_group_name(a.group_name);
  if (a.last_bucket_mb >= 0) req.set_last_bucket_mb(a.last_bucket_mb);
  req.set_no_overlap_schedule(a.no_overlap_schedule);
  req.set_sync_batchnorm(a.sync_batchnorm);
  req.set_style(a.style);
  v1::ExpandResponse resp;
  grpc::ClientContext ctx;
  auto stub = Stub("expand", a.server, a.creds);
  if (stub == nullptr) return kExitUsage;
  grpc::Status s = stub->Expand(&ctx, req, &resp);
  if (!s.ok()) return ReportRpcError("expand", a.server, s);
  const std::vector<std::string> paths =
      ExpandOutputPaths(a.out, resp.identical(), resp.graphs_size());
  for (int r = 0; r < resp.graphs_size(); ++r) {
    const std::string& p = paths[r];
    std::string bytes;
    resp.graphs(r).SerializeToString(&bytes);
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.close();
    if (!f) {
      std::fprintf(stderr, "fxdp expand: cannot write %s\n", p.c_str());
      return kExitIo;
    }
    std::fprintf(stderr, "fxdp expand: wrote %s (%s, %d nodes)\n", p.c_str(),
                 resp.identical() ? "all ranks" : absl::StrCat("rank ", r).c_str(),
                 resp.graphs(r).nodes_size());
  }
  const std::string report =
      a.json ? ReportJsonWithFiles(resp.report_json(), paths, a.world) : resp.report_table();
  std::fwrite(report.data(), 1, report.size(), stdout);
  return kExitOk;
}

}  // namespace fxdp::cli
