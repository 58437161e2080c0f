// fxdp analyze GRAPH --world-size N [--json] [--style S] [--shape NAME=AxB]
// [--server HOST:PORT]:
// the BatchDimAnalyzer on a saved graph (with a style, seen through its
// expansion: expansion/state_memory.h), locally or through fxdp-server.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "analysis/batch_dim.h"
#include "analysis/ir/instantiate.h"
#include "client/cli/commands.h"
#include "client/cli/connect.h"
#include "client/cli/remote.h"
#include "expansion/state_memory.h"
#include "expansion/style_proto.h"
#include "util/flags.h"

namespace fxdp::cli {
namespace {

constexpr char kAnalyzeUsage[] =
    "usage: fxdp analyze GRAPH [--world-size N] [--sync-batchnorm] [--json] [--source]\n"
    "                    [--style replicate|fully_shard [--bucket-mb X]]\n"
    "                    [--shape NAME=AxB ...]\n"
    "                    [--server HOST:PORT]\n"
    "\n"
    "Decodes and verifies the binary GraphDef GRAPH, checks every op against the\n"
    "schemas of torch 2.13 (what fxdp-worker runs), follows the batch dim through\n"
    "every node and prints each node's batch dim and placement on N data-parallel\n"
    "ranks (S(d), R, P(sum), P(avg)) with the rule that decided it, then the\n"
    "all-reduces it implies, warnings and notes. An op with no batch-dim rule is\n"
    "placed by matching sizes and labelled GUESSED (a warning per op): exploration\n"
    "only, `fxdp expand` and jobs refuse such a graph.\n"
    "\n"
    "  --world-size N   number of ranks (default 2)\n"
    "  --source         the table shows each node's line of the user's code\n"
    "  --sync-batchnorm batch norm in training with the global batch's statistics\n"
    "                   (as `fxdp expand --sync-batchnorm`; default: local, as DDP)\n"
    "  --json           print JSON: {\"world_size\", \"batch_size\", \"nodes\": [{\"name\",\n"
    "                   \"target\", \"batch_dim\", \"placement\", \"placements\", \"reason\",\n"
    "                   \"source\" (the user's line, when the graph records it)}],\n"
    "                   \"reductions\", \"sharded_reads\", \"warnings\", \"notes\"};\n"
    "                   \"placements\" has one entry per output (null: not a tensor),\n"
    "                   \"placement\" joins them (\"(S(0), P(avg))\" when they differ)\n"
    "  --style S        also expand for style S (replicate or fully_shard, as `fxdp\n"
    "                   expand --style`): the state fully_shard shards is S(0), a flat\n"
    "                   shard of the whole tensor, with the reason; then the state each\n"
    "                   rank holds (parameters, gradients, optimizer state, other\n"
    "                   state, gathered units, largest bucket: a lower bound of the\n"
    "                   peak, what fxdp-server checks against a worker's registered\n"
    "                   memory before it runs a job); --json adds \"style\" and\n"
    "                   \"memory\" (the same fields, \"total_bytes\")\n"
    "  --bucket-mb X    with --style: the unit and bucket cap in MiB (default "
    "25)\n" FXDP_CLI_SHAPE_USAGE
    "  --server HOST:PORT   ask fxdp-server (CompileService.Analyze) instead of\n"
    "                   analysing locally; same output (with --shape the graph is\n"
    "                   instantiated here and sent static)\n" FXDP_CLI_CREDENTIAL_USAGE
    "\n"
    "Exit codes: 0 ok, 1 invalid graph or unsupported use of the batch, 2 usage, 3 I/O.\n";

}  // namespace

int AnalyzeCommand(const std::vector<std::string>& args) {
  int32_t world = 2;
  util::Flags flags("fxdp analyze", kAnalyzeUsage);
  flags.Int("--world-size", &world);
  bool with_source = false;
  flags.Bool("--source", &with_source);
  bool sync_bn = false;
  flags.Bool("--sync-batchnorm", &sync_bn);
  std::string style;
  flags.String("--style", &style);
  double bucket_mb = 0;
  flags.Double("--bucket-mb", &bucket_mb);
  ServerQuery q;
  AddServerQueryFlags(&flags, /*default_server=*/"", &q);  // no --server: analyzed here
  std::string path;
  ir::InputShapes shapes;
  if (int rc = ParseGraphArgs(&flags, args, &path, &shapes); rc >= 0) return rc;
  const bool styled = flags.Seen("--style");
  ExpandOptions opts;
  if (styled) {
    absl::StatusOr<DataParallelStyle> st = ParseDataParallelStyle(style);
    if (!st.ok()) return flags.Usage(absl::StrCat("--style: ", st.status().message()));
    opts.style = *st;
  } else if (flags.Seen("--bucket-mb")) {
    return flags.Usage("--bucket-mb needs --style");
  }
  if (!(bucket_mb >= 0) || !std::isfinite(bucket_mb))
    return flags.Usage("--bucket-mb must be >= 0");
  if (!q.server.empty()) {
    RemoteAnalyzeArgs ra;
    ra.server = q.server;
    ra.creds = q.creds;
    ra.path = path;
    ra.world = world;
    ra.json = q.json;
    ra.sync_batchnorm = sync_bn;
    if (styled) ra.style = StyleToProto(opts.style);
    ra.bucket_cap_mb = bucket_mb;
    ra.with_source = with_source;
    ra.shapes = shapes;
    return RemoteAnalyze(ra);
  }
  auto g = ir::ReadGraphFileAt(path, shapes);
  if (!g.ok()) return ReportError("analyze", g.status());
  // Exploration: an op without a rule is placed by a labelled guess (expand refuses it).
  auto a = AnalyzeBatchDims(*g, AnalyzeOptions{world, sync_bn, /*guess_unruled_ops=*/true});
  if (!a.ok()) return ReportError("analyze", a.status());
  std::string out;
  if (styled) {
    opts.world_size = world;
    opts.sync_batchnorm = sync_bn;
    if (bucket_mb > 0) opts.bucket_cap_mb = bucket_mb;
    absl::StatusOr<StyledAnalysis> s = AnalyzeStyle(*g, *a, opts);
    if (!s.ok()) return ReportError("analyze", s.status());
    out =
        q.json ? StyledAnalysisToJson(*g, *a, *s) : StyledAnalysisToTable(*g, *a, *s, with_source);
  } else {
    out = q.json ? AnalysisToJson(*g, *a) : AnalysisToTable(*g, *a, nullptr, with_source);
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return kExitOk;
}

}  // namespace fxdp::cli
