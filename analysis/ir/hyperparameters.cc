#include "analysis/ir/hyperparameters.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "util/status_macros.h"

namespace fxdp::ir {
namespace {

using Json = nlohmann::json;

std::string KnownList(const std::vector<std::string>& names) {
  return names.empty() ? "the graph has none"
                       : absl::StrCat("its hyper-parameters: ", absl::StrJoin(names, ", "));
}

// A closed form's fields: every one a finite number, none unknown, the
// required ones present.
class Fields {
 public:
  Fields(const Json& j, std::string where) : j_(j), where_(std::move(where)) {}

  absl::Status Check(std::initializer_list<const char*> allowed) const {
    if (!j_.is_object())
      return absl::InvalidArgumentError(
          absl::StrCat(where_, ": expected an object of fields, got ", j_.dump()));
    for (auto it = j_.begin(); it != j_.end(); ++it) {
      if (std::none_of(allowed.begin(), allowed.end(),
                       [&](const char* a) { return it.key() == a; }))
        return absl::InvalidArgumentError(absl::StrCat(where_, ": unknown field '", it.key(),
                                                       "' (fields: ", absl::StrJoin(allowed, ", "),
                                                       ")"));
    }
    return absl::OkStatus();
  }
  // The field `name` as a finite number (`fallback` when absent and given).
  absl::StatusOr<double> Number(const char* name, std::optional<double> fallback = {}) const {
    auto it = j_.find(name);
    if (it == j_.end()) {
      if (fallback) return *fallback;
      return absl::InvalidArgumentError(absl::StrCat(where_, ": field '", name, "' is required"));
    }
    if (!it->is_number() || !std::isfinite(it->get<double>()))
      return absl::InvalidArgumentError(
          absl::StrCat(where_, ": field '", name, "' must be a finite number, got ", it->dump()));
    return it->get<double>();
  }
  absl::StatusOr<int64_t> Count(const char* name, std::optional<int64_t> fallback = {}) const {
    FXDP_ASSIGN_OR_RETURN(double v,
                          Number(name, fallback ? std::optional<double>(*fallback) : std::nullopt));
    if (v < 0 || v != std::floor(v) || v > 1e15)
      return absl::InvalidArgumentError(
          absl::StrCat(where_, ": field '", name, "' must be a non-negative integer, got ", v));
    return static_cast<int64_t>(v);
  }

 private:
  const Json& j_;
  std::string where_;
};

// The values of one entry for steps 1..steps.
absl::StatusOr<std::vector<double>> Expand(const std::string& name, const Json& j, int64_t steps,
                                           const std::string& where) {
  std::vector<double> out;
  if (j.is_array()) {
    if (static_cast<int64_t>(j.size()) < steps)
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", j.size(), " value",
                                                     j.size() == 1 ? "" : "s", " for ", steps,
                                                     " steps (one value per step is needed)"));
    for (int64_t s = 0; s < steps; ++s) {
      const Json& v = j[s];
      if (!v.is_number() || !std::isfinite(v.get<double>()))
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": value ", s, " (step ", s + 1, ") must be a finite number, got ", v.dump()));
      out.push_back(v.get<double>());
    }
    return out;
  }
  if (!j.is_object() || j.size() != 1)
    return absl::InvalidArgumentError(absl::StrCat(
        where,
        ": expected a list of values (one per step) or one closed form "
        "({\"constant\": v}, {\"linear_warmup_cosine\": {...}}, {\"step_decay\": {...}}), got ",
        j.dump()));
  const std::string form = j.begin().key();
  const Json& body = j.begin().value();
  const std::string at = absl::StrCat(where, ".", form);
  out.reserve(steps);
  if (form == "constant") {
    if (!body.is_number() || !std::isfinite(body.get<double>()))
      return absl::InvalidArgumentError(
          absl::StrCat(at, ": must be a finite number, got ", body.dump()));
    out.assign(steps, body.get<double>());
  } else if (form == "linear_warmup_cosine") {
    Fields f(body, at);
    FXDP_RETURN_IF_ERROR(f.Check({"peak", "warmup_steps", "total_steps", "final"}));
    FXDP_ASSIGN_OR_RETURN(double peak, f.Number("peak"));
    FXDP_ASSIGN_OR_RETURN(double final_value, f.Number("final", 0.0));
    FXDP_ASSIGN_OR_RETURN(int64_t warmup, f.Count("warmup_steps", 0));
    FXDP_ASSIGN_OR_RETURN(int64_t total, f.Count("total_steps", steps));
    for (int64_t s = 0; s < steps; ++s) {
      if (s < warmup) {
        out.push_back(peak * static_cast<double>(s) / static_cast<double>(warmup));
        continue;
      }
      const double p = std::min(1.0, static_cast<double>(s - warmup) /
                                         static_cast<double>(std::max<int64_t>(1, total - warmup)));
      out.push_back(final_value + (peak - final_value) * 0.5 * (1.0 + std::cos(M_PI * p)));
    }
  } else if (form == "step_decay") {
    Fields f(body, at);
    FXDP_RETURN_IF_ERROR(f.Check({"initial", "step_size", "gamma"}));
    FXDP_ASSIGN_OR_RETURN(double initial, f.Number("initial"));
    FXDP_ASSIGN_OR_RETURN(int64_t size, f.Count("step_size"));
    FXDP_ASSIGN_OR_RETURN(double gamma, f.Number("gamma"));
    if (size < 1) return absl::InvalidArgumentError(absl::StrCat(at, ": step_size must be >= 1"));
    for (int64_t s = 0; s < steps; ++s)
      out.push_back(initial * std::pow(gamma, static_cast<double>(s / size)));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": unknown closed form '", form,
                     "' (known: constant, linear_warmup_cosine, step_decay; or a list of values)"));
  }
  return out;
}

}  // namespace

