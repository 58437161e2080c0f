// The CUDA/NCCL path links and reports what it has; GPU checks skip
// themselves where no device is present.
#include "executor/nccl/nccl_info.h"

#include <gtest/gtest.h>

namespace fxdp::executor {
namespace {

TEST(NcclInfoTest, LinkedNcclReportsARealVersion) {
  const std::string v = NcclVersion();
  EXPECT_EQ(v.rfind("2.", 0), 0u) << v;
}

TEST(NcclInfoTest, CudaDeviceCountIsPositiveOrExplainsWhy) {
  auto n = CudaDeviceCount();
  if (!n.ok()) {
    EXPECT_NE(n.status().message().find("no usable CUDA device"), std::string::npos);
    GTEST_SKIP() << n.status();
  }
  EXPECT_GT(*n, 0);
}

}  // namespace
}  // namespace fxdp::executor
