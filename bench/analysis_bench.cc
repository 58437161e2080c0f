// Decode + BatchDimAnalyzer speed and memory on synthetic transformer
// training steps of ~10k, ~100k and ~1M nodes (bench/README.md).
//
//   BM_Decode             GraphDef bytes -> verified ir::Graph (DecodeGraphBytes)
//   BM_Analyze            AnalyzeBatchDims(graph, {.world_size = 8}) on a decoded graph
//   BM_DecodeAndAnalyze   both, as `fxdp analyze` or the server does
//   BM_Expand             ExpandDataParallel(graph, analysis, {.world_size = 8}) on a
//                         decoded and analysed graph (every rank's graph)
//   BM_DecodeAnalyzeExpand  all three, as `fxdp expand` or the server's Expand does
//
// Counters: ns_per_node (CPU time / nodes; the console prints 2500 as
// "2.5k"), items_per_second (nodes/s),
// nodes, and, from one extra untimed run with allocation tracking:
// bytes_per_node (heap the decoded graph and the analysis result hold),
// analysis_bytes_per_node (the result alone), peak_bytes_per_node (highest
// heap use during the run, the transient protobuf message included),
// analysis_peak_bytes_per_node (highest heap use of AnalyzeBatchDims on top
// of the graph, its temporaries included) and wire_bytes_per_node (size of
// the serialized input, which is not counted in the others).
// Freeing the results is not timed.
#include <benchmark/benchmark.h>
#include <malloc.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <new>
#include <optional>
#include <string>

#include "analysis/batch_dim.h"
#include "analysis/ir/proto_codec.h"
#include "bench/synthetic_graph.h"
#include "expansion/data_parallel.h"

// ---- heap accounting: every operator new/delete, counted only while
// g_tracking is set (one untimed run per benchmark), so timed loops pay one
// predictable branch.
namespace {
std::atomic<bool> g_tracking{false};
std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};

void* Allocate(std::size_t n) {
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  if (g_tracking.load(std::memory_order_relaxed)) {
    const int64_t live =
        g_live.fetch_add(static_cast<int64_t>(malloc_usable_size(p)), std::memory_order_relaxed) +
        static_cast<int64_t>(malloc_usable_size(p));
    int64_t peak = g_peak.load(std::memory_order_relaxed);
    while (live > peak && !g_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
    }
  }
  return p;
}
void Deallocate(void* p) {
  if (p == nullptr) return;
  if (g_tracking.load(std::memory_order_relaxed))
    g_live.fetch_sub(static_cast<int64_t>(malloc_usable_size(p)), std::memory_order_relaxed);
  std::free(p);
}
}  // namespace

void* operator new(std::size_t n) { return Allocate(n); }
void* operator new[](std::size_t n) { return Allocate(n); }
void operator delete(void* p) noexcept { Deallocate(p); }
void operator delete[](void* p) noexcept { Deallocate(p); }
void operator delete(void* p, std::size_t) noexcept { Deallocate(p); }
void operator delete[](void* p, std::size_t) noexcept { Deallocate(p); }

