#include "executor/value_trace.h"

#include <ATen/ATen.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace fxdp::executor {

std::string TraceValue(const c10::IValue& v, bool values) {
  if (v.isInt()) return absl::StrCat("int ", v.toInt());
  if (v.isDouble()) return absl::StrFormat("float %a", v.toDouble());
  if (v.isBool()) return absl::StrCat("bool ", v.toBool());
  if (!v.isTensor()) return v.tagKind();
  const at::Tensor& t = v.toTensor();
  if (!t.defined()) return "undefined tensor";
  const std::string layout = absl::StrFormat("%s[%s]{%s}+%d", c10::toString(t.scalar_type()),
                                             absl::StrJoin(t.sizes(), ","),
                                             absl::StrJoin(t.strides(), ","), t.storage_offset());
  if (!values) return absl::StrCat(layout, " uninitialised");
  const at::Tensor c = t.to(at::kCPU).contiguous();
  uint64_t h = 14695981039346656037ull;
  const auto* p = static_cast<const unsigned char*>(c.data_ptr());
  for (size_t i = 0, n = c.nbytes(); i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return absl::StrFormat("%s fnv %016x", layout, h);
}

}  // namespace fxdp::executor
