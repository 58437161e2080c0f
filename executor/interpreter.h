// The LibTorch interpreter: runs an fxdp graph node by node through the c10
// dispatcher.
//
// Program::Load prepares everything once: for every call node the dispatcher's
// OperatorHandle (schema name + overload), and for every schema argument where
// its value comes from: a value slot (tensor references, filled per run), or a
// constant converted to a c10::IValue once (graph args by position, kwargs by
// schema argument name, the rest from the schema's defaults). Program::Run then
// only pushes IValues onto a reused stack and calls `callBoxed`; every value
// is released right after its last use (computed at load), so a step's peak
// memory is that of the graph's live values, as in eager mode.
//
// Buffer reuse (inplace.h): a pointwise op (add, mul, div, lerp, addcmul,
// addcdiv, sqrt, relu, ...: the op table's kInplace rows, analysis/op_rules.cc) whose `self`
// argument dies at that node runs as its in-place variant (`aten::mul_.Scalar` for
// `aten::mul.Scalar`) when the graph gives self and the result the same dtype
// and shape, contiguous, and at run time nothing else holds self's storage
// (use counts 1: never a tensor the caller kept, an input still read later or
// a view). The result is the same; it saves an allocation and a third of the
// memory traffic (the functional Adam of a traced step writes 7 new tensors
// per parameter, eager Adam 2). Inputs passed by move (StepRunner hands over
// the state it replaces) can be overwritten this way.
//
// Conventions:
//  * `operator.getitem` aliases output k of a multi-output node (a tuple or a
//    Tensor[] return, split into one slot per graph output); it costs nothing.
//  * A number given for a Tensor argument (`aten::add.Tensor(%x, 1)`, as FX
//    records it) becomes a CPU "wrapped number" tensor, like torch's Python
//    argument parser makes, so type promotion treats it as a scalar.
//  * Devices: the program runs on one device (cpu or cuda:k). Input tensors on
//    another device are copied there. Every device *argument* (factory ops'
//    `device=` kwarg, `_to_copy`), whatever it names (cpu, meta, cuda:1), is
//    replaced by the program's device (ArgBinder::MapDevice): a traced step's
//    tensors all live on one device.
//  * `_c10d_functional::all_reduce(t, reduce_op, group)` starts
//    Communicator::AllReduceSum ("sum"; "avg" divides the sum by the world
//    size) and keeps the Work in the value table;
//    `_c10d_functional::wait_tensor` waits for it (ProgramOptions::
//    collective_timeout). A node other than wait_tensor that reads a pending
//    all_reduce waits first. A failed wait names the waiting node, the
//    all_reduce node, its number among the run's collectives and the
//    communicator's reason (rank, lost peer, timeout). The group name is not interpreted: a program
//    has one communicator. Without a communicator the program uses a LocalCommunicator (world size
//    1: all_reduce is a clone).
//  * Runs under c10::InferenceMode by default (no autograd bookkeeping): the
//    outputs are inference tensors; do not modify them in place outside
//    InferenceMode.
//  * Errors name the node, its op and what is wrong: NOT_FOUND for an op this
//    LibTorch does not know, INVALID_ARGUMENT for arguments that do not fit
//    the schema (expected vs got) and for kernel errors (c10::Error), INTERNAL
//    for other exceptions, RESOURCE_EXHAUSTED for out of memory.
//
// A Program is not thread-safe: one Run at a time.
#ifndef FXDP_EXECUTOR_INTERPRETER_H_
#define FXDP_EXECUTOR_INTERPRETER_H_

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "analysis/ir/graph.h"
#include "executor/communicator.h"

