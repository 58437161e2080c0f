// StateCollector: a running job's state out of its ranks, whole: for every
// checkpoint (--checkpoint-every) and for the final state. One interface, one
// implementation per way the ranks hold the state:
//   REPLICATE    every rank holds all of it: rank 0 is asked (FetchState) and
//                its chunks are checked against the tensors the graph
//                declares as they arrive (a worker cannot make the server
//                hold more); for the final state the other ranks end by
//                CancelJob;
//   FULLY_SHARD  (the expansion's sharded_state) every rank is asked and the
//                ranks' flat shards are put back together into whole tensors
//                (StateGatherer, state_shards.h).
// Requests are answered in order (a worker answers between steps, so a
// checkpoint asked after step K is the state after exactly step K; a rank's
// chunks of one request all come before the next's). Another way to take a
// checkpoint (issue 27: workers write their own shards and report them) is
// another implementation. No gRPC here.
#ifndef FXDP_SERVER_JOBS_STATE_COLLECTOR_H_
#define FXDP_SERVER_JOBS_STATE_COLLECTOR_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "analysis/ir/declared_tensors.h"
#include "proto/fxdp/v1/compile.pb.h"
#include "server/jobs/dispatcher.h"
#include "server/jobs/job.h"
#include "server/jobs/state_store.h"

namespace fxdp::server {

class StateCollector {
 public:
  // A state asked for, complete: the job step it is the state after, and
  // the whole tensors, or why they could not be put together.
  struct Collected {
    int64_t step = 0;
    absl::StatusOr<StateStore::State> state;
  };

  virtual ~StateCollector() = default;
  // Asks the ranks for their state after job step `step`; with `end_job` it
  // is the final state and the ranks end after sending it. -1, or the first
  // rank that is gone.
  virtual int Request(Dispatcher* ranks, int64_t step, bool end_job) = 0;
  // Whether a message of `rank` (its end, its chunks) matters to the final
  // state's collection.
  virtual bool Awaits(int rank) const = 0;
  // A rank's StateChunk (`msg` holds one; its data is taken); `done` is set
  // when it completed the oldest request. An error (DATA_LOSS naming the
  // job, the rank and the tensor) fails the job. A chunk nobody asked for is
  // ignored.
  virtual absl::Status Add(Job::Msg& msg, std::optional<Collected>* done) = 0;
  // Requests not yet complete.
  virtual bool pending() const = 0;
};

// The collector for a job of `world` ranks expanded as `expanded` (FULLY_SHARD
// when it lists sharded_state), whose graph declares `declared` state
// tensors (outlives the collector); chunks of at most `chunk_bytes`.
std::unique_ptr<StateCollector> MakeStateCollector(const std::string& job_id, int world,
                                                   const v1::ExpandResponse& expanded,
                                                   const ir::DeclaredTensors* declared,
                                                   size_t chunk_bytes);

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_STATE_COLLECTOR_H_
