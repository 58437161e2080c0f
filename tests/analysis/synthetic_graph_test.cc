// The synthetic transformer training step used by bench/analysis_bench.cc:
// a valid graph of the requested size that round-trips byte-exactly and that
// the BatchDimAnalyzer places like a real traced step (no fallbacks).
#include "bench/synthetic_graph.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"

#include "analysis/batch_dim.h"
#include "analysis/ir/proto_codec.h"
#include "analysis/ir/verifier.h"
#include "tests/test_util.h"

namespace fxdp::bench {
namespace {

using ::fxdp::testing::ValueOrDie;

constexpr int64_t kTargetNodes = 2000;

TEST(SyntheticGraphTest, HasRequestedSizeAndVerifies) {
  const ir::Graph g = ValueOrDie(BuildSyntheticGraph(kTargetNodes));
  EXPECT_NEAR(g.size(), kTargetNodes, kTargetNodes * 0.05);
  EXPECT_EQ(g.size(), TransformerStepNodeCount(LayersForNodeCount(kTargetNodes)));
  EXPECT_TRUE(ir::VerifyGraph(g.header(), g.nodes()).ok());
  // With the zoo's sizes it has as many nodes as the traced zoo graph
  // (python -m fxdp.zoo.export: transformer_sgd.pb, 451 nodes).
  EXPECT_EQ(ValueOrDie(BuildTransformerStep(TransformerShape::Zoo(), 2)).size(), 451);
  EXPECT_EQ(TransformerStepNodeCount(2), 451);
}

TEST(SyntheticGraphTest, HasTheRolesOfATrainingStep) {
  const int32_t layers = 3;
  const ir::Graph g = ValueOrDie(BuildTransformerStep(TransformerShape{}, layers));
  int params = 0, states = 0, inputs = 0, grads = 0;
  for (const ir::Node& n : g.nodes()) {
    if (n.is_placeholder()) {
      switch (n.placeholder.role) {
        case ir::PlaceholderRole::kParameter: ++params; break;
        case ir::PlaceholderRole::kOptimizerState: ++states; break;
        case ir::PlaceholderRole::kInput:
          ++inputs;
          EXPECT_EQ(n.placeholder.batch_dim, 0) << n.name;
          break;
        default: ADD_FAILURE() << n.name;
      }
    }
    if (!n.grad_of.empty()) ++grads;
  }
  EXPECT_EQ(params, 11 * layers + 6);
  EXPECT_EQ(states, params);
  EXPECT_EQ(grads, params);
  EXPECT_EQ(inputs, 2);
  EXPECT_TRUE(g.FindState("blocks.2.attn.qkv.weight").has_value());
  // Every parameter and buffer updated, plus the loss.
  EXPECT_EQ(g.output_node().output_specs.size(), static_cast<size_t>(2 * params + 1));
  EXPECT_EQ(g.output_node().output_specs.back().role, ir::OutputRole::kLoss);
}

TEST(SyntheticGraphTest, RoundTripsByteExactly) {
  const ir::Graph g = ValueOrDie(BuildSyntheticGraph(kTargetNodes));
  const std::string bytes = ir::EncodeGraphBytes(g);
  EXPECT_EQ(ValueOrDie(BuildSyntheticGraphBytes(kTargetNodes)), bytes);
  const ir::Graph decoded = ValueOrDie(ir::DecodeGraphBytes(bytes));
  EXPECT_TRUE(decoded == g);
  EXPECT_EQ(ir::EncodeGraphBytes(decoded), bytes);
}

TEST(SyntheticGraphTest, RejectsBadShapes) {
  EXPECT_FALSE(BuildTransformerStep(TransformerShape{}, 0).ok());
  TransformerShape s;
  s.heads = 5;  // does not divide 768
  EXPECT_FALSE(BuildTransformerStep(s, 1).ok());
}

TEST(SyntheticGraphTest, AnalyzesLikeATracedStep) {
  const ir::Graph g = ValueOrDie(BuildSyntheticGraph(kTargetNodes));
  const BatchDimAnalysis a = ValueOrDie(AnalyzeBatchDims(g, {.world_size = 8}));
  EXPECT_EQ(a.warnings(), std::vector<std::string>{});
  EXPECT_EQ(a.batch_size(), TransformerShape{}.batch);

  const ir::NodeId tokens = *g.FindState("tokens");
  EXPECT_EQ(a.primary(tokens).placement.ToString(), "S(0)");
  absl::flat_hash_map<std::string, const Reduction*> reduced;
  for (const Reduction& r : a.reductions()) {
    if (!r.grad_of.empty()) reduced[r.grad_of] = &r;
  }
  for (int32_t i = 0; i < g.size(); ++i) {
    const ir::NodeId id{i};
    const ir::Node& n = g.node(id);
    if (n.is_placeholder() && n.placeholder.role == ir::PlaceholderRole::kParameter) {
      EXPECT_EQ(a.primary(id).placement.ToString(), "R") << n.name;
    }
    if (!n.grad_of.empty()) {
      EXPECT_EQ(a.primary(id).placement.ToString(), "P(avg)") << n.name;
      auto it = reduced.find(n.grad_of);
      ASSERT_NE(it, reduced.end()) << "no all-reduce for the gradient of " << n.grad_of;
      EXPECT_EQ(it->second->op, ReduceOp::kAvg) << n.grad_of;
      EXPECT_EQ(it->second->value.node, id) << n.grad_of;
    }
  }
  const ir::Node& out = g.output_node();
  const ir::ValueRef loss = out.args[0].as<ir::Argument::List>().back().as<ir::ValueRef>();
  EXPECT_EQ(a.value(loss).placement.ToString(), "P(avg)");
}

}  // namespace
}  // namespace fxdp::bench
