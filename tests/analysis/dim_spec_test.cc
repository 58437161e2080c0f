#include "analysis/dim_spec.h"

#include <gtest/gtest.h>

namespace fxdp {
namespace {

const DimSpec S = DimSpec::Singleton();
DimSpec In(int64_t d) { return DimSpec::InputDim(d); }

TEST(DimSpecTest, PrintsEveryKind) {
  EXPECT_EQ(S.ToString(), "S");
  EXPECT_EQ(In(3).ToString(), "In3");
  EXPECT_EQ(DimSpec::Broadcast(S, 2).ToString(), "Bc(S,2)");
  EXPECT_EQ(DimSpec::NewDim(5).ToString(), "New(5)");
  EXPECT_EQ(DimSpec::Repeat(In(0), 256).ToString(), "Rep(In0,256)");
  EXPECT_EQ(DimSpec::Flatten({In(0), In(1)}).ToString(), "Fl(In0,In1)");
  EXPECT_EQ(DimSpec::Split(DimSpec::Flatten({In(0), In(1)}), {2, 12}, 1).ToString(),
            "Sp(Fl(In0,In1),(2,12),1)");
}

TEST(DimSpecTest, PrintsMaps) {
  EXPECT_EQ(DimMapToString({}), "()");
  EXPECT_EQ(DimMapToString({In(0)}), "(In0)");
  EXPECT_EQ(DimMapToString({In(0), DimSpec::Flatten({In(1), In(2)})}), "(In0, Fl(In1,In2))");
}

TEST(DimSpecTest, FlattenNormalises) {
  EXPECT_EQ(DimSpec::Flatten({}), S);  // flattening a scalar
  EXPECT_EQ(DimSpec::Flatten({In(2)}), In(2));
  EXPECT_EQ(DimSpec::Flatten({In(0), In(1)}).kind(), DimSpec::Kind::kFlatten);
  EXPECT_EQ(DimSpec::Flatten({In(0), In(1)}).inputs(), (std::vector<DimSpec>{In(0), In(1)}));
}

TEST(DimSpecTest, RepeatNormalises) {
  EXPECT_EQ(DimSpec::Repeat(In(0), 1), In(0));
  EXPECT_EQ(DimSpec::Repeat(S, 3), DimSpec::Broadcast(S, 3));  // repeating a singleton broadcasts
  EXPECT_EQ(DimSpec::Repeat(S, 1), S);
  EXPECT_EQ(DimSpec::Repeat(In(1), 0).ToString(), "Rep(In1,0)");
}

TEST(DimSpecTest, NewDimNormalises) {
  EXPECT_EQ(DimSpec::NewDim(1), S);
  EXPECT_EQ(DimSpec::NewDim(4).size(), 4);
}

TEST(DimSpecTest, BroadcastIsNeverNormalised) {
  EXPECT_EQ(DimSpec::Broadcast(In(0), 1).ToString(), "Bc(In0,1)");
  EXPECT_EQ(DimSpec::Broadcast(S, 0).ToString(), "Bc(S,0)");
}

TEST(DimSpecTest, SplitNormalises) {
  EXPECT_EQ(DimSpec::Split(In(0), {6}, 0), In(0));  // one group is no split
  EXPECT_EQ(DimSpec::Split(In(0), {2, 1, 3}, 1), S);
  // Size-1 factors leave the group; the id is re-indexed.
  const DimSpec s = DimSpec::Split(In(0), {2, 1, 3}, 2);
  EXPECT_EQ(s, DimSpec::RawSplit(In(0), {2, 3}, 1));
  EXPECT_EQ(s.group_shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(s.split_id(), 1);
  EXPECT_EQ(s.inputs()[0], In(0));
  // Like torch, a group left with one factor is not collapsed further.
  EXPECT_EQ(DimSpec::Split(In(0), {1, 1, 4, 1}, 2), DimSpec::RawSplit(In(0), {4}, 0));
}

TEST(DimSpecTest, RawConstructorsKeepTheirInput) {
  EXPECT_EQ(DimSpec::RawSplit(In(1), {1, 2}, 0).ToString(), "Sp(In1,(1,2),0)");
  EXPECT_EQ(DimSpec::RawFlatten({In(0)}).ToString(), "Fl(In0)");
  EXPECT_EQ(DimSpec::RawRepeat(In(0), 1).ToString(), "Rep(In0,1)");
  EXPECT_EQ(DimSpec::RawNewDim(1).ToString(), "New(1)");
}

TEST(DimSpecTest, EqualityIsStructural) {
  EXPECT_EQ(DimSpec::Flatten({In(0), In(1)}), DimSpec::Flatten({In(0), In(1)}));
  EXPECT_NE(DimSpec::Flatten({In(0), In(1)}), DimSpec::Flatten({In(1), In(0)}));
  EXPECT_NE(In(0), In(1));
  EXPECT_NE(In(0), S);
  EXPECT_NE(DimSpec::Broadcast(In(0), 2), DimSpec::Repeat(In(0), 2));
  EXPECT_NE(DimSpec::Broadcast(S, 2), DimSpec::NewDim(2));
  EXPECT_NE(DimSpec::RawSplit(In(0), {2, 3}, 0), DimSpec::RawSplit(In(0), {3, 2}, 0));
  EXPECT_NE(DimSpec::RawSplit(In(0), {2, 3}, 0), DimSpec::RawSplit(In(0), {2, 3}, 1));
}

TEST(TraceInputDimTest, FollowsEachRole) {
  const DimSpec fl = DimSpec::Flatten({In(1), In(2)});
  const DimMap map = {
      In(3),                             // 0
      fl,                                // 1
      DimSpec::Split(In(0), {2, 4}, 0),  // 2
      DimSpec::Split(In(0), {2, 4}, 1),  // 3
      DimSpec::Repeat(In(4), 2),         // 4
      DimSpec::Broadcast(In(5), 3),      // 5
      S,                                 // 6
  };
  EXPECT_EQ(TraceInputDim(map, 3), (DimFlow{0, DimFlowRole::kIdentity}));
  EXPECT_EQ(TraceInputDim(map, 1), (DimFlow{1, DimFlowRole::kFlattenLeading}));
  EXPECT_EQ(TraceInputDim(map, 2), (DimFlow{1, DimFlowRole::kFlattenInner}));
  EXPECT_EQ(TraceInputDim(map, 0), (DimFlow{2, DimFlowRole::kSplitLeading}));
  EXPECT_EQ(TraceInputDim(map, 4), (DimFlow{4, DimFlowRole::kOther}));
  EXPECT_EQ(TraceInputDim(map, 5), (DimFlow{5, DimFlowRole::kOther}));
  EXPECT_EQ(TraceInputDim(map, 6), std::nullopt);
}

TEST(TraceInputDimTest, SplitOfAFlatten) {
  // view [4, 6] -> [2, 12]
  const DimSpec fl = DimSpec::Flatten({In(0), In(1)});
  const DimMap map = {DimSpec::Split(fl, {2, 12}, 0), DimSpec::Split(fl, {2, 12}, 1)};
  EXPECT_EQ(TraceInputDim(map, 0), (DimFlow{0, DimFlowRole::kSplitLeading}));
  EXPECT_EQ(TraceInputDim(map, 1), (DimFlow{0, DimFlowRole::kFlattenInner}));
}

TEST(TraceInputDimTest, SplitWhoseFirstFactorIsASingleton) {
  // view [8] -> [1, 2, 4]: output 0 is S, the batch leads output 1.
  const DimMap map = {DimSpec::Split(In(0), {1, 2, 4}, 0), DimSpec::Split(In(0), {1, 2, 4}, 1),
                      DimSpec::Split(In(0), {1, 2, 4}, 2)};
  EXPECT_EQ(map[0], S);
  EXPECT_EQ(TraceInputDim(map, 0), (DimFlow{1, DimFlowRole::kSplitLeading}));
}

}  // namespace
}  // namespace fxdp
