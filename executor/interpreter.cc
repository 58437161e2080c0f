#include "executor/interpreter.h"

#include <ATen/ATen.h>
#include <ATen/ScalarOps.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "analysis/ir/hyperparameters.h"
#include "analysis/ir/status_macros.h"
#include "analysis/ir/text.h"
#include "executor/torch_types.h"

namespace fxdp::executor {
namespace {

using ir::Argument;
using ir::Node;
using ir::ValueKind;
using ir::ValueRef;

constexpr absl::string_view kAllReduce = "_c10d_functional::all_reduce";
constexpr absl::string_view kWaitTensor = "_c10d_functional::wait_tensor";
constexpr absl::string_view kFunctionalPrefix = "_c10d_functional::";

std::string DescribeTorchTensor(const at::Tensor& t) {
  if (!t.defined()) return "an undefined tensor";
  auto d = FromTorch(t.scalar_type());
  std::string s = d.ok() ? std::string(ir::DTypeShortName(*d)) : c10::toString(t.scalar_type());
  absl::StrAppend(&s, "[", absl::StrJoin(t.sizes(), ", "), "]");
  if (!t.device().is_cpu()) absl::StrAppend(&s, "@", t.device().str());
  return s;
}

std::string DescribeIValue(const c10::IValue& v) {
  if (v.isTensor()) return DescribeTorchTensor(v.toTensor());
  return v.tagKind();
}

bool SameSizes(const at::Tensor& t, const ir::TensorType& want) {
  return t.sizes() == c10::IntArrayRef(want.shape);
}

// Whether `t` fits the graph's type (dtype and sizes; strides and device are
// not the graph's business at run time).
bool Fits(const at::Tensor& t, const ir::TensorType& want) {
  return t.defined() && t.scalar_type() == ToTorch(want.dtype) && SameSizes(t, want);
}

std::string TypeForMessage(const ir::TensorType& t) {
  return absl::StrCat(ir::DTypeShortName(t.dtype), "[", absl::StrJoin(t.shape, ", "), "]");
}

// Pointwise ops whose in-place variant (`name_`, same overload, same
// arguments) computes what the functional op would, into `self`.
bool HasPointwiseInplaceVariant(absl::string_view name) {
  static constexpr absl::string_view kOps[] = {
      "aten::abs",        "aten::add",     "aten::addcdiv",    "aten::addcmul",
      "aten::clamp",      "aten::clamp_max", "aten::clamp_min", "aten::cos",
      "aten::div",        "aten::exp",     "aten::gelu",       "aten::hardtanh",
      "aten::leaky_relu", "aten::lerp",    "aten::log",        "aten::masked_fill",
      "aten::mul",        "aten::neg",     "aten::reciprocal", "aten::relu",
      "aten::rsqrt",      "aten::sigmoid", "aten::sign",       "aten::silu",
      "aten::sin",        "aten::sqrt",    "aten::sub",        "aten::tanh",
  };
  return std::find(std::begin(kOps), std::end(kOps), name) != std::end(kOps);
}

bool DenseContiguous(const ir::TensorType& t) {
  return t.IsContiguous() && t.storage_offset == 0;
}

// Whether `v`, the value an op's `self` argument was moved into, may be
// overwritten: a dense tensor no other tensor (or view) shares.
bool Reusable(const c10::IValue& v, const ir::TensorType& want) {
  if (!v.isTensor()) return false;
  const at::Tensor& t = v.toTensor();
  if (!t.defined() || t.use_count() != 1 || t.unsafeGetTensorImpl()->is_wrapped_number() ||
      t.requires_grad())
    return false;
  if (t.scalar_type() != ToTorch(want.dtype) || !SameSizes(t, want)) return false;
  if (!t.is_contiguous() || t.storage_offset() != 0) return false;
  const c10::Storage& st = t.storage();
  return st.use_count() == 1 &&
         st.nbytes() == static_cast<size_t>(t.numel()) * t.element_size();
}

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

struct Step {
  StepKind kind = StepKind::kOp;
  ReturnKind ret = ReturnKind::kSingle;
  bool avg = false;  // all_reduce with reduce_op "avg"
  int32_t node = -1;
  std::string name;  // node name and op, for errors
  std::string op_name;
  std::optional<c10::OperatorHandle> op;
  // The op's in-place variant (`aten::mul_.Scalar` for `aten::mul.Scalar`),
  // called instead when `self` dies here and nothing else shares its storage:
  // the result is written into self's buffer (no allocation, less memory
  // traffic). Only for the ops of HasPointwiseInplaceVariant() whose output has
  // self's dtype and shape, contiguous.
  std::optional<c10::OperatorHandle> inplace_op;
  std::vector<ArgPlan> args;
  std::vector<int32_t> out_slots;  // one per graph output
  std::vector<ir::ValueType> out_types;
  std::vector<int32_t> free_after;  // slots whose last read is this step
};

// A Work whose result is divided by the world size (reduce_op "avg").
class AvgWork : public Work {
 public:
  AvgWork(std::unique_ptr<Work> inner, int world) : inner_(std::move(inner)), world_(world) {}
  absl::StatusOr<at::Tensor> Wait(std::chrono::milliseconds timeout) override {
    FXDP_ASSIGN_OR_RETURN(at::Tensor t, inner_->Wait(timeout));
    return t.div_(world_);
  }

