#include "util/bytes.h"

#include "absl/strings/str_format.h"

namespace fxdp::util {

std::string MiB(uint64_t bytes) {
  return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / (1 << 20));
}

std::string MiBWithBytes(uint64_t bytes) {
  return absl::StrFormat("%s (%d bytes)", MiB(bytes), bytes);
}

}  // namespace fxdp::util
