// Program::Load's pass over the graph: one value slot per node output, one
// Step per call node (its op's dispatcher handle, argument plans from
// ArgBinder, in-place variant, collective plan), the graph's outputs, and
// value lifetimes (ir::ComputeLiveness).
#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <torch/headeronly/version.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "analysis/ir/batch_split.h"
#include "analysis/ir/liveness.h"
#include "analysis/ir/node_error.h"
#include "executor/arg_binding.h"
#include "executor/collective_steps.h"
#include "executor/inplace.h"
#include "executor/program_impl.h"
#include "executor/random_ops.h"
#include "executor/torch_types.h"
#include "util/status_macros.h"

namespace fxdp::executor {
namespace {

using ir::Argument;
using ir::Node;
using ir::ValueRef;

// The overloads this LibTorch registers for the op `name` ("aten::add"),
// sorted, "default" for the unnamed one: what a missing overload's error offers.
std::vector<std::string> OverloadsOf(const std::string& name) {
  std::vector<std::string> out;
  for (const c10::OperatorName& op : c10::Dispatcher::singleton().getAllOpNames())
    if (op.name == name) out.push_back(op.overload_name.empty() ? "default" : op.overload_name);
  std::sort(out.begin(), out.end());
  return out;
}

class Loader {
 public:
  Loader(const ir::Graph& g, Program::Impl& impl) : g_(g), p_(impl) {}

  absl::Status Load() {
    FXDP_RETURN_IF_ERROR(CheckDevice());
    FXDP_RETURN_IF_ERROR(CheckOperators());
    slot_of_.resize(g_.size());
    for (int32_t i = 0; i < g_.size(); ++i) {
      const Node& n = g_.nodes()[i];
      switch (n.kind) {
        case ir::NodeKind::kPlaceholder:
        case ir::NodeKind::kGetAttr: {
          if (n.outputs.size() != 1)
            return NodeError(
                n, absl::StrCat("a graph input must have one output, it has ", n.outputs.size()));
          ProgramInput in;
          in.node = n.name;
          in.type = n.outputs[0];
          if (n.is_placeholder()) {
            in.role = n.placeholder.role;
            in.state_name = n.placeholder.state_name;
            if (in.role == ir::PlaceholderRole::kInput) in.batch_dim = n.placeholder.batch_dim;
          } else {
            in.role = ir::PlaceholderRole::kConstant;
            in.state_name = n.target.name;
          }
          slot_of_[i] = {NewSlot()};
          p_.inputs.push_back(std::move(in));
          p_.input_slots.push_back(slot_of_[i][0]);
          break;
        }
        case ir::NodeKind::kCallFunction: {
          if (n.is_getitem()) {
            // An alias of the element it names: no step, no slot of its own.
            const ValueRef* r = n.args.empty() ? nullptr : n.args[0].get_if<ValueRef>();
            if (r == nullptr) return NodeError(n, "operator.getitem needs a reference argument");
            slot_of_[i] = {Slot(*r)};
            break;
          }
          FXDP_ASSIGN_OR_RETURN(Step s, PlanCall(n, i));
          for (size_t k = 0; k < n.outputs.size(); ++k) s.out_slots.push_back(NewSlot());
          slot_of_[i] = s.out_slots;
          p_.steps.push_back(std::move(s));
          break;
        }
        case ir::NodeKind::kOutput: {
          for (const Argument& a : n.args) {
            if (const auto* l = a.get_if<Argument::List>()) {
              for (const Argument& e : *l) FXDP_RETURN_IF_ERROR(PlanOutput(n, e));
            } else {
              FXDP_RETURN_IF_ERROR(PlanOutput(n, a));
            }
          }
          p_.output_specs = n.output_specs;
          break;
        }
      }
    }
    p_.num_slots = next_slot_;
    PlanLifetimes();
    p_.slots.resize(p_.num_slots);
    p_.works.resize(p_.num_slots);
    p_.work_from.resize(p_.num_slots);
    return absl::OkStatus();
  }

