#include "executor/worker/checkpoint_read.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "analysis/ir/checkpoint_reader.h"
#include "analysis/ir/declared_tensors.h"
#include "analysis/ir/flat_shard.h"
#include "analysis/ir/safetensors.h"
#include "analysis/ir/type_text.h"
#include "executor/torch_types.h"
#include "util/status_macros.h"

namespace fxdp::executor {
namespace {

// The largest index file read (a Hugging Face index of 100k tensors is ~10 MB).
constexpr uint64_t kMaxIndexBytes = uint64_t{64} << 20;
const char* const kHfIndex = "model.safetensors.index.json";
const char* const kHfSingle = "model.safetensors";

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash == 0 ? 1 : slash);
}

// Checkpoint tensor name -> the file (as opened) that holds it; or for a
// checkpoint the workers wrote, its index (every tensor's parts).
struct Located {
  std::string shown;                           // the checkpoint as the job named it
  std::map<std::string, std::string> file_of;  // empty: a single file, `single`
  std::string single;
  std::optional<ir::CheckpointReader> fxdp;  // a checkpoint the workers wrote
};

// A checkpoint the workers wrote (analysis/ir/checkpoint_reader.h): its index.
absl::StatusOr<Located> ReadFxdpIndex(const std::string& path, const util::DataRoots& roots) {
  ir::SafetensorsReadOptions o;
  o.roots = &roots;
  Located out;
  FXDP_ASSIGN_OR_RETURN(out.fxdp, ir::CheckpointReader::Open(path, o));
  return out;
}

// A Hugging Face index's weight_map: its file names must be plain names in
// the index's directory (no '/', '.', '..').
absl::StatusOr<Located> ReadHfIndex(const std::string& path, const util::DataRoots& roots) {
  FXDP_ASSIGN_OR_RETURN(util::RegularFile f, roots.OpenFile(path, kMaxIndexBytes));
  std::string bytes(f.size(), '\0');
  FXDP_RETURN_IF_ERROR(f.ReadAt(0, bytes.size(), bytes.data()));
  nlohmann::json j = nlohmann::json::parse(bytes, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("index '", path, "': ", why));
  };
  if (j.is_discarded()) return bad("not JSON");
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    return bad("no \"weight_map\" object (a Hugging Face model.safetensors.index.json has one)");
  Located out;
  const std::string dir = DirOf(path);
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) return bad(absl::StrCat("weight_map['", name, "'] is not a string"));
    const std::string f = file.get<std::string>();
    if (f.empty() || f == "." || f == ".." || f.find('/') != std::string::npos ||
        f.find('\0') != std::string::npos) {
      return bad(absl::StrCat("weight_map['", name, "'] is '", f,
                              "', not a file name in the index's directory"));
    }
    out.file_of[name] = absl::StrCat(dir, "/", f);
  }
  return out;
}

// `path` as a checkpoint: an index, a safetensors file, or a directory with
// model.safetensors.index.json or model.safetensors.
absl::StatusOr<Located> Locate(const std::string& path, const util::DataRoots& roots) {
  Located out;
  const std::string fxdp_index = absl::StrCat(path, "/", ir::kCheckpointIndexName);
  if (absl::EndsWith(path, absl::StrCat("/", ir::kCheckpointIndexName)) ||
      path == ir::kCheckpointIndexName) {
    FXDP_ASSIGN_OR_RETURN(out, ReadFxdpIndex(path, roots));
  } else if (absl::EndsWith(path, ".json")) {
    FXDP_ASSIGN_OR_RETURN(out, ReadHfIndex(path, roots));
  } else if (absl::StatusOr<bool> dir = roots.IsDirectory(fxdp_index); dir.ok() && !*dir) {
    FXDP_ASSIGN_OR_RETURN(out, ReadFxdpIndex(fxdp_index, roots));
  } else if (absl::EndsWith(path, ".safetensors")) {
    out.single = path;
  } else {
    const std::string index = absl::StrCat(path, "/", kHfIndex);
    absl::StatusOr<Located> indexed = ReadHfIndex(index, roots);
    if (indexed.ok()) {
      out = *std::move(indexed);
    } else if (indexed.status().code() == absl::StatusCode::kNotFound) {
      out.single = absl::StrCat(path, "/", kHfSingle);
    } else {
      return indexed.status();
    }
  }
  out.shown = path;
  return out;
}

