// The random-op table (analysis/ir/random_ops.h): its text form is
// tests/testdata/random_ops.txt, which client/python/fxdp/random_ops.py's
// copy must also print (tests/python/test_randomness.py); every row has an op
// rule marked random; a random op outside it is refused by the analysis; the
// layout metadata's format. Regenerate the golden after a deliberate change:
//   FXDP_REGEN_GOLDENS=1 build/tests/random_ops_table_test
#include "analysis/ir/random_ops.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "analysis/batch_dim.h"
#include "analysis/ir/text.h"
#include "analysis/op_rules.h"
#include "tests/test_util.h"

namespace fxdp::ir {
namespace {

using ::fxdp::testing::ReadTestData;
using ::fxdp::testing::StatusIs;
using ::fxdp::testing::TestDataPath;
using ::fxdp::testing::ValueOrDie;

TEST(RandomOpsTable, MatchesTheGoldenFile) {
  const std::string got = RandomOpsText();
  if (std::getenv("FXDP_REGEN_GOLDENS") != nullptr)
    std::ofstream(TestDataPath("random_ops.txt"), std::ios::binary) << got;
  EXPECT_EQ(ReadTestData("random_ops.txt"), got)
      << "regenerate: FXDP_REGEN_GOLDENS=1 build/tests/random_ops_table_test";
}

TEST(RandomOpsTable, EveryRowHasARandomOpRule) {
  for (const RandomOp& r : RandomOps()) {
    const Target t{std::string(r.name), std::string(r.overload)};
    const OpRule* rule = FindOpRule(t);
    ASSERT_NE(rule, nullptr) << t.ToString();
    EXPECT_TRUE(rule->has(kRandom)) << t.ToString();
    EXPECT_EQ(FindRandomOp(t), &r);
  }
  EXPECT_EQ(FindRandomOp(Target{"aten::randperm", ""}), nullptr);
  EXPECT_EQ(FindRandomOp(Target{"aten::bernoulli", "Tensor"}), nullptr);
}

TEST(RandomOpsTable, LayoutsRoundTripAndBadLinesAreNamed) {
  const std::vector<RandomLayout> l = {{"drop", 0, 1, 8}, {"noise_1", 1, 4, 28}};
  EXPECT_EQ(FormatRandomLayouts(l), "drop 0 1 8\nnoise_1 1 4 28");
  EXPECT_EQ(ValueOrDie(ParseRandomLayouts(FormatRandomLayouts(l))), l);
  EXPECT_THAT(ParseRandomLayouts("drop 0 0 8").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "line 'drop 0 0 8' is not"));
}

// randperm over the batch cannot be drawn so that N ranks equal one device:
// refused at compile time, naming the op.
TEST(RandomOpsTable, AnalysisRefusesARandomOpOutsideTheTable) {
  const Graph g = ValueOrDie(
      ParseGraphText("graph format=1 producer=\"test\" torch=\"2.13.0\" {\n"
                     "  %x: f32[8, 4] = placeholder() {role=INPUT, state=\"x\", batch_dim=0}\n"
                     "  %p: i64[8] = aten::randperm(8, device=device(cpu), pin_memory=false)\n"
                     "  %y: f32[8, 4] = aten::index.Tensor(%x, [%p])\n"
                     "  %output = output([%y]) {specs=[OTHER]}\n}\n"));
  EXPECT_THAT(AnalyzeBatchDims(g, {.world_size = 2}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "aten::randperm draws random values fxdp cannot draw rank-invariantly"));
}

// The random overloads fxdp has no draw for (a tensor probability, a tensor
// bound) are refused by name: their op rules say random, the table has no row.
TEST(RandomOpsTable, AnalysisRefusesRandomOverloadsWithoutARow) {
  for (const char* call : {"aten::bernoulli.Tensor(%x, %x)", "aten::randint_like.Tensor(%x, %h)"}) {
    const Graph g = ValueOrDie(ParseGraphText(
        absl::StrCat("graph format=1 producer=\"test\" torch=\"2.13.0\" {\n"
                     "  %x: f32[8, 4] = placeholder() {role=INPUT, state=\"x\", batch_dim=0}\n"
                     "  %h: i64[] = placeholder() {role=PARAMETER, state=\"h\"}\n"
                     "  %y: f32[8, 4] = ",
                     call, "\n  %output = output([%y]) {specs=[OTHER]}\n}\n")));
    const std::string op(call, std::string_view(call).find('('));
    EXPECT_THAT(AnalyzeBatchDims(g, {.world_size = 2}).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         absl::StrCat(op, " draws random values fxdp cannot draw")))
        << op;
  }
}

}  // namespace
}  // namespace fxdp::ir
