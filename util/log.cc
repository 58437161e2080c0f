#include "util/log.h"

#include <cstdio>

namespace fxdp::util {

std::string EscapeControlBytes(absl::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else {
      out += c;
    }
  }
  return out;
}

void WriteLogLine(absl::string_view prefix, absl::string_view text) {
  const std::string line = absl::StrCat(prefix, EscapeControlBytes(text), "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

std::string JobLogPrefix(absl::string_view job, int rank, int64_t step, int64_t steps) {
  return absl::StrCat("[job ", job, " rank ", rank, " step ", step,
                      steps > 0 ? absl::StrCat("/", steps) : std::string(), "] ");
}

}  // namespace fxdp::util
