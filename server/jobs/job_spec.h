// A JobSpec checked and prepared for running: its fields validated, its
// hyper-parameter schedule checked against the graph's HYPERPARAMETER
// placeholders, its graph expanded for world_size ranks, its INPUTs listed.
// Errors are INVALID_ARGUMENT naming the field and the value (the expansion's
// own code for a graph it refuses, naming the node). No gRPC here.
#ifndef FXDP_SERVER_JOBS_JOB_SPEC_H_
#define FXDP_SERVER_JOBS_JOB_SPEC_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "analysis/ir/declared_tensors.h"
#include "analysis/ir/hyperparameters.h"
#include "analysis/ir/instantiate.h"
#include "proto/fxdp/v1/compile.pb.h"
#include "proto/fxdp/v1/jobs.pb.h"

namespace fxdp::server {

// An INPUT placeholder of the single-device graph (of a graph with symbolic
// sizes: `shape` the traced example's, `symbolic` its dims that vary).
struct InputSpec {
  std::string name;
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;
  int batch_dim = -1;
  std::vector<bool> symbolic;  // per dim (TensorMeta.shape_expr != 0); empty: static
};

// The graph's INPUT placeholders, in graph order.
std::vector<InputSpec> GraphInputs(const v1::GraphDef& graph);
// The one named `name` (null: none).
const InputSpec* FindInputSpec(const std::vector<InputSpec>& inputs, const std::string& name);

// Bounds of the strings a JobSpec carries (they are stored, listed, logged).
inline constexpr size_t kMaxJobNameBytes = 256;    // JobSpec.name, JobSpec.resume_job
inline constexpr int kMaxDataPaths = 4096;         // JobSpec.data_paths entries
inline constexpr size_t kMaxDataPathBytes = 4096;  // each (PATH_MAX)
inline constexpr int kDefaultMaxShapes = 16;       // JobSpec.max_shapes 0
inline constexpr int kMaxMaxShapes = 64;  // JobSpec.max_shapes' bound (the worker keeps <= 64)

// JobSpec's fields: a graph, world_size >= 1, steps >= 0 (> 0 with a
// schedule or data_paths), no empty data path, a collective timeout in
// [0, one year], max_shapes in [0, kMaxMaxShapes], the strings within the
// bounds above.
absl::Status ValidateJobSpec(const v1::JobSpec& spec);

// JobSpec.data_paths (and initial_checkpoint.path) that lead, as this host resolves them (links
// followed, relative to the server's working directory), into one of
// `excluded` (real paths: the server's --state-dir, key and token files) are
// PERMISSION_DENIED naming the entry: the server's own files are never data
// (issue 25.3). The workers refuse them too, as they open them
// (fxdp-worker attach --data-exclude), which is what holds against a link
// swapped in later or a worker with another view of the filesystem.
absl::Status CheckDataPathsExcluded(const v1::JobSpec& spec,
                                    const std::vector<std::string>& excluded);

// JobSpec.initial_checkpoint against the single-device graph's `state`: every
// name it reads (tensors) or creates (fills) is a state tensor of the graph,
// named once. The rest is what the client sends (JobSpec.num_state_tensors
// of them). INVALID_ARGUMENT naming the entry.
absl::StatusOr<ir::DeclaredTensors> SentStateOf(const v1::JobSpec& spec,
                                                const ir::DeclaredTensors& state);

// JobSpec.collective_timeout_s (0: 60 s) against the server's cap `max_s`
// (fxdp-server --max-collective-timeout-s): INVALID_ARGUMENT naming both.
absl::Status CheckCollectiveTimeout(const v1::JobSpec& spec, double max_s);

// JobSpec.schedule: names of the graph's HYPERPARAMETER placeholders, each
// at most once, with one value per step.
absl::StatusOr<ir::Schedule> JobScheduleOf(const v1::JobSpec& spec,
                                           const ir::PlaceholderNames& placeholders);

// What a SubmitJobRequest carries ("a batch", "an initial-state chunk", ...),
// for errors.
const char* SubmitRequestKind(const v1::SubmitJobRequest& request);

// Expands a graph (the compile service, through its cache, in the server).
using Expander = std::function<absl::StatusOr<v1::ExpandResponse>(const v1::ExpandRequest&)>;

struct PreparedSpec {
  v1::JobSpec spec;             // without the graph and the schedule
  v1::ExpandResponse expanded;  // a symbolic graph's: at its traced example's shapes
  // A graph with symbolic sizes (docs/shapes.md): its ExpandRequest, to
  // compile each batch shape (ShapeVariants), the traced example's shapes
  // (`expanded`'s: graph 0) and how long they took to compile; null: static.
  std::shared_ptr<const v1::ExpandRequest> symbolic;
  ir::InputShapes example;
  double compile_ms = 0;
  std::vector<InputSpec> inputs;
  ir::PlaceholderNames placeholders;
  ir::Schedule schedule;
  ir::DeclaredTensors state;  // the single-device graph's state tensors
  ir::DeclaredTensors sent;   // those the client sends (SentStateOf)
  ir::DeclaredTensors batch;  // its INPUTs
  v1::ExpandResponse eval;    // JobSpec.eval's graph expanded (eval_spec.h); spec.eval without it
};

// Validates `spec`, checks its schedule, expands its graph (an empty
// expansion is INTERNAL); a graph with symbolic sizes is instantiated at its
// traced example's shapes for that and kept (PreparedSpec.symbolic).
absl::StatusOr<PreparedSpec> PrepareJobSpec(v1::JobSpec spec, const Expander& expand);

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_JOB_SPEC_H_
