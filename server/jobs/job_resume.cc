#include "server/jobs/job_resume.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "analysis/ir/declared_tensors.h"
#include "expansion/style_proto.h"
#include "server/audit.h"
#include "server/jobs/raw_tensors.h"

namespace fxdp::server {
namespace {

// "'addmm' (#9, aten::addmm)".
std::string NodeText(const v1::Node& n, int index) {
  std::string target = n.target().name();
  if (!n.target().overload().empty()) absl::StrAppend(&target, ".", n.target().overload());
  return absl::StrCat("'", n.name(), "' (#", index,
                      target.empty() ? "" : absl::StrCat(", ", target), ")");
}

// Every placeholder by state name: its role and type, as text.
std::map<std::string, std::string> Placeholders(const v1::GraphDef& g) {
  std::map<std::string, std::string> out;
  for (const v1::Node& n : g.nodes()) {
    if (n.kind() != v1::PLACEHOLDER) continue;
    std::string type = "a non-tensor";
    if (n.outputs_size() > 0 && n.outputs(0).kind() == v1::TENSOR) {
      const v1::TensorMeta& t = n.outputs(0).tensor();
      type = TypeString(t.dtype(), std::vector<int64_t>(t.shape().begin(), t.shape().end()));
    }
    out[n.placeholder().state_name()] =
        absl::StrCat(type, " ", v1::PlaceholderRole_Name(n.placeholder().role()));
  }
  return out;
}

// Refuses a resume of `old` (`id`) while another job resumes it or after one
// completed it; else claims it for `self`. Under one mutex for all claims
// (check and claim are one step; each job's mu is taken alone, inside it).
absl::Status ClaimResume(const JobTable& table, const std::shared_ptr<Job>& old,
                         const std::string& id, const std::shared_ptr<Job>& self) {
  static std::mutex* const claims = new std::mutex;
  std::lock_guard<std::mutex> l(*claims);
  // The claim covers a resume not yet queued (its JobInfo not yet naming
  // `id`); the table, those queued, ended, or recovered after a restart.
  const std::shared_ptr<Job> claimed = old->resumed_by();
  std::vector<std::shared_ptr<Job>> others;
  if (claimed != nullptr && claimed != self) others.push_back(claimed);
  for (const std::shared_ptr<Job>& j : table.All()) {
    if (j != self && j != claimed) others.push_back(j);
  }
  for (const std::shared_ptr<Job>& j : others) {
    const v1::JobInfo info = j->Info();
    if (j != claimed && info.resumed_from() != id) continue;
    const std::string& other = info.job_id();
    const v1::JobState state = info.state();
    if (HasFinalState(state)) {
      return absl::FailedPreconditionError(
          absl::StrCat("job '", id, "' was resumed already: job '", other,
                       "' resumed it and SUCCEEDED (its final state: FetchState "
                       "of '",
                       other, "')"));
    }
    if (!Terminal(state)) {
      return absl::FailedPreconditionError(
          other.empty()
              ? absl::StrCat("job '", id,
                             "' is being resumed already by another Submit (one resume of "
                             "a job at a time)")
              : absl::StrCat("job '", id, "' is being resumed already by job '", other, "' (",
                             StateName(state),
                             "): one resume of a job at a time; wait for it or "
                             "cancel it (fxdp cancel ",
                             other, ")"));
    }
  }
  old->set_resumed_by(self);
  return absl::OkStatus();
}

}  // namespace

std::string GraphDifference(const v1::GraphDef& before, const v1::GraphDef& now) {
  const std::map<std::string, std::string> a = Placeholders(before), b = Placeholders(now);
  for (const auto& [name, type] : a) {
    auto it = b.find(name);
    if (it == b.end())
      return absl::StrCat("state tensor or input '", name, "' (", type,
                          ") is not in the new graph");
    if (it->second != type) {
      return absl::StrCat("state tensor or input '", name, "' is ", type,
                          " in the resumed job's graph, ", it->second, " in the new one");
    }
  }
  for (const auto& [name, type] : b) {
    if (a.count(name) == 0) {
      return absl::StrCat("the new graph has state tensor or input '", name, "' (", type,
                          "), the resumed job's has not");
    }
  }
  if (before.nodes_size() != now.nodes_size()) {
    return absl::StrCat("the resumed job's graph has ", before.nodes_size(), " nodes, the new one ",
                        now.nodes_size());
  }
  for (int i = 0; i < before.nodes_size(); ++i) {
    const v1::Node &x = before.nodes(i), &y = now.nodes(i);
    if (x.SerializeAsString() == y.SerializeAsString()) continue;
    if (NodeText(x, i) != NodeText(y, i)) {
      return absl::StrCat("node ", NodeText(x, i), " in the resumed job's graph is node ",
                          NodeText(y, i), " in the new one");
    }
    return absl::StrCat("node ", NodeText(x, i), " differs (its arguments or output types)");
  }
  return "";
}

namespace {

// "" when `spec` may continue the job that ran as `was` (no state of its own, the same world
// size, style, batch norm and graph), else what differs. From a checkpoint on the workers
// (`reshards`) the world size and style may differ: each rank reads its part.
std::string SpecDifference(const v1::JobSpec& spec, const v1::JobSpec& was, bool reshards) {
  if (spec.num_state_tensors() != 0) {
    return absl::StrCat(
        "a resumed job starts from its checkpoint's state; JobSpec.num_state_tensors must "
        "be 0, got ",
        spec.num_state_tensors());
  }
  if (spec.has_initial_checkpoint()) {
    return "JobSpec.initial_checkpoint and resume_job exclude each other: a resumed job starts "
           "from its checkpoint's state";
  }
  if (!reshards && spec.world_size() != was.world_size()) {
    return absl::StrCat("world_size is ", spec.world_size(), ", the job ran on ", was.world_size(),
                        " (its state is on the server, whole per rank: only a checkpoint its "
                        "workers wrote, JobSpec.checkpoints, is read on another world size)");
  }
  if (!reshards && StyleName(spec.style()) != StyleName(was.style())) {
    return absl::StrCat("style is ", StyleName(spec.style()), ", the job ran ",
                        StyleName(was.style()));
  }
  if (spec.sync_batchnorm() != was.sync_batchnorm()) {
    return absl::StrCat("sync_batchnorm is ", spec.sync_batchnorm() ? "on" : "off",
                        ", the job ran with it ", was.sync_batchnorm() ? "on" : "off");
  }
  if (const std::string d = GraphDifference(was.graph(), spec.graph()); !d.empty()) {
    return absl::StrCat("the graph differs: ", d);
  }
  return "";
}

// FAILED_PRECONDITION: `id` cannot be resumed (why), and what can be done instead.
absl::Status NotResumable(const std::string& id, const v1::JobInfo& info, bool on_workers,
                          const std::string& why) {
  const std::string instead =
      on_workers ? absl::StrCat("its work is in its workers' checkpoint '", info.checkpoint_path(),
                                "' (step ", info.checkpoint_step(),
                                "): start a job from it with JobSpec.initial_checkpoint")
                 : absl::StrCat("the state it kept can be fetched: fxdp fetch ", id);
  return absl::FailedPreconditionError(
      absl::StrCat("job '", id, "' cannot be resumed: ", why, " (", instead, ")"));
}

}  // namespace

// The checkpoint at `path` as the initial_checkpoint of every state tensor of
// `graph` (a checkpoint the workers wrote holds each under its state name).
v1::CheckpointSource WholeStateFrom(const std::string& path, const v1::GraphDef& graph) {
  v1::CheckpointSource source;
  source.set_path(path);
  const ir::DeclaredTensors state =
      ir::DeclaredTensors::Of(graph, ir::DeclaredTensors::Kind::kState);
  for (const std::string& name : state.names()) {
    v1::CheckpointTensor* t = source.add_tensors();
    t->set_state_name(name);
    t->set_checkpoint_name(name);
  }
  return source;
}

absl::StatusOr<ResumeStart> PrepareResume(const JobTable& table, JobStore* store,
                                          const JobOwner& caller, const v1::JobSpec& spec,
                                          int64_t checkpoint_every,
                                          const std::shared_ptr<Job>& self) {
  const std::string& id = spec.resume_job();
  absl::StatusOr<std::shared_ptr<Job>> found = table.Find(id);
  if (!found.ok()) return found.status();
  const std::shared_ptr<Job>& old = *found;
  // As GetJob/CancelJob/FetchState (job_service.cc): the owner, an admin, or
  // anyone when the server does not authenticate; another identity's job is
  // NOT_FOUND like an unknown one (ids cannot be probed), audit-logged.
  if (caller.authenticated && !caller.admin && caller.identity != old->owner().identity) {
    Audit("resume", {{"identity", caller.description},
                     {"peer", caller.peer},
                     {"job", id},
                     {"result", "denied"}});
    return table.NotFound(id);
  }
  const v1::JobInfo info = old->Info();
  // Its workers wrote its checkpoints and the server kept no state of it.
  const bool on_workers = !info.has_state() && !info.checkpoint_path().empty();
  if (store == nullptr) {
    return NotResumable(id, info, on_workers,
                        "this server keeps no job records (start it with --state-dir DIR)");
  }
  if (!Resumable(info.state())) {
    return absl::FailedPreconditionError(absl::StrCat("job '", id, "' is ", StateName(info.state()),
                                                      ": only a FAILED or CANCELLED job can be "
                                                      "resumed"));
  }
  absl::StatusOr<JobStore::ResumePoint> point = store->ReadResumePoint(id);
  if (!point.ok()) return point.status();
  const int64_t k = on_workers ? info.checkpoint_step() : point->checkpoint_step;
  if (k <= 0 || !point->spec.has_graph()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", id, "' has no checkpoint to resume from: it ended after ", info.steps_done(),
        " steps without a state to keep (its error says why) and before its first checkpoint "
        "(fxdp-server --checkpoint-every ",
        checkpoint_every > 0 ? absl::StrCat(checkpoint_every) : "is off",
        ", or JobSpec.checkpoints)"));
  }
  auto differs = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resume job '", id, "': ", what));
  };
  if (const std::string d = SpecDifference(spec, point->spec, on_workers); !d.empty())
    return differs(d);
  ResumeStart out;
  if (on_workers) {
    out.step = k;
    out.on_workers = WholeStateFrom(info.checkpoint_path(), spec.graph());
  } else {
    // The file's step holds (the database's may lag it by one checkpoint).
    absl::StatusOr<JobStore::Checkpoint> checkpoint = store->ReadCheckpoint(id);
    if (!checkpoint.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job '", id, "': its checkpoint of step ", k, " ('", store->CheckpointPath(id),
          "') cannot be read: ", checkpoint.status().message()));
    }
    out.step = checkpoint->step;
    out.state = std::move(checkpoint->state);
  }
  if (spec.steps() > 0 && spec.steps() <= out.step) {
    return differs(absl::StrCat("its checkpoint is at step ", out.step, " and JobSpec.steps is ",
                                spec.steps(), ": no step is left to run"));
  }
  if (absl::Status s = ClaimResume(table, old, id, self); !s.ok()) return s;
  out.from = id;
  const int n = static_cast<int>(std::min<int64_t>(out.step, info.losses_size()));
  out.losses.assign(info.losses().begin(), info.losses().begin() + n);
  for (const v1::EvalMetrics& e : info.evals()) {
    if (e.step() <= out.step) out.evals.push_back(e);
  }
  return out;
}

}  // namespace fxdp::server
