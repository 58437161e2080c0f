// fxdp expand GRAPH --world-size N -o OUT [--style S] [--bucket-mb X] [--shape NAME=AxB]
// [--json]: the data-parallel expansion of a saved graph (a symbolic one instantiated at
// the --shape's first), locally or through fxdp-server (--server HOST:PORT).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "analysis/batch_dim.h"
#include "analysis/ir/instantiate.h"
#include "analysis/ir/proto_codec.h"
#include "client/cli/commands.h"
#include "client/cli/connect.h"
#include "client/cli/remote.h"
#include "expansion/data_parallel.h"
#include "expansion/style_proto.h"
#include "util/flags.h"

namespace fxdp::cli {
namespace {

constexpr char kExpandUsage[] =
    "usage: fxdp expand GRAPH --world-size N -o OUT [--style replicate|fully_shard]\n"
    "                   [--bucket-mb X] [--first-bucket-mb Y] [--sync-batchnorm]\n"
    "                   [--group NAME] [--shape NAME=AxB ...] [--json]\n"
    "                   [--server HOST:PORT]\n"
    "\n"
    "Analyses the binary GraphDef GRAPH and rewrites it into the graph each of N ranks\n"
    "runs: local batch shapes, gradients all-reduced in buckets that overlap backward,\n"
    "the global loss. Writes OUT when every rank runs the same graph, else one file per\n"
    "rank, OUT with .rank<r> before the extension (x.pb: x.rank0.pb, x.rank1.pb, ...).\n"
    "Ranks differ when B % N != 0 (uneven slices) or when a replicated value is sliced\n"
    "per rank (the report's sharded reads, e.g. a batch-sized constant). stderr names\n"
    "every file written, and so does the --json report (\"files\": [{\"path\",\n"
    "\"ranks\"}]). Then prints the report: rank slices, buckets, collectives and bytes\n"
    "per step.\n"
    "\n"
    "  --world-size N       number of ranks (required)\n"
    "  -o, --out OUT        output file\n"
    "  --style S            replicate (default: every rank holds the whole state,\n"
    "                       gradients all-reduced, as DDP) or fully_shard (each rank\n"
    "                       holds a flat 1/N shard of every parameter and its optimizer\n"
    "                       state; parameters all-gathered before use, gradients\n"
    "                       reduce-scattered, as FSDP). The report lists the sharded\n"
    "                       state (docs/fully_shard.md)\n"
    "  --bucket-mb X        bucket cap in MiB (default 25, DDP's)\n"
    "  --first-bucket-mb Y  cap of the first bucket in MiB (default 1, DDP's)\n"
    "  --last-bucket-mb Z   split the bucket backward fills last into pieces of Z, 2Z,\n"
    "                       4Z, ... MiB so the exposed last all-reduce is small\n"
    "                       (default 1; 0: DDP's buckets as they are)\n"
    "  --no-overlap         keep each wait right before its first use and the optimizer\n"
    "                       after backward's waits (default: all-reduces start as early\n"
    "                       as they can, bucket k's updates run while bucket k+1 reduces)\n"
    "  --sync-batchnorm     batch norm in training normalises with the global batch's\n"
    "                       statistics, all-reduced in forward and backward (as torch's\n"
    "                       SyncBatchNorm): BatchNorm models train exactly like one\n"
    "                       device (default: each rank's local statistics, as DDP)\n"
    "  --group NAME         process group name the collectives use (default \"0\": torch's\n"
    "                       default group)\n" FXDP_CLI_SHAPE_USAGE
    "  --json               print the report as JSON, with \"files\": the files written\n"
    "                       and the ranks that run each\n"
    "  --server HOST:PORT   expand on fxdp-server (CompileService.Expand) instead of\n"
    "                       locally; same files and output (with --shape the graph is\n"
    "                       instantiated here and sent static)\n" FXDP_CLI_CREDENTIAL_USAGE
    "\n"
    "Exit codes: 0 ok, 1 invalid graph or unsupported placement, 2 usage, 3 I/O.\n";

}  // namespace

int ExpandCommand(const std::vector<std::string>& args) {
  std::string out;
  ExpandOptions opts;
  util::Flags flags("fxdp expand", kExpandUsage);
  flags.Int("--world-size", &opts.world_size);
  flags.String("--out", &out, "-o");
  std::string style = "replicate";
  flags.String("--style", &style);
  flags.Double("--bucket-mb", &opts.bucket_cap_mb);
  flags.Double("--first-bucket-mb", &opts.first_bucket_mb);
  flags.Double("--last-bucket-mb", &opts.last_bucket_mb);
  bool no_overlap = false;
  flags.Bool("--no-overlap", &no_overlap);
  flags.Bool("--sync-batchnorm", &opts.sync_batchnorm);
  flags.String("--group", &opts.group_name);
  ServerQuery q;
  AddServerQueryFlags(&flags, /*default_server=*/"", &q);  // no --server: expanded here
  std::string path;
  ir::InputShapes shapes;
  if (int rc = ParseGraphArgs(&flags, args, &path, &shapes); rc >= 0) return rc;
  if (!flags.Seen("--world-size")) return flags.Usage("missing --world-size");
  if (out.empty()) return flags.Usage("missing -o OUT");
  if (!(opts.last_bucket_mb >= 0)) return flags.Usage("--last-bucket-mb must be >= 0");
  opts.overlap_schedule = !no_overlap;
  if (auto st = ParseDataParallelStyle(style); st.ok()) {
    opts.style = *st;
  } else {
    return flags.Usage(absl::StrCat("--style: ", st.status().message()));
  }
  if (!q.server.empty()) {
    RemoteExpandArgs ra;
    ra.server = q.server;
    ra.creds = q.creds;
    ra.path = path;
    ra.out = out;
    ra.world = opts.world_size;
    if (flags.Seen("--bucket-mb")) ra.bucket_cap_mb = opts.bucket_cap_mb;
    if (flags.Seen("--first-bucket-mb")) ra.first_bucket_mb = opts.first_bucket_mb;
    if (flags.Seen("--group")) ra.group_name = opts.group_name;
    if (flags.Seen("--last-bucket-mb")) ra.last_bucket_mb = opts.last_bucket_mb;
    ra.no_overlap_schedule = no_overlap;
    ra.sync_batchnorm = opts.sync_batchnorm;
    ra.style = StyleToProto(opts.style);
    ra.json = q.json;
    ra.shapes = shapes;
    return RemoteExpand(ra);
  }
  auto g = ir::ReadGraphFileAt(path, shapes);
  if (!g.ok()) return ReportError("expand", g.status());
  auto a = AnalyzeBatchDims(*g, AnalyzeOptions{opts.world_size, opts.sync_batchnorm});
  if (!a.ok()) return ReportError("expand", a.status());
  auto e = ExpandDataParallel(*g, *a, opts);
  if (!e.ok()) return ReportError("expand", e.status());
  const int n = static_cast<int>(e->distinct_graphs.size());
  const std::vector<std::string> paths = ExpandOutputPaths(out, e->identical, n);
  for (int r = 0; r < n; ++r) {
    const std::string& p = paths[r];
    absl::Status s = ir::WriteGraphFile(e->graph(r), p);
    if (!s.ok()) return ReportError("expand", s);
    std::fprintf(stderr, "fxdp expand: wrote %s (%s, %d nodes)\n", p.c_str(),
                 e->identical ? "all ranks" : absl::StrCat("rank ", r).c_str(), e->graph(r).size());
  }
  const std::string report = q.json
                                 ? ReportJsonWithFiles(e->report.ToJson(), paths, opts.world_size)
                                 : e->report.ToTable();
  std::fwrite(report.data(), 1, report.size(), stdout);
  return kExitOk;
}

}  // namespace fxdp::cli
