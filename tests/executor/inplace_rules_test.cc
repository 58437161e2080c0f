// The interpreter's in-place candidates (executor/inplace.h) are the op
// table's kInplace rows (analysis/op_rules.cc), read from the table itself
// (fxdp_op_facts). This test holds the trait true of the LibTorch the worker
// runs: every kInplace op has its `name_` variant, with the functional op's
// arguments, for the row's overload (a "*" row: for every overload whose
// in-place variant exists, and at least one).
#include <gtest/gtest.h>

#include <string>

#include "analysis/op_rules.h"
#include "executor/torch_types.h"

namespace fxdp {
namespace {

bool SameArguments(const c10::OperatorHandle& a, const c10::OperatorHandle& b) {
  const auto& fa = a.schema().arguments();
  const auto& ia = b.schema().arguments();
  if (fa.size() != ia.size()) return false;
  for (size_t i = 0; i < fa.size(); ++i) {
    if (fa[i].name() != ia[i].name() || *fa[i].type() != *ia[i].type()) return false;
  }
  return true;
}

TEST(InplaceCandidates, EveryInplaceRowHasItsInplaceVariantInLibTorch) {
  int rows = 0;
  for (int i = 0; i < NumOpRules(); ++i) {
    const OpRule& r = OpRuleAt(i);
    if (!r.has(kInplace)) continue;
    ++rows;
    const std::string name(r.name);
    int variants = 0;
    for (const char* overload : {"", "Tensor", "Scalar", "Tensor_mode", "Scalar_mode", "Self"}) {
      if (r.overload != "*" && r.overload != overload) continue;
      auto op = executor::FindOperator(ir::Target{name, overload});
      if (!op.ok()) continue;
      auto ip = executor::FindOperator(ir::Target{name + "_", overload});
      if (r.overload != "*") {
        ASSERT_TRUE(ip.ok()) << name << "_." << overload << ": " << ip.status();
      }
      if (!ip.ok()) continue;
      EXPECT_TRUE(SameArguments(*op, *ip)) << name << "." << overload << " vs " << name << "_";
      ++variants;
    }
    EXPECT_GT(variants, 0) << r.name << "." << r.overload << " has kInplace but no `_` variant";
  }
  EXPECT_GE(rows, 28);  // the interpreter's list had 28 ops when it was a copy
}

}  // namespace
}  // namespace fxdp