 private:
  int32_t NewSlot() { return next_slot_++; }
  int32_t Slot(const ValueRef& r) const { return slot_of_[r.node.value][r.output]; }

  absl::Status CheckDevice() {
    const c10::Device& d = p_.options.device;
    if (d.is_cpu()) return absl::OkStatus();
    if (!d.is_cuda())
      return absl::InvalidArgumentError(
          absl::StrCat("device ", d.str(), " is not supported (cpu or cuda:N)"));
    if (!at::hasCUDA())
      return absl::FailedPreconditionError(
          absl::StrCat("device ", d.str(),
                       " requested but this LibTorch has no usable CUDA (no driver, no "
                       "device, or a CPU-only build)"));
    const int count = at::detail::getCUDAHooks().deviceCount();
    if (d.index() >= count)
      return absl::InvalidArgumentError(
          absl::StrCat("device ", d.str(), " requested but there are ", count, " CUDA devices"));
    if (!d.has_index()) p_.options.device = c10::Device(c10::kCUDA, 0);
    return absl::OkStatus();
  }

  // Every op the graph calls that this LibTorch lacks, all named at once,
  // before anything runs: a graph traced by a newer torch (2.13) loaded by an
  // older one (the GPU machine's 2.11) fails here naming each missing op or
  // overload, its nodes, and the overloads this LibTorch has instead.
  absl::Status CheckOperators() const {
    std::map<std::string, std::vector<const Node*>> missing;  // op -> its nodes
    for (const Node& n : g_.nodes()) {
      if (!n.is_call() || n.is_getitem() || IsCollectiveNode(n)) continue;
      if (!FindOperator(n.target).ok()) missing[n.target.ToString()].push_back(&n);
    }
    if (missing.empty()) return absl::OkStatus();
    std::vector<std::string> parts;
    for (const auto& [op, nodes] : missing) {
      const Node& first = *nodes.front();
      std::string what = std::string(FindOperator(first.target).status().message());
      if (nodes.size() > 1)
        absl::StrAppend(&what, " (and ", nodes.size() - 1,
                        nodes.size() == 2 ? " more node)" : " more nodes)");
      const std::vector<std::string> has = OverloadsOf(first.target.name);
      absl::StrAppend(&what, has.empty() ? absl::StrCat(", nor any overload of ", first.target.name)
                                         : absl::StrCat(", which has the overloads ",
                                                        absl::StrJoin(has, ", ")));
      parts.push_back(std::string(ir::NodeError(first, what).message()));
    }
    const std::string traced = g_.header().torch_version.empty()
                                   ? std::string("an unrecorded torch")
                                   : absl::StrCat("torch ", g_.header().torch_version);
    return absl::NotFoundError(absl::StrCat(
        missing.size(), " operator", missing.size() == 1 ? "" : "s", " of the graph (traced with ",
        traced, ") not in this LibTorch (", TORCH_VERSION, "): ", absl::StrJoin(parts, "; ")));
  }

  absl::StatusOr<Step> PlanCall(const Node& n, int32_t index) {
    Step s;
    s.node = index;
    s.name = n.name;
    s.op_name = n.target.ToString();
    s.label = ir::NodeLabel(n);
    if (IsCollectiveNode(n)) return PlanCollective(g_, n, std::move(s), slot_of_);
    auto op = FindOperator(n.target);
    if (!op.ok()) return NodeError(n, op.status().message(), absl::StatusCode::kNotFound);
    s.op = *op;
    const c10::FunctionSchema& schema = op->schema();
    ArgBinder binder(g_, slot_of_, p_.options.device);
    FXDP_ASSIGN_OR_RETURN(s.args, binder.BindCall(n, schema));
    const auto& rets = schema.returns();
    if (rets.empty()) {
      s.ret = ReturnKind::kNone;
    } else if (rets.size() == 1 && rets[0].type()->kind() == c10::TypeKind::ListType) {
      s.ret = ReturnKind::kList;
    } else if (rets.size() == 1) {
      s.ret = ReturnKind::kSingle;
      if (n.outputs.size() != 1)
        return NodeError(
            n, absl::StrCat("the op returns one value, the graph declares ", n.outputs.size()));
    } else {
      s.ret = ReturnKind::kMulti;
      if (n.outputs.size() != rets.size())
        return NodeError(n, absl::StrCat("the op returns ", rets.size(),
                                         " values, the graph declares ", n.outputs.size()));
    }
    s.out_types = n.outputs;
    PlanInplace(g_, n, s);
    if (const ir::RandomOp* r = ir::FindRandomOp(n.target)) {
      FXDP_ASSIGN_OR_RETURN(s.random, PlanRandom(*r, schema, n, p_.random_layouts));
      s.inplace_op.reset();
    }
    return s;
  }

