#include "server/jobs/submit_call.h"

#include <utility>

#include "server/grpc_status.h"

namespace fxdp::server {

SubmitCall::SubmitCall(const JobContext* context, JobOwner owner, IdentityQuota::Slot slot)
    : context_(context), slot_(std::move(slot)), job_(std::make_shared<Job>(std::move(owner))) {
  {
    std::lock_guard<std::mutex> l(rmu_);
    MaybeRead();  // the spec (budget_ 1, buffered_ 0)
  }
  std::lock_guard<std::mutex> l(start_mu_);
  thread_ = std::thread([this] { End(ToGrpcStatus(RunJob(*context_, this, job_))); });
}

void SubmitCall::Write(v1::JobEvent e) {
  std::lock_guard<std::mutex> l(wmu_);
  if (finishing_) return;
  writes_.push_back(std::move(e));
  if (!writing_) {
    writing_ = true;
    StartWrite(&writes_.front());
  }
}

void SubmitCall::SetReadBudget(size_t bytes) {
  std::lock_guard<std::mutex> l(rmu_);
  budget_ = bytes;
  MaybeRead();
}

void SubmitCall::Consumed(size_t bytes) {
  std::lock_guard<std::mutex> l(rmu_);
  buffered_ -= bytes;
  MaybeRead();
}

void SubmitCall::End(const grpc::Status& s) {
  std::lock_guard<std::mutex> l(wmu_);
  finishing_ = true;
  final_ = s;
  if (!writing_) Finish(s);
}

void SubmitCall::MaybeRead() {
  if (reading_ || read_ended_ || buffered_ >= budget_) return;
  reading_ = true;
  incoming_.Clear();
  StartRead(&incoming_);
}

void SubmitCall::OnReadDone(bool ok) {
  std::lock_guard<std::mutex> l(rmu_);
  reading_ = false;
  if (!ok) {
    job_->ClientEnded();
    read_ended_ = true;
    return;
  }
  const size_t bytes = incoming_.ByteSizeLong() + kMessageOverhead;
  job_->FromClient(std::move(incoming_), bytes);
  buffered_ += bytes;
  MaybeRead();
}

void SubmitCall::OnWriteDone(bool ok) {
  std::lock_guard<std::mutex> l(wmu_);
  writes_.pop_front();
  if (!ok) writes_.clear();  // the client is gone
  if (!writes_.empty()) {
    StartWrite(&writes_.front());
    return;
  }
  writing_ = false;
  if (finishing_) Finish(final_);
}

void SubmitCall::OnCancel() { job_->ClientGone(); }

void SubmitCall::OnDone() {
  { std::lock_guard<std::mutex> l(start_mu_); }  // thread_ is assigned
  thread_.join();
  delete this;
}

}  // namespace fxdp::server
