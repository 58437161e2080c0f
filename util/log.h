// fxdp's one logger: lines on stderr, each written whole with one write and
// flushed (servers, workers and ranks share terminals and log files), each
// starting with who speaks: "fxdp-server: ", "[worker ID] ",
// "[job J rank R step S/K] ".
#ifndef FXDP_UTIL_LOG_H_
#define FXDP_UTIL_LOG_H_

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace fxdp::util {

// Writes `prefix` `text` and a newline to stderr in one write, then flushes.
// Control bytes in `text` (newline, carriage return, escape, ...) are written
// as \xNN: clients and workers send the strings that end up in log lines
// (hostnames, job names, data paths, error messages), and none of them may
// start a forged line.
void WriteLogLine(absl::string_view prefix, absl::string_view text);
// "a\nb" -> "a\\x0ab": bytes < 0x20 and 0x7f as \xNN, everything else as is.
std::string EscapeControlBytes(absl::string_view text);

// Log("[worker w1] ", "attached to ", server): the pieces are joined with
// absl::StrCat.
template <typename... A>
void Log(absl::string_view prefix, const A&... pieces) {
  WriteLogLine(prefix, absl::StrCat(pieces...));
}

// "[job J rank R step S/K] ", or "[job J rank R step S] " when the step
// count is not known (steps <= 0).
std::string JobLogPrefix(absl::string_view job, int rank, int64_t step, int64_t steps);

}  // namespace fxdp::util

#endif  // FXDP_UTIL_LOG_H_