  absl::Status PlanOutput(const Node& n, const Argument& a) {
    ArgPlan p;
    if (const auto* r = a.get_if<ValueRef>()) {
      p.kind = ArgPlan::Kind::kSlot;
      p.slot = Slot(*r);
    } else if (!a.is_none()) {
      return NodeError(n, absl::StrCat("output values must be references or None, got ",
                                       DescribeArgument(g_, a)));
    }
    p_.outputs.push_back(std::move(p));
    return absl::OkStatus();
  }

  // A slot is released after the step that reads it last; a slot nobody
  // reads right after it is produced (inputs: before the first step). A
  // slot an op reads once, for the last time, is moved onto its stack.
  void PlanLifetimes() {
    auto reads = [](const ArgPlan& a, std::vector<int32_t>& out) {
      if (a.kind == ArgPlan::Kind::kSlot) out.push_back(a.slot);
      if (a.kind == ArgPlan::Kind::kList)
        for (int32_t e : a.elem_slots)
          if (e >= 0) out.push_back(e);
    };
    ir::LivenessProblem problem;
    problem.num_slots = p_.num_slots;
    std::vector<bool> async(p_.num_slots, false);
    for (const Step& s : p_.steps) {
      problem.reads.emplace_back();
      for (const ArgPlan& a : s.args) reads(a, problem.reads.back());
      problem.writes.push_back(s.out_slots);
      for (int32_t slot : s.out_slots) async[slot] = s.kind == StepKind::kAllReduce;
    }
    for (const ArgPlan& a : p_.outputs) reads(a, problem.returned);
    ir::Liveness live = ir::ComputeLiveness(problem);
    p_.free_at_start = std::move(live.free_at_start);
    for (size_t i = 0; i < p_.steps.size(); ++i) {
      Step& s = p_.steps[i];
      s.free_after = std::move(live.free_after[i]);
      const std::vector<int32_t>& sole = live.last_sole_read[i];
      for (ArgPlan& a : s.args) {
        if (a.kind == ArgPlan::Kind::kSlot) {
          a.maybe_pending = async[a.slot];
          a.move = s.kind == StepKind::kOp && std::binary_search(sole.begin(), sole.end(), a.slot);
        } else if (a.kind == ArgPlan::Kind::kList) {
          for (int32_t e : a.elem_slots) a.maybe_pending |= e >= 0 && async[e];
        }
      }
      if (s.inplace_op.has_value() && !s.args[0].move) s.inplace_op.reset();
    }
    for (ArgPlan& a : p_.outputs)
      if (a.kind == ArgPlan::Kind::kSlot) a.maybe_pending = async[a.slot];
  }

