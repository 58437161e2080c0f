// The version every binary prints for `--version`: the project's version
// (CMakeLists.txt's project(... VERSION ...)).
#ifndef FXDP_UTIL_VERSION_H_
#define FXDP_UTIL_VERSION_H_

#include <string>

namespace fxdp::util {

// "<program> <version>", the line `--version` prints.
std::string VersionLine(const std::string& program);

}  // namespace fxdp::util

#endif  // FXDP_UTIL_VERSION_H_
