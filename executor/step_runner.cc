#include "executor/step_runner.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "analysis/ir/hyperparameters.h"
#include "executor/torch_types.h"
#include "util/status_macros.h"

namespace fxdp::executor {

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
  StepRunner r(std::move(program), std::move(state));
  for (const ProgramInput& in : r.program_.inputs()) {
    bool updated = false;
    if (in.role != ir::PlaceholderRole::kInput) {
      for (const ir::OutputSpec& o : r.program_.output_specs())
        updated |= ir::UpdatedRole(o.role).has_value() && o.state_name == in.state_name;
    }
    r.moves_.push_back(updated);
  }
  return r;
}

absl::Status StepRunner::SetHyperparameters(
    const std::vector<std::pair<std::string, double>>& values) {
  if (values.empty()) return absl::OkStatus();
  const auto& inputs = program_.inputs();
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
          at::TensorOptions().dtype(ToTorch(in.type.tensor.dtype)).device(program_.device()));
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("setting the hyper-parameters: ", ExceptionMessage(e)));
  }
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> StepRunner::Step(const TensorMap& batch) {
  if (broken_)
    return absl::FailedPreconditionError(
        "an earlier step failed after the state was handed to the graph; the state is lost");
  const auto& inputs = program_.inputs();
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
  FXDP_RETURN_IF_ERROR(program_.CheckInputs(values));
  bool handed = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!moves_[i]) continue;
    state_[inputs[i].state_name] = at::Tensor();  // the graph holds the only reference
    handed = true;
  }
  program_.SetStep(step_++);
  absl::StatusOr<std::vector<c10::IValue>> out = program_.Run(std::move(values));
  if (!out.ok()) {
    broken_ = handed;
    return out.status();
  }
  at::Tensor loss;
  other_.clear();
  const auto& specs = program_.output_specs();
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