  const ir::Graph& g_;
  Program::Impl& p_;
  std::vector<std::vector<int32_t>> slot_of_;
  int32_t next_slot_ = 0;
};

// The INPUT placeholder whose input name is `name`, or nullptr.
ProgramInput* FindInput(Program::Impl& impl, const std::string& name) {
  for (ProgramInput& in : impl.inputs)
    if (in.role == ir::PlaceholderRole::kInput && in.state_name == name) return &in;
  return nullptr;
}

std::string InputText(const ProgramInput& in) {
  return absl::StrCat(in.type.ToString(), in.batch_dim < 0
                                              ? std::string(" without a batch dim")
                                              : absl::StrCat(" batched on dim ", in.batch_dim));
}

// Graph metadata ir::kRaggedKey (issue 23): each ragged INPUT is marked with
// its offsets INPUT (ProgramInput::ragged_offsets), both checked first: the
// input 1-D without a batch dim, the offsets 1-D int64 or int32 with batch
// dim 0. INVALID_ARGUMENT naming the line and what does not fit.
absl::Status PlanRagged(const ir::Graph& graph, Program::Impl& impl) {
  for (const auto& [key, value] : graph.header().metadata) {
    if (key != ir::kRaggedKey) continue;
    FXDP_ASSIGN_OR_RETURN(const ir::RaggedInputs pairs, ir::ParseRagged(value));
    for (const auto& [input, offsets] : pairs) {
      const std::string where =
          absl::StrCat("graph metadata ", ir::kRaggedKey, " line '", input, " ", offsets, "': ");
      ProgramInput* in = FindInput(impl, input);
      ProgramInput* off = FindInput(impl, offsets);
      if (in == nullptr || off == nullptr)
        return absl::InvalidArgumentError(absl::StrCat(
            where, "the graph has no INPUT placeholder '", in == nullptr ? input : offsets, "'"));
      const ir::ValueType& t = in->type;
      if (!t.is_tensor() || t.tensor.shape.size() != 1 || in->batch_dim != -1)
        return absl::InvalidArgumentError(
            absl::StrCat(where, "input '", input, "' is ", InputText(*in),
                         "; a ragged input is a 1-D tensor without a batch dim"));
      const ir::ValueType& o = off->type;
      if (!o.is_tensor() || o.tensor.shape.size() != 1 || off->batch_dim != 0 ||
          (o.tensor.dtype != ir::DType::kInt64 && o.tensor.dtype != ir::DType::kInt32))
        return absl::InvalidArgumentError(
            absl::StrCat(where, "its offsets '", offsets, "' are ", InputText(*off),
                         "; offsets are a 1-D int64 or int32 tensor batched on dim 0"));
      if (!in->ragged_offsets.empty() && in->ragged_offsets != offsets)
        return absl::InvalidArgumentError(absl::StrCat(
            where, "input '", input, "' is already cut by the offsets '", in->ragged_offsets, "'"));
      in->ragged_offsets = offsets;
      impl.ragged = true;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LoadPlan(const ir::Graph& graph, Program::Impl& impl) {
  FXDP_ASSIGN_OR_RETURN(const uint64_t seed, ir::MetadataNumber(graph, ir::kSeedKey, 0));
  impl.random.seed = impl.options.seed.value_or(seed);
  FXDP_ASSIGN_OR_RETURN(const uint64_t offset, ir::MetadataNumber(graph, ir::kStepOffsetKey, 0));
  impl.random_step_offset = static_cast<int64_t>(offset);
  FXDP_ASSIGN_OR_RETURN(const uint64_t batch, ir::MetadataNumber(graph, ir::kBatchSizeKey, 0));
  impl.random.batch = static_cast<int64_t>(batch);
  FXDP_ASSIGN_OR_RETURN(const uint64_t world, ir::MetadataNumber(graph, "fxdp.world_size", 1));
  impl.random_world = static_cast<int64_t>(world);
  FXDP_ASSIGN_OR_RETURN(const uint64_t micro, ir::MetadataNumber(graph, ir::kMicroBatchKey, 0));
  impl.micro_batch = static_cast<int64_t>(micro);
  for (const auto& [key, value] : graph.header().metadata) {
    if (key == ir::kRandomLayoutKey) {
      FXDP_ASSIGN_OR_RETURN(impl.random_layouts, ir::ParseRandomLayouts(value));
    }
  }
  FXDP_RETURN_IF_ERROR(Loader(graph, impl).Load());
  return PlanRagged(graph, impl);
}

}  // namespace fxdp::executor
