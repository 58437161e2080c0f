// Value lifetimes of a straight-line program (analysis/ir/liveness.h),
// without torch: when each slot dies and which reads may move it.
#include "analysis/ir/liveness.h"

#include <gtest/gtest.h>

#include <vector>

namespace fxdp::ir {
namespace {

using Slots = std::vector<int32_t>;

TEST(Liveness, ReleasesAfterTheLastReadAndMovesSoleLastReads) {
  // Inputs 0, 1. step 0: 2 = f(0, 1); step 1: 3 = g(2, 2, 0); step 2: 4 = h(3).
  // Returned: 4.
  LivenessProblem p;
  p.num_slots = 5;
  p.reads = {{0, 1}, {2, 2, 0}, {3}};
  p.writes = {{2}, {3}, {4}};
  p.returned = {4};
  const Liveness l = ComputeLiveness(p);
  EXPECT_EQ(l.last_read, (Slots{1, 0, 1, 2, 3}));
  EXPECT_TRUE(l.free_at_start.empty());
  EXPECT_EQ(l.free_after[0], (Slots{1}));
  EXPECT_EQ(l.free_after[1], (Slots{0, 2}));
  EXPECT_EQ(l.free_after[2], (Slots{3}));
  // Step 0 reads 0 again later: only 1 moves. Step 1 reads 2 twice: only 0
  // moves. Step 2 is 3's only and last reader.
  EXPECT_EQ(l.last_sole_read[0], (Slots{1}));
  EXPECT_EQ(l.last_sole_read[1], (Slots{0}));
  EXPECT_EQ(l.last_sole_read[2], (Slots{3}));
}

TEST(Liveness, UnreadValuesDieAtOnceAndReturnedOnesLiveToTheEnd) {
  // Inputs 0 (unread), 1. step 0: (2, 3) = f(1), 3 unread; step 1: 4 = g(2).
  // Returned: 1 and 4; 1 is also read by step 0 but must not move.
  LivenessProblem p;
  p.num_slots = 5;
  p.reads = {{1}, {2}};
  p.writes = {{2, 3}, {4}};
  p.returned = {1, 4};
  const Liveness l = ComputeLiveness(p);
  EXPECT_EQ(l.free_at_start, (Slots{0}));
  EXPECT_EQ(l.free_after[0], (Slots{3}));
  EXPECT_EQ(l.free_after[1], (Slots{2}));
  EXPECT_EQ(l.last_read[1], 2);
  EXPECT_EQ(l.last_read[0], Liveness::kNotRead);
  EXPECT_TRUE(l.last_sole_read[0].empty());
  EXPECT_EQ(l.last_sole_read[1], (Slots{2}));
}

TEST(Liveness, EmptyProgram) {
  LivenessProblem p;
  p.num_slots = 2;
  p.returned = {1};
  const Liveness l = ComputeLiveness(p);
  EXPECT_EQ(l.free_at_start, (Slots{0}));
  EXPECT_TRUE(l.free_after.empty());
}

}  // namespace
}  // namespace fxdp::ir
