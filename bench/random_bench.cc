// Dropout through fxdp's generator against torch's own kernel on the same
// tensor (bench/README.md, "Random ops"; docs/randomness.md):
//
//   native_dropout   executor/random_ops.h's kernel (Philox mask at each
//                    element's global index, then input * mask * 1/(1-p))
//                    vs at::native_dropout (torch's CPU generator)
//   bernoulli.p      the op a traced dropout becomes (empty_like + bernoulli.p
//                    + div + mul): fxdp's mask vs at::bernoulli(self, p)
//
// usage: fxdp_random_bench [--numel N] [--reps R] [--threads T] [--json]
// Each row: the median over R runs of each, measured alternately in the same
// process, and their ratio (fxdp / torch); --json: one line per op with every run's time
// (make bench's "random" area, bench/areas.py).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "analysis/ir/random_ops.h"
#include "executor/random_ops.h"
#include "executor/torch_types.h"

namespace fxdp::bench {
namespace {

using executor::RandomContext;
using executor::RandomPlan;

RandomPlan Plan(const char* op, const char* overload, int64_t numel) {
  const ir::Target target{op, overload};
  ir::Node n;
  n.name = "dropout";
  n.target = target;
  ir::TensorType t;
  t.shape = {numel};
  t.stride = {1};
  n.outputs.push_back(ir::ValueType::Tensor(t));
  auto handle = executor::FindOperator(target);
  auto plan = executor::PlanRandom(*ir::FindRandomOp(target), handle->schema(), n, {});
  if (!plan.ok()) {
    std::fprintf(stderr, "%s\n", plan.status().ToString().c_str());
    std::exit(1);
  }
  return *plan;
}

// The times of `reps` runs of f and of g, in ms, in run order, measured
// alternately (f, g, f, g...) after one run of each to warm up, so that a
// change of the machine's load falls on both.
std::pair<std::vector<double>, std::vector<double>> AlternateMs(const std::function<void()>& f,
                                                                const std::function<void()>& g,
                                                                int reps) {
  std::pair<std::vector<double>, std::vector<double>> ms;
  f();
  g();
  auto time = [](const std::function<void()>& h) {
    const auto t0 = std::chrono::steady_clock::now();
    h();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  for (int i = 0; i < reps; ++i) {
    ms.first.push_back(time(f));
    ms.second.push_back(time(g));
  }
  return ms;
}

double Median(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

std::string JsonList(const std::vector<double>& ms) {
  std::string out = "[";
  for (size_t i = 0; i < ms.size(); ++i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s%.4f", i ? ", " : "", ms[i]);
    out += buf;
  }
  return out + "]";
}

int Main(int argc, char** argv) {
  int64_t numel = 1 << 22;
  int reps = 21, threads = 1;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--numel") && i + 1 < argc)
      numel = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--json"))
      json = true;
    else {
      std::fprintf(stderr,
                   "usage: fxdp_random_bench [--numel N] [--reps R] [--threads T] [--json]\n");
      return 2;
    }
  }
  at::set_num_threads(threads);
  c10::InferenceMode guard;
  const at::Tensor x = at::randn({numel});
  const double p = 0.1;
  const RandomContext ctx{1234, 1, 0, {}};
  const RandomPlan drop = Plan("aten::native_dropout", "", numel);
  const RandomPlan bern = Plan("aten::bernoulli", "p", numel);
  auto fxdp_dropout = [&] {
    std::vector<c10::IValue> stack{x, p, true};
    if (!executor::RunRandom(drop, ctx, c10::Device(c10::kCPU), stack).ok()) std::abort();
  };
  auto torch_dropout = [&] { at::native_dropout(x, p, true); };
  auto fxdp_bernoulli = [&] {
    std::vector<c10::IValue> stack{x, 1.0 - p, c10::IValue()};
    if (!executor::RunRandom(bern, ctx, c10::Device(c10::kCPU), stack).ok()) std::abort();
  };
  auto torch_bernoulli = [&] { at::bernoulli(x, 1.0 - p); };
  struct Row {
    const char* name;
    std::pair<std::vector<double>, std::vector<double>> ms;  // fxdp's, torch's
  };
  const std::vector<Row> rows = {
      {"native_dropout", AlternateMs(fxdp_dropout, torch_dropout, reps)},
      {"bernoulli.p", AlternateMs(fxdp_bernoulli, torch_bernoulli, reps)}};
  for (const Row& r : rows) {
    const double f = Median(r.ms.first), t = Median(r.ms.second);
    if (json) {
      std::printf(
          "{\"op\": \"%s\", \"numel\": %lld, \"threads\": %d, \"p\": %g, \"fxdp_ms\": %s, "
          "\"torch_ms\": %s}\n",
          r.name, static_cast<long long>(numel), threads, p, JsonList(r.ms.first).c_str(),
          JsonList(r.ms.second).c_str());
    } else {
      std::printf("%-15s numel %lld, %d thread(s): fxdp %.3f ms, torch %.3f ms, ratio %.2f\n",
                  r.name, static_cast<long long>(numel), threads, f, t, f / t);
    }
  }
  return 0;
}

}  // namespace
}  // namespace fxdp::bench

int main(int argc, char** argv) { return fxdp::bench::Main(argc, argv); }
