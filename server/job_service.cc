#include "server/job_service.h"

#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/raw_tensors.h"
#include "server/submit_call.h"

namespace fxdp::server {

JobServiceImpl::JobServiceImpl(CompileServiceImpl* compile, WorkerPool* workers, JobServiceOptions options)
    : table_(options), scheduler_(workers, &table_, options) {
  context_.options = options;
  context_.expand = [compile](const v1::ExpandRequest& r) { return compile->ExpandCached(r); };
  context_.pool = workers;
  context_.table = &table_;
  context_.scheduler = &scheduler_;
}

JobServiceImpl::~JobServiceImpl() = default;

grpc::ServerBidiReactor<v1::SubmitJobRequest, v1::JobEvent>* JobServiceImpl::Submit(grpc::CallbackServerContext*) {
  return new SubmitCall(&context_);
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext*, const v1::GetJobRequest* request, v1::JobInfo* response) {
  absl::StatusOr<std::shared_ptr<Job>> j = table_.Find(request->job_id());
  if (!j.ok()) return ToGrpcStatus(j.status());
  std::lock_guard<std::mutex> l((*j)->mu);
  *response = (*j)->info;
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*,
                                      v1::ListJobsResponse* response) {
  for (const std::shared_ptr<Job>& j : table_.All()) {
    std::lock_guard<std::mutex> l(j->mu);
    *response->add_jobs() = j->info;
  }
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext*, const v1::CancelJobRequest* request,
                                       v1::JobInfo* response) {
  absl::StatusOr<std::shared_ptr<Job>> found = table_.Find(request->job_id());
  if (!found.ok()) return ToGrpcStatus(found.status());
  const std::shared_ptr<Job>& j = *found;
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

grpc::Status JobServiceImpl::FetchState(grpc::ServerContext*, const v1::FetchJobStateRequest* request,
                                        grpc::ServerWriter<v1::StateChunk>* writer) {
  absl::StatusOr<std::shared_ptr<const StateStore::State>> found = table_.FinalState(request->job_id());
  if (!found.ok()) return ToGrpcStatus(found.status());
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
