#include "server/jobs/job_spec.h"

#include <chrono>
#include <cmath>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "analysis/ir/size_exprs.h"
#include "expansion/style_proto.h"
#include "server/jobs/eval_spec.h"
#include "util/data_roots.h"

namespace fxdp::server {

std::vector<InputSpec> GraphInputs(const v1::GraphDef& g) {
  std::vector<InputSpec> out;
  for (const v1::Node& n : g.nodes()) {
    if (n.kind() != v1::PLACEHOLDER || n.placeholder().role() != v1::INPUT ||
        n.outputs_size() == 0 || n.outputs(0).kind() != v1::TENSOR) {
      continue;
    }
    const v1::TensorMeta& t = n.outputs(0).tensor();
    InputSpec& in = out.emplace_back();
    in.name = n.placeholder().state_name();
    in.dtype = t.dtype();
    in.shape.assign(t.shape().begin(), t.shape().end());
    in.batch_dim = n.placeholder().batch_dim();
    if (t.shape_expr_size() > 0) {
      for (uint32_t e : t.shape_expr()) in.symbolic.push_back(e != 0);
    }
  }
  return out;
}

const InputSpec* FindInputSpec(const std::vector<InputSpec>& inputs, const std::string& name) {
  for (const InputSpec& in : inputs) {
    if (in.name == name) return &in;
  }
  return nullptr;
}

const char* SubmitRequestKind(const v1::SubmitJobRequest& r) {
  switch (r.msg_case()) {
    case v1::SubmitJobRequest::kSpec: return "a second spec";
    case v1::SubmitJobRequest::kState: return "an initial-state chunk";
    case v1::SubmitJobRequest::kBatch: return "a batch";
    default: return "an empty SubmitJobRequest";
  }
}

namespace {

// One path a job names on the workers' filesystem (`field` names it).
absl::Status CheckPathExcluded(const std::string& path, const std::string& field,
                               const std::vector<std::string>& excluded) {
  if (path.find('\0') != std::string::npos)  // the checks and the kernel would disagree
    return absl::InvalidArgumentError(absl::StrCat(field, " contains a NUL byte"));
  const std::string real = util::RealPathAsFarAsItExists(path);
  const std::string lexical = util::LexicalAbsolute(path);
  for (const std::string& x : excluded) {
    if (util::PathUnder(real, x) || util::PathUnder(lexical, x)) {
      return absl::PermissionDeniedError(absl::StrCat(
          field, " '", path, "' is in '", x,
          "', the server's state directory or credentials, which are never read as data"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckDataPathsExcluded(const v1::JobSpec& spec,
                                    const std::vector<std::string>& excluded) {
  for (int i = 0; i < spec.data_paths_size(); ++i) {
    if (absl::Status s = CheckPathExcluded(spec.data_paths(i),
                                           absl::StrCat("JobSpec.data_paths[", i, "]"), excluded);
        !s.ok())
      return s;
  }
  for (int i = 0; i < spec.eval().data_paths_size(); ++i) {
    if (absl::Status s = CheckPathExcluded(
            spec.eval().data_paths(i), absl::StrCat("JobSpec.eval.data_paths[", i, "]"), excluded);
        !s.ok())
      return s;
  }
  if (spec.has_checkpoints()) {
    if (absl::Status s =
            CheckPathExcluded(spec.checkpoints().dir(), "JobSpec.checkpoints.dir", excluded);
        !s.ok())
      return s;
  }
  if (!spec.has_initial_checkpoint()) return absl::OkStatus();
  return CheckPathExcluded(spec.initial_checkpoint().path(), "JobSpec.initial_checkpoint.path",
                           excluded);
}

absl::StatusOr<ir::DeclaredTensors> SentStateOf(const v1::JobSpec& spec,
                                                const ir::DeclaredTensors& state) {
  std::set<std::string> covered;
  auto cover = [&](const std::string& name, const std::string& field) {
    if (state.Find(name) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(field, " '", name,
                                                     "' is not a state tensor of the graph (its ",
                                                     state.size(), ": ", state.Names(), ")"));
    }
    if (!covered.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " '", name, "': the state tensor is read or filled twice"));
    }
    return absl::OkStatus();
  };
  const v1::CheckpointSource& c = spec.initial_checkpoint();
  for (int i = 0; i < c.tensors_size(); ++i) {
    if (absl::Status s = cover(c.tensors(i).state_name(),
                               absl::StrCat("JobSpec.initial_checkpoint.tensors[", i, "]"));
        !s.ok())
      return s;
  }
  for (int i = 0; i < c.fills_size(); ++i) {
    if (absl::Status s = cover(c.fills(i).state_name(),
                               absl::StrCat("JobSpec.initial_checkpoint.fills[", i, "]"));
        !s.ok())
      return s;
  }
  return state.Without(covered);
}

namespace {

// JobSpec.checkpoints: a directory the workers can create files in (their
// own checks: util::DataRoots::CreateFile), steps and a count >= 0.
absl::Status ValidateCheckpointPolicy(const v1::JobSpec& spec) {
  using absl::InvalidArgumentError;
  const v1::CheckpointPolicy& p = spec.checkpoints();
  if (p.dir().empty()) return InvalidArgumentError("JobSpec.checkpoints.dir is empty");
  if (p.dir().size() > kMaxDataPathBytes) {
    return InvalidArgumentError(absl::StrCat("JobSpec.checkpoints.dir is ", p.dir().size(),
                                             " bytes, more than ", kMaxDataPathBytes,
                                             " (PATH_MAX)"));
  }
  if (p.every() < 0 || p.keep() < 0) {
    return InvalidArgumentError(absl::StrCat("JobSpec.checkpoints: every ", p.every(), " and keep ",
                                             p.keep(), " must be >= 0"));
  }
  if (p.every() == 0 && spec.steps() == 0) {
    return InvalidArgumentError(
        "JobSpec.checkpoints.every is 0 (a checkpoint after the last step only) but the job is "
        "open-ended (JobSpec.steps 0): its workers do not know its last step; set steps or every");
  }
  return absl::OkStatus();
}

absl::Status ValidateCheckpoints(const v1::JobSpec& spec) {
  using absl::InvalidArgumentError;
  if (spec.has_checkpoints()) {
    if (absl::Status s = ValidateCheckpointPolicy(spec); !s.ok()) return s;
  }
  if (!spec.has_initial_checkpoint()) return absl::OkStatus();
  const v1::CheckpointSource& c = spec.initial_checkpoint();
  if (!spec.resume_job().empty()) {
    return InvalidArgumentError(
        "JobSpec.initial_checkpoint and resume_job exclude each other: a resumed job starts from "
        "its checkpoint's state");
  }
  if (c.path().empty()) return InvalidArgumentError("JobSpec.initial_checkpoint.path is empty");
  if (c.path().size() > kMaxDataPathBytes) {
    return InvalidArgumentError(absl::StrCat("JobSpec.initial_checkpoint.path is ", c.path().size(),
                                             " bytes, more than ", kMaxDataPathBytes,
                                             " (PATH_MAX)"));
  }
  for (int i = 0; i < c.fills_size(); ++i) {
    const v1::StateFill& f = c.fills(i);
    if (!std::isfinite(f.value()) || f.shape_size() > 0) {
      return InvalidArgumentError(absl::StrCat(
          "JobSpec.initial_checkpoint.fills[", i, "] ('", f.state_name(), "'): value ", f.value(),
          " with ", f.shape_size(),
          " shape dims; the value must be finite and the shape empty (the server sets it)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateJobSpec(const v1::JobSpec& spec) {
  using absl::InvalidArgumentError;
  if (!spec.has_graph()) return InvalidArgumentError("JobSpec.graph is missing");
  if (spec.world_size() < 1) {
    return InvalidArgumentError(
        absl::StrCat("JobSpec.world_size must be >= 1, got ", spec.world_size()));
  }
  if (spec.steps() < 0) {
    return InvalidArgumentError(
        absl::StrCat("JobSpec.steps must be >= 0 (0: as many steps as the client sends "
                     "batches for), got ",
                     spec.steps()));
  }
  // Strings a client chooses are stored, listed and logged: bounded.
  if (spec.name().size() > kMaxJobNameBytes) {
    return InvalidArgumentError(absl::StrCat("JobSpec.name is ", spec.name().size(),
                                             " bytes, more than ", kMaxJobNameBytes));
  }
  if (spec.resume_job().size() > kMaxJobNameBytes) {
    return InvalidArgumentError(absl::StrCat("JobSpec.resume_job is ", spec.resume_job().size(),
                                             " bytes, more than ", kMaxJobNameBytes));
  }
  if (spec.data_paths_size() > kMaxDataPaths) {
    return InvalidArgumentError(absl::StrCat("JobSpec.data_paths has ", spec.data_paths_size(),
                                             " entries, more than ", kMaxDataPaths));
  }
  for (int i = 0; i < spec.data_paths_size(); ++i) {
    if (spec.data_paths(i).empty())
      return InvalidArgumentError(absl::StrCat("JobSpec.data_paths[", i, "] is empty"));
    if (spec.data_paths(i).size() > kMaxDataPathBytes) {
      return InvalidArgumentError(absl::StrCat("JobSpec.data_paths[", i, "] is ",
                                               spec.data_paths(i).size(), " bytes, more than ",
                                               kMaxDataPathBytes, " (PATH_MAX)"));
    }
  }
  if (spec.schedule_size() > 0 && spec.steps() == 0) {
    return InvalidArgumentError(
        "JobSpec.steps must be > 0 with a schedule (JobSpec.schedule gives one value per step)");
  }
  if (spec.data_paths_size() > 0 && spec.steps() == 0) {
    return InvalidArgumentError(
        "JobSpec.steps must be > 0 with data_paths (the workers read the batches; the "
        "client sends none)");
  }
  if (absl::StatusOr<DataParallelStyle> style = StyleFromProto(spec.style(), "JobSpec.style");
      !style.ok()) {
    return style.status();
  }
  if (spec.max_shapes() < 0 || spec.max_shapes() > kMaxMaxShapes) {
    return InvalidArgumentError(absl::StrCat("JobSpec.max_shapes must be in [0, ", kMaxMaxShapes,
                                             "] (0: ", kDefaultMaxShapes, "), got ",
                                             spec.max_shapes()));
  }
  const double t = spec.collective_timeout_s();
  if (!std::isfinite(t) || t < 0 || t > 86400.0 * 365) {
    return InvalidArgumentError(
        absl::StrCat("JobSpec.collective_timeout_s must be in [0, one year] (0: 60 s), got ", t));
  }
  return ValidateCheckpoints(spec);
}

absl::Status CheckCollectiveTimeout(const v1::JobSpec& spec, double max_s) {
  const double t = spec.collective_timeout_s() > 0 ? spec.collective_timeout_s() : 60;
  if (t <= max_s) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "JobSpec.collective_timeout_s %.15g s%s is over this server's limit of %.15g s "
      "(fxdp-server --max-collective-timeout-s): it bounds each rendezvous and collective, so how "
      "long a hung or failed peer can hold the job's workers",
      t, spec.collective_timeout_s() > 0 ? "" : " (0: the default)", max_s));
}

absl::StatusOr<ir::Schedule> JobScheduleOf(const v1::JobSpec& spec,
                                           const ir::PlaceholderNames& placeholders) {
  std::map<std::string, std::vector<double>> series;
  std::vector<std::string> names;
  for (const v1::HyperparameterSeries& h : spec.schedule()) {
    if (series.count(h.name()) > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("JobSpec.schedule: '", h.name(), "' appears twice"));
    }
    names.push_back(h.name());
    series[h.name()].assign(h.values().begin(), h.values().end());
  }
  if (absl::Status s = placeholders.Check(names, "JobSpec.schedule"); !s.ok()) {
    return absl::InvalidArgumentError(s.message());
  }
  absl::StatusOr<ir::Schedule> schedule =
      ir::Schedule::FromSeries(std::move(series), spec.steps(), "JobSpec.schedule");
  if (!schedule.ok()) return absl::InvalidArgumentError(schedule.status().message());
  return schedule;
}

namespace {

// A graph with symbolic sizes: kept whole in `p` (its request, the traced
// example's shapes), its instantiation at those shapes left in `xr` to expand.
// A data_paths job's step shapes come from its workers (dataset_shapes.h).
absl::Status KeepSymbolic(v1::ExpandRequest* xr, PreparedSpec* p) {
  for (const InputSpec& in : GraphInputs(xr->graph())) p->example[in.name] = in.shape;
  absl::StatusOr<v1::GraphDef> at = ir::InstantiateDef(xr->graph(), p->example);
  if (!at.ok()) {
    return absl::Status(at.status().code(),
                        absl::StrCat("instantiating the graph at its traced example's shapes: ",
                                     at.status().message()));
  }
  auto request = std::make_shared<v1::ExpandRequest>(*xr);
  xr->mutable_graph()->Swap(&*at);
  p->symbolic = std::move(request);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PreparedSpec> PrepareJobSpec(v1::JobSpec spec, const Expander& expand) {
  if (absl::Status s = ValidateJobSpec(spec); !s.ok()) return s;
  PreparedSpec p;
  p.placeholders = ir::PlaceholderNames::Of(spec.graph());
  absl::StatusOr<ir::Schedule> schedule = JobScheduleOf(spec, p.placeholders);
  if (!schedule.ok()) return schedule.status();
  p.schedule = *std::move(schedule);
  spec.clear_schedule();
  v1::ExpandRequest xr;
  xr.set_allocated_graph(spec.release_graph());
  xr.set_world_size(spec.world_size());
  xr.set_bucket_cap_mb(spec.bucket_cap_mb());
  xr.set_first_bucket_mb(spec.first_bucket_mb());
  xr.set_sync_batchnorm(spec.sync_batchnorm());
  xr.set_style(spec.style());
  const auto start = std::chrono::steady_clock::now();
  if (ir::HasSymbolicSizes(xr.graph())) {
    if (absl::Status s = KeepSymbolic(&xr, &p); !s.ok()) return s;
  }
  absl::StatusOr<v1::ExpandResponse> expanded = expand(xr);
  if (!expanded.ok()) {
    return absl::Status(expanded.status().code(),
                        absl::StrCat("expanding the graph for ", spec.world_size(), " ranks",
                                     p.symbolic ? absl::StrCat(" at its traced example's shapes (",
                                                               ir::InputShapesText(p.example), ")")
                                                : "",
                                     ": ", expanded.status().message()));
  }
  if (expanded->graphs_size() == 0) return absl::InternalError("the expansion returned no graph");
  p.compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  p.expanded = *std::move(expanded);
  const v1::GraphDef& graph = p.symbolic ? p.symbolic->graph() : xr.graph();
  p.inputs = GraphInputs(graph);
  p.state = ir::DeclaredTensors::Of(graph, ir::DeclaredTensors::Kind::kState);
  p.batch = ir::DeclaredTensors::Of(graph, ir::DeclaredTensors::Kind::kBatch);
  absl::StatusOr<ir::DeclaredTensors> sent = SentStateOf(spec, p.state);
  if (!sent.ok()) return sent.status();
  p.sent = *std::move(sent);
  if (spec.has_eval()) {
    absl::StatusOr<v1::ExpandResponse> eval = PrepareEval(spec, xr.graph(), p.expanded, expand);
    if (!eval.ok()) return eval.status();
    p.eval = *std::move(eval);
    spec.mutable_eval()->clear_graph();
  }
  p.spec = std::move(spec);
  return p;
}

}  // namespace fxdp::server
