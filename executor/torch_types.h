// The boundary between the fxdp IR and LibTorch: dtype/device/layout tables
// and operator lookup through the c10 dispatcher.
#ifndef FXDP_EXECUTOR_TORCH_TYPES_H_
#define FXDP_EXECUTOR_TORCH_TYPES_H_

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <c10/core/Layout.h>
#include <c10/core/MemoryFormat.h>
#include <c10/core/ScalarType.h>

#include <exception>
#include <string>

#include "absl/status/statusor.h"
#include "analysis/ir/graph.h"

namespace fxdp::executor {

c10::ScalarType ToTorch(ir::DType d);
absl::StatusOr<ir::DType> FromTorch(c10::ScalarType t);
c10::Device ToTorch(const ir::Device& d);
c10::Layout ToTorch(ir::Layout l);
c10::MemoryFormat ToTorch(ir::MemoryFormat m);

// The dispatcher's handle for an op target ("aten::addmm", ""), or NOT_FOUND
// naming the op when this LibTorch does not know it.
absl::StatusOr<c10::OperatorHandle> FindOperator(const ir::Target& target);

// "f32[2, 3]", "f32[2, 3]@cuda:0", "an undefined tensor": a tensor (or the
// tag of a non-tensor value) as error messages name it.
std::string DescribeTorchTensor(const at::Tensor& t);
std::string DescribeIValue(const c10::IValue& v);
// "f32[2, 3]": the graph's tensor type as error messages name it.
std::string TypeForMessage(const ir::TensorType& t);
// Whether `t` fits the graph's type (dtype and sizes; strides and device are
// not the graph's business at run time).
bool Fits(const at::Tensor& t, const ir::TensorType& want);

// An exception's message for a status: c10::Error without its C++ backtrace
// ("Exception raised from ... frame #0 ..."), trailing whitespace trimmed.
std::string ExceptionMessage(const std::exception& e);

}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_TORCH_TYPES_H_
