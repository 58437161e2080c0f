#include "server/jobs/memory_admission.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "expansion/state_memory.h"
#include "expansion/style_proto.h"

namespace fxdp::server {

absl::Status CheckRanksFit(const std::string& job_id, const v1::ExpandResponse& expanded,
                           const std::vector<std::string>& workers,
                           const std::vector<v1::WorkerInfo>& known) {
  if (!expanded.has_memory()) return absl::OkStatus();
  const StateMemory m = StateMemoryFromProto(expanded.memory());
  const int64_t need = m.total_bytes();
  std::map<std::string, const v1::WorkerInfo*> by_id;
  for (const v1::WorkerInfo& w : known) by_id[w.worker_id()] = &w;
  for (size_t rank = 0; rank < workers.size(); ++rank) {
    auto it = by_id.find(workers[rank]);
    if (it == by_id.end()) continue;
    const v1::WorkerInfo& w = *it->second;
    if (w.memory_bytes() <= 0 || need <= w.memory_bytes()) continue;
    std::string msg = absl::StrCat(
        "job ", job_id, ": rank ", rank, " does not fit worker ", w.worker_id(),
        ": its state under ", DataParallelStyleName(m.style), " on ", m.world_size, " rank",
        m.world_size == 1 ? "" : "s", " needs ", FormatBytes(need), " (parameters ",
        m.parameter_bytes, " + gradients ", m.gradient_bytes, " + optimizer state ",
        m.optimizer_state_bytes, " + other state ", m.other_state_bytes,
        m.gathered_bytes > 0 ? absl::StrCat(" + gathered units ", m.gathered_bytes) : "",
        " + largest bucket ", m.largest_bucket_bytes,
        " bytes; activations come on top), the worker has ", FormatBytes(w.memory_bytes()),
        w.memory_source().empty() ? "" : absl::StrCat(" (", w.memory_source(), ")"));
    if (m.style == DataParallelStyle::kReplicate && m.world_size > 1) {
      const int64_t sharded =
          StateMemory::AddBytes(StateMemory::AddBytes(m.parameter_bytes, m.gradient_bytes),
                                m.optimizer_state_bytes) /
          m.world_size;
      absl::StrAppend(
          &msg, "; with --style fully_shard each rank holds 1/", m.world_size,
          " of the parameters, gradients and optimizer state, ", FormatBytes(sharded),
          ", plus the gathered units: `fxdp analyze --style fully_shard` shows the total");
    } else {
      absl::StrAppend(&msg, "; more ranks (--world-size) make each rank's shard smaller");
    }
    return absl::FailedPreconditionError(msg);
  }
  return absl::OkStatus();
}

}  // namespace fxdp::server
