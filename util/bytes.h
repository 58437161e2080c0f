// Byte counts as messages and tables print them (server, worker, CLI and
// expansion reports alike).
#ifndef FXDP_UTIL_BYTES_H_
#define FXDP_UTIL_BYTES_H_

#include <cstdint>
#include <string>

namespace fxdp::util {

// "1.5 MiB": `bytes` in MiB with one decimal.
std::string MiB(uint64_t bytes);
// "1.5 MiB (1572864 bytes)": the same and the exact count, as errors quote a
// size that is checked against a limit.
std::string MiBWithBytes(uint64_t bytes);

}  // namespace fxdp::util

#endif  // FXDP_UTIL_BYTES_H_
