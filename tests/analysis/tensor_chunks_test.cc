// The tensor-chunk protocol (analysis/ir/tensor_chunks.h) against the cases
// the Python client must pass too (tests/testdata/tensor_chunks.json;
// tests/python/test_tensor_chunks.py).
#include "analysis/ir/tensor_chunks.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "analysis/ir/types.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace fxdp::ir {
namespace {

using ::fxdp::testing::TestDataPath;
using nlohmann::json;

json Vectors() {
  std::ifstream f(TestDataPath("tensor_chunks.json"));
  return json::parse(f);
}

int WireDType(const json& d) {
  if (d.is_number_integer()) return d.get<int>();
  v1::DType out = v1::DTYPE_UNSPECIFIED;
  EXPECT_TRUE(v1::DType_Parse(d.get<std::string>(), &out)) << d;
  return out;
}

// Byte i of a tensor's data: (i % 251), so a chunk at `offset` holds
// (offset + j) % 251.
std::string Pattern(uint64_t from, uint64_t n) {
  std::string s(n, '\0');
  for (uint64_t j = 0; j < n; ++j) s[j] = static_cast<char>((from + j) % 251);
  return s;
}

v1::TensorChunk ChunkOf(const json& c) {
  v1::TensorChunk out;
  out.set_name(c["name"].get<std::string>());
  out.set_dtype(static_cast<v1::DType>(WireDType(c["dtype"])));
  for (int64_t d : c["shape"]) out.add_shape(d);
  out.set_offset(c["offset"].get<uint64_t>());
  out.set_data(Pattern(out.offset(), c["size"].get<uint64_t>()));
  return out;
}

TEST(TensorChunks, DTypeTableIsTheIrs) {
  const json v = Vectors();
  // Every wire dtype but DTYPE_UNSPECIFIED, once.
  ASSERT_EQ(v["dtypes"].size(), static_cast<size_t>(v1::DType_descriptor()->value_count() - 1));
  for (const json& row : v["dtypes"]) {
    absl::StatusOr<DType> d = DTypeFromWire(WireDType(row[0]));
    ASSERT_TRUE(d.ok()) << row;
    EXPECT_EQ(DTypeShortName(*d), row[1].get<std::string>());
    EXPECT_EQ(DTypeItemSize(*d), row[2].get<int>());
  }
}

TEST(TensorChunks, StreamsAreCheckedAsTheVectorsSay) {
  const json v = Vectors();  // a range over a member of a temporary would outlive it
  for (const json& stream : v["streams"]) {
    SCOPED_TRACE(stream["case"].get<std::string>());
    TensorChunkChecker check(stream["what"].get<std::string>());
    std::vector<std::string> complete;
    std::string data;
    for (const json& c : stream["chunks"]) {
      const v1::TensorChunk chunk = ChunkOf(c);
      absl::StatusOr<ChunkPlace> place = check.Add(chunk);
      if (c.contains("error")) {
        EXPECT_EQ(place.status(), absl::InvalidArgumentError(c["error"].get<std::string>())) << c;
        continue;
      }
      ASSERT_TRUE(place.ok()) << c << ": " << place.status();
      if (place->starts) data.assign(check.current().bytes, '\0');
      data.replace(chunk.offset(), chunk.data().size(), chunk.data());
      if (place->completes) {
        EXPECT_EQ(data, Pattern(0, data.size())) << check.current().name;
        complete.push_back(check.current().name);
      }
    }
    EXPECT_EQ(complete, stream["complete"].get<std::vector<std::string>>());
    EXPECT_EQ(check.complete(), complete.size());
    EXPECT_EQ(check.pending() ? check.pending_name() : "", stream["pending"].get<std::string>());
  }
}

TEST(TensorChunks, SpansAreTheVectors) {
  const json v = Vectors();
  for (const json& s : v["spans"]) {
    std::vector<std::vector<uint64_t>> got;
    for (const auto& [off, n] : ChunkSpans(s["bytes"], s["chunk_bytes"])) got.push_back({off, n});
    EXPECT_EQ(got, s["spans"].get<std::vector<std::vector<uint64_t>>>()) << s;
  }
}

}  // namespace
}  // namespace fxdp::ir
