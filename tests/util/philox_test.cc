// util/philox.h against tests/testdata/philox_vectors.txt: Random123's known
// answers for Philox4x32-10, fxdp's node ids and stream words (the same file
// holds client/python/fxdp/philox.py to the same values).
#include "util/philox.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace fxdp::philox {
namespace {

uint32_t Hex(const std::string& s) { return static_cast<uint32_t>(std::stoul(s, nullptr, 16)); }

std::vector<std::vector<std::string>> Lines(const std::string& kind) {
  std::vector<std::vector<std::string>> out;
  std::istringstream in(testing::ReadTestData("philox_vectors.txt"));
  for (std::string line; std::getline(in, line);) {
    std::istringstream f(line);
    std::vector<std::string> words;
    for (std::string w; f >> w;) words.push_back(w);
    if (!words.empty() && words[0] == kind) out.push_back(words);
  }
  return out;
}

TEST(Philox, Random123KnownAnswers) {
  const auto lines = Lines("philox4x32");
  ASSERT_EQ(lines.size(), 3u);
  for (const auto& f : lines) {
    ASSERT_EQ(f.size(), 12u);
    const Words4 c{{Hex(f[2]), Hex(f[3]), Hex(f[4]), Hex(f[5])}};
    const Words4 out = Philox4x32(c, Hex(f[6]), Hex(f[7]), std::stoi(f[1]));
    for (int w = 0; w < 4; ++w) EXPECT_EQ(out.v[w], Hex(f[8 + w])) << f[2] << " word " << w;
  }
}

TEST(Philox, NodeIdIsFnv1aOfTheName) {
  const auto lines = Lines("node");
  ASSERT_FALSE(lines.empty());
  for (const auto& f : lines) {
    const std::string name = f[1] == "-" ? "" : f[1];
    EXPECT_EQ(NodeId(name.data(), static_cast<int64_t>(name.size())), Hex(f[2])) << name;
  }
}

TEST(Philox, StreamWords) {
  const auto lines = Lines("stream");
  ASSERT_FALSE(lines.empty());
  for (const auto& f : lines) {
    const StreamKey k{std::stoull(f[1]), static_cast<uint32_t>(std::stoul(f[2])), Hex(f[3])};
    const uint64_t first = std::stoull(f[4]);
    std::vector<uint32_t> got(f.size() - 5);
    Words(k, first, static_cast<int64_t>(got.size()), got.data());
    for (size_t j = 0; j < got.size(); ++j)
      EXPECT_EQ(got[j], Hex(f[5 + j])) << f[1] << " word " << j;
  }
}

// Any window of the stream is the same words: a slice draws what the whole draws.
TEST(Philox, WindowsAgreeWithTheWhole) {
  const StreamKey k{99, 5, 1234};
  std::vector<uint32_t> whole(120);  // windows past kLanes blocks (32 words) too
  Words(k, 0, 120, whole.data());
  for (uint64_t first = 0; first < 12; ++first) {
    for (int64_t n = 0; n + first <= 120 && n < 80; ++n) {
      std::vector<uint32_t> part(n + 1, 0);
      Words(k, first, n, part.data());
      for (int64_t j = 0; j < n; ++j) ASSERT_EQ(part[j], whole[first + j]) << first << "+" << j;
      if (n > 0) ASSERT_EQ(part[n - 1], Block(k, (first + n - 1) / 4).v[(first + n - 1) % 4]);
      EXPECT_EQ(part[n], 0u) << "wrote past n";
    }
  }
}

}  // namespace
}  // namespace fxdp::philox
