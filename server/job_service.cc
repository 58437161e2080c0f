#include "server/job_service.h"

#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "security/server_auth.h"
#include "server/audit.h"
#include "server/log.h"
#include "server/raw_tensors.h"
#include "server/submit_call.h"

namespace fxdp::server {
namespace {

// The job `id` when the caller may see and act on it (its owner, an admin,
// or anyone without authentication): NOT_FOUND for an unknown job,
// PERMISSION_DENIED naming the caller and what it tried.
grpc::Status Authorized(const grpc::ServerContextBase& ctx, const JobTable& table, const std::string& id,
                        const char* action, std::shared_ptr<Job>* job) {
  absl::StatusOr<std::shared_ptr<Job>> found = table.Find(id);
  if (!found.ok()) return ToGrpcStatus(found.status());
  const std::optional<security::Principal> caller = security::PrincipalOf(ctx);
  if (!security::MayAccess(caller, (*found)->owner.identity)) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat("job '", id, "' belongs to another identity: '", caller->identity,
                                     "' may not ", action, " it (only its owner or an admin may)"));
  }
  *job = *std::move(found);
  return grpc::Status::OK;
}

// An audit line for an action on a job, with its outcome.
void AuditJob(const char* event, const grpc::ServerContextBase& ctx, const std::string& id, const grpc::Status& s) {
  Audit(event, {{"identity", security::Describe(security::PrincipalOf(ctx))},
                {"peer", ctx.peer()},
                {"job", id},
                {"result", s.ok() ? "ok"
                           : s.error_code() == grpc::StatusCode::PERMISSION_DENIED ? "denied"
                                                                                   : s.error_message()}});
}

}  // namespace

JobServiceImpl::JobServiceImpl(CompileServiceImpl* compile, WorkerPool* workers, JobServiceOptions options,
                               JobStore* store)
    : table_(options, store), scheduler_(workers, &table_, options) {
  context_.options = options;
  context_.expand = [compile](const v1::ExpandRequest& r) { return compile->ExpandCached(r); };
  context_.pool = workers;
  context_.table = &table_;
  context_.scheduler = &scheduler_;
  context_.store = store;
  context_.submit_streams = &submit_streams_;
  context_.held_state_bytes = &held_state_bytes_;
}

JobServiceImpl::~JobServiceImpl() {
  if (!recovered_.empty()) CancelAll("the server is shutting down");
  for (std::thread& t : recovered_) t.join();
}

absl::Status JobServiceImpl::Recover() {
  if (context_.store == nullptr) return absl::OkStatus();
  absl::StatusOr<RecoveredJobs> r = RecoverJobs(context_.store, context_.expand);
  if (!r.ok()) return r.status();
  table_.Restore(r->jobs, r->last_seq);
  for (const std::shared_ptr<Job>& job : r->to_run) {  // in their old order
    if (absl::StatusOr<v1::JobEvent> queued = scheduler_.Requeue(job); !queued.ok()) {
      job->SetState(v1::JOB_STATE_FAILED, queued.status());
      table_.Finished(job);
      continue;
    }
    recovered_.emplace_back([this, job] { RunJob(context_, &no_client_, job).IgnoreError(); });
  }
  return absl::OkStatus();
}

