// The one spelling of a shape and of a tensor's type in messages, tables and
// reports (IR, analysis, expansion, server, worker and CLI alike): "[2, 3]" and
// "f32[2, 3]" (TensorType::ToString adds strides, offset, device and
// requires_grad).
#ifndef FXDP_ANALYSIS_IR_TYPE_TEXT_H_
#define FXDP_ANALYSIS_IR_TYPE_TEXT_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "analysis/ir/types.h"

namespace fxdp::ir {

// "[2, 3]" (also any list of ints: dims, sizes, strides).
std::string ShapeText(absl::Span<const int64_t> shape);
// "f32[2, 3]".
std::string TypeText(DType dtype, absl::Span<const int64_t> shape);
// The same with a dtype named some other way: "dtype99[2, 3]" for an unknown
// wire value, torch's name for a dtype the IR lacks.
std::string TypeText(absl::string_view dtype, absl::Span<const int64_t> shape);
inline std::string TypeText(const TensorType& t) { return TypeText(t.dtype, t.shape); }

}  // namespace fxdp::ir

#endif  // FXDP_ANALYSIS_IR_TYPE_TEXT_H_
