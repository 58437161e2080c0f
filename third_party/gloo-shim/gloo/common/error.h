#pragma once
// Shim (see gloo/README.md). Exception types are intentionally not declared:
// catch std::exception / c10::Error around Work::wait().
#include <chrono>
namespace gloo {
const std::chrono::milliseconds kNoTimeout = std::chrono::milliseconds::zero();
} // namespace gloo
