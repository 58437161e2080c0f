// fxdp-worker: runs fxdp graphs with LibTorch. `fxdp-worker --help` lists the
// commands: `run` (a fixed number of steps from files) and `attach` (a daemon
// serving an fxdp server, executor/worker/attach.h).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Logging.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "analysis/ir/hyperparameters.h"
#include "analysis/ir/proto_codec.h"
#include "executor/communicator.h"
#include "executor/gloo/gloo_communicator.h"
#include "executor/interpreter.h"
#include "executor/memory_limit.h"
#include "executor/safetensors.h"
#include "executor/step_runner.h"
#include "executor/timed_communicator.h"
#ifndef FXDP_WORKER_ONLY
#include "executor/worker/attach.h"
#endif
#include "executor/worker/common.h"
#include "executor/worker/memory_trace.h"
#include "executor/worker/sharded_state.h"
#include "util/flags.h"
#include "util/log.h"
#include "util/status_macros.h"
#include "util/version.h"

namespace fxdp::executor {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;  // bad input, a failing step, a lost peer
constexpr int kExitUsage = 2;
constexpr int kExitIo = 3;

constexpr char kUsage[] =
    "usage: fxdp-worker <command> [args]\n"
    "\n"
    "commands:\n"
    "  run    run a saved graph for a number of steps on state and data files\n"
    "  attach serve an fxdp server: register, heartbeat, run the jobs it assigns\n"
    "\n"
    "Run 'fxdp-worker <command> --help' for the arguments of a command; 'fxdp-worker --version'\n"
    "for the version and the LibTorch it was built with.\n";

constexpr char kRunUsage[] =
    "usage: fxdp-worker run --graph G.pb --state S.safetensors --data D.safetensors\n"
    "                       --steps K [--out FINAL.safetensors] [--device cpu|cuda[:N]]\n"
    "                       [--data D2.safetensors ...] [--timeout SECONDS] [--threads N]\n"
    "                       [--job NAME] [--check-outputs] [--schedule FILE]\n"
    "                       [--memory-limit SIZE] [--communicator auto|gloo|nccl]\n"
    "\n"
    "Runs the training step G (a binary fxdp.v1.GraphDef, e.g. from fxdp.TracedStep.save,\n"
    "python -m fxdp.zoo.export or fxdp expand) K times. The state file holds every\n"
    "non-input placeholder's tensor by state name (parameters, buffers, optimizer state,\n"
    "constants); UPDATED_* outputs replace their entries after each step. A data file holds\n"
    "one batch, tensors named by the graph's INPUT placeholders (state names; the zoo\n"
    "export's <model>_<optim>.batch.safetensors). Step i uses data file i mod the number\n"
    "of --data files: one file is reused every step.\n"
    "\n"
    "Prints 'step i/K loss L (T ms)' per step on stdout (rank 0 only); logs go to stderr as\n"
    "'[job NAME rank R step S/K] ...' (S: the step in progress; 0 before the first). --out\n"
    "writes the final state, every entry of the state file, updated.\n"
    "\n"
    "A FULLY_SHARD graph (fxdp expand --style fully_shard; its metadata lists the sharded\n"
    "state) takes the same whole state file: each rank reads only its flat 1/N shard of every\n"
    "sharded tensor, and --out gathers the shards back (every rank takes part), so the\n"
    "file holds whole tensors as with REPLICATE.\n"
    "\n"
    "  --graph G           the graph; '{rank}' in the path is replaced by the rank (the\n"
    "                      per-rank files fxdp expand writes for uneven batches)\n"
    "  --state S           initial state (safetensors)\n"
    "  --data D            a batch (safetensors); repeat for one batch per step\n"
    "  --steps K           number of steps (>= 1)\n"
    "  --out FINAL         write the final state here (rank 0; every rank when the path\n"
    "                      contains '{rank}')\n"
    "  --device DEV        cpu (default) or cuda[:N]; 'cuda' means cuda:LOCAL_RANK\n"
    "  --timeout SECONDS   rendezvous and collective timeout (default 60; fractions allowed;\n"
    "                      --timeout-s is the same flag): a rank that does not answer makes\n"
    "                      the others fail after this long, a dead one at once (a rank that\n"
    "                      cannot reach the store gives up after up to ~2x this)\n"
    "  --job NAME          the job's name in every log line (default 'local')\n"
    "  --threads N         intra-op CPU threads (default: OMP_NUM_THREADS, else all cores\n"
    "                      for one rank, cores / LOCAL_WORLD_SIZE or 1 for several ranks)\n"
    "  --check-outputs     compare every node's output dtype and shape with the graph\n"
    "  --memory-limit SIZE the most memory this rank's tensors may hold at once (300MB,\n"
    "                      4GiB: powers of 1024); an allocation past it fails the rank\n"
    "                      naming the node, as a device of that size would\n"
    "  --communicator C    auto (default: nccl on cuda where built, gloo on cpu), gloo or\n"
    "                      nccl; gloo on cuda copies each collective's tensor through the\n"
    "                      host (several ranks on one GPU, which NCCL refuses)\n"
    "  --schedule FILE     per-step values of the graph's HYPERPARAMETER placeholders (lr,\n"
    "                      momentum, ...): a JSON object from name to a list of values, one\n"
    "                      per step, or a closed form ({\"constant\": v},\n"
    "                      {\"linear_warmup_cosine\": {\"peak\", \"warmup_steps\",\n"
    "                      \"total_steps\", \"final\"}}, {\"step_decay\": {\"initial\",\n"
    "                      \"step_size\", \"gamma\"}}); see docs/schedules.md. Step i's\n"
    "                      values are written into the state before step i runs; names it\n"
    "                      does not give keep their state value. A name that is not a\n"
    "                      hyper-parameter of the graph, or fewer values than --steps, is an\n"
    "                      error before the rendezvous\n"
    "\n"
    "Launch environment (torchrun / Slurm conventions): RANK, WORLD_SIZE, LOCAL_RANK,\n"
    "MASTER_ADDR, MASTER_PORT, or SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID. With\n"
    "WORLD_SIZE > 1 the ranks meet at MASTER_ADDR:MASTER_PORT (rank 0 serves a c10d\n"
    "TCPStore) and all-reduce through Gloo on cpu, NCCL on cuda (see --communicator).\n"
    "Gloo binds to loopback when MASTER_ADDR is local, else to this host's name;\n"
    "FXDP_GLOO_HOST overrides. Each rank\n"
    "runs its own graph; a data file holds the global batch and each rank takes its\n"
    "contiguous slice along every INPUT's batch dim (the balanced split of fxdp expand: the\n"
    "first B % N ranks get one extra sample), or uses it as is when it already has the\n"
    "graph's size.\n"
    "\n"
    "A failed collective (a peer that died or did not answer within --timeout) fails the\n"
    "step: the error names this rank, the step, the all_reduce node and, when Gloo names\n"
    "the peer's socket, the peer's rank; the process exits without waiting for the rest.\n"
    "\n"
    "FXDP_MEMORY_TRACE=FILE ('{rank}' replaced by the rank) measures memory: live CPU\n"
    "tensor bytes and the resident set after loading and per step, and per node of the\n"
    "last step, written to FILE as JSON (executor/worker/memory_trace.h); it costs a\n"
    "little per allocation, so timings under it are not comparable.\n"
    "\n"
    "Every stderr line is the worker's own; c10/c10d's log lines (without job, rank and\n"
    "step) are shown only when TORCH_CPP_LOG_LEVEL is set (e.g. WARNING).\n"
    "\n"
    "Exit codes: 0 ok, 1 invalid input or a failed step (a lost peer included), 2 usage, 3 I/O.\n";

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
};

