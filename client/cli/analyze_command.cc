// fxdp analyze GRAPH --world-size N [--json] [--server HOST:PORT]: the
// BatchDimAnalyzer on a saved graph, locally or through fxdp-server.
#include <cstdio>
#include <string>
#include <vector>

#include "analysis/batch_dim.h"
#include "analysis/ir/proto_codec.h"
#include "client/cli/commands.h"
#include "client/cli/remote.h"
#include "client/cli/connect.h"
#include "util/flags.h"

namespace fxdp::cli {
namespace {

constexpr char kAnalyzeUsage[] =
    "usage: fxdp analyze GRAPH [--world-size N] [--sync-batchnorm] [--json]\n"
    "                    [--server HOST:PORT]\n"
    "\n"
    "Decodes and verifies the binary GraphDef GRAPH, checks every op against the\n"
    "schemas of torch 2.13 (what fxdp-worker runs), follows the batch dim through\n"
    "every node and prints each node's batch dim and placement on N data-parallel\n"
    "ranks (S(d), R, P(sum), P(avg)) with the rule that decided it, then the\n"
    "all-reduces it implies, warnings (ops with no rule) and notes.\n"
    "\n"
    "  --world-size N   number of ranks (default 2)\n"
    "  --sync-batchnorm batch norm in training with the global batch's statistics\n"
    "                   (as `fxdp expand --sync-batchnorm`; default: local, as DDP)\n"
    "  --json           print JSON: {\"world_size\", \"batch_size\", \"nodes\": [{\"name\",\n"
    "                   \"target\", \"batch_dim\", \"placement\", \"placements\", \"reason\"}],\n"
    "                   \"reductions\", \"sharded_reads\", \"warnings\", \"notes\"};\n"
    "                   \"placements\" has one entry per output (null: not a tensor),\n"
    "                   \"placement\" joins them (\"(S(0), P(avg))\" when they differ)\n"
    "  --server HOST:PORT   ask fxdp-server (CompileService.Analyze) instead of\n"
    "                   analysing locally; same output\n"
    FXDP_CLI_CREDENTIAL_USAGE
    "\n"
    "Exit codes: 0 ok, 1 invalid graph or unsupported use of the batch, 2 usage, 3 I/O.\n";

}  // namespace

int AnalyzeCommand(const std::vector<std::string>& args) {
  bool json = false;
  int32_t world = 2;
  util::Flags flags("fxdp analyze", kAnalyzeUsage);
  flags.Int("--world-size", &world);
  flags.Bool("--json", &json);
  bool sync_bn = false;
  flags.Bool("--sync-batchnorm", &sync_bn);
  std::string server;
  flags.String("--server", &server);
  security::ChannelSecurity creds;
  AddCredentialFlags(&flags, &creds);
  std::vector<std::string> pos;
  if (int rc = flags.Parse(args, &pos); rc >= 0) return rc;
  if (pos.size() != 1) return flags.Usage(pos.empty() ? "missing GRAPH" : "takes one GRAPH");
  const std::string& path = pos[0];
  if (!server.empty()) return RemoteAnalyze(server, creds, path, world, json, sync_bn);
  auto g = ir::ReadGraphFile(path);
  if (!g.ok()) return ReportError("analyze", g.status());
  auto a = AnalyzeBatchDims(*g, AnalyzeOptions{world, sync_bn});
  if (!a.ok()) return ReportError("analyze", a.status());
  const std::string out = json ? AnalysisToJson(*g, *a) : AnalysisToTable(*g, *a);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return kExitOk;
}

}  // namespace fxdp::cli
