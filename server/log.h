// One log line of fxdp-server on stderr, flushed ("fxdp-server: <line>").
#ifndef FXDP_SERVER_LOG_H_
#define FXDP_SERVER_LOG_H_

#include <cstdio>
#include <string>

namespace fxdp::server {

inline void Log(const std::string& line) {
  std::fprintf(stderr, "fxdp-server: %s\n", line.c_str());
  std::fflush(stderr);
}

}  // namespace fxdp::server

#endif  // FXDP_SERVER_LOG_H_