std::optional<std::string> Env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

// The first of `names` that is set, as an int.
absl::Status EnvInt(std::initializer_list<const char*> names, int* out) {
  for (const char* n : names) {
    auto v = Env(n);
    if (!v) continue;
    if (!absl::SimpleAtoi(*v, out) || *out < 0)
      return absl::InvalidArgumentError(
          absl::StrCat("environment variable ", n, "='", *v, "' is not a non-negative integer"));
    return absl::OkStatus();
  }
  return absl::OkStatus();
}

absl::StatusOr<LaunchEnv> ReadLaunchEnv() {
  LaunchEnv e;
  FXDP_RETURN_IF_ERROR(EnvInt({"RANK", "SLURM_PROCID"}, &e.rank));
  FXDP_RETURN_IF_ERROR(EnvInt({"WORLD_SIZE", "SLURM_NTASKS"}, &e.world_size));
  FXDP_RETURN_IF_ERROR(EnvInt({"LOCAL_RANK", "SLURM_LOCALID"}, &e.local_rank));
  FXDP_RETURN_IF_ERROR(EnvInt({"MASTER_PORT"}, &e.master_port));
  if (auto a = Env("MASTER_ADDR")) e.master_addr = *a;
  if (e.world_size < 1) return absl::InvalidArgumentError("WORLD_SIZE must be at least 1");
  if (e.rank >= e.world_size)
    return absl::InvalidArgumentError(
        absl::StrCat("RANK ", e.rank, " is not below WORLD_SIZE ", e.world_size));
  if (e.master_port > 65535)
    return absl::InvalidArgumentError(absl::StrCat("MASTER_PORT ", e.master_port, " > 65535"));
  return e;
}

