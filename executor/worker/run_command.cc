// `fxdp-worker run` (run_command.h): usage, flags, the launch environment,
// exit codes. One rank's work is run_rank.cc.
#include "executor/worker/run_command.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "util/flags.h"
#include "util/status_macros.h"

namespace fxdp::executor {

const char kRunUsage[] =
    "usage: fxdp-worker run --graph G.pb --state S.safetensors --data D.safetensors\n"
    "                       --steps K [--out FINAL.safetensors] [--device cpu|cuda[:N]]\n"
    "                       [--data D2.safetensors ...] [--timeout SECONDS] [--threads N]\n"
    "                       [--job NAME] [--check-outputs] [--schedule FILE]\n"
    "                       [--memory-limit SIZE] [--communicator auto|gloo|nccl]\n"
    "                       [--seed S]\n"
    "\n"
    "Runs the training step G (a binary fxdp.v1.GraphDef, e.g. from fxdp.TracedStep.save,\n"
    "python -m fxdp.zoo.export or fxdp expand) K times. The state file holds every\n"
    "non-input placeholder's tensor by state name (parameters, buffers, optimizer state,\n"
    "constants); UPDATED_* outputs replace their entries after each step. A data file holds\n"
    "one batch, tensors named by the graph's INPUT placeholders (state names; the zoo\n"
    "export's <model>_<optim>.batch.safetensors). Step i uses data file i mod the number\n"
    "of --data files: one file is reused every step.\n"
    "\n"
    "Prints 'step i/K loss L (T ms)' per step on stdout (rank 0 only), then the step's named\n"
    "0-d outputs (' correct=5 accuracy=0.625'); logs go to stderr as\n"
    "'[job NAME rank R step S/K] ...' (S: the step in progress; 0 before the first). --out\n"
    "writes the final state, every entry of the state file, updated.\n"
    "\n"
    "A FULLY_SHARD graph (fxdp expand --style fully_shard; its metadata lists the sharded\n"
    "state) takes the same whole state file: each rank reads only its flat 1/N shard of every\n"
    "sharded tensor, and --out gathers the shards back (every rank takes part), so the\n"
    "file holds whole tensors as with REPLICATE.\n"
    "\n"
    "  --graph G           the graph; '{rank}' in the path is replaced by the rank (the\n"
    "                      per-rank files fxdp expand writes for uneven batches). Repeat it\n"
    "                      for data of several shapes (batch sizes, sequence lengths;\n"
    "                      docs/shapes.md): one graph per shape, e.g. a symbolic trace\n"
    "                      expanded with fxdp expand --shape at each; every step runs the\n"
    "                      graph expanded for its data's global shapes (the expansion records\n"
    "                      them), all over one state. Data of a shape no --graph takes is an\n"
    "                      error naming the shapes\n"
    "  --state S           initial state (safetensors)\n"
    "  --data D            a batch (safetensors); repeat for one batch per step; or a\n"
    "                      dataset directory (given alone: safetensors shards and an\n"
    "                      index.json, docs/datasets.md, e.g. from fxdp.write_dataset):\n"
    "                      step i reads entry (i - 1) mod the index's steps, each rank only\n"
    "                      its rows of it, when the step runs\n"
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
    "  --seed S            the seed of the graph's random ops (an unsigned 64-bit number;\n"
    "                      default: the graph's metadata fxdp.seed, else 0). Every rank draws\n"
    "                      its slice of what one device draws (docs/randomness.md)\n"
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
    "FXDP_VALUE_TRACE=FILE ('{rank}' replaced by the rank) appends every node's outputs of\n"
    "every step to FILE, one line each (layout and a hash of the values,\n"
    "executor/value_trace.h): the first line two runs differ in names where they part.\n"
    "\n"
    "Every stderr line is the worker's own; c10/c10d's log lines (without job, rank and\n"
    "step) are shown only when TORCH_CPP_LOG_LEVEL is set (e.g. WARNING).\n"
    "\n"
    "Exit codes: 0 ok, 1 invalid input or a failed step (a lost peer included), 2 usage, 3 I/O.\n";

namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;  // bad input, a failing step, a lost peer
constexpr int kExitUsage = 2;
constexpr int kExitIo = 3;

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

absl::StatusOr<run::LaunchEnv> ReadLaunchEnv() {
  run::LaunchEnv e;
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

}  // namespace

int RunCommand(const std::vector<std::string>& argv) {
  run::RunArgs a;
  util::Flags flags("fxdp-worker run", kRunUsage);
  flags.Bool("--check-outputs", &a.check_outputs);
  flags.Strings("--graph", &a.graphs);
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
  flags.Custom("--seed", "an unsigned 64-bit number", [&a](const std::string& v) {
    uint64_t s = 0;
    if (!absl::SimpleAtoi(v, &s)) return false;
    a.seed = s;
    return true;
  });
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
  if (a.graphs.empty()) return flags.Usage("--graph is required");
  if (a.state.empty()) return flags.Usage("--state is required");
  if (a.data.empty()) return flags.Usage("--data is required");
  if (a.steps == 0) return flags.Usage("--steps is required");

  auto env = ReadLaunchEnv();
  if (!env.ok()) {
    std::fprintf(stderr, "fxdp-worker run: %s\n", std::string(env.status().message()).c_str());
    return kExitUsage;
  }
  run::Logger log(a.job, env->rank, a.steps);
  std::unique_ptr<Communicator> comm;
  absl::Status s = run::RunRank(a, *env, log, comm);
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

}  // namespace fxdp::executor
