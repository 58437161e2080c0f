// safetensors reading and writing (executor/safetensors.h): round trips of
// every dtype, a file written by the Python library, and one error per way a
// file can be corrupt or truncated (never a crash).
#include "executor/safetensors.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "tests/test_util.h"
#include "util/files.h"

namespace fxdp::executor {
namespace {

using ::fxdp::testing::ReadTestData;
using ::fxdp::testing::StatusIs;
using ::fxdp::testing::TestDataPath;
using ::fxdp::testing::ValueOrDie;

// A file from a header string and a data buffer.
std::string File(const std::string& header, const std::string& data = "") {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

TEST(SafetensorsTest, RoundTripsEveryDType) {
  std::map<std::string, at::Tensor> t;
  int i = 0;
  for (c10::ScalarType st :
       {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kLong, at::kInt, at::kShort,
        at::kChar, at::kByte, at::kBool, at::kFloat8_e4m3fn, at::kFloat8_e5m2, at::kUInt16,
        at::kUInt32, at::kUInt64, at::kComplexFloat}) {
    at::Tensor v = at::arange(12, at::kFloat).reshape({3, 4}).sub(3);
    if (st == at::kBool) v = v.gt(0);
    if (st == at::kByte || st == at::kUInt16 || st == at::kUInt32 || st == at::kUInt64) v = v.abs();
    t[absl::StrCat("t", i++, "_", c10::toString(st))] = v.to(st);
  }
  t["scalar"] = at::full({}, 2.5, at::kFloat);
  t["empty"] = at::zeros({0, 3}, at::kDouble);
  t["strided"] = at::arange(6, at::kLong).reshape({2, 3}).t();  // written contiguous
  const std::string bytes = ValueOrDie(SerializeSafetensors(t, {{"format", "pt"}}));
  const uint64_t n = *reinterpret_cast<const uint64_t*>(bytes.data());
  EXPECT_EQ(n % 8, 0u) << "header padded to 8 bytes";
  const SafetensorsFile f = ValueOrDie(ParseSafetensors(bytes));
  EXPECT_EQ(f.metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  ASSERT_EQ(f.tensors.size(), t.size());
  for (const auto& [name, want] : t) {
    const at::Tensor& got = f.tensors.at(name);
    EXPECT_EQ(got.scalar_type(), want.scalar_type()) << name;
    EXPECT_EQ(got.sizes(), want.sizes()) << name;
    EXPECT_TRUE(got.is_contiguous()) << name;
    // Byte equality (float8 and uint types have few ops).
    const at::Tensor wc = want.contiguous();
    ASSERT_EQ(got.nbytes(), wc.nbytes()) << name;
    EXPECT_EQ(std::memcmp(got.const_data_ptr(), wc.const_data_ptr(), got.nbytes()), 0) << name;
  }
  // Through a file.
  const std::string path = ::testing::TempDir() + "/roundtrip.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, t).ok());
  EXPECT_EQ(ValueOrDie(ReadSafetensors(path)).tensors.size(), t.size());
}

TEST(SafetensorsTest, ReadsWhatThePythonLibraryWrites) {
  // tests/testdata/python_written.safetensors: safetensors.torch.save_file.
  const SafetensorsFile f = ValueOrDie(ReadSafetensors(TestDataPath("python_written.safetensors")));
  EXPECT_EQ(f.metadata.at("format"), "pt");
  ASSERT_EQ(f.tensors.size(), 10u);
  EXPECT_TRUE(at::equal(f.tensors.at("a"), at::arange(6, at::kFloat).reshape({2, 3}) - 2.5));
  EXPECT_TRUE(at::equal(f.tensors.at("b"), at::tensor({1L, -2L, 3L, 1L << 40}, at::kLong)));
  EXPECT_TRUE(at::equal(f.tensors.at("c"), at::tensor({1, 0}).to(at::kBool)));
  EXPECT_TRUE(at::equal(f.tensors.at("d"), at::tensor({1.5, -0.25, 3.0}).to(at::kBFloat16)));
  EXPECT_EQ(f.tensors.at("e").dim(), 0);
  EXPECT_EQ(f.tensors.at("e").item<float>(), 0.5f);
  EXPECT_EQ(f.tensors.at("f").sizes(), (c10::IntArrayRef{0, 4}));
  EXPECT_TRUE(at::equal(f.tensors.at("g"), at::tensor({-1, 2}, at::kChar).reshape({1, 2})));
  EXPECT_TRUE(at::equal(f.tensors.at("h"), at::tensor({255, 0, 7}, at::kByte)));
  EXPECT_TRUE(at::equal(f.tensors.at("i"), at::tensor({70000, -5}, at::kInt)));
  EXPECT_TRUE(at::equal(f.tensors.at("j"), at::tensor({-300}, at::kShort)));
}

TEST(SafetensorsTest, CorruptFilesAreErrorsNamingWhatIsWrong) {
  const auto kBad = absl::StatusCode::kInvalidArgument;
  const std::string f32x2 = R"("dtype":"F32","shape":[2])";
  const std::string eight(8, '\0');
  EXPECT_THAT(ParseSafetensors("abc").status(), StatusIs(kBad, "shorter than the 8-byte header"));
  EXPECT_THAT(ParseSafetensors(File("{}").substr(0, 9)).status(),
              StatusIs(kBad, "the header length field exceeds the 1 bytes after it"));
  std::string huge(8, '\xff');
  EXPECT_THAT(ParseSafetensors(huge).status(), StatusIs(kBad, "exceeds the limit"));
  EXPECT_THAT(ParseSafetensors(File("{\"a\": ")).status(), StatusIs(kBad, "not valid JSON"));
  EXPECT_THAT(ParseSafetensors(File("[1, 2]")).status(), StatusIs(kBad, "not a JSON object"));
  EXPECT_THAT(ParseSafetensors(File(R"({"a": 3})")).status(),
              StatusIs(kBad, "tensor entry 1 of 1 (in name order) is not an object"));
  EXPECT_THAT(
      ParseSafetensors(File(R"({"a": {"shape":[2],"data_offsets":[0,8]}})", eight)).status(),
      StatusIs(kBad, "tensor entry 1 of 1 (in name order): missing or non-string 'dtype'"));
  EXPECT_THAT(
      ParseSafetensors(File(R"({"a": {"dtype":"F32","data_offsets":[0,8]}})", eight)).status(),
      StatusIs(kBad, "tensor entry 1 of 1 (in name order): missing or non-array 'shape'"));
  EXPECT_THAT(
      ParseSafetensors(File(R"({"a": {)" + f32x2 + R"(,"data_offsets":[0]}})", eight)).status(),
      StatusIs(kBad, "tensor entry 1 of 1 (in name order): 'data_offsets' must be [begin, end]"));
  EXPECT_THAT(
      ParseSafetensors(File(R"({"a": {"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", eight))
          .status(),
      StatusIs(absl::StatusCode::kUnimplemented,
               "tensor entry 1 of 1 (in name order): a dtype fxdp does not know"));
  EXPECT_THAT(
      ParseSafetensors(File(R"({"a": {"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight))
          .status(),
      StatusIs(kBad,
               "entry 1 of 1 (in name order): its shape has an entry that is not a non-negative "
               "integer"));
  EXPECT_THAT(
      ParseSafetensors(File(R"({"a": {)" + f32x2 + R"(,"data_offsets":[8,0]}})", eight)).status(),
      StatusIs(kBad, "its data_offsets are not integers 0 <= begin <= end"));
  EXPECT_THAT(
      ParseSafetensors(
          File(R"({"a": {)" + f32x2 + R"(,"data_offsets":[0,12]}})", std::string(12, '\0')))
          .status(),
      StatusIs(kBad,
               "its data_offsets span a different number of bytes than its dtype and shape need"));
  EXPECT_THAT(
      ParseSafetensors(File(R"({"a": {)" + f32x2 + R"(,"data_offsets":[0,8]}})", "1234")).status(),
      StatusIs(kBad, "tensor 'a': data ends at byte 8 of a 4-byte data buffer (truncated?)"));
  EXPECT_THAT(ParseSafetensors(File(R"({"a": {"dtype":"F32","shape":[4611686018427387904, 4],)"
                                    R"("data_offsets":[0,8]}})",
                                    eight))
                  .status(),
              StatusIs(kBad, "is too large"));
  EXPECT_THAT(ParseSafetensors(File(R"({"a": {)" + f32x2 + R"(,"data_offsets":[0,8]}, "b": {)" +
                                        f32x2 + R"(,"data_offsets":[4,12]}})",
                                    std::string(12, '\0')))
                  .status(),
              StatusIs(kBad, "overlaps the previous tensor"));
  EXPECT_THAT(ParseSafetensors(
                  File(R"({"a": {)" + f32x2 + R"(,"data_offsets":[4,12]}})", std::string(12, '\0')))
                  .status(),
              StatusIs(kBad, "bytes 0..4 of the data buffer belong to no tensor"));
  EXPECT_THAT(ParseSafetensors(
                  File(R"({"a": {)" + f32x2 + R"(,"data_offsets":[0,8]}})", std::string(9, '\0')))
                  .status(),
              StatusIs(kBad, "the data buffer has 9 bytes, the tensors cover 8"));
  EXPECT_THAT(ParseSafetensors(File(R"({"__metadata__": {"k": 1}})")).status(),
              StatusIs(kBad, "a __metadata__ value is not a string"));
  EXPECT_THAT(ReadSafetensors("/nonexistent/x.safetensors").status(),
              StatusIs(absl::StatusCode::kNotFound, "cannot open '/nonexistent/x.safetensors'"));
  EXPECT_THAT(
      SerializeSafetensors({{"q", at::quantize_per_tensor(at::ones({2}), 0.1, 0, at::kQInt8)}})
          .status(),
      StatusIs(kBad, "has no safetensors name"));
  EXPECT_THAT(SerializeSafetensors({{"u", at::Tensor()}}).status(),
              StatusIs(kBad, "tensor 'u' is undefined"));
}

// Files a job names (data_paths) are untrusted: a directory, a FIFO, a
// device, paths outside the roots, symlinks out of them, a text file, a
// truncated file: each an error naming the path, none aborts, hangs or reads
// without bound, and none echoes the file's bytes.
TEST(SafetensorsTest, UntrustedPathsAreErrorsNotAbortsHangsOrLeaks) {
  const std::string root = ::testing::TempDir() + "/st_root";
  const std::string outside = ::testing::TempDir() + "/st_outside";
  ASSERT_EQ(std::system(
                absl::StrCat("rm -rf ", root, " ", outside, " && mkdir -p ", root, "/dir ", outside)
                    .c_str()),
            0);
  const std::string good = ReadTestData("python_written.safetensors");
  auto write = [](const std::string& path, const std::string& bytes) {
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  };
  write(root + "/good.safetensors", good);
  write(root + "/truncated.safetensors", good.substr(0, good.size() / 2));
  write(root + "/text", "root:x:0:0:root:/root:/bin/bash\n");
  write(outside + "/secret.safetensors", good);
  ASSERT_EQ(mkfifo((root + "/fifo").c_str(), 0600), 0);
  ASSERT_EQ(symlink((outside + "/secret.safetensors").c_str(), (root + "/escape").c_str()), 0);
  ASSERT_EQ(symlink("/dev/zero", (root + "/zero").c_str()), 0);
  const util::DataRoots roots = ValueOrDie(util::DataRoots::Open({root}));
  SafetensorsReadOptions o;
  o.roots = &roots;
  EXPECT_TRUE(ReadSafetensors(root + "/good.safetensors", o).ok());
  EXPECT_TRUE(ReadSafetensors(root + "/dir/../good.safetensors", o).ok());
  const auto kPre = absl::StatusCode::kFailedPrecondition;
  const auto kDenied = absl::StatusCode::kPermissionDenied;
  EXPECT_THAT(ReadSafetensors(root + "/dir", o).status(),
              StatusIs(kPre, absl::StrCat("'", root, "/dir' is a directory, not a regular file")));
  EXPECT_THAT(ReadSafetensors(root + "/fifo", o).status(),
              StatusIs(kPre, "is a FIFO, not a regular file"));
  EXPECT_THAT(ReadSafetensors(root + "/truncated.safetensors", o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "truncated.safetensors': corrupt safetensors data"));
  const absl::Status text = ReadSafetensors(root + "/text", o).status();
  EXPECT_THAT(text, StatusIs(absl::StatusCode::kInvalidArgument, "not a safetensors file"));
  EXPECT_EQ(std::string(text.message()).find("root:x"), std::string::npos) << text;
  // 'root:x:0' as a little-endian u64 must not appear either.
  uint64_t n = 0;
  std::memcpy(&n, "root:x:0", 8);
  EXPECT_EQ(std::string(text.message()).find(absl::StrCat(n)), std::string::npos) << text;
  EXPECT_THAT(
      ReadSafetensors(outside + "/secret.safetensors", o).status(),
      StatusIs(kDenied, absl::StrCat("outside this worker's data roots (allowed: ", root, ")")));
  EXPECT_THAT(ReadSafetensors(root + "/../st_outside/secret.safetensors", o).status(),
              StatusIs(kDenied, "outside this worker's data roots"));
  EXPECT_THAT(ReadSafetensors(root + "/escape", o).status(),
              StatusIs(kDenied, "goes through a symbolic link"));
  EXPECT_THAT(ReadSafetensors(root + "/zero", o).status(),
              StatusIs(kDenied, "goes through a symbolic link"));
  // Outside the roots, existing or not, reads the same: nothing is revealed.
  EXPECT_THAT(ReadSafetensors("/nonexistent/x", o).status(), StatusIs(kDenied, "outside"));
  EXPECT_THAT(ReadSafetensors("/etc/passwd", o).status(), StatusIs(kDenied, "outside"));
  EXPECT_THAT(ReadSafetensors(root + "/missing", o).status(),
              StatusIs(absl::StatusCode::kNotFound, "does not exist under the data roots"));
  const util::DataRoots none;
  o.roots = &none;
  EXPECT_THAT(ReadSafetensors(root + "/good.safetensors", o).status(),
              StatusIs(kDenied, "none were configured"));
  // Unconfined (fxdp-worker run's own files): still regular files only, bounded.
  EXPECT_THAT(ReadSafetensors("/dev/zero").status(),
              StatusIs(kPre, "is a character device, not a regular file"));
  EXPECT_THAT(ReadSafetensors(root + "/zero").status(),
              StatusIs(kPre, "zero' is a character device"));
  SafetensorsReadOptions small;
  small.max_bytes = 16;
  EXPECT_THAT(ReadSafetensors(root + "/good.safetensors", small).status(),
              StatusIs(kPre, absl::StrCat("has ", util::WithCommas(good.size()),
                                          " bytes, over the limit of 16")));
}

TEST(SafetensorsTest, EveryTruncationAndManyBitFlipsAreErrorsNotCrashes) {
  const std::string good = ReadTestData("python_written.safetensors");
  ASSERT_TRUE(ParseSafetensors(good).ok());
  for (size_t n = 0; n < good.size(); ++n)
    EXPECT_FALSE(ParseSafetensors(good.substr(0, n)).ok()) << "prefix of " << n << " bytes";
  std::mt19937 rng(7);
  int rejected = 0;
  for (int i = 0; i < 2000; ++i) {
    std::string bad = good;
    const size_t pos = rng() % std::min<size_t>(bad.size(), 8 + 400);  // mostly the header
    bad[pos] = static_cast<char>(bad[pos] ^ (1 << (rng() % 8)));
    rejected += !ParseSafetensors(bad).ok();
  }
  EXPECT_GT(rejected, 1000);
}

}  // namespace
}  // namespace fxdp::executor