int ExitCode(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kDataLoss: return kExitIo;
    default: return kExitFailed;
  }
}

struct RunArgs {
  std::string graph, state, out;
  std::vector<std::string> data;
  int steps = 0;
  std::string device = "cpu";
  std::string communicator = "auto";  // --communicator
  std::chrono::milliseconds timeout{60000};
  std::string job = "local";
  int threads = 0;  // 0: see Run
  bool check_outputs = false;
  std::string schedule;      // --schedule FILE ("" : none)
  int64_t memory_limit = 0;  // --memory-limit (executor/memory_limit.h)
};

// Every line on stderr says which job, rank and step it is about:
// "[job local rank 1 step 2/3] ...", step 0 before the first step
// (util::JobLogPrefix, written by util::Log).
class Logger {
 public:
  Logger(std::string job, int rank, int steps) : job_(std::move(job)), rank_(rank), steps_(steps) {}
  void set_step(int step) { step_ = step; }
  template <typename... A>
  void Log(const A&... a) const {
    util::Log(util::JobLogPrefix(job_, rank_, step_, steps_), a...);
  }

 private:
  std::string job_;
  int rank_;
  int steps_;
  int step_ = 0;
};

std::string WithRank(const std::string& path, int rank) {
  return absl::StrReplaceAll(path, {{"{rank}", absl::StrCat(rank)}});
}

// This rank's part of a global batch (executor/worker/common.h, shared with
// `attach`): for every INPUT with a batch dim whose size differs from the
// graph's, the balanced contiguous slice.
absl::StatusOr<TensorMap> ShardBatch(const TensorMap& batch, const Program& program,
                                     const LaunchEnv& env) {
  return executor::ShardBatch(batch, program, env.rank, env.world_size);
}

// Whether `path` can be written without creating it: its folder exists and
// is writable, and the file, if present, is writable. NOT_FOUND /
// PERMISSION_DENIED naming `flag` and the path.
absl::Status CheckWritable(const std::string& path, const std::string& flag) {
  const size_t slash = path.find_last_of('/');
  const std::string dir =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  if (::access(dir.c_str(), F_OK) != 0)
    return absl::NotFoundError(absl::StrCat(flag, " ", path, ": folder ", dir, " does not exist"));
  if (::access(dir.c_str(), W_OK) != 0 ||
      (::access(path.c_str(), F_OK) == 0 && ::access(path.c_str(), W_OK) != 0))
    return absl::PermissionDeniedError(absl::StrCat(flag, " ", path, ": not writable"));
  return absl::OkStatus();
}

// The graph was expanded for this launch's world size (`fxdp expand` writes
// "fxdp.world_size" into it): a single-device graph run by N ranks would
// train N independent copies without a word. INVALID_ARGUMENT naming both.
absl::Status CheckExpandedFor(const ir::Graph& graph, const std::string& path,
                              const LaunchEnv& env) {
  std::string expanded;
  for (const auto& [k, v] : graph.header().metadata) {
    if (k == "fxdp.world_size") expanded = v;
  }
  if (expanded.empty() && env.world_size == 1) return absl::OkStatus();
  if (expanded == absl::StrCat(env.world_size)) return absl::OkStatus();
  const std::string fix =
      absl::StrCat("; expand it for this launch (fxdp expand GRAPH --world-size ", env.world_size,
                   " -o X.pb, then run X.pb or X.rank{rank}.pb) "
                   "or launch ",
                   expanded.empty() ? "1" : expanded, " rank(s)");
  if (expanded.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " is a single-device graph (not expanded by fxdp expand) but WORLD_SIZE is ",
        env.world_size, ": each rank would train its own copy on its slice of the batch", fix));
  }
  return absl::InvalidArgumentError(absl::StrCat(path, " was expanded for ", expanded,
                                                 " ranks but WORLD_SIZE is ", env.world_size, fix));
}

