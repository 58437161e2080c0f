// StepRunner: a Program plus the training state it updates, one Step per
// batch (state by name in, UPDATED_* outputs written back, the loss out).
// A job whose batches change shape (docs/shapes.md) holds one program per
// shape over the same state: program 0 and those AddProgram adds, each
// Step naming the one it runs.
#ifndef FXDP_EXECUTOR_STEP_RUNNER_H_
#define FXDP_EXECUTOR_STEP_RUNNER_H_

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "executor/interpreter.h"

namespace fxdp::executor {

// A Program plus the training state it updates: one Step per batch.
class StepRunner {
 public:
  // Every state entry the graph reads (non-INPUT placeholders by state name)
  // must be in `state` (NOT_FOUND naming the missing ones); those are moved to
  // the program's device once. Entries the graph does not read are kept as
  // they are.
  static absl::StatusOr<StepRunner> Create(Program program, TensorMap state);

  // Runs one step on `batch` (INPUT placeholders by state name; NOT_FOUND
  // naming a missing one; tensors are copied to the device). UPDATED_* outputs
  // replace their state entries. Returns the LOSS output (an undefined tensor
  // when the graph has none). Old state entries the step replaces are released
  // during the step (they are not copied); if a kernel fails mid-step those
  // entries are lost and every later Step is FAILED_PRECONDITION.
  absl::StatusOr<at::Tensor> Step(const TensorMap& batch, uint32_t program_id = 0);

  // Another program over the same state (one more batch shape): its
  // placeholders must be program 0's by state name and role, the state's
  // with their dtype and shape, the INPUTs' with their dtype, rank and
  // batch dim (only their sizes differ), and it must update the state
  // program 0 updates and return the same outputs in the same order (role
  // and state name); `id` >= 1 and not held; the same device.
  // INVALID_ARGUMENT naming the first placeholder that differs, program 0's
  // declaration against this one's, else. The state is never copied: every
  // program reads and updates the one map.
  absl::Status AddProgram(uint32_t id, Program program);
  // Drops program `id` (>= 1; INVALID_ARGUMENT naming the ids held when it
  // is not one of them).
  absl::Status DropProgram(uint32_t id);
  // Program `id`, or null when it is not held.
  Program* FindProgram(uint32_t id);
  // The ids held, ascending ("0, 2, 5"), and how many.
  std::string ProgramIds() const;
  size_t num_programs() const { return programs_.size(); }
  // The 1-based number of the next Step (default 1; each Step adds one): the
  // step its random ops draw for (docs/randomness.md). A resumed job sets it.
  void set_step(int64_t step) { step_ = step; }
  int64_t step() const { return step_; }

  // Writes one step's hyper-parameter values into the state: each name must
  // be a HYPERPARAMETER placeholder's state name (INVALID_ARGUMENT naming the
  // first one that is not, what it is instead and the graph's
  // hyper-parameters; nothing is written then). Each value becomes a 0-d
  // tensor of the placeholder's dtype on the program's device and stays in
  // effect until the next call names it.
  absl::Status SetHyperparameters(const std::vector<std::pair<std::string, double>>& values);

  const TensorMap& state() const { return state_; }
  // The OTHER outputs of the last step, by position in output_specs.
  const std::vector<c10::IValue>& other_outputs() const { return other_; }
  // Program 0 (the one Create took).
  Program& program() { return programs_.begin()->second.program; }

 private:
  struct Loaded {
    Program program;
    std::vector<bool> moves;  // per input: the step replaces this state entry
  };
  explicit StepRunner(TensorMap state) : state_(std::move(state)) {}
  static Loaded Prepare(Program program);
  std::map<uint32_t, Loaded> programs_;  // 0 always held, so begin() is it
  TensorMap state_;
  std::vector<c10::IValue> other_;
  bool broken_ = false;
  int64_t step_ = 1;
};

}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_STEP_RUNNER_H_
