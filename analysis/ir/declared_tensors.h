// The tensors a graph's placeholders declare, by state name: what a job's
// initial state (every placeholder but the INPUTs: parameters, buffers,
// optimizer state, constants, hyper-parameters) or one step's batch (the
// INPUTs) must be. The server checks what a client streams against the
// single-device graph and the worker what the server streams against its
// rank graph, each tensor when its first chunk arrives, before anything is
// buffered or allocated, so a declared shape never costs more memory than
// the graph itself declares.
#ifndef FXDP_ANALYSIS_IR_DECLARED_TENSORS_H_
#define FXDP_ANALYSIS_IR_DECLARED_TENSORS_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "analysis/ir/types.h"
#include "proto/fxdp/v1/graph.pb.h"
#include "proto/fxdp/v1/worker.pb.h"

namespace fxdp::ir {

class DeclaredTensors {
 public:
  enum class Kind { kState, kBatch };
  struct Tensor {
    std::string node;  // the placeholder
    DType dtype = DType::kFloat32;
    std::vector<int64_t> shape;
    int batch_dim = -1;  // INPUTs
    // A ragged INPUT (the graph's metadata kRaggedKey, batch_split.h): 1-D,
    // `shape` its global length, an upper bound; a rank gets its bags' part.
    bool ragged = false;
    uint64_t bytes = 0;  // saturating
  };

  // kState: every placeholder but the INPUTs; kBatch: the INPUTs. A state
  // name that several placeholders share counts once (the first).
  static DeclaredTensors Of(const v1::GraphDef& g, Kind kind);

  size_t size() const { return by_name_.size(); }
  // The bytes of all of them (saturating at UINT64_MAX).
  uint64_t bytes() const { return bytes_; }
  const Tensor* Find(const std::string& name) const;
  // "fc.weight, fc.bias" (the first `max`, then "and N more").
  std::string Names(size_t max = 8) const;
  // The state names, graph order.
  const std::vector<std::string>& names() const { return order_; }
  // These tensors but `drop` (graph order kept): e.g. the state a client
  // still sends when a checkpoint gives the rest.
  DeclaredTensors Without(const std::set<std::string>& drop) const;

  // A tensor's first chunk: its name is declared, its dtype and shape are
  // the placeholder's. With `world_size` > 1 the batch dim of an INPUT may
  // hold a global batch (up to world_size * (n + 1) - 1 samples for the
  // rank's n); a ragged INPUT any length up to the declared. INVALID_ARGUMENT "<what>: tensor 'x'
  // is not ... of the graph (its N ...: a, b)" or "<what>: tensor 'x' is f32[3, 5], the graph's
  // placeholder 'w' declares f32[3, 4]" (no "<what>: " when `what` is empty).
  absl::Status CheckFirstChunk(const v1::TensorChunk& c, absl::string_view what,
                               int world_size = 1) const;

 private:
  Kind kind_ = Kind::kState;
  std::map<std::string, Tensor> by_name_;
  std::vector<std::string> order_;  // graph order
  uint64_t bytes_ = 0;
};

// numel * item size of `shape`, saturating at UINT64_MAX (a negative dim
// counts as 0).
uint64_t TensorByteSize(DType dtype, const std::vector<int64_t>& shape);

}  // namespace fxdp::ir

#endif  // FXDP_ANALYSIS_IR_DECLARED_TENSORS_H_
