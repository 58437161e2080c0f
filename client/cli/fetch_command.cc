// fxdp fetch ID --out FILE: the state a finished job kept (JobService.FetchState)
// as a safetensors file: a SUCCEEDED job's final state, a FAILED or CANCELLED
// job's last completed step's (docs/jobs.md, "What an ended job keeps");
// `fxdp run --out` writes its final state the same way.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "analysis/ir/raw_tensor.h"
#include "analysis/ir/safetensors.h"
#include "client/cli/commands.h"
#include "client/cli/connect.h"
#include "client/cli/job_format.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "proto/fxdp/v1/jobs.grpc.pb.h"
#include "util/flags.h"

namespace fxdp::cli {
namespace {

using ir::RawTensor;

constexpr char kFetchUsage[] =
    "usage: fxdp fetch ID --out FILE.safetensors [--json] [--server HOST:PORT]\n"
    "\n"
    "Writes the state job ID kept (JobService.FetchState) as safetensors: a\n"
    "SUCCEEDED job's final state, a FAILED or CANCELLED job's state after its last\n"
    "completed step ('fxdp job ID' says which: its checkpoint step).\n"
    "\n"
    "  --server HOST:PORT   the fxdp server (default $FXDP_SERVER, else "
    "127.0.0.1:50051)\n" FXDP_CLI_CREDENTIAL_USAGE
    "  --out FILE           where to write it\n"
    "  --json               print a JSON line when it is written\n"
    "\n"
    "Exit codes: 0 ok, 1 no such job or it keeps no state, 2 usage, 3 the server is\n"
    "unreachable or the file cannot be written.\n";

}  // namespace

int FetchStateToFile(v1::JobService::Stub* stub, const std::string& cmd, const std::string& server,
                     const std::string& job_id, const std::string& out, bool json) {
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
      absl::StatusOr<ir::DType> dtype = ir::DTypeFromWire(t.dtype());
      if (!dtype.ok()) {
        fctx.TryCancel();
        std::fprintf(stderr, "fxdp %s: state of %s: tensor '%s': %s\n", cmd.c_str(), job_id.c_str(),
                     t.name().c_str(), std::string(dtype.status().message()).c_str());
        return kExitInvalidInput;
      }
      RawTensor r;
      r.name = t.name();
      r.dtype = *dtype;
      r.shape.assign(t.shape().begin(), t.shape().end());
      tensors.push_back(std::move(r));
    }
    RawTensor& r = tensors[it->second];
    if (t.offset() != r.data.size()) {
      fctx.TryCancel();
      std::fprintf(stderr, "fxdp %s: state of %s: chunk of '%s' at offset %llu, expected %zu\n",
                   cmd.c_str(), job_id.c_str(), t.name().c_str(),
                   static_cast<unsigned long long>(t.offset()), r.data.size());
      return kExitInvalidInput;
    }
    r.data += t.data();
  }
  const grpc::Status fs = fr->Finish();
  if (!fs.ok()) return ReportRpcError(cmd, server, fs);
  if (absl::Status w = ir::WriteSafetensorsFile(out, tensors); !w.ok()) {
    std::fprintf(stderr, "fxdp %s: %s\n", cmd.c_str(), std::string(w.message()).c_str());
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
    std::fprintf(stderr, "fxdp %s: wrote %s (%zu tensors)\n", cmd.c_str(), out.c_str(),
                 tensors.size());
  }
  return kExitOk;
}

int FetchCommand(const std::vector<std::string>& args) {
  util::Flags flags("fxdp fetch", kFetchUsage);
  ServerQuery q;
  AddServerQueryFlags(&flags, DefaultServer(), &q);
  std::string out;
  flags.String("--out", &out, "-o");
  std::vector<std::string> pos;
  if (int rc = flags.Parse(args, &pos); rc >= 0) return rc;
  if (pos.size() != 1) return flags.Usage("expected exactly one job ID");
  if (out.empty()) return flags.Usage("--out FILE is required");
  auto channel = Connect("fetch", q.server, q.creds);
  if (!channel) return kExitIo;
  auto stub = v1::JobService::NewStub(channel);
  return FetchStateToFile(stub.get(), "fetch", q.server, pos[0], out, q.json);
}

}  // namespace fxdp::cli
