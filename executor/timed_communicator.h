// A Communicator decorator that measures the time its caller spends starting
// collectives and, above all, blocked in Work::Wait: the communication a step
// does not hide behind compute. Header-only; wraps any Communicator (local,
// Gloo, NCCL).
//
//   TimedCommunicator timed(comm.get());
//   po.communicator = &timed;              // ProgramOptions
//   ... runner.Step(batch) ...
//   CollectiveStats s = timed.TakeStats();  // this step's numbers, then reset
//
// Like the communicators it wraps, used by one thread at a time. With CUDA
// (NCCL), Wait returns when the all-reduce is done on the device, so wait_ms
// is the host's exposed waiting there too.
#ifndef FXDP_EXECUTOR_TIMED_COMMUNICATOR_H_
#define FXDP_EXECUTOR_TIMED_COMMUNICATOR_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "executor/communicator.h"

namespace fxdp::executor {

struct CollectiveStats {
  int64_t collectives = 0;  // collectives started (all-reduce, all-gather, reduce-scatter)
  int64_t bytes = 0;        // their input bytes
  double start_ms = 0;      // inside AllReduceSum (copying, enqueueing)
  double wait_ms = 0;       // inside Work::Wait (blocked on the collective)
  // Per collective, in the order they were started: bytes, and the time from
  // its start to its Wait call and blocked in that Wait (ms).
  struct One {
    int64_t bytes = 0;
    double in_flight_ms = 0;
    double wait_ms = 0;
  };
  std::vector<One> each;
};

class TimedCommunicator : public Communicator {
 public:
  // `inner` is not owned and must outlive this object and its Works. It may
  // be set later (set_inner), before the first call: a program can be loaded
  // before the rendezvous that creates the communicator.
  explicit TimedCommunicator(Communicator* inner) : inner_(inner) {}
  void set_inner(Communicator* inner) { inner_ = inner; }

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string name() const override { return inner_->name(); }

  absl::StatusOr<std::unique_ptr<Work>> AllReduceSum(const at::Tensor& input) override {
    const auto t0 = Clock::now();
    absl::StatusOr<std::unique_ptr<Work>> w = inner_->AllReduceSum(input);
    return Started(std::move(w), static_cast<int64_t>(input.nbytes()), t0);
  }

  absl::StatusOr<std::unique_ptr<Work>> AllReduceSumDonated(at::Tensor buffer) override {
    const auto t0 = Clock::now();
    const int64_t bytes = static_cast<int64_t>(buffer.nbytes());
    absl::StatusOr<std::unique_ptr<Work>> w = inner_->AllReduceSumDonated(std::move(buffer));
    return Started(std::move(w), bytes, t0);
  }

  absl::StatusOr<std::unique_ptr<Work>> AllGather(const at::Tensor& input) override {
    const auto t0 = Clock::now();
    absl::StatusOr<std::unique_ptr<Work>> w = inner_->AllGather(input);
    return Started(std::move(w), static_cast<int64_t>(input.nbytes()), t0);
  }

  absl::StatusOr<std::unique_ptr<Work>> ReduceScatterSum(const at::Tensor& input) override {
    const auto t0 = Clock::now();
    absl::StatusOr<std::unique_ptr<Work>> w = inner_->ReduceScatterSum(input);
    return Started(std::move(w), static_cast<int64_t>(input.nbytes()), t0);
  }

  absl::StatusOr<std::unique_ptr<Work>> ReduceScatterSumDonated(at::Tensor buffer) override {
    const auto t0 = Clock::now();
    const int64_t bytes = static_cast<int64_t>(buffer.nbytes());
    absl::StatusOr<std::unique_ptr<Work>> w = inner_->ReduceScatterSumDonated(std::move(buffer));
    return Started(std::move(w), bytes, t0);
  }

  const CollectiveStats& stats() const { return stats_; }
  // Returns the numbers so far and starts counting from zero.
  CollectiveStats TakeStats() { return std::exchange(stats_, CollectiveStats{}); }

 private:
  using Clock = std::chrono::steady_clock;
  static double Ms(Clock::duration d) {
    return std::chrono::duration<double, std::milli>(d).count();
  }

  absl::StatusOr<std::unique_ptr<Work>> Started(absl::StatusOr<std::unique_ptr<Work>> w,
                                                int64_t bytes, Clock::time_point t0) {
    const auto t1 = Clock::now();
    stats_.start_ms += Ms(t1 - t0);
    ++stats_.collectives;
    stats_.bytes += bytes;
    if (!w.ok()) return w;
    stats_.each.push_back(CollectiveStats::One{bytes, 0, 0});
    return std::unique_ptr<Work>(
        std::make_unique<TimedWork>(*std::move(w), &stats_, stats_.each.size() - 1, t1));
  }

  class TimedWork : public Work {
   public:
    TimedWork(std::unique_ptr<Work> inner, CollectiveStats* stats, size_t index,
              Clock::time_point started)
        : inner_(std::move(inner)), stats_(stats), index_(index), started_(started) {}
    absl::StatusOr<at::Tensor> Wait(std::chrono::milliseconds timeout) override {
      const auto t0 = Clock::now();
      absl::StatusOr<at::Tensor> r = inner_->Wait(timeout);
      const double ms = Ms(Clock::now() - t0);
      stats_->wait_ms += ms;
      // The stats may have been taken (reset) since this collective started.
      if (index_ < stats_->each.size()) {
        stats_->each[index_].in_flight_ms = Ms(t0 - started_);
        stats_->each[index_].wait_ms = ms;
      }
      return r;
    }
    void Poll() override { inner_->Poll(); }

   private:
    std::unique_ptr<Work> inner_;
    CollectiveStats* stats_;
    size_t index_;
    Clock::time_point started_;
  };

  Communicator* inner_;
  CollectiveStats stats_;
};

}  // namespace fxdp::executor

#endif  // FXDP_EXECUTOR_TIMED_COMMUNICATOR_H_
