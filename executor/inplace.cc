#include "executor/inplace.h"

#include "absl/strings/str_cat.h"
#include "analysis/op_rules.h"

namespace fxdp::executor {
namespace {

bool DenseContiguous(const ir::TensorType& t) { return t.IsContiguous() && t.storage_offset == 0; }

}  // namespace

void PlanInplace(const ir::Graph& g, const ir::Node& n, Step& s) {
  if (!HasInplaceVariant(n.target) || n.outputs.size() != 1 || !n.outputs[0].is_tensor() ||
      n.args.empty() || s.args.empty() || s.args[0].kind != ArgPlan::Kind::kSlot)
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
