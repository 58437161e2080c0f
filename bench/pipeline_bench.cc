// fxdp_pipeline_bench: decode + analysis + expansion of one serialized graph
// file, timed per phase, with the peak resident memory of the process, so
// that fxdp and its Python baseline (bench/fx_baseline.py) are measured the
// same way on the same bytes (bench/README.md, area 1 and "The programs"). No LibTorch.
//
//   fxdp_pipeline_bench --write_synthetic=NODES --out=PATH
//       writes the synthetic transformer step of about NODES nodes
//       (bench/synthetic_graph.h) as a binary GraphDef and exits.
//   fxdp_pipeline_bench --graph=PATH [--reps=3] [--world_size=8] [--json=OUT]
//       reads PATH once, then runs, --reps times:
//         decode   ir::DecodeGraphBytes (wire -> ir::Node, verifier, name index)
//         analyze  AnalyzeBatchDims(graph, {world_size})
//         expand   ExpandDataParallel(graph, analysis, {world_size}) (every
//                  distinct rank graph, as `fxdp expand` and the server build them)
//       and prints (or writes) JSON: per rep and phase the wall and CPU
//       seconds, and the peak memory of the first rep (a fresh process):
//       VmHWM after it minus VmRSS before it, the file's bytes excluded
//       (they are read before). Everything the rep built is freed after it,
//       untimed.
#include <sys/resource.h>
#include <time.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "analysis/batch_dim.h"
#include "analysis/ir/proto_codec.h"
#include "bench/synthetic_graph.h"
#include "expansion/data_parallel.h"

namespace {

double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A field of /proc/self/status in bytes ("VmRSS", "VmHWM"); -1 if absent.
int64_t ProcStatusBytes(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(field);
  while (std::getline(f, line)) {
    if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':') {
      return std::strtoll(line.c_str() + n + 1, nullptr, 10) * 1024;
    }
  }
  return -1;
}

// Resets VmHWM to the current RSS (Linux >= 4.0); false where not allowed.
bool ResetPeakRss() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (f == nullptr) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

struct Phase {
  double wall = 0, cpu = 0;
};

int Fail(const std::string& what) {
  std::fprintf(stderr, "fxdp_pipeline_bench: %s\n", what.c_str());
  return 1;
}

bool Flag(const char* arg, const char* name, std::string* value) {
  const size_t n = std::strlen(name);
  if (std::strncmp(arg, name, n) != 0 || arg[n] != '=') return false;
  *value = arg + n + 1;
  return true;
}

struct Args {
  std::string synthetic, out, graph_path, json_path;
  int64_t reps = 3, world = 8;
};

// The command line into `a`: -1, or the exit code (1 or 2 after a message).
int ParseArgs(int argc, char** argv, Args* a) {
  std::string v;
  for (int i = 1; i < argc; ++i) {
    if (Flag(argv[i], "--write_synthetic", &a->synthetic) || Flag(argv[i], "--out", &a->out) ||
        Flag(argv[i], "--graph", &a->graph_path) || Flag(argv[i], "--json", &a->json_path)) {
      continue;
    }
    if (Flag(argv[i], "--reps", &v)) {
      if (!absl::SimpleAtoi(v, &a->reps) || a->reps < 1)
        return Fail("--reps needs an integer >= 1");
    } else if (Flag(argv[i], "--world_size", &v)) {
      if (!absl::SimpleAtoi(v, &a->world) || a->world < 1) return Fail("--world_size needs >= 1");
    } else {
      std::fprintf(stderr,
                   "usage: fxdp_pipeline_bench --write_synthetic=NODES --out=PATH\n"
                   "       fxdp_pipeline_bench --graph=PATH [--reps=3] [--world_size=8] "
                   "[--json=OUT]\n");
      return 2;
    }
  }
  return -1;
}

// --write_synthetic=NODES --out=PATH: the exit code.
int WriteSynthetic(const Args& a) {
  int64_t nodes = 0;
  if (!absl::SimpleAtoi(a.synthetic, &nodes) || nodes < 1 || a.out.empty()) {
    return Fail("--write_synthetic=NODES needs NODES >= 1 and --out=PATH");
  }
  absl::StatusOr<std::string> bytes = fxdp::bench::BuildSyntheticGraphBytes(nodes);
  if (!bytes.ok()) return Fail(bytes.status().ToString());
  std::ofstream f(a.out, std::ios::binary);
  f.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
  if (!f.good()) return Fail("cannot write " + a.out);
  return 0;
}

// Every repetition's phases, and what the first one measured.
struct Timings {
  std::vector<Phase> decode, analyze, expand;
  int64_t nodes = 0, expanded_nodes = 0, buckets = 0, peak_rss = -1;
  bool hwm_reset = false;
};