// One state tensor to read: where, and what the graph expects.
struct Wanted {
  std::string state_name, checkpoint_name;
  ir::DType dtype = ir::DType::kFloat32;
  std::vector<int64_t> whole_shape;
  bool sharded = false;
};

absl::StatusOr<std::vector<Wanted>> WantedTensors(const v1::CheckpointSource& source,
                                                  const RankStateLayout& layout) {
  std::vector<Wanted> out;
  std::set<std::string> states, names;
  for (const v1::CheckpointTensor& t : source.tensors()) {
    if (!states.insert(t.state_name()).second || !names.insert(t.checkpoint_name()).second) {
      return absl::InvalidArgumentError(absl::StrCat("initial_checkpoint.tensors names state '",
                                                     t.state_name(), "' or checkpoint tensor '",
                                                     t.checkpoint_name(), "' twice"));
    }
    const ir::DeclaredTensors::Tensor* d = layout.declared->Find(t.state_name());
    if (d == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "initial_checkpoint.tensors: '", t.state_name(), "' is not a state tensor of the graph"));
    }
    Wanted w{t.state_name(), t.checkpoint_name(), d->dtype, d->shape, false};
    if (auto it = layout.sharded.find(t.state_name()); it != layout.sharded.end()) {
      w.sharded = true;
      w.whole_shape.assign(it->second->shape().begin(), it->second->shape().end());
    }
    out.push_back(std::move(w));
  }
  return out;
}

// The header entry against what the graph expects: INVALID_ARGUMENT naming
// the file, the tensor and both types.
absl::Status CheckEntry(const ir::SafetensorsEntry& e, const Wanted& w, const std::string& file) {
  const bool floats = ir::DTypeIsFloatingPoint(e.dtype) && ir::DTypeIsFloatingPoint(w.dtype);
  if (e.shape == w.whole_shape && (e.dtype == w.dtype || floats)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("checkpoint file '", file, "': tensor '", e.name, "' (for the graph's '",
                   w.state_name, "') is ", ir::TypeText(e.dtype, e.shape), ", the graph expects ",
                   ir::TypeText(w.dtype, w.whole_shape),
                   e.shape == w.whole_shape ? " (only floating-point dtypes are converted)" : ""));
}

// This rank's part of one tensor: whole, or its flat shard ([s], the
// padding zero), in the graph's dtype.
absl::StatusOr<at::Tensor> ReadPart(const ir::SafetensorsReader& file,
                                    const ir::SafetensorsEntry& e, const Wanted& w,
                                    const RankStateLayout& layout, uint64_t* bytes) {
  const int64_t item = ir::DTypeItemSize(e.dtype);
  const int64_t numel = static_cast<int64_t>((e.end - e.begin) / item);
  const at::TensorOptions file_type = at::TensorOptions().dtype(ToTorch(e.dtype));
  try {
    c10::InferenceMode guard;
    if (!w.sharded) {
      at::Tensor t = at::empty(e.shape, file_type);
      if (numel > 0) FXDP_RETURN_IF_ERROR(file.Read(e.begin, e.end - e.begin, t.data_ptr()));
      *bytes += e.end - e.begin;
      return e.dtype == w.dtype ? t : t.to(ToTorch(w.dtype));
    }
    const ir::FlatShard f = ir::FlatShardOf(numel, layout.world, layout.rank);
    at::Tensor out = at::zeros({f.shard_numel}, at::TensorOptions().dtype(ToTorch(w.dtype)));
    at::Tensor real =
        e.dtype == w.dtype ? out.narrow(0, 0, f.real()) : at::empty({f.real()}, file_type);
    const uint64_t n = static_cast<uint64_t>(f.real() * item);
    if (n > 0) FXDP_RETURN_IF_ERROR(file.Read(e.begin + f.begin * item, n, real.data_ptr()));
    *bytes += n;
    if (e.dtype != w.dtype) out.narrow(0, 0, f.real()).copy_(real);
    return out;
  } catch (const std::exception& ex) {
    return absl::ResourceExhaustedError(
        absl::StrCat("reading tensor '", e.name, "': ", ExceptionMessage(ex)));
  }
}