// `comm` is the caller's: on a failed step it must not be destroyed (Gloo's
// destructor waits for collectives still queued on a lost peer).
absl::Status Run(const RunArgs& args, const LaunchEnv& env, Logger& log,
                 std::unique_ptr<Communicator>& comm) {
  if (args.memory_limit > 0) InstallCpuMemoryLimit(args.memory_limit);
  // Device.
  c10::Device device(c10::kCPU);
  try {
    device =
        args.device == "cuda" ? c10::Device(c10::kCUDA, env.local_rank) : c10::Device(args.device);
  } catch (const std::exception&) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device '", args.device, "' is not a device (cpu, cuda, cuda:N)"));
  }

  // The graph and the schedule first: a bad schedule fails before the
  // rendezvous, so no rank waits for one that gave up.
  const std::string graph_path = WithRank(args.graph, env.rank);
  FXDP_ASSIGN_OR_RETURN(ir::Graph graph, ir::ReadGraphFile(graph_path));
  ir::Schedule schedule;
  if (!args.schedule.empty()) {
    FXDP_ASSIGN_OR_RETURN(schedule, ir::Schedule::ReadFile(args.schedule, args.steps));
    FXDP_RETURN_IF_ERROR(ir::CheckHyperparameterNames(graph, schedule.names(),
                                                      absl::StrCat("--schedule ", args.schedule)));
    log.Log("schedule ", args.schedule, ": ", absl::StrJoin(schedule.names(), ", "));
  }
  FXDP_RETURN_IF_ERROR(CheckExpandedFor(graph, graph_path, env));

  // Intra-op threads: --threads, else OMP_NUM_THREADS (LibTorch reads it),
  // else with several ranks the cores divided among this host's ranks
  // (LOCAL_WORLD_SIZE; 1 thread when unknown, as torchrun does): OpenMP
  // threads of several processes spinning on the same cores make every op
  // ~50x slower.
  int threads = args.threads;
  if (threads == 0 && !Env("OMP_NUM_THREADS") && env.world_size > 1) {
    threads = 1;
    int local_world = 0;
    if (EnvInt({"LOCAL_WORLD_SIZE"}, &local_world).ok() && local_world > 0) {
      threads =
          std::max<int>(1, static_cast<int>(std::thread::hardware_concurrency()) / local_world);
    }
  }
  if (threads > 0) at::set_num_threads(threads);
  log.Log("intra-op threads: ", at::get_num_threads());

  // Everything local first (op lookup, state, data, where --out goes), so a
  // missing or bad file fails this rank before it meets its peers, which
  // would otherwise only see "lost the connection to rank R". Counts the time
  // each step spends waiting on communication; its communicator is set after
  // the rendezvous.
  TimedCommunicator timed(nullptr);
  std::optional<MemoryTrace> memory = MemoryTrace::FromEnv(env.rank, env.world_size);
  ProgramOptions po;
  po.device = device;
  po.communicator = &timed;
  po.collective_timeout = args.timeout;
  po.check_outputs = args.check_outputs;
  po.record_memory = memory.has_value();
  const auto t_load = std::chrono::steady_clock::now();
  FXDP_ASSIGN_OR_RETURN(Program program, Program::Load(graph, po));
  const double load_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_load).count();
  const int num_inputs = static_cast<int>(program.inputs().size());
  const std::string on_device = program.device().str();

  // FULLY_SHARD graphs: this rank reads only its flat shard of each sharded tensor.
  std::map<std::string, std::vector<int64_t>> full_shapes;
  FXDP_ASSIGN_OR_RETURN(
      SafetensorsFile state,
      ReadRankState(args.state, ShardedStateNames(graph), env.world_size, env.rank, &full_shapes));
  std::vector<TensorMap> batches;
  for (const std::string& d : args.data) {
    FXDP_ASSIGN_OR_RETURN(SafetensorsFile f, ReadSafetensors(d));
    FXDP_ASSIGN_OR_RETURN(TensorMap shard, ShardBatch(f.tensors, program, env));
    batches.push_back(std::move(shard));
  }
  std::string out;
  if (!args.out.empty() && (args.out.find("{rank}") != std::string::npos || env.rank == 0)) {
    out = WithRank(args.out, env.rank);
    FXDP_RETURN_IF_ERROR(CheckWritable(out, "--out"));
  }
  FXDP_ASSIGN_OR_RETURN(StepRunner runner,
                        StepRunner::Create(std::move(program), std::move(state.tensors)));
  if (memory) memory->LoadDone();

  if (env.world_size > 1) {
    RendezvousOptions ro;
    ro.host = env.master_addr;
    ro.port = env.master_port;
    ro.rank = env.rank;
    ro.world_size = env.world_size;
    ro.timeout = args.timeout;
    log.Log("rendezvous at ", ro.host, ":", ro.port, " (world size ", ro.world_size, ", timeout ",
            absl::StrFormat("%.3g", args.timeout.count() / 1000.0), " s)");
    // Gloo (cpu) or NCCL (cuda); Gloo binds to an address the other ranks
    // reach this host by (worker/common.h GlooInterfaceHost).
    FXDP_ASSIGN_OR_RETURN(comm, ConnectCommunicator(ro, device, args.communicator));
  } else {
    comm = std::make_unique<LocalCommunicator>();
  }
  timed.set_inner(comm.get());
  log.Log("loaded ", graph_path, ": ", runner.program().num_nodes(), " ops, ", num_inputs,
          " inputs, on ", on_device, ", ", comm->name(), " (", absl::StrFormat("%.1f", load_ms),
          " ms)");

  double total_ms = 0, total_wait_ms = 0;
  timed.TakeStats();
  for (int i = 0; i < args.steps; ++i) {
    log.set_step(i + 1);
    const auto t0 = std::chrono::steady_clock::now();
    if (absl::Status s = runner.SetHyperparameters(schedule.At(i + 1)); !s.ok())
      return absl::Status(s.code(),
                          absl::StrCat("step ", i + 1, "/", args.steps, ": ", s.message()));
    absl::StatusOr<at::Tensor> loss = runner.Step(batches[i % batches.size()]);
    if (!loss.ok()) {
      return absl::Status(loss.status().code(), absl::StrCat("step ", i + 1, "/", args.steps,
                                                             " failed: ", loss.status().message()));
    }
    double value = std::nan("");
    if (loss->defined()) {
      c10::InferenceMode guard;
      value = loss->to(at::kCPU).to(at::kDouble).item<double>();  // syncs the device
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (memory) memory->StepDone(runner.program());
    total_ms += ms;
    const CollectiveStats cs = timed.TakeStats();
    total_wait_ms += cs.wait_ms;
    if (cs.collectives > 0) {
      log.Log(absl::StrFormat("%.1f ms, %d collectives (%d bytes), %.1f ms waiting on them", ms,
                              cs.collectives, cs.bytes, cs.wait_ms));
    }
    if (env.rank == 0) {
      std::printf("step %d/%d loss %.8g (%.1f ms)\n", i + 1, args.steps, value, ms);
      std::fflush(stdout);
    }
    if (!std::isfinite(value) && loss->defined()) log.Log("warning: the loss is not finite");
  }
  const int nodes = runner.program().num_nodes();
  log.Log(args.steps, " steps in ", absl::StrFormat("%.1f", total_ms), " ms (",
          absl::StrFormat("%.2f", total_ms / args.steps), " ms/step, ",
          absl::StrFormat("%.1f", nodes > 0 ? 1000.0 * total_ms / args.steps / nodes : 0.0),
          " us/op over ", nodes, " ops; ", absl::StrFormat("%.2f", total_wait_ms / args.steps),
          " ms/step waiting on communication)");
  if (device.is_cuda()) log.Log(DeviceMemorySummary(device));
  if (memory) {
    FXDP_RETURN_IF_ERROR(memory->Write());
    log.Log(memory->Summary());
  }

  if (!full_shapes.empty() && !args.out.empty()) {
    // Every rank takes part in gathering the shards back; rank 0 (or every
    // rank, with {rank}) writes whole tensors.
    FXDP_ASSIGN_OR_RETURN(TensorMap whole,
                          UnshardState(runner.state(), full_shapes, *comm, args.timeout));
    if (!out.empty()) {
      FXDP_RETURN_IF_ERROR(WriteSafetensors(out, whole, state.metadata));
      log.Log("wrote the final state (", whole.size(), " tensors, ", full_shapes.size(),
              " gathered from shards) to ", out);
    }
  } else if (!out.empty()) {
    FXDP_RETURN_IF_ERROR(WriteSafetensors(out, runner.state(), state.metadata));
    log.Log("wrote the final state (", runner.state().size(), " tensors) to ", out);
  }
  return absl::OkStatus();
}

