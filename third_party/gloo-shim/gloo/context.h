#pragma once
// Shim (see gloo/README.md).
#include <chrono>
#include "gloo/transport/device.h"
namespace gloo {
class Context {
 public:
  Context() = delete;               // only libtorch_cpu.so creates contexts
  Context(const Context&) = delete;
  // Exported from libtorch_cpu.so: gloo::Context::setTimeout(std::chrono::milliseconds)
  void setTimeout(std::chrono::milliseconds timeout);
};
} // namespace gloo
