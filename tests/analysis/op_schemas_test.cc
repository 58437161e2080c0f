// CheckOpSchemas (analysis/op_schemas.h): the table of torch 2.13's op
// schemas refuses unknown ops, overloads and argument lists naming the node,
// and AnalyzeBatchDims applies it before anything else.
#include "analysis/op_schemas.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "analysis/batch_dim.h"
#include "analysis/ir/text.h"
#include "tests/test_util.h"

namespace fxdp {
namespace {

using ::fxdp::testing::StatusIs;

ir::Graph Parse(const std::string& call, const std::string& torch = "2.13.0+cpu") {
  const std::string text =
      "graph format=1 producer=\"test\" torch=\"" + torch + "\" {\n" +
      "  %x: f32[4, 3] = placeholder() {role=INPUT, state=\"x\", batch_dim=0}\n" +
      "  %y: f32[4, 3] = " + call + "\n" + "  %output = output([%y]) {specs=[OTHER]}\n}\n";
  return ::fxdp::testing::ValueOrDie(ir::ParseGraphText(text));
}

absl::Status Check(const std::string& call, const std::string& torch = "2.13.0+cpu") {
  return CheckOpSchemas(Parse(call, torch));
}

TEST(OpSchemas, TableIsTorch213AndLooksUpOverloads) {
  EXPECT_EQ(OpSchemaTorchVersion(), "2.13.0");
  EXPECT_GT(NumOpSchemas(), 3000);
  const OpSchema* add = FindOpSchema("aten::add", "Tensor");
  ASSERT_NE(add, nullptr);
  EXPECT_EQ(add->ToString(), "aten::add.Tensor(self, other, *, alpha=)");
  EXPECT_EQ(add->num_positional, 2);
  ASSERT_NE(FindOpSchema("aten::relu", ""), nullptr);
  ASSERT_NE(FindOpSchema("_c10d_functional::all_reduce", ""), nullptr);
  ASSERT_NE(FindOpSchema("_c10d_functional::wait_tensor", ""), nullptr);
  EXPECT_EQ(FindOpSchema("aten::add", "NoSuchOverload"), nullptr);
  EXPECT_EQ(FindOpSchema("aten::no_such_op", ""), nullptr);
}

TEST(OpSchemas, AcceptsCallsThatFitTheirSchema) {
  EXPECT_TRUE(Check("aten::relu(%x)").ok());
  EXPECT_TRUE(Check("aten::add.Tensor(%x, %x)").ok());
  EXPECT_TRUE(Check("aten::add.Tensor(%x, %x, alpha=2)").ok());
  EXPECT_TRUE(Check("aten::sum.dim_IntList(%x, [0], true)").ok());
  EXPECT_TRUE(Check("aten::rot90(%x, 1, [0, 1])").ok());
}

TEST(OpSchemas, RefusesUnknownOpsNamingNodeOpAndTracingTorch) {
  EXPECT_THAT(Check("aten::no_such_op(%x)"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "node 'y' (#1): unknown op aten::no_such_op: torch 2.13.0 (what "
                       "fxdp-worker runs) has no such operator (the graph was traced with "
                       "torch 2.13.0+cpu)"));
  EXPECT_TRUE(Check("aten::relu(%x)", "2.4.0").ok());  // known ops pass, whoever traced
  EXPECT_THAT(Check("aten::add.NoSuchOverload(%x, %x)", "2.99.0"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "node 'y' (#1): unknown op aten::add.NoSuchOverload: torch "
                       "2.13.0 has no overload 'NoSuchOverload' of aten::add (it has "));
  EXPECT_THAT(
      Check("aten::add.NoSuchOverload(%x, %x)", "2.99.0"),
      StatusIs(absl::StatusCode::kInvalidArgument, "(it has Scalar, Scalar_out, Tensor, out)"));
  EXPECT_THAT(
      Check("aten::add.NoSuchOverload(%x, %x)", "2.99.0"),
      StatusIs(absl::StatusCode::kInvalidArgument, "(the graph was traced with torch 2.99.0)"));
  EXPECT_THAT(Check("mylib::op(%x)"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "node 'y' (#1): op mylib::op is in namespace 'mylib': fxdp runs only "
                       "aten and _c10d_functional ops"));
}

TEST(OpSchemas, RefusesArgumentListsThatDoNotFit) {
  EXPECT_THAT(Check("aten::relu(%x, %x)"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "node 'y' (#1): aten::relu takes at most 1 positional arguments "
                       "(aten::relu(self)), got 2"));
  EXPECT_THAT(Check("aten::add.Tensor(%x, %x, beta=2)"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "node 'y' (#1): aten::add.Tensor has no argument 'beta' (arguments: "
                       "self, other, alpha)"));
  EXPECT_THAT(Check("aten::add.Tensor(%x, other=%x, self=%x)"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "node 'y' (#1): aten::add.Tensor: argument 'self' is given both "
                       "positionally and by keyword"));
  EXPECT_THAT(Check("aten::add.Tensor(%x)"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "node 'y' (#1): aten::add.Tensor is missing argument 'other' "
                       "(aten::add.Tensor(self, other, *, alpha=); got 1 positional)"));
}

TEST(OpSchemas, AnalyzeRefusesAGraphWithAnUnknownOp) {
  EXPECT_THAT(
      AnalyzeBatchDims(Parse("aten::no_such_op(%x)"), AnalyzeOptions{2}).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, "node 'y' (#1): unknown op aten::no_such_op"));
}

}  // namespace
}  // namespace fxdp
