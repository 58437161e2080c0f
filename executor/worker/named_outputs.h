// A step's named metrics (StepResult.outputs, EvalResult.metrics): the 0-d
// OTHER outputs of a graph that train_step (or fxdp.trace_eval's eval_step)
// returned beside the loss, named by the graph's `extra_outputs` metadata.
//
// The tracer writes `extra_outputs` as a JSON list of the names, in output
// order: the graph's first OTHER outputs are those, in that order (gradient
// snapshots follow them; the expansion appends "local_loss" last). In an
// expanded graph each is the global value, reduced on the ranks as its
// placement says (a mean over the batch weighted by the ranks' rows, a sum
// summed: docs/evaluation.md), so every rank holds the same number.
//
// The metadata is the client's: it is parsed with a bound on the names'
// count (at most the graph's OTHER outputs) and length (kMaxOutputNameBytes);
// anything else is INVALID_ARGUMENT naming what is wrong.
#ifndef FXDP_EXECUTOR_WORKER_NAMED_OUTPUTS_H_
#define FXDP_EXECUTOR_WORKER_NAMED_OUTPUTS_H_

#include <ATen/core/ivalue.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "analysis/ir/graph.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "proto/fxdp/v1/worker.pb.h"

namespace fxdp::executor {

inline constexpr char kExtraOutputsKey[] = "extra_outputs";
inline constexpr size_t kMaxOutputNameBytes = 256;

class NamedOutputs {
 public:
  // The names of `output_specs`' OTHER outputs (by their position among the
  // OTHER outputs, StepRunner::other_outputs()) from `graph`'s metadata; no
  // names when the graph has no `extra_outputs`.
  static absl::StatusOr<NamedOutputs> Of(const ir::Graph& graph,
                                         const std::vector<ir::OutputSpec>& output_specs);

  // The named outputs among `other` (one step's OTHER outputs, in order) that
  // are 0-d tensors, as doubles (synchronises the device).
  std::vector<std::pair<std::string, double>> Values(const std::vector<c10::IValue>& other) const;

  const std::vector<std::string>& names() const { return names_; }

 private:
  std::vector<std::string> names_;  // by position in the OTHER outputs
};

// `values` appended to `out` (StepResult.outputs, EvalResult.metrics).
void AddNamedValues(const std::vector<std::pair<std::string, double>>& values,
                    google::protobuf::RepeatedPtrField<v1::NamedValue>* out);

// " correct=5 accuracy=0.625": the values for a log or progress line ("" for none).
std::string NamedValuesText(const std::vector<std::pair<std::string, double>>& values);

}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_WORKER_NAMED_OUTPUTS_H_
