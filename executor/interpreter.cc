// Program's API and the run loop: push each step's arguments onto a reused
// stack, call the op (or its in-place variant), take its returns, release
// the values that die there. The plan comes from program_loader.cc.
#include "executor/interpreter.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/InferenceMode.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "executor/inplace.h"
#include "executor/kernel_init.h"
#include "executor/memory_limit.h"
#include "executor/program_impl.h"
#include "executor/torch_types.h"
#include "executor/value_trace.h"
#include "util/status_macros.h"

namespace fxdp::executor {

absl::Status Program::Impl::Push(const ArgPlan& a, const Step& s) {
  switch (a.kind) {
    case ArgPlan::Kind::kConst: stack.push_back(a.constant); break;
    case ArgPlan::Kind::kSlot:
      if (a.maybe_pending) FXDP_RETURN_IF_ERROR(Resolve(a.slot, &s));
      if (a.move) {
        stack.push_back(std::move(slots[a.slot]));
      } else {
        stack.push_back(slots[a.slot]);
      }
      break;
    case ArgPlan::Kind::kList: {
      c10::impl::GenericList l(a.elem_type);
      l.reserve(a.elem_slots.size());
      for (size_t k = 0; k < a.elem_slots.size(); ++k) {
        const int32_t e = a.elem_slots[k];
        if (e >= 0) {
          if (a.maybe_pending) FXDP_RETURN_IF_ERROR(Resolve(e, &s));
          l.push_back(slots[e]);
        } else {
          l.push_back(a.elem_consts[k]);
        }
      }
      stack.push_back(c10::IValue(std::move(l)));
      break;
    }
  }
  return absl::OkStatus();
}

namespace {

// ProgramOptions::check_outputs with ragged inputs: their length is an upper
// bound, and so is every size computed from them.
bool FitsAtMost(const at::Tensor& t, const ir::TensorType& want) {
  if (!t.defined() || t.scalar_type() != ToTorch(want.dtype) ||
      t.dim() != static_cast<int64_t>(want.shape.size()))
    return false;
  for (size_t d = 0; d < want.shape.size(); ++d)
    if (t.size(static_cast<int64_t>(d)) > want.shape[d]) return false;
  return true;
}

}  // namespace

absl::Status Program::Impl::TakeReturns(Step& s) {
  auto error = [&](const std::string& what) {
    return absl::InternalError(absl::StrCat(s.label, ": ", what));
  };
  switch (s.ret) {
    case ReturnKind::kNone:
      for (int32_t slot : s.out_slots) slots[slot] = c10::IValue();
      break;
    case ReturnKind::kSingle: slots[s.out_slots[0]] = std::move(stack[0]); break;
    case ReturnKind::kMulti:
      for (size_t k = 0; k < s.out_slots.size(); ++k) slots[s.out_slots[k]] = std::move(stack[k]);
      break;
    case ReturnKind::kList: {
      if (!stack[0].isList())
        return error(absl::StrCat("returned ", stack[0].tagKind(), ", expected a list"));
      c10::impl::GenericList l = std::move(stack[0]).toList();
      if (l.size() != s.out_slots.size())
        return error(absl::StrCat("returned a list of ", l.size(), " values, the graph declares ",
                                  s.out_slots.size()));
      for (size_t k = 0; k < s.out_slots.size(); ++k) slots[s.out_slots[k]] = l.get(k);
      break;
    }
  }
  stack.clear();
  if (options.check_outputs) {
    for (size_t k = 0; k < s.out_slots.size(); ++k) {
      const ir::ValueType& want = s.out_types[k];
      if (!want.is_tensor()) continue;
      const c10::IValue& v = slots[s.out_slots[k]];
      if (!v.isTensor() ||
          !(ragged ? FitsAtMost(v.toTensor(), want.tensor) : Fits(v.toTensor(), want.tensor)))
        return error(absl::StrCat("output ", k, " is ", DescribeIValue(v), ", the graph says ",
                                  TypeForMessage(want.tensor), ragged ? " at most" : ""));
    }
  }
  return absl::OkStatus();
}

absl::Status Program::Impl::RunStep(Step& s) {
  stack.clear();
  switch (s.kind) {
    case StepKind::kOp: {
      for (const ArgPlan& a : s.args) FXDP_RETURN_IF_ERROR(Push(a, s));
      s.ran_inplace = false;
      if (s.random.has_value()) {
        if (absl::Status st = RunRandom(*s.random, random, options.device, stack); !st.ok())
          return absl::Status(st.code(),
                              absl::StrCat(ir::NodeLabel(s.name, s.op_name), ": ", st.message()));
      } else if (s.inplace_op.has_value() && Reusable(stack[0], s.out_types[0].tensor)) {
        s.ran_inplace = true;
        s.inplace_op->callBoxed(stack);
      } else {
        s.op->callBoxed(stack);
      }
      return TakeReturns(s);
    }
    case StepKind::kAllReduce: return RunAllReduce(s);
    case StepKind::kWait: return RunWait(s);
  }
  return absl::OkStatus();
}

Program::Program(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Program::Program(Program&&) noexcept = default;
Program& Program::operator=(Program&&) noexcept = default;
Program::~Program() = default;

absl::StatusOr<Program> Program::Load(const ir::Graph& graph, const ProgramOptions& options) {
  InitKernelLibraries();  // before any of its parallel regions (kernel_init.h)
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  try {
    FXDP_RETURN_IF_ERROR(LoadPlan(graph, *impl));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("loading the graph: ", ExceptionMessage(e)));
  }
  if (impl->options.communicator == nullptr) {
    impl->local = std::make_unique<LocalCommunicator>();
    impl->comm = impl->local.get();
  } else {
    impl->comm = impl->options.communicator;
  }
  return Program(std::move(impl));
}

const c10::Device& Program::device() const { return impl_->options.device; }
const std::vector<ProgramInput>& Program::inputs() const { return impl_->inputs; }
const std::vector<ir::OutputSpec>& Program::output_specs() const { return impl_->output_specs; }
int32_t Program::num_nodes() const { return static_cast<int32_t>(impl_->steps.size()); }
int64_t Program::micro_batch() const { return impl_->micro_batch; }
int64_t Program::live_values() const { return impl_->Live(); }
void Program::SetStep(int64_t step) { impl_->random.step = impl_->random_step_offset + step; }

// The rank's slice of the batch for sharded random nodes, from the
// communicator (set by the first Run: fxdp-worker run connects it after Load).
absl::Status Program::Impl::SetRandomSlice() {
  if (random_slice_set || random_layouts.empty()) return absl::OkStatus();
  if (comm->world_size() != random_world || random.batch < random_world)
    return absl::InvalidArgumentError(absl::StrCat(
        "the graph's random ops are laid out for ", random_world, " ranks and a batch of ",
        random.batch, " (metadata fxdp.world_size, fxdp.batch_size); this run has ",
        comm->world_size(), " ranks"));
  random.slice = ir::SliceForRank(random.batch, comm->world_size(), comm->rank());
  random_slice_set = true;
  return absl::OkStatus();
}
const std::vector<std::pair<std::string, int64_t>>& Program::live_trace() const {
  return impl_->live_trace;
}
const std::vector<NodeMemory>& Program::memory_trace() const { return impl_->memory_trace; }
std::vector<NodeTime> Program::profile() const {
  std::vector<NodeTime> out;
  for (size_t i = 0; i < impl_->steps.size() && i < impl_->step_ms.size(); ++i) {
    const Step& s = impl_->steps[i];
    out.push_back(NodeTime{s.name, s.op_name, impl_->profiled_runs, impl_->step_ms[i]});
  }
  return out;
}

absl::Status Program::CheckInputs(const std::vector<c10::IValue>& inputs) const {
  const auto& want = impl_->inputs;
  if (inputs.size() != want.size())
    return absl::InvalidArgumentError(
        absl::StrCat("the graph takes ", want.size(), " inputs, got ", inputs.size()));
  for (size_t i = 0; i < want.size(); ++i) {
    const ProgramInput& in = want[i];
    if (!in.type.is_tensor()) continue;
    const c10::IValue& v = inputs[i];
    if (!v.isTensor() || !InputFits(v.toTensor(), in))
      return absl::InvalidArgumentError(absl::StrCat(
          "placeholder '", in.node, "' (", ir::PlaceholderRoleName(in.role), " '", in.state_name,
          "'): expected ", InputTypeText(in), ", got ", DescribeIValue(v)));
  }
  return absl::OkStatus();
}

bool InputFits(const at::Tensor& t, const ProgramInput& in) {
  const ir::TensorType& want = in.type.tensor;
  if (in.ragged_offsets.empty() || want.shape.size() != 1) return Fits(t, want);
  return FitsAtMost(t, want);
}

std::string InputTypeText(const ProgramInput& in) {
  const ir::TensorType& t = in.type.tensor;
  if (in.ragged_offsets.empty() || t.shape.size() != 1) return TypeForMessage(t);
  return absl::StrCat(ir::DTypeShortName(t.dtype), "[<= ", t.shape[0],
                      "] (ragged: bags by the offsets '", in.ragged_offsets, "')");
}

namespace {

using Clock = std::chrono::steady_clock;

// Moves the run's inputs into their slots (copied to the program's device
// where they are elsewhere) and empties the slots that no step reads.
void BindInputs(Program::Impl& p, std::vector<c10::IValue>& inputs) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    c10::IValue v = std::move(inputs[i]);
    if (v.isTensor() && v.toTensor().device() != p.options.device)
      v = v.toTensor().to(p.options.device);
    p.slots[p.input_slots[i]] = std::move(v);
  }
  inputs.clear();
  for (int32_t slot : p.free_at_start) p.slots[slot] = c10::IValue();
}

