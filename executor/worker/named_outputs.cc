#include "executor/worker/named_outputs.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace fxdp::executor {

absl::StatusOr<NamedOutputs> NamedOutputs::Of(const ir::Graph& graph,
                                              const std::vector<ir::OutputSpec>& output_specs) {
  NamedOutputs out;
  const std::string* text = nullptr;
  for (const auto& [k, v] : graph.header().metadata)
    if (k == kExtraOutputsKey) text = &v;
  if (text == nullptr) return out;
  size_t others = 0;
  for (const ir::OutputSpec& s : output_specs)
    if (s.role == ir::OutputRole::kOther && s.state_name != "local_loss") ++others;
  const std::string where = absl::StrCat("graph metadata '", kExtraOutputsKey, "'");
  // Never nlohmann's message (it may quote the text): what is wrong, in our words.
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_array())
    return absl::InvalidArgumentError(
        absl::StrCat(where, " (", text->size(), " bytes) is not a JSON list of output names"));
  if (j.size() > others)
    return absl::InvalidArgumentError(absl::StrCat(where, " names ", j.size(),
                                                   " outputs; the graph has ", others,
                                                   " OTHER outputs besides local_loss"));
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_string())
      return absl::InvalidArgumentError(absl::StrCat(where, " entry ", i, " is not a string"));
    std::string name = j[i].get<std::string>();
    if (name.empty() || name.size() > kMaxOutputNameBytes)
      return absl::InvalidArgumentError(absl::StrCat(where, " entry ", i, " is ", name.size(),
                                                     " bytes; a name has 1 to ",
                                                     kMaxOutputNameBytes));
    for (unsigned char c : name)
      if (c < 0x20 || c == 0x7f)
        return absl::InvalidArgumentError(
            absl::StrCat(where, " entry ", i, " holds control character ", static_cast<int>(c)));
    out.names_.push_back(std::move(name));
  }
  return out;
}

std::vector<std::pair<std::string, double>> NamedOutputs::Values(
    const std::vector<c10::IValue>& other) const {
  std::vector<std::pair<std::string, double>> out;
  c10::InferenceMode guard;
  for (size_t k = 0; k < names_.size() && k < other.size(); ++k) {
    if (!other[k].isTensor()) continue;
    const at::Tensor& t = other[k].toTensor();
    if (!t.defined() || t.dim() != 0) continue;
    out.emplace_back(names_[k], t.to(at::kCPU).to(at::kDouble).item<double>());
  }
  return out;
}

void AddNamedValues(const std::vector<std::pair<std::string, double>>& values,
                    google::protobuf::RepeatedPtrField<v1::NamedValue>* out) {
  for (const auto& [name, value] : values) {
    v1::NamedValue* v = out->Add();
    v->set_name(name);
    v->set_value(value);
  }
}

std::string NamedValuesText(const std::vector<std::pair<std::string, double>>& values) {
  std::string out;
  for (const auto& [name, value] : values)
    absl::StrAppend(&out, " ", name, "=", absl::StrFormat("%.8g", value));
  return out;
}

}  // namespace fxdp::executor
