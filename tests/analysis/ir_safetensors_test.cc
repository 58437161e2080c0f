// The torch-free safetensors parser and writer (analysis/ir/safetensors.h)
// on raw bytes; executor/safetensors_test.cc covers the LibTorch wrapper and
// every corruption the parser names.
#include "analysis/ir/safetensors.h"
#include "util/files.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>

#include "tests/test_util.h"

namespace fxdp::ir {
namespace {

using ::fxdp::testing::StatusIs;
using ::fxdp::testing::ValueOrDie;

std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

TEST(IrSafetensors, RoundTripInNameOrder) {
  const std::vector<RawTensor> in = {
      {"w", DType::kFloat32, {2, 2}, Bytes({1, 2, 3, 4})},
      {"b", DType::kInt64, {0}, ""},
      {"a", DType::kBool, {3}, std::string("\x01\x00\x01", 3)},
  };
  const std::string bytes = ValueOrDie(SerializeSafetensors(in));
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);  // padded like the Python library
  const std::vector<RawTensor> out = ValueOrDie(ParseSafetensorsTensors(bytes));
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].name, "a");
  EXPECT_EQ(out[0].dtype, DType::kBool);
  EXPECT_EQ(out[0].data, std::string("\x01\x00\x01", 3));
  EXPECT_EQ(out[1].name, "b");
  EXPECT_EQ(out[1].shape, std::vector<int64_t>{0});
  EXPECT_EQ(out[2].name, "w");
  EXPECT_EQ(out[2].dtype, DType::kFloat32);
  EXPECT_EQ(out[2].data, Bytes({1, 2, 3, 4}));
}

TEST(IrSafetensors, WriterRefusesWhatTheFormatCannotHold) {
  EXPECT_THAT(SerializeSafetensors(
                  std::vector<RawTensor>{{"c", DType::kComplex128, {1}, std::string(16, '\0')}})
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "tensor 'c': dtype torch.complex128 has no safetensors name"));
  EXPECT_THAT(
      SerializeSafetensors(std::vector<RawTensor>{{"w", DType::kFloat32, {2}, "abc"}}).status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "tensor 'w': 3 bytes, but its dtype and shape need 8"));
  EXPECT_THAT(SerializeSafetensors(std::vector<RawTensor>{{"w", DType::kInt8, {0}, ""},
                                                          {"w", DType::kInt8, {0}, ""}})
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "tensor 'w' given twice"));
}

TEST(IrSafetensors, ParserNamesTheTensorAndTheProblem) {
  std::string bytes = ValueOrDie(
      SerializeSafetensors(std::vector<RawTensor>{{"w", DType::kFloat32, {2}, Bytes({1, 2})}}));
  EXPECT_THAT(ParseSafetensors(bytes.substr(0, bytes.size() - 1)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "tensor 'w': data ends at byte 8"));
  EXPECT_THAT(ParseSafetensors("garbage!garbage!").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a safetensors file"));
  const std::string header = R"({"x":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})";
  std::string odd(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(odd.data(), &n, 8);
  EXPECT_THAT(
      ParseSafetensors(odd + header + "z").status(),
      StatusIs(
          absl::StatusCode::kUnimplemented,
          "tensor entry 1 of 1 (in name order): a dtype fxdp does not know (it knows F64 F32"));
}

// Issue 25.9: a data file may be any file under a data root, a secret one
// too. Whatever a file that is not well-formed safetensors holds, no byte of
// it (nor its length field as a number) appears in the error.
TEST(IrSafetensors, ErrorsQuoteNoBytesOfTheFile) {
  auto with_length = [](const std::string& header, const std::string& data = "") {
    std::string out(8, '\0');
    const uint64_t n = header.size();
    std::memcpy(out.data(), &n, 8);
    return out + header + data;
  };
  const std::string files[] = {
      with_length(R"("SECRET-PASSWORD-hunter2)"),  // nlohmann: "last read: ..."
      with_length(R"({"SECRET-PASSWORD": 3})"),    // an entry that is no object
      with_length(R"({"x": {"dtype": "SECRET-PASSWORD", "shape": [1], "data_offsets": [0, 4]}})",
                  "abcd"),
      with_length(
          R"({"x": {"dtype": "F32", "shape": ["SECRET-PASSWORD"], "data_offsets": [0, 4]}})",
          "abcd"),
      with_length(
          R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": ["SECRET-PASSWORD", 4]}})",
          "abcd"),
      with_length(
          R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "SECRET-PASSWORD": 1})",
          "abcd"),
      with_length(R"({"__metadata__": {"SECRET-PASSWORD": 1}})"),
      with_length(R"({"__metadata__": "SECRET-PASSWORD"})"),
      with_length(R"({"SECRET-PASSWORD": {"dtype": "F32", "shape": [7], "data_offsets": [0, 4]}})",
                  "abcd"),
      with_length(
          R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}} SECRET-PASSWORD)",
          "abcd"),
      std::string("AB\0\0\0\0\0\0SECRET-PASSWORD", 23),  // length field 16,961
      "SECRET-PASSWORD-hunter2\n",
  };
  for (const std::string& f : files) {
    const absl::Status s = ParseSafetensors(f).status();
    EXPECT_FALSE(s.ok()) << f;
    for (const char* leak : {"SECRET", "hunter2", "16961", "16,961", "last read"})
      EXPECT_EQ(std::string(s.message()).find(leak), std::string::npos) << leak << " in: " << s;
  }
}