// One step, a kernel's exception turned into a status naming the step.
absl::Status RunStepCaught(Program::Impl& p, Step& s) {
  try {
    return p.RunStep(s);
  } catch (const c10::OutOfMemoryError& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat(s.label, ": out of memory: ", ExceptionMessage(e)));
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(s.label, ": kernel failed: ", ExceptionMessage(e)));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(s.label, ": ", ExceptionMessage(e)));
  }
}

// After step `s` (started at `t0`): the values that die there released, and
// what ProgramOptions asked to record (value trace, profile, live values,
// memory).
void AfterStep(Program::Impl& p, const Step& s, Clock::time_point t0) {
  if (!p.options.value_trace.empty()) p.TraceStep(s);
  for (int32_t slot : s.free_after) {
    p.slots[slot] = c10::IValue();
    p.works[slot].reset();
  }
  if (p.options.profile) {
    p.step_ms[&s - p.steps.data()] +=
        std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  }
  if (p.options.record_live) p.live_trace.emplace_back(s.name, p.Live());
  if (p.options.record_memory) {
    const int64_t live = CpuTensorBytesInUse(), peak = PeakCpuTensorBytes();
    ResetPeakCpuTensorBytes();
    p.memory_trace.push_back(NodeMemory{s.name, s.op_name, live, peak});
  }
}

