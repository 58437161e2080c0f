// fxdp_shape_bench: what a new batch shape costs the server (issue 26:
// "a new shape costs at most 2 s for a 12-layer GPT-2"; bench/README.md,
// area 9, docs/shapes.md).
//
//   fxdp_shape_bench --graph=G.pb --shape=input_ids=8x64,labels=8x64 ...
//       [--world_size=2] [--reps=3]
//     G.pb is a graph traced with symbolic sizes (trace_step(...,
//     dynamic=True)); the first --shape is its traced example's (the job's
//     graph 0, compiled at Submit), each further one a new shape of a step.
//     Each repetition builds the server's ShapeVariants
//     (server/jobs/shape_variants.h) over the compile service's expansion
//     (RunExpand: a compile-cache miss), pins the first shape and asks for
//     each further one, as a job's steps loop does: the instantiation at the
//     shape, its analysis and its expansion for --world_size ranks. Prints a
//     JSON line per shape: its compile_ms per repetition (ShapeVariant's, as
//     JobInfo.shapes reports it), process CPU ms, and the rank graph's bytes
//     (what each worker's LoadGraph carries).
//
// Exit codes: 0 ok, 1 a failed compile, 2 usage.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "analysis/ir/instantiate.h"
#include "analysis/ir/proto_codec.h"
#include "server/compile/compile_service.h"
#include "server/jobs/shape_variants.h"

namespace {

using fxdp::ir::InputShapes;

bool Flag(const char* arg, const char* name, std::string* value) {
  const size_t n = std::strlen(name);
  if (std::strncmp(arg, name, n) != 0 || arg[n] != '=') return false;
  *value = arg + n + 1;
  return true;
}

int Usage(const std::string& why) {
  std::fprintf(stderr,
               "fxdp_shape_bench: %s\nusage: fxdp_shape_bench --graph=G.pb --shape=NAME=AxB,... "
               "[--shape=...] [--world_size=2] [--reps=3]\n",
               why.c_str());
  return 2;
}

double CpuMs() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

// One repetition: every shape after the first compiled by a fresh ShapeVariants.
bool Repetition(const fxdp::v1::ExpandRequest& request, const std::vector<InputShapes>& shapes,
                std::vector<std::vector<double>>* ms, std::vector<std::vector<double>>* cpu,
                std::vector<size_t>* bytes) {
  fxdp::server::ShapeVariants variants(request, fxdp::server::RunExpand, 64);
  absl::StatusOr<fxdp::v1::GraphDef> at = fxdp::ir::InstantiateDef(request.graph(), shapes[0]);
  fxdp::v1::ExpandRequest pinned = request;
  if (at.ok()) *pinned.mutable_graph() = *std::move(at);
  absl::StatusOr<fxdp::v1::ExpandResponse> first =
      at.ok() ? fxdp::server::RunExpand(pinned) : at.status();
  if (!first.ok()) {
    std::fprintf(stderr, "the first shape: %s\n", std::string(first.status().message()).c_str());
    return false;
  }
  variants.Pin(shapes[0], std::make_shared<fxdp::v1::ExpandResponse>(*std::move(first)), 0);
  for (size_t i = 1; i < shapes.size(); ++i) {
    const double c0 = CpuMs();
    absl::StatusOr<fxdp::server::ShapeVariant> v = variants.Get(shapes[i]);
    const double c1 = CpuMs();
    if (!v.ok()) {
      std::fprintf(stderr, "%s: %s\n", fxdp::ir::InputShapesText(shapes[i]).c_str(),
                   std::string(v.status().message()).c_str());
      return false;
    }
    (*ms)[i].push_back(v->compile_ms);
    (*cpu)[i].push_back(c1 - c0);
    (*bytes)[i] = v->expanded->graphs(0).ByteSizeLong();
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string graph_path, v;
  std::vector<InputShapes> shapes;
  int world = 2, reps = 3;
  for (int i = 1; i < argc; ++i) {
    if (Flag(argv[i], "--graph", &graph_path)) continue;
    if (Flag(argv[i], "--shape", &v)) {
      InputShapes s;
      for (absl::string_view part : absl::StrSplit(v, ',', absl::SkipEmpty())) {
        if (absl::Status st = fxdp::ir::ParseInputShape(part, &s); !st.ok())
          return Usage(std::string(st.message()));
      }
      shapes.push_back(std::move(s));
    } else if (Flag(argv[i], "--world_size", &v)) {
      if (!absl::SimpleAtoi(v, &world) || world < 1) return Usage("--world_size is not >= 1");
    } else if (Flag(argv[i], "--reps", &v)) {
      if (!absl::SimpleAtoi(v, &reps) || reps < 1) return Usage("--reps is not >= 1");
    } else {
      return Usage(std::string("unknown argument ") + argv[i]);
    }
  }
  if (graph_path.empty() || shapes.size() < 2) return Usage("--graph and two --shape are needed");
  absl::StatusOr<std::string> bytes = fxdp::ir::ReadFileBytes(graph_path);
  fxdp::v1::ExpandRequest request;
  if (!bytes.ok() || !request.mutable_graph()->ParseFromString(*bytes))
    return Usage("cannot read the graph " + graph_path);
  request.set_world_size(world);
  std::vector<std::vector<double>> ms(shapes.size()), cpu(shapes.size());
  std::vector<size_t> rank_bytes(shapes.size(), 0);
  for (int r = 0; r < reps; ++r) {
    if (!Repetition(request, shapes, &ms, &cpu, &rank_bytes)) return 1;
  }
  for (size_t i = 1; i < shapes.size(); ++i) {
    std::printf(
        "{\"shape\": \"%s\", \"world_size\": %d, \"graph_bytes\": %zu, \"rank_graph_bytes\": %zu, "
        "\"compile_ms\": [%s], \"cpu_ms\": [%s]}\n",
        fxdp::ir::InputShapesText(shapes[i], " ").c_str(), world, bytes->size(), rank_bytes[i],
        absl::StrJoin(ms[i], ", ").c_str(), absl::StrJoin(cpu[i], ", ").c_str());
  }
  return 0;
}