// Every wanted tensor in one file, its header checked first.
absl::Status ReadFile(const std::string& path, const std::vector<const Wanted*>& wanted,
                      const RankStateLayout& layout, CheckpointState* out) {
  ir::SafetensorsReadOptions o;
  o.roots = layout.roots;
  FXDP_ASSIGN_OR_RETURN(ir::SafetensorsReader file, ir::SafetensorsReader::Open(path, o));
  ++out->files;
  std::map<std::string, const ir::SafetensorsEntry*> entries;
  for (const ir::SafetensorsEntry& e : file.header().tensors) entries[e.name] = &e;
  for (const Wanted* w : wanted) {
    auto it = entries.find(w->checkpoint_name);
    if (it == entries.end()) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint file '", path, "' has no tensor '",
                                                     w->checkpoint_name, "' (for the graph's '",
                                                     w->state_name, "'; it holds ",
                                                     file.header().tensors.size(), " tensors)"));
    }
    FXDP_RETURN_IF_ERROR(CheckEntry(*it->second, *w, path));
  }
  for (const Wanted* w : wanted) {
    const ir::SafetensorsEntry& e = *entries[w->checkpoint_name];
    FXDP_ASSIGN_OR_RETURN(at::Tensor t, ReadPart(file, e, *w, layout, &out->bytes_read));
    out->bytes_listed += e.end - e.begin;
    out->tensors.emplace(w->state_name, std::move(t));
  }
  return absl::OkStatus();
}

// This rank's part of one tensor of a checkpoint the workers wrote: its
// range (whole, or its flat shard's real elements), whatever world size
// wrote it, in the graph's dtype.
absl::StatusOr<at::Tensor> ReadFxdpPart(ir::CheckpointReader& reader,
                                        const ir::CheckpointTensorEntry& e, const Wanted& w,
                                        const RankStateLayout& layout) {
  const int64_t numel = e.numel();
  const ir::FlatShard f = w.sharded ? ir::FlatShardOf(numel, layout.world, layout.rank)
                                    : ir::FlatShard{numel, 0, numel};
  const at::TensorOptions graph_type = at::TensorOptions().dtype(ToTorch(w.dtype));
  at::Tensor result =
      w.sharded ? at::zeros({f.shard_numel}, graph_type) : at::empty(e.shape, graph_type);
  at::Tensor dst = result.view({-1}).narrow(0, 0, f.real());
  at::Tensor buf =
      e.dtype == w.dtype ? dst : at::empty({f.real()}, at::TensorOptions().dtype(ToTorch(e.dtype)));
  FXDP_RETURN_IF_ERROR(reader.Read(w.checkpoint_name, f.begin, f.end, buf.data_ptr()));
  if (e.dtype != w.dtype) dst.copy_(buf);
  return result;
}

// Every wanted tensor from a checkpoint the workers wrote.
absl::Status ReadFxdp(Located& where, const std::vector<Wanted>& wanted,
                      const RankStateLayout& layout, CheckpointState* out) {
  ir::CheckpointReader& reader = *where.fxdp;
  const auto& tensors = reader.index().tensors;
  for (const Wanted& w : wanted) {
    auto it = tensors.find(w.checkpoint_name);
    if (it == tensors.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", where.shown, "': its index lists no tensor '", w.checkpoint_name,
                       "' (for the graph's '", w.state_name, "'; it lists ", tensors.size(), ")"));
    }
    ir::SafetensorsEntry as_listed{w.checkpoint_name, it->second.dtype, it->second.shape, 0, 0};
    FXDP_RETURN_IF_ERROR(CheckEntry(as_listed, w, where.shown));
    try {
      c10::InferenceMode guard;
      FXDP_ASSIGN_OR_RETURN(at::Tensor t, ReadFxdpPart(reader, it->second, w, layout));
      out->bytes_listed +=
          static_cast<uint64_t>(it->second.numel() * ir::DTypeItemSize(it->second.dtype));
      out->tensors.emplace(w.state_name, std::move(t));
    } catch (const std::exception& ex) {
      return absl::ResourceExhaustedError(
          absl::StrCat("reading tensor '", w.checkpoint_name, "': ", ExceptionMessage(ex)));
    }
  }
  out->bytes_read += reader.bytes_read();
  out->files += reader.files_opened();
  return absl::OkStatus();
}

