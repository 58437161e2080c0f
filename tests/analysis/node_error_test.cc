// The one way errors name a graph node (analysis/ir/node_error.h).
#include "analysis/ir/node_error.h"

#include <gtest/gtest.h>

#include "analysis/ir/text.h"
#include "tests/test_util.h"

namespace fxdp::ir {
namespace {

using ::fxdp::testing::StatusIs;
using ::fxdp::testing::ValueOrDie;

TEST(NodeError, NamesTheNodeAndItsOp) {
  const Graph g = ValueOrDie(ParseGraphText(R"(graph format=1 producer="test" torch="2.13.0" {
  %x: f32[2] = placeholder() {role=INPUT, state="input.0", batch_dim=0}
  %y: f32[2] = aten::add.Tensor(%x, %x)
  %output = output([%y]) {specs=[OTHER]}
}
)"));
  EXPECT_EQ(NodeLabel(g.nodes()[1]), "node 'y' (aten::add.Tensor)");
  EXPECT_EQ(NodeLabel(g.nodes()[0]), "node 'x' (placeholder)");
  EXPECT_THAT(
      NodeError(g.nodes()[1], "shapes differ"),
      StatusIs(absl::StatusCode::kInvalidArgument, "node 'y' (aten::add.Tensor): shapes differ"));
  EXPECT_THAT(
      NodeError("mm", "aten::mm", "out of memory", absl::StatusCode::kResourceExhausted),
      StatusIs(absl::StatusCode::kResourceExhausted, "node 'mm' (aten::mm): out of memory"));
}

TEST(NodeError, QuotesTheUsersLineWhenTheGraphHasIt) {
  const Graph g = ValueOrDie(ParseGraphText(R"(graph format=1 producer="test" torch="2.13.0" {
  %x: f32[2] = placeholder() {role=INPUT, state="input.0", batch_dim=0}
  %y: f32[2] = aten::add.Tensor(%x, %x) {source="train.py:9 in model.block: y = x + x"}
  %output = output([%y]) {specs=[OTHER]}
}
)"));
  EXPECT_EQ(NodeLabel(g.nodes()[1]),
            "node 'y' (aten::add.Tensor) [train.py:9 in model.block: y = x + x]");
  EXPECT_THAT(
      NodeError(g.nodes()[1], "shapes differ"),
      StatusIs(
          absl::StatusCode::kInvalidArgument,
          "node 'y' (aten::add.Tensor) [train.py:9 in model.block: y = x + x]: shapes differ"));
}

}  // namespace
}  // namespace fxdp::ir
