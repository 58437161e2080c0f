#include "executor/arg_binding.h"

#include <ATen/ScalarOps.h>

#include <complex>
#include <type_traits>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "analysis/ir/text.h"
#include "executor/torch_types.h"
#include "util/status_macros.h"

namespace fxdp::executor {
namespace {

using ir::Argument;
using ir::Node;
using ir::ValueKind;
using ir::ValueRef;

c10::IValue ScalarIValue(const ir::Scalar& s) {
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
std::optional<at::Scalar> AsNumber(const Argument& a) {
  if (const auto* i = a.get_if<int64_t>()) return at::Scalar(*i);
  if (const auto* d = a.get_if<double>()) return at::Scalar(*d);
  if (const auto* b = a.get_if<bool>()) return at::Scalar(*b);
  if (const auto* s = a.get_if<ir::Scalar>()) return ScalarIValue(*s).toScalar();
  return std::nullopt;
}

// Whether a graph value of type `t` fits a schema argument of `kind` (a tensor, or a number of
// the kind's own type; a Number takes any).
bool ValueFits(c10::TypeKind kind, const ir::ValueType& t) {
  using K = c10::TypeKind;
  switch (kind) {
    case K::TensorType: return t.is_tensor();
    case K::IntType:
    case K::SymIntType: return t.kind == ValueKind::kInt;
    case K::FloatType:
    case K::SymFloatType: return t.kind == ValueKind::kFloat;
    case K::BoolType:
    case K::SymBoolType: return t.kind == ValueKind::kBool;
    case K::NumberType:
      return t.kind == ValueKind::kInt || t.kind == ValueKind::kFloat || t.kind == ValueKind::kBool;
    default: return false;
  }
}

// The constant a schema argument of a scalar `kind` (a number, string, dtype, layout, memory
// format) takes from `a` (an int for a float), or nullopt when `a` does not fit.
std::optional<c10::IValue> ScalarConstant(c10::TypeKind kind, const Argument& a) {
  using K = c10::TypeKind;
  switch (kind) {
    case K::IntType:
    case K::SymIntType:
      if (const auto* i = a.get_if<int64_t>()) return c10::IValue(*i);
      break;
    case K::FloatType:
    case K::SymFloatType:
      if (const auto* d = a.get_if<double>()) return c10::IValue(*d);
      if (const auto* i = a.get_if<int64_t>()) return c10::IValue(static_cast<double>(*i));
      break;
    case K::BoolType:
    case K::SymBoolType:
      if (const auto* b = a.get_if<bool>()) return c10::IValue(*b);
      break;
    case K::NumberType: {
      if (const auto* s = a.get_if<ir::Scalar>()) return ScalarIValue(*s);
      if (auto num = AsNumber(a)) return c10::IValue(*num);
      break;
    }
    case K::ComplexType:
      if (const auto* s = a.get_if<ir::Scalar>()) return ScalarIValue(*s);
      break;
    case K::StringType:
      if (const auto* s = a.get_if<std::string>()) return c10::IValue(*s);
      break;
    case K::ScalarTypeType:
      if (const auto* d = a.get_if<ir::DType>())
        return c10::IValue(static_cast<int64_t>(ToTorch(*d)));
      break;
    case K::LayoutType:
      if (const auto* l = a.get_if<ir::Layout>())
        return c10::IValue(static_cast<int64_t>(ToTorch(*l)));
      break;
    case K::MemoryFormatType:
      if (const auto* m = a.get_if<ir::MemoryFormat>()) {
        return c10::IValue(static_cast<int64_t>(ToTorch(*m)));
      }
      break;
    default: break;
  }
  return std::nullopt;
}

}  // namespace

std::string DescribeArgument(const ir::Graph& g, const Argument& a) {
  if (const auto* r = a.get_if<ValueRef>()) {
    const Node& src = g.node(r->node);
    std::string s = absl::StrCat("a reference to %", src.name);
    if (src.outputs.size() > 1) absl::StrAppend(&s, "#", r->output);
    return absl::StrCat(s, " (", g.type(*r).ToString(), ")");
  }
  if (a.is<int64_t>()) return absl::StrCat("int ", ir::PrintArgument(g, a));
  if (a.is<double>()) return absl::StrCat("float ", ir::PrintArgument(g, a));
  if (a.is<bool>()) return absl::StrCat("bool ", ir::PrintArgument(g, a));
  if (a.is<std::string>()) return absl::StrCat("string ", ir::PrintArgument(g, a));
  if (a.is_none()) return "None";
  if (a.is<ir::DType>()) return absl::StrCat("dtype ", ir::PrintArgument(g, a));
  if (a.is<ir::Device>()) return absl::StrCat("device ", a.as<ir::Device>().ToString());
  if (a.is<ir::Layout>()) return absl::StrCat("layout ", ir::PrintArgument(g, a));
  if (a.is<ir::MemoryFormat>()) return absl::StrCat("memory format ", ir::PrintArgument(g, a));
  if (a.is<ir::Scalar>()) return absl::StrCat("scalar ", ir::PrintArgument(g, a));
  return absl::StrCat("list ", ir::PrintArgument(g, a));
}

// A graph runs on the worker's device whatever device it was traced on:
// factory ops recorded with device=meta (a model built on `meta`), cpu (a
// CPU trace run by a CUDA worker, or a cpu tensor made inside a CUDA trace)
// or cuda:1 (the user's GPU) all make their tensors on the program's device.
// A step's tensors all live on one device (the tracer checks its inputs), so
// no device argument of a traced step means a transfer elsewhere.
c10::Device ArgBinder::MapDevice(const ir::Device&) const { return device_; }

absl::Status ArgBinder::Mismatch(const Node& n, const std::string& where, const c10::TypePtr& type,
                                 const Argument& a) const {
  return NodeError(
      n, absl::StrCat(where, " expects ", type->str(), ", got ", DescribeArgument(g_, a)));
}

absl::StatusOr<std::vector<ArgPlan>> ArgBinder::BindCall(const Node& n,
                                                         const c10::FunctionSchema& schema) {
  const auto& sargs = schema.arguments();
  if (n.args.size() > sargs.size())
    return NodeError(n, absl::StrCat("takes at most ", sargs.size(), " positional arguments, got ",
                                     n.args.size()));
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
  std::vector<ArgPlan> plans;
  plans.reserve(sargs.size());
  for (size_t i = 0; i < sargs.size(); ++i) {
    const c10::Argument& sa = sargs[i];
    if (given[i] == nullptr) {
      if (!sa.default_value().has_value())
        return NodeError(n, absl::StrCat("required argument '", sa.name(), "' (",
                                         sa.real_type()->str(), ") is missing"));
      ArgPlan p;
      p.constant = *sa.default_value();
      plans.push_back(std::move(p));
      continue;
    }
    FXDP_ASSIGN_OR_RETURN(ArgPlan p, PlanArg(n, sa, *given[i]));
    plans.push_back(std::move(p));
  }
  return plans;
}

absl::StatusOr<ArgPlan> ArgBinder::PlanArg(const Node& n, const c10::Argument& sa,
                                           const Argument& a) {
  FXDP_ASSIGN_OR_RETURN(Bound b, Bind(n, absl::StrCat("argument '", sa.name(), "'"), a, sa.type(),
                                      sa.real_type(), sa.N()));
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

absl::StatusOr<ArgBinder::Bound> ArgBinder::Bind(const Node& n, const std::string& where,
                                                 const Argument& a, const c10::TypePtr& fake,
                                                 const c10::TypePtr& real,
                                                 std::optional<int32_t> list_n) {
  using K = c10::TypeKind;
  const K kind = real->kind();
  if (kind == K::OptionalType) {
    if (a.is_none()) return Bound{};
    return Bind(n, where, a, fake->expectRef<c10::OptionalType>().getElementType(),
                real->expectRef<c10::OptionalType>().getElementType(), list_n);
  }
  if (const auto* r = a.get_if<ValueRef>()) {
    if (!ValueFits(kind, g_.type(*r))) return Mismatch(n, where, real, a);
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
    case K::FloatType:
    case K::SymFloatType:
    case K::BoolType:
    case K::SymBoolType:
    case K::NumberType:
    case K::ComplexType:
    case K::StringType:
    case K::ScalarTypeType:
    case K::LayoutType:
    case K::MemoryFormatType:
      if (auto v = ScalarConstant(kind, a)) return Bound{-1, *std::move(v)};
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
          FXDP_ASSIGN_OR_RETURN(
              Bound b, Bind(n, absl::StrCat(where, " element ", k), (*l)[k], fe, re, std::nullopt));
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
      return NodeError(n,
                       absl::StrCat(where, " has type ", real->str(),
                                    ", which the interpreter does not support"),
                       absl::StatusCode::kUnimplemented);
  }
  return Mismatch(n, where, real, a);
}

// Lists: a constant list when no element is a slot, else a marker the
// caller turns into a kList plan (Bound.slot == -2, elements in pending_list_).
absl::StatusOr<ArgBinder::Bound> ArgBinder::BoundList(const c10::TypePtr& elem_type,
                                                      std::vector<Bound> elems) {
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

}  // namespace fxdp::executor
