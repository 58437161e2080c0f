// FetchCall: one JobService.FetchState call (gRPC's callback API). It writes
// the job's final state one StateChunk at a time, building the next chunk
// only once the previous one was written (gRPC's flow control: a client that
// reads slowly is sent slowly), so a call holds one chunk of at most
// kMaxFetchChunkBytes, never the state; the state itself is shared or read
// from its file piece by piece (StateReader). A client that takes no chunk
// for idle_s is cancelled. The call holds its FetchState slot
// (--max-fetch-streams, per identity too) until it is done.
#ifndef FXDP_SERVER_JOBS_FETCH_CALL_H_
#define FXDP_SERVER_JOBS_FETCH_CALL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "grpcpp/alarm.h"
#include "grpcpp/grpcpp.h"
#include "proto/fxdp/v1/jobs.pb.h"
#include "server/jobs/identity_quota.h"
#include "server/jobs/state_reader.h"

namespace fxdp::server {

class FetchCall final : public grpc::ServerWriteReactor<v1::StateChunk> {
 public:
  // Starts writing at once. `chunk_bytes` is already clamped.
  FetchCall(grpc::CallbackServerContext* context, std::string job_id, StateReader state,
            size_t chunk_bytes, double idle_s, IdentityQuota::Slot slot);

  void OnWriteDone(bool ok) override;
  void OnDone() override;

 private:
  // What the idle alarm sees of the call: cleared when the call is done.
  struct Watch {
    std::mutex mu;
    grpc::CallbackServerContext* context = nullptr;
    uint64_t writes = 0;  // chunks written so far
  };

  // Builds and starts the next write, or finishes the call.
  void WriteNext();
  // Cancels the call if no chunk is taken within idle_s from now.
  void ArmIdleAlarm();

  const std::string job_id_;
  StateReader state_;
  const size_t chunk_bytes_;
  const double idle_s_;
  IdentityQuota::Slot slot_;
  v1::StateChunk chunk_;  // the one being written
  std::shared_ptr<Watch> watch_ = std::make_shared<Watch>();
  std::unique_ptr<grpc::Alarm> alarm_;
};

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_FETCH_CALL_H_
