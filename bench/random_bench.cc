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
// process, and their ratio (fxdp / torch).
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

double MedianMs(const std::function<void()>& f, int reps) {
  std::vector<double> ms;
  f();  // warm up
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
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
    double fxdp_ms, torch_ms;
  };
  std::vector<Row> rows = {
      {"native_dropout", MedianMs(fxdp_dropout, reps), MedianMs(torch_dropout, reps)},
      {"bernoulli.p", MedianMs(fxdp_bernoulli, reps), MedianMs(torch_bernoulli, reps)}};
  for (const Row& r : rows) {
    if (json) {
      std::printf(
          "{\"op\": \"%s\", \"numel\": %lld, \"threads\": %d, \"fxdp_ms\": %.4f, "
          "\"torch_ms\": %.4f, \"ratio\": %.3f}\n",
          r.name, static_cast<long long>(numel), threads, r.fxdp_ms, r.torch_ms,
          r.fxdp_ms / r.torch_ms);
    } else {
      std::printf("%-15s numel %lld, %d thread(s): fxdp %.3f ms, torch %.3f ms, ratio %.2f\n",
                  r.name, static_cast<long long>(numel), threads, r.fxdp_ms, r.torch_ms,
                  r.fxdp_ms / r.torch_ms);
    }
  }
  return 0;
}

}  // namespace
}  // namespace fxdp::bench

int main(int argc, char** argv) { return fxdp::bench::Main(argc, argv); }
