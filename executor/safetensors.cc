#include "executor/safetensors.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <utility>
#include <limits>
#include <nlohmann/json.hpp>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "executor/torch_types.h"
#include "util/files.h"

namespace fxdp::executor {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian; this code copies it as is");

struct DTypeName {
  const char* name;
  c10::ScalarType type;
};
constexpr std::array<DTypeName, 16> kDTypes = {{
    {"F64", c10::ScalarType::Double},        {"F32", c10::ScalarType::Float},
    {"F16", c10::ScalarType::Half},          {"BF16", c10::ScalarType::BFloat16},
    {"F8_E4M3", c10::ScalarType::Float8_e4m3fn}, {"F8_E5M2", c10::ScalarType::Float8_e5m2},
    {"I64", c10::ScalarType::Long},          {"I32", c10::ScalarType::Int},
    {"I16", c10::ScalarType::Short},         {"I8", c10::ScalarType::Char},
    {"U64", c10::ScalarType::UInt64},        {"U32", c10::ScalarType::UInt32},
    {"U16", c10::ScalarType::UInt16},        {"U8", c10::ScalarType::Byte},
    {"BOOL", c10::ScalarType::Bool},         {"C64", c10::ScalarType::ComplexFloat},
}};

std::optional<c10::ScalarType> DTypeFromName(const std::string& s) {
  for (const DTypeName& d : kDTypes)
    if (s == d.name) return d.type;
  return std::nullopt;
}

const char* DTypeToName(c10::ScalarType t) {
  for (const DTypeName& d : kDTypes)
    if (t == d.type) return d.name;
  return nullptr;
}

absl::Status Corrupt(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("corrupt safetensors data: ", what));
}

// A JSON value as a non-negative integer that fits in int64.
std::optional<uint64_t> AsCount(const nlohmann::json& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return u;
    return std::nullopt;
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i >= 0) return static_cast<uint64_t>(i);
  }
  return std::nullopt;
}

struct Entry {
  std::string name;
  c10::ScalarType type;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

}  // namespace

absl::StatusOr<SafetensorsFile> ParseSafetensors(absl::string_view bytes) {
  if (bytes.size() < 8)
    return Corrupt(absl::StrCat("the file is ", bytes.size(),
                                " bytes, shorter than the 8-byte header length (truncated?)"));
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  // The length field is the file's first 8 bytes: when they are not a length
  // (a text file, say), say so without echoing them.
  if (n > kMaxSafetensorsHeader)
    return Corrupt(absl::StrCat("not a safetensors file: the header length field exceeds the limit of ",
                                util::WithCommas(kMaxSafetensorsHeader), " bytes"));
  if (n > bytes.size() - 8)
    return Corrupt(absl::StrCat("header length ", util::WithCommas(n), " exceeds the ",
                                util::WithCommas(bytes.size() - 8),
                                " bytes after the length field (truncated, or not a safetensors file)"));
  const absl::string_view header = bytes.substr(8, n);
  const absl::string_view data = bytes.substr(8 + n);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header.begin(), header.end());
  } catch (const nlohmann::json::exception& e) {
    return Corrupt(absl::StrCat("the header is not valid JSON: ", e.what()));
  }
  if (!j.is_object()) return Corrupt("the header is not a JSON object");

  SafetensorsFile out;
  std::vector<Entry> entries;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    const nlohmann::json& v = it.value();
    if (key == "__metadata__") {
      if (!v.is_object()) return Corrupt("__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          return Corrupt(absl::StrCat("__metadata__ value '", m.key(), "' is not a string"));
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = absl::StrCat("tensor '", key, "'");
    if (!v.is_object()) return Corrupt(absl::StrCat(where, ": entry is not an object"));
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string())
      return Corrupt(absl::StrCat(where, ": missing or non-string 'dtype'"));
    if (sh == v.end() || !sh->is_array())
      return Corrupt(absl::StrCat(where, ": missing or non-array 'shape'"));
    if (off == v.end() || !off->is_array() || off->size() != 2)
      return Corrupt(absl::StrCat(where, ": 'data_offsets' must be [begin, end]"));
    Entry e;
    e.name = key;
    auto type = DTypeFromName(dt->get<std::string>());
    if (!type)
      return absl::UnimplementedError(absl::StrCat(
          "safetensors ", where, ": unsupported dtype '", dt->get<std::string>(), "'"));
    e.type = *type;
    if (sh->size() > 64) return Corrupt(absl::StrCat(where, ": ", sh->size(), " dimensions"));
    uint64_t numel = 1;
    bool overflow = false;
    for (const nlohmann::json& d : *sh) {
      auto c = AsCount(d);
      if (!c) return Corrupt(absl::StrCat(where, ": shape ", sh->dump(),
                                          " has an entry that is not a non-negative integer"));
      e.shape.push_back(static_cast<int64_t>(*c));
      if (*c != 0 && numel > (uint64_t{1} << 62) / *c) overflow = true;
      numel *= *c;
    }
    auto b = AsCount((*off)[0]);
    auto en = AsCount((*off)[1]);
    if (!b || !en || *b > *en)
      return Corrupt(absl::StrCat(where, ": bad data_offsets ", off->dump()));
    e.begin = *b;
    e.end = *en;
    const uint64_t item = c10::elementSize(e.type);
    if (overflow || numel > (uint64_t{1} << 62) / item)
      return Corrupt(absl::StrCat(where, ": shape ", sh->dump(), " is too large"));
    if (e.end - e.begin != numel * item)
      return Corrupt(absl::StrCat(where, ": data_offsets ", off->dump(), " span ",
                                  e.end - e.begin, " bytes, but ", dt->get<std::string>(),
                                  sh->dump(), " needs ", numel * item));
    if (e.end > data.size())
      return Corrupt(absl::StrCat(where, ": data ends at byte ", e.end, " of a ", data.size(),
                                  "-byte data buffer (truncated?)"));
    entries.push_back(std::move(e));
  }
  // Tensors tile the buffer: no overlap, no gap, nothing after the last one.
  std::vector<const Entry*> order;
  for (const Entry& e : entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t pos = 0;
  for (const Entry* e : order) {
    if (e->begin < pos)
      return Corrupt(absl::StrCat("tensor '", e->name, "' overlaps the previous tensor"));
    if (e->begin > pos)
      return Corrupt(absl::StrCat("bytes ", pos, "..", e->begin, " of the data buffer belong to "
                                  "no tensor (before '", e->name, "')"));
    pos = e->end;
  }
  if (pos != data.size())
    return Corrupt(absl::StrCat("the data buffer has ", data.size(), " bytes, the tensors cover ",
                                pos));
  try {
    for (const Entry& e : entries) {
      at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.type));
      if (e.end > e.begin) std::memcpy(t.data_ptr(), data.data() + e.begin, e.end - e.begin);
      out.tensors.emplace(e.name, std::move(t));
    }
  } catch (const std::exception& ex) {
    return absl::ResourceExhaustedError(absl::StrCat("allocating tensors: ", ExceptionMessage(ex)));
  }
  return out;
}

absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path, const SafetensorsReadOptions& options) {
  std::string resolved = path;
  if (options.confine) {
    absl::StatusOr<std::string> r = util::ConfinePath(path, options.roots);
    if (!r.ok()) return r.status();
    resolved = *std::move(r);
  } else {
    // Symlinks the caller named are followed here, once; the open below
    // refuses one that appears in between.
    char buf[PATH_MAX];
    if (realpath(path.c_str(), buf) != nullptr) resolved = buf;
  }
  absl::StatusOr<std::string> bytes = util::ReadRegularFile(resolved, options.max_bytes);
  if (!bytes.ok()) {
    // Messages name the path as given, not where it resolved to.
    if (resolved == path) return bytes.status();
    return absl::Status(bytes.status().code(),
                        absl::StrReplaceAll(bytes.status().message(), {{resolved, path}}));
  }
  auto r = ParseSafetensors(*bytes);
  if (!r.ok()) return absl::Status(r.status().code(), absl::StrCat("'", path, "': ", r.status().message()));
  return r;
}

absl::StatusOr<std::string> SerializeSafetensors(const std::map<std::string, at::Tensor>& tensors,
                                                 const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) {
    nlohmann::json m = nlohmann::json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = m;
  }
  std::vector<at::Tensor> cpu;
  uint64_t offset = 0;
  try {
    for (const auto& [name, t] : tensors) {
      if (name == "__metadata__")
        return absl::InvalidArgumentError("a tensor cannot be named __metadata__");
      if (!t.defined())
        return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' is undefined"));
      const char* dt = DTypeToName(t.scalar_type());
      if (dt == nullptr)
        return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': dtype ",
                                                       c10::toString(t.scalar_type()),
                                                       " has no safetensors name"));
      at::Tensor c = t.to(at::kCPU).contiguous();
      const uint64_t nbytes = c.numel() * c.element_size();
      header[name] = {{"dtype", dt},
                      {"shape", c.sizes().vec()},
                      {"data_offsets", {offset, offset + nbytes}}};
      offset += nbytes;
      cpu.push_back(std::move(c));
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("copying tensors to the CPU: ", ExceptionMessage(e)));
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  std::string out;
  out.reserve(8 + h.size() + offset);
  const uint64_t n = h.size();
  out.append(reinterpret_cast<const char*>(&n), 8);
  out += h;
  for (const at::Tensor& c : cpu) {
    const size_t nbytes = c.numel() * c.element_size();
    if (nbytes > 0) out.append(static_cast<const char*>(c.const_data_ptr()), nbytes);
  }
  return out;
}

absl::Status WriteSafetensors(const std::string& path,
                              const std::map<std::string, at::Tensor>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  auto bytes = SerializeSafetensors(tensors, metadata);
  if (!bytes.ok()) return bytes.status();
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return absl::PermissionDeniedError(absl::StrCat("cannot write ", tmp));
    f.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
    f.close();
    if (!f) {
      std::remove(tmp.c_str());
      return absl::DataLossError(absl::StrCat("error writing ", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::PermissionDeniedError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

}  // namespace fxdp::executor
