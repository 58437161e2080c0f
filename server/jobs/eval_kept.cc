#include "server/jobs/eval_kept.h"

#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "analysis/ir/declared_tensors.h"
#include "server/audit.h"

namespace fxdp::server {

bool IsEvaluationGraph(const v1::GraphDef& graph) {
  for (const v1::Node& n : graph.nodes()) {
    for (const v1::OutputSpec& s : n.output_specs()) {
      if (s.role() == v1::UPDATED_PARAMETER || s.role() == v1::UPDATED_BUFFER ||
          s.role() == v1::UPDATED_OPTIMIZER_STATE)
        return false;
    }
  }
  return true;
}

absl::StatusOr<StateStore::State> KeptStateToEvaluate(const JobTable& table, const JobOwner& caller,
                                                      const v1::JobSpec& spec) {
  const std::string& id = spec.resume_job();
  if (spec.num_state_tensors() != 0)
    return absl::InvalidArgumentError(absl::StrCat(
        "an evaluation of job '", id, "' starts from the state it kept; JobSpec.num_state_tensors ",
        "must be 0, got ", spec.num_state_tensors()));
  absl::StatusOr<std::shared_ptr<Job>> found = table.Find(id);
  if (!found.ok()) return found.status();
  // As GetJob and FetchState: another identity's job is NOT_FOUND like an unknown one.
  if (caller.authenticated && !caller.admin && caller.identity != (*found)->owner().identity) {
    Audit("evaluate", {{"identity", caller.description},
                       {"peer", caller.peer},
                       {"job", id},
                       {"result", "denied"}});
    return table.NotFound(id);
  }
  absl::StatusOr<StateReader> reader = table.OpenFinalState(id);
  if (!reader.ok()) return reader.status();
  using ir::DeclaredTensors;
  const DeclaredTensors read = DeclaredTensors::Of(spec.graph(), DeclaredTensors::Kind::kState);
  const std::string what = absl::StrCat("the state job '", id, "' kept");
  StateStore::State out;
  std::set<std::string> found_names;
  constexpr size_t kChunkBytes = size_t{4} << 20;
  while (true) {
    v1::TensorChunk c;
    absl::StatusOr<bool> more = reader->Next(kChunkBytes, &c);
    if (!more.ok()) return more.status();
    if (!*more) break;
    if (read.Find(c.name()) == nullptr) continue;  // optimizer state, ...: not read
    if (found_names.insert(c.name()).second) {
      if (absl::Status s = read.CheckFirstChunk(c, what); !s.ok()) return s;
    }
    out.push_back(std::move(c));
  }
  for (const std::string& name : read.names()) {
    if (found_names.count(name) == 0)
      return absl::InvalidArgumentError(absl::StrCat(
          "the evaluation graph reads state '", name, "', which ", what, " lacks (",
          found_names.size(), " of the graph's ", read.size(), " state tensors found)"));
  }
  return out;
}

}  // namespace fxdp::server
