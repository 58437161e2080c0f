#include "server/jobs/state_store.h"

#include <algorithm>
#include <utility>

namespace fxdp::server {

uint64_t StateStore::Bytes(const State& state) {
  uint64_t n = 0;
  for (const v1::TensorChunk& c : state) n += c.data().size();
  return n;
}

std::vector<std::string> StateStore::Put(const std::string& job_id,
                                         std::shared_ptr<const State> state) {
  const uint64_t bytes = Bytes(*state);
  return Keep(job_id, std::move(state), bytes);
}

std::vector<std::string> StateStore::PutBytes(const std::string& job_id, uint64_t bytes) {
  return Keep(job_id, nullptr, bytes);
}

std::vector<std::string> StateStore::Keep(const std::string& job_id,
                                          std::shared_ptr<const State> state, uint64_t bytes) {
  Erase(job_id);
  if (bytes > max_bytes_) return {job_id};
  std::vector<std::string> evicted;
  while (bytes_ + bytes > max_bytes_ && !order_.empty()) {
    evicted.push_back(order_.front());
    Erase(order_.front());
  }
  states_[job_id] = Kept{std::move(state), bytes};
  order_.push_back(job_id);
  bytes_ += bytes;
  return evicted;
}

std::shared_ptr<const StateStore::State> StateStore::Get(const std::string& job_id) const {
  auto it = states_.find(job_id);
  return it == states_.end() ? nullptr : it->second.state;
}

void StateStore::Erase(const std::string& job_id) {
  auto it = states_.find(job_id);
  if (it == states_.end()) return;
  bytes_ -= it->second.bytes;
  states_.erase(it);
  order_.erase(std::find(order_.begin(), order_.end(), job_id));
}

}  // namespace fxdp::server