int RunCommand(const std::vector<std::string>& argv) {
  RunArgs a;
  util::Flags flags("fxdp-worker run", kRunUsage);
  flags.Bool("--check-outputs", &a.check_outputs);
  flags.String("--graph", &a.graph);
  flags.String("--state", &a.state);
  flags.Strings("--data", &a.data);
  flags.String("--out", &a.out);
  flags.String("--schedule", &a.schedule);
  flags.String("--device", &a.device);
  flags.Custom("--communicator", "auto, gloo or nccl", [&a](const std::string& v) {
    a.communicator = v;
    return v == "auto" || v == "gloo" || v == "nccl";
  });
  auto positive = [](int* out) {
    return [out](const std::string& v) { return absl::SimpleAtoi(v, out) && *out >= 1; };
  };
  flags.Custom("--steps", "a positive integer", positive(&a.steps));
  flags.Custom("--threads", "a positive integer", positive(&a.threads));
  flags.Custom(
      "--timeout", "a number of seconds (at least 0.001)",
      [&a](const std::string& v) {
        double seconds = 0;
        if (!absl::SimpleAtod(v, &seconds) || !(seconds >= 0.001) || seconds > 86400.0 * 365)
          return false;
        a.timeout = std::chrono::milliseconds(static_cast<int64_t>(std::llround(seconds * 1000)));
        return true;
      },
      "--timeout-s");
  flags.Custom("--job", "a name without spaces or control characters", [&a](const std::string& v) {
    a.job = v;
    return util::IsPlainName(v);
  });
  flags.Custom("--memory-limit", "a size in bytes (300MB, 4GiB)",
               [&a](const std::string& v) { return util::ParseByteSize(v, &a.memory_limit); });
  if (int rc = flags.Parse(argv, nullptr); rc >= 0) return rc;
  if (a.graph.empty()) return flags.Usage("--graph is required");
  if (a.state.empty()) return flags.Usage("--state is required");
  if (a.data.empty()) return flags.Usage("--data is required");
  if (a.steps == 0) return flags.Usage("--steps is required");

  auto env = ReadLaunchEnv();
  if (!env.ok()) {
    std::fprintf(stderr, "fxdp-worker run: %s\n", std::string(env.status().message()).c_str());
    return kExitUsage;
  }
  Logger log(a.job, env->rank, a.steps);
  std::unique_ptr<Communicator> comm;
  absl::Status s = Run(a, *env, log, comm);
  if (!s.ok()) {
    log.Log("error: ", s.message());
    std::fflush(stdout);
    std::fflush(stderr);
    // Skip destructors: ProcessGroupGloo's waits until its queue is drained
    // and its threads are done, which behind a hung peer can take another
    // timeout or more.
    if (comm != nullptr) std::_Exit(ExitCode(s));
    return ExitCode(s);
  }
  return kExitOk;
}

}  // namespace
}  // namespace fxdp::executor

