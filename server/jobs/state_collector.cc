#include "server/jobs/state_collector.h"

#include <algorithm>
#include <deque>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/jobs/raw_tensors.h"
#include "server/jobs/state_shards.h"

namespace fxdp::server {
namespace {

v1::ServerMessage FetchMessage(const std::string& job_id, size_t chunk_bytes, bool end_job) {
  v1::ServerMessage m;
  m.mutable_fetch_state()->set_job_id(job_id);
  m.mutable_fetch_state()->set_chunk_bytes(static_cast<uint32_t>(chunk_bytes));
  m.mutable_fetch_state()->set_end_job(end_job);
  return m;
}

// REPLICATE: rank 0's state, checked chunk by chunk against the graph.
class ReplicatedState final : public StateCollector {
 public:
  ReplicatedState(std::string job_id, const ir::DeclaredTensors* declared, size_t chunk_bytes)
      : id_(std::move(job_id)), declared_(declared), chunk_bytes_(chunk_bytes) {}

  int Request(Dispatcher* ranks, int64_t step, bool end_job) override {
    if (!ranks->Send(0, FetchMessage(id_, chunk_bytes_, end_job))) return 0;
    if (end_job) ranks->CancelOthers("the job finished (state fetched from rank 0)");
    asked_.push_back({step, end_job});
    return -1;
  }

  bool Awaits(int rank) const override { return rank == 0; }

  absl::Status Add(Job::Msg& msg, std::optional<Collected>* done) override {
    if (msg.rank != 0 || asked_.empty()) return absl::OkStatus();
    if (!check_) {
      check_.emplace(
          asked_.front().end_job ? "the final state of rank 0" : "a checkpoint of rank 0",
          /*keep_data=*/false, declared_);
    }
    v1::StateChunk& c = *msg.m.mutable_state_chunk();
    if (absl::Status s = Check(c); !s.ok()) return s;
    if (c.has_tensor()) state_.push_back(std::move(*c.mutable_tensor()));
    if (!c.last()) return absl::OkStatus();
    done->emplace(Collected{asked_.front().step, std::move(state_)});
    state_.clear();
    check_.reset();
    asked_.pop_front();
    return absl::OkStatus();
  }

  bool pending() const override { return !asked_.empty(); }

 private:
  struct Asked {
    int64_t step;
    bool end_job;
  };

  // A chunk against the graph's state tensors (with `last` the state must be
  // complete): DATA_LOSS naming the tensor and what is wrong.
  absl::Status Check(const v1::StateChunk& c) {
    absl::Status s = c.has_tensor() ? check_->Add(c.tensor()) : absl::OkStatus();
    if (s.ok() && c.last() && (check_->pending() || check_->complete() != declared_->size())) {
      s = absl::InvalidArgumentError(absl::StrCat(check_->what(), " ended after ",
                                                  check_->complete(), " complete tensors of the ",
                                                  declared_->size(), " the graph declares"));
    }
    if (s.ok()) return s;
    return absl::DataLossError(absl::StrCat("job ", id_, ": ", s.message()));
  }

  const std::string id_;
  const ir::DeclaredTensors* const declared_;
  const size_t chunk_bytes_;
  std::deque<Asked> asked_;
  StateStore::State state_;           // of asked_.front(), so far
  std::optional<ChunkStream> check_;  // of state_, against the graph
};

// FULLY_SHARD: every rank's state, the shards gathered into whole tensors.
class ShardedState final : public StateCollector {
 public:
  ShardedState(std::string job_id, int world, const ShardedStateList& sharded, size_t chunk_bytes)
      : id_(std::move(job_id)), world_(world), sharded_(sharded), chunk_bytes_(chunk_bytes) {}

  int Request(Dispatcher* ranks, int64_t step, bool end_job) override {
    if (const int gone = ranks->SendAll(FetchMessage(id_, chunk_bytes_, end_job)); gone >= 0)
      return gone;
    asked_.push_back({step, std::make_unique<StateGatherer>(world_, sharded_, chunk_bytes_),
                      std::vector<bool>(world_, false), world_});
    return -1;
  }

  bool Awaits(int) const override { return true; }

  absl::Status Add(Job::Msg& msg, std::optional<Collected>* done) override {
    // A rank's chunks of one request all come before its next request's.
    auto a = std::find_if(asked_.begin(), asked_.end(),
                          [&](const Asked& x) { return !x.done[msg.rank]; });
    if (a == asked_.end()) return absl::OkStatus();
    const v1::StateChunk& c = msg.m.state_chunk();
    if (c.has_tensor()) {
      if (absl::Status s = a->gather->Add(msg.rank, c.tensor()); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("job ", id_, ": ", s.message()));
      }
    }
    if (c.last()) {
      a->done[msg.rank] = true;
      --a->left;
    }
    if (asked_.front().left > 0) return absl::OkStatus();
    done->emplace(Collected{asked_.front().step, asked_.front().gather->Finish()});
    asked_.pop_front();
    return absl::OkStatus();
  }

  bool pending() const override { return !asked_.empty(); }

 private:
  struct Asked {
    int64_t step;
    std::unique_ptr<StateGatherer> gather;
    std::vector<bool> done;  // per rank: its last chunk came
    int left = 0;            // ranks not done
  };

  const std::string id_;
  const int world_;
  const ShardedStateList& sharded_;
  const size_t chunk_bytes_;
  std::deque<Asked> asked_;
};

}  // namespace

std::unique_ptr<StateCollector> MakeStateCollector(const std::string& job_id, int world,
                                                   const v1::ExpandResponse& expanded,
                                                   const ir::DeclaredTensors* declared,
                                                   size_t chunk_bytes) {
  if (expanded.sharded_state_size() > 0) {
    return std::make_unique<ShardedState>(job_id, world, expanded.sharded_state(), chunk_bytes);
  }
  return std::make_unique<ReplicatedState>(job_id, declared, chunk_bytes);
}

}  // namespace fxdp::server
