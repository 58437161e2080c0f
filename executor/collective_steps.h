// Collective steps of the interpreter: `_c10d_functional::all_reduce(t,
// reduce_op, group)` starts Communicator::AllReduceSum ("sum"; "avg" divides
// the sum by the world size), FULLY_SHARD's `all_gather_into_tensor(t,
// group_size, group)` and `reduce_scatter_tensor(t, "sum", group_size, group)`
// start AllGather / ReduceScatterSum (group_size must be the communicator's
// world size); each keeps its Work in the value table;
// `_c10d_functional::wait_tensor` waits for it (ProgramOptions::
// collective_timeout). A node other than wait_tensor that reads a pending
// all_reduce waits first (Program::Impl::Resolve). A failed wait names the
// waiting node, the all_reduce node, its number among the run's collectives
// and the communicator's reason. The group name is not interpreted: a
// program has one communicator.
//
// Planning is here (PlanCollective, called by the loader for every
// `_c10d_functional::` node); running is Program::Impl::RunAllReduce /
// RunWait / Resolve (collective_steps.cc).
#ifndef FXDP_EXECUTOR_COLLECTIVE_STEPS_H_
#define FXDP_EXECUTOR_COLLECTIVE_STEPS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "analysis/ir/graph.h"
#include "executor/program_impl.h"

namespace fxdp::executor {

// Whether `n` calls a functional collective (`_c10d_functional::*`): the
// loader plans those with PlanCollective, not through the dispatcher.
bool IsCollectiveNode(const ir::Node& n);

// The step for collective node `n` (`s` has its node, name and op name):
// UNIMPLEMENTED for a collective the interpreter does not run, errors naming
// the argument for inputs that do not fit. `slot_of`: as ArgBinder's.
absl::StatusOr<Step> PlanCollective(const ir::Graph& g, const ir::Node& n, Step s,
                                    const std::vector<std::vector<int32_t>>& slot_of);

}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_COLLECTIVE_STEPS_H_
