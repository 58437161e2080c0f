#include "server/jobs/job_service.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "security/server_auth.h"
#include "server/audit.h"
#include "server/grpc_status.h"
#include "server/jobs/fetch_call.h"
#include "server/jobs/submit_call.h"
#include "server/log.h"

namespace fxdp::server {
namespace {

using Caller = std::optional<security::Principal>;

// The caller of a JobService call (nullopt without authentication) or the
// status refusing the call (call_auth.h).
grpc::Status CallerOf(security::CallAuth* auth, const grpc::ServerContextBase& ctx,
                      const char* method, Caller* caller) {
  absl::StatusOr<Caller> who =
      security::CallPrincipal(auth, ctx, absl::StrCat("/fxdp.v1.JobService/", method));
  if (!who.ok()) return ToGrpcStatus(who.status());
  *caller = *std::move(who);
  return grpc::Status::OK;
}

// The job `id` when `caller` may see and act on it (its owner, an admin, or
// anyone without authentication). Another identity's job is NOT_FOUND with
// the very text of an unknown one, so that ids cannot be probed (issue 25);
// *denied says which it was, for the audit log.
grpc::Status Authorized(const Caller& caller, const JobTable& table, const std::string& id,
                        std::shared_ptr<Job>* job, bool* denied) {
  *denied = false;
  absl::StatusOr<std::shared_ptr<Job>> found = table.Find(id);
  if (!found.ok()) return ToGrpcStatus(found.status());
  if (!security::MayAccess(caller, (*found)->owner().identity)) {
    *denied = true;
    return ToGrpcStatus(table.NotFound(id));
  }
  *job = *std::move(found);
  return grpc::Status::OK;
}

// An audit line for an action on a job, with its outcome.
void AuditJob(const char* event, const grpc::ServerContextBase& ctx, const Caller& caller,
              const std::string& id, const grpc::Status& s, bool denied) {
  Audit(event, {{"identity", security::Describe(caller)},
                {"peer", ctx.peer()},
                {"job", id},
                {"result", denied   ? "denied"
                           : s.ok() ? "ok"
                                    : s.error_message()}});
}

}  // namespace

JobServiceImpl::JobServiceImpl(CompileServiceImpl* compile, WorkerPool* workers,
                               JobServiceOptions options, JobStore* store,
                               std::shared_ptr<security::CallAuth> auth)
    : auth_(std::move(auth)),
      table_(options, store),
      scheduler_(workers, &table_, options),
      submit_streams_({"Submit streams", options.max_submit_streams, "--max-submit-streams",
                       options.max_submit_streams_per_identity,
                       "--max-submit-streams-per-identity"}),
      fetch_streams_({"FetchState calls", options.max_fetch_streams, "--max-fetch-streams",
                      options.max_fetch_streams_per_identity, "--max-fetch-streams-per-identity"}) {
  context_.options = options;
  context_.expand = [compile](const v1::ExpandRequest& r) { return compile->ExpandCached(r); };
  context_.pool = workers;
  context_.table = &table_;
  context_.scheduler = &scheduler_;
  context_.store = store;
  context_.held_state_bytes = &held_state_bytes_;
  context_.counters = &counters_;
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
      job->Change(JobChange::kFail, queued.status()).IgnoreError();  // refused: logged
      table_.Finished(job);
      continue;
    }
    recovered_.emplace_back([this, job] { RunJob(context_, &no_client_, job).IgnoreError(); });
  }
  return absl::OkStatus();
}