// Decode, analyze and expand `bytes` --reps times, each rep's results freed
// untimed after it.
absl::Status RunReps(const Args& a, const std::string& bytes, Timings* t) {
  int64_t rss_before = 0;
  t->hwm_reset = ResetPeakRss();
  for (int64_t rep = 0; rep < a.reps; ++rep) {
    if (rep == 0) rss_before = ProcStatusBytes("VmRSS");
    double w0 = WallSeconds(), c0 = CpuSeconds();
    std::optional<absl::StatusOr<fxdp::ir::Graph>> g;
    g.emplace(fxdp::ir::DecodeGraphBytes(bytes));
    double w1 = WallSeconds(), c1 = CpuSeconds();
    if (!g->ok()) return g->status();
    const Phase d = {w1 - w0, c1 - c0};
    std::optional<absl::StatusOr<fxdp::BatchDimAnalysis>> an;
    an.emplace(fxdp::AnalyzeBatchDims(**g, {static_cast<int32_t>(a.world)}));
    double w2 = WallSeconds(), c2 = CpuSeconds();
    if (!an->ok()) return an->status();
    const Phase an_phase = {w2 - w1, c2 - c1};
    fxdp::ExpandOptions eo;
    eo.world_size = static_cast<int32_t>(a.world);
    std::optional<absl::StatusOr<fxdp::Expansion>> ex;
    ex.emplace(fxdp::ExpandDataParallel(**g, **an, eo));
    double w3 = WallSeconds(), c3 = CpuSeconds();
    if (!ex->ok()) return ex->status();
    const Phase e = {w3 - w2, c3 - c2};
    if (rep == 0) {
      // The HWM was reset to the RSS with the file read; where /proc does
      // not allow the reset it is the process's whole-life peak (the same
      // here: nothing larger ran before).
      t->peak_rss = ProcStatusBytes("VmHWM") - rss_before;
      t->nodes = (*g)->size();
      t->expanded_nodes = (**ex).distinct_graphs.empty() ? 0 : (**ex).graph(0).size();
      t->buckets = static_cast<int64_t>((**ex).report.buckets.size());
    }
    t->decode.push_back(d);
    t->analyze.push_back(an_phase);
    t->expand.push_back(e);
    ex.reset();
    an.reset();
    g.reset();
  }
  return absl::OkStatus();
}

std::string ResultJson(const Args& a, size_t wire_bytes, const Timings& t) {
  auto list = [](const std::vector<Phase>& ps, bool cpu) {
    std::string s = "[";
    for (size_t i = 0; i < ps.size(); ++i) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%s%.6f", i ? ", " : "", cpu ? ps[i].cpu : ps[i].wall);
      s += buf;
    }
    return s + "]";
  };
  std::string json = "{\n";
  json += "  \"impl\": \"fxdp\",\n";
  json += "  \"graph\": \"" + a.graph_path + "\",\n";
  json += "  \"nodes\": " + std::to_string(t.nodes) + ",\n";
  json += "  \"wire_bytes\": " + std::to_string(wire_bytes) + ",\n";
  json += "  \"world_size\": " + std::to_string(a.world) + ",\n";
  json += "  \"reps\": " + std::to_string(a.reps) + ",\n";
  json += "  \"expanded_nodes\": " + std::to_string(t.expanded_nodes) + ",\n";
  json += "  \"buckets\": " + std::to_string(t.buckets) + ",\n";
  json += "  \"peak_rss_bytes\": " + std::to_string(t.peak_rss) + ",\n";
  json += "  \"peak_rss_method\": \"" +
          std::string(t.hwm_reset ? "VmHWM (reset before rep 1) - VmRSS before rep 1"
                                  : "VmHWM - VmRSS before rep 1") +
          "\",\n";
  const char* names[] = {"decode", "analyze", "expand"};
  const std::vector<Phase>* phases[] = {&t.decode, &t.analyze, &t.expand};
  for (int k = 0; k < 3; ++k) {
    json += std::string("  \"") + names[k] + "_wall_s\": " + list(*phases[k], false) + ",\n";
    json += std::string("  \"") + names[k] + "_cpu_s\": " + list(*phases[k], true) + ",\n";
  }
  json += "  \"threads\": 1\n}\n";
  return json;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (const int rc = ParseArgs(argc, argv, &a); rc >= 0) return rc;
  if (!a.synthetic.empty()) return WriteSynthetic(a);
  if (a.graph_path.empty()) return Fail("--graph=PATH or --write_synthetic=NODES is needed");
  absl::StatusOr<std::string> bytes = fxdp::ir::ReadFileBytes(a.graph_path);
  if (!bytes.ok()) return Fail(bytes.status().ToString());
  Timings t;
  if (absl::Status s = RunReps(a, *bytes, &t); !s.ok()) return Fail(s.ToString());
  const std::string json = ResultJson(a, bytes->size(), t);
  if (a.json_path.empty()) {
    std::fputs(json.c_str(), stdout);
  } else {
    std::ofstream f(a.json_path);
    f << json;
    if (!f.good()) return Fail("cannot write " + a.json_path);
  }
  return 0;
}
