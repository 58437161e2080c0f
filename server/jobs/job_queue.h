// JobQueue: which job runs next on which workers. Strict FIFO: the job at
// the head waits until world_size workers are free, and no job behind it may
// start before it (so none starves, however large). A worker is free when
// the registry lists it IDLE and no job holds a reservation on it; a job's
// reservations are taken when it is dispatched and released one worker at a
// time (the job service releases a worker once it confirmed the job's end).
// Not thread-safe: the job service guards it with its mutex.
#ifndef FXDP_SERVER_JOBS_JOB_QUEUE_H_
#define FXDP_SERVER_JOBS_JOB_QUEUE_H_

#include <cstddef>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace fxdp::server {

class JobQueue {
 public:
  explicit JobQueue(size_t max_queued) : max_queued_(max_queued) {}

  // Appends a job; RESOURCE_EXHAUSTED (saying so, and naming the flag) when
  // max_queued jobs wait already.
  absl::Status Push(const std::string& job_id, int world_size);
  // Takes a job out of the queue; false when it is not queued.
  bool Remove(const std::string& job_id);
  // 1 for the head, 2 behind it, ...; 0 when not queued.
  int Position(const std::string& job_id) const;
  size_t size() const { return queue_.size(); }
  // Queued job ids, head first.
  std::vector<std::string> Ids() const;

  struct Dispatch {
    std::string job_id;
    std::vector<std::string> workers;  // rank order
  };
  // Starts the jobs at the head that fit, in order, on the `idle` workers
  // that are not reserved (taken in the order given); reserves their
  // workers. Stops at the first job that does not fit.
  std::vector<Dispatch> Take(const std::vector<std::string>& idle);
  // The `idle` workers that are not reserved.
  std::vector<std::string> Free(const std::vector<std::string>& idle) const;

  // Ends `job_id`'s reservation of `worker` (no-op when it holds none).
  void Release(const std::string& worker, const std::string& job_id);
  // The job holding `worker` ("" when none).
  std::string Holder(const std::string& worker) const;

 private:
  struct Entry {
    std::string job_id;
    int world_size;
  };
  const size_t max_queued_;
  std::deque<Entry> queue_;
  std::map<std::string, std::string> reserved_;  // worker -> job
};

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_JOB_QUEUE_H_
