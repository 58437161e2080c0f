// Host overhead per node of the LibTorch interpreter (executor/interpreter.h)
// on a chain of tiny ops (bench/README.md, "Executor"):
//
//   BM_ProgramRun/N    Program::Run of a chain of N one-element ops,
//                      alternating aten::add.Tensor(%v, %x) and
//                      aten::mul.Tensor(%v, %y): the interpreter's cost per node
//                      (argument stack, boxed dispatcher call, value table) on
//                      top of the kernels' own.
//   BM_DirectAten/N    the same op sequence as direct at::add / at::mul calls
//                      from C++ (unboxed, no interpreter): the floor.
//   BM_ProgramLoad/N   Program::Load of that graph (a one-time cost per graph).
//
// Counters: ns_per_node (wall time of the timed part per iteration / N, from
// steady_clock; every benchmark also uses real time, as the Python baselines
// do), nodes. Everything runs under
// c10::InferenceMode, as Program::Run does by default, with 1 intra-op thread.
//
// `fxdp_executor_bench --write_chain=PATH [--chain_nodes=N]` writes the chain
// graph (binary fxdp.v1.GraphDef) to PATH and exits: bench/executor_baselines.py
// runs PyTorch eager and torch.fx.Interpreter on that same graph.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <c10/core/InferenceMode.h>
#include <torch/headeronly/version.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "analysis/ir/proto_codec.h"
#include "analysis/ir/text.h"
#include "executor/interpreter.h"

namespace fxdp::bench {
namespace {

// x and y: one-element f32 inputs. v_i = v_{i-1} + x (even i) or v_{i-1} * y
// (odd i), v_{-1} = x; with x = 1e-3 and y = 0.999 the values stay near 1 (no
// denormals, no overflow).
constexpr float kX = 1e-3f;
constexpr float kY = 0.999f;

ir::Graph ChainGraph(int nodes) {
  std::string text = absl::StrCat(
      "graph format=1 producer=\"fxdp executor_bench\" torch=\"", TORCH_VERSION, "\" {\n",
      "  %x: f32[1] = placeholder() {role=INPUT, state=\"x\", batch_dim=-1}\n",
      "  %y: f32[1] = placeholder() {role=INPUT, state=\"y\", batch_dim=-1}\n");
  std::string prev = "x";
  for (int i = 0; i < nodes; ++i) {
    absl::StrAppend(&text, "  %v", i, ": f32[1] = aten::", i % 2 == 0 ? "add" : "mul", ".Tensor(%",
                    prev, ", %", i % 2 == 0 ? "x" : "y", ")\n");
    prev = absl::StrCat("v", i);
  }
  absl::StrAppend(&text, "  %output = output([%", prev, "]) {specs=[OTHER]}\n}\n");
  auto g = ir::ParseGraphText(text);
  if (!g.ok()) {
    std::fprintf(stderr, "chain graph: %s\n", g.status().ToString().c_str());
    std::abort();
  }
  return *std::move(g);
}

executor::Program LoadOrDie(const ir::Graph& g) {
  auto p = executor::Program::Load(g, c10::Device(c10::kCPU));
  if (!p.ok()) {
    std::fprintf(stderr, "Program::Load: %s\n", p.status().ToString().c_str());
    std::abort();
  }
  return *std::move(p);
}

double NowNs() {
  return std::chrono::duration<double, std::nano>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// `ns`: wall time of the timed parts of all iterations.
void SetCounters(benchmark::State& state, int nodes, double ns) {
  state.counters["nodes"] = nodes;
  state.counters["ns_per_node"] =
      state.iterations() > 0 ? ns / static_cast<double>(state.iterations()) / nodes : 0.0;
}

void BM_ProgramRun(benchmark::State& state) {
  const int nodes = static_cast<int>(state.range(0));
  const ir::Graph g = ChainGraph(nodes);
  executor::Program p = LoadOrDie(g);
  const at::Tensor x = at::full({1}, kX), y = at::full({1}, kY);
  double ns = 0;
  for (auto _ : state) {
    const double t0 = NowNs();
    auto out = p.Run({x, y});
    ns += NowNs() - t0;
    if (!out.ok()) {
      state.SkipWithError(out.status().ToString().c_str());
      break;
    }
    benchmark::DoNotOptimize(out->front());
  }
  SetCounters(state, nodes, ns);
}

void BM_DirectAten(benchmark::State& state) {
  const int nodes = static_cast<int>(state.range(0));
  c10::InferenceMode guard;
  const at::Tensor x = at::full({1}, kX), y = at::full({1}, kY);
  double ns = 0;
  for (auto _ : state) {
    const double t0 = NowNs();
    at::Tensor v = x;
    for (int i = 0; i < nodes; ++i) v = (i % 2 == 0) ? at::add(v, x) : at::mul(v, y);
    benchmark::DoNotOptimize(v);
    v.reset();
    ns += NowNs() - t0;
  }
  SetCounters(state, nodes, ns);
}

void BM_ProgramLoad(benchmark::State& state) {
  const int nodes = static_cast<int>(state.range(0));
  const ir::Graph g = ChainGraph(nodes);
  double ns = 0;
  for (auto _ : state) {
    const double t0 = NowNs();
    executor::Program p = LoadOrDie(g);
    ns += NowNs() - t0;
    benchmark::DoNotOptimize(p);
    state.PauseTiming();
    { executor::Program gone = std::move(p); }
    state.ResumeTiming();
  }
  SetCounters(state, nodes, ns);
}

BENCHMARK(BM_ProgramRun)->Arg(10000)->Arg(100000)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DirectAten)->Arg(10000)->Arg(100000)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ProgramLoad)->Arg(10000)->UseRealTime()->Unit(benchmark::kMillisecond);

// --write_chain=PATH [--chain_nodes=N]: write the graph and exit.
int MaybeWriteChain(int* argc, char** argv) {
  std::string path;
  int nodes = 10000;
  int out = 1;
  for (int i = 1; i < *argc; ++i) {
    if (std::strncmp(argv[i], "--write_chain=", 14) == 0) {
      path = argv[i] + 14;
    } else if (std::strncmp(argv[i], "--chain_nodes=", 14) == 0) {
      nodes = std::atoi(argv[i] + 14);
    } else {
      argv[out++] = argv[i];
    }
  }
  *argc = out;
  if (path.empty()) return -1;
  if (nodes < 1) {
    std::fprintf(stderr, "--chain_nodes must be positive\n");
    return 2;
  }
  const absl::Status s = ir::WriteGraphFile(ChainGraph(nodes), path);
  if (!s.ok()) {
    std::fprintf(stderr, "writing %s: %s\n", path.c_str(), s.ToString().c_str());
    return 3;
  }
  std::printf("wrote %s (%d call nodes)\n", path.c_str(), nodes);
  return 0;
}

}  // namespace
}  // namespace fxdp::bench

int main(int argc, char** argv) {
  if (int rc = fxdp::bench::MaybeWriteChain(&argc, argv); rc >= 0) return rc;
  at::set_num_threads(1);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
