#include "executor/torch_types.h"

#include <array>

#include <c10/util/Exception.h>

#include <torch/headeronly/version.h>

#include "absl/strings/str_cat.h"
#include "analysis/ir/type_text.h"

namespace fxdp::executor {
namespace {

// Indexed by ir::DType; the one table for dtype mapping.
constexpr std::array<c10::ScalarType, 18> kScalarTypes = {
    c10::ScalarType::Float,       c10::ScalarType::Double,        c10::ScalarType::Half,
    c10::ScalarType::BFloat16,    c10::ScalarType::Long,          c10::ScalarType::Int,
    c10::ScalarType::Short,       c10::ScalarType::Char,          c10::ScalarType::Byte,
    c10::ScalarType::Bool,        c10::ScalarType::ComplexFloat,  c10::ScalarType::ComplexDouble,
    c10::ScalarType::ComplexHalf, c10::ScalarType::Float8_e4m3fn, c10::ScalarType::Float8_e5m2,
    c10::ScalarType::UInt16,      c10::ScalarType::UInt32,        c10::ScalarType::UInt64,
};

}  // namespace

c10::ScalarType ToTorch(ir::DType d) { return kScalarTypes[static_cast<int>(d)]; }

absl::StatusOr<ir::DType> FromTorch(c10::ScalarType t) {
  for (size_t i = 0; i < kScalarTypes.size(); ++i)
    if (kScalarTypes[i] == t) return static_cast<ir::DType>(i);
  return absl::InvalidArgumentError(
      absl::StrCat("torch dtype ", c10::toString(t), " has no fxdp wire dtype"));
}

c10::Device ToTorch(const ir::Device& d) {
  const c10::DeviceType type = d.type == ir::DeviceType::kCuda   ? c10::DeviceType::CUDA
                               : d.type == ir::DeviceType::kMeta ? c10::DeviceType::Meta
                                                                 : c10::DeviceType::CPU;
  return c10::Device(type, static_cast<c10::DeviceIndex>(d.index));
}

c10::Layout ToTorch(ir::Layout l) {
  switch (l) {
    case ir::Layout::kStrided: return c10::kStrided;
    case ir::Layout::kSparseCoo: return c10::kSparse;
    case ir::Layout::kSparseCsr: return c10::kSparseCsr;
  }
  return c10::kStrided;
}

c10::MemoryFormat ToTorch(ir::MemoryFormat m) {
  switch (m) {
    case ir::MemoryFormat::kContiguous: return c10::MemoryFormat::Contiguous;
    case ir::MemoryFormat::kChannelsLast: return c10::MemoryFormat::ChannelsLast;
    case ir::MemoryFormat::kChannelsLast3d: return c10::MemoryFormat::ChannelsLast3d;
    case ir::MemoryFormat::kPreserve: return c10::MemoryFormat::Preserve;
  }
  return c10::MemoryFormat::Contiguous;
}

absl::StatusOr<c10::OperatorHandle> FindOperator(const ir::Target& target) {
  auto op = c10::Dispatcher::singleton().findSchema({target.name, target.overload});
  if (!op.has_value())
    return absl::NotFoundError(absl::StrCat(
        "operator ", target.ToString(), " is not known to this LibTorch (", TORCH_VERSION, ")"));
  return *op;
}

std::string DescribeTorchTensor(const at::Tensor& t) {
  if (!t.defined()) return "an undefined tensor";
  auto d = FromTorch(t.scalar_type());
  std::string s = d.ok() ? ir::TypeText(*d, t.sizes())
                         : ir::TypeText(c10::toString(t.scalar_type()), t.sizes());
  if (!t.device().is_cpu()) absl::StrAppend(&s, "@", t.device().str());
  return s;
}

std::string DescribeIValue(const c10::IValue& v) {
  if (v.isTensor()) return DescribeTorchTensor(v.toTensor());
  return v.tagKind();
}

std::string TypeForMessage(const ir::TensorType& t) { return ir::TypeText(t); }

bool Fits(const at::Tensor& t, const ir::TensorType& want) {
  return t.defined() && t.scalar_type() == ToTorch(want.dtype) &&
         t.sizes() == c10::IntArrayRef(want.shape);
}

std::string ExceptionMessage(const std::exception& e) {
  const auto* c10e = dynamic_cast<const c10::Error*>(&e);
  std::string s = c10e != nullptr ? c10e->what_without_backtrace() : e.what();
  if (size_t at = s.find("\nException raised from "); at != std::string::npos) s.resize(at);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace fxdp::executor
