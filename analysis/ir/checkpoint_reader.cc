#include "analysis/ir/checkpoint_reader.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "util/data_roots.h"
#include "util/files.h"

namespace fxdp::ir {

absl::StatusOr<CheckpointReader> CheckpointReader::Open(const std::string& path,
                                                        const SafetensorsReadOptions& options) {
  absl::StatusOr<util::RegularFile> f =
      options.roots != nullptr ? options.roots->OpenFile(path, kMaxCheckpointIndexBytes)
                               : util::RegularFile::Open(path, kMaxCheckpointIndexBytes);
  if (!f.ok()) return f.status();
  std::string bytes(f->size(), '\0');
  if (absl::Status s = f->ReadAt(0, bytes.size(), bytes.data()); !s.ok()) return s;
  absl::StatusOr<CheckpointIndex> index = ParseCheckpointIndex(bytes, path);
  if (!index.ok()) return index.status();
  const size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : path.substr(0, slash == 0 ? 1 : slash);
  return CheckpointReader(*std::move(index), path, std::move(dir), options);
}

absl::Status CheckpointReader::Read(const std::string& name, int64_t begin, int64_t end,
                                    void* dest) {
  auto t = index_.tensors.find(name);
  if (t == index_.tensors.end()) {
    return absl::InvalidArgumentError(absl::StrCat("'", path_, "': its index lists no tensor '",
                                                   name, "' (it lists ", index_.tensors.size(),
                                                   ")"));
  }
  const CheckpointTensorEntry& e = t->second;
  const int64_t item = DTypeItemSize(e.dtype);
  if (begin < 0 || end < begin || end > e.numel()) {
    return absl::InvalidArgumentError(absl::StrCat("'", path_, "': elements [", begin, ", ", end,
                                                   ") of '", name, "', which has ", e.numel()));
  }
  for (const CheckpointPart& p : e.parts) {
    const int64_t a = std::max(begin, p.begin), b = std::min(end, p.end);
    if (a >= b) continue;
    const std::string file = JoinCheckpointPath(dir_, index_.files[p.file]);
    auto it = files_.find(p.file);
    if (it == files_.end()) {
      absl::StatusOr<SafetensorsReader> r = SafetensorsReader::Open(file, options_);
      if (!r.ok()) return r.status();
      it = files_.emplace(p.file, *std::move(r)).first;
    }
    const SafetensorsEntry* entry = nullptr;
    for (const SafetensorsEntry& x : it->second.header().tensors)
      if (x.name == name) entry = &x;
    if (entry == nullptr || entry->dtype != e.dtype ||
        entry->end - entry->begin != static_cast<uint64_t>((p.end - p.begin) * item)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint file '", file, "' does not hold elements [", p.begin, ", ", p.end, ") of '",
          name, "' as ", DTypeTorchName(e.dtype), " (its index '", path_, "' says it does)"));
    }
    const uint64_t n = static_cast<uint64_t>((b - a) * item);
    if (absl::Status s = it->second.Read(entry->begin + (a - p.begin) * item, n,
                                         static_cast<char*>(dest) + (a - begin) * item);
        !s.ok())
      return s;
    bytes_read_ += n;
  }
  return absl::OkStatus();
}

}  // namespace fxdp::ir
