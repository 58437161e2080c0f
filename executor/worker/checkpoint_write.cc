#include "executor/worker/checkpoint_write.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "analysis/ir/checkpoint_index.h"
#include "analysis/ir/declared_tensors.h"
#include "analysis/ir/safetensors.h"
#include "analysis/ir/type_text.h"
#include "executor/torch_types.h"
#include "util/status_macros.h"

namespace fxdp::executor {
namespace {

const util::DataRoots& RootsOf(const RankStateLayout& layout) {
  static const util::DataRoots kNoRoots;
  return layout.roots != nullptr ? *layout.roots : kNoRoots;
}

// Every state tensor of the job as the index lists it: whole shapes.
std::map<std::string, ir::CheckpointStateTensor> IndexedState(
    const RankStateLayout& layout, const std::map<std::string, std::string>& roles,
    const std::set<std::string>& non_persistent) {
  std::map<std::string, ir::CheckpointStateTensor> out;
  for (const std::string& name : layout.declared->names()) {
    const ir::DeclaredTensors::Tensor* d = layout.declared->Find(name);
    ir::CheckpointStateTensor t{d->dtype, d->shape, "", false};
    if (auto r = roles.find(name); r != roles.end()) t.role = r->second;
    t.persistent = !(t.role == "BUFFER" && non_persistent.count(name) > 0);
    if (auto s = layout.sharded.find(name); s != layout.sharded.end()) {
      t.sharded = true;
      t.shape.assign(s->second->shape().begin(), s->second->shape().end());
    }
    out.emplace(name, std::move(t));
  }
  return out;
}

// The rank's tensors of `index`, on the CPU and contiguous (`keep` holds
// them), as views of their bytes.
absl::StatusOr<std::vector<ir::TensorBytes>> RankTensors(const ir::CheckpointIndex& index,
                                                         const RankStateLayout& layout,
                                                         const TensorMap& state,
                                                         std::vector<at::Tensor>* keep) {
  std::vector<ir::TensorBytes> out;
  for (const auto& [name, e] : index.tensors) {
    for (const ir::CheckpointPart& p : e.parts) {
      if (p.file != layout.rank) continue;
      auto it = state.find(name);
      if (it == state.end())
        return absl::InternalError(absl::StrCat("the rank holds no state tensor '", name, "'"));
      const bool sharded = layout.sharded.count(name) > 0;
      const int64_t n = p.end - p.begin;
      try {
        c10::InferenceMode guard;
        // A flat shard starts at the part's first element (FlatShardOf).
        at::Tensor t =
            (sharded ? it->second.narrow(0, 0, n) : it->second).to(at::kCPU).contiguous();
        absl::StatusOr<ir::DType> dt = FromTorch(t.scalar_type());
        if (!dt.ok() || *dt != e.dtype || t.numel() != n) {
          return absl::InternalError(absl::StrCat("state tensor '", name, "' holds ", t.numel(),
                                                  " elements of ", c10::toString(t.scalar_type()),
                                                  ", its part of the checkpoint is ", n, " of ",
                                                  ir::DTypeTorchName(e.dtype)));
        }
        const size_t bytes = static_cast<size_t>(n) * t.element_size();
        out.push_back(ir::TensorBytes{
            name, e.dtype, sharded ? std::vector<int64_t>{n} : e.shape,
            absl::string_view(bytes > 0 ? static_cast<const char*>(t.const_data_ptr()) : "",
                              bytes)});
        keep->push_back(std::move(t));
      } catch (const std::exception& ex) {
        return absl::ResourceExhaustedError(
            absl::StrCat("copying '", name, "' to the CPU: ", ExceptionMessage(ex)));
      }
    }
  }
  return out;
}

// `pieces` into the new file `path`, not committed yet.
absl::StatusOr<util::NewFile> WriteNew(const util::DataRoots& roots, const std::string& path,
                                       const std::vector<absl::string_view>& pieces) {
  uint64_t total = 0;
  for (absl::string_view p : pieces) total += p.size();
  FXDP_ASSIGN_OR_RETURN(util::NewFile f, roots.CreateFile(path, total));
  for (absl::string_view p : pieces) FXDP_RETURN_IF_ERROR(f.Write(p));
  return f;
}

}  // namespace

std::set<std::string> NonPersistentBuffers(const ir::Graph& graph) {
  std::set<std::string> out;
  for (const auto& [k, v] : graph.header().metadata)
    if (k == ir::kNonPersistentBuffersKey && !v.empty()) out = absl::StrSplit(v, '\n');
  return out;
}

bool CheckpointDue(const v1::CheckpointPolicy& policy, int64_t step, bool last) {
  return last || (policy.every() > 0 && step % policy.every() == 0);
}

absl::StatusOr<WrittenPart> WriteCheckpointPart(const v1::CheckpointPolicy& policy, int64_t step,
                                                const RankStateLayout& layout,
                                                const TensorMap& state,
                                                const std::map<std::string, std::string>& roles,
                                                const std::set<std::string>& non_persistent) {
  const ir::CheckpointIndex index =
      ir::PlanCheckpoint(IndexedState(layout, roles, non_persistent), layout.world, step,
                         layout.sharded.empty() ? "replicate" : "fully_shard");
  WrittenPart out;
  out.dir = ir::JoinCheckpointPath(policy.dir(), ir::CheckpointStepDir(step));
  std::vector<at::Tensor> keep;
  FXDP_ASSIGN_OR_RETURN(std::vector<ir::TensorBytes> tensors,
                        RankTensors(index, layout, state, &keep));
  uint64_t data = 0;
  const std::map<std::string, std::string> meta = {{"format", "fxdp-checkpoint"},
                                                   {"step", absl::StrCat(step)},
                                                   {"rank", absl::StrCat(layout.rank)},
                                                   {"world_size", absl::StrCat(layout.world)}};
  FXDP_ASSIGN_OR_RETURN(std::string header, ir::SafetensorsHeader(&tensors, meta, &data));
  std::vector<absl::string_view> pieces = {header};
  for (const ir::TensorBytes& t : tensors) pieces.push_back(t.data);
  const util::DataRoots& roots = RootsOf(layout);
  FXDP_ASSIGN_OR_RETURN(
      util::NewFile file,
      WriteNew(roots, ir::JoinCheckpointPath(out.dir, index.files[layout.rank]), pieces));
  FXDP_RETURN_IF_ERROR(file.Commit());
  out.bytes = header.size() + data;
  if (layout.rank == 0) {
    const std::string json = ir::CheckpointIndexJson(index);
    FXDP_ASSIGN_OR_RETURN(
        out.index,
        WriteNew(roots, ir::JoinCheckpointPath(out.dir, ir::kCheckpointIndexName), {json}));
    out.bytes += json.size();
  }
  return out;
}

absl::Status RemoveCheckpointPart(const v1::CheckpointPolicy& policy, int64_t step,
                                  const RankStateLayout& layout, bool directory) {
  const util::DataRoots& roots = RootsOf(layout);
  const std::string dir = ir::JoinCheckpointPath(policy.dir(), ir::CheckpointStepDir(step));
  auto gone = [](const absl::Status& s) {
    return s.ok() || s.code() == absl::StatusCode::kNotFound ? absl::OkStatus() : s;
  };
  if (layout.rank == 0)
    FXDP_RETURN_IF_ERROR(
        gone(roots.Remove(ir::JoinCheckpointPath(dir, ir::kCheckpointIndexName), false)));
  FXDP_RETURN_IF_ERROR(gone(roots.Remove(
      ir::JoinCheckpointPath(dir, ir::CheckpointRankFile(layout.rank, layout.world)), false)));
  if (!directory) return absl::OkStatus();
  // The last rank to get here removes the directory; the others find files in it.
  const absl::Status s = roots.Remove(dir, true);
  return s.code() == absl::StatusCode::kFailedPrecondition ? absl::OkStatus() : gone(s);
}

}  // namespace fxdp::executor
