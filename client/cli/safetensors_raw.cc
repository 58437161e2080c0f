#include "client/cli/safetensors_raw.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <iterator>
#include <map>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace fxdp::cli {
namespace {

struct DTypeName {
  const char* name;
  v1::DType proto;
  int64_t size;
};
constexpr std::array<DTypeName, 16> kDTypes = {{
    {"F64", v1::FLOAT64, 8},          {"F32", v1::FLOAT32, 4},   {"F16", v1::FLOAT16, 2},
    {"BF16", v1::BFLOAT16, 2},        {"F8_E4M3", v1::FLOAT8_E4M3FN, 1},
    {"F8_E5M2", v1::FLOAT8_E5M2, 1},  {"I64", v1::INT64, 8},     {"I32", v1::INT32, 4},
    {"I16", v1::INT16, 2},            {"I8", v1::INT8, 1},       {"U64", v1::UINT64, 8},
    {"U32", v1::UINT32, 4},           {"U16", v1::UINT16, 2},    {"U8", v1::UINT8, 1},
    {"BOOL", v1::BOOL, 1},            {"C64", v1::COMPLEX64, 8},
}};

int64_t NumBytes(const std::string& dtype, const std::vector<int64_t>& shape) {
  int64_t n = DTypeItemSize(dtype);
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

v1::DType DTypeToProto(const std::string& name) {
  for (const DTypeName& d : kDTypes)
    if (name == d.name) return d.proto;
  return v1::DTYPE_UNSPECIFIED;
}

std::string DTypeFromProto(v1::DType p) {
  for (const DTypeName& d : kDTypes)
    if (p == d.proto) return d.name;
  return "";
}

int64_t DTypeItemSize(const std::string& name) {
  for (const DTypeName& d : kDTypes)
    if (name == d.name) return d.size;
  return 0;
}

absl::StatusOr<std::vector<RawTensor>> ReadSafetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a safetensors file: ", why));
  };
  if (bytes.size() < 8) return bad("shorter than 8 bytes");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  if (n > bytes.size() - 8) return bad("header length past the end");
  nlohmann::json header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + n, nullptr,
                                                /*allow_exceptions=*/false);
  if (!header.is_object()) return bad("header is not a JSON object");
  const uint64_t base = 8 + n;
  std::vector<std::pair<uint64_t, RawTensor>> out;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const nlohmann::json& v = it.value();
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets") || !v["dtype"].is_string() || !v["shape"].is_array() ||
        !v["data_offsets"].is_array() || v["data_offsets"].size() != 2) {
      return bad(absl::StrCat("bad entry for '", it.key(), "'"));
    }
    RawTensor t;
    t.name = it.key();
    t.dtype = v["dtype"].get<std::string>();
    if (DTypeItemSize(t.dtype) == 0) return bad(absl::StrCat("'", t.name, "': unsupported dtype ", t.dtype));
    for (const auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) return bad(absl::StrCat("'", t.name, "': bad shape"));
      t.shape.push_back(d.get<int64_t>());
    }
    const uint64_t b = v["data_offsets"][0].get<uint64_t>(), e = v["data_offsets"][1].get<uint64_t>();
    if (b > e || base + e > bytes.size()) return bad(absl::StrCat("'", t.name, "': data_offsets out of range"));
    if (static_cast<int64_t>(e - b) != NumBytes(t.dtype, t.shape))
      return bad(absl::StrCat("'", t.name, "': ", e - b, " bytes for ", t.dtype, " of that shape"));
    t.data = bytes.substr(base + b, e - b);
    out.emplace_back(b, std::move(t));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<RawTensor> tensors;
  for (auto& [_, t] : out) tensors.push_back(std::move(t));
  return tensors;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<RawTensor>& tensors) {
  std::vector<const RawTensor*> sorted;
  for (const RawTensor& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->name < b->name; });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  uint64_t off = 0;
  for (const RawTensor* t : sorted) {
    if (DTypeItemSize(t->dtype) == 0)
      return absl::InvalidArgumentError(absl::StrCat("'", t->name, "': unsupported dtype ", t->dtype));
    if (static_cast<int64_t>(t->data.size()) != NumBytes(t->dtype, t->shape))
      return absl::InvalidArgumentError(absl::StrCat("'", t->name, "': ", t->data.size(),
                                                     " bytes do not match its dtype and shape"));
    header[t->name] = {{"dtype", t->dtype}, {"shape", t->shape},
                       {"data_offsets", {off, off + t->data.size()}}};
    off += t->data.size();
  }
  std::string h = header.dump();
  while (h.size() % 8) h.push_back(' ');
  std::string len(8, '\0');
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(len.data(), 8);
  f.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const RawTensor* t : sorted) f.write(t->data.data(), static_cast<std::streamsize>(t->data.size()));
  f.close();
  if (!f) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace fxdp::cli
