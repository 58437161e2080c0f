// `fxdp-worker run` under FXDP_MEMORY_TRACE=FILE ('{rank}' replaced by the
// rank): a measurement of where the rank's memory goes, for benchmarks and
// for finding what holds memory (live CPU tensor bytes, counted by
// executor/memory_limit.h's allocator wrapper, installed without a cap unless
// --memory-limit set one). FILE gets one JSON object:
//
//   {"rank": R, "world_size": N,
//    "load": {"live": B, "peak": B, "rss": B, "hwm": B},   state and data read
//    "steps": [{"live": B, "peak": B, "rss": B, "hwm": B}, ...],
//    "nodes": [[node, op, live after, peak during], ...]}   the last step
//
// live/peak: CPU tensor bytes (after / the most during the phase); rss/hwm:
// the process' resident set and its high-water mark at the end of the phase.
// Without the variable nothing is installed or recorded.
#ifndef FXDP_EXECUTOR_WORKER_MEMORY_TRACE_H_
#define FXDP_EXECUTOR_WORKER_MEMORY_TRACE_H_

#include <optional>
#include <string>
#include <vector>

#include <cstdint>
#include "absl/status/status.h"
#include "executor/interpreter.h"

namespace fxdp::executor {

class MemoryTrace {
 public:
  // The path FXDP_MEMORY_TRACE names for `rank`, nullopt when it is unset;
  // installs the counter when set (before anything is allocated).
  static std::optional<MemoryTrace> FromEnv(int rank, int world_size);

  void LoadDone();                        // the state and data are in
  void StepDone(const Program& program);  // after each step
  absl::Status Write() const;
  std::string Summary() const;  // one log line: load and step peaks

 private:
  struct Phase {
    int64_t live = 0, peak = 0;  // CPU tensor bytes: after the phase, the most during it
    int64_t rss = 0, hwm = 0;    // resident set (VmRSS) and its high-water mark (VmHWM)
  };
  static Phase Take();
  std::string path_;
  int rank_ = 0, world_size_ = 1;
  Phase load_;
  std::vector<Phase> steps_;
  std::vector<NodeMemory> nodes_;
};

}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_WORKER_MEMORY_TRACE_H_
