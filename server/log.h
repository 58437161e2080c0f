// One log line of fxdp-server on stderr, flushed ("fxdp-server: <line>").
// Control characters in `line` (a newline in a name a worker or client sent)
// are written as \xHH, so one call is always exactly one line.
#ifndef FXDP_SERVER_LOG_H_
#define FXDP_SERVER_LOG_H_

#include <cstdio>
#include <string>

namespace fxdp::server {

inline void Log(const std::string& line) {
  std::string out;
  out.reserve(line.size() + 16);
  for (char c : line) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else {
      out += c;
    }
  }
  std::fprintf(stderr, "fxdp-server: %s\n", out.c_str());
  std::fflush(stderr);
}

}  // namespace fxdp::server

#endif  // FXDP_SERVER_LOG_H_
