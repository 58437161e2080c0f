#include "analysis/ir/types.h"

#include "analysis/ir/type_text.h"

#include <algorithm>
#include <array>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proto/fxdp/v1/graph.pb.h"

namespace fxdp::ir {
namespace {

struct DTypeInfo {
  DType dtype;
  v1::DType wire;
  absl::string_view short_name;
  absl::string_view torch_name;
  int item_size;
  bool floating;
};

// One row per dtype; the only place dtype facts live.
constexpr std::array<DTypeInfo, 18> kDTypes = {{
    {DType::kFloat32, v1::FLOAT32, "f32", "torch.float32", 4, true},
    {DType::kFloat64, v1::FLOAT64, "f64", "torch.float64", 8, true},
    {DType::kFloat16, v1::FLOAT16, "f16", "torch.float16", 2, true},
    {DType::kBFloat16, v1::BFLOAT16, "bf16", "torch.bfloat16", 2, true},
    {DType::kInt64, v1::INT64, "i64", "torch.int64", 8, false},
    {DType::kInt32, v1::INT32, "i32", "torch.int32", 4, false},
    {DType::kInt16, v1::INT16, "i16", "torch.int16", 2, false},
    {DType::kInt8, v1::INT8, "i8", "torch.int8", 1, false},
    {DType::kUInt8, v1::UINT8, "u8", "torch.uint8", 1, false},
    {DType::kBool, v1::BOOL, "b8", "torch.bool", 1, false},
    {DType::kComplex64, v1::COMPLEX64, "c64", "torch.complex64", 8, false},
    {DType::kComplex128, v1::COMPLEX128, "c128", "torch.complex128", 16, false},
    {DType::kComplex32, v1::COMPLEX32, "c32", "torch.complex32", 4, false},
    {DType::kFloat8E4M3FN, v1::FLOAT8_E4M3FN, "f8e4m3fn", "torch.float8_e4m3fn", 1, true},
    {DType::kFloat8E5M2, v1::FLOAT8_E5M2, "f8e5m2", "torch.float8_e5m2", 1, true},
    {DType::kUInt16, v1::UINT16, "u16", "torch.uint16", 2, false},
    {DType::kUInt32, v1::UINT32, "u32", "torch.uint32", 4, false},
    {DType::kUInt64, v1::UINT64, "u64", "torch.uint64", 8, false},
}};

const DTypeInfo& Info(DType d) { return kDTypes[static_cast<int>(d)]; }

template <typename E>
struct EnumRow {
  E value;
  int wire;
  absl::string_view name;
};

constexpr std::array<EnumRow<DeviceType>, 3> kDeviceTypes = {{
    {DeviceType::kCpu, v1::CPU, "cpu"},
    {DeviceType::kCuda, v1::CUDA, "cuda"},
    {DeviceType::kMeta, v1::META, "meta"},
}};
constexpr std::array<EnumRow<Layout>, 3> kLayouts = {{
    {Layout::kStrided, v1::STRIDED, "torch.strided"},
    {Layout::kSparseCoo, v1::SPARSE_COO, "torch.sparse_coo"},
    {Layout::kSparseCsr, v1::SPARSE_CSR, "torch.sparse_csr"},
}};
constexpr std::array<EnumRow<MemoryFormat>, 4> kMemoryFormats = {{
    {MemoryFormat::kContiguous, v1::CONTIGUOUS_FORMAT, "torch.contiguous_format"},
    {MemoryFormat::kChannelsLast, v1::CHANNELS_LAST, "torch.channels_last"},
    {MemoryFormat::kChannelsLast3d, v1::CHANNELS_LAST_3D, "torch.channels_last_3d"},
    {MemoryFormat::kPreserve, v1::PRESERVE_FORMAT, "torch.preserve_format"},
}};
constexpr std::array<EnumRow<ValueKind>, 5> kValueKinds = {{
    {ValueKind::kTensor, v1::TENSOR, "tensor"},
    {ValueKind::kNone, v1::NONE_VALUE, "none"},
    {ValueKind::kInt, v1::INT_VALUE, "int"},
    {ValueKind::kFloat, v1::FLOAT_VALUE, "float"},
    {ValueKind::kBool, v1::BOOL_VALUE, "bool"},
}};

template <typename E, size_t N>
absl::StatusOr<E> FromWire(const std::array<EnumRow<E>, N>& rows, int v, absl::string_view what) {
  for (const auto& r : rows)
    if (r.wire == v) return r.value;
  return absl::InvalidArgumentError(absl::StrCat("unknown ", what, " enum value ", v));
}
template <typename E, size_t N>
absl::StatusOr<E> FromName(const std::array<EnumRow<E>, N>& rows, absl::string_view s,
                           absl::string_view what) {
  for (const auto& r : rows)
    if (r.name == s) return r.value;
  return absl::InvalidArgumentError(absl::StrCat("unknown ", what, " '", s, "'"));
}
template <typename E, size_t N>
const EnumRow<E>& Row(const std::array<EnumRow<E>, N>& rows, E v) {
  return rows[static_cast<int>(v)];
}

}  // namespace

absl::string_view DTypeShortName(DType d) { return Info(d).short_name; }
absl::string_view DTypeTorchName(DType d) { return Info(d).torch_name; }
int DTypeItemSize(DType d) { return Info(d).item_size; }
bool DTypeIsFloatingPoint(DType d) { return Info(d).floating; }
absl::StatusOr<DType> DTypeFromShortName(absl::string_view s) {
  for (const auto& i : kDTypes)
    if (i.short_name == s) return i.dtype;
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", s, "'"));
}
absl::StatusOr<DType> DTypeFromTorchName(absl::string_view s) {
  for (const auto& i : kDTypes)
    if (i.torch_name == s) return i.dtype;
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", s, "'"));
}
absl::StatusOr<DType> DTypeFromWire(int v) {
  for (const auto& i : kDTypes)
    if (i.wire == v) return i.dtype;
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype enum value ", v));
}
int DTypeToWire(DType d) { return Info(d).wire; }

std::string Device::ToString() const {
  std::string s(Row(kDeviceTypes, type).name);
  if (index >= 0) absl::StrAppend(&s, ":", index);
  return s;
}
absl::StatusOr<Device> Device::Parse(absl::string_view s) {
  Device d;
  size_t colon = s.find(':');
  auto type = FromName(kDeviceTypes, s.substr(0, colon), "device type");
  if (!type.ok()) return type.status();
  d.type = *type;
  if (colon != absl::string_view::npos) {
    if (!absl::SimpleAtoi(s.substr(colon + 1), &d.index) || d.index < 0)
      return absl::InvalidArgumentError(absl::StrCat("bad device index in '", s, "'"));
  }
  return d;
}
absl::StatusOr<DeviceType> DeviceTypeFromWire(int v) {
  return FromWire(kDeviceTypes, v, "device type");
}
int DeviceTypeToWire(DeviceType t) { return Row(kDeviceTypes, t).wire; }

absl::string_view LayoutTorchName(Layout l) { return Row(kLayouts, l).name; }
absl::StatusOr<Layout> LayoutFromTorchName(absl::string_view s) {
  return FromName(kLayouts, s, "layout");
}
absl::StatusOr<Layout> LayoutFromWire(int v) { return FromWire(kLayouts, v, "layout"); }
int LayoutToWire(Layout l) { return Row(kLayouts, l).wire; }

absl::string_view MemoryFormatTorchName(MemoryFormat m) { return Row(kMemoryFormats, m).name; }
absl::StatusOr<MemoryFormat> MemoryFormatFromTorchName(absl::string_view s) {
  return FromName(kMemoryFormats, s, "memory format");
}
absl::StatusOr<MemoryFormat> MemoryFormatFromWire(int v) {
  return FromWire(kMemoryFormats, v, "memory format");
}
int MemoryFormatToWire(MemoryFormat m) { return Row(kMemoryFormats, m).wire; }

absl::StatusOr<ValueKind> ValueKindFromWire(int v) {
  return FromWire(kValueKinds, v, "value kind");
}
int ValueKindToWire(ValueKind k) { return Row(kValueKinds, k).wire; }

std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> stride(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    stride[i] = s;
    if (__builtin_mul_overflow(s, std::max<int64_t>(shape[i], 1), &s))
      s = std::numeric_limits<int64_t>::max();
  }
  return stride;
}

