#include "analysis/ir/types.h"

#include <gtest/gtest.h>

#include <limits>

#include "proto/fxdp/v1/graph.pb.h"
#include "tests/test_util.h"

namespace fxdp::ir {
namespace {

using ::fxdp::testing::StatusIs;

TEST(DTypeTest, EveryWireDTypeMapsBothWays) {
  const auto* desc = v1::DType_descriptor();
  int mapped = 0;
  for (int i = 0; i < desc->value_count(); ++i) {
    const int wire = desc->value(i)->number();
    if (wire == v1::DTYPE_UNSPECIFIED) {
      EXPECT_FALSE(DTypeFromWire(wire).ok());
      continue;
    }
    auto d = DTypeFromWire(wire);
    ASSERT_TRUE(d.ok()) << desc->value(i)->name();
    EXPECT_EQ(DTypeToWire(*d), wire);
    EXPECT_EQ(*DTypeFromShortName(DTypeShortName(*d)), *d);
    EXPECT_EQ(*DTypeFromTorchName(DTypeTorchName(*d)), *d);
    ++mapped;
  }
  EXPECT_EQ(mapped, desc->value_count() - 1);
  EXPECT_THAT(DTypeFromWire(99).status(), StatusIs(absl::StatusCode::kInvalidArgument, "99"));
  EXPECT_EQ(DTypeItemSize(DType::kBFloat16), 2);
  EXPECT_TRUE(DTypeIsFloatingPoint(DType::kFloat16));
  EXPECT_FALSE(DTypeIsFloatingPoint(DType::kInt64));
}

TEST(DeviceTest, ParsesAndPrints) {
  EXPECT_EQ(Device::Parse("cpu")->ToString(), "cpu");
  EXPECT_EQ(Device::Parse("cuda:3")->index, 3);
  EXPECT_EQ(Device::Parse("cuda:3")->ToString(), "cuda:3");
  EXPECT_FALSE(Device::Parse("tpu").ok());
  EXPECT_FALSE(Device::Parse("cuda:x").ok());
  EXPECT_FALSE(Device::Parse("cuda:-2").ok());
}

TensorType Make(std::vector<int64_t> shape) {
  TensorType t;
  t.stride = ContiguousStrides(shape);
  t.shape = std::move(shape);
  return t;
}

TEST(TensorTypeTest, ContiguousStridesTreatSizeZeroAndOneLikeTorch) {
  EXPECT_EQ(ContiguousStrides({2, 3, 4}), (std::vector<int64_t>{12, 4, 1}));
  EXPECT_EQ(ContiguousStrides({2, 0, 4}), (std::vector<int64_t>{4, 4, 1}));
  EXPECT_EQ(ContiguousStrides({}), (std::vector<int64_t>{}));
  // Overflow saturates (no UB); the checked form refuses the shape.
  const int64_t big = int64_t{1} << 32;
  EXPECT_EQ(ContiguousStrides({big, big, big}),
            (std::vector<int64_t>{std::numeric_limits<int64_t>::max(), big, 1}));
  EXPECT_FALSE(CheckedContiguousStrides({big, big, big}).ok());
  EXPECT_FALSE(CheckedContiguousStrides({2, -1}).ok());
  EXPECT_EQ(*CheckedContiguousStrides({2, 0, 4}), (std::vector<int64_t>{4, 4, 1}));
}

TEST(TensorTypeTest, ToStringShowsOnlyWhatDiffersFromDefaults) {
  TensorType t = Make({12, 8});
  EXPECT_EQ(t.ToString(), "f32[12, 8]");
  t.stride = {1, 12};
  t.storage_offset = 3;
  t.device = Device{DeviceType::kCuda, 1};
  t.requires_grad = true;
  t.dtype = DType::kBFloat16;
  EXPECT_EQ(t.ToString(), "bf16[12, 8]{1, 12}+3@cuda:1 rg");
  EXPECT_EQ(Make({}).ToString(), "f32[]");
}

TEST(TensorTypeTest, ValidateRefusesNegativeSizes) {
  EXPECT_THAT(ValidateTensorType(Make({4, -1})),
              StatusIs(absl::StatusCode::kInvalidArgument, "size of dim 1 is negative (-1)"));
}

TEST(TensorTypeTest, ValidateRefusesHugeShapesWithoutOverflow) {
  // 2^31 * 2^31 = 2^62 elements: refused, and the product never overflows.
  TensorType t = Make({int64_t{1} << 31, int64_t{1} << 31});
  EXPECT_THAT(ValidateTensorType(t),
              StatusIs(absl::StatusCode::kInvalidArgument, "elements (the limit)"));
  TensorType single = Make({int64_t{1} << 62});
  EXPECT_FALSE(ValidateTensorType(single).ok());
  TensorType overflow = Make({int64_t{1} << 40, int64_t{1} << 40, 0});
  // A zero-size dim after huge ones: still refused, the running product overflows first.
  EXPECT_FALSE(ValidateTensorType(overflow).ok());
  EXPECT_TRUE(ValidateTensorType(Make({0, int64_t{1} << 40})).ok());
}

TEST(TensorTypeTest, ValidateChecksStrides) {
  TensorType t = Make({4, 4});
  t.stride = {1};
  EXPECT_THAT(ValidateTensorType(t),
              StatusIs(absl::StatusCode::kInvalidArgument, "stride has 1 entries"));
  t.stride = {4, -1};
  EXPECT_THAT(ValidateTensorType(t), StatusIs(absl::StatusCode::kInvalidArgument, "negative"));
  t.stride = {int64_t{1} << 62, 1};
  EXPECT_THAT(ValidateTensorType(t), StatusIs(absl::StatusCode::kInvalidArgument, "addresses"));
  t = Make(std::vector<int64_t>(kMaxRank + 1, 1));
  EXPECT_THAT(ValidateTensorType(t), StatusIs(absl::StatusCode::kInvalidArgument, "rank 65"));
}

}  // namespace
}  // namespace fxdp::ir
