#include "server/jobs/job.h"

#include <chrono>
#include <string>

#include "server/log.h"

namespace fxdp::server {

int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Clock::duration Seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

absl::Status Job::Change(JobChange change, const absl::Status& status) {
  absl::Status refused;
  {
    std::lock_guard<std::mutex> l(mu);
    refused = ApplyChange(&info, change, status);
  }
  if (!refused.ok()) {
    Log(std::string(refused.message()));
    return refused;
  }
  cv.notify_all();
  return absl::OkStatus();
}

v1::JobInfo Job::Info() {
  std::lock_guard<std::mutex> l(mu);
  return info;
}

bool Job::Cancel(const std::string& reason) {
  {
    std::lock_guard<std::mutex> l(mu);
    if (Terminal(info.state()) || cancel) return false;
    cancel = true;
    cancel_reason = reason;
  }
  cv.notify_all();
  return true;
}

v1::JobEvent Job::Event(v1::JobState state) {
  v1::JobEvent e;
  std::lock_guard<std::mutex> l(mu);
  e.set_job_id(info.job_id());
  e.set_state(state);
  // A resumed job's events before its first step of this run report none.
  const int64_t done = info.steps_done();
  e.set_step(Terminal(state) || done > first_step ? done : 0);
  if (first_step > 0) e.set_first_step(first_step);
  for (const auto& w : workers) e.add_workers(w);
  if (state == v1::JOB_STATE_QUEUED) {
    e.set_queue_position(info.queue_position());
    e.set_message(info.message());
  }
  if (Terminal(state)) e.set_error(info.error());
  return e;
}

std::string Job::id() {
  std::lock_guard<std::mutex> l(mu);
  return info.job_id();
}

v1::JobState Job::state() {
  std::lock_guard<std::mutex> l(mu);
  return info.state();
}

void Job::FromClient(v1::SubmitJobRequest request, size_t bytes) {
  {
    std::lock_guard<std::mutex> l(mu);
    from_client.emplace_back(std::move(request), bytes);
  }
  cv.notify_all();
}

void Job::ClientEnded() {
  {
    std::lock_guard<std::mutex> l(mu);
    client_ended = true;
  }
  cv.notify_all();
}

void Job::ClientGone() {
  {
    std::lock_guard<std::mutex> l(mu);
    client_gone = true;
  }
  cv.notify_all();
}

}  // namespace fxdp::server
