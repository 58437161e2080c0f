// util/bytes.h: the one spelling of byte counts in messages and tables.
#include "util/bytes.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace fxdp::util {
namespace {

TEST(Bytes, MiB) {
  EXPECT_EQ(MiB(0), "0.0 MiB");
  EXPECT_EQ(MiB(3 << 19), "1.5 MiB");
  EXPECT_EQ(MiBWithBytes(70324272), "67.1 MiB (70324272 bytes)");
}

}  // namespace
}  // namespace fxdp::util