TEST(IrSafetensors, FilesNameTheirPath) {
  const std::string path = ::testing::TempDir() + "/ir_safetensors_" + std::to_string(getpid());
  ASSERT_TRUE(WriteSafetensorsFile(path, {{"w", DType::kFloat16, {1}, "ab"}}).ok());
  const std::vector<RawTensor> t = ValueOrDie(ReadSafetensorsFile(path));
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0].dtype, DType::kFloat16);
  EXPECT_EQ(t[0].data, "ab");
  EXPECT_THAT(ReadSafetensorsFile(path + ".missing").status(),
              StatusIs(absl::StatusCode::kNotFound, ".missing"));
  unlink(path.c_str());
}

// A reader that keeps part of a file reads the header, then only the bytes
// it asks for; the header gets every check ParseSafetensors makes.
TEST(IrSafetensors, ReaderReadsTheHeaderThenThePiecesAskedFor) {
  const std::string path =
      ::testing::TempDir() + "/ir_safetensors_reader_" + std::to_string(getpid());
  ASSERT_TRUE(WriteSafetensorsFile(
                  path, {{"a", DType::kUInt8, {3}, "xyz"}, {"b", DType::kUInt8, {2, 2}, "1234"}})
                  .ok());
  const SafetensorsReader r = ValueOrDie(SafetensorsReader::Open(path));
  ASSERT_EQ(r.header().tensors.size(), 2u);
  EXPECT_EQ(r.header().data_size, 7u);
  const SafetensorsEntry& b = r.header().tensors[1];
  EXPECT_EQ(b.name, "b");
  EXPECT_EQ(b.shape, (std::vector<int64_t>{2, 2}));
  std::string piece(2, '\0');
  ASSERT_TRUE(r.Read(b.begin + 1, 2, piece.data()).ok());
  EXPECT_EQ(piece, "23");
  EXPECT_THAT(r.Read(6, 2, piece.data()),
              StatusIs(absl::StatusCode::kInternal, "7-byte data buffer"));
  // A file cut short fails at Open naming it, as the whole-file parser does.
  const std::string bytes = ValueOrDie(ReadSafetensorsBytes(path));
  const std::string cut = path + ".cut";
  ASSERT_TRUE(util::WriteFileAtomically(cut, bytes.substr(0, bytes.size() - 1)).ok());
  EXPECT_THAT(
      SafetensorsReader::Open(cut).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, "': corrupt safetensors data: tensor 'b'"));
  EXPECT_THAT(SafetensorsReader::Open(path + ".missing").status(),
              StatusIs(absl::StatusCode::kNotFound, ".missing"));
  unlink(cut.c_str());
  unlink(path.c_str());
}

}  // namespace
}  // namespace fxdp::ir
