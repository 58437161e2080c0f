// `fxdp-worker run`: a launcher (torchrun, Slurm) started the ranks; each runs
// a saved graph for a number of steps on state and data files. Its parts:
//   run_command.cc  usage, flags, the launch environment, exit codes
//   run_rank.cc     one rank: load, rendezvous, steps, the final state
// One rank's set-up (device, rendezvous, program) is `attach`'s too
// (worker/common.h).
#ifndef FXDP_EXECUTOR_WORKER_RUN_COMMAND_H_
#define FXDP_EXECUTOR_WORKER_RUN_COMMAND_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "executor/communicator.h"
#include "util/log.h"

namespace fxdp::executor {

// The usage text of `fxdp-worker run --help`.
extern const char kRunUsage[];

// Runs `fxdp-worker run ARGS...` (args exclude "run"); returns the exit code
// (0 ok, 1 invalid input or a failed step, 2 usage, 3 I/O).
int RunCommand(const std::vector<std::string>& args);

namespace run {

// RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (or Slurm's).
struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
};

struct RunArgs {
  // --graph: one graph, or one per batch shape (each step runs the one
  // expanded for its data's shapes, ir::kInputShapesKey).
  std::vector<std::string> graphs;
  std::string state, out;
  std::vector<std::string> data;
  int steps = 0;
  std::string device = "cpu";
  std::string communicator = "auto";  // --communicator
  std::chrono::milliseconds timeout{60000};
  std::string job = "local";
  int threads = 0;  // 0: see IntraOpThreads
  bool check_outputs = false;
  std::string schedule;          // --schedule FILE ("" : none)
  int64_t memory_limit = 0;      // --memory-limit (executor/memory_limit.h)
  std::optional<uint64_t> seed;  // --seed (ProgramOptions::seed)
};

// Every line on stderr says which job, rank and step it is about:
// "[job local rank 1 step 2/3] ...", step 0 before the first step
// (util::JobLogPrefix, written by util::Log).
class Logger {
 public:
  Logger(std::string job, int rank, int steps) : job_(std::move(job)), rank_(rank), steps_(steps) {}
  void set_step(int step) { step_ = step; }
  std::string Prefix() const { return util::JobLogPrefix(job_, rank_, step_, steps_); }
  template <typename... A>
  void Log(const A&... a) const {
    util::Log(Prefix(), a...);
  }

 private:
  std::string job_;
  int rank_;
  int steps_;
  int step_ = 0;
};

// The intra-op thread count for --threads N (0: unset) under `env`:
// --threads, else OMP_NUM_THREADS (LibTorch reads it; 0 here), else with
// several ranks the cores divided among this host's ranks (LOCAL_WORLD_SIZE;
// 1 when unknown, as torchrun does); 0: LibTorch's default.
int IntraOpThreads(int threads, const LaunchEnv& env);

// One rank of the launch: everything local first (graph, schedule, state,
// data, where --out goes), then the rendezvous, the steps and the final
// state. `comm` is the caller's: on a failed step it must not be destroyed
// (Gloo's destructor waits for collectives still queued on a lost peer).
absl::Status RunRank(const RunArgs& args, const LaunchEnv& env, Logger& log,
                     std::unique_ptr<Communicator>& comm);

}  // namespace run
}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_WORKER_RUN_COMMAND_H_