namespace fxdp::executor {

struct ProgramOptions {
  c10::Device device = c10::Device(c10::kCPU);
  // Not owned; must outlive the Program. nullptr: a LocalCommunicator.
  Communicator* communicator = nullptr;
  std::chrono::milliseconds collective_timeout{std::chrono::minutes(5)};
  bool inference_mode = true;
  // After every node, compare each tensor output's dtype and sizes with the
  // graph's metadata (INTERNAL naming the node on a mismatch; with ragged
  // inputs, whose length is an upper bound, each size at most the graph's).
  // Costs a little host time per node; meant for checking rewritten graphs.
  bool check_outputs = false;
  // Tests: record the number of live values after every node (live_trace()).
  bool record_live = false;
  // Add up the wall time of every call node over all runs (profile()).
  bool profile = false;
  // Measuring (memory_limit.h's counting CPU allocator, installed by the
  // caller): after every node, the live CPU tensor bytes and the most they
  // were during the node (memory_trace()). Resets the counter's peak at every
  // node.
  bool record_memory = false;
  // The seed of the random ops (docs/randomness.md); unset: the graph's
  // metadata "fxdp.seed" (0 when it has none).
  std::optional<uint64_t> seed;
  // Non-empty: after every run, append each call node's outputs to this file
  // (value_trace.h: shapes, strides, a hash of the values). Slow; for
  // finding where two runs that should be bit-identical part.
  std::string value_trace;
};

// ProgramOptions::record_memory: one entry per call node of the last run.
struct NodeMemory {
  std::string node;
  std::string op;
  int64_t live_bytes = 0;  // after the node, its dead values released
  int64_t peak_bytes = 0;  // the most during the node (its outputs, temporaries, collectives)
};

// ProgramOptions::profile: one entry per call node, in execution order.
struct NodeTime {
  std::string node;
  std::string op;
  int64_t runs = 0;
  double total_ms = 0;  // over all runs, including waits for collectives
};

// One graph input: a placeholder (or a get_attr node, read from the state by
// its target name with role CONSTANT).
struct ProgramInput {
  std::string node;
  ir::PlaceholderRole role = ir::PlaceholderRole::kInput;
  std::string state_name;
  int32_t batch_dim = -1;  // INPUT only: the batch dim, -1 for none
  ir::ValueType type;
  // A ragged INPUT (graph metadata ir::kRaggedKey, issue 23): the name of
  // the INPUT holding its offsets; empty for any other input. Its type is
  // 1-D at the global length, an upper bound: a rank gets only its bags'
  // elements (ir::CutRagged), any length from 0 up to it.
  std::string ragged_offsets;
};

// Whether `t` may be given for `in`: the graph's dtype and sizes, or for a
// ragged input 1-D of the graph's dtype and at most its length.
bool InputFits(const at::Tensor& t, const ProgramInput& in);
// What `in` takes, for errors: "i64[40]", or "i64[<= 40] (ragged: bags by
// the offsets 'offsets')".
std::string InputTypeText(const ProgramInput& in);

class Program {
 public:
  static absl::StatusOr<Program> Load(const ir::Graph& graph, const ProgramOptions& options);
  static absl::StatusOr<Program> Load(const ir::Graph& graph, c10::Device device) {
    ProgramOptions o;
    o.device = device;
    return Load(graph, o);
  }

  Program(Program&&) noexcept;
  Program& operator=(Program&&) noexcept;
  ~Program();

  const c10::Device& device() const;
  // The graph inputs in graph order; Run takes one value per entry.
  const std::vector<ProgramInput>& inputs() const;
  // The roles of Run's results, one per returned value.
  const std::vector<ir::OutputSpec>& output_specs() const;
  int32_t num_nodes() const;  // call nodes that run (getitem excluded)
  // The graph's micro-batch size in rows (metadata ir::kMicroBatchKey; 0:
  // none): which global rows this rank holds is ir::RankRows(B, it, N, r).
  int64_t micro_batch() const;

  // Checks `inputs` against inputs() (count, dtype, sizes; a ragged input's
  // length up to the graph's, InputFits) without running.
  absl::Status CheckInputs(const std::vector<c10::IValue>& inputs) const;
  // Runs the graph once. Tensors on another device are copied to device().
  // The program holds the only references it is given: pass inputs by move
  // to let them be freed after their last use.
  absl::StatusOr<std::vector<c10::IValue>> Run(std::vector<c10::IValue> inputs);
  // The 1-based training step the next Runs draw their random numbers for
  // (executor/random_ops.h); default 1.
  void SetStep(int64_t step);

  // Values held in the value table right now (0 between runs).
  int64_t live_values() const;
  // With ProgramOptions::record_live: after Run, (node name, live values
  // after that node) for every call node, in execution order.
  const std::vector<std::pair<std::string, int64_t>>& live_trace() const;
  // With ProgramOptions::record_memory: after Run, every call node's memory.
  const std::vector<NodeMemory>& memory_trace() const;
  // With ProgramOptions::profile: the time spent in each call node so far.
  std::vector<NodeTime> profile() const;

  struct Impl;  // implementation detail (interpreter.cc)

 private:
  explicit Program(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Tensors by name (state, batches, safetensors files).
using TensorMap = std::map<std::string, at::Tensor>;

}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_INTERPRETER_H_
