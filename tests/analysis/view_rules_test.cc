#include "analysis/view_rules.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace fxdp {
namespace {

using ::fxdp::testing::StatusIs;
using ir::Argument;

Argument Ints(std::vector<int64_t> v) {
  Argument::List l(v.begin(), v.end());
  return l;
}

ir::Target T(const std::string& s) {  // "aten::squeeze.dims"
  const size_t dot = s.find('.');
  if (dot == std::string::npos) return {s, ""};
  return {s.substr(0, dot), s.substr(dot + 1)};
}

absl::StatusOr<DimMap> Compute(const std::string& op, std::vector<int64_t> shape,
                               std::vector<Argument> args = {},
                               std::vector<ir::KeywordArgument> kwargs = {}) {
  args.insert(args.begin(), ir::ValueRef{ir::NodeId{0}, 0});
  return ComputeViewDimMap(T(op), shape, args, kwargs);
}

// "(In0, Fl(In1,In2))", or the error message.
std::string Map(const std::string& op, std::vector<int64_t> shape, std::vector<Argument> args = {},
                std::vector<ir::KeywordArgument> kwargs = {}) {
  auto m = Compute(op, std::move(shape), std::move(args), std::move(kwargs));
  return m.ok() ? DimMapToString(*m) : std::string(m.status().message());
}

// SPMD_REFERENCE §1.6, as torch 2.13 computes them.
TEST(ViewRulesTest, WorkedExamples) {
  EXPECT_EQ(Map("aten::view", {256, 8}, {Ints({-1})}), "(Fl(In0,In1))");
  EXPECT_EQ(Map("aten::view", {1, 2048}, {Ints({256, -1})}),
            "(Sp(In1,(256,8),0), Sp(In1,(256,8),1))");
  EXPECT_EQ(Map("aten::view", {2048}, {Ints({256, 8})}), "(Sp(In0,(256,8),0), Sp(In0,(256,8),1))");
  EXPECT_EQ(Map("aten::view", {4, 6}, {Ints({2, 12})}),
            "(Sp(Fl(In0,In1),(2,12),0), Sp(Fl(In0,In1),(2,12),1))");
  // torch 2.13 keeps size-1 dims inside a group (the legacy rule gave Fl(In0,In2)).
  EXPECT_EQ(Map("aten::view", {2, 1, 3}, {Ints({6})}), "(Fl(In0,In1,In2))");
  EXPECT_EQ(Map("aten::view", {2, 3}, {Ints({1, 6, 1})}), "(S, Fl(In0,In1), S)");
  EXPECT_EQ(Map("aten::view", {8}, {Ints({2, 1, 4})}), "(Sp(In0,(2,4),0), S, Sp(In0,(2,4),1))");
  EXPECT_EQ(Map("aten::view", {256, 8}, {Ints({2, 128, 8})}),
            "(Sp(In0,(2,128),0), Sp(In0,(2,128),1), In1)");
  EXPECT_EQ(Map("aten::view", {256, 8}, {Ints({512, 4})}),
            "(Sp(Fl(In0,In1),(512,4),0), Sp(Fl(In0,In1),(512,4),1))");
  EXPECT_EQ(Map("aten::view", {1}, {Ints({})}), "()");
  EXPECT_EQ(Map("aten::view", {}, {Ints({1, 1})}), "(S, S)");
  EXPECT_EQ(Map("aten::view", {1, 1, 3, 2, 1, 1}, {Ints({6, 1, 1, 1})}),
            "(Fl(In2,In3), In4, In5, S)");
  EXPECT_EQ(Map("aten::view", {2, 3, 4}, {Ints({2, -1, 4})}), "(In0, In1, In2)");
  EXPECT_EQ(Map("aten::squeeze", {4, 1, 3}), "(In0, In2)");
  EXPECT_EQ(Map("aten::squeeze.dim", {4, 1, 3}, {1}), "(In0, In2)");
  EXPECT_EQ(Map("aten::squeeze.dim", {4, 1, 3}, {-2}), "(In0, In2)");
  EXPECT_EQ(Map("aten::squeeze.dim", {4, 1, 3}, {0}), "(In0, In1, In2)");
  EXPECT_EQ(Map("aten::squeeze", {1, 1}), "()");
  EXPECT_EQ(Map("aten::unsqueeze", {2, 3, 4}, {-1}), "(In0, In1, In2, S)");
  EXPECT_EQ(Map("aten::unsqueeze", {}, {0}), "(S)");
  EXPECT_EQ(Map("aten::expand", {3, 1}, {Ints({2, 3, 4})}), "(Bc(S,2), In0, Bc(In1,4))");
  EXPECT_EQ(Map("aten::expand", {1}, {Ints({5})}), "(Bc(In0,5))");
  EXPECT_EQ(Map("aten::expand", {}, {Ints({256, 8})}), "(Bc(S,256), Bc(S,8))");
  EXPECT_EQ(Map("aten::expand", {24, 1, 36, 1}, {Ints({36, 24, 42, -1, 24})}),
            "(Bc(S,36), In0, Bc(In1,42), In2, Bc(In3,24))");
  EXPECT_EQ(Map("aten::repeat", {1, 8}, {Ints({256, 1})}), "(Rep(In0,256), In1)");
  EXPECT_EQ(Map("aten::repeat", {3}, {Ints({2, 1, 4})}), "(Bc(S,2), S, Rep(In0,4))");
  EXPECT_EQ(Map("aten::repeat", {24, 36}, {Ints({1, 2, 1, 1, 2})}),
            "(S, Bc(S,2), S, In0, Rep(In1,2))");
  EXPECT_EQ(Map("aten::tile", {2, 3, 4}, {Ints({2})}), "(In0, In1, Rep(In2,2))");
  EXPECT_EQ(Map("aten::permute", {2, 3, 4}, {Ints({2, 0, 1})}), "(In2, In0, In1)");
  EXPECT_EQ(Map("aten::permute", {2, 3, 4}, {Ints({-1, -3, -2})}), "(In2, In0, In1)");
  EXPECT_EQ(Map("aten::transpose.int", {2, 3, 4, 5}, {-1, 0}), "(In3, In1, In2, In0)");
  EXPECT_EQ(Map("aten::movedim.int", {2, 3, 4, 5}, {1, 2}), "(In0, In2, In1, In3)");
  EXPECT_EQ(Map("aten::movedim.intlist", {2, 3, 4}, {Ints({0, 2, 1}), Ints({2, 1, 0})}),
            "(In1, In2, In0)");
  EXPECT_EQ(Map("aten::atleast_2d", {5}), "(S, In0)");
  EXPECT_EQ(Map("aten::atleast_3d", {5, 6}), "(In0, In1, S)");
  EXPECT_EQ(Map("aten::view_as_complex", {24, 13, 2}), "(In0, Fl(In1,In2))");
  EXPECT_EQ(Map("aten::view_as_real", {24, 13}), "(In0, Sp(In1,(13,2),0), Sp(In1,(13,2),1))");
}

TEST(ViewRulesTest, CompositeOps) {
  EXPECT_EQ(Map("aten::flatten.using_ints", {2, 3, 4, 5}, {1, -2}), "(In0, Fl(In1,In2), In3)");
  EXPECT_EQ(Map("aten::flatten.using_ints", {2, 3}), "(Fl(In0,In1))");  // defaults 0, -1
  EXPECT_EQ(Map("aten::flatten.using_ints", {}), "(S)");
  EXPECT_EQ(Map("aten::ravel", {2, 3, 4}), "(Fl(In0,In1,In2))");
  EXPECT_EQ(Map("aten::unflatten.int", {6, 20}, {-1, Ints({4, -1})}),
            "(In0, Sp(In1,(4,5),0), Sp(In1,(4,5),1))");
  EXPECT_EQ(Map("aten::t", {3, 4}), "(In1, In0)");
  EXPECT_EQ(Map("aten::t", {3}), "(In0)");
  EXPECT_EQ(Map("aten::broadcast_to", {3}, {Ints({2, 3})}), "(Bc(S,2), In0)");
  EXPECT_EQ(Map("aten::atleast_1d", {}), "(S)");
  EXPECT_EQ(Map("aten::atleast_3d", {7}), "(S, In0, S)");
  EXPECT_EQ(Map("aten::squeeze.dims", {1, 5, 1}, {Ints({0, -1})}), "(In1)");
  EXPECT_EQ(Map("aten::squeeze_.dim", {1, 5}, {0}), "(In1)");
}

TEST(ViewRulesTest, SizeOneAndSizeZeroDims) {
  EXPECT_EQ(Map("aten::view", {0, 4}, {Ints({-1, 4})}), "(S, In1)");  // size-0 dims leave groups
  EXPECT_EQ(Map("aten::expand", {1}, {Ints({0})}), "(Bc(In0,0))");
  EXPECT_EQ(Map("aten::expand", {1}, {Ints({1})}), "(In0)");  // stays In0, not S
  EXPECT_EQ(Map("aten::repeat", {2}, {Ints({0})}), "(Rep(In0,0))");
  EXPECT_EQ(Map("aten::view_as_real", {24, 1}), "(In0, Sp(In1,(1,2),0), Sp(In1,(1,2),1))");
  // [View Rule Divergences]: torch's rule has the wrong rank here.
  EXPECT_EQ(Map("aten::squeeze", {0, 1, 3}), "(In0, In2)");
  EXPECT_EQ(Map("aten::squeeze.dim", {0, 3}, {0}), "(In0, In1)");
  EXPECT_EQ(Map("aten::view_as_complex", {2}), "()");
}

TEST(ViewRulesTest, ArgumentsBindByPositionKeywordOrDefault) {
  const std::vector<ir::KeywordArgument> kw = {{"end_dim", Argument(2)}};
  EXPECT_EQ(Map("aten::flatten.using_ints", {2, 3, 4, 5}, {1}, kw), "(In0, Fl(In1,In2), In3)");
  EXPECT_EQ(Map("aten::view", {2, 3}, {}, {{"size", Ints({6})}}), "(Fl(In0,In1))");
  EXPECT_EQ(Map("aten::expand", {1}, {Ints({4})}, {{"implicit", Argument(false)}}), "(Bc(In0,4))");
  EXPECT_EQ(Map("aten::squeeze.dims", {1, 5}, {0}), "(In1)");  // int[1] given as a bare int
}

TEST(ViewRulesTest, ReportsBadArguments) {
  const auto bad = absl::StatusCode::kInvalidArgument;
  EXPECT_THAT(Compute("aten::view", {2, 3}).status(),
              StatusIs(bad, "aten::view: missing argument 'size'"));
  EXPECT_THAT(Compute("aten::view", {2, 3}, {Ints({6}), 1}).status(),
              StatusIs(bad, "aten::view: takes 2 positional arguments, got 3"));
  EXPECT_THAT(Compute("aten::view", {2, 3}, {Ints({6})}, {{"size", Ints({6})}}).status(),
              StatusIs(bad, "argument 'size' given twice"));
  EXPECT_THAT(Compute("aten::unsqueeze", {2}, {Ints({0})}).status(),
              StatusIs(bad, "aten::unsqueeze: argument 'dim' must be an int"));
  EXPECT_THAT(Compute("aten::view", {2}, {Argument::List{Argument(1.5)}}).status(),
              StatusIs(bad, "argument 'size' must be a list of ints"));
  EXPECT_THAT(Compute("aten::t", {2}, {}, {{"dim", Argument(0)}}).status(),
              StatusIs(bad, "aten::t: unexpected keyword argument 'dim'"));
  std::vector<Argument> no_self = {Ints({2})};
  EXPECT_THAT(ComputeViewDimMap(T("aten::view"), {2}, no_self, {}).status(),
              StatusIs(bad, "argument 0 (self) must be a tensor"));
}

TEST(ViewRulesTest, ReportsWhereTorchRaises) {
  const auto bad = absl::StatusCode::kInvalidArgument;
  EXPECT_THAT(Compute("aten::view", {12}, {Ints({5, -1})}).status(),
              StatusIs(bad, "aten::view: size [5, -1] is invalid for input of size 12"));
  EXPECT_THAT(Compute("aten::reshape", {3, 4}, {Ints({-1, -1})}).status(),
              StatusIs(bad, "aten::reshape: shape [-1, -1]: only one dimension can be inferred"));
  EXPECT_THAT(Compute("aten::view", {6}, {Ints({-2, -3})}).status(),
              StatusIs(bad, "invalid size dimension -2 at index 0 of [-2, -3]"));
  EXPECT_THAT(Compute("aten::view", {0}, {Ints({0, -1})}).status(),
              StatusIs(bad, "size [0, -1] is ambiguous for input of size 0"));
  EXPECT_THAT(Compute("aten::unflatten.int", {6, 20}, {1, Ints({3, 3})}).status(),
              StatusIs(bad, "sizes [3, 3] is invalid for dim 1 of size 20"));
  EXPECT_THAT(Compute("aten::expand", {2, 3}, {Ints({2, 5})}).status(),
              StatusIs(bad, "size 5 must match the existing size 3 at non-singleton input dim 1"));
  EXPECT_THAT(Compute("aten::expand", {3}, {Ints({-1, 3})}).status(),
              StatusIs(bad, "size -1 is not allowed at dim 0 (a new leading dim)"));
  EXPECT_THAT(Compute("aten::expand", {2, 3}, {Ints({3})}).status(),
              StatusIs(bad, "size [3] has 1 entries, fewer than the input's 2 dims"));
  EXPECT_THAT(Compute("aten::squeeze.dims", {1, 1}, {Ints({0, -2})}).status(),
              StatusIs(bad, "dim [0, -2] names dim 0 twice"));
  EXPECT_THAT(Compute("aten::transpose.int", {2, 3}, {0, 2}).status(),
              StatusIs(bad, "dim1 2 is out of range for a 2-d input (expected [-2, 1])"));
  EXPECT_THAT(Compute("aten::unsqueeze", {2, 3}, {4}).status(),
              StatusIs(bad,
                       "dim 4 is out of range for unsqueezing a 2-d input "
                       "(expected [-3, 2])"));
  EXPECT_THAT(Compute("aten::permute", {2, 3}, {Ints({0})}).status(),
              StatusIs(bad, "dims [0] has 1 entries for a 2-d input"));
  EXPECT_THAT(Compute("aten::permute", {2, 3}, {Ints({1, -1})}).status(),
              StatusIs(bad, "names dim 1 twice"));
  EXPECT_THAT(Compute("aten::repeat", {2, 3}, {Ints({2})}).status(),
              StatusIs(bad, "fewer than the input's 2 dims"));
  EXPECT_THAT(Compute("aten::tile", {2}, {Ints({-1})}).status(),
              StatusIs(bad, "dims [-1] has negative entry -1 at index 0"));
  EXPECT_THAT(Compute("aten::flatten.using_ints", {2, 3, 4}, {2, 1}).status(),
              StatusIs(bad, "start_dim 2 comes after end_dim 1"));
  EXPECT_THAT(Compute("aten::t", {2, 3, 4}).status(), StatusIs(bad, "expects <= 2 dims"));
  EXPECT_THAT(Compute("aten::view_as_complex", {3}).status(),
              StatusIs(bad, "last dim must have size 2, got 3"));
  EXPECT_THAT(Compute("aten::movedim.intlist", {2, 3}, {Ints({0}), Ints({1, 0})}).status(),
              StatusIs(bad, "source [0] and destination [1, 0] differ in length"));
}

// The op accepts these, DTensor's rule does not: errors here as there.
TEST(ViewRulesTest, FollowsTorchRuleFailures) {
  const auto bad = absl::StatusCode::kInvalidArgument;
  EXPECT_THAT(Compute("aten::view", {2, 0}, {Ints({0, 2})}).status(),
              StatusIs(bad, "view_groups does not terminate reshaping [2, 0] to [0, 2]"));
  EXPECT_THAT(Compute("aten::reshape", {1}, {Ints({})}).status(),
              StatusIs(bad, "reshape rule rejects an empty shape"));
  EXPECT_THAT(Compute("aten::transpose.int", {}, {0, -1}).status(), StatusIs(bad, "0-d input"));
  EXPECT_THAT(Compute("aten::t", {}).status(), StatusIs(bad, "0-d input"));
  EXPECT_THAT(Compute("aten::movedim.intlist", {2}, {Ints({}), Ints({})}).status(),
              StatusIs(bad, "empty source and destination"));
  EXPECT_THAT(Compute("aten::view_as_real", {}).status(), StatusIs(bad, "0-d input"));
  EXPECT_THAT(Compute("aten::tile", {}, {Ints({})}).status(), StatusIs(bad, "empty dims"));
}

TEST(ViewRulesTest, OpsWithoutARule) {
  EXPECT_FALSE(IsViewOp(T("aten::add.Tensor")));
  EXPECT_FALSE(IsViewOp(T("aten::view.dtype")));
  EXPECT_TRUE(IsViewOp(T("aten::view")));
  EXPECT_TRUE(IsViewOp(T("aten::squeeze_.dims")));
  EXPECT_THAT(Compute("aten::mm", {2, 2}, {}).status(),
              StatusIs(absl::StatusCode::kNotFound, "aten::mm: no view rule"));
}

TEST(ViewRulesTest, TableListsEveryOpOnce) {
  const std::vector<std::string> names = ViewOpNames();
  EXPECT_EQ(names.size(), 29u);
  for (const std::string& n : names) EXPECT_TRUE(IsViewOp(T(n))) << n;
  std::vector<std::string> unique = names;
  unique.erase(std::unique(unique.begin(), unique.end()), unique.end());
  EXPECT_EQ(unique.size(), names.size());
}

// How the batch-dim analysis follows a batch dim through a view.
TEST(ViewRulesTest, TracesTheBatchDim) {
  auto flow = [](const std::string& op, std::vector<int64_t> shape, std::vector<Argument> args,
                 int64_t dim) { return TraceInputDim(*Compute(op, shape, args), dim); };
  EXPECT_EQ(flow("aten::view", {8, 3, 4}, {Ints({8, 12})}, 0),
            (DimFlow{0, DimFlowRole::kIdentity}));
  EXPECT_EQ(flow("aten::view", {8, 3, 4}, {Ints({96})}, 0),
            (DimFlow{0, DimFlowRole::kFlattenLeading}));
  EXPECT_EQ(flow("aten::view", {96}, {Ints({8, 12})}, 0), (DimFlow{0, DimFlowRole::kSplitLeading}));
  EXPECT_EQ(flow("aten::transpose.int", {8, 3}, {0, 1}, 0), (DimFlow{1, DimFlowRole::kIdentity}));
  EXPECT_EQ(flow("aten::view", {3, 8}, {Ints({24})}, 1), (DimFlow{0, DimFlowRole::kFlattenInner}));
  EXPECT_EQ(flow("aten::squeeze.dim", {1, 3}, {0}, 0), std::nullopt);
}

}  // namespace
}  // namespace fxdp