// Every step in order; stops at the first that fails.
absl::Status RunSteps(Program::Impl& p) {
  if (p.options.profile) {
    p.step_ms.resize(p.steps.size());
    ++p.profiled_runs;
  }
  for (Step& s : p.steps) {
    const Clock::time_point t0 = p.options.profile ? Clock::now() : Clock::time_point();
    FXDP_RETURN_IF_ERROR(RunStepCaught(p, s));
    AfterStep(p, s, t0);
  }
  return absl::OkStatus();
}

// The graph's outputs, each collective still pending in one waited for.
absl::Status TakeOutputs(Program::Impl& p, std::vector<c10::IValue>& results) {
  results.reserve(p.outputs.size());
  for (const ArgPlan& a : p.outputs) {
    if (a.kind != ArgPlan::Kind::kSlot) {
      results.emplace_back();
      continue;
    }
    if (a.maybe_pending) FXDP_RETURN_IF_ERROR(p.Resolve(a.slot, nullptr));
    results.push_back(p.slots[a.slot]);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<c10::IValue>> Program::Run(std::vector<c10::IValue> inputs) {
  Impl& p = *impl_;
  FXDP_RETURN_IF_ERROR(CheckInputs(inputs));
  FXDP_RETURN_IF_ERROR(p.SetRandomSlice());
  std::optional<c10::InferenceMode> inference;
  if (p.options.inference_mode) inference.emplace();
  if (p.options.record_live) p.live_trace.clear();
  if (p.options.record_memory) {
    p.memory_trace.clear();
    ResetPeakCpuTensorBytes();
  }
  absl::Status status;
  std::vector<c10::IValue> results;
  try {
    c10::DeviceGuard guard(p.options.device);
    BindInputs(p, inputs);
    status = RunSteps(p);
    if (status.ok()) status = TakeOutputs(p, results);
  } catch (const std::exception& e) {
    status = absl::InternalError(absl::StrCat("running the graph: ", ExceptionMessage(e)));
  }
  p.Clear();
  if (status.ok() && !p.options.value_trace.empty()) status = p.WriteValueTrace();
  if (!status.ok()) return status;
  return results;
}

void Program::Impl::TraceStep(const Step& s) {
  // empty, empty_like, new_empty, empty_strided: memory nobody wrote yet.
  const bool uninitialised = absl::StrContains(s.op_name, "empty");
  for (size_t k = 0; k < s.out_slots.size(); ++k) {
    absl::StrAppend(&value_trace, "run ", traced_runs + 1, " ", s.label,
                    s.ran_inplace ? " inplace" : "", " out ", k, " ",
                    TraceValue(slots[s.out_slots[k]], !uninitialised), "\n");
  }
}

absl::Status Program::Impl::WriteValueTrace() {
  ++traced_runs;
  std::ofstream f(options.value_trace, std::ios::app);
  f << value_trace;
  value_trace.clear();
  if (!f.good())
    return absl::InternalError(absl::StrCat("writing the value trace to '", options.value_trace,
                                            "': ", std::strerror(errno)));
  return absl::OkStatus();
}

}  // namespace fxdp::executor
