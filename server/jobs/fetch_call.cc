#include "server/jobs/fetch_call.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/grpc_status.h"
#include "server/log.h"

namespace fxdp::server {

FetchCall::FetchCall(grpc::CallbackServerContext* context, std::string job_id, StateReader state,
                     size_t chunk_bytes, double idle_s, IdentityQuota::Slot slot)
    : job_id_(std::move(job_id)),
      state_(std::move(state)),
      chunk_bytes_(chunk_bytes),
      idle_s_(idle_s),
      slot_(std::move(slot)) {
  watch_->context = context;
  WriteNext();
}

void FetchCall::WriteNext() {
  chunk_.Clear();
  absl::StatusOr<bool> more = state_.Next(chunk_bytes_, chunk_.mutable_tensor());
  if (!more.ok()) {
    Log(absl::StrCat("FetchState of ", job_id_, ": ", more.status().message()));
    Finish(ToGrpcStatus(more.status()));
    return;
  }
  if (!*more) chunk_.clear_tensor();  // an empty state: one chunk, the last
  chunk_.set_job_id(job_id_);
  chunk_.set_last(state_.done());
  ArmIdleAlarm();
  StartWrite(&chunk_);
}

void FetchCall::ArmIdleAlarm() {
  uint64_t armed = 0;
  {
    std::lock_guard<std::mutex> l(watch_->mu);
    armed = watch_->writes;
  }
  // Replacing the alarm cancels the previous one (its callback sees ok = false).
  alarm_ = std::make_unique<grpc::Alarm>();
  const std::string id = job_id_;
  const double idle = idle_s_;
  alarm_->Set(std::chrono::system_clock::now() +
                  std::chrono::duration_cast<std::chrono::system_clock::duration>(
                      std::chrono::duration<double>(idle)),
              [watch = watch_, armed, id, idle](bool fired) {
                std::lock_guard<std::mutex> l(watch->mu);
                if (!fired || watch->context == nullptr || watch->writes != armed) return;
                Log(absl::StrCat("FetchState of ", id, ": the client took no chunk for ", idle,
                                 " s (fxdp-server --client-idle-s); cancelled"));
                watch->context->TryCancel();
              });
}

void FetchCall::OnWriteDone(bool ok) {
  {
    std::lock_guard<std::mutex> l(watch_->mu);
    ++watch_->writes;
  }
  if (!ok) {  // the client went away, or the call was cancelled
    Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
    return;
  }
  if (chunk_.last()) {
    Finish(grpc::Status::OK);
    return;
  }
  WriteNext();
}

void FetchCall::OnDone() {
  {
    std::lock_guard<std::mutex> l(watch_->mu);
    watch_->context = nullptr;
  }
  delete this;
}

}  // namespace fxdp::server
