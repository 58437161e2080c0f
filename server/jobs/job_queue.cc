#include "server/jobs/job_queue.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace fxdp::server {

absl::Status JobQueue::Push(const std::string& job_id, int world_size) {
  if (queue_.size() >= max_queued_) {
    return absl::ResourceExhaustedError(absl::StrCat("the job queue is full: ", queue_.size(),
                                                     " jobs are waiting for workers (the server's "
                                                     "--max-queued-jobs is ",
                                                     max_queued_, "); retry later"));
  }
  queue_.push_back({job_id, world_size});
  return absl::OkStatus();
}

bool JobQueue::Remove(const std::string& job_id) {
  auto it = std::find_if(queue_.begin(), queue_.end(),
                         [&](const Entry& e) { return e.job_id == job_id; });
  if (it == queue_.end()) return false;
  queue_.erase(it);
  return true;
}

int JobQueue::Position(const std::string& job_id) const {
  for (size_t i = 0; i < queue_.size(); ++i) {
    if (queue_[i].job_id == job_id) return static_cast<int>(i) + 1;
  }
  return 0;
}

std::vector<std::string> JobQueue::Ids() const {
  std::vector<std::string> out;
  for (const Entry& e : queue_) out.push_back(e.job_id);
  return out;
}

std::vector<std::string> JobQueue::Free(const std::vector<std::string>& idle) const {
  std::vector<std::string> out;
  for (const std::string& w : idle) {
    if (!reserved_.count(w)) out.push_back(w);
  }
  return out;
}

std::vector<JobQueue::Dispatch> JobQueue::Take(const std::vector<std::string>& idle) {
  std::vector<std::string> free = Free(idle);
  std::vector<Dispatch> out;
  size_t next = 0;
  while (!queue_.empty() && static_cast<size_t>(queue_.front().world_size) <= free.size() - next) {
    Dispatch d;
    d.job_id = queue_.front().job_id;
    for (int r = 0; r < queue_.front().world_size; ++r) {
      d.workers.push_back(free[next]);
      reserved_[free[next]] = d.job_id;
      ++next;
    }
    queue_.pop_front();
    out.push_back(std::move(d));
  }
  return out;
}

void JobQueue::Release(const std::string& worker, const std::string& job_id) {
  auto it = reserved_.find(worker);
  if (it != reserved_.end() && it->second == job_id) reserved_.erase(it);
}

std::string JobQueue::Holder(const std::string& worker) const {
  auto it = reserved_.find(worker);
  return it == reserved_.end() ? "" : it->second;
}

}  // namespace fxdp::server
