// fxdp: the command-line client. `fxdp --help` lists the commands.
#include <cstdio>
#include <string>
#include <vector>

#include "client/cli/commands.h"
#include "util/version.h"

namespace {

constexpr char kUsage[] =
    "usage: fxdp <command> [args]\n"
    "\n"
    "commands:\n"
    "  graph     inspect and validate saved graphs (print, check, roundtrip, parse, instantiate)\n"
    "  analyze   batch dim and placement of every node of a saved graph\n"
    "  expand    rewrite a saved graph into per-rank data-parallel graphs\n"
    "  workers   list the workers attached to an fxdp server\n"
    "  run       run a traced training step data-parallel on an fxdp server's workers\n"
    "  jobs      list the jobs of an fxdp server\n"
    "  job       show one job of an fxdp server\n"
    "  cancel    cancel a running job\n"
    "  fetch     write the state a finished job kept (final, or its last step's)\n"
    "  export    a checkpoint the workers wrote as a Hugging Face model.safetensors\n"
    "\n"
    "Run 'fxdp <command> --help' for the arguments of a command; 'fxdp --version' for the "
    "version.\n";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::fputs(kUsage, stderr);
    return fxdp::cli::kExitUsage;
  }
  const std::string cmd = args[0];
  args.erase(args.begin());
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::fputs(kUsage, stdout);
    return fxdp::cli::kExitOk;
  }
  if (cmd == "--version") {
    std::printf("%s\n", fxdp::util::VersionLine("fxdp").c_str());
    return fxdp::cli::kExitOk;
  }
  if (cmd == "graph") return fxdp::cli::GraphCommand(args);
  if (cmd == "analyze") return fxdp::cli::AnalyzeCommand(args);
  if (cmd == "expand") return fxdp::cli::ExpandCommand(args);
  if (cmd == "workers") return fxdp::cli::WorkersCommand(args);
  if (cmd == "run") return fxdp::cli::RunCommand(args);
  if (cmd == "jobs") return fxdp::cli::JobsCommand(args);
  if (cmd == "job") return fxdp::cli::JobCommand(args);
  if (cmd == "cancel") return fxdp::cli::CancelCommand(args);
  if (cmd == "fetch") return fxdp::cli::FetchCommand(args);
  if (cmd == "export") return fxdp::cli::ExportCommand(args);
  std::fprintf(stderr, "fxdp: unknown command '%s'\n\n%s", cmd.c_str(), kUsage);
  return fxdp::cli::kExitUsage;
}