 private:
  std::unique_ptr<Work> inner_;
  int world_;
};

}  // namespace

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

  // Per run.
  std::vector<c10::IValue> slots;
  std::vector<std::unique_ptr<Work>> works;  // pending all_reduce per slot
  // Per pending slot: the all_reduce step that started it and its number
  // among this run's collectives (1-based), for errors.
  std::vector<std::pair<const Step*, int>> work_from;
  int collectives_started = 0;  // this run
  std::vector<c10::IValue> stack;
  std::vector<std::pair<std::string, int64_t>> live_trace;
  std::vector<double> step_ms;  // ProgramOptions::profile, per step
  int64_t profiled_runs = 0;

  absl::Status RunStep(Step& s);
  absl::Status Resolve(int32_t slot, const Step* reader);
  absl::Status Push(const ArgPlan& a, const Step& s);
  absl::Status TakeReturns(Step& s);
  void Clear() {
    for (auto& v : slots) v = c10::IValue();
    for (auto& w : works) w.reset();
    collectives_started = 0;
    stack.clear();
  }
  int64_t Live() const {
    int64_t n = 0;
    for (const auto& v : slots) n += v.isNone() ? 0 : 1;
    for (const auto& w : works) n += w ? 1 : 0;
    return n;
  }
};

namespace {

// Builds the Impl from a graph: slot assignment, argument plans, last uses.
class Loader {
 public:
  Loader(const ir::Graph& g, Program::Impl& impl) : g_(g), p_(impl) {}

