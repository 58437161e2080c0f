// The op-rule vocabulary (op_rules.h, view_rules.h): every row in text form is
// tests/testdata/op_rules.txt, byte for byte, so adding an op is one table line
// plus one golden line. Regenerate after a deliberate change:
//   FXDP_REGEN_GOLDENS=1 build/tests/op_rules_test
#include "analysis/op_rules.h"
#include "analysis/op_queries.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "analysis/matmul_spec.h"
#include "analysis/op_schemas.h"
#include "analysis/view_rules.h"
#include "tests/test_util.h"

namespace fxdp {
namespace {

using ::fxdp::testing::ReadTestData;
using ::fxdp::testing::TestDataPath;

std::string GoldenText() {
  return "# Every rule row of analysis/op_rules.cc and analysis/view_rules.cc in text form.\n"
         "# Regenerate: FXDP_REGEN_GOLDENS=1 build/tests/op_rules_test (docs/DEVELOPMENT.md).\n"
         "# op  family  linear(args)  role=arg:name ...  spec=  [traits]  shape=\n"
         "## op rules\n" +
         OpRulesText() + "## view rules\n" + ViewRulesText();
}

TEST(OpRulesGolden, EveryRowMatchesTheGoldenFile) {
  const std::string got = GoldenText();
  if (std::getenv("FXDP_REGEN_GOLDENS") != nullptr) {
    std::ofstream(TestDataPath("op_rules.txt"), std::ios::binary) << got;
  }
  EXPECT_EQ(ReadTestData("op_rules.txt"), got)
      << "the rule tables changed: regenerate tests/testdata/op_rules.txt with "
         "FXDP_REGEN_GOLDENS=1 build/tests/op_rules_test and review the diff";
}

TEST(OpRules, TextFormOfOneRowNamesEveryParameter) {
  EXPECT_EQ(OpRuleText(*FindOpRule({"aten::sum", "dim_IntList"})),
            "aten::sum.dim_IntList  reduction  additive(0)  dims=1:dim keepdim=2:keepdim "
            "reduces=sum");
  EXPECT_EQ(OpRuleText(*FindOpRule({"aten::addmm", ""})),
            "aten::addmm.*  matmul  spec=+ij,ik,kj->ij  shape=product");
}

TEST(MatmulSpec, ParsesOnceAndPrintsBack) {
  for (const char* s : {"ik,kj->ij", "+ij,ik,kj->ij", "bik,bkj->bij", "k,k->", "linear", "matmul",
                        "ij,ik,jk,,ij->ik"}) {
    const MatmulSpec m = MatmulSpec::Parse(s);
    EXPECT_TRUE(m.valid()) << s;
    EXPECT_EQ(m.ToString(), s);
  }
  for (const char* s : {"ik,kj", "ik,kj->i1", "abcde->a", "a,b,c,d,e,f->a", "ik-kj"}) {
    EXPECT_FALSE(MatmulSpec::Parse(s).valid()) << s;
  }
  for (int i = 0; i < NumOpRules(); ++i) {
    const OpRule& r = OpRuleAt(i);
    EXPECT_EQ(r.family == OpFamily::kMatmul, r.spec.kind() != MatmulSpec::Kind::kNone) << r.name;
  }
  // "linear" binds per call: the leading dims of x are broadcast labels.
  auto l = MatmulSpec::Parse("linear").Bind({3, 2, 1});
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->operands[0], (std::vector<int>{1000, 1001, 'k'}));
  EXPECT_EQ(l->output, (std::vector<int>{1000, 1001, 'n'}));
  EXPECT_EQ(l->bias_arg, 2);
  EXPECT_FALSE(MatmulSpec::Parse("matmul").Bind({2}).ok());
}

TEST(OpRules, OtherPassesReadTheSameRows) {
  // Which argument spells a shape: op rows and view rows.
  EXPECT_EQ(SizeArgIndex({"aten::zeros", ""}), 0);
  EXPECT_EQ(SizeArgIndex({"aten::new_zeros", ""}), 1);
  EXPECT_EQ(SizeArgIndex({"aten::view", ""}), 1);
  EXPECT_EQ(SizeArgIndex({"aten::as_strided_scatter", ""}), 2);
  EXPECT_EQ(SizeArgIndex({"aten::upsample_nearest2d_backward", ""}), 2);
  EXPECT_EQ(SizeArgIndex({"aten::relu", ""}), -1);
  EXPECT_EQ(SizeArgIndex({"aten::permute", ""}), -1);  // dims, not sizes
  // Packing ops of the overlap schedule, in-place candidates of the interpreter.
  EXPECT_TRUE(IsPackingOp({"aten::cat", ""}));
  EXPECT_TRUE(IsPackingOp({"aten::reshape", ""}));
  EXPECT_TRUE(IsPackingOp({"aten::mul", "Scalar"}));
  EXPECT_FALSE(IsPackingOp({"aten::add", "Tensor"}));
  EXPECT_TRUE(HasInplaceVariant({"aten::add", "Tensor"}));
  EXPECT_TRUE(HasInplaceVariant({"aten::masked_fill", "Scalar"}));
  EXPECT_FALSE(HasInplaceVariant({"aten::mm", ""}));
  // Shape checks: a view row's sizes reshape, an expand row's broadcast.
  EXPECT_EQ(ShapeRuleOf({"aten::view", ""}).kind, ShapeCheck::kView);
  EXPECT_EQ(ShapeRuleOf({"aten::expand", ""}).kind, ShapeCheck::kExpand);
  EXPECT_EQ(ShapeRuleOf({"aten::native_layer_norm", ""}).kind, ShapeCheck::kSameAsArg);
  // Replicated operands are named.
  const OpRule* conv = FindOpRule({"aten::convolution", ""});
  EXPECT_TRUE(conv->replicated(1));
  EXPECT_TRUE(conv->replicated(2));
  EXPECT_FALSE(conv->replicated(0));
}

// A row's positional parameters name the schema's arguments at their
// positions (the overload's, or for "*" rows the default overload's), so
// whoever reads a position from the table (sync BatchNorm's momentum, eps,
// saved statistics; the analyzer's dims; ...) reads the right argument.
TEST(OpRules, ParameterPositionsAreTheSchemas) {
  int checked = 0;
  for (int i = 0; i < NumOpRules(); ++i) {
    const OpRule& r = OpRuleAt(i);
    const OpSchema* schema = FindOpSchema(r.name, r.overload == "*" ? "" : r.overload);
    if (schema == nullptr) continue;
    for (const OpParam& p : r.params) {
      if (p.role == ParamRole::kNone || p.index < 0 || p.name.empty()) continue;
      ASSERT_LT(p.index, static_cast<int>(schema->args.size())) << OpRuleText(r);
      EXPECT_EQ(schema->args[p.index].name, p.name)
          << OpRuleText(r) << " vs " << schema->ToString();
      ++checked;
    }
  }
  EXPECT_GT(checked, 150);
}

}  // namespace
}  // namespace fxdp
