#include "analysis/ir/safetensors.h"

#include <stdlib.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "util/files.h"

namespace fxdp::ir {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian; this code copies it as is");

// safetensors' dtype names: the format's own spelling of ir::DType.
struct SafetensorsDType {
  absl::string_view name;
  DType dtype;
};
constexpr SafetensorsDType kSafetensorsDTypes[] = {
    {"F64", DType::kFloat64},
    {"F32", DType::kFloat32},
    {"F16", DType::kFloat16},
    {"BF16", DType::kBFloat16},
    {"F8_E4M3", DType::kFloat8E4M3FN},
    {"F8_E5M2", DType::kFloat8E5M2},
    {"I64", DType::kInt64},
    {"I32", DType::kInt32},
    {"I16", DType::kInt16},
    {"I8", DType::kInt8},
    {"U64", DType::kUInt64},
    {"U32", DType::kUInt32},
    {"U16", DType::kUInt16},
    {"U8", DType::kUInt8},
    {"BOOL", DType::kBool},
    {"C64", DType::kComplex64},
};

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

}  // namespace

absl::string_view DTypeSafetensorsName(DType d) {
  for (const SafetensorsDType& t : kSafetensorsDTypes)
    if (t.dtype == d) return t.name;
  return "";
}

absl::StatusOr<DType> DTypeFromSafetensorsName(absl::string_view s) {
  for (const SafetensorsDType& t : kSafetensorsDTypes)
    if (t.name == s) return t.dtype;
  return absl::InvalidArgumentError(absl::StrCat("unknown safetensors dtype '", s, "'"));
}

absl::StatusOr<SafetensorsView> ParseSafetensors(absl::string_view bytes) {
  absl::StatusOr<SafetensorsView> out = ParseSafetensorsHeader(bytes, bytes.size());
  if (out.ok()) out->data = bytes.substr(bytes.size() - out->data_size);
  return out;
}

// [Errors Quote No File Bytes] A data file may be any file under a data
// root, a secret among them (issue 25.9). Nothing read from the file is
// quoted until it declares itself safetensors: the length field's value, the
// JSON text (nlohmann's messages quote it: "last read: ..."), malformed
// entries, dtype strings fxdp does not know and __metadata__ never appear in
// an error; those name the entry by its position and give sizes of the file,
// the header and the limit. A well-formed entry (a known dtype, a shape of
// non-negative integers, offsets that match them) is named with its name,
// dtype, shape and offsets: only a file written as safetensors gets that far.
absl::StatusOr<uint64_t> SafetensorsHeaderLength(absl::string_view first8, uint64_t file_size) {
  if (file_size < 8 || first8.size() < 8)
    return Corrupt(absl::StrCat("the file is ", file_size,
                                " bytes, shorter than the 8-byte header length (truncated?)"));
  uint64_t n = 0;
  std::memcpy(&n, first8.data(), 8);
  if (n > kMaxSafetensorsHeader)
    return Corrupt(
        absl::StrCat("not a safetensors file: the header length field exceeds the limit of ",
                     util::WithCommas(kMaxSafetensorsHeader), " bytes"));
  if (n > file_size - 8)
    return Corrupt(
        absl::StrCat("not a safetensors file, or truncated: the header length field exceeds the ",
                     util::WithCommas(file_size - 8), " bytes after it"));
  return n;
}

namespace {

// One tensor entry of a header that is a JSON object: checked, or an error
// that names the entry by `where` ("entry 2 of 5 (in name order)") and quotes
// nothing of it until it is well-formed ([Errors Quote No File Bytes]).
absl::StatusOr<SafetensorsEntry> ParseEntry(const std::string& key, const nlohmann::json& v,
                                            const std::string& where, uint64_t data_size) {
  if (!v.is_object()) return Corrupt(absl::StrCat(where, " is not an object"));
  auto dt = v.find("dtype");
  auto sh = v.find("shape");
  auto off = v.find("data_offsets");
  if (dt == v.end() || !dt->is_string())
    return Corrupt(absl::StrCat(where, ": missing or non-string 'dtype'"));
  if (sh == v.end() || !sh->is_array())
    return Corrupt(absl::StrCat(where, ": missing or non-array 'shape'"));
  if (off == v.end() || !off->is_array() || off->size() != 2)
    return Corrupt(absl::StrCat(where, ": 'data_offsets' must be [begin, end]"));
  SafetensorsEntry e;
  e.name = key;
  absl::StatusOr<DType> type = DTypeFromSafetensorsName(dt->get<std::string>());
  if (!type.ok()) {
    std::string known;
    for (const SafetensorsDType& t : kSafetensorsDTypes)
      absl::StrAppend(&known, known.empty() ? "" : " ", t.name);
    return absl::UnimplementedError(
        absl::StrCat("safetensors ", where, ": a dtype fxdp does not know (it knows ", known, ")"));
  }
  e.dtype = *type;
  if (sh->size() > 64)
    return Corrupt(absl::StrCat(where, ": ", sh->size(), " dimensions, more than 64"));
  uint64_t numel = 1;
  bool overflow = false;
  for (const nlohmann::json& d : *sh) {
    auto c = AsCount(d);
    if (!c)
      return Corrupt(
          absl::StrCat(where, ": its shape has an entry that is not a non-negative integer"));
    e.shape.push_back(static_cast<int64_t>(*c));
    if (*c != 0 && numel > (uint64_t{1} << 62) / *c) overflow = true;
    numel *= *c;
  }
  auto b = AsCount((*off)[0]);
  auto en = AsCount((*off)[1]);
  if (!b || !en || *b > *en)
    return Corrupt(absl::StrCat(where, ": its data_offsets are not integers 0 <= begin <= end"));
  e.begin = *b;
  e.end = *en;
  const uint64_t item = static_cast<uint64_t>(DTypeItemSize(e.dtype));
  if (overflow || numel > (uint64_t{1} << 62) / item)
    return Corrupt(absl::StrCat(where, ": its shape is too large (over 2^62 bytes)"));
  if (e.end - e.begin != numel * item)
    return Corrupt(
        absl::StrCat(where,
                     ": its data_offsets span a different number of bytes than its dtype "
                     "and shape need"));
  // Well-formed from here on: named.
  if (e.end > data_size)
    return Corrupt(absl::StrCat("tensor '", key, "': data ends at byte ", e.end, " of a ",
                                data_size, "-byte data buffer (truncated?)"));
  return e;
}

}  // namespace

