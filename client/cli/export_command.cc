// fxdp export CHECKPOINT --hf OUT: a checkpoint the workers wrote
// (docs/checkpoints.md: DIR/step-K/, rank files and fxdp-checkpoint.json),
// or the newest one of a job (JobInfo.checkpoint_path), consolidated into a
// Hugging Face model.safetensors that `from_pretrained` loads: every
// PARAMETER and persistent BUFFER tensor whole, under its state name (the
// model's state_dict name; a tied weight once, under the name the graph holds
// it by), in its dtype; a buffer the index marks "persistent": false (not in
// the model's state_dict) is left out. Each tensor is read from the parts that
// hold it (ir::CheckpointReader), whatever world size or style wrote them.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "analysis/ir/checkpoint_reader.h"
#include "analysis/ir/safetensors.h"
#include "client/cli/commands.h"
#include "client/cli/connect.h"
#include "client/cli/job_format.h"
#include "grpcpp/grpcpp.h"
#include "proto/fxdp/v1/jobs.grpc.pb.h"
#include "util/files.h"
#include "util/flags.h"

namespace fxdp::cli {
namespace {

constexpr char kExportUsage[] =
    "usage: fxdp export CHECKPOINT --hf OUT [--config config.json] [--server HOST:PORT]\n"
    "\n"
    "Consolidates a checkpoint the workers wrote (fxdp run --checkpoint-dir;\n"
    "docs/checkpoints.md) into OUT/model.safetensors for Hugging Face's\n"
    "from_pretrained: every parameter and buffer of the model's state_dict whole,\n"
    "under its name (a tied weight once), in its dtype; non-persistent buffers (not\n"
    "in the state_dict, as the tracer recorded), optimizer state, hyper-parameters\n"
    "and constants are left out. CHECKPOINT is the checkpoint's directory (DIR/step-K) or\n"
    "its fxdp-checkpoint.json, or a job ID whose newest complete checkpoint is read\n"
    "(JobInfo.checkpoint_path): the files are read on this machine, which must see\n"
    "the workers' filesystem.\n"
    "\n"
    "  --hf OUT             the directory to write model.safetensors into (created)\n"
    "  --config FILE        a config.json copied into OUT beside it\n"
    "  --server HOST:PORT   the fxdp server, for a job ID (default $FXDP_SERVER, else "
    "127.0.0.1:50051)\n" FXDP_CLI_CREDENTIAL_USAGE
    "\n"
    "Exit codes: 0 ok, 1 a checkpoint that is not one or a job without one, 2 usage,\n"
    "3 the server is unreachable or a file cannot be read or written.\n";

bool Exists(const std::string& path, bool* dir) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return false;
  *dir = S_ISDIR(st.st_mode);
  return true;
}

// The checkpoint's index: CHECKPOINT itself, in its directory, or the job's.
int IndexPath(const std::string& given, const std::string& server,
              const security::ChannelSecurity& creds, std::string* index) {
  bool dir = false;
  if (Exists(given, &dir)) {
    *index = dir ? ir::JoinCheckpointPath(given, ir::kCheckpointIndexName) : given;
    return -1;
  }
  auto channel = Connect("export", server, creds);
  if (!channel) return kExitIo;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::GetJobRequest req;
  req.set_job_id(given);
  v1::JobInfo info;
  const grpc::Status s = v1::JobService::NewStub(channel)->GetJob(&ctx, req, &info);
  if (!s.ok()) return ReportRpcError("export", server, s);
  if (info.checkpoint_path().empty()) {
    std::fprintf(stderr,
                 "fxdp export: job %s has no checkpoint written by its workers (fxdp run "
                 "--checkpoint-dir; JobInfo.checkpoint_path is empty)\n",
                 given.c_str());
    return kExitInvalidInput;
  }
  *index = ir::JoinCheckpointPath(info.checkpoint_path(), ir::kCheckpointIndexName);
  return -1;
}

// What a state_dict holds: parameters and persistent buffers.
bool InStateDict(const ir::CheckpointTensorEntry& e) {
  return e.role == "PARAMETER" || (e.role == "BUFFER" && e.persistent);
}

// The parameters and persistent buffers, whole, streamed into `out` after
// their header: one tensor at a time is held (read from the parts that hold
// it, written).
absl::Status Consolidate(ir::CheckpointReader& reader, const std::string& out, int* count) {
  std::vector<ir::TensorBytes> tensors;
  size_t largest = 0;
  for (const auto& [name, e] : reader.index().tensors) {
    if (!InStateDict(e)) continue;
    largest = std::max(largest, static_cast<size_t>(e.numel() * ir::DTypeItemSize(e.dtype)));
    tensors.push_back(ir::TensorBytes{name, e.dtype, e.shape, {}});
  }
  *count = static_cast<int>(tensors.size());
  // The header needs each tensor's size only: views of one buffer, which
  // then holds each tensor in turn as it is read and written.
  std::string buffer(largest, '\0');
  for (ir::TensorBytes& t : tensors)
    t.data = absl::string_view(buffer.data(),
                               static_cast<size_t>(reader.index().tensors.at(t.name).numel() *
                                                   ir::DTypeItemSize(t.dtype)));
  uint64_t bytes = 0;
  absl::StatusOr<std::string> header = ir::SafetensorsHeader(&tensors, {{"format", "pt"}}, &bytes);
  if (!header.ok()) return header.status();
  const std::string tmp = absl::StrCat(out, ".tmp");
  absl::Status read;
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(header->data(), static_cast<std::streamsize>(header->size()));
    for (const ir::TensorBytes& t : tensors) {  // in the header's (name) order
      read = reader.Read(t.name, 0, reader.index().tensors.at(t.name).numel(), buffer.data());
      if (!read.ok()) break;
      f.write(buffer.data(), static_cast<std::streamsize>(t.data.size()));
    }
    if (read.ok() && !f.flush()) read = util::WriteError(out, errno, absl::StrCat("writing ", tmp));
  }
  if (!read.ok()) {
    std::remove(tmp.c_str());
    return read;
  }
  if (std::rename(tmp.c_str(), out.c_str()) != 0)
    return util::WriteError(out, errno, absl::StrCat("renaming ", tmp, " to it"));
  return absl::OkStatus();
}

}  // namespace

