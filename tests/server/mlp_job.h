// The job the server tests run: tests/testdata/mlp_sgd.txt (state fc.weight
// f32[3, 4] and fc.bias f32[3]; batch input.0 f32[8, 4] and input.1 f32[8, 3])
// and float32 tensors of counting values to feed it.
#ifndef FXDP_TESTS_SERVER_MLP_JOB_H_
#define FXDP_TESTS_SERVER_MLP_JOB_H_

#include <cstdint>
#include <string>
#include <vector>

#include "analysis/ir/proto_codec.h"
#include "analysis/ir/text.h"
#include "proto/fxdp/v1/jobs.pb.h"
#include "server/jobs/job.h"
#include "tests/test_util.h"

namespace fxdp::testing {

inline constexpr int kB = 8;  // mlp_sgd.txt's batch: input.0 f32[8, 4], input.1 f32[8, 3]

inline v1::GraphDef MlpGraph() {
  return ir::EncodeGraph(ValueOrDie(ir::ParseGraphText(ReadTestData("mlp_sgd.txt"))));
}

// A float32 tensor of `shape` holding start, start + 1, ...
inline v1::TensorChunk F32(const std::string& name, std::vector<int64_t> shape, float start) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i);
  v1::TensorChunk c;
  c.set_name(name);
  c.set_dtype(v1::FLOAT32);
  for (int64_t d : shape) c.add_shape(d);
  c.set_data(std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)));
  return c;
}

// Step `step`'s global batch (whole tensors, values distinct per step).
inline std::vector<v1::TensorChunk> MlpBatch(int64_t step) {
  return {F32("input.0", {kB, 4}, 1000.0f * step), F32("input.1", {kB, 3}, 1000.0f * step + 500)};
}

// The spec of an MLP job on `world` workers for `steps` steps (two state
// tensors, a 5 s collective timeout).
inline v1::JobSpec MlpSpec(int world, int64_t steps) {
  v1::JobSpec spec;
  *spec.mutable_graph() = MlpGraph();
  spec.set_world_size(world);
  spec.set_steps(steps);
  spec.set_num_state_tensors(2);
  spec.set_collective_timeout_s(5);
  return spec;
}

// One SubmitJobRequest of step `step`'s batch carrying `c` (`more`: the step
// goes on in the next message).
inline v1::SubmitJobRequest BatchMessage(int64_t step, const v1::TensorChunk& c, bool more) {
  v1::SubmitJobRequest r;
  r.mutable_batch()->set_step(step);
  *r.mutable_batch()->add_tensors() = c;
  r.mutable_batch()->set_more(more);
  return r;
}

// A job plan of MlpSpec(world, steps) without its graph (the table and the
// scheduler read only the spec).
inline server::JobPlan GraphlessPlan(int world, int steps) {
  server::JobPlan plan;
  plan.spec = MlpSpec(world, steps);
  plan.spec.clear_graph();
  return plan;
}

}  // namespace fxdp::testing

#endif  // FXDP_TESTS_SERVER_MLP_JOB_H_
