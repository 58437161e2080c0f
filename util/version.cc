#include "util/version.h"

namespace fxdp::util {

std::string VersionLine(const std::string& program) { return program + " " + FXDP_VERSION; }

}  // namespace fxdp::util
