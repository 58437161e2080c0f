// The interpreter's in-place candidates (executor/inplace.h) are the op-rule
// table's kInplace rows (analysis/op_rules.h). executor/ may depend on the IR
// only, so it keeps its own list; this test keeps the two equal.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "analysis/op_rules.h"
#include "executor/inplace.h"

namespace fxdp {
namespace {

TEST(InplaceCandidates, AreTheOpTablesInplaceRows) {
  // Op name -> whether any of its rows has kInplace (the interpreter's list
  // is by name, every overload).
  std::map<std::string, bool> table;
  for (int i = 0; i < NumOpRules(); ++i) {
    table[std::string(OpRuleAt(i).name)] |= OpRuleAt(i).has(kInplace);
  }
  for (const auto& [name, inplace] : table) {
    EXPECT_EQ(executor::HasPointwiseInplaceVariant(name), inplace)
        << name << ": the interpreter's list and the kInplace trait of op_rules.cc disagree";
  }
}

}  // namespace
}  // namespace fxdp
