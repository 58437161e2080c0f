#include "executor/safetensors.h"

#include <ATen/ATen.h>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "analysis/ir/flat_shard.h"
#include "analysis/ir/safetensors.h"
#include "executor/torch_types.h"
#include "util/files.h"
#include "util/status_macros.h"

namespace fxdp::executor {

absl::StatusOr<SafetensorsFile> ParseSafetensors(absl::string_view bytes) {
  absl::StatusOr<ir::SafetensorsView> view = ir::ParseSafetensors(bytes);
  if (!view.ok()) return view.status();
  SafetensorsFile out;
  out.metadata = std::move(view->metadata);
  try {
    for (const ir::SafetensorsEntry& e : view->tensors) {
      at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(ToTorch(e.dtype)));
      if (e.end > e.begin) std::memcpy(t.data_ptr(), view->data.data() + e.begin, e.end - e.begin);
      out.tensors.emplace(e.name, std::move(t));
    }
  } catch (const std::exception& ex) {
    return absl::ResourceExhaustedError(absl::StrCat("allocating tensors: ", ExceptionMessage(ex)));
  }
  return out;
}

absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path,
                                                const SafetensorsReadOptions& options,
                                                FlatShardRead* shards) {
  FXDP_ASSIGN_OR_RETURN(ir::SafetensorsReader file, ir::SafetensorsReader::Open(path, options));
  return ReadTensors(file, path, nullptr, shards);
}

absl::StatusOr<SafetensorsFile> ReadTensors(const ir::SafetensorsReader& file,
                                            const std::string& path,
                                            const std::set<std::string>* only,
                                            FlatShardRead* shards) {
  SafetensorsFile out;
  out.metadata = file.header().metadata;
  for (const ir::SafetensorsEntry& e : file.header().tensors) {
    if (only != nullptr && only->count(e.name) == 0) continue;  // never read
    const at::TensorOptions dtype = at::TensorOptions().dtype(ToTorch(e.dtype));
    const int64_t item = ir::DTypeItemSize(e.dtype);
    at::Tensor t;
    uint64_t begin = e.begin, bytes = e.end - e.begin;
    try {
      if (shards != nullptr && shards->names.count(e.name) > 0) {
        const int64_t numel = static_cast<int64_t>((e.end - e.begin) / item);
        const ir::FlatShard f = ir::FlatShardOf(numel, shards->world, shards->rank);
        t = at::zeros({f.shard_numel}, dtype);  // the padding stays zero
        begin += static_cast<uint64_t>(f.begin * item);
        bytes = static_cast<uint64_t>(f.real() * item);
        shards->full_shapes[e.name] = e.shape;
      } else {
        t = at::empty(e.shape, dtype);
      }
    } catch (const std::exception& ex) {
      return absl::ResourceExhaustedError(
          absl::StrCat("'", path, "': allocating tensor '", e.name, "': ", ExceptionMessage(ex)));
    }
    if (bytes > 0) FXDP_RETURN_IF_ERROR(file.Read(begin, bytes, t.data_ptr()));
    out.tensors.emplace(e.name, std::move(t));
  }
  return out;
}

absl::StatusOr<std::string> SerializeSafetensors(
    const std::map<std::string, at::Tensor>& tensors,
    const std::map<std::string, std::string>& metadata) {
  std::vector<at::Tensor> cpu;  // keeps the bytes the views point into
  std::vector<ir::TensorBytes> views;
  cpu.reserve(tensors.size());
  try {
    for (const auto& [name, t] : tensors) {
      if (name == "__metadata__")
        return absl::InvalidArgumentError("a tensor cannot be named __metadata__");
      if (!t.defined())
        return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' is undefined"));
      absl::StatusOr<ir::DType> dt = FromTorch(t.scalar_type());
      if (!dt.ok())
        return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': dtype ",
                                                       c10::toString(t.scalar_type()),
                                                       " has no safetensors name"));
      at::Tensor c = t.to(at::kCPU).contiguous();
      const size_t nbytes = c.numel() * c.element_size();
      views.push_back(ir::TensorBytes{
          name, *dt, c.sizes().vec(),
          absl::string_view(nbytes > 0 ? static_cast<const char*>(c.const_data_ptr()) : "",
                            nbytes)});
      cpu.push_back(std::move(c));
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("copying tensors to the CPU: ", ExceptionMessage(e)));
  }
  return ir::SerializeSafetensors(std::move(views), metadata);
}

absl::Status WriteSafetensors(const std::string& path,
                              const std::map<std::string, at::Tensor>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  auto bytes = SerializeSafetensors(tensors, metadata);
  if (!bytes.ok()) return bytes.status();
  return util::WriteFileAtomically(path, *bytes);
}

}  // namespace fxdp::executor
