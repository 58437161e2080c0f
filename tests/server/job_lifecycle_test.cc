// The job lifecycle (server/jobs/job_lifecycle.h): every allowed change moves
// a job between the table's states and sets what the new state shows; every
// other change is refused naming both states, leaving the job as it was; and
// Job::Change applies it under the job's lock.
#include "server/jobs/job_lifecycle.h"

#include <set>
#include <string>
#include <utility>

#include "gtest/gtest.h"
#include "server/jobs/job.h"

namespace fxdp {
namespace {

using server::JobChange;

constexpr v1::JobState kStates[] = {v1::JOB_STATE_UNSPECIFIED, v1::JOB_STATE_QUEUED,
                                    v1::JOB_STATE_RUNNING,     v1::JOB_STATE_SUCCEEDED,
                                    v1::JOB_STATE_FAILED,      v1::JOB_STATE_CANCELLED};
constexpr JobChange kChanges[] = {JobChange::kQueue, JobChange::kStart,  JobChange::kSucceed,
                                  JobChange::kFail,  JobChange::kCancel, JobChange::kRequeue};

v1::JobInfo InState(v1::JobState s) {
  v1::JobInfo info;
  info.set_job_id("job-1-abc");
  info.set_state(s);
  info.set_queue_position(3);
  info.set_message("waiting for 2 idle workers");
  info.set_checkpoint_step(4);
  return info;
}

TEST(JobLifecycle, TheTableIsTheDocumentedOne) {
  std::set<std::string> rows;
  for (const server::JobTransition& t : server::JobTransitions()) {
    rows.insert(server::StateName(t.from) + " " + std::string(server::ChangeName(t.change)) + " " +
                server::StateName(t.to));
  }
  EXPECT_EQ(rows, (std::set<std::string>{"NEW queue QUEUED", "QUEUED start RUNNING",
                                         "QUEUED fail FAILED", "QUEUED cancel CANCELLED",
                                         "RUNNING succeed SUCCEEDED", "RUNNING fail FAILED",
                                         "RUNNING cancel CANCELLED", "RUNNING requeue QUEUED"}));
}

TEST(JobLifecycle, EveryAllowedChangeMovesTheJob) {
  for (const server::JobTransition& t : server::JobTransitions()) {
    SCOPED_TRACE(server::StateName(t.from) + " " + std::string(server::ChangeName(t.change)));
    v1::JobInfo info = InState(t.from);
    const absl::Status why =
        t.to == v1::JOB_STATE_FAILED ? absl::UnavailableError("rank 1 was lost") : absl::OkStatus();
    ASSERT_TRUE(server::ApplyChange(&info, t.change, why).ok());
    EXPECT_EQ(info.state(), t.to);
    EXPECT_EQ(info.error_code(), static_cast<int>(why.code()));
    EXPECT_EQ(info.error(), std::string(why.message()));
    // Only a queued job shows a place in the queue.
    EXPECT_EQ(info.queue_position(), t.to == v1::JOB_STATE_QUEUED ? 3 : 0);
    EXPECT_EQ(info.message().empty(), t.to != v1::JOB_STATE_QUEUED);
    EXPECT_EQ(info.started_unix_ms() > 0, t.to == v1::JOB_STATE_RUNNING);
    EXPECT_EQ(info.ended_unix_ms() > 0, server::Terminal(t.to));
    // An ended job keeps its checkpoint (the state of its last completed
    // step, to be fetched and resumed) unless it SUCCEEDED.
    EXPECT_EQ(info.checkpoint_step(), t.to == v1::JOB_STATE_SUCCEEDED ? 0 : 4);
  }
}

TEST(JobLifecycle, EveryOtherChangeIsRefusedNamingBothStates) {
  int refused = 0;
  for (v1::JobState from : kStates) {
    for (JobChange change : kChanges) {
      bool allowed = false;
      v1::JobState to = v1::JOB_STATE_UNSPECIFIED;
      for (const server::JobTransition& t : server::JobTransitions()) {
        if (t.change == change) to = t.to;
        allowed |= t.from == from && t.change == change;
      }
      if (allowed) continue;
      ++refused;
      const std::string what =
          server::StateName(from) + " " + std::string(server::ChangeName(change));
      SCOPED_TRACE(what);
      v1::JobInfo info = InState(from);
      const v1::JobInfo before = info;
      const absl::Status s = server::ApplyChange(&info, change, absl::InternalError("x"));
      EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_NE(s.message().find("job job-1-abc cannot go from " + server::StateName(from) +
                                 " to " + server::StateName(to)),
                std::string::npos)
          << s.message();
      EXPECT_EQ(info.SerializeAsString(), before.SerializeAsString());  // unchanged
    }
  }
  EXPECT_EQ(refused, 6 * 6 - 8);
}

TEST(JobLifecycle, TerminalStatesAllowNothing) {
  v1::JobInfo info = InState(v1::JOB_STATE_SUCCEEDED);
  const absl::Status s =
      server::ApplyChange(&info, JobChange::kFail, absl::UnavailableError("late"));
  EXPECT_EQ(s.message(),
            "job job-1-abc cannot go from SUCCEEDED to FAILED (fail): from SUCCEEDED no change is "
            "allowed (it ended)");
  info = InState(v1::JOB_STATE_QUEUED);
  EXPECT_EQ(server::ApplyChange(&info, JobChange::kSucceed, absl::OkStatus()).message(),
            "job job-1-abc cannot go from QUEUED to SUCCEEDED (succeed): from QUEUED only start "
            "(to RUNNING), "
            "fail (to FAILED), cancel (to CANCELLED)");
}

TEST(JobLifecycle, WhatEachStateMeans) {
  for (v1::JobState s : kStates) {
    SCOPED_TRACE(server::StateName(s));
    const bool ended =
        s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED;
    EXPECT_EQ(server::Terminal(s), ended);
    EXPECT_EQ(server::HasFinalState(s), s == v1::JOB_STATE_SUCCEEDED);
    EXPECT_EQ(server::Resumable(s), s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED);
  }
}

// What each change keeps of the job's state: a running job that fails or
// is cancelled keeps its last completed step's, one that succeeds its final
// state; nothing else keeps one (issue 26).
TEST(JobLifecycle, WhatEachChangeKeeps) {
  std::set<std::string> keeping;
  for (const server::JobTransition& t : server::JobTransitions()) {
    EXPECT_EQ(server::KeptBy(t.from, t.change), t.kept);
    if (t.kept == server::StateKept::kNothing) continue;
    keeping.insert(server::StateName(t.from) + " " + std::string(server::ChangeName(t.change)) +
                   (t.kept == server::StateKept::kFinal ? " final" : " last step"));
  }
  EXPECT_EQ(keeping, (std::set<std::string>{"RUNNING succeed final", "RUNNING fail last step",
                                            "RUNNING cancel last step"}));
  EXPECT_EQ(server::KeptBy(v1::JOB_STATE_QUEUED, JobChange::kCancel), server::StateKept::kNothing);
  EXPECT_EQ(server::KeptBy(v1::JOB_STATE_FAILED, JobChange::kCancel), server::StateKept::kNothing);
}

TEST(JobLifecycle, JobChangeRefusesAndKeepsItsState) {
  server::Job job;
  EXPECT_TRUE(job.Change(JobChange::kQueue).ok());
  EXPECT_TRUE(job.Change(JobChange::kStart).ok());
  EXPECT_TRUE(job.Change(JobChange::kCancel, absl::CancelledError("CancelJob")).ok());
  const absl::Status late = job.Change(JobChange::kSucceed);
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(late.message().find("cannot go from CANCELLED to SUCCEEDED"), std::string::npos)
      << late.message();
  EXPECT_EQ(job.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(job.Info().error(), "CancelJob");
}

}  // namespace
}  // namespace fxdp
