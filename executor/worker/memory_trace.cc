#include "executor/worker/memory_trace.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "executor/memory_limit.h"
#include "util/files.h"

namespace fxdp::executor {

std::optional<MemoryTrace> MemoryTrace::FromEnv(int rank, int world_size) {
  const char* v = std::getenv("FXDP_MEMORY_TRACE");
  if (v == nullptr || *v == '\0') return std::nullopt;
  InstallCpuMemoryLimit(CpuMemoryLimit());  // counts; keeps --memory-limit's cap, if any
  ResetPeakCpuTensorBytes();
  MemoryTrace t;
  t.path_ = absl::StrReplaceAll(v, {{"{rank}", absl::StrCat(rank)}});
  t.rank_ = rank;
  t.world_size_ = world_size;
  return t;
}

MemoryTrace::Phase MemoryTrace::Take() {
  Phase p;
  p.live = CpuTensorBytesInUse();
  p.peak = PeakCpuTensorBytes();
  ResetPeakCpuTensorBytes();
  // VmRSS and VmHWM from /proc/self/status (0 where it cannot be read).
  if (std::FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, f) != nullptr) {
      long long kb = 0;
      if (std::sscanf(line, "VmRSS: %lld kB", &kb) == 1) p.rss = kb * 1024;
      if (std::sscanf(line, "VmHWM: %lld kB", &kb) == 1) p.hwm = kb * 1024;
    }
    std::fclose(f);
  }
  return p;
}

void MemoryTrace::LoadDone() { load_ = Take(); }

void MemoryTrace::StepDone(const Program& program) {
  Phase p = Take();
  // Program::Run resets the peak at every node: the step's is the nodes' most.
  for (const NodeMemory& n : program.memory_trace()) p.peak = std::max(p.peak, n.peak_bytes);
  steps_.push_back(p);
  nodes_ = program.memory_trace();
}

std::string MemoryTrace::Summary() const {
  int64_t step_peak = 0;
  for (const Phase& p : steps_) step_peak = std::max(step_peak, p.peak);
  const int64_t hwm = steps_.empty() ? load_.hwm : steps_.back().hwm;
  return absl::StrFormat(
      "memory: live tensors %.1f MB after loading (peak %.1f MB while loading), peak %.1f MB "
      "during the steps; resident set peak %.1f MB; trace in %s",
      load_.live / 1e6, load_.peak / 1e6, step_peak / 1e6, hwm / 1e6, path_);
}

absl::Status MemoryTrace::Write() const {
  auto phase = [](const Phase& p) {
    return nlohmann::json{{"live", p.live}, {"peak", p.peak}, {"rss", p.rss}, {"hwm", p.hwm}};
  };
  nlohmann::json j = {{"rank", rank_}, {"world_size", world_size_}, {"load", phase(load_)}};
  j["steps"] = nlohmann::json::array();
  for (const Phase& p : steps_) j["steps"].push_back(phase(p));
  j["nodes"] = nlohmann::json::array();
  for (const NodeMemory& n : nodes_)
    j["nodes"].push_back({n.node, n.op, n.live_bytes, n.peak_bytes});
  return util::WriteFileAtomically(path_, j.dump() + "\n");
}

}  // namespace fxdp::executor