absl::StatusOr<std::vector<int64_t>> CheckedContiguousStrides(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0)
      return absl::InvalidArgumentError(
          absl::StrCat("size of dim ", i, " is negative (", shape[i], ")"));
    const int64_t d = std::max<int64_t>(shape[i], 1);
    if (__builtin_mul_overflow(n, d, &n) || n > kMaxTensorElements)
      return absl::InvalidArgumentError(absl::StrCat("shape ", ShapeText(shape),
                                                     " spans more than ", kMaxTensorElements,
                                                     " elements (the limit); refusing it"));
  }
  return ContiguousStrides(shape);
}

int64_t TensorType::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

bool TensorType::IsContiguous() const { return stride == ContiguousStrides(shape); }

bool TensorType::operator==(const TensorType& o) const {
  return shape == o.shape && stride == o.stride && storage_offset == o.storage_offset &&
         dtype == o.dtype && device == o.device && requires_grad == o.requires_grad;
}

std::string ShapeText(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string TypeText(absl::string_view dtype, absl::Span<const int64_t> shape) {
  return absl::StrCat(dtype, ShapeText(shape));
}

std::string TypeText(DType dtype, absl::Span<const int64_t> shape) {
  return TypeText(DTypeShortName(dtype), shape);
}

std::string TensorType::ToString() const {
  std::string s = TypeText(dtype, shape);
  if (!IsContiguous()) absl::StrAppend(&s, "{", absl::StrJoin(stride, ", "), "}");
  if (storage_offset != 0) absl::StrAppend(&s, "+", storage_offset);
  if (device != Device{}) absl::StrAppend(&s, "@", device.ToString());
  if (requires_grad) absl::StrAppend(&s, " rg");
  return s;
}

absl::Status ValidateTensorType(const TensorType& t) {
  if (t.shape.size() > static_cast<size_t>(kMaxRank))
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", t.shape.size(), " exceeds the limit of ", kMaxRank));
  if (t.stride.size() != t.shape.size())
    return absl::InvalidArgumentError(absl::StrCat(
        "stride has ", t.stride.size(), " entries, expected one per dim (", t.shape.size(), ")"));
  int64_t numel = 1;
  for (size_t i = 0; i < t.shape.size(); ++i) {
    int64_t s = t.shape[i];
    if (s < 0)
      return absl::InvalidArgumentError(absl::StrCat("size of dim ", i, " is negative (", s, ")"));
    if (t.stride[i] < 0)
      return absl::InvalidArgumentError(
          absl::StrCat("stride of dim ", i, " is negative (", t.stride[i], ")"));
    if (s != 0 && numel > kMaxTensorElements / s)
      return absl::InvalidArgumentError(absl::StrCat("shape ", ShapeText(t.shape),
                                                     " has more than ", kMaxTensorElements,
                                                     " elements (the limit); refusing it"));
    numel *= s;
  }
  if (t.storage_offset < 0 || t.storage_offset > kMaxTensorElements)
    return absl::InvalidArgumentError(absl::StrCat(
        "storage_offset ", t.storage_offset, " is out of range [0, ", kMaxTensorElements, "]"));
  // The furthest element must be addressable: offset + sum((size-1)*stride).
  if (numel > 0) {
    int64_t extent = t.storage_offset;
    for (size_t i = 0; i < t.shape.size(); ++i) {
      if (t.stride[i] > kMaxTensorElements ||
          t.shape[i] - 1 > kMaxTensorElements / std::max<int64_t>(t.stride[i], 1))
        return absl::InvalidArgumentError(absl::StrCat("stride ", t.stride[i], " of dim ", i,
                                                       " addresses beyond ", kMaxTensorElements,
                                                       " elements"));
      extent += (t.shape[i] - 1) * t.stride[i];
      if (extent > kMaxTensorElements)
        return absl::InvalidArgumentError(absl::StrCat(
            "strides ", ShapeText(t.stride), " address beyond ", kMaxTensorElements, " elements"));
    }
  }
  return absl::OkStatus();
}

bool ValueType::operator==(const ValueType& o) const {
  return kind == o.kind && (kind != ValueKind::kTensor || tensor == o.tensor);
}

std::string ValueType::ToString() const {
  if (kind == ValueKind::kTensor) return tensor.ToString();
  return std::string(Row(kValueKinds, kind).name);
}

}  // namespace fxdp::ir
