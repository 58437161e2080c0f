#include "client/cli/job_format.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "analysis/ir/instantiate.h"
#include "client/cli/commands.h"
#include "client/cli/connect.h"
#include "expansion/style_proto.h"

namespace fxdp::cli {

std::string StateName(v1::JobState s) {
  switch (s) {
    case v1::JOB_STATE_QUEUED: return "QUEUED";
    case v1::JOB_STATE_RUNNING: return "RUNNING";
    case v1::JOB_STATE_SUCCEEDED: return "SUCCEEDED";
    case v1::JOB_STATE_FAILED: return "FAILED";
    case v1::JOB_STATE_CANCELLED: return "CANCELLED";
    default: return "UNKNOWN";
  }
}

std::string CodeName(grpc::StatusCode c) {
  static const char* kNames[] = {"OK",
                                 "CANCELLED",
                                 "UNKNOWN",
                                 "INVALID_ARGUMENT",
                                 "DEADLINE_EXCEEDED",
                                 "NOT_FOUND",
                                 "ALREADY_EXISTS",
                                 "PERMISSION_DENIED",
                                 "RESOURCE_EXHAUSTED",
                                 "FAILED_PRECONDITION",
                                 "ABORTED",
                                 "OUT_OF_RANGE",
                                 "UNIMPLEMENTED",
                                 "INTERNAL",
                                 "UNAVAILABLE",
                                 "DATA_LOSS",
                                 "UNAUTHENTICATED"};
  const int i = static_cast<int>(c);
  return i >= 0 && i < 17 ? kNames[i] : absl::StrCat("CODE_", i);
}

int ReportRpcError(const std::string& cmd, const std::string& server, const grpc::Status& s) {
  const grpc::StatusCode c = s.error_code();
  if (c == grpc::StatusCode::UNAVAILABLE || c == grpc::StatusCode::DEADLINE_EXCEEDED) {
    std::fprintf(stderr, "fxdp %s: server %s: %s%s\n", cmd.c_str(), server.c_str(),
                 s.error_message().c_str(), UnreachableHint(s).c_str());
    return kExitIo;
  }
  std::fprintf(stderr, "fxdp %s: %s: %s\n", cmd.c_str(), CodeName(c).c_str(),
               s.error_message().c_str());
  return kExitInvalidInput;
}

nlohmann::ordered_json InfoJson(const v1::JobInfo& j) {
  nlohmann::ordered_json o;
  o["job_id"] = j.job_id();
  o["name"] = j.name();
  if (!j.owner().empty()) o["owner"] = j.owner();
  o["state"] = StateName(j.state());
  o["world_size"] = j.world_size();
  o["style"] = StyleName(j.style());
  o["steps"] = j.steps();
  o["steps_done"] = j.steps_done();
  o["workers"] = std::vector<std::string>(j.workers().begin(), j.workers().end());
  o["losses"] = std::vector<double>(j.losses().begin(), j.losses().end());
  o["last_loss"] = j.losses_size() ? nlohmann::ordered_json(j.losses(j.losses_size() - 1))
                                   : nlohmann::ordered_json(nullptr);
  o["error"] = j.error();
  o["error_code"] = j.error_code();
  o["submitted_unix_ms"] = j.submitted_unix_ms();
  o["ended_unix_ms"] = j.ended_unix_ms();
  o["has_state"] = j.has_state();
  o["state_evicted"] = j.state_evicted();
  o["queue_position"] = j.queue_position();
  o["message"] = j.message();
  o["started_unix_ms"] = j.started_unix_ms();
  o["data_paths"] = std::vector<std::string>(j.data_paths().begin(), j.data_paths().end());
  o["hyperparameters"] =
      std::vector<std::string>(j.hyperparameters().begin(), j.hyperparameters().end());
  o["compile_cached"] = j.compile_cached();
  o["checkpoint_step"] = j.checkpoint_step();
  o["checkpoint_path"] = j.checkpoint_path();
  o["resumed_from"] = j.resumed_from();
  nlohmann::ordered_json shapes = nlohmann::ordered_json::array();
  for (const v1::CompiledShape& c : j.shapes()) {
    shapes.push_back({{"shape", c.shape()},
                      {"steps", c.steps()},
                      {"compile_ms", c.compile_ms()},
                      {"evicted", c.evicted()}});
  }
  o["shapes"] = std::move(shapes);
  nlohmann::ordered_json evals = nlohmann::ordered_json::array();
  for (const v1::EvalMetrics& e : j.evals()) {
    nlohmann::ordered_json metrics = nlohmann::ordered_json::object();
    for (const v1::NamedValue& v : e.metrics()) metrics[v.name()] = v.value();
    evals.push_back({{"step", e.step()},
                     {"metrics", std::move(metrics)},
                     {"batches", e.batches()},
                     {"eval_ms", e.eval_ms()}});
  }
  o["evals"] = std::move(evals);
  return o;
}

std::string EvalShort(const v1::EvalMetrics& e, int max_metrics) {
  std::string out = absl::StrCat("step ", e.step(), ":");
  for (int i = 0; i < e.metrics_size() && i < max_metrics; ++i)
    absl::StrAppend(&out, " ", e.metrics(i).name(), "=",
                    absl::StrFormat("%.6g", e.metrics(i).value()));
  if (e.metrics_size() > max_metrics) absl::StrAppend(&out, " ...");
  return out;
}

std::string InfoText(const v1::JobInfo& j) {
  std::string out;
  absl::StrAppendFormat(&out, "job        %s\n", j.job_id());
  absl::StrAppendFormat(&out, "name       %s\n", j.name().empty() ? "-" : j.name());
  if (!j.owner().empty()) absl::StrAppendFormat(&out, "owner      %s\n", j.owner());
  absl::StrAppendFormat(&out, "state      %s\n", StateName(j.state()));
  if (j.state() == v1::JOB_STATE_QUEUED) {
    absl::StrAppendFormat(&out, "queue      position %d: %s\n", j.queue_position(), j.message());
  }
  absl::StrAppendFormat(&out, "world size %d\n", j.world_size());
  absl::StrAppendFormat(&out, "style      %s\n", StyleName(j.style()));
  absl::StrAppendFormat(
      &out, "steps      %d/%s\n", j.steps_done(),
      j.steps() > 0 ? absl::StrCat(j.steps()) : "? (until the client's last batch)");
  std::string workers;
  for (int i = 0; i < j.workers_size(); ++i)
    absl::StrAppend(&workers, i ? ", " : "", "rank ", i, ": ", j.workers(i));
  absl::StrAppendFormat(&out, "workers    %s\n", workers.empty() ? "-" : workers);
  std::string losses;
  for (int i = 0; i < j.losses_size(); ++i)
    absl::StrAppendFormat(&losses, "%s%.6g", i ? " " : "", j.losses(i));
  absl::StrAppendFormat(&out, "losses     %s\n", losses.empty() ? "-" : losses);
  if (j.data_paths_size() > 0) {
    absl::StrAppendFormat(&out, "data       %s (on the workers)\n",
                          absl::StrJoin(j.data_paths(), ", "));
  }
  if (j.hyperparameters_size() > 0) {
    absl::StrAppendFormat(&out, "hyper-params %s\n", absl::StrJoin(j.hyperparameters(), ", "));
  }
  absl::StrAppendFormat(&out, "compiled   %s\n",
                        j.compile_cached() ? "from the compile cache" : "for this job");
  for (const v1::CompiledShape& c : j.shapes()) {
    absl::StrAppendFormat(&out, "shape      %s: %d steps, compiled in %.1f ms%s\n", c.shape(),
                          c.steps(), c.compile_ms(), c.evicted() ? " (evicted: max_shapes)" : "");
  }
  if (j.evals_size() > 0) {
    // The last few (a job evaluates at most 10,000 times).
    constexpr int kShown = 3;
    std::vector<std::string> shown;
    for (int i = std::max(0, j.evals_size() - kShown); i < j.evals_size(); ++i)
      shown.push_back(EvalShort(j.evals(i), 4));
    absl::StrAppendFormat(&out, "evaluations %d%s: %s\n", j.evals_size(),
                          j.evals_size() > kShown ? absl::StrCat(", the last ", kShown) : "",
                          absl::StrJoin(shown, "; "));
  }
  absl::StrAppendFormat(
      &out, "final state %s\n",
      j.has_state() ? "kept" : (j.state_evicted() ? "evicted (--max-state-mb)" : "-"));
  if (!j.resumed_from().empty()) absl::StrAppendFormat(&out, "resumes    %s\n", j.resumed_from());
  if (!j.checkpoint_path().empty()) {
    absl::StrAppendFormat(&out, "checkpoint step %d: %s (written by the workers)\n",
                          j.checkpoint_step(), j.checkpoint_path());
  } else if (j.checkpoint_step() > 0) {
    absl::StrAppendFormat(
        &out, "checkpoint step %d%s\n", j.checkpoint_step(),
        j.state() == v1::JOB_STATE_FAILED
            ? absl::StrCat(" (fxdp run ... --resume ", j.job_id(), " continues from it)")
            : "");
  }
  if (!j.error().empty()) absl::StrAppendFormat(&out, "error      %s\n", j.error());
  return out;
}

void PrintLine(const nlohmann::ordered_json& o) {
  const std::string s = o.dump() + "\n";
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

nlohmann::ordered_json EventJson(const v1::JobEvent& e, int64_t steps) {
  nlohmann::ordered_json o;
  o["event"] = "job";
  o["job_id"] = e.job_id();
  o["state"] = StateName(e.state());
  o["step"] = e.step();
  o["steps"] = steps;
  if (e.first_step() > 0) o["first_step"] = e.first_step();
  if (e.state() == v1::JOB_STATE_QUEUED) {
    o["queue_position"] = e.queue_position();
    o["message"] = e.message();
  }
  if (e.step() > 0 && e.state() == v1::JOB_STATE_RUNNING && !e.has_eval()) {
    o["loss"] = e.loss();
    o["step_ms"] = e.step_ms();
    o["local_losses"] = std::vector<double>(e.local_losses().begin(), e.local_losses().end());
    if (!e.shape().empty()) o["shape"] = e.shape();
    nlohmann::ordered_json outputs = nlohmann::ordered_json::object();
    for (const v1::NamedValue& v : e.outputs()) outputs[v.name()] = v.value();
    o["outputs"] = std::move(outputs);
  }
  if (e.has_eval()) {
    nlohmann::ordered_json metrics = nlohmann::ordered_json::object();
    for (const v1::NamedValue& v : e.eval().metrics()) metrics[v.name()] = v.value();
    o["eval"] = {{"step", e.eval().step()},
                 {"metrics", std::move(metrics)},
                 {"batches", e.eval().batches()},
                 {"eval_ms", e.eval().eval_ms()}};
  }
  o["workers"] = std::vector<std::string>(e.workers().begin(), e.workers().end());
  if (!e.error().empty()) o["error"] = e.error();
  return o;
}

BatchCounts CountBatch(const v1::GraphDef& graph) {
  BatchCounts b;
  for (const v1::Node& n : graph.nodes()) {
    if (n.kind() != v1::PLACEHOLDER || n.placeholder().role() != v1::INPUT ||
        n.outputs_size() == 0 || n.outputs(0).kind() != v1::TENSOR)
      continue;
    const v1::TensorMeta& t = n.outputs(0).tensor();
    const int d = n.placeholder().batch_dim();
    if (d < 0 || d >= t.shape_size()) continue;
    // A size that varies per batch (a graph with symbolic sizes) is not known: 0.
    auto varies = [&t](int i) { return i < t.shape_expr_size() && t.shape_expr(i) != 0; };
    if (b.samples_input.empty()) {
      b.samples_input = n.placeholder().state_name();
      b.samples_dim = d;
      b.samples = varies(d) ? 0 : t.shape(d);
    }
    if (b.tokens_input.empty() && (t.dtype() == v1::INT64 || t.dtype() == v1::INT32) &&
        t.shape_size() >= 2) {
      b.tokens_input = n.placeholder().state_name();
      b.tokens = 1;
      for (int i = 0; i < t.shape_size(); ++i) b.tokens *= varies(i) ? 0 : t.shape(i);
    }
  }
  return b;
}

BatchCounts StepCounts(const BatchCounts& graph, const std::string& shape) {
  if (shape.empty()) return graph;
  ir::InputShapes given;
  for (absl::string_view part : absl::StrSplit(shape, ' ', absl::SkipEmpty())) {
    if (!ir::ParseInputShape(part, &given).ok()) return BatchCounts{};
  }
  BatchCounts b = graph;
  auto s = given.find(graph.samples_input);
  b.samples = s != given.end() && graph.samples_dim < static_cast<int>(s->second.size())
                  ? s->second[graph.samples_dim]
                  : 0;
  auto t = given.find(graph.tokens_input);
  b.tokens = 0;
  if (t != given.end()) {
    b.tokens = 1;
    for (int64_t d : t->second) b.tokens *= d;
  }
  return b;
}

StepRate::Rates StepRate::Add(int64_t step, const BatchCounts& counts) {
  seen_.push_back({step, counts.samples, counts.tokens, std::chrono::steady_clock::now()});
  if (seen_.size() > window_) seen_.pop_front();
  Rates r;
  const Seen& first = seen_.front();
  const Seen& last = seen_.back();
  const double dt = std::chrono::duration<double>(last.at - first.at).count();
  if (last.step <= first.step || dt <= 0) return r;
  r.steps = static_cast<double>(last.step - first.step) / dt;
  // The steps after the window's first, each with its own batch.
  int64_t samples = 0, tokens = 0;
  bool known_samples = true, known_tokens = true;
  for (size_t i = 1; i < seen_.size(); ++i) {
    samples += seen_[i].samples;
    tokens += seen_[i].tokens;
    known_samples = known_samples && seen_[i].samples > 0;
    known_tokens = known_tokens && seen_[i].tokens > 0;
  }
  r.samples = known_samples ? static_cast<double>(samples) / dt : 0;
  r.tokens = known_tokens ? static_cast<double>(tokens) / dt : 0;
  return r;
}

}  // namespace fxdp::cli