namespace fxdp::bench {
namespace {

constexpr AnalyzeOptions kOptions{.world_size = 8};

// This thread's CPU time in ns (the clock Google Benchmark's CPU column uses).
double CpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

// Serialized synthetic graphs, built once per size.
const std::string& GraphBytes(int64_t target_nodes) {
  static auto* cache = new std::map<int64_t, std::string>();
  auto it = cache->find(target_nodes);
  if (it == cache->end()) {
    absl::StatusOr<std::string> bytes = BuildSyntheticGraphBytes(target_nodes);
    if (!bytes.ok()) {
      std::fprintf(stderr, "synthetic graph of %lld nodes: %s\n",
                   static_cast<long long>(target_nodes), bytes.status().ToString().c_str());
      std::abort();
    }
    it = cache->emplace(target_nodes, *std::move(bytes)).first;
  }
  return it->second;
}

struct Memory {
  int64_t graph = 0;           // held by the decoded graph
  int64_t analysis = 0;        // held by the analysis result
  int64_t expansion = 0;       // held by the expansion (every rank's graph + the report)
  int64_t peak = 0;            // highest heap use during decode + analysis (+ expansion)
  int64_t analysis_peak = 0;   // highest heap use of the analysis alone (graph excluded)
  int64_t expansion_peak = 0;  // highest heap use of the expansion alone (graph and
                               // analysis excluded)
};

ExpandOptions ExpandOpts() {
  ExpandOptions o;
  o.world_size = kOptions.world_size;
  return o;
}

// One untimed decode (+ analysis (+ expansion)) with allocation tracking.
Memory MeasureMemory(const std::string& bytes, bool analyze, bool expand = false) {
  Memory m;
  std::optional<absl::StatusOr<ir::Graph>> g;
  std::optional<absl::StatusOr<BatchDimAnalysis>> a;
  std::optional<absl::StatusOr<Expansion>> e;
  g_live = 0;
  g_peak = 0;
  g_tracking = true;
  g.emplace(ir::DecodeGraphBytes(bytes));
  m.graph = g_live;
  m.peak = g_peak;
  if (analyze && g->ok()) {
    g_peak = m.graph;
    a.emplace(AnalyzeBatchDims(**g, kOptions));
    m.analysis = g_live - m.graph;
    m.analysis_peak = g_peak - m.graph;
    m.peak = std::max(m.peak, g_peak.load());
    if (expand && a->ok()) {
      const int64_t before = g_live;
      g_peak = before;
      e.emplace(ExpandDataParallel(**g, **a, ExpandOpts()));
      m.expansion = g_live - before;
      m.expansion_peak = g_peak - before;
      m.peak = std::max(m.peak, g_peak.load());
    }
  }
  g_tracking = false;
  return m;
}

// `cpu_ns`: CPU time of the timed parts of all iterations.
void SetCommonCounters(benchmark::State& state, int64_t nodes, int64_t wire_bytes, double cpu_ns) {
  state.SetItemsProcessed(state.iterations() * nodes);
  state.SetComplexityN(nodes);
  state.counters["nodes"] = static_cast<double>(nodes);
  state.counters["ns_per_node"] =
      cpu_ns / static_cast<double>(std::max<int64_t>(1, state.iterations() * nodes));
  state.counters["wire_bytes_per_node"] =
      static_cast<double>(wire_bytes) / static_cast<double>(nodes);
}

void SetMemoryCounters(benchmark::State& state, const Memory& m, int64_t nodes, bool analysis,
                       bool expansion = false) {
  const double n = static_cast<double>(nodes);
  state.counters["bytes_per_node"] = static_cast<double>(m.graph + m.analysis + m.expansion) / n;
  if (expansion) {
    state.counters["expansion_bytes_per_node"] = static_cast<double>(m.expansion) / n;
    state.counters["expansion_peak_bytes_per_node"] = static_cast<double>(m.expansion_peak) / n;
  }
  if (analysis) {
    state.counters["analysis_bytes_per_node"] = static_cast<double>(m.analysis) / n;
    state.counters["analysis_peak_bytes_per_node"] = static_cast<double>(m.analysis_peak) / n;
  }
  state.counters["peak_bytes_per_node"] = static_cast<double>(m.peak) / n;
}

void BM_Decode(benchmark::State& state) {
  const std::string& bytes = GraphBytes(state.range(0));
  const Memory mem = MeasureMemory(bytes, /*analyze=*/false);
  int64_t nodes = 0;
  double cpu_ns = 0;
  for (auto _ : state) {
    const double start = CpuNs();
    std::optional<absl::StatusOr<ir::Graph>> g;
    g.emplace(ir::DecodeGraphBytes(bytes));
    benchmark::DoNotOptimize(*g);
    cpu_ns += CpuNs() - start;
    if (!g->ok()) {
      state.SkipWithError(g->status().ToString().c_str());
      break;
    }
    nodes = (*g)->size();
    state.PauseTiming();
    g.reset();
    state.ResumeTiming();
  }
  SetCommonCounters(state, nodes, static_cast<int64_t>(bytes.size()), cpu_ns);
  SetMemoryCounters(state, mem, nodes, /*analysis=*/false);
}

void BM_Analyze(benchmark::State& state) {
  const std::string& bytes = GraphBytes(state.range(0));
  absl::StatusOr<ir::Graph> g = ir::DecodeGraphBytes(bytes);
  if (!g.ok()) {
    state.SkipWithError(g.status().ToString().c_str());
    return;
  }
  int64_t warnings = 0;
  double cpu_ns = 0;
  for (auto _ : state) {
    const double start = CpuNs();
    std::optional<absl::StatusOr<BatchDimAnalysis>> a;
    a.emplace(AnalyzeBatchDims(*g, kOptions));
    benchmark::DoNotOptimize(*a);
    cpu_ns += CpuNs() - start;
    if (!a->ok()) {
      state.SkipWithError(a->status().ToString().c_str());
      break;
    }
    warnings = static_cast<int64_t>((*a)->warnings().size());
    state.PauseTiming();
    a.reset();
    state.ResumeTiming();
  }
  SetCommonCounters(state, g->size(), static_cast<int64_t>(bytes.size()), cpu_ns);
  state.counters["warnings"] = static_cast<double>(warnings);
}

// Decode + analysis (+ expansion), as `fxdp analyze` (`fxdp expand`) and the
// server do; freeing the results is not timed.
void DecodeAnalyze(benchmark::State& state, bool expand) {
  const std::string& bytes = GraphBytes(state.range(0));
  const Memory mem = MeasureMemory(bytes, /*analyze=*/true, expand);
  int64_t nodes = 0;
  double cpu_ns = 0;
  for (auto _ : state) {
    const double start = CpuNs();
    std::optional<absl::StatusOr<ir::Graph>> g;
    std::optional<absl::StatusOr<BatchDimAnalysis>> a;
    std::optional<absl::StatusOr<Expansion>> e;
    g.emplace(ir::DecodeGraphBytes(bytes));
    if (!g->ok()) {
      state.SkipWithError(g->status().ToString().c_str());
      break;
    }
    a.emplace(AnalyzeBatchDims(**g, kOptions));
    if (expand && a->ok()) {
      e.emplace(ExpandDataParallel(**g, **a, ExpandOpts()));
      benchmark::DoNotOptimize(*e);
    } else {
      benchmark::DoNotOptimize(*a);
    }
    cpu_ns += CpuNs() - start;
    const absl::Status status = !a->ok()        ? a->status()
                                : e && !e->ok() ? e->status()
                                                : absl::OkStatus();
    if (!status.ok()) {
      state.SkipWithError(status.ToString().c_str());
      break;
    }
    nodes = (*g)->size();
    state.PauseTiming();
    e.reset();
    a.reset();
    g.reset();
    state.ResumeTiming();
  }
  SetCommonCounters(state, nodes, static_cast<int64_t>(bytes.size()), cpu_ns);
  SetMemoryCounters(state, mem, nodes, /*analysis=*/true, expand);
}

void BM_DecodeAndAnalyze(benchmark::State& state) { DecodeAnalyze(state, /*expand=*/false); }

void BM_Expand(benchmark::State& state) {
  const std::string& bytes = GraphBytes(state.range(0));
  absl::StatusOr<ir::Graph> g = ir::DecodeGraphBytes(bytes);
  if (!g.ok()) {
    state.SkipWithError(g.status().ToString().c_str());
    return;
  }
  absl::StatusOr<BatchDimAnalysis> a = AnalyzeBatchDims(*g, kOptions);
  if (!a.ok()) {
    state.SkipWithError(a.status().ToString().c_str());
    return;
  }
  const Memory mem = MeasureMemory(bytes, /*analyze=*/true, /*expand=*/true);
  int64_t buckets = 0, expanded = 0;
  double cpu_ns = 0;
  for (auto _ : state) {
    const double start = CpuNs();
    std::optional<absl::StatusOr<Expansion>> e;
    e.emplace(ExpandDataParallel(*g, *a, ExpandOpts()));
    benchmark::DoNotOptimize(*e);
    cpu_ns += CpuNs() - start;
    if (!e->ok()) {
      state.SkipWithError(e->status().ToString().c_str());
      break;
    }
    buckets = static_cast<int64_t>((*e)->report.buckets.size());
    expanded = (*e)->distinct_graphs.empty() ? 0 : (*e)->graph(0).size();
    state.PauseTiming();
    e.reset();
    state.ResumeTiming();
  }
  SetCommonCounters(state, g->size(), static_cast<int64_t>(bytes.size()), cpu_ns);
  state.counters["buckets"] = static_cast<double>(buckets);
  state.counters["expanded_nodes"] = static_cast<double>(expanded);
  state.counters["expansion_bytes_per_node"] =
      static_cast<double>(mem.expansion) / static_cast<double>(g->size());
  state.counters["expansion_peak_bytes_per_node"] =
      static_cast<double>(mem.expansion_peak) / static_cast<double>(g->size());
}

void BM_DecodeAnalyzeExpand(benchmark::State& state) { DecodeAnalyze(state, /*expand=*/true); }

void Sizes(benchmark::internal::Benchmark* b) {
  b->Arg(10'000)->Arg(100'000)->Arg(1'000'000);
  b->Unit(benchmark::kMillisecond);
  b->Complexity(benchmark::oN);
}

BENCHMARK(BM_Decode)->Apply(Sizes);
BENCHMARK(BM_Analyze)->Apply(Sizes);
BENCHMARK(BM_DecodeAndAnalyze)->Apply(Sizes);
BENCHMARK(BM_Expand)->Apply(Sizes);
BENCHMARK(BM_DecodeAnalyzeExpand)->Apply(Sizes);

}  // namespace
}  // namespace fxdp::bench

BENCHMARK_MAIN();
