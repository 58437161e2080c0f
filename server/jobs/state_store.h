// StateStore: the final states of succeeded jobs, kept for
// JobService.FetchState within a byte budget (`fxdp-server --max-state-mb`).
// Putting a state evicts the oldest kept ones until the new one fits; a state
// larger than the whole budget is not kept at all. Not thread-safe: the job
// service guards it with its mutex.
#ifndef FXDP_SERVER_JOBS_STATE_STORE_H_
#define FXDP_SERVER_JOBS_STATE_STORE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "proto/fxdp/v1/worker.pb.h"

namespace fxdp::server {

class StateStore {
 public:
  using State = std::vector<v1::TensorChunk>;

  explicit StateStore(uint64_t max_bytes) : max_bytes_(max_bytes) {}

  // Keeps `state` (its tensor data counts against the budget) for `job_id`;
  // returns the jobs whose states were evicted to make room, oldest first,
  // and `job_id` itself when its state alone is over the budget.
  std::vector<std::string> Put(const std::string& job_id, std::shared_ptr<const State> state);
  // The same for a state kept elsewhere (a file): only its bytes count.
  std::vector<std::string> PutBytes(const std::string& job_id, uint64_t bytes);
  // The kept state, or null (also for one kept elsewhere).
  std::shared_ptr<const State> Get(const std::string& job_id) const;
  // Whether a state is kept for the job (here or elsewhere).
  bool Has(const std::string& job_id) const { return states_.count(job_id) > 0; }
  void Erase(const std::string& job_id);

  uint64_t bytes() const { return bytes_; }
  uint64_t max_bytes() const { return max_bytes_; }
  size_t size() const { return states_.size(); }

  static uint64_t Bytes(const State& state);

 private:
  std::vector<std::string> Keep(const std::string& job_id, std::shared_ptr<const State> state,
                                uint64_t bytes);

  struct Kept {
    std::shared_ptr<const State> state;
    uint64_t bytes;
  };
  const uint64_t max_bytes_;
  uint64_t bytes_ = 0;
  std::map<std::string, Kept> states_;
  std::deque<std::string> order_;  // oldest first
};

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_STATE_STORE_H_
