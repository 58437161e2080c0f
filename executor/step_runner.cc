#include "executor/step_runner.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "analysis/ir/hyperparameters.h"
#include "executor/torch_types.h"
#include "util/status_macros.h"

namespace fxdp::executor {
namespace {

// A program's placeholders by state name (the first of several sharing one).
std::map<std::string, const ProgramInput*> ReadsOf(const Program& p) {
  std::map<std::string, const ProgramInput*> reads;
  for (const ProgramInput& in : p.inputs()) reads.emplace(in.state_name, &in);
  return reads;
}

// "f32[4, 3] PARAMETER (placeholder 'fc_weight')", "i64[4, 16] INPUT batch dim 0 (...)".
std::string Describe(const ProgramInput& in) {
  return absl::StrCat(
      in.type.is_tensor() ? TypeForMessage(in.type.tensor) : in.type.ToString(), " ",
      ir::PlaceholderRoleName(in.role),
      in.role == ir::PlaceholderRole::kInput ? absl::StrCat(" batch dim ", in.batch_dim) : "",
      " (placeholder '", in.node, "')");
}

// The state's placeholders alike by role, dtype and shape; the INPUTs by
// dtype, rank and batch dim (their sizes are the shape that differs).
bool SameDeclaration(const ProgramInput& a, const ProgramInput& b) {
  if (a.role != b.role || a.type.kind != b.type.kind) return false;
  if (!a.type.is_tensor()) return true;
  const ir::TensorType &x = a.type.tensor, &y = b.type.tensor;
  if (a.role == ir::PlaceholderRole::kInput)
    return x.dtype == y.dtype && x.rank() == y.rank() && a.batch_dim == b.batch_dim;
  return x.dtype == y.dtype && x.shape == y.shape;
}

// `next` reads and updates the state as `first` does, takes the same batch
// tensors and returns the same outputs (AddProgram).
absl::Status CheckSameState(const Program& first, const Program& next) {
  const auto a = ReadsOf(first), b = ReadsOf(next);
  for (const auto& [name, in] : a) {
    auto it = b.find(name);
    if (it == b.end())
      return absl::InvalidArgumentError(absl::StrCat("'", name, "': program 0 declares ",
                                                     Describe(*in),
                                                     ", this one has no such placeholder"));
    if (!SameDeclaration(*in, *it->second))
      return absl::InvalidArgumentError(absl::StrCat("'", name, "': program 0 declares ",
                                                     Describe(*in), ", this one ",
                                                     Describe(*it->second)));
  }
  for (const auto& [name, in] : b) {
    if (a.count(name) == 0)
      return absl::InvalidArgumentError(
          absl::StrCat("'", name, "': this one declares ", Describe(*in),
                       ", program 0 has no such placeholder (it has ", a.size(), ")"));
  }
  // The same outputs in the same order (so the same state updated): the
  // loss, the named metrics and the local loss are read from program 0's
  // positions (NamedOutputs, LocalLossIndex).
  const auto &oa = first.output_specs(), &ob = next.output_specs();
  for (size_t i = 0; i < std::max(oa.size(), ob.size()); ++i) {
    auto text = [](const std::vector<ir::OutputSpec>& o, size_t i) {
      return i < o.size() ? absl::StrCat(ir::OutputRoleName(o[i].role), " '", o[i].state_name, "'")
                          : std::string("none");
    };
    if (i >= oa.size() || i >= ob.size() || oa[i].role != ob[i].role ||
        oa[i].state_name != ob[i].state_name)
      return absl::InvalidArgumentError(absl::StrCat("output ", i, ": program 0's is ", text(oa, i),
                                                     ", this one's ", text(ob, i)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<StepRunner> StepRunner::Create(Program program, TensorMap state) {
  std::vector<std::string> missing;
  const auto& inputs = program.inputs();
  for (const ProgramInput& in : inputs) {
    if (in.role == ir::PlaceholderRole::kInput) continue;
    auto it = state.find(in.state_name);
    if (it == state.end()) {
      missing.push_back(absl::StrCat("'", in.state_name, "'"));
      continue;
    }
    if (in.type.is_tensor() && !Fits(it->second, in.type.tensor))
      return absl::InvalidArgumentError(
          absl::StrCat("state '", in.state_name, "' is ", DescribeTorchTensor(it->second),
                       ", placeholder '", in.node, "' expects ", TypeForMessage(in.type.tensor)));
  }
  if (!missing.empty())
    return absl::NotFoundError(
        absl::StrCat("the state lacks ", absl::StrJoin(missing, ", "), " (read by the graph)"));
  try {
    for (const ProgramInput& in : inputs) {
      if (in.role == ir::PlaceholderRole::kInput) continue;
      at::Tensor& t = state[in.state_name];
      if (t.device() != program.device()) t = t.to(program.device());
    }
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("moving the state to ", program.device().str(), ": ", ExceptionMessage(e)));
  }
  StepRunner r(std::move(state));
  r.programs_.emplace(0, Prepare(std::move(program)));
  return r;
}

StepRunner::Loaded StepRunner::Prepare(Program program) {
  Loaded l{std::move(program), {}};
  for (const ProgramInput& in : l.program.inputs()) {
    bool updated = false;
    if (in.role != ir::PlaceholderRole::kInput) {
      for (const ir::OutputSpec& o : l.program.output_specs())
        updated |= ir::UpdatedRole(o.role).has_value() && o.state_name == in.state_name;
    }
    l.moves.push_back(updated);
  }
  return l;
}

absl::Status StepRunner::AddProgram(uint32_t id, Program program) {
  if (id == 0 || programs_.count(id) > 0)
    return absl::InvalidArgumentError(
        absl::StrCat("program ", id, id == 0 ? " is the first one" : " is already held",
                     " (held: ", ProgramIds(), ")"));
  FXDP_RETURN_IF_ERROR(CheckSameState(this->program(), program));
  if (program.device() != this->program().device())
    return absl::InvalidArgumentError(absl::StrCat(
        "it runs on ", program.device().str(), ", program 0 on ", this->program().device().str()));
  programs_.emplace(id, Prepare(std::move(program)));
  return absl::OkStatus();
}

absl::Status StepRunner::DropProgram(uint32_t id) {
  if (id == 0 || programs_.erase(id) == 0)
    return absl::InvalidArgumentError(
        absl::StrCat("program ", id, " is not one that can be dropped (held: ", ProgramIds(),
                     id == 0 ? "; program 0 stays" : "", ")"));
  return absl::OkStatus();
}

Program* StepRunner::FindProgram(uint32_t id) {
  auto it = programs_.find(id);
  return it == programs_.end() ? nullptr : &it->second.program;
}

std::string StepRunner::ProgramIds() const {
  std::vector<uint32_t> ids;
  for (const auto& [id, l] : programs_) ids.push_back(id);
  return absl::StrJoin(ids, ", ");
}

absl::Status StepRunner::SetHyperparameters(
    const std::vector<std::pair<std::string, double>>& values) {
  if (values.empty()) return absl::OkStatus();
  const Program& prog = program();
  const auto& inputs = prog.inputs();
  std::vector<const ProgramInput*> targets;
  for (const auto& [name, value] : values) {
    const ProgramInput* found = nullptr;
    for (const ProgramInput& in : inputs) {
      if (in.state_name == name && in.role == ir::PlaceholderRole::kHyperparameter) found = &in;
    }
    if (found == nullptr) {
      ir::PlaceholderNames names;
      for (const ProgramInput& in : inputs)
        names.entries.push_back(
            {in.state_name, in.role == ir::PlaceholderRole::kHyperparameter, in.node});
      return names.Check({name}, "hyper-parameter values");
    }
    targets.push_back(found);
  }
  try {
    for (size_t i = 0; i < values.size(); ++i) {
      const ProgramInput& in = *targets[i];
      state_[in.state_name] = at::scalar_tensor(
          values[i].second,
          at::TensorOptions().dtype(ToTorch(in.type.tensor.dtype)).device(prog.device()));
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("setting the hyper-parameters: ", ExceptionMessage(e)));
  }
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> StepRunner::Step(const TensorMap& batch, uint32_t program_id) {
  if (broken_)
    return absl::FailedPreconditionError(
        "an earlier step failed after the state was handed to the graph; the state is lost");
  auto loaded = programs_.find(program_id);
  if (loaded == programs_.end())
    return absl::InvalidArgumentError(
        absl::StrCat("program ", program_id, " is not held (held: ", ProgramIds(), ")"));
  Program& prog = loaded->second.program;
  const std::vector<bool>& moves = loaded->second.moves;
  const auto& inputs = prog.inputs();
  std::vector<c10::IValue> values;
  values.reserve(inputs.size());
  for (const ProgramInput& in : inputs) {
    if (in.role == ir::PlaceholderRole::kInput) {
      auto it = batch.find(in.state_name);
      if (it == batch.end()) {
        std::vector<std::string> have;
        for (const auto& [k, v] : batch) have.push_back(k);
        return absl::NotFoundError(absl::StrCat("the batch has no tensor '", in.state_name,
                                                "' (INPUT placeholder '", in.node,
                                                "'); it has: ", absl::StrJoin(have, ", ")));
      }
      values.emplace_back(it->second);
    } else {
      values.emplace_back(state_.at(in.state_name));
    }
  }
  FXDP_RETURN_IF_ERROR(prog.CheckInputs(values));
  bool handed = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!moves[i]) continue;
    state_[inputs[i].state_name] = at::Tensor();  // the graph holds the only reference
    handed = true;
  }
  prog.SetStep(step_++);
  absl::StatusOr<std::vector<c10::IValue>> out = prog.Run(std::move(values));
  if (!out.ok()) {
    broken_ = handed;
    return out.status();
  }
  at::Tensor loss;
  other_.clear();
  const auto& specs = prog.output_specs();
  for (size_t i = 0; i < specs.size() && i < out->size(); ++i) {
    c10::IValue& v = (*out)[i];
    if (ir::UpdatedRole(specs[i].role).has_value()) {
      if (!v.isTensor()) {
        broken_ = true;
        return absl::InternalError(absl::StrCat("output ", i, " updates state '",
                                                specs[i].state_name, "' but is ", v.tagKind()));
      }
      state_[specs[i].state_name] = std::move(v).toTensor();
    } else if (specs[i].role == ir::OutputRole::kLoss) {
      if (v.isTensor()) loss = std::move(v).toTensor();
    } else {
      other_.push_back(std::move(v));
    }
  }
  return loss;
}

}  // namespace fxdp::executor
