// fxdp-worker: runs fxdp graphs with LibTorch. `fxdp-worker --help` lists the
// commands: `run` (run_command.h: a launcher started the ranks; a fixed number
// of steps from files) and `attach` (attach.h: a daemon serving an fxdp
// server). Both set a rank up the same way (common.h).
#include <c10/util/Logging.h>
#include <torch/version.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#ifndef FXDP_WORKER_ONLY
#include "executor/worker/attach.h"
#endif
#include "executor/worker/run_command.h"
#include "util/version.h"

namespace fxdp::executor {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitUsage = 2;

constexpr char kUsage[] =
    "usage: fxdp-worker <command> [args]\n"
    "\n"
    "commands:\n"
    "  run    run a saved graph for a number of steps on state and data files\n"
    "  attach serve an fxdp server: register, heartbeat, run the jobs it assigns\n"
    "\n"
    "Run 'fxdp-worker <command> --help' for the arguments of a command; 'fxdp-worker --version'\n"
    "for the version and the LibTorch it was built with.\n";

}  // namespace
}  // namespace fxdp::executor

int main(int argc, char** argv) {
  // c10/c10d's own log lines (rendezvous retries with stack traces, ...) carry
  // no job, rank or step, and the worker's error repeats what they say: off
  // (FATAL only) unless TORCH_CPP_LOG_LEVEL asks for them.
  if (std::getenv("TORCH_CPP_LOG_LEVEL") == nullptr) FLAGS_caffe2_log_level = 3;
  // A write to the socket of a peer that died raises SIGPIPE, whose default
  // action kills this process without a word (exit -13); ignored, Gloo sees
  // EPIPE and the step fails with an error. (Python ignores SIGPIPE at
  // startup, so torch.distributed never meets this.)
  std::signal(SIGPIPE, SIG_IGN);
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::fputs(fxdp::executor::kUsage, stderr);
    return fxdp::executor::kExitUsage;
  }
  const std::string cmd = args[0];
  args.erase(args.begin());
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::fputs(fxdp::executor::kUsage, stdout);
    return fxdp::executor::kExitOk;
  }
  if (cmd == "--version") {
    std::printf("%s (LibTorch %s)\n", fxdp::util::VersionLine("fxdp-worker").c_str(),
                TORCH_VERSION);
    return fxdp::executor::kExitOk;
  }
  if (cmd == "run") return fxdp::executor::RunCommand(args);
#ifdef FXDP_WORKER_ONLY
  if (cmd == "attach") {
    std::fputs("fxdp-worker: attach is not built (FXDP_WORKER_ONLY=ON: no gRPC); only run\n",
               stderr);
    return fxdp::executor::kExitUsage;
  }
#else
  if (cmd == "attach") return fxdp::executor::AttachCommand(args);
#endif
  std::fprintf(stderr, "fxdp-worker: unknown command '%s'\n\n%s", cmd.c_str(),
               fxdp::executor::kUsage);
  return fxdp::executor::kExitUsage;
}