  absl::Status Load() {
    FXDP_RETURN_IF_ERROR(CheckDevice());
    trace_device_ = TraceDeviceType();
    slot_of_.resize(g_.size());
    for (int32_t i = 0; i < g_.size(); ++i) {
      const Node& n = g_.nodes()[i];
      switch (n.kind) {
        case ir::NodeKind::kPlaceholder:
        case ir::NodeKind::kGetAttr: {
          if (n.outputs.size() != 1)
            return NodeError(n, absl::StrCat("a graph input must have one output, it has ",
                                             n.outputs.size()));
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
      return absl::FailedPreconditionError(absl::StrCat(
          "device ", d.str(), " requested but this LibTorch has no usable CUDA (no driver, no "
          "device, or a CPU-only build)"));
    const int count = at::detail::getCUDAHooks().deviceCount();
    if (d.index() >= count)
      return absl::InvalidArgumentError(
          absl::StrCat("device ", d.str(), " requested but there are ", count, " CUDA devices"));
    if (!d.has_index()) p_.options.device = c10::Device(c10::kCUDA, 0);
    return absl::OkStatus();
  }

  ir::DeviceType TraceDeviceType() const {
    for (const Node& n : g_.nodes()) {
      if (!n.is_placeholder()) continue;
      for (const ir::ValueType& t : n.outputs)
        if (t.is_tensor()) return t.tensor.device.type;
    }
    return ir::DeviceType::kCpu;
  }

  c10::Device MapDevice(const ir::Device& d) const {
    if (d.type == trace_device_) return p_.options.device;
    return ToTorch(d);
  }

  absl::Status NodeError(const Node& n, absl::string_view what,
                         absl::StatusCode code = absl::StatusCode::kInvalidArgument) const {
    return absl::Status(code, absl::StrCat("node '", n.name, "' (", n.target.ToString(),
                                           "): ", what));
  }

  std::string Describe(const Argument& a) const {
    if (const auto* r = a.get_if<ValueRef>()) {
      const Node& src = g_.node(r->node);
      std::string s = absl::StrCat("a reference to %", src.name);
      if (src.outputs.size() > 1) absl::StrAppend(&s, "#", r->output);
      return absl::StrCat(s, " (", g_.type(*r).ToString(), ")");
    }
    if (a.is<int64_t>()) return absl::StrCat("int ", ir::PrintArgument(g_, a));
    if (a.is<double>()) return absl::StrCat("float ", ir::PrintArgument(g_, a));
    if (a.is<bool>()) return absl::StrCat("bool ", ir::PrintArgument(g_, a));
    if (a.is<std::string>()) return absl::StrCat("string ", ir::PrintArgument(g_, a));
    if (a.is_none()) return "None";
    if (a.is<ir::DType>()) return absl::StrCat("dtype ", ir::PrintArgument(g_, a));
    if (a.is<ir::Device>()) return absl::StrCat("device ", a.as<ir::Device>().ToString());
    if (a.is<ir::Layout>()) return absl::StrCat("layout ", ir::PrintArgument(g_, a));
    if (a.is<ir::MemoryFormat>()) return absl::StrCat("memory format ", ir::PrintArgument(g_, a));
    if (a.is<ir::Scalar>()) return absl::StrCat("scalar ", ir::PrintArgument(g_, a));
    return absl::StrCat("list ", ir::PrintArgument(g_, a));
  }

  // A bound value: a slot read at run time, or a constant.
  struct Bound {
    int32_t slot = -1;
    c10::IValue value;
  };

  absl::Status Mismatch(const Node& n, const std::string& where, const c10::TypePtr& type,
                        const Argument& a) const {
    return NodeError(n, absl::StrCat(where, " expects ", type->str(), ", got ",
                                     Describe(a)));
  }

  static c10::IValue ScalarIValue(const ir::Scalar& s) {
    return std::visit(
        [](const auto& v) -> c10::IValue {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, std::complex<double>>) {
            return c10::IValue(c10::complex<double>(v.real(), v.imag()));
          } else {
            return c10::IValue(v);
          }
        },
        s.value);
  }

  // The number in `a` as a Scalar, if it is one (int, float, bool, scalar).
  static std::optional<at::Scalar> AsNumber(const Argument& a) {
    if (const auto* i = a.get_if<int64_t>()) return at::Scalar(*i);
    if (const auto* d = a.get_if<double>()) return at::Scalar(*d);
    if (const auto* b = a.get_if<bool>()) return at::Scalar(*b);
    if (const auto* s = a.get_if<ir::Scalar>()) return ScalarIValue(*s).toScalar();
    return std::nullopt;
  }

  // Binds `a` to a schema type. `fake` is the type the boxed calling
  // convention uses (int for SymInt/ScalarType/...), `real` the declared one.
  absl::StatusOr<Bound> Bind(const Node& n, const std::string& where, const Argument& a,
                             const c10::TypePtr& fake, const c10::TypePtr& real,
                             std::optional<int32_t> list_n) {
    using K = c10::TypeKind;
    const K kind = real->kind();
    if (kind == K::OptionalType) {
      if (a.is_none()) return Bound{};
      return Bind(n, where, a, fake->expectRef<c10::OptionalType>().getElementType(),
                  real->expectRef<c10::OptionalType>().getElementType(), list_n);
    }
    if (const auto* r = a.get_if<ValueRef>()) {
      const ir::ValueType& t = g_.type(*r);
      bool ok = false;
      switch (kind) {
        case K::TensorType: ok = t.is_tensor(); break;
        case K::IntType: case K::SymIntType: ok = t.kind == ValueKind::kInt; break;
        case K::FloatType: case K::SymFloatType: ok = t.kind == ValueKind::kFloat; break;
        case K::BoolType: case K::SymBoolType: ok = t.kind == ValueKind::kBool; break;
        case K::NumberType:
          ok = t.kind == ValueKind::kInt || t.kind == ValueKind::kFloat ||
               t.kind == ValueKind::kBool;
          break;
        default: break;
      }
      if (!ok) return Mismatch(n, where, real, a);
      return Bound{Slot(*r), c10::IValue()};
    }
    switch (kind) {
      case K::TensorType: {
        // A number for a Tensor argument: a wrapped-number CPU tensor, as
        // torch's Python argument parser makes it.
        auto num = AsNumber(a);
        if (!num) return Mismatch(n, where, real, a);
        at::Tensor t = c10::scalar_to_tensor(*num);
        t.unsafeGetTensorImpl()->set_wrapped_number(true);
        return Bound{-1, c10::IValue(std::move(t))};
      }
      case K::IntType:
      case K::SymIntType:
        if (const auto* i = a.get_if<int64_t>()) return Bound{-1, c10::IValue(*i)};
        break;
      case K::FloatType:
      case K::SymFloatType:
        if (const auto* d = a.get_if<double>()) return Bound{-1, c10::IValue(*d)};
        if (const auto* i = a.get_if<int64_t>())
          return Bound{-1, c10::IValue(static_cast<double>(*i))};
        break;
      case K::BoolType:
      case K::SymBoolType:
        if (const auto* b = a.get_if<bool>()) return Bound{-1, c10::IValue(*b)};
        break;
      case K::NumberType: {
        if (const auto* s = a.get_if<ir::Scalar>()) return Bound{-1, ScalarIValue(*s)};
        auto num = AsNumber(a);
        if (num) return Bound{-1, c10::IValue(*num)};
        break;
      }
      case K::ComplexType:
        if (const auto* s = a.get_if<ir::Scalar>()) return Bound{-1, ScalarIValue(*s)};
        break;
      case K::StringType:
        if (const auto* s = a.get_if<std::string>()) return Bound{-1, c10::IValue(*s)};
        break;
      case K::ScalarTypeType:
        if (const auto* d = a.get_if<ir::DType>())
          return Bound{-1, c10::IValue(static_cast<int64_t>(ToTorch(*d)))};
        break;
      case K::LayoutType:
        if (const auto* l = a.get_if<ir::Layout>())
          return Bound{-1, c10::IValue(static_cast<int64_t>(ToTorch(*l)))};
        break;
      case K::MemoryFormatType:
        if (const auto* m = a.get_if<ir::MemoryFormat>())
          return Bound{-1, c10::IValue(static_cast<int64_t>(ToTorch(*m)))};
        break;
      case K::DeviceObjType:
        if (const auto* d = a.get_if<ir::Device>()) return Bound{-1, c10::IValue(MapDevice(*d))};
        if (const auto* s = a.get_if<std::string>()) {
          auto d = ir::Device::Parse(*s);
          if (d.ok()) return Bound{-1, c10::IValue(MapDevice(*d))};
        }
        break;
      case K::NoneType:
        if (a.is_none()) return Bound{};
        break;
      case K::ListType: {
        const c10::TypePtr fe = fake->expectRef<c10::ListType>().getElementType();
        const c10::TypePtr re = real->expectRef<c10::ListType>().getElementType();
        std::vector<Bound> elems;
        if (const auto* l = a.get_if<Argument::List>()) {
          for (size_t k = 0; k < l->size(); ++k) {
            FXDP_ASSIGN_OR_RETURN(Bound b, Bind(n, absl::StrCat(where, " element ", k), (*l)[k],
                                                fe, re, std::nullopt));
            elems.push_back(std::move(b));
          }
        } else if (a.is<int64_t>() && (re->kind() == K::IntType || re->kind() == K::SymIntType)) {
          // `int[2] stride=1`: a bare int stands for N copies (Python's rule).
          for (int32_t k = 0; k < list_n.value_or(1); ++k)
            elems.push_back(Bound{-1, c10::IValue(a.as<int64_t>())});
        } else {
          break;
        }
        return BoundList(fe, std::move(elems));
      }
      default:
        return NodeError(n, absl::StrCat(where, " has type ", real->str(),
                                         ", which the interpreter does not support"),
                         absl::StatusCode::kUnimplemented);
    }
    return Mismatch(n, where, real, a);
  }

  // Lists: a constant list when no element is a slot, else a marker the
  // caller turns into a kList plan (Bound.slot == -2, elements in list_).
  absl::StatusOr<Bound> BoundList(const c10::TypePtr& elem_type, std::vector<Bound> elems) {
    bool any_slot = false;
    for (const Bound& b : elems) any_slot |= b.slot >= 0;
    if (!any_slot) {
      c10::impl::GenericList l(elem_type);
      l.reserve(elems.size());
      for (Bound& b : elems) l.push_back(std::move(b.value));
      return Bound{-1, c10::IValue(std::move(l))};
    }
    pending_list_.elem_type = elem_type;
    pending_list_.elem_slots.clear();
    pending_list_.elem_consts.clear();
    for (Bound& b : elems) {
      pending_list_.elem_slots.push_back(b.slot);
      pending_list_.elem_consts.push_back(std::move(b.value));
    }
    return Bound{-2, c10::IValue()};
  }

  absl::StatusOr<ArgPlan> PlanArg(const Node& n, const c10::Argument& sa, const Argument& a) {
    FXDP_ASSIGN_OR_RETURN(Bound b, Bind(n, absl::StrCat("argument '", sa.name(), "'"), a,
                                        sa.type(), sa.real_type(), sa.N()));
    ArgPlan p;
    if (b.slot == -2) {
      p = std::move(pending_list_);
      pending_list_ = ArgPlan();
      p.kind = ArgPlan::Kind::kList;
    } else if (b.slot >= 0) {
      p.kind = ArgPlan::Kind::kSlot;
      p.slot = b.slot;
    } else {
      p.kind = ArgPlan::Kind::kConst;
      p.constant = std::move(b.value);
    }
    return p;
  }

  absl::StatusOr<Step> PlanCall(const Node& n, int32_t index) {
    Step s;
    s.node = index;
    s.name = n.name;
    s.op_name = n.target.ToString();
    if (n.target.name == kAllReduce || n.target.name == kWaitTensor)
      return PlanCollective(n, std::move(s));
    if (absl::StartsWith(n.target.name, kFunctionalPrefix))
      return NodeError(n,
                       "this collective is not supported by the interpreter (supported: "
                       "_c10d_functional::all_reduce and wait_tensor)",
                       absl::StatusCode::kUnimplemented);
    auto op = FindOperator(n.target);
    if (!op.ok()) return NodeError(n, op.status().message(), absl::StatusCode::kNotFound);
    s.op = *op;
    const c10::FunctionSchema& schema = op->schema();
    const auto& sargs = schema.arguments();
    if (n.args.size() > sargs.size())
      return NodeError(n, absl::StrCat("takes at most ", sargs.size(),
                                       " positional arguments, got ", n.args.size()));
    std::vector<const Argument*> given(sargs.size(), nullptr);
    for (size_t i = 0; i < n.args.size(); ++i) given[i] = &n.args[i];
    for (const ir::KeywordArgument& kw : n.kwargs) {
      auto idx = schema.argumentIndexWithName(kw.name);
      if (!idx.has_value())
        return NodeError(n, absl::StrCat("has no argument named '", kw.name, "'"));
      if (given[*idx] != nullptr)
        return NodeError(n, absl::StrCat("argument '", kw.name, "' given twice"));
      given[*idx] = &kw.value;
    }
    for (size_t i = 0; i < sargs.size(); ++i) {
      const c10::Argument& sa = sargs[i];
      if (given[i] == nullptr) {
        if (!sa.default_value().has_value())
          return NodeError(n, absl::StrCat("required argument '", sa.name(), "' (",
                                           sa.real_type()->str(), ") is missing"));
        ArgPlan p;
        p.constant = *sa.default_value();
        s.args.push_back(std::move(p));
        continue;
      }
      FXDP_ASSIGN_OR_RETURN(ArgPlan p, PlanArg(n, sa, *given[i]));
      s.args.push_back(std::move(p));
    }
    const auto& rets = schema.returns();
    if (rets.empty()) {
      s.ret = ReturnKind::kNone;
    } else if (rets.size() == 1 && rets[0].type()->kind() == c10::TypeKind::ListType) {
      s.ret = ReturnKind::kList;
    } else if (rets.size() == 1) {
      s.ret = ReturnKind::kSingle;
      if (n.outputs.size() != 1)
        return NodeError(n, absl::StrCat("the op returns one value, the graph declares ",
                                         n.outputs.size()));
    } else {
      s.ret = ReturnKind::kMulti;
      if (n.outputs.size() != rets.size())
        return NodeError(n, absl::StrCat("the op returns ", rets.size(),
                                         " values, the graph declares ", n.outputs.size()));
    }
    s.out_types = n.outputs;
    PlanInplace(n, s);
    return s;
  }

  // Step::inplace_op when the op has a pointwise in-place variant and the
  // graph says self and the result have the same dtype and shape, both dense
  // and contiguous (whether self dies at this node is decided later).
  void PlanInplace(const Node& n, Step& s) {
    if (!HasPointwiseInplaceVariant(n.target.name) || n.outputs.size() != 1 ||
        !n.outputs[0].is_tensor() || n.args.empty() || s.args.empty() ||
        s.args[0].kind != ArgPlan::Kind::kSlot)
      return;
    const ValueRef* self = n.args[0].get_if<ValueRef>();
    if (self == nullptr || !g_.type(*self).is_tensor()) return;
    const ir::TensorType& in = g_.type(*self).tensor;
    const ir::TensorType& out = n.outputs[0].tensor;
    if (in.dtype != out.dtype || in.shape != out.shape || !DenseContiguous(in) ||
        !DenseContiguous(out))
      return;
    auto ip = FindOperator(ir::Target{absl::StrCat(n.target.name, "_"), n.target.overload});
    if (!ip.ok()) return;
    const auto& fa = s.op->schema().arguments();
    const auto& ia = ip->schema().arguments();
    if (fa.size() != ia.size() || ip->schema().returns().size() != 1) return;
    for (size_t i = 0; i < fa.size(); ++i) {
      if (fa[i].name() != ia[i].name() || *fa[i].type() != *ia[i].type()) return;
    }
    s.inplace_op = *ip;
  }

  absl::StatusOr<Step> PlanCollective(const Node& n, Step s) {
    const bool is_reduce = n.target.name == kAllReduce;
    s.kind = is_reduce ? StepKind::kAllReduce : StepKind::kWait;
    if (!n.target.overload.empty())
      return NodeError(n, "unknown overload", absl::StatusCode::kNotFound);
    if (n.args.empty() || !n.args[0].is_ref() || !g_.type(n.args[0].as<ValueRef>()).is_tensor())
      return NodeError(n, absl::StrCat("argument 'input' expects Tensor, got ",
                                       n.args.empty() ? "nothing" : Describe(n.args[0])));
    if (n.outputs.size() != 1 || !n.outputs[0].is_tensor())
      return NodeError(n, "must have one tensor output");
    ArgPlan in;
    in.kind = ArgPlan::Kind::kSlot;
    in.slot = Slot(n.args[0].as<ValueRef>());
    s.args.push_back(std::move(in));
    if (is_reduce) {
      const Argument* op = n.args.size() > 1 ? &n.args[1] : n.kwarg("reduce_op");
      if (op == nullptr || !op->is<std::string>())
        return NodeError(n, absl::StrCat("argument 'reduce_op' expects str, got ",
                                         op == nullptr ? "nothing" : Describe(*op)));
      const std::string& r = op->as<std::string>();
      if (r == "avg") {
        s.avg = true;
      } else if (r != "sum") {
        return NodeError(n, absl::StrCat("reduce_op \"", r, "\" is not supported (sum, avg)"),
                         absl::StatusCode::kUnimplemented);
      }
    }
    s.ret = ReturnKind::kSingle;
    s.out_types = n.outputs;
    return s;
  }

  absl::Status PlanOutput(const Node& n, const Argument& a) {
    ArgPlan p;
    if (const auto* r = a.get_if<ValueRef>()) {
      p.kind = ArgPlan::Kind::kSlot;
      p.slot = Slot(*r);
    } else if (!a.is_none()) {
      return NodeError(n, absl::StrCat("output values must be references or None, got ",
                                       Describe(a)));
    }
    p_.outputs.push_back(std::move(p));
    return absl::OkStatus();
  }

  // Last reads: a slot is released after the step that reads it last; a slot
  // nobody reads right after it is produced (inputs: before the first step).
  void PlanLifetimes() {
    const int32_t nsteps = static_cast<int32_t>(p_.steps.size());
    const int32_t kNever = -2, kBeforeFirst = -1;
    std::vector<int32_t> last(p_.num_slots, kNever);
    std::vector<int32_t> producer(p_.num_slots, kBeforeFirst);
    std::vector<bool> async(p_.num_slots, false);
    for (int32_t i = 0; i < nsteps; ++i) {
      Step& s = p_.steps[i];
      for (int32_t slot : s.out_slots) {
        producer[slot] = i;
        async[slot] = s.kind == StepKind::kAllReduce;
      }
    }
    auto reads = [&](const ArgPlan& a, auto&& f) {
      if (a.kind == ArgPlan::Kind::kSlot) f(a.slot);
      if (a.kind == ArgPlan::Kind::kList)
        for (int32_t e : a.elem_slots)
          if (e >= 0) f(e);
    };
    for (int32_t i = 0; i < nsteps; ++i)
      for (const ArgPlan& a : p_.steps[i].args) reads(a, [&](int32_t slot) { last[slot] = i; });
    for (const ArgPlan& a : p_.outputs) reads(a, [&](int32_t slot) { last[slot] = nsteps; });
    for (int32_t slot = 0; slot < p_.num_slots; ++slot) {
      if (last[slot] == nsteps) continue;  // returned: released after the outputs are taken
      const int32_t when = last[slot] == kNever ? producer[slot] : last[slot];
      if (when == kBeforeFirst) {
        p_.free_at_start.push_back(slot);
      } else {
        p_.steps[when].free_after.push_back(slot);
      }
    }
    for (int32_t i = 0; i < nsteps; ++i) {
      Step& s = p_.steps[i];
      // A slot read once by its last reader is moved onto the stack.
      absl::flat_hash_map<int32_t, int> count;
      for (const ArgPlan& a : s.args) reads(a, [&](int32_t slot) { ++count[slot]; });
      for (ArgPlan& a : s.args) {
        if (a.kind == ArgPlan::Kind::kSlot) {
          a.maybe_pending = async[a.slot];
          a.move = s.kind == StepKind::kOp && last[a.slot] == i && count[a.slot] == 1;
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
  ir::DeviceType trace_device_ = ir::DeviceType::kCpu;
  std::vector<std::vector<int32_t>> slot_of_;
  int32_t next_slot_ = 0;
  ArgPlan pending_list_;
};

}  // namespace

// ---- running -------------------------------------------------------------------------

absl::Status Program::Impl::Resolve(int32_t slot, const Step* reader) {
  std::unique_ptr<Work> w = std::move(works[slot]);
  if (!w) return absl::OkStatus();
  absl::StatusOr<at::Tensor> r = w->Wait(options.collective_timeout);
  if (!r.ok()) {
    const std::string who =
        reader ? absl::StrCat("node '", reader->name, "' (", reader->op_name, ")") : "output";
    // Name the collective as every rank's graph does: the all_reduce node,
    // what it reduces and its number among this step's collectives.
    std::string what = "all_reduce";
    if (const auto& [from, seq] = work_from[slot]; from != nullptr) {
      what = absl::StrCat("all_reduce '", from->name, "' (collective ", seq, " of the step",
                          from->out_types.empty() || !from->out_types[0].is_tensor()
                              ? std::string()
                              : absl::StrCat(", ", TypeForMessage(from->out_types[0].tensor)),
                          ")");
    }
    return absl::Status(r.status().code(), absl::StrCat(who, ": waiting for ", what, ": ",
                                                        r.status().message()));
  }
  slots[slot] = c10::IValue(*std::move(r));
  return absl::OkStatus();
}

absl::Status Program::Impl::Push(const ArgPlan& a, const Step& s) {
  switch (a.kind) {
    case ArgPlan::Kind::kConst:
      stack.push_back(a.constant);
      break;
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

absl::Status Program::Impl::TakeReturns(Step& s) {
  auto error = [&](const std::string& what) {
    return absl::InternalError(absl::StrCat("node '", s.name, "' (", s.op_name, "): ", what));
  };
  switch (s.ret) {
    case ReturnKind::kNone:
      for (int32_t slot : s.out_slots) slots[slot] = c10::IValue();
      break;
    case ReturnKind::kSingle:
      slots[s.out_slots[0]] = std::move(stack[0]);
      break;
    case ReturnKind::kMulti:
      for (size_t k = 0; k < s.out_slots.size(); ++k) slots[s.out_slots[k]] = std::move(stack[k]);
      break;
    case ReturnKind::kList: {
      if (!stack[0].isList()) return error(absl::StrCat("returned ", stack[0].tagKind(),
                                                        ", expected a list"));
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
      if (!v.isTensor() || !Fits(v.toTensor(), want.tensor))
        return error(absl::StrCat("output ", k, " is ", DescribeIValue(v), ", the graph says ",
                                  TypeForMessage(want.tensor)));
    }
  }
  return absl::OkStatus();
}

absl::Status Program::Impl::RunStep(Step& s) {
  stack.clear();
  switch (s.kind) {
    case StepKind::kOp: {
      for (const ArgPlan& a : s.args) FXDP_RETURN_IF_ERROR(Push(a, s));
      if (s.inplace_op.has_value() && Reusable(stack[0], s.out_types[0].tensor)) {
        s.inplace_op->callBoxed(stack);
      } else {
        s.op->callBoxed(stack);
      }
      return TakeReturns(s);
    }
    case StepKind::kAllReduce: {
      const ArgPlan& in = s.args[0];
      if (in.maybe_pending) FXDP_RETURN_IF_ERROR(Resolve(in.slot, &s));
      const c10::IValue& v = slots[in.slot];
      if (!v.isTensor())
        return absl::InternalError(absl::StrCat("node '", s.name, "' (", s.op_name,
                                                "): input is ", v.tagKind(), ", not a tensor"));
      ++collectives_started;
      // The bucket (or loss) is usually a fresh tensor read by this all_reduce
      // only: donate it so the communicator reduces in place.
      const bool last_use = std::find(s.free_after.begin(), s.free_after.end(), in.slot) !=
                            s.free_after.end();
      absl::StatusOr<std::unique_ptr<Work>> w;
      if (last_use && v.toTensor().use_count() == 1 &&
          v.toTensor().storage().use_count() == 1) {
        at::Tensor donated = std::move(slots[in.slot]).toTensor();
        slots[in.slot] = c10::IValue();
        w = comm->AllReduceSumDonated(std::move(donated));
      } else {
        w = comm->AllReduceSum(v.toTensor());
      }
      if (!w.ok())
        return absl::Status(w.status().code(),
                            absl::StrCat("node '", s.name, "' (", s.op_name, ", collective ",
                                         collectives_started, " of the step): ",
                                         w.status().message()));
      work_from[s.out_slots[0]] = {&s, collectives_started};
      std::unique_ptr<Work> work = *std::move(w);
      if (s.avg) work = std::make_unique<AvgWork>(std::move(work), comm->world_size());
      works[s.out_slots[0]] = std::move(work);
      return absl::OkStatus();
    }
    case StepKind::kWait: {
      const int32_t in = s.args[0].slot;
      FXDP_RETURN_IF_ERROR(Resolve(in, &s));
      slots[s.out_slots[0]] = slots[in];
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

Program::Program(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Program::Program(Program&&) noexcept = default;
Program& Program::operator=(Program&&) noexcept = default;
Program::~Program() = default;

absl::StatusOr<Program> Program::Load(const ir::Graph& graph, const ProgramOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  try {
    FXDP_RETURN_IF_ERROR(Loader(graph, *impl).Load());
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
int64_t Program::live_values() const { return impl_->Live(); }
const std::vector<std::pair<std::string, int64_t>>& Program::live_trace() const {
  return impl_->live_trace;
}
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
    if (!v.isTensor() || !Fits(v.toTensor(), in.type.tensor))
      return absl::InvalidArgumentError(absl::StrCat(
          "placeholder '", in.node, "' (", ir::PlaceholderRoleName(in.role), " '", in.state_name,
          "'): expected ", TypeForMessage(in.type.tensor), ", got ", DescribeIValue(v)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<c10::IValue>> Program::Run(std::vector<c10::IValue> inputs) {
  Impl& p = *impl_;
  FXDP_RETURN_IF_ERROR(CheckInputs(inputs));
  std::optional<c10::InferenceMode> inference;
  if (p.options.inference_mode) inference.emplace();
  if (p.options.record_live) p.live_trace.clear();
  absl::Status status;
  std::vector<c10::IValue> results;
  try {
    c10::DeviceGuard guard(p.options.device);
    for (size_t i = 0; i < inputs.size(); ++i) {
      c10::IValue v = std::move(inputs[i]);
      if (v.isTensor() && v.toTensor().device() != p.options.device)
        v = v.toTensor().to(p.options.device);
      p.slots[p.input_slots[i]] = std::move(v);
    }
    inputs.clear();
    for (int32_t slot : p.free_at_start) p.slots[slot] = c10::IValue();
    if (p.options.profile) {
      p.step_ms.resize(p.steps.size());
      ++p.profiled_runs;
    }
    for (Step& s : p.steps) {
      const auto t0 = p.options.profile ? std::chrono::steady_clock::now()
                                        : std::chrono::steady_clock::time_point();
      try {
        status = p.RunStep(s);
      } catch (const c10::OutOfMemoryError& e) {
        status = absl::ResourceExhaustedError(absl::StrCat(
            "node '", s.name, "' (", s.op_name, "): out of memory: ",
            ExceptionMessage(e)));
      } catch (const c10::Error& e) {
        status = absl::InvalidArgumentError(absl::StrCat("node '", s.name, "' (", s.op_name,
                                                         "): kernel failed: ",
                                                         ExceptionMessage(e)));
      } catch (const std::exception& e) {
        status = absl::InternalError(absl::StrCat("node '", s.name, "' (", s.op_name,
                                                  "): ", ExceptionMessage(e)));
      }
      if (!status.ok()) break;
      for (int32_t slot : s.free_after) {
        p.slots[slot] = c10::IValue();
        p.works[slot].reset();
      }
      if (p.options.profile) {
        p.step_ms[&s - p.steps.data()] += std::chrono::duration<double, std::milli>(
                                              std::chrono::steady_clock::now() - t0)
                                              .count();
      }
      if (p.options.record_live) p.live_trace.emplace_back(s.name, p.Live());
    }
    if (status.ok()) {
      results.reserve(p.outputs.size());
      for (const ArgPlan& a : p.outputs) {
        if (a.kind != ArgPlan::Kind::kSlot) {
          results.emplace_back();
          continue;
        }
        if (a.maybe_pending) {
          status = p.Resolve(a.slot, nullptr);
          if (!status.ok()) break;
        }
        results.push_back(p.slots[a.slot]);
      }
    }
  } catch (const std::exception& e) {
    status = absl::InternalError(absl::StrCat("running the graph: ", ExceptionMessage(e)));
  }
  p.Clear();
  if (!status.ok()) return status;
  return results;
}

// ---- StepRunner ----------------------------------------------------------------------

absl::StatusOr<StepRunner> StepRunner::Create(Program program, TensorMap state) {
  std::vector<std::string> missing;
  const auto& inputs = program.inputs();
  for (const ProgramInput& in : inputs) {
    if (in.role == ir::PlaceholderRole::kInput) continue;
    auto it = state.find(in.state_name);
    if (it == state.end()) {
      missing.push_back(absl::StrCat("'", in.state_name, "'"));
      continue;
    }
    if (in.type.is_tensor() && !Fits(it->second, in.type.tensor))
      return absl::InvalidArgumentError(absl::StrCat(
          "state '", in.state_name, "' is ", DescribeTorchTensor(it->second), ", placeholder '",
          in.node, "' expects ", TypeForMessage(in.type.tensor)));
  }
  if (!missing.empty())
    return absl::NotFoundError(
        absl::StrCat("the state lacks ", absl::StrJoin(missing, ", "), " (read by the graph)"));
  try {
    for (const ProgramInput& in : inputs) {
      if (in.role == ir::PlaceholderRole::kInput) continue;
      at::Tensor& t = state[in.state_name];
      if (t.device() != program.device()) t = t.to(program.device());
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("moving the state to ", program.device().str(), ": ",
                                            ExceptionMessage(e)));
  }
  StepRunner r(std::move(program), std::move(state));
  for (const ProgramInput& in : r.program_.inputs()) {
    bool updated = false;
    if (in.role != ir::PlaceholderRole::kInput) {
      for (const ir::OutputSpec& o : r.program_.output_specs())
        updated |= ir::UpdatedRole(o.role).has_value() && o.state_name == in.state_name;
    }
    r.moves_.push_back(updated);
  }
  return r;
}

absl::Status StepRunner::SetHyperparameters(
    const std::vector<std::pair<std::string, double>>& values) {
  if (values.empty()) return absl::OkStatus();
  const auto& inputs = program_.inputs();
  std::vector<const ProgramInput*> targets;
  for (const auto& [name, value] : values) {
    const ProgramInput* found = nullptr;
    for (const ProgramInput& in : inputs) {
      if (in.state_name == name && in.role == ir::PlaceholderRole::kHyperparameter) found = &in;
    }
    if (found == nullptr) {
      ir::PlaceholderNames names;
      for (const ProgramInput& in : inputs)
        names.entries.push_back(
            {in.state_name, in.role == ir::PlaceholderRole::kHyperparameter, in.node});
      return names.Check({name}, "hyper-parameter values");
    }
    targets.push_back(found);
  }
  try {
    for (size_t i = 0; i < values.size(); ++i) {
      const ProgramInput& in = *targets[i];
      state_[in.state_name] = at::scalar_tensor(
          values[i].second,
          at::TensorOptions().dtype(ToTorch(in.type.tensor.dtype)).device(program_.device()));
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("setting the hyper-parameters: ", ExceptionMessage(e)));
  }
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> StepRunner::Step(const TensorMap& batch) {
  if (broken_)
    return absl::FailedPreconditionError(
        "an earlier step failed after the state was handed to the graph; the state is lost");
  const auto& inputs = program_.inputs();
  std::vector<c10::IValue> values;
  values.reserve(inputs.size());
  for (const ProgramInput& in : inputs) {
    if (in.role == ir::PlaceholderRole::kInput) {
      auto it = batch.find(in.state_name);
      if (it == batch.end()) {
        std::vector<std::string> have;
        for (const auto& [k, v] : batch) have.push_back(k);
        return absl::NotFoundError(absl::StrCat("the batch has no tensor '", in.state_name,
                                                "' (INPUT placeholder '", in.node,
                                                "'); it has: ", absl::StrJoin(have, ", ")));
      }
      values.emplace_back(it->second);
    } else {
      values.emplace_back(state_.at(in.state_name));
    }
  }
  FXDP_RETURN_IF_ERROR(program_.CheckInputs(values));
  bool handed = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!moves_[i]) continue;
    state_[inputs[i].state_name] = at::Tensor();  // the graph holds the only reference
    handed = true;
  }
  absl::StatusOr<std::vector<c10::IValue>> out = program_.Run(std::move(values));
  if (!out.ok()) {
    broken_ = handed;
    return out.status();
  }
  at::Tensor loss;
  other_.clear();
  const auto& specs = program_.output_specs();
  for (size_t i = 0; i < specs.size() && i < out->size(); ++i) {
    c10::IValue& v = (*out)[i];
    if (ir::UpdatedRole(specs[i].role).has_value()) {
      if (!v.isTensor()) {
        broken_ = true;
        return absl::InternalError(absl::StrCat("output ", i, " updates state '",
                                                specs[i].state_name, "' but is ", v.tagKind()));
      }
      state_[specs[i].state_name] = std::move(v).toTensor();
    } else if (specs[i].role == ir::OutputRole::kLoss) {
      if (v.isTensor()) loss = std::move(v).toTensor();
    } else {
      other_.push_back(std::move(v));
    }
  }
  return loss;
}

}  // namespace fxdp::executor
