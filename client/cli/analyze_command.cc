// fxdp analyze GRAPH --world-size N [--json]: the BatchDimAnalyzer on a saved
// graph, no server.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "analysis/batch_dim.h"
#include "analysis/ir/proto_codec.h"
#include "client/cli/commands.h"

namespace fxdp::cli {
namespace {

constexpr char kAnalyzeUsage[] =
    "usage: fxdp analyze GRAPH [--world-size N] [--json]\n"
    "\n"
    "Decodes and verifies the binary GraphDef GRAPH, follows the batch dim through\n"
    "every node and prints each node's batch dim and placement on N data-parallel\n"
    "ranks (S(d), R, P(sum), P(avg)) with the rule that decided it, then the\n"
    "all-reduces it implies, warnings (ops with no rule) and notes.\n"
    "\n"
    "  --world-size N   number of ranks (default 2)\n"
    "  --json           print JSON: {\"world_size\", \"batch_size\", \"nodes\": [{\"name\",\n"
    "                   \"target\", \"batch_dim\", \"placement\", \"reason\"}], \"reductions\",\n"
    "                   \"sharded_reads\", \"warnings\", \"notes\"}\n"
    "\n"
    "Exit codes: 0 ok, 1 invalid graph or unsupported use of the batch, 2 usage, 3 I/O.\n";

int Usage(const std::string& msg) {
  std::fprintf(stderr, "fxdp analyze: %s\n\n%s", msg.c_str(), kAnalyzeUsage);
  return kExitUsage;
}

}  // namespace

int AnalyzeCommand(const std::vector<std::string>& args) {
  std::string path;
  bool json = false;
  int32_t world = 2;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kAnalyzeUsage, stdout);
      return kExitOk;
    }
    if (a == "--json") {
      json = true;
    } else if (a == "--world-size" || a.rfind("--world-size=", 0) == 0) {
      std::string v;
      if (a == "--world-size") {
        if (i + 1 == args.size()) return Usage("--world-size needs a value");
        v = args[++i];
      } else {
        v = a.substr(sizeof("--world-size=") - 1);
      }
      if (!absl::SimpleAtoi(v, &world)) {
        return Usage("--world-size must be an integer, got '" + v + "'");
      }
    } else if (!a.empty() && a[0] == '-') {
      return Usage("unknown flag " + a);
    } else if (path.empty()) {
      path = a;
    } else {
      return Usage("takes one GRAPH, got '" + path + "' and '" + a + "'");
    }
  }
  if (path.empty()) return Usage("missing GRAPH");
  auto g = ir::ReadGraphFile(path);
  if (!g.ok()) return ReportError("analyze", g.status());
  auto a = AnalyzeBatchDims(*g, AnalyzeOptions{world});
  if (!a.ok()) return ReportError("analyze", a.status());
  const std::string out = json ? AnalysisToJson(*g, *a) : AnalysisToTable(*g, *a);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return kExitOk;
}

}  // namespace fxdp::cli