absl::StatusOr<SafetensorsView> ParseSafetensorsHeader(absl::string_view prefix,
                                                       uint64_t file_size) {
  absl::StatusOr<uint64_t> length = SafetensorsHeaderLength(prefix, file_size);
  if (!length.ok()) return length.status();
  const uint64_t n = *length;
  if (prefix.size() < 8 + n)
    return absl::InternalError(absl::StrCat("parsing a safetensors header of ", n,
                                            " bytes from the first ", prefix.size(),
                                            " bytes of the file"));
  const absl::string_view header = prefix.substr(8, n);
  SafetensorsView out;
  out.data_size = file_size - 8 - n;
  // No exceptions, and never nlohmann's message: it quotes the input.
  nlohmann::json j =
      nlohmann::json::parse(header.begin(), header.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    return Corrupt(absl::StrCat("not a safetensors file, or a damaged one: its ",
                                util::WithCommas(n), "-byte header is not valid JSON"));
  if (!j.is_object()) return Corrupt("not a safetensors file: its header is not a JSON object");

  size_t k = 0;
  const size_t entries = j.size() - (j.contains("__metadata__") ? 1 : 0);
  for (auto it = j.begin(); it != j.end(); ++it) {
    const nlohmann::json& v = it.value();
    if (it.key() == "__metadata__") {
      if (!v.is_object()) return Corrupt("__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) return Corrupt("a __metadata__ value is not a string");
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where =
        absl::StrCat("tensor entry ", ++k, " of ", entries, " (in name order)");
    absl::StatusOr<SafetensorsEntry> e = ParseEntry(it.key(), v, where, out.data_size);
    if (!e.ok()) return e.status();
    out.tensors.push_back(*std::move(e));
  }
  // Tensors tile the buffer: no overlap, no gap, nothing after the last one.
  std::stable_sort(out.tensors.begin(), out.tensors.end(),
                   [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
                     return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
                   });
  uint64_t pos = 0;
  for (const SafetensorsEntry& e : out.tensors) {
    if (e.begin < pos)
      return Corrupt(absl::StrCat("tensor '", e.name, "' overlaps the previous tensor"));
    if (e.begin > pos)
      return Corrupt(absl::StrCat("bytes ", pos, "..", e.begin,
                                  " of the data buffer belong to "
                                  "no tensor (before '",
                                  e.name, "')"));
    pos = e.end;
  }
  if (pos != out.data_size)
    return Corrupt(
        absl::StrCat("the data buffer has ", out.data_size, " bytes, the tensors cover ", pos));
  return out;
}

absl::StatusOr<std::vector<RawTensor>> ParseSafetensorsTensors(absl::string_view bytes) {
  absl::StatusOr<SafetensorsView> view = ParseSafetensors(bytes);
  if (!view.ok()) return view.status();
  std::vector<RawTensor> out;
  out.reserve(view->tensors.size());
  for (SafetensorsEntry& e : view->tensors) {
    out.push_back(RawTensor{std::move(e.name), e.dtype, std::move(e.shape),
                            std::string(view->data.substr(e.begin, e.end - e.begin))});
  }
  return out;
}

absl::StatusOr<std::string> SafetensorsHeader(std::vector<TensorBytes>* tensors,
                                              const std::map<std::string, std::string>& metadata,
                                              uint64_t* data_bytes) {
  std::sort(tensors->begin(), tensors->end(),
            [](const TensorBytes& a, const TensorBytes& b) { return a.name < b.name; });
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) {
    nlohmann::json m = nlohmann::json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = m;
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors->size(); ++i) {
    const TensorBytes& t = (*tensors)[i];
    if (t.name == "__metadata__")
      return absl::InvalidArgumentError("a tensor cannot be named __metadata__");
    if (i > 0 && (*tensors)[i - 1].name == t.name)
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' given twice"));
    const absl::string_view dt = DTypeSafetensorsName(t.dtype);
    if (dt.empty())
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "': dtype ", DTypeTorchName(t.dtype), " has no safetensors name"));
    uint64_t want = static_cast<uint64_t>(DTypeItemSize(t.dtype));
    for (int64_t d : t.shape) want *= static_cast<uint64_t>(std::max<int64_t>(d, 0));
    if (t.data.size() != want)
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "': ", t.data.size(), " bytes, but its dtype and shape need ", want));
    header[t.name] = {{"dtype", std::string(dt)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  const uint64_t n = h.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  out += h;
  if (data_bytes != nullptr) *data_bytes = offset;
  return out;
}

absl::StatusOr<std::string> SerializeSafetensors(
    std::vector<TensorBytes> tensors, const std::map<std::string, std::string>& metadata) {
  uint64_t data_bytes = 0;
  absl::StatusOr<std::string> out = SafetensorsHeader(&tensors, metadata, &data_bytes);
  if (!out.ok()) return out.status();
  out->reserve(out->size() + data_bytes);
  for (const TensorBytes& t : tensors) out->append(t.data.data(), t.data.size());
  return out;
}

absl::StatusOr<std::string> SerializeSafetensors(const std::vector<RawTensor>& tensors) {
  std::vector<TensorBytes> views;
  views.reserve(tensors.size());
  for (const RawTensor& t : tensors) views.push_back(TensorBytes{t.name, t.dtype, t.shape, t.data});
  return SerializeSafetensors(std::move(views));
}

namespace {

// `path` opened for reading under `options`: beneath its roots, or with the
// symlinks the caller named followed once (the open refuses one that
// appears in between). Messages name the path as given, not where it
// resolved to.
absl::StatusOr<util::RegularFile> OpenForRead(const std::string& path,
                                              const SafetensorsReadOptions& options) {
  if (options.roots != nullptr) return options.roots->OpenFile(path, options.max_bytes);
  std::string resolved = path;
  char buf[PATH_MAX];
  if (realpath(path.c_str(), buf) != nullptr) resolved = buf;
  return util::RegularFile::Open(resolved, options.max_bytes, path);
}

}  // namespace

absl::StatusOr<std::string> ReadSafetensorsBytes(const std::string& path,
                                                 const SafetensorsReadOptions& options) {
  absl::StatusOr<util::RegularFile> file = OpenForRead(path, options);
  if (!file.ok()) return file.status();
  std::string bytes(file->size(), '\0');
  if (absl::Status s = file->ReadAt(0, file->size(), bytes.data()); !s.ok()) return s;
  return bytes;
}

absl::StatusOr<SafetensorsReader> SafetensorsReader::Open(const std::string& path,
                                                          const SafetensorsReadOptions& options) {
  absl::StatusOr<util::RegularFile> file = OpenForRead(path, options);
  if (!file.ok()) return file.status();
  auto named = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("'", path, "': ", s.message()));
  };
  std::string prefix(std::min<uint64_t>(8, file->size()), '\0');
  if (absl::Status s = file->ReadAt(0, prefix.size(), prefix.data()); !s.ok()) return s;
  absl::StatusOr<uint64_t> n = SafetensorsHeaderLength(prefix, file->size());
  if (!n.ok()) return named(n.status());
  prefix.resize(8 + *n);
  if (absl::Status s = file->ReadAt(8, *n, prefix.data() + 8); !s.ok()) return s;
  absl::StatusOr<SafetensorsView> header = ParseSafetensorsHeader(prefix, file->size());
  if (!header.ok()) return named(header.status());
  const uint64_t data_begin = 8 + *n;
  return SafetensorsReader(*std::move(file), *std::move(header), data_begin);
}

absl::Status SafetensorsReader::Read(uint64_t begin, uint64_t n, void* dest) const {
  if (begin > header_.data_size || n > header_.data_size - begin)
    return absl::InternalError(absl::StrCat("reading bytes ", begin, "..", begin + n, " of the ",
                                            header_.data_size, "-byte data buffer of '",
                                            file_.path(), "'"));
  return file_.ReadAt(data_begin_ + begin, n, dest);
}

absl::StatusOr<std::vector<RawTensor>> ReadSafetensorsFile(const std::string& path,
                                                           const SafetensorsReadOptions& options) {
  absl::StatusOr<std::string> bytes = ReadSafetensorsBytes(path, options);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<std::vector<RawTensor>> r = ParseSafetensorsTensors(*bytes);
  if (!r.ok())
    return absl::Status(r.status().code(), absl::StrCat("'", path, "': ", r.status().message()));
  return r;
}

absl::Status WriteSafetensorsFile(const std::string& path, const std::vector<RawTensor>& tensors) {
  absl::StatusOr<std::string> bytes = SerializeSafetensors(tensors);
  if (!bytes.ok()) return bytes.status();
  return util::WriteFileAtomically(path, *bytes);
}

}  // namespace fxdp::ir