int ExportCommand(const std::vector<std::string>& args) {
  util::Flags flags("fxdp export", kExportUsage);
  std::string server = DefaultServer(), hf, config;
  security::ChannelSecurity creds;
  AddServerFlags(&flags, &server, &creds);
  flags.String("--hf", &hf);
  flags.String("--config", &config);
  std::vector<std::string> pos;
  if (int rc = flags.Parse(args, &pos); rc >= 0) return rc;
  if (pos.size() != 1) return flags.Usage("expected exactly one CHECKPOINT (or job ID)");
  if (hf.empty()) return flags.Usage("--hf OUT is required");
  std::string index;
  if (int rc = IndexPath(pos[0], server, creds, &index); rc >= 0) return rc;
  absl::StatusOr<ir::CheckpointReader> reader = ir::CheckpointReader::Open(index, {});
  if (!reader.ok()) return ReportError("export", reader.status());
  if (mkdir(hf.c_str(), 0755) != 0 && errno != EEXIST)
    return ReportError("export", util::WriteError(hf, errno, "creating the directory"));
  const std::string out = ir::JoinCheckpointPath(hf, "model.safetensors");
  int count = 0;
  if (absl::Status s = Consolidate(*reader, out, &count); !s.ok()) return ReportError("export", s);
  if (!config.empty()) {
    absl::StatusOr<std::string> bytes = util::ReadRegularFile(config, 16 << 20);
    if (!bytes.ok()) return ReportError("export", bytes.status());
    if (absl::Status s =
            util::WriteFileAtomically(ir::JoinCheckpointPath(hf, "config.json"), *bytes);
        !s.ok())
      return ReportError("export", s);
  }
  int left_out = 0;
  for (const auto& [name, e] : reader->index().tensors) left_out += e.persistent ? 0 : 1;
  std::printf("exported %d tensors of the checkpoint of step %lld (%d ranks, %s) to %s%s\n", count,
              static_cast<long long>(reader->index().step), reader->index().world_size,
              reader->index().style.c_str(), out.c_str(),
              left_out > 0
                  ? absl::StrCat(" (", left_out, " non-persistent buffers left out)").c_str()
                  : "");
  return kExitOk;
}

}  // namespace fxdp::cli
