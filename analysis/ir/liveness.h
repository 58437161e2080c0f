// Value lifetimes of a straight-line program: which values die after which
// step, and which reads may move a value out instead of copying it.
//
// The program is a sequence of steps over numbered value slots. A slot holds
// one value: a graph input (filled before the first step) or an output of the
// step that writes it. ComputeLiveness finds, for every slot, the step after
// which nothing reads it: the interpreter releases it there, so a run's peak
// memory is that of the live values (as in eager mode). Torch-free: the
// interpreter (executor/) builds a LivenessProblem from its plan.
#ifndef FXDP_ANALYSIS_IR_LIVENESS_H_
#define FXDP_ANALYSIS_IR_LIVENESS_H_

#include <cstdint>
#include <vector>

namespace fxdp::ir {

struct LivenessProblem {
  int32_t num_slots = 0;
  // Per step, in execution order: the slots it reads (a slot read twice by
  // one step appears twice) and the slots it writes.
  std::vector<std::vector<int32_t>> reads;
  std::vector<std::vector<int32_t>> writes;
  // The slots the program returns after its last step: alive to the end.
  std::vector<int32_t> returned;
};

struct Liveness {
  // last_read[slot]: the last step that reads it; num_steps when it is
  // returned; kNotRead when nothing reads it.
  static constexpr int32_t kNotRead = -2;
  std::vector<int32_t> last_read;
  // Slots nothing reads and no step writes (unread inputs): released before
  // the first step.
  std::vector<int32_t> free_at_start;
  // Per step: the slots released right after it (ascending): those it reads
  // last, and those it writes that nothing reads.
  std::vector<std::vector<int32_t>> free_after;
  // Per step: the slots it reads exactly once and for the last time (a
  // caller may move these values out instead of copying them), ascending.
  std::vector<std::vector<int32_t>> last_sole_read;
};

// Slots a step reads or writes must be in [0, num_slots).
Liveness ComputeLiveness(const LivenessProblem& problem);

}  // namespace fxdp::ir

#endif  // FXDP_ANALYSIS_IR_LIVENESS_H_
