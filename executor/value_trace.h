// A value trace: every call node's outputs, one line each, per run, for
// finding where two runs that should be bit-identical part
// (ProgramOptions::value_trace; fxdp-worker reads FXDP_VALUE_TRACE=FILE).
//
//   run 2 node 'mul_5' (aten::mul.Tensor) [line] inplace out 0 Float[8,2,8,8]{128,64,8,1}+0 fnv
//   9c1f...
//
// `inplace` marks a step that wrote into its `self` (inplace.h); the shape,
// strides and storage offset are the tensor's as the kernel made it, `fnv` is
// FNV-1a (64-bit) over its elements' bytes in row-major order, so two lines
// are equal exactly when the values are bit-identical. Diff two files: the
// first differing line is the first node whose output differs.
#ifndef FXDP_EXECUTOR_VALUE_TRACE_H_
#define FXDP_EXECUTOR_VALUE_TRACE_H_

#include <ATen/core/ivalue.h>

#include <string>

namespace fxdp::executor {

// "Float[8,2]{2,1}+0 fnv 0123456789abcdef" for a tensor (without the hash
// when not `values`: an empty_like's memory); the tag kind (and the value for
// numbers) otherwise.
std::string TraceValue(const c10::IValue& v, bool values = true);

}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_VALUE_TRACE_H_