// One fill: the rank's tensor (a sharded one's real elements only) set to
// the value.
absl::StatusOr<at::Tensor> Fill(const v1::StateFill& fill, const RankStateLayout& layout) {
  const ir::DeclaredTensors::Tensor* d = layout.declared->Find(fill.state_name());
  if (d == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("initial_checkpoint.fills: '", fill.state_name(),
                                                   "' is not a state tensor of the graph"));
  }
  const std::vector<int64_t> whole(fill.shape().begin(), fill.shape().end());
  auto sharded = layout.sharded.find(fill.state_name());
  const std::vector<int64_t> expect =
      sharded == layout.sharded.end()
          ? d->shape
          : std::vector<int64_t>(sharded->second->shape().begin(), sharded->second->shape().end());
  if (whole != expect || !std::isfinite(fill.value())) {
    return absl::InvalidArgumentError(
        absl::StrCat("initial_checkpoint.fills: '", fill.state_name(), "' has shape ",
                     ir::ShapeText(whole), " and value ", fill.value(), "; the graph's shape is ",
                     ir::ShapeText(expect), " and the value must be finite"));
  }
  try {
    c10::InferenceMode guard;
    const at::TensorOptions type = at::TensorOptions().dtype(ToTorch(d->dtype));
    if (sharded == layout.sharded.end()) return at::full(d->shape, fill.value(), type);
    int64_t numel = 1;
    for (int64_t x : whole) numel *= x;
    const ir::FlatShard f = ir::FlatShardOf(numel, layout.world, layout.rank);
    at::Tensor t = at::zeros({f.shard_numel}, type);
    t.narrow(0, 0, f.real()).fill_(fill.value());
    return t;
  } catch (const std::exception& ex) {
    return absl::ResourceExhaustedError(
        absl::StrCat("creating '", fill.state_name(), "': ", ExceptionMessage(ex)));
  }
}

}  // namespace

RankStateLayout LayoutOf(const v1::AssignJob& assign, const ir::DeclaredTensors* declared,
                         const util::DataRoots* roots) {
  RankStateLayout l;
  l.declared = declared;
  for (const v1::ShardedState& s : assign.sharded_state()) l.sharded[s.state_name()] = &s;
  l.world = assign.world_size();
  l.rank = assign.rank();
  l.roots = roots;
  return l;
}

absl::StatusOr<CheckpointState> ReadCheckpointState(const v1::CheckpointSource& source,
                                                    const RankStateLayout& layout) {
  CheckpointState out;
  static const util::DataRoots kNoRoots;
  const util::DataRoots& roots = layout.roots != nullptr ? *layout.roots : kNoRoots;
  if (source.tensors_size() > 0) {
    FXDP_ASSIGN_OR_RETURN(std::vector<Wanted> wanted, WantedTensors(source, layout));
    FXDP_ASSIGN_OR_RETURN(Located where, Locate(source.path(), roots));
    if (where.fxdp) FXDP_RETURN_IF_ERROR(ReadFxdp(where, wanted, layout, &out));
    std::map<std::string, std::vector<const Wanted*>> by_file;
    for (const Wanted& w : wanted) {
      if (where.fxdp) break;
      if (where.file_of.empty()) {
        by_file[where.single].push_back(&w);
        continue;
      }
      auto it = where.file_of.find(w.checkpoint_name);
      if (it == where.file_of.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "'", where.shown, "': its index lists no tensor '", w.checkpoint_name,
            "' (for the graph's '", w.state_name, "'; it lists ", where.file_of.size(), ")"));
      }
      by_file[it->second].push_back(&w);
    }
    for (const auto& [file, ws] : by_file) FXDP_RETURN_IF_ERROR(ReadFile(file, ws, layout, &out));
  }
  for (const v1::StateFill& fill : source.fills()) {
    FXDP_ASSIGN_OR_RETURN(at::Tensor t, Fill(fill, layout));
    if (!out.tensors.emplace(fill.state_name(), std::move(t)).second) {
      return absl::InvalidArgumentError(absl::StrCat("initial_checkpoint: '", fill.state_name(),
                                                     "' is filled twice, or read and filled"));
    }
  }
  return out;
}

}  // namespace fxdp::executor