namespace {

// A call refused before it starts (unauthorized, over --max-submit-streams,
// a FetchState not allowed): ended at once, nothing read or written.
template <typename Reactor>
class RefusedCall final : public Reactor {
 public:
  explicit RefusedCall(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};
using RefusedSubmit = RefusedCall<grpc::ServerBidiReactor<v1::SubmitJobRequest, v1::JobEvent>>;

}  // namespace

grpc::ServerBidiReactor<v1::SubmitJobRequest, v1::JobEvent>* JobServiceImpl::Submit(
    grpc::CallbackServerContext* context) {
  Caller who;
  if (grpc::Status s = CallerOf(auth_.get(), *context, "Submit", &who); !s.ok())
    return new RefusedSubmit(s);
  JobOwner owner;
  if (who.has_value()) {
    owner.identity = who->identity;
    owner.authenticated = true;
    owner.admin = who->role == security::Role::kAdmin;
  }
  owner.description = security::Describe(who);
  owner.peer = context->peer();
  absl::StatusOr<IdentityQuota::Slot> slot = submit_streams_.Acquire(owner.identity);
  if (!slot.ok()) {
    if (refused_submits_.fetch_add(1) < 10) {  // then silence
      Log(absl::StrCat("Submit from ", owner.description, " at ", context->peer(),
                       ": refused: ", slot.status().message()));
    }
    return new RefusedSubmit(ToGrpcStatus(slot.status()));
  }
  return new SubmitCall(&context_, std::move(owner), *std::move(slot));
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                                    v1::JobInfo* response) {
  Caller caller;
  if (grpc::Status s = CallerOf(auth_.get(), *context, "GetJob", &caller); !s.ok()) return s;
  std::shared_ptr<Job> j;
  bool denied = false;
  if (grpc::Status s = Authorized(caller, table_, request->job_id(), &j, &denied); !s.ok()) {
    if (denied) AuditJob("get", *context, caller, request->job_id(), s, denied);  // not every poll
    return s;
  }
  *response = j->Info();
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest*,
                                      v1::ListJobsResponse* response) {
  Caller caller;
  if (grpc::Status s = CallerOf(auth_.get(), *context, "ListJobs", &caller); !s.ok()) return s;
  for (const std::shared_ptr<Job>& j : table_.All()) {
    if (!security::MayAccess(caller, j->owner().identity)) continue;
    *response->add_jobs() = j->Info();
  }
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext* context,
                                       const v1::CancelJobRequest* request, v1::JobInfo* response) {
  Caller caller;
  if (grpc::Status s = CallerOf(auth_.get(), *context, "CancelJob", &caller); !s.ok()) return s;
  std::shared_ptr<Job> j;
  bool denied = false;
  const grpc::Status allowed = Authorized(caller, table_, request->job_id(), &j, &denied);
  AuditJob("cancel", *context, caller, request->job_id(), allowed, denied);
  if (!allowed.ok()) return allowed;
  const std::string reason =
      request->reason().empty() ? "CancelJob" : "CancelJob: " + request->reason();
  scheduler_.CancelQueued(request->job_id(), reason,
                          absl::CancelledError(absl::StrCat("job ", request->job_id(),
                                                            " cancelled while queued: ", reason)));
  j->Cancel(reason);
  *response = j->WaitEnded(std::chrono::seconds(5));
  return grpc::Status::OK;
}

void JobServiceImpl::CancelAll(const std::string& reason) {
  scheduler_.CancelAllQueued(reason);
  for (const std::shared_ptr<Job>& j : table_.All()) j->Cancel(reason);
}

std::string JobServiceImpl::OwnerOf(const std::string& id) const {
  absl::StatusOr<std::shared_ptr<Job>> found = table_.Find(id);
  return found.ok() ? (*found)->owner().identity : "";
}

grpc::ServerWriteReactor<v1::StateChunk>* JobServiceImpl::FetchState(
    grpc::CallbackServerContext* context, const v1::FetchJobStateRequest* request) {
  using Refused = RefusedCall<grpc::ServerWriteReactor<v1::StateChunk>>;
  Caller caller;
  if (grpc::Status s = CallerOf(auth_.get(), *context, "FetchState", &caller); !s.ok())
    return new Refused(s);
  std::shared_ptr<Job> j;
  bool denied = false;
  grpc::Status allowed = Authorized(caller, table_, request->job_id(), &j, &denied);
  std::optional<IdentityQuota::Slot> slot;
  if (allowed.ok()) {  // a slot before the state's file is opened
    absl::StatusOr<IdentityQuota::Slot> s =
        fetch_streams_.Acquire(caller.has_value() ? caller->identity : "");
    if (s.ok()) {
      slot = *std::move(s);
    } else {
      allowed = ToGrpcStatus(s.status());
    }
  }
  absl::StatusOr<StateReader> state = absl::PermissionDeniedError("");
  if (allowed.ok()) {
    state = table_.OpenFinalState(request->job_id());
    if (!state.ok()) allowed = ToGrpcStatus(state.status());
  }
  AuditJob("fetch", *context, caller, request->job_id(), allowed, denied);
  if (!allowed.ok()) return new Refused(allowed);
  const size_t asked =
      request->chunk_bytes() > 0 ? request->chunk_bytes() : context_.options.chunk_bytes;
  const size_t chunk =
      std::clamp(asked, kMinFetchChunkBytes, context_.options.max_fetch_chunk_bytes);
  return new FetchCall(context, request->job_id(), *std::move(state), chunk,
                       context_.options.client_idle_s, *std::move(slot));
}

std::string JobServiceImpl::Metrics() const {
  std::vector<v1::JobState> states;
  for (const std::shared_ptr<Job>& j : table_.All()) states.push_back(j->state());
  return MetricsText(states, context_.pool->List(), counters_);
}

}  // namespace fxdp::server
