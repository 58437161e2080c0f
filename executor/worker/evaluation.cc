#include "executor/worker/evaluation.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "absl/strings/str_cat.h"
#include "executor/torch_types.h"
#include "executor/worker/common.h"

namespace fxdp::executor {

absl::StatusOr<std::vector<c10::IValue>> Evaluation::Inputs(const TensorMap& state,
                                                            const TensorMap& batch,
                                                            int64_t b) const {
  std::vector<c10::IValue> values;
  values.reserve(program_.inputs().size());
  for (const ProgramInput& in : program_.inputs()) {
    const bool input = in.role == ir::PlaceholderRole::kInput;
    const TensorMap& from = input ? batch : state;
    auto it = from.find(in.state_name);
    if (it == from.end() || !it->second.defined()) {
      return input ? absl::InvalidArgumentError(absl::StrCat(
                         "evaluation batch ", b + 1, " has no tensor '", in.state_name, "'"))
                   : absl::FailedPreconditionError(
                         absl::StrCat("the evaluation graph reads state '", in.state_name,
                                      "', which this rank's training state does not hold"));
    }
    values.emplace_back(it->second);
  }
  return values;
}

absl::StatusOr<std::vector<std::pair<std::string, double>>> Evaluation::Run(
    const TensorMap& state) {
  std::vector<std::pair<std::string, double>> sums;
  const auto& specs = program_.output_specs();
  for (int64_t b = 0; b < num_batches(); ++b) {
    absl::StatusOr<TensorMap> read;
    if (dataset_) read = dataset_->ReadStep(b + 1, program_);
    if (dataset_ && !read.ok()) return read.status();
    const TensorMap& batch = dataset_ ? *read : files_[static_cast<size_t>(b)];
    absl::StatusOr<std::vector<c10::IValue>> values = Inputs(state, batch, b);
    if (!values.ok()) return values.status();
    if (absl::Status s = program_.CheckInputs(*values); !s.ok())
      return absl::Status(s.code(), absl::StrCat("evaluation batch ", b + 1, ": ", s.message()));
    program_.SetStep(1);  // an evaluation graph draws nothing (model.eval())
    absl::StatusOr<std::vector<c10::IValue>> out = program_.Run(*std::move(values));
    if (!out.ok())
      return absl::Status(out.status().code(),
                          absl::StrCat("evaluation batch ", b + 1, ": ", out.status().message()));
    std::vector<std::pair<std::string, double>> got;
    std::vector<c10::IValue> other;
    try {
      for (size_t i = 0; i < specs.size() && i < out->size(); ++i) {
        if (specs[i].role == ir::OutputRole::kLoss && (*out)[i].isTensor())
          got.emplace_back("loss", LossValue((*out)[i].toTensor()));
        else if (specs[i].role == ir::OutputRole::kOther)
          other.push_back(std::move((*out)[i]));
      }
      for (auto& named : names_.Values(other)) got.push_back(std::move(named));
    } catch (const std::exception& e) {
      return absl::InternalError(
          absl::StrCat("reading evaluation batch ", b + 1, "'s metrics: ", ExceptionMessage(e)));
    }
    if (b == 0) {
      sums = std::move(got);
      continue;
    }
    for (size_t k = 0; k < sums.size() && k < got.size(); ++k) sums[k].second += got[k].second;
  }
  return sums;
}

}  // namespace fxdp::executor
