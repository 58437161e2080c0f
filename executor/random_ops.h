// The executor's kernels for the random ops of analysis/ir/random_ops.h: every
// value from fxdp's Philox stream (util/philox.h) at its GLOBAL element index,
// never from torch's generator, so N ranks draw exactly what one device draws
// (docs/randomness.md).
//
// Program::Load makes a RandomPlan for each random node (its op's parameters'
// stack positions, the node id, where the batch lies in its output); the run
// loop pushes the node's arguments as for any op and calls RunRandom instead of
// the kernel, which leaves the op's results on the stack.
#ifndef FXDP_EXECUTOR_RANDOM_OPS_H_
#define FXDP_EXECUTOR_RANDOM_OPS_H_

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "analysis/ir/batch_split.h"
#include "analysis/ir/graph.h"
#include "analysis/ir/random_ops.h"

namespace fxdp::executor {

struct RandomPlan {
  const ir::RandomOp* op = nullptr;
  uint32_t node_id = 0;
  std::vector<int> params;  // stack positions of op->params, in order
  ir::RandomLayout layout;  // dim -1: replicated
  ir::TensorType out;       // output 0 (the rank's shape)
};

// Where a run draws from: the job's seed, the step (1-based, < 2^32), the
// global batch and this rank's slice of it (for sharded random nodes).
struct RandomContext {
  uint64_t seed = 0;
  int64_t step = 1;
  int64_t batch = 0;
  ir::RankSlice slice;
};

// The plan for node `n` (an op of the table with schema `schema`); `layouts`:
// the graph's kRandomLayoutKey entries. INVALID_ARGUMENT naming the node when
// the schema lacks a parameter the table names.
absl::StatusOr<RandomPlan> PlanRandom(const ir::RandomOp& op, const c10::FunctionSchema& schema,
                                      const ir::Node& n,
                                      const std::vector<ir::RandomLayout>& layouts);

// Runs the op: `stack` holds its arguments in schema order and, on return, its
// results. Tensors are made on `device` (drawn on the CPU).
absl::Status RunRandom(const RandomPlan& plan, const RandomContext& ctx, c10::Device device,
                       std::vector<c10::IValue>& stack);

// For each element i of a tensor of `sizes` laid out as `layout`, the global
// element index it has on one device: runs of (local start, global start,
// count). INVALID_ARGUMENT when the sizes do not fit the layout and slice.
struct IndexRun {
  int64_t local = 0;
  uint64_t global = 0;
  int64_t count = 0;
};
absl::StatusOr<std::vector<IndexRun>> GlobalIndexRuns(const std::vector<int64_t>& sizes,
                                                      const ir::RandomLayout& layout, int64_t batch,
                                                      const ir::RankSlice& slice);

}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_RANDOM_OPS_H_
