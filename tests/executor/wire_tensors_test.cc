// The worker protocol's tensor chunks (executor/worker/wire_tensors.h): the
// LibTorch side; the protocol's rules are analysis/ir/tensor_chunks.h's
// (tests/analysis/tensor_chunks_test.cc and its shared vectors).
#include "executor/worker/wire_tensors.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

namespace fxdp::executor {
namespace {

using ::testing::HasSubstr;

std::vector<v1::TensorChunk> Chunks(const std::string& name, const at::Tensor& t, size_t n) {
  std::vector<v1::TensorChunk> out;
  absl::Status s = ChunkTensor(name, t, n, [&](v1::TensorChunk& c) {
    out.push_back(c);
    return true;
  });
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

TEST(WireTensorsTest, RoundTripsEveryDtypeThroughOddChunkSizes) {
  at::manual_seed(0);
  const std::vector<at::Tensor> tensors = {
      at::randn({3, 5}),            // f32, 60 bytes
      at::randn({7}, at::kDouble),  // f64
      at::randn({2, 3}).to(at::kBFloat16),
      at::randint(-1000, 1000, {4, 2}, at::kLong),
      at::randint(0, 2, {9}, at::kBool),
      at::randn({2, 3}).t(),  // not contiguous
      at::tensor(3.5),        // 0-dim
      at::empty({0, 4}),      // 0 bytes
  };
  for (size_t chunk : {size_t{1}, size_t{7}, size_t{60}, size_t{1} << 20}) {
    TensorAssembler a;
    for (size_t i = 0; i < tensors.size(); ++i) {
      for (const v1::TensorChunk& c : Chunks("t" + std::to_string(i), tensors[i], chunk)) {
        EXPECT_LE(c.data().size(), chunk);
        ASSERT_TRUE(a.Add(c).ok());
      }
      EXPECT_FALSE(a.pending());
    }
    TensorMap got = a.Take();
    ASSERT_EQ(got.size(), tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      const at::Tensor& g = got.at("t" + std::to_string(i));
      EXPECT_EQ(g.scalar_type(), tensors[i].scalar_type());
      EXPECT_EQ(g.sizes(), tensors[i].sizes());
      EXPECT_TRUE(at::equal(g, tensors[i])) << "tensor " << i << " chunk " << chunk;
    }
  }
}

TEST(WireTensorsTest, ZeroByteTensorIsOneEmptyChunk) {
  auto cs = Chunks("e", at::empty({0}), 16);
  ASSERT_EQ(cs.size(), 1u);
  EXPECT_EQ(cs[0].offset(), 0u);
  EXPECT_TRUE(cs[0].data().empty());
}

TEST(WireTensorsTest, RejectsChunksThatBreakTheRules) {
  const auto cs = Chunks("w", at::arange(10, at::kFloat), 16);  // 40 bytes: 16, 16, 8
  ASSERT_EQ(cs.size(), 3u);
  {
    TensorAssembler a;
    EXPECT_THAT(std::string(a.Add(cs[1]).message()),
                HasSubstr("tensor 'w': chunk at offset 16, expected 0"));
  }
  {
    TensorAssembler a;
    ASSERT_TRUE(a.Add(cs[0]).ok());
    EXPECT_THAT(std::string(a.Add(cs[2]).message()), HasSubstr("chunk at offset 32, expected 16"));
  }
  {
    TensorAssembler a;
    ASSERT_TRUE(a.Add(cs[0]).ok());
    v1::TensorChunk other = Chunks("v", at::ones({2}), 16)[0];
    EXPECT_THAT(std::string(a.Add(other).message()),
                HasSubstr("tensor 'v' started before tensor 'w' was complete (16 of 40 bytes)"));
  }
  {
    TensorAssembler a;
    v1::TensorChunk big = cs[0];
    big.set_data(std::string(41, 'x'));
    EXPECT_THAT(std::string(a.Add(big).message()), HasSubstr("runs past the tensor's 40 bytes"));
  }
  {
    TensorAssembler a;
    for (const auto& c : cs) ASSERT_TRUE(a.Add(c).ok());
    EXPECT_THAT(std::string(a.Add(cs[0]).message()), HasSubstr("tensor 'w': sent twice"));
  }
  {
    TensorAssembler a;
    v1::TensorChunk c = cs[0];
    c.set_dtype(v1::DTYPE_UNSPECIFIED);
    EXPECT_THAT(std::string(a.Add(c).message()), HasSubstr("unknown dtype 0"));
    c = cs[0];
    c.set_shape(0, -2);
    EXPECT_THAT(std::string(a.Add(c).message()), HasSubstr("negative dim in shape [-2]"));
    c = cs[0];
    c.clear_shape();
    for (int i = 0; i < 4; ++i) c.add_shape(int64_t{1} << 20);
    EXPECT_THAT(std::string(a.Add(c).message()), HasSubstr("is too large"));
  }
}

}  // namespace
}  // namespace fxdp::executor
