// One log line of fxdp-server on stderr ("fxdp-server: <line>"), through
// fxdp's logger (util/log.h).
#ifndef FXDP_SERVER_LOG_H_
#define FXDP_SERVER_LOG_H_

#include <string>

#include "util/log.h"

namespace fxdp::server {

inline void Log(const std::string& line) { util::Log("fxdp-server: ", line); }

}  // namespace fxdp::server

#endif  // FXDP_SERVER_LOG_H_
