// SubmitCall: one JobService.Submit call (gRPC's callback API), the job's
// JobClient: the client's messages are read into the job's from_client
// (ahead up to the byte budget the runner sets), events are written in order
// from a queue, and a job thread runs the job (RunJob) and ends the call
// with its status, mapped once by ToGrpcStatus.
#ifndef FXDP_SERVER_JOBS_SUBMIT_CALL_H_
#define FXDP_SERVER_JOBS_SUBMIT_CALL_H_

#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "grpcpp/grpcpp.h"
#include "proto/fxdp/v1/jobs.pb.h"
#include "server/jobs/identity_quota.h"
#include "server/jobs/job.h"
#include "server/jobs/job_runner.h"

namespace fxdp::server {

class SubmitCall final : public grpc::ServerBidiReactor<v1::SubmitJobRequest, v1::JobEvent>,
                         public JobClient {
 public:
  // `context` outlives every call; `owner` submits the job; `slot` is its
  // Submit stream's (--max-submit-streams), held until the call is done.
  SubmitCall(const JobContext* context, JobOwner owner, IdentityQuota::Slot slot);

  void Write(v1::JobEvent e) override;
  void SetReadBudget(size_t bytes) override;
  void Consumed(size_t bytes) override;

 private:
  // Finishes the call once the queued events are written.
  void End(const grpc::Status& s);
  void MaybeRead();  // rmu_ held
  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

  // Each message counts its overhead too: empty ones must not pile up.
  static constexpr size_t kMessageOverhead = 64;

  const JobContext* const context_;
  IdentityQuota::Slot slot_;
  const std::shared_ptr<Job> job_;
  std::mutex rmu_;
  v1::SubmitJobRequest incoming_;  // the outstanding read's message
  bool reading_ = false, read_ended_ = false;
  size_t budget_ = 1, buffered_ = 0;  // at first: one message, the spec
  std::mutex wmu_;
  std::deque<v1::JobEvent> writes_;  // the front one is being written
  bool writing_ = false, finishing_ = false;
  grpc::Status final_;
  std::mutex start_mu_;  // held while thread_ is assigned
  std::thread thread_;
};

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_SUBMIT_CALL_H_