int main(int argc, char** argv) {
  // c10/c10d's own log lines (rendezvous retries with stack traces, ...) carry
  // no job, rank or step, and the worker's error repeats what they say: off
  // (FATAL only) unless TORCH_CPP_LOG_LEVEL asks for them.
  if (std::getenv("TORCH_CPP_LOG_LEVEL") == nullptr) FLAGS_caffe2_log_level = 3;
  // A write to the socket of a peer that died raises SIGPIPE, whose default
  // action kills this process without a word (exit -13); ignored, Gloo sees
  // EPIPE and the step fails with an error. (Python ignores SIGPIPE at
  // startup, so torch.distributed never meets this.)
  std::signal(SIGPIPE, SIG_IGN);
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::fputs(fxdp::executor::kUsage, stderr);
    return fxdp::executor::kExitUsage;
  }
  const std::string cmd = args[0];
  args.erase(args.begin());
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::fputs(fxdp::executor::kUsage, stdout);
    return fxdp::executor::kExitOk;
  }
  if (cmd == "--version") {
    std::printf("%s (LibTorch %s)\n", fxdp::util::VersionLine("fxdp-worker").c_str(),
                TORCH_VERSION);
    return fxdp::executor::kExitOk;
  }
  if (cmd == "run") return fxdp::executor::RunCommand(args);
#ifdef FXDP_WORKER_ONLY
  if (cmd == "attach") {
    std::fputs("fxdp-worker: attach is not built (FXDP_WORKER_ONLY=ON: no gRPC); only run\n",
               stderr);
    return fxdp::executor::kExitUsage;
  }
#else
  if (cmd == "attach") return fxdp::executor::AttachCommand(args);
#endif
  std::fprintf(stderr, "fxdp-worker: unknown command '%s'\n\n%s", cmd.c_str(),
               fxdp::executor::kUsage);
  return fxdp::executor::kExitUsage;
}
