#include "analysis/ir/checkpoint_index.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "analysis/ir/flat_shard.h"
#include "analysis/ir/safetensors.h"

namespace fxdp::ir {
namespace {

constexpr int kMaxWorld = 1 << 16;
constexpr int64_t kMaxNumel = int64_t{1} << 48;

int64_t NumelOf(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool PlainName(const std::string& f) {
  return !f.empty() && f != "." && f != ".." && f.find('/') == std::string::npos &&
         f.find('\0') == std::string::npos;
}

// One tensor's entry of the JSON, checked.
absl::StatusOr<CheckpointTensorEntry> ParseEntry(const nlohmann::json& j, const std::string& name,
                                                 size_t files) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': ", why));
  };
  if (!j.is_object() || !j.contains("dtype") || !j["dtype"].is_string() || !j.contains("shape") ||
      !j["shape"].is_array() || !j.contains("parts") || !j["parts"].is_array()) {
    return bad("needs \"dtype\" (a string), \"shape\" and \"parts\" (arrays)");
  }
  CheckpointTensorEntry e;
  absl::StatusOr<DType> dt = DTypeFromSafetensorsName(j["dtype"].get<std::string>());
  if (!dt.ok()) return bad(std::string(dt.status().message()));
  e.dtype = *dt;
  if (j.contains("role") && j["role"].is_string()) e.role = j["role"].get<std::string>();
  if (j.contains("persistent")) {
    if (!j["persistent"].is_boolean())
      return bad(absl::StrCat("\"persistent\" is ", j["persistent"].dump(), ", not true or false"));
    e.persistent = j["persistent"].get<bool>();
  }
  int64_t numel = 1;
  for (const auto& d : j["shape"]) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0 || e.shape.size() >= 64)
      return bad("its shape is not a list of at most 64 sizes >= 0");
    e.shape.push_back(d.get<int64_t>());
    if (e.shape.back() > 0 && numel > kMaxNumel / e.shape.back())
      return bad(absl::StrCat("more than ", kMaxNumel, " elements"));
    numel *= e.shape.back();
  }
  int64_t at = 0;
  for (const auto& p : j["parts"]) {
    if (!p.is_array() || p.size() != 3 || !p[0].is_number_integer() || !p[1].is_number_integer() ||
        !p[2].is_number_integer()) {
      return bad("a part is not [file, begin, end]");
    }
    CheckpointPart part{p[0].get<int>(), p[1].get<int64_t>(), p[2].get<int64_t>()};
    if (part.file < 0 || static_cast<size_t>(part.file) >= files || part.begin != at ||
        part.end <= part.begin || part.end > numel) {
      return bad(absl::StrCat("part [", part.file, ", ", part.begin, ", ", part.end,
                              "] does not follow element ", at, " of ", numel, " in one of the ",
                              files, " files"));
    }
    at = part.end;
    e.parts.push_back(part);
  }
  if (at != numel) return bad(absl::StrCat("its parts hold ", at, " of its ", numel, " elements"));
  return e;
}

}  // namespace

std::string CheckpointStepDir(int64_t step) { return absl::StrCat("step-", step); }

std::string CheckpointRankFile(int rank, int world) {
  return absl::StrCat("rank-", rank, "-of-", world, ".safetensors");
}

std::string JoinCheckpointPath(const std::string& dir, const std::string& name) {
  return !dir.empty() && dir.back() == '/' ? absl::StrCat(dir, name) : absl::StrCat(dir, "/", name);
}

int64_t CheckpointTensorEntry::numel() const { return NumelOf(shape); }

CheckpointIndex PlanCheckpoint(const std::map<std::string, CheckpointStateTensor>& state, int world,
                               int64_t step, const std::string& style) {
  CheckpointIndex out;
  out.step = step;
  out.world_size = world;
  out.style = style;
  for (int r = 0; r < world; ++r) out.files.push_back(CheckpointRankFile(r, world));
  int whole = 0;  // the tensors held whole so far, in name order
  for (const auto& [name, t] : state) {
    CheckpointTensorEntry e{t.dtype, t.shape, t.role, {}, t.persistent};
    const int64_t numel = NumelOf(t.shape);
    if (t.sharded) {
      for (int r = 0; r < world; ++r) {
        const FlatShard f = FlatShardOf(numel, world, r);
        if (f.real() > 0) e.parts.push_back({r, f.begin, f.end});
      }
    } else {
      if (numel > 0) e.parts.push_back({whole % world, 0, numel});
      ++whole;
    }
    out.tensors.emplace(name, std::move(e));
  }
  return out;
}

std::string CheckpointIndexJson(const CheckpointIndex& index) {
  nlohmann::ordered_json j;
  j["format"] = "fxdp-checkpoint";
  j["version"] = 1;
  j["step"] = index.step;
  j["world_size"] = index.world_size;
  j["style"] = index.style;
  j["files"] = index.files;
  nlohmann::ordered_json tensors = nlohmann::ordered_json::object();
  for (const auto& [name, e] : index.tensors) {
    nlohmann::ordered_json t;
    t["dtype"] = std::string(DTypeSafetensorsName(e.dtype));
    t["shape"] = e.shape;
    t["role"] = e.role;
    if (!e.persistent) t["persistent"] = false;
    nlohmann::ordered_json parts = nlohmann::ordered_json::array();
    for (const CheckpointPart& p : e.parts) parts.push_back({p.file, p.begin, p.end});
    t["parts"] = std::move(parts);
    tensors[name] = std::move(t);
  }
  j["tensors"] = std::move(tensors);
  return j.dump(1);
}

absl::StatusOr<CheckpointIndex> ParseCheckpointIndex(absl::string_view json,
                                                     const std::string& path) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint index '", path, "': ", why));
  };
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad("not JSON");
  if (!j.is_object() || j.value("format", "") != "fxdp-checkpoint" || !j.contains("version") ||
      j["version"] != 1) {
    return bad("not an fxdp checkpoint index (\"format\": \"fxdp-checkpoint\", \"version\": 1)");
  }
  CheckpointIndex out;
  if (!j.contains("step") || !j["step"].is_number_integer() || !j.contains("world_size") ||
      !j["world_size"].is_number_integer() || !j.contains("files") || !j["files"].is_array() ||
      !j.contains("tensors") || !j["tensors"].is_object()) {
    return bad("needs \"step\", \"world_size\", \"files\" and \"tensors\"");
  }
  out.step = j["step"].get<int64_t>();
  const int64_t world = j["world_size"].get<int64_t>();
  if (world < 1 || world > kMaxWorld || j["files"].size() != static_cast<size_t>(world))
    return bad(absl::StrCat("world_size ", world, " with ", j["files"].size(), " files"));
  out.world_size = static_cast<int>(world);
  out.style = j.value("style", "");
  for (const auto& f : j["files"]) {
    if (!f.is_string() || !PlainName(f.get<std::string>()))
      return bad(absl::StrCat("files has ", f.dump(), ", not a file name in its directory"));
    out.files.push_back(f.get<std::string>());
  }
  for (const auto& [name, t] : j["tensors"].items()) {
    absl::StatusOr<CheckpointTensorEntry> e = ParseEntry(t, name, out.files.size());
    if (!e.ok()) return bad(std::string(e.status().message()));
    out.tensors.emplace(name, *std::move(e));
  }
  return out;
}

}  // namespace fxdp::ir
