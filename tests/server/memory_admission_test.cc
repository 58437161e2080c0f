// Admission by memory (server/jobs/memory_admission.h): a rank whose state needs
// more than its worker registered is refused, naming what and where.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/jobs/memory_admission.h"
#include "tests/test_util.h"
#include "util/flags.h"

namespace fxdp::server {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

v1::ExpandResponse Expanded(v1::DataParallelStyle style, int world) {
  v1::ExpandResponse r;
  v1::StateMemory* m = r.mutable_memory();
  m->set_world_size(world);
  m->set_style(style);
  m->set_parameter_bytes(1000);
  m->set_gradient_bytes(1000);
  m->set_optimizer_state_bytes(2000);
  m->set_largest_bucket_bytes(500);
  m->set_total_bytes(4500);
  return r;
}

v1::WorkerInfo Worker(const std::string& id, int64_t bytes, const std::string& source) {
  v1::WorkerInfo w;
  w.set_worker_id(id);
  w.set_memory_bytes(bytes);
  w.set_memory_source(source);
  return w;
}

TEST(MemoryAdmission, RefusesTheFirstRankThatDoesNotFit) {
  const auto known = {Worker("a", 10000, "physical memory"), Worker("b", 4499, "--memory-limit")};
  const absl::Status rep =
      CheckRanksFit("job-1", Expanded(v1::DATA_PARALLEL_STYLE_REPLICATE, 2), {"a", "b"}, known);
  EXPECT_EQ(rep.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(
      std::string(rep.message()),
      AllOf(
          HasSubstr(
              "job job-1: rank 1 does not fit worker b: its state under replicate on 2 ranks "
              "needs 4.4 KiB (4500 bytes) (parameters 1000 + gradients 1000 + optimizer state 2000 "
              "+ other state 0 + largest bucket 500 bytes; activations come on top), the worker "
              "has 4.4 KiB (4499 bytes) (--memory-limit)"),
          HasSubstr("with --style fully_shard each rank holds 1/2 of the parameters, gradients and "
                    "optimizer state, 2.0 KiB (2000 bytes), plus the gathered units")));
  const absl::Status fs =
      CheckRanksFit("job-1", Expanded(v1::DATA_PARALLEL_STYLE_FULLY_SHARD, 2), {"b", "a"}, known);
  EXPECT_EQ(fs.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(fs.message()),
              AllOf(HasSubstr("rank 0 does not fit worker b: its state under fully_shard"),
                    HasSubstr("more ranks (--world-size)")));
}

TEST(MemoryAdmission, FitsOrUnknownPasses) {
  const auto known = {Worker("a", 4500, "--memory-limit"), Worker("u", 0, "")};
  EXPECT_TRUE(
      CheckRanksFit("j", Expanded(v1::DATA_PARALLEL_STYLE_REPLICATE, 2), {"a", "u"}, known).ok());
  EXPECT_TRUE(
      CheckRanksFit("j", v1::ExpandResponse(), {"a"}, {Worker("a", 1, "")}).ok());  // no figure
}

TEST(ByteSize, Units) {
  int64_t b = 0;
  ASSERT_TRUE(util::ParseByteSize("300MB", &b));
  EXPECT_EQ(b, 300 << 20);
  ASSERT_TRUE(util::ParseByteSize("1.5GiB", &b));
  EXPECT_EQ(b, int64_t{3} << 29);
  ASSERT_TRUE(util::ParseByteSize("70324272", &b));
  EXPECT_EQ(b, 70324272);
  for (const char* bad : {"", "MB", "-1MB", "0", "12XB", "nanMB", "1e30TB"})
    EXPECT_FALSE(util::ParseByteSize(bad, &b)) << bad;
}

}  // namespace
}  // namespace fxdp::server
