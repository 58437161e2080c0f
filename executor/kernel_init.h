// One-time set-up of the kernel libraries, on one thread, before any step runs.
//
// MKL's vector math (VML: what ATen runs for tanh, erf, exp, log... of a
// contiguous float tensor, aten/src/ATen/cpu/vml.h) picks its kernels by a CPU
// type it detects on its first call and caches, without a lock, in a static
// (mkl_vml_serv_cpu_detect, MKL 2024.2 in torch 2.13's wheel): it stores the raw
// type (9 on this AVX-512 machine) before the mapped one (5), so a thread that
// calls VML in between runs another kernel table, whose tanh differs by up to
// 1342 ulp. ATen splits an elementwise op of >= 2x2048 elements over its
// OpenMP threads, so with 2 or more intra-op threads the first VML op of a
// process calls VML from every thread at once: about one worker in 100 computed
// one thread's half of GPT-2's GELU tanh with the other kernels (the
// >1-thread rerun difference of issue 24, docs/randomness.md).
// InitKernelLibraries makes that first call on the calling thread alone.
#ifndef FXDP_EXECUTOR_KERNEL_INIT_H_
#define FXDP_EXECUTOR_KERNEL_INIT_H_

namespace fxdp::executor {

// Calls ATen's VML-backed ops once on a one-element tensor (below every
// grain size, so on this thread only). Idempotent and thread-safe; Program::Load
// calls it, so every program's parallel regions find VML's CPU type set.
void InitKernelLibraries();

}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_KERNEL_INIT_H_
