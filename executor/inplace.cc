#include "executor/inplace.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace fxdp::executor {
namespace {

bool DenseContiguous(const ir::TensorType& t) { return t.IsContiguous() && t.storage_offset == 0; }

}  // namespace

bool HasPointwiseInplaceVariant(absl::string_view name) {
  static constexpr absl::string_view kOps[] = {
      "aten::abs",         "aten::add",       "aten::addcdiv",    "aten::addcmul",    "aten::clamp",
      "aten::clamp_max",   "aten::clamp_min", "aten::cos",        "aten::div",        "aten::exp",
      "aten::gelu",        "aten::hardtanh",  "aten::leaky_relu", "aten::lerp",       "aten::log",
      "aten::masked_fill", "aten::mul",       "aten::neg",        "aten::reciprocal", "aten::relu",
      "aten::rsqrt",       "aten::sigmoid",   "aten::sign",       "aten::silu",       "aten::sin",
      "aten::sqrt",        "aten::sub",       "aten::tanh",
  };
  return std::find(std::begin(kOps), std::end(kOps), name) != std::end(kOps);
}

void PlanInplace(const ir::Graph& g, const ir::Node& n, Step& s) {
  if (!HasPointwiseInplaceVariant(n.target.name) || n.outputs.size() != 1 ||
      !n.outputs[0].is_tensor() || n.args.empty() || s.args.empty() ||
      s.args[0].kind != ArgPlan::Kind::kSlot)
    return;
  const ir::ValueRef* self = n.args[0].get_if<ir::ValueRef>();
  if (self == nullptr || !g.type(*self).is_tensor()) return;
  const ir::TensorType& in = g.type(*self).tensor;
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

}  // namespace fxdp::executor