PlaceholderNames PlaceholderNames::Of(const Graph& g) {
  PlaceholderNames out;
  for (const Node& n : g.nodes()) {
    if (n.is_placeholder())
      out.entries.push_back({n.placeholder.state_name,
                             n.placeholder.role == PlaceholderRole::kHyperparameter, n.name});
  }
  return out;
}

PlaceholderNames PlaceholderNames::Of(const v1::GraphDef& g) {
  PlaceholderNames out;
  for (const v1::Node& n : g.nodes()) {
    if (n.kind() != v1::PLACEHOLDER) continue;
    out.entries.push_back(
        {n.placeholder().state_name(), n.placeholder().role() == v1::HYPERPARAMETER, n.name()});
  }
  return out;
}

std::vector<std::string> PlaceholderNames::Hyperparameters() const {
  std::vector<std::string> out;
  for (const Entry& e : entries) {
    if (e.hyperparameter) out.push_back(e.state_name);
  }
  return out;
}

absl::Status PlaceholderNames::Check(absl::Span<const std::string> names,
                                     absl::string_view what) const {
  const std::vector<std::string> known = Hyperparameters();
  for (const std::string& name : names) {
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    std::string instead = "no placeholder has that state name";
    for (const Entry& e : entries) {
      if (e.state_name == name)
        instead = absl::StrCat("it is the state of placeholder '", e.node, "'");
    }
    return absl::InvalidArgumentError(absl::StrCat(what, ": '", name,
                                                   "' is not a hyper-parameter of the graph (",
                                                   instead, "; ", KnownList(known), ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Schedule> Schedule::Parse(absl::string_view json, int64_t steps,
                                         absl::string_view source) {
  if (steps < 0) return absl::InvalidArgumentError(absl::StrCat(source, ": negative step count"));
  Json j = Json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON"));
  if (!j.is_object())
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": expected a JSON object {\"optim.group0.lr\": [...], ...}, got ", j.type_name()));
  Schedule s;
  s.steps_ = steps;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key().empty())
      return absl::InvalidArgumentError(absl::StrCat(source, ": an entry with an empty name"));
    FXDP_ASSIGN_OR_RETURN(
        std::vector<double> v,
        Expand(it.key(), it.value(), steps, absl::StrCat(source, ": '", it.key(), "'")));
    s.values_[it.key()] = std::move(v);
  }
  return s;
}

absl::StatusOr<Schedule> Schedule::ReadFile(const std::string& path, int64_t steps) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot read the schedule file ", path));
  std::stringstream ss;
  ss << f.rdbuf();
  return Parse(ss.str(), steps, path);
}

absl::StatusOr<Schedule> Schedule::FromSeries(std::map<std::string, std::vector<double>> series,
                                              int64_t steps, absl::string_view what) {
  Schedule s;
  s.steps_ = steps;
  for (auto& [name, v] : series) {
    if (name.empty())
      return absl::InvalidArgumentError(absl::StrCat(what, ": a series with an empty name"));
    if (static_cast<int64_t>(v.size()) < steps)
      return absl::InvalidArgumentError(absl::StrCat(what, ": '", name, "' has ", v.size(),
                                                     " value", v.size() == 1 ? "" : "s", " for ",
                                                     steps, " steps (one value per step)"));
    for (size_t k = 0; k < v.size(); ++k) {
      if (!std::isfinite(v[k]))
        return absl::InvalidArgumentError(absl::StrCat(what, ": '", name, "' value ", k, " (step ",
                                                       k + 1, ") is ", v[k],
                                                       ", not a finite number"));
    }
    v.resize(steps);
    s.values_[name] = std::move(v);
  }
  return s;
}

std::vector<std::string> Schedule::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : values_) out.push_back(k);
  return out;
}

HyperparameterValues Schedule::At(int64_t step) const {
  HyperparameterValues out;
  if (step < 1 || step > steps_) return out;
  for (const auto& [k, v] : values_) out.emplace_back(k, v[step - 1]);
  return out;
}

}  // namespace fxdp::ir
