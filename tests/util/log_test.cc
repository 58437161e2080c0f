// fxdp's logger (util/log.h): one whole line per call, with its prefix.
#include "util/log.h"

#include <gtest/gtest.h>

namespace fxdp::util {
namespace {

TEST(Log, JobPrefixNamesJobRankAndStep) {
  EXPECT_EQ(JobLogPrefix("j7", 1, 2, 3), "[job j7 rank 1 step 2/3] ");
  EXPECT_EQ(JobLogPrefix("j7", 0, 4, 0), "[job j7 rank 0 step 4] ");
}

TEST(Log, WritesOneLineWithItsPrefix) {
  ::testing::internal::CaptureStderr();
  Log("[worker w] ", "attached to ", "host:1", " after ", 3, " tries");
  WriteLogLine("fxdp-server: ", "listening");
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "[worker w] attached to host:1 after 3 tries\nfxdp-server: listening\n");
}

TEST(Log, ControlBytesCannotStartAForgedLine) {
  EXPECT_EQ(EscapeControlBytes("a\nb\r\x1b[0m\x7f"), "a\\x0ab\\x0d\\x1b[0m\\x7f");
  ::testing::internal::CaptureStderr();
  Log("[worker w] ", "host\nfxdp-server: forged");
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "[worker w] host\\x0afxdp-server: forged\n");
}

}  // namespace
}  // namespace fxdp::util
