// Internal to the interpreter: the plan Program::Load builds from a graph
// (steps, argument plans, value slots) and the state of one Run. Shared by
// the files that build it and run it:
//   arg_binding.cc       graph arguments -> schema arguments (ArgPlan)
//   inplace.{h,cc}       which steps may write into their `self`
//   collective_steps.cc  all_reduce / wait_tensor: planning and running
//   program_loader.cc    the Load pass over the graph (+ ir::ComputeLiveness)
//   interpreter.cc       Program's API and the run loop
// Not part of the executor's API: include interpreter.h instead.
#ifndef FXDP_EXECUTOR_PROGRAM_IMPL_H_
#define FXDP_EXECUTOR_PROGRAM_IMPL_H_

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "analysis/ir/graph.h"
#include "analysis/ir/node_error.h"
#include "executor/communicator.h"
#include "executor/interpreter.h"
#include "executor/random_ops.h"

namespace fxdp::executor {

// Where one argument of a step comes from at run time.
struct ArgPlan {
  enum class Kind : uint8_t { kConst, kSlot, kList };
  Kind kind = Kind::kConst;
  bool move = false;           // kSlot: last read of the slot: move it out
  bool maybe_pending = false;  // reads the result of an all_reduce
  int32_t slot = -1;
  c10::IValue constant;
  // kList: element i is elem_slots[i] >= 0 ? slots[elem_slots[i]] : elem_consts[i].
  c10::TypePtr elem_type;
  std::vector<int32_t> elem_slots;
  std::vector<c10::IValue> elem_consts;
};

enum class StepKind : uint8_t { kOp, kAllReduce, kWait };
enum class ReturnKind : uint8_t { kNone, kSingle, kMulti, kList };

// One call node of the graph.
struct Step {
  StepKind kind = StepKind::kOp;
  ReturnKind ret = ReturnKind::kSingle;
  bool avg = false;  // all_reduce with reduce_op "avg"
  // kAllReduce steps: which collective. FULLY_SHARD's flat ones
  // (expansion/fully_shard.h) carry their group_size.
  enum class Collective : uint8_t { kAllReduce, kAllGather, kReduceScatter };
  Collective collective = Collective::kAllReduce;
  int64_t group_size = 0;
  int32_t node = -1;
  std::string name;  // node name and op
  std::string op_name;
  // For errors: "node 'NAME' (OP) [the user's line]" (ir::NodeLabel, Node::source).
  std::string label;
  std::optional<c10::OperatorHandle> op;
  // The op's in-place variant (`aten::mul_.Scalar` for `aten::mul.Scalar`),
  // called instead when `self` dies here and nothing else shares its storage
  // (inplace.h).
  std::optional<c10::OperatorHandle> inplace_op;
  std::vector<ArgPlan> args;
  std::vector<int32_t> out_slots;  // one per graph output
  std::vector<ir::ValueType> out_types;
  std::vector<int32_t> free_after;  // slots whose last read is this step
  // A random op of analysis/ir/random_ops.h: drawn by RunRandom, not the op.
  std::optional<RandomPlan> random;
  bool ran_inplace = false;  // the last run called inplace_op (value traces)
};

struct Program::Impl {
  ProgramOptions options;
  std::unique_ptr<LocalCommunicator> local;
  Communicator* comm = nullptr;

  std::vector<ProgramInput> inputs;
  std::vector<int32_t> input_slots;
  std::vector<int32_t> free_at_start;
  std::vector<Step> steps;
  std::vector<ArgPlan> outputs;
  std::vector<ir::OutputSpec> output_specs;
  int32_t num_slots = 0;
  // Random ops: the graph's layouts, the seed, step, batch and (set at the
  // first Run, from the communicator) this rank's slice.
  std::vector<ir::RandomLayout> random_layouts;
  int64_t random_world = 1;        // the graph's "fxdp.world_size"
  int64_t micro_batch = 0;         // the graph's ir::kMicroBatchKey (0: none)
  bool ragged = false;             // some input is ragged (ir::kRaggedKey)
  int64_t random_step_offset = 0;  // the graph's "fxdp.step_offset" (a resumed job)
  bool random_slice_set = false;
  RandomContext random;

  // Per run.
  std::vector<c10::IValue> slots;
  std::vector<std::unique_ptr<Work>> works;  // pending all_reduce per slot
  // Per pending slot: the all_reduce step that started it and its number
  // among this run's collectives (1-based), for errors.
  std::vector<std::pair<const Step*, int>> work_from;
  int collectives_started = 0;     // this run
  std::vector<int32_t> in_flight;  // slots whose works may still be pending
  std::vector<c10::IValue> stack;
  std::vector<std::pair<std::string, int64_t>> live_trace;
  std::vector<NodeMemory> memory_trace;
  std::vector<double> step_ms;  // ProgramOptions::profile, per step
  int64_t profiled_runs = 0;
  std::string value_trace;  // ProgramOptions::value_trace: this run's lines
  int64_t traced_runs = 0;

  // interpreter.cc
  absl::Status RunStep(Step& s);
  absl::Status Push(const ArgPlan& a, const Step& s);
  absl::Status TakeReturns(Step& s);
  absl::Status SetRandomSlice();
  void TraceStep(const Step& s);
  absl::Status WriteValueTrace();
  // collective_steps.cc
  absl::Status RunAllReduce(Step& s);
  absl::Status RunWait(Step& s);
  // Waits for the collective pending in `slot`, if any (`reader`: the step
  // that needs it, nullptr for the graph's outputs).
  absl::Status Resolve(int32_t slot, const Step* reader);

  void Clear() {
    for (auto& v : slots) v = c10::IValue();
    for (auto& w : works) w.reset();
    collectives_started = 0;
    in_flight.clear();
    stack.clear();
  }
  int64_t Live() const {
    int64_t n = 0;
    for (const auto& v : slots) n += v.isNone() ? 0 : 1;
    for (const auto& w : works) n += w ? 1 : 0;
    return n;
  }
};

// Planning errors: "node 'NAME' (OP): what" (analysis/ir/node_error.h).
using ir::NodeError;

// program_loader.cc: fills `impl` (options already set) from `graph`.
absl::Status LoadPlan(const ir::Graph& graph, Program::Impl& impl);

}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_PROGRAM_IMPL_H_
