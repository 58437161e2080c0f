// Value types of the fxdp graph IR: dtypes, devices, tensor metadata.
//
// Every enum here has one table (types.cc) that maps it to its wire value and
// its text spelling; nothing else switches over these enums.
#ifndef FXDP_ANALYSIS_IR_TYPES_H_
#define FXDP_ANALYSIS_IR_TYPES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace fxdp::ir {

// Element types, named after torch dtypes.
enum class DType : int8_t {
  kFloat32,
  kFloat64,
  kFloat16,
  kBFloat16,
  kInt64,
  kInt32,
  kInt16,
  kInt8,
  kUInt8,
  kBool,
  kComplex64,
  kComplex128,
  kComplex32,
  kFloat8E4M3FN,
  kFloat8E5M2,
  kUInt16,
  kUInt32,
  kUInt64,
};
// Short text name ("f32"), used in type annotations.
absl::string_view DTypeShortName(DType d);
// torch name ("torch.float32"), used for dtype arguments.
absl::string_view DTypeTorchName(DType d);
int DTypeItemSize(DType d);
bool DTypeIsFloatingPoint(DType d);
absl::StatusOr<DType> DTypeFromShortName(absl::string_view s);
absl::StatusOr<DType> DTypeFromTorchName(absl::string_view s);
// Wire enum value (fxdp.v1.DType) <-> DType.
absl::StatusOr<DType> DTypeFromWire(int v);
int DTypeToWire(DType d);

enum class DeviceType : int8_t { kCpu, kCuda, kMeta };
struct Device {
  DeviceType type = DeviceType::kCpu;
  int32_t index = -1;  // -1: no index ("cpu", "cuda").
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string ToString() const;  // "cpu", "cuda:1"
  static absl::StatusOr<Device> Parse(absl::string_view s);
};
absl::StatusOr<DeviceType> DeviceTypeFromWire(int v);
int DeviceTypeToWire(DeviceType t);

enum class Layout : int8_t { kStrided, kSparseCoo, kSparseCsr };
absl::string_view LayoutTorchName(Layout l);
absl::StatusOr<Layout> LayoutFromTorchName(absl::string_view s);
absl::StatusOr<Layout> LayoutFromWire(int v);
int LayoutToWire(Layout l);

enum class MemoryFormat : int8_t { kContiguous, kChannelsLast, kChannelsLast3d, kPreserve };
absl::string_view MemoryFormatTorchName(MemoryFormat m);
absl::StatusOr<MemoryFormat> MemoryFormatFromTorchName(absl::string_view s);
absl::StatusOr<MemoryFormat> MemoryFormatFromWire(int v);
int MemoryFormatToWire(MemoryFormat m);

// Limits that keep hostile input from allocating without bound. A tensor
// description is metadata only, but everything downstream (executor, memory
// planning) multiplies these numbers.
inline constexpr int kMaxRank = 64;
inline constexpr int64_t kMaxTensorElements = int64_t{1} << 48;

struct TensorType {
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
  int64_t storage_offset = 0;
  DType dtype = DType::kFloat32;
  Device device;
  bool requires_grad = false;

  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  // Product of the sizes; only meaningful after Validate() succeeded.
  int64_t numel() const;
  bool IsContiguous() const;  // stride == ContiguousStrides(shape)
  bool operator==(const TensorType& o) const;
  bool operator!=(const TensorType& o) const { return !(*this == o); }
  // "f32[12, 8]", with "{stride}" when not contiguous, "+offset", "@device"
  // when not plain cpu, and " rg" when requires_grad.
  std::string ToString() const;
};
// Row-major strides (empty dims count as 1). Saturates at INT64_MAX instead
// of overflowing; CheckedContiguousStrides says when a shape is that large
// (sizes must be >= 0 and their product, empty dims as 1, at most
// kMaxTensorElements), naming the shape.
std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& shape);
absl::StatusOr<std::vector<int64_t>> CheckedContiguousStrides(const std::vector<int64_t>& shape);
// Checks rank, sizes, strides and element count against the limits above.
// The message names every number involved; the caller prefixes the node.
absl::Status ValidateTensorType(const TensorType& t);

// What one output of a node is.
enum class ValueKind : int8_t { kTensor, kNone, kInt, kFloat, kBool };
struct ValueType {
  ValueKind kind = ValueKind::kTensor;
  TensorType tensor;  // kind == kTensor only.

  static ValueType Tensor(TensorType t) { return {ValueKind::kTensor, std::move(t)}; }
  static ValueType Of(ValueKind k) { return {k, {}}; }
  bool is_tensor() const { return kind == ValueKind::kTensor; }
  bool operator==(const ValueType& o) const;
  std::string ToString() const;
};
absl::StatusOr<ValueKind> ValueKindFromWire(int v);
int ValueKindToWire(ValueKind k);

}  // namespace fxdp::ir

#endif  // FXDP_ANALYSIS_IR_TYPES_H_
