// In-place planning: a pointwise op (add, mul, div, lerp, addcmul, addcdiv,
// sqrt, relu, ...: the op table's kInplace rows, analysis/op_rules.cc) whose `self` argument dies
// at that node runs as its in-place variant (`aten::mul_.Scalar` for `aten::mul.Scalar`) when the
// graph gives self and the result the same dtype and shape, contiguous, and at run time nothing
// else holds self's storage (Reusable). The result is the same; it saves an allocation and a third
// of the memory traffic.
#ifndef FXDP_EXECUTOR_INPLACE_H_
#define FXDP_EXECUTOR_INPLACE_H_

#include <ATen/core/ivalue.h>

#include "analysis/ir/graph.h"
#include "executor/program_impl.h"
#include "executor/torch_types.h"

namespace fxdp::executor {

// Sets s.inplace_op when `n`'s op has a pointwise in-place variant with the
// same arguments and the graph says self (a value slot) and the result have
// the same dtype and shape, both dense and contiguous. Whether self dies at
// this node is decided later (the loader drops inplace_op unless s.args[0]
// moves its slot).
void PlanInplace(const ir::Graph& g, const ir::Node& n, Step& s);

// At run time: whether `v`, the value an op's `self` argument was moved
// into, may be overwritten: a dense tensor of the graph's dtype and sizes
// that no other tensor (or view) shares. Inline: checked before every
// in-place candidate runs.
inline bool Reusable(const c10::IValue& v, const ir::TensorType& want) {
  if (!v.isTensor()) return false;
  const at::Tensor& t = v.toTensor();
  if (!t.defined() || t.use_count() != 1 || t.unsafeGetTensorImpl()->is_wrapped_number() ||
      t.requires_grad())
    return false;
  if (t.scalar_type() != ToTorch(want.dtype) || t.sizes() != c10::IntArrayRef(want.shape))
    return false;
  if (!t.is_contiguous() || t.storage_offset() != 0) return false;
  const c10::Storage& st = t.storage();
  return st.use_count() == 1 && st.nbytes() == static_cast<size_t>(t.numel()) * t.element_size();
}

}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_INPLACE_H_
