#include "executor/kernel_init.h"

#include <ATen/ATen.h>

#include <mutex>

namespace fxdp::executor {

void InitKernelLibraries() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Every VML function shares the cached CPU type: one call sets it. A few
    // ops, so that one of them still reaches VML if ATen moves another to
    // its own vectorised code.
    const at::Tensor x = at::zeros({1});
    (void)at::tanh(x);
    (void)at::erf(x);
    (void)at::exp(x);
    (void)at::log1p(x);
  });
}

}  // namespace fxdp::executor
