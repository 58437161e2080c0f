// One rank of `fxdp-worker run` (run_command.h): load, rendezvous, steps,
// the final state.
#include <ATen/Parallel.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
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
#include "analysis/ir/instantiate.h"
#include "analysis/ir/proto_codec.h"
#include "executor/memory_limit.h"
#include "executor/safetensors.h"
#include "executor/step_runner.h"
#include "executor/timed_communicator.h"
#include "executor/worker/common.h"
#include "executor/worker/dataset.h"
#include "executor/worker/memory_trace.h"
#include "executor/worker/named_outputs.h"
#include "executor/worker/run_command.h"
#include "executor/worker/sharded_state.h"
#include "util/status_macros.h"

namespace fxdp::executor::run {
namespace {

std::string WithRank(const std::string& path, int rank) {
  return absl::StrReplaceAll(path, {{"{rank}", absl::StrCat(rank)}});
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

// Whether --data names a dataset directory (one --data, a directory); a
// directory among several --data is a usage error.
absl::StatusOr<bool> IsDatasetDir(const std::vector<std::string>& data) {
  for (const std::string& d : data) {
    struct stat st {};
    if (::stat(d.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
    if (data.size() > 1)
      return absl::InvalidArgumentError(absl::StrCat(
          "--data ", d, " is a directory (a dataset, docs/datasets.md) among ", data.size(),
          " --data: give the dataset directory alone, or safetensors files only"));
    return true;
  }
  return false;
}

// What a rank holds once everything local is read.
struct LoadedRank {
  std::string graph_path;  // the first --graph (program 0)
  ir::Schedule schedule;
  std::optional<StepRunner> runner;  // program k: the k-th --graph
  // Several --graph: program k's global input shapes (ir::kInputShapesKey),
  // which pick the program of each step's data; empty for one --graph.
  std::vector<std::string> shapes;
  std::vector<std::string> paths;        // program k's --graph, '{rank}' replaced
  std::vector<TensorMap> batches;        // --data files: this rank's shard of each
  std::vector<uint32_t> batch_program;   // the program of each of them
  std::optional<DatasetReader> dataset;  // --data DIR: read per step (docs/datasets.md)
  std::map<std::string, std::vector<int64_t>> full_shapes;  // FULLY_SHARD: sharded tensors
  std::map<std::string, std::string> state_metadata;
  std::string out;       // where this rank writes the final state ("": nowhere)
  NamedOutputs outputs;  // the step's named metrics, printed after its loss
  double load_ms = 0;
  int num_inputs = 0;
};

// The global input shapes the graph at `path` takes (several --graph): the
// expansion's record, or a single-device graph's own INPUTs.
absl::StatusOr<std::string> GlobalShapes(const ir::Graph& g, const std::string& path) {
  bool expanded = false;
  for (const auto& [k, v] : g.header().metadata) {
    if (k == ir::kInputShapesKey) return v;
    expanded |= k == "fxdp.world_size";
  }
  if (!expanded) return ir::InputShapesText(ir::InputShapesOf(g));
  return absl::InvalidArgumentError(absl::StrCat(
      "--graph ", path, " does not record the global input shapes it was expanded for (metadata ",
      ir::kInputShapesKey,
      "; an older fxdp expand wrote it): expand it again to run it among "
      "several --graph"));
}

// The program whose graph was expanded for `shapes` (the global batch `what`
// holds); with one --graph, that one (its shapes are checked as they always
// were).
absl::StatusOr<uint32_t> ProgramFor(const LoadedRank& r, const ir::InputShapes& shapes,
                                    const std::string& what) {
  if (r.shapes.empty()) return 0;
  const std::string text = ir::InputShapesText(shapes);
  std::string have;
  for (size_t k = 0; k < r.shapes.size(); ++k) {
    if (r.shapes[k] == text) return static_cast<uint32_t>(k);
    absl::StrAppend(&have, k == 0 ? "" : "; ", r.paths[k], ": ", r.shapes[k]);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      what, " holds ", text, "; no --graph was expanded for that shape (", have,
      "): expand the symbolic graph at it (fxdp expand G.pb --world-size N --shape NAME=AxB "
      "...) and add the file with --graph"));
}

// Every --graph after the first: read, checked against the first (its
// metadata, then its placeholders as StepRunner::AddProgram checks them)
// and added as program k; each graph's global input shapes recorded.
absl::Status AddPrograms(const RunArgs& args, const LaunchEnv& env, const RankSetup& setup,
                         const ir::Graph& first, TimedCommunicator* timed, LoadedRank& r) {
  if (args.graphs.size() == 1) return absl::OkStatus();
  const GraphMetadata shared = SharedMetadata(first);
  FXDP_ASSIGN_OR_RETURN(std::string shapes0, GlobalShapes(first, r.graph_path));
  r.shapes.push_back(std::move(shapes0));
  for (size_t k = 1; k < args.graphs.size(); ++k) {
    const std::string path = WithRank(args.graphs[k], env.rank);
    FXDP_ASSIGN_OR_RETURN(ir::Graph g, ir::ReadGraphFile(path));
    FXDP_RETURN_IF_ERROR(CheckExpandedFor(g, path, env));
    absl::Status s = CheckSharedMetadata(shared, g);
    FXDP_ASSIGN_OR_RETURN(std::string shapes, GlobalShapes(g, path));
    for (size_t j = 0; s.ok() && j < r.shapes.size(); ++j) {
      if (r.shapes[j] == shapes)
        s = absl::InvalidArgumentError(absl::StrCat("it takes ", shapes, " as --graph ", r.paths[j],
                                                    " does: give one graph per shape"));
    }
    if (s.ok()) {
      absl::StatusOr<Program> program = LoadRankProgram(g, setup, timed);
      s = program.ok() ? r.runner->AddProgram(static_cast<uint32_t>(k), *std::move(program))
                       : program.status();
    }
    if (!s.ok())
      return absl::Status(s.code(), absl::StrCat("--graph ", path, " (after --graph ", r.graph_path,
                                                 "): ", s.message()));
    r.paths.push_back(path);
    r.shapes.push_back(std::move(shapes));
  }
  return absl::OkStatus();
}

// --data: one dataset directory, read per step, or files, each read now
// and sliced for this rank by the program expanded for its shapes.
absl::Status LoadData(const RunArgs& args, const LaunchEnv& env, Logger& log, LoadedRank& r) {
  FXDP_ASSIGN_OR_RETURN(const bool is_dataset, IsDatasetDir(args.data));
  StepRunner& runner = *r.runner;
  if (is_dataset) {
    DatasetReader::Options o;
    o.rank = env.rank;
    o.world_size = env.world_size;
    FXDP_ASSIGN_OR_RETURN(DatasetReader d, DatasetReader::Open(args.data[0], runner.program(), o));
    log.Log("dataset ", args.data[0], ": ", d.num_steps(), " steps, read per step");
    r.dataset.emplace(std::move(d));
    return absl::OkStatus();
  }
  for (const std::string& d : args.data) {
    FXDP_ASSIGN_OR_RETURN(SafetensorsFile f, ReadSafetensors(d));
    ir::InputShapes shapes;
    for (const ProgramInput& in : runner.program().inputs()) {
      auto it = f.tensors.find(in.state_name);
      if (in.role == ir::PlaceholderRole::kInput && it != f.tensors.end())
        shapes.emplace(in.state_name, it->second.sizes().vec());
    }
    FXDP_ASSIGN_OR_RETURN(const uint32_t k, ProgramFor(r, shapes, absl::StrCat("--data ", d)));
    FXDP_ASSIGN_OR_RETURN(TensorMap shard,
                          ShardBatch(f.tensors, *runner.FindProgram(k), env.rank, env.world_size));
    r.batches.push_back(std::move(shard));
    r.batch_program.push_back(k);
  }
  return absl::OkStatus();
}

// The graph and the schedule first: a bad schedule fails before the
// rendezvous, so no rank waits for one that gave up. Then the programs, the
// state, the data and where --out goes, so a missing or bad file fails this
// rank before it meets its peers, which would otherwise only see "lost the
// connection to rank R". `timed` counts the time each step spends waiting
// on communication; its communicator is set after the rendezvous.
absl::Status LoadRank(const RunArgs& args, const LaunchEnv& env, const RankSetup& setup,
                      Logger& log, TimedCommunicator* timed, std::optional<MemoryTrace>& memory,
                      LoadedRank& r) {
  r.graph_path = WithRank(args.graphs[0], env.rank);
  r.paths = {r.graph_path};
  FXDP_ASSIGN_OR_RETURN(ir::Graph graph, ir::ReadGraphFile(r.graph_path));
  if (!args.schedule.empty()) {
    FXDP_ASSIGN_OR_RETURN(r.schedule, ir::Schedule::ReadFile(args.schedule, args.steps));
    FXDP_RETURN_IF_ERROR(ir::CheckHyperparameterNames(graph, r.schedule.names(),
                                                      absl::StrCat("--schedule ", args.schedule)));
    log.Log("schedule ", args.schedule, ": ", absl::StrJoin(r.schedule.names(), ", "));
  }
  FXDP_RETURN_IF_ERROR(CheckExpandedFor(graph, r.graph_path, env));
  SetIntraOpThreads(IntraOpThreads(args.threads, env));
  log.Log("intra-op threads: ", at::get_num_threads());

  const auto t_load = std::chrono::steady_clock::now();
  FXDP_ASSIGN_OR_RETURN(Program program, LoadRankProgram(graph, setup, timed));
  r.load_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_load).count();
  r.num_inputs = static_cast<int>(program.inputs().size());
  FXDP_ASSIGN_OR_RETURN(r.outputs, NamedOutputs::Of(graph, program.output_specs()));
  // FULLY_SHARD graphs: this rank reads only its flat shard of each sharded tensor.
  FXDP_ASSIGN_OR_RETURN(SafetensorsFile state,
                        ReadRankState(args.state, ShardedStateNames(graph), env.world_size,
                                      env.rank, &r.full_shapes));
  r.state_metadata = state.metadata;
  FXDP_ASSIGN_OR_RETURN(StepRunner runner,
                        StepRunner::Create(std::move(program), std::move(state.tensors)));
  r.runner.emplace(std::move(runner));
  FXDP_RETURN_IF_ERROR(AddPrograms(args, env, setup, graph, timed, r));
  FXDP_RETURN_IF_ERROR(LoadData(args, env, log, r));
  if (!args.out.empty() && (args.out.find("{rank}") != std::string::npos || env.rank == 0)) {
    r.out = WithRank(args.out, env.rank);
    FXDP_RETURN_IF_ERROR(CheckWritable(r.out, "--out"));
  }
  if (memory) memory->LoadDone();
  return absl::OkStatus();
}

// The steps: "step i/K loss L (T ms)" on stdout (rank 0), followed by the
// step's named metrics (" correct=5 accuracy=0.625", NamedOutputs), then the
// totals.
absl::Status RunSteps(const RunArgs& args, const LaunchEnv& env, Logger& log,
                      TimedCommunicator& timed, std::optional<MemoryTrace>& memory, LoadedRank& r) {
  StepRunner& runner = *r.runner;
  double total_ms = 0, total_wait_ms = 0;
  timed.TakeStats();
  for (int i = 0; i < args.steps; ++i) {
    log.set_step(i + 1);
    const auto t0 = std::chrono::steady_clock::now();
    if (absl::Status s = runner.SetHyperparameters(r.schedule.At(i + 1)); !s.ok())
      return absl::Status(s.code(),
                          absl::StrCat("step ", i + 1, "/", args.steps, ": ", s.message()));
    absl::StatusOr<uint32_t> id = r.dataset ? 0 : r.batch_program[i % r.batches.size()];
    if (r.dataset && !r.shapes.empty()) {
      absl::StatusOr<ir::InputShapes> shapes = r.dataset->StepShapes(i + 1, runner.program());
      id = shapes.ok()
               ? ProgramFor(r, *shapes, absl::StrCat("--data ", args.data[0], " step ", i + 1))
               : shapes.status();
    }
    if (!id.ok()) return id.status();
    Program& program = *runner.FindProgram(*id);
    absl::StatusOr<TensorMap> read;
    if (r.dataset) read = r.dataset->ReadStep(i + 1, program);
    if (r.dataset && !read.ok()) return read.status();
    absl::StatusOr<at::Tensor> loss =
        runner.Step(r.dataset ? *read : r.batches[i % r.batches.size()], *id);
    if (!loss.ok()) {
      return absl::Status(loss.status().code(), absl::StrCat("step ", i + 1, "/", args.steps,
                                                             " failed: ", loss.status().message()));
    }
    const double value = LossValue(*loss);  // syncs the device
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (memory) memory->StepDone(program);
    total_ms += ms;
    const CollectiveStats cs = timed.TakeStats();
    total_wait_ms += cs.wait_ms;
    if (cs.collectives > 0) {
      log.Log(absl::StrFormat("%.1f ms, %d collectives (%d bytes), %.1f ms waiting on them", ms,
                              cs.collectives, cs.bytes, cs.wait_ms));
    }
    if (env.rank == 0) {
      const std::string named = NamedValuesText(r.outputs.Values(runner.other_outputs()));
      std::printf("step %d/%d loss %.8g (%.1f ms)%s\n", i + 1, args.steps, value, ms,
                  named.c_str());
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
  return absl::OkStatus();
}

// --out: FULLY_SHARD's shards are gathered back first (every rank takes
// part); rank 0 (or every rank, with {rank}) writes whole tensors.
absl::Status WriteFinalState(const RunArgs& args, Logger& log, Communicator& comm,
                             const LoadedRank& r) {
  const StepRunner& runner = *r.runner;
  if (!r.full_shapes.empty() && !args.out.empty()) {
    FXDP_ASSIGN_OR_RETURN(TensorMap whole,
                          UnshardState(runner.state(), r.full_shapes, comm, args.timeout));
    if (!r.out.empty()) {
      FXDP_RETURN_IF_ERROR(WriteSafetensors(r.out, whole, r.state_metadata));
      log.Log("wrote the final state (", whole.size(), " tensors, ", r.full_shapes.size(),
              " gathered from shards) to ", r.out);
    }
  } else if (!r.out.empty()) {
    FXDP_RETURN_IF_ERROR(WriteSafetensors(r.out, runner.state(), r.state_metadata));
    log.Log("wrote the final state (", runner.state().size(), " tensors) to ", r.out);
  }
  return absl::OkStatus();
}

}  // namespace

int IntraOpThreads(int threads, const LaunchEnv& env) {
  // OpenMP threads of several processes spinning on the same cores make
  // every op ~50x slower.
  if (threads > 0 || env.world_size <= 1) return threads;
  const char* omp = std::getenv("OMP_NUM_THREADS");
  if (omp != nullptr && *omp != '\0') return 0;
  int local_world = 0;
  const char* lws = std::getenv("LOCAL_WORLD_SIZE");
  if (lws != nullptr && absl::SimpleAtoi(lws, &local_world) && local_world > 0) {
    return std::max<int>(1, static_cast<int>(std::thread::hardware_concurrency()) / local_world);
  }
  return 1;
}

absl::Status RunRank(const RunArgs& args, const LaunchEnv& env, Logger& log,
                     std::unique_ptr<Communicator>& comm) {
  if (args.memory_limit > 0) InstallCpuMemoryLimit(args.memory_limit);
  RankSetup setup;
  FXDP_ASSIGN_OR_RETURN(setup.device, ParseWorkerDevice(args.device, env.local_rank, "--device"));
  setup.rendezvous.host = env.master_addr;
  setup.rendezvous.port = env.master_port;
  setup.rendezvous.rank = env.rank;
  setup.rendezvous.world_size = env.world_size;
  setup.rendezvous.timeout = args.timeout;
  setup.communicator = args.communicator;
  setup.check_outputs = args.check_outputs;
  std::optional<MemoryTrace> memory = MemoryTrace::FromEnv(env.rank, env.world_size);
  setup.record_memory = memory.has_value();
  setup.seed = args.seed;

  TimedCommunicator timed(nullptr);
  LoadedRank r;
  FXDP_RETURN_IF_ERROR(LoadRank(args, env, setup, log, &timed, memory, r));
  FXDP_ASSIGN_OR_RETURN(comm, Rendezvous(setup, log.Prefix()));
  timed.set_inner(comm.get());
  log.Log("loaded ", r.graph_path, ": ", r.runner->program().num_nodes(), " ops, ", r.num_inputs,
          " inputs, on ", r.runner->program().device().str(), ", ", comm->name(), " (",
          absl::StrFormat("%.1f", r.load_ms), " ms)");

  FXDP_RETURN_IF_ERROR(RunSteps(args, env, log, timed, memory, r));
  if (setup.device.is_cuda()) log.Log(DeviceMemorySummary(setup.device));
  if (memory) {
    FXDP_RETURN_IF_ERROR(memory->Write());
    log.Log(memory->Summary());
  }
  return WriteFinalState(args, log, *comm, r);
}

}  // namespace fxdp::executor::run
