// fxdp_step_bench: `fxdp-worker run` for CPU ranks (Gloo), instrumented with
// executor/timed_communicator.h, so that each step's time spent waiting on
// communication is known (the worker does not report it yet). Used by
// bench/step_vs_ddp.py next to the worker itself (bench/README.md).
//
//   RANK=r WORLD_SIZE=N MASTER_ADDR=127.0.0.1 MASTER_PORT=P
//     fxdp_step_bench --graph G.pb --state S.safetensors --data D.safetensors
//                     --steps K [--threads T]
//
// Same inputs and launch environment as the worker (the data file holds the
// global batch; each rank takes its balanced contiguous slice, or uses it as
// is when it already has the graph's size). Every rank prints one line per
// step on stdout:
//   rank R step I/K loss L ms T wait W start S collectives C bytes B
// T: the step's wall time (Step + reading the loss); W: time blocked in
// Work::Wait; S: time inside AllReduceSum (Gloo copies the input there, unless
// the bucket is donated).
//   --detail      per step on stderr, every collective in the order started:
//                 "rank R step I collectives: [B B: F ms in flight, W ms waited] ..."
//                 (F: from its start to its Wait call; W: blocked in that Wait)
//   --profile N   at the end, on stderr: the N ops taking the most time per
//                 step (all nodes of one op added up; ProgramOptions::profile)
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "analysis/ir/proto_codec.h"
#include "executor/gloo/gloo_communicator.h"
#include "executor/interpreter.h"
#include "executor/safetensors.h"
#include "executor/step_runner.h"
#include "executor/timed_communicator.h"
#include "executor/worker/common.h"
#include "util/status_macros.h"

namespace fxdp::bench {
namespace {

using executor::TensorMap;

int EnvInt(const char* name, int dflt) {
  const char* v = std::getenv(name);
  int out = dflt;
  if (v != nullptr && *v != '\0' && !absl::SimpleAtoi(v, &out)) {
    std::fprintf(stderr, "%s='%s' is not an integer\n", name, v);
    std::exit(2);
  }
  return out;
}

struct Args {
  std::string graph, state, data;
  int steps = 0;
  int threads = 1;
  bool detail = false;  // per-collective times on stderr
  int profile = 0;      // the N most expensive ops (by op name) on stderr at the end
};

absl::Status Run(const Args& a) {
  const int rank = EnvInt("RANK", 0), world = EnvInt("WORLD_SIZE", 1);
  at::set_num_threads(a.threads);
  std::unique_ptr<executor::Communicator> comm;
  if (world > 1) {
    executor::RendezvousOptions ro;
    if (const char* h = std::getenv("MASTER_ADDR")) ro.host = h;
    ro.port = EnvInt("MASTER_PORT", 29500);
    ro.rank = rank;
    ro.world_size = world;
    ro.timeout = std::chrono::seconds(120);
    FXDP_ASSIGN_OR_RETURN(comm, executor::GlooCommunicator::Connect(ro, "127.0.0.1"));
  } else {
    comm = std::make_unique<executor::LocalCommunicator>();
  }
  executor::TimedCommunicator timed(comm.get());

  FXDP_ASSIGN_OR_RETURN(ir::Graph graph, ir::ReadGraphFile(a.graph));
  executor::ProgramOptions po;
  po.communicator = &timed;
  po.profile = a.profile > 0;
  FXDP_ASSIGN_OR_RETURN(executor::Program program, executor::Program::Load(graph, po));
  FXDP_ASSIGN_OR_RETURN(executor::SafetensorsFile state, executor::ReadSafetensors(a.state));
  FXDP_ASSIGN_OR_RETURN(executor::SafetensorsFile data, executor::ReadSafetensors(a.data));
  FXDP_ASSIGN_OR_RETURN(TensorMap batch, executor::ShardBatch(data.tensors, program, rank, world));
  FXDP_ASSIGN_OR_RETURN(executor::StepRunner runner,
                        executor::StepRunner::Create(std::move(program), std::move(state.tensors)));
  for (int i = 0; i < a.steps; ++i) {
    timed.TakeStats();
    const auto t0 = std::chrono::steady_clock::now();
    FXDP_ASSIGN_OR_RETURN(at::Tensor loss, runner.Step(batch));
    double value = std::nan("");
    if (loss.defined()) {
      c10::InferenceMode guard;
      value = loss.to(at::kDouble).item<double>();
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const executor::CollectiveStats s = timed.TakeStats();
    std::printf(
        "rank %d step %d/%d loss %.8g ms %.3f wait %.3f start %.3f collectives %lld bytes %lld\n",
        rank, i + 1, a.steps, value, ms, s.wait_ms, s.start_ms,
        static_cast<long long>(s.collectives), static_cast<long long>(s.bytes));
    std::fflush(stdout);
    if (a.detail) {
      std::string line = absl::StrCat("rank ", rank, " step ", i + 1, " collectives:");
      for (const executor::CollectiveStats::One& c : s.each)
        absl::StrAppend(&line, absl::StrFormat(" [%d B: %.2f ms in flight, %.2f ms waited]",
                                               c.bytes, c.in_flight_ms, c.wait_ms));
      std::fprintf(stderr, "%s\n", line.c_str());
    }
  }
  if (a.profile > 0) {
    // Per op (target): summed over its nodes, averaged over the steps.
    std::map<std::string, std::pair<double, int64_t>> by_op;
    double total = 0;
    for (const executor::NodeTime& t : runner.program().profile()) {
      auto& e = by_op[t.op];
      e.first += t.total_ms / t.runs;
      e.second += 1;
      total += t.total_ms / t.runs;
    }
    std::vector<std::pair<double, std::string>> sorted;
    for (const auto& [op, e] : by_op) sorted.emplace_back(e.first, op);
    std::sort(sorted.rbegin(), sorted.rend());
    std::fprintf(stderr, "rank %d: %.2f ms per step in nodes; by op (ms per step, nodes):\n", rank,
                 total);
    for (size_t k = 0; k < sorted.size() && k < static_cast<size_t>(a.profile); ++k)
      std::fprintf(stderr, "  %8.3f  %4lld  %s\n", sorted[k].first,
                   static_cast<long long>(by_op[sorted[k].second].second),
                   sorted[k].second.c_str());
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (f == "--detail") {
      a.detail = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", f.c_str());
      return 2;
    }
    const std::string v = argv[++i];
    if (f == "--graph") {
      a.graph = v;
    } else if (f == "--state") {
      a.state = v;
    } else if (f == "--data") {
      a.data = v;
    } else if (f == "--steps") {
      a.steps = std::atoi(v.c_str());
    } else if (f == "--threads") {
      a.threads = std::atoi(v.c_str());
    } else if (f == "--profile") {
      a.profile = std::atoi(v.c_str());
    } else {
      std::fprintf(stderr, "unknown flag %s\n", f.c_str());
      return 2;
    }
  }
  if (a.graph.empty() || a.state.empty() || a.data.empty() || a.steps < 1 || a.threads < 1) {
    std::fprintf(stderr,
                 "usage: fxdp_step_bench --graph G --state S --data D --steps K [--threads T] "
                 "[--detail] [--profile N]\n");
    return 2;
  }
  const absl::Status s = Run(a);
  if (!s.ok()) {
    std::fprintf(stderr, "fxdp_step_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace fxdp::bench

int main(int argc, char** argv) { return fxdp::bench::Main(argc, argv); }
