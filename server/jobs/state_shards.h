// FULLY_SHARD's state in and out of the server, so that a user never handles
// shards: the initial state is split into each rank's flat shards as its
// chunks stream in (StateSplitter), and the ranks' final states are put back
// together into whole tensors (StateGatherer). The layout is
// analysis/ir/flat_shard.h's FlatShardOf: a sharded tensor of n elements, s =
// ceil(n / N); rank r holds elements [r*s, (r+1)*s) of the flattened tensor
// padded with zeros to N*s, as a 1-D [s] tensor of the same dtype. Tensors
// not in the expansion's sharded_state (buffers, scalar optimizer state,
// hyper-parameters, constants) go to every rank whole and come back from
// rank 0. Raw bytes only (no LibTorch), no gRPC.
#ifndef FXDP_SERVER_JOBS_STATE_SHARDS_H_
#define FXDP_SERVER_JOBS_STATE_SHARDS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "proto/fxdp/v1/compile.pb.h"
#include "proto/fxdp/v1/worker.pb.h"
#include "server/jobs/state_store.h"

namespace fxdp::server {

using ShardedStateList = google::protobuf::RepeatedPtrField<v1::ShardedState>;

class StateSplitter {
 public:
  // `sharded`: ExpandResponse.sharded_state; chunks sent are at most
  // `chunk_bytes` of data.
  StateSplitter(int world, const ShardedStateList& sharded, size_t chunk_bytes);

  // One initial-state chunk, already checked against the chunking rules
  // (ChunkStream). Appends to out[r] (out has world entries) what rank r gets
  // from it, in order: a replicated tensor's chunk as it is (re-chunked); of
  // a sharded tensor the part of rank r's shard the chunk covers, and with
  // the tensor's last chunk the zeros that pad the shard to [s].
  // INVALID_ARGUMENT naming the tensor when a sharded tensor's dtype or shape
  // is not the graph's.
  absl::Status Add(const v1::TensorChunk& chunk,
                   std::vector<std::vector<v1::TensorChunk>>* out) const;

 private:
  const int world_;
  const size_t chunk_bytes_;
  std::map<std::string, v1::ShardedState> sharded_;
};

class StateGatherer {
 public:
  StateGatherer(int world, const ShardedStateList& sharded, size_t chunk_bytes);

  // One chunk of rank `rank`'s final state (FetchState's answer).
  // DATA_LOSS naming the rank and tensor for a shard whose dtype or shape is
  // not the expansion's, or bytes past its end.
  absl::Status Add(int rank, const v1::TensorChunk& chunk);
  // Every rank has sent its whole state: rank 0's tensors in rank 0's order,
  // the sharded ones whole (the graph's shape), in chunks of at most
  // chunk_bytes. DATA_LOSS naming the rank and tensor for a shard a rank did
  // not send completely.
  absl::StatusOr<StateStore::State> Finish();

 private:
  struct Whole {
    v1::ShardedState meta;
    int item = 0;
    std::string data;                // numel * item bytes
    std::vector<uint64_t> received;  // per rank: shard bytes received
  };
  const int world_;
  const size_t chunk_bytes_;
  std::map<std::string, Whole> sharded_;
  std::vector<std::string> order_;                       // rank 0's tensor names
  std::set<std::string> seen_;                           // in order_
  std::map<std::string, StateStore::State> replicated_;  // rank 0's chunks
};

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_STATE_SHARDS_H_
