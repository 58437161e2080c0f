// Hyper-parameters: a graph's HYPERPARAMETER placeholders (0-d floating
// tensors named "optim.group<g>.<key>", fed like state) and the schedule that
// gives them a value per step. LibTorch-free: `fxdp run`, `fxdp-worker run`
// and the server share it.
//
// The schedule file (`fxdp run --schedule`, `fxdp-worker run --schedule`) is
// a JSON object from hyper-parameter name to its values, one entry per name:
//
//   {"optim.group0.lr": [0.001, 0.0009, 0.0008],            one value per step
//    "optim.group0.weight_decay": {"constant": 0.01},
//    "optim.group1.lr": {"linear_warmup_cosine":
//        {"peak": 1e-3, "warmup_steps": 10, "total_steps": 100, "final": 0.0}},
//    "optim.group0.momentum": {"step_decay":
//        {"initial": 0.9, "step_size": 30, "gamma": 0.5}}}
//
// With s = step - 1 (0 for the first step):
//  * a list: the value of step s + 1 is element s; a list shorter than the
//    run's steps is an error (extra values are ignored);
//  * constant: the value every step;
//  * linear_warmup_cosine (transformers' get_cosine_schedule_with_warmup with
//    a floor): peak * s / warmup_steps while s < warmup_steps, then
//    final + (peak - final) * 0.5 * (1 + cos(pi * p)) with
//    p = min(1, (s - warmup_steps) / max(1, total_steps - warmup_steps));
//    final defaults to 0, total_steps to the run's steps;
//  * step_decay (torch's StepLR): initial * gamma ^ floor(s / step_size).
// A hyper-parameter the schedule does not name keeps its value in the state
// (the traced constant unless the state says otherwise).
#ifndef FXDP_ANALYSIS_IR_HYPERPARAMETERS_H_
#define FXDP_ANALYSIS_IR_HYPERPARAMETERS_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "analysis/ir/graph.h"
#include "proto/fxdp/v1/graph.pb.h"

namespace fxdp::ir {

// A graph's placeholders as far as hyper-parameters are concerned: from the
// IR (executor, CLI) or straight from a GraphDef (the server, no decode).
struct PlaceholderNames {
  struct Entry {
    std::string state_name;
    bool hyperparameter = false;  // role HYPERPARAMETER
    std::string node;
  };
  std::vector<Entry> entries;  // graph order

  static PlaceholderNames Of(const Graph& g);
  static PlaceholderNames Of(const v1::GraphDef& g);
  // The HYPERPARAMETER placeholders' state names, in graph order.
  std::vector<std::string> Hyperparameters() const;
  // OK when every name is the state name of a HYPERPARAMETER placeholder;
  // else INVALID_ARGUMENT "<what>: '<name>' is not a hyper-parameter of the
  // graph (...)", saying what the name is instead (another role's state, or
  // nothing) and listing the graph's hyper-parameters.
  absl::Status Check(absl::Span<const std::string> names, absl::string_view what) const;
};

inline std::vector<std::string> HyperparameterNames(const Graph& g) {
  return PlaceholderNames::Of(g).Hyperparameters();
}
inline absl::Status CheckHyperparameterNames(const Graph& g, absl::Span<const std::string> names,
                                             absl::string_view what) {
  return PlaceholderNames::Of(g).Check(names, what);
}

// One step's values: (name, value) pairs.
using HyperparameterValues = std::vector<std::pair<std::string, double>>;

// Per-name values for steps 1..steps().
class Schedule {
 public:
  Schedule() = default;
  // Parses the schedule file's JSON (see the file comment) for a run of
  // `steps` steps. INVALID_ARGUMENT naming `source`, the entry and what is
  // wrong: not JSON, not an object, an unknown closed form or field, a value
  // that is not a finite number, a list with fewer values than steps.
  static absl::StatusOr<Schedule> Parse(absl::string_view json, int64_t steps,
                                        absl::string_view source);
  // Reads and parses `path` (NOT_FOUND when it cannot be read).
  static absl::StatusOr<Schedule> ReadFile(const std::string& path, int64_t steps);
  // From explicit per-name series (JobSpec.schedule): every series needs at
  // least `steps` values (INVALID_ARGUMENT naming `what`, the name and both
  // counts); extra values are dropped.
  static absl::StatusOr<Schedule> FromSeries(std::map<std::string, std::vector<double>> series,
                                             int64_t steps, absl::string_view what);

  int64_t steps() const { return steps_; }
  bool empty() const { return values_.empty(); }
  // The scheduled names, sorted.
  std::vector<std::string> names() const;
  // The values of step `step` (1-based, <= steps()), sorted by name.
  HyperparameterValues At(int64_t step) const;
  const std::map<std::string, std::vector<double>>& series() const { return values_; }

 private:
  int64_t steps_ = 0;
  std::map<std::string, std::vector<double>> values_;  // each of size steps_
};

}  // namespace fxdp::ir

#endif  // FXDP_ANALYSIS_IR_HYPERPARAMETERS_H_
