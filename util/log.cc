#include "util/log.h"

#include <cstdio>

namespace fxdp::util {

void WriteLogLine(absl::string_view prefix, absl::string_view text) {
  const std::string line = absl::StrCat(prefix, text, "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

std::string JobLogPrefix(absl::string_view job, int rank, int64_t step, int64_t steps) {
  return absl::StrCat("[job ", job, " rank ", rank, " step ", step,
                      steps > 0 ? absl::StrCat("/", steps) : std::string(), "] ");
}

}  // namespace fxdp::util