namespace {

// A Submit over --max-submit-streams: ended at once, nothing read.
class RefusedSubmit final : public grpc::ServerBidiReactor<v1::SubmitJobRequest, v1::JobEvent> {
 public:
  explicit RefusedSubmit(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerBidiReactor<v1::SubmitJobRequest, v1::JobEvent>* JobServiceImpl::Submit(
    grpc::CallbackServerContext* context) {
  const size_t max = context_.options.max_submit_streams;
  if (submit_streams_.fetch_add(1) >= max) {
    submit_streams_.fetch_sub(1);
    if (refused_submits_.fetch_add(1) < 10) {  // then silence
      Log(absl::StrCat("Submit from ", context->peer(), ": refused: ", max,
                       " Submit streams open (--max-submit-streams)"));
    }
    return new RefusedSubmit(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("this server takes at most ", max,
                     " Submit streams at once (fxdp-server --max-submit-streams)")));
  }
  JobOwner owner;
  const std::optional<security::Principal> who = security::PrincipalOf(*context);
  if (who.has_value()) {
    owner.identity = who->identity;
    owner.authenticated = true;
    owner.admin = who->role == security::Role::kAdmin;
  }
  owner.description = security::Describe(who);
  owner.peer = context->peer();
  return new SubmitCall(&context_, std::move(owner));
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                                    v1::JobInfo* response) {
  std::shared_ptr<Job> j;
  if (grpc::Status s = Authorized(*context, table_, request->job_id(), "see", &j); !s.ok()) return s;
  std::lock_guard<std::mutex> l(j->mu);
  *response = j->info;
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest*,
                                      v1::ListJobsResponse* response) {
  const std::optional<security::Principal> caller = security::PrincipalOf(*context);
  for (const std::shared_ptr<Job>& j : table_.All()) {
    if (!security::MayAccess(caller, j->owner.identity)) continue;
    std::lock_guard<std::mutex> l(j->mu);
    *response->add_jobs() = j->info;
  }
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext* context, const v1::CancelJobRequest* request,
                                       v1::JobInfo* response) {
  std::shared_ptr<Job> j;
  const grpc::Status allowed = Authorized(*context, table_, request->job_id(), "cancel", &j);
  AuditJob("cancel", *context, request->job_id(), allowed);
  if (!allowed.ok()) return allowed;
  const std::string reason = request->reason().empty() ? "CancelJob" : "CancelJob: " + request->reason();
  scheduler_.CancelQueued(request->job_id(), reason,
                          absl::CancelledError(absl::StrCat("job ", request->job_id(), " cancelled while queued: ", reason)));
  j->Cancel(reason);
  std::unique_lock<std::mutex> l(j->mu);
  j->cv.wait_for(l, std::chrono::seconds(5), [&] { return Terminal(j->info.state()); });
  *response = j->info;
  return grpc::Status::OK;
}

void JobServiceImpl::CancelAll(const std::string& reason) {
  scheduler_.CancelAllQueued(reason);
  for (const std::shared_ptr<Job>& j : table_.All()) j->Cancel(reason);
}

grpc::Status JobServiceImpl::FetchState(grpc::ServerContext* context, const v1::FetchJobStateRequest* request,
                                        grpc::ServerWriter<v1::StateChunk>* writer) {
  std::shared_ptr<Job> j;
  grpc::Status allowed = Authorized(*context, table_, request->job_id(), "fetch the state of", &j);
  absl::StatusOr<std::shared_ptr<const StateStore::State>> found = absl::PermissionDeniedError("");
  if (allowed.ok()) {
    found = table_.FinalState(request->job_id());
    if (!found.ok()) allowed = ToGrpcStatus(found.status());
  }
  AuditJob("fetch", *context, request->job_id(), allowed);
  if (!allowed.ok()) return allowed;
  const StateStore::State& state = **found;
  const size_t max = request->chunk_bytes() > 0 ? request->chunk_bytes() : context_.options.chunk_bytes;
  auto write = [&](v1::StateChunk& s) {
    s.set_job_id(request->job_id());
    return writer->Write(s);
  };
  const grpc::Status gone(grpc::StatusCode::CANCELLED, "the client went away");
  if (state.empty()) {
    v1::StateChunk s;
    s.set_last(true);
    if (!write(s)) return gone;
  }
  std::vector<v1::TensorChunk> chunks;
  for (size_t t = 0; t < state.size(); ++t) {
    // One stored chunk at a time: the whole state is never copied.
    chunks.clear();
    RechunkTensor(state[t], max, &chunks);
    for (size_t i = 0; i < chunks.size(); ++i) {
      v1::StateChunk s;
      s.mutable_tensor()->Swap(&chunks[i]);
      s.set_last(t + 1 == state.size() && i + 1 == chunks.size());
      if (!write(s)) return gone;
    }
  }
  return grpc::Status::OK;
}

}  // namespace fxdp::server
