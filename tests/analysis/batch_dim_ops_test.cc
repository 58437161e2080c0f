// BatchDimAnalyzer on hand-written graphs (text form), the op families beyond
// the core: norms, conv, pooling, embedding, indexing, scatter, as_strided,
// foreach optimizers; ops without a rule; bad input; the JSON and table forms.
#include "analysis/batch_dim.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "analysis/ir/text.h"
#include "analysis/op_rules.h"
#include "tests/analysis/batch_dim_util.h"
#include "tests/test_util.h"

namespace fxdp {
namespace {

using ::fxdp::testing::Analysed;
using ::fxdp::testing::Analyze;
using ::fxdp::testing::MustRun;
using ::fxdp::testing::ReadTestData;
using ::fxdp::testing::StatusIs;
using ::fxdp::testing::ValueOrDie;
using ::fxdp::testing::Wrap;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

TEST(BatchDim, NormsConvPoolEmbedding) {
  auto r = MustRun(R"(
  %cw: f32[2, 3, 3, 3] rg = placeholder() {role=PARAMETER, state="conv.weight"}
  %bw: f32[2] rg = placeholder() {role=PARAMETER, state="bn.weight"}
  %bb: f32[2] rg = placeholder() {role=PARAMETER, state="bn.bias"}
  %rm: f32[2] = placeholder() {role=BUFFER, state="bn.running_mean"}
  %rv: f32[2] = placeholder() {role=BUFFER, state="bn.running_var"}
  %emb: f32[10, 4] rg = placeholder() {role=PARAMETER, state="emb.weight"}
  %x: f32[2, 3, 6, 6] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %tok: i64[2, 5] = placeholder() {role=INPUT, state="tok", batch_dim=0}
  %c: f32[2, 2, 4, 4] = aten::convolution(%x, %cw, None, [1, 1], [0, 0], [1, 1], false, [0, 0], 1)
  %bn: (f32[2, 2, 4, 4], f32[2], f32[2], f32[2], f32[2]) = aten::_native_batch_norm_legit_functional(%c, %bw, %bb, %rm, %rv, true, 0.1, 1e-05)
  %y: f32[2, 2, 4, 4] = operator.getitem(%bn#0, 0)
  %mp: (f32[2, 2, 2, 2], i64[2, 2, 2, 2]) = aten::max_pool2d_with_indices(%y, [2, 2], [2, 2])
  %p: f32[2, 2, 2, 2] = operator.getitem(%mp#0, 0)
  %e: f32[2, 5, 4] = aten::embedding(%emb, %tok)
  %ln: (f32[2, 5, 4], f32[2, 5, 1], f32[2, 5, 1]) = aten::native_layer_norm(%e, [4], None, None, 1e-05)
  %ge: f32[10, 4] = aten::embedding_dense_backward(%e, %tok, 10, -1, false)
  %output = output([%p, %ln#0, %ge]) {specs=[OTHER, OTHER, OTHER]}
)");
  EXPECT_EQ(r.P("c"), "S(0)");
  EXPECT_EQ(r.P("bn"), "(S(0), R, R, R, R)");
  EXPECT_THAT(r.Why("bn"), HasSubstr("local batch statistics"));
  ASSERT_EQ(r.a.notes().size(), 1u);
  EXPECT_EQ(r.P("mp"), "S(0)");
  EXPECT_EQ(r.P("e"), "S(0)");
  EXPECT_EQ(r.P("ln"), "S(0)");
  EXPECT_EQ(r.P("ge"), "P(sum)");
}

TEST(BatchDim, BufferExpandedToTheBatchIsBuiltShardedForEveryUse) {
  // BERT's token_type_ids: a [1, S] buffer expanded to [B, S] feeds an
  // embedding whose backward also reads the batch-sharded gradient. Both uses
  // need the local rows, so the expand is built with the local batch.
  auto r = MustRun(R"(
  %w: f32[10, 4] rg = placeholder() {role=PARAMETER, state="word.weight"}
  %tw: f32[2, 4] rg = placeholder() {role=PARAMETER, state="type.weight"}
  %buf: i64[1, 5] = placeholder() {role=BUFFER, state="token_type_ids"}
  %tok: i64[4, 5] = placeholder() {role=INPUT, state="tok", batch_dim=0}
  %ex: i64[4, 5]{0, 1} = aten::expand(%buf, [4, 5])
  %e: f32[4, 5, 4] = aten::embedding(%w, %tok)
  %te: f32[4, 5, 4] = aten::embedding(%tw, %ex)
  %a: f32[4, 5, 4] = aten::add.Tensor(%e, %te)
  %g: f32[2, 4] = aten::embedding_dense_backward(%a, %ex, 2, -1, false) {grad_of="type.weight"}
  %output = output([%g]) {specs=[OTHER]}
)");
  EXPECT_EQ(r.P("ex"), "S(0)");
  EXPECT_THAT(r.Why("ex"), HasSubstr("for its use by"));
  EXPECT_EQ(r.P("te"), "S(0)");
  EXPECT_EQ(r.P("g"), "P(sum)");
  EXPECT_TRUE(r.a.sharded_reads().empty());
}

TEST(BatchDim, EmbeddingBackwardSlicesAReplicatedIndexItCannotRebuild) {
  // The indices are a parameter-like value: sliced by rows for the backward.
  auto r = MustRun(R"(
  %idx: i64[4, 5] = placeholder() {role=BUFFER, state="idx"}
  %gr: f32[4, 5, 3] = placeholder() {role=INPUT, state="g", batch_dim=0}
  %g: f32[7, 3] = aten::embedding_dense_backward(%gr, %idx, 7, -1, false)
  %output = output([%g]) {specs=[OTHER]}
)");
  ASSERT_EQ(r.a.sharded_reads().size(), 1u);
  EXPECT_EQ(r.graph.node(r.a.sharded_reads()[0].value.node).name, "idx");
  EXPECT_EQ(r.P("g"), "P(sum)");
}

TEST(BatchDim, NllBackwardTargetAndAttentionMaskFollowTheBatch) {
  auto r = MustRun(R"(
  %m: f32[1, 1, 3, 3] = placeholder() {role=BUFFER, state="mask"}
  %lab: i64[1] = placeholder() {role=BUFFER, state="label"}
  %q: f32[4, 2, 3, 8] = placeholder() {role=INPUT, state="q", batch_dim=0}
  %x: f32[4, 6] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %me: f32[4, 1, 3, 3]{0, 9, 3, 1} = aten::expand(%m, [4, 1, 3, 3])
  %o: (f32[4, 2, 3, 8], f32[4, 2, 3]) = aten::_scaled_dot_product_flash_attention_for_cpu(%q, %q, %q, 0.0, false, attn_mask=%me)
  %t: i64[4] = aten::expand(%lab, [4])
  %ls: f32[4, 6] = aten::_log_softmax(%x, 1, false)
  %one: f32[] = aten::full([], 1.0)
  %tw: f32[] = aten::full([], 4.0)
  %gi: f32[4, 6] = aten::nll_loss_backward(%one, %ls, %t, None, 1, -100, %tw)
  %output = output([%o#0, %gi]) {specs=[OTHER, OTHER]}
)");
  EXPECT_EQ(r.P("me"), "S(0)");
  EXPECT_EQ(r.P("o"), "S(0)");
  EXPECT_EQ(r.P("t"), "S(0)");
  EXPECT_TRUE(r.a.sharded_reads().empty());
}

TEST(BatchDim, SafeSoftmaxAndScatterIntoFollowTheirRules) {
  // T5's _shift_right: zeros like the ids, a slice and a column scattered in.
  auto r = MustRun(R"(
  %ids: i64[4, 5] = placeholder() {role=INPUT, state="ids", batch_dim=0}
  %x: f32[4, 5] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %z: i64[4, 5] = aten::new_zeros(%ids, [4, 5])
  %s: i64[4, 4]{5, 1} = aten::slice.Tensor(%ids, 1, 0, -1)
  %ss: i64[4, 5] = aten::slice_scatter(%z, %s, 1, 1, 9223372036854775807)
  %col: i64[4] = aten::full([4], 0, dtype=torch.int64)
  %sel: i64[4, 5] = aten::select_scatter(%ss, %col, 1, 0)
  %p: f32[4, 5] = aten::_safe_softmax(%x, -1)
  %output = output([%sel, %p]) {specs=[OTHER, OTHER]}
)");
  EXPECT_EQ(r.P("z"), "S(0)");
  EXPECT_EQ(r.P("ss"), "S(0)");
  EXPECT_EQ(r.P("col"), "S(0)");
  EXPECT_EQ(r.P("sel"), "S(0)");
  EXPECT_EQ(r.P("p"), "S(0)");
  EXPECT_TRUE(r.a.warnings().empty());
  EXPECT_EQ(MustRun(R"(
  %x: f32[4, 5] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %p: f32[4, 5] = aten::_safe_softmax(%x, 0)
  %output = output([%p]) {specs=[OTHER]}
)")
                .P("p"),
            "R");
  EXPECT_THAT(Analyze(R"(
  %x: f32[4, 5] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %r: f32[5] = aten::full([5], 0.0)
  %y: f32[4, 5] = aten::select_scatter(%x, %r, 0, 1)
  %output = output([%y]) {specs=[OTHER]}
)")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "scatters into dim 0"));
}

TEST(BatchDim, AsStridedFollowsTheDimThatStepsOverSamples) {
  // Swin's pooled head and its backward: a flat zero buffer of B * 4 elements
  // viewed as [B, 4] receives the gradient, then is viewed as [B, 4, 1, 1].
  auto r = MustRun(R"(
  %x: f32[4, 4, 1, 1] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %g: f32[4, 4] = placeholder() {role=INPUT, state="g", batch_dim=0}
  %s: f32[4, 4, 1, 1]{4, 1, 4, 4} = aten::as_strided(%x, [4, 4, 1, 1], [4, 1, 4, 4])
  %z: f32[16] = aten::new_zeros(%g, [16])
  %v: f32[4, 4] = aten::as_strided(%z, [4, 4], [4, 1], 0)
  %c: f32[4, 4] = aten::copy(%v, %g)
  %sc: f32[16] = aten::as_strided_scatter(%z, %c, [4, 4], [4, 1], 0)
  %back: f32[4, 4, 1, 1] = aten::as_strided(%sc, [4, 4, 1, 1], [4, 1, 1, 1], 0)
  %output = output([%s, %back]) {specs=[OTHER, OTHER]}
)");
  EXPECT_EQ(r.P("s"), "S(0)");
  EXPECT_EQ(r.P("z"), "S(0)");
  EXPECT_EQ(r.P("v"), "S(0)");
  EXPECT_EQ(r.P("sc"), "S(0)");
  EXPECT_EQ(r.P("back"), "S(0)");
  EXPECT_TRUE(r.a.warnings().empty());
  // A view whose rows mix samples is refused, naming the node.
  EXPECT_THAT(Analyze(R"(
  %x: f32[4, 4] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %s: f32[2, 8] = aten::as_strided(%x, [2, 8], [8, 1])
  %output = output([%s]) {specs=[OTHER]}
)")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "node 's' (aten::as_strided)"));
}

constexpr char kLastTokenLogits[] = R"(
  %x: f32[4, 5, 3] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %tok: i64[4, 5] = placeholder() {role=INPUT, state="tok", batch_dim=0}
  %last: i64[4] = aten::argmax(%tok, -1)
  %ar: i64[4] = aten::arange(4, device=device(cpu), pin_memory=false)
  %ix: f32[4, 3] = aten::index.Tensor(%x, [%ar, %last])
  %z: f32[4, 5, 3] = aten::new_zeros(%ix, [4, 5, 3])
  %ip: f32[4, 5, 3] = aten::index_put(%z, [%ar, %last], %ix, true)
  %output = output([%ip]) {specs=[OTHER]}
)";

TEST(BatchDim, ArangeOfTheBatchIndexingItsRowsBecomesLocalPositions) {
  // logits[arange(B), last_token] (sequence classification heads) and its backward.
  auto r = MustRun(kLastTokenLogits);
  EXPECT_EQ(r.P("ar"), "S(0)");
  EXPECT_THAT(r.Why("ar"), HasSubstr("for its use by ix"));
  EXPECT_EQ(r.P("ix"), "S(0)");
  EXPECT_EQ(r.P("z"), "S(0)");
  EXPECT_EQ(r.P("ip"), "S(0)");
  // An arange whose values are also used as data stays global: the index is refused.
  EXPECT_THAT(Analyze(R"(
  %x: f32[4, 3] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %tok: i64[4] = placeholder() {role=INPUT, state="tok", batch_dim=0}
  %ar: i64[4] = aten::arange(4, device=device(cpu), pin_memory=false)
  %ix: f32[4] = aten::index.Tensor(%x, [%ar, %tok])
  %sh: i64[4] = aten::add.Tensor(%ar, %tok)
  %output = output([%ix, %sh]) {specs=[OTHER, OTHER]}
)")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "node 'ix' (aten::index.Tensor)"));
}

TEST(BatchDim, IndexPutFollowsTheBatchOfSelfAndValues) {
  // Falcon's rotary backward: x[:, :, idx] scattered back into zeros of x's shape.
  auto r = MustRun(R"(
  %idx: i64[2] = placeholder() {role=BUFFER, state="idx"}
  %g: f32[4, 3, 2, 5] = placeholder() {role=INPUT, state="g", batch_dim=0}
  %z: f32[4, 3, 6, 5] = aten::new_zeros(%g, [4, 3, 6, 5])
  %ip: f32[4, 3, 6, 5] = aten::index_put(%z, [None, None, %idx], %g, true)
  %output = output([%ip]) {specs=[OTHER]}
)");
  EXPECT_EQ(r.P("z"), "S(0)");
  EXPECT_EQ(r.P("ip"), "S(0)");
  EXPECT_THAT(Analyze(R"(
  %x: f32[4, 3] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %i: i64[2] = placeholder() {role=BUFFER, state="i"}
  %v: f32[2, 3] = placeholder() {role=BUFFER, state="v"}
  %ip: f32[4, 3] = aten::index_put(%x, [%i], %v, true)
  %output = output([%ip]) {specs=[OTHER]}
)")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "indexes dim 0, which holds the batch"));
}

TEST(BatchDim, ForeachOptimizerReadsReducedGradients) {
  auto r = MustRun(R"(
  %w0: f32[3, 2] rg = placeholder() {role=PARAMETER, state="w0"}
  %w1: f32[3] rg = placeholder() {role=PARAMETER, state="w1"}
  %x: f32[4, 2] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %g: f32[4, 3] = placeholder() {role=INPUT, state="g", batch_dim=0}
  %gt: f32[3, 4]{1, 3} = aten::t(%g)
  %g0: f32[3, 2] = aten::mm(%gt, %x) {grad_of="w0"}
  %g1: f32[3] = aten::sum.dim_IntList(%g, [0], false) {grad_of="w1"}
  %upd: (f32[3, 2], f32[3]) = aten::_foreach_add.List([%w0, %w1], [%g0, %g1], alpha=-0.1)
  %n0: f32[3, 2] = operator.getitem(%upd#0, 0)
  %n1: f32[3] = operator.getitem(%upd#1, 1)
  %output = output([%n0, %n1]) {specs=[UPDATED_PARAMETER "w0", UPDATED_PARAMETER "w1"]}
)");
  EXPECT_EQ(r.P("g0"), "P(sum)");
  EXPECT_EQ(r.P("g1"), "P(sum)");
  EXPECT_EQ(r.P("upd"), "R");
  EXPECT_EQ(r.a.reductions().size(), 2u);
}

constexpr char kRot90[] = R"g(
  %x: f32[4, 3] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %a: f32[3, 4] = aten::rot90(%x) {source="train.py:7 in model.head: y = torch.rot90(x)"}
  %b: f32[4, 3] = aten::rot90(%a)
  %c: f32[3, 4] = aten::rot90(%b)
  %d: (f32[3, 4], i64[3, 4]) = aten::cummax(%c, 1)
  %e: f32[3, 4] = operator.getitem(%d, 0)
  %output = output([%e]) {specs=[OTHER]}
)g";

TEST(BatchDim, OpWithoutRuleIsRefusedNamingTheUsersLineAndTheRowToAdd) {
  const absl::Status s = Analyze(kRot90).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          "node 'a' (aten::rot90) [train.py:7 in model.head: y = torch.rot90(x)]: "
                          "no batch-dim rule for aten::rot90 (nor do aten::cummax): the compile "
                          "step does not guess"));
  EXPECT_THAT(
      std::string(s.message()),
      HasSubstr(
          "analysis/op_rules.cc, e.g. {\"aten::rot90\", \"*\", F::kPointwise, kNotLinear, {}}"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("tests/testdata/op_rules.txt"));
}

TEST(BatchDim, OpWithoutRuleIsAGuessLabelledAsOneWhenAsked) {
  auto g = ValueOrDie(ir::ParseGraphText(Wrap(kRot90)));
  AnalyzeOptions o{2};
  o.guess_unruled_ops = true;
  Analysed r{g, ValueOrDie(AnalyzeBatchDims(g, o))};
  EXPECT_EQ(r.P("a"), "S(1)");
  ASSERT_EQ(r.a.warnings().size(), 2u);
  EXPECT_THAT(r.a.warnings()[0],
              HasSubstr("GUESSED: no batch-dim rule for aten::rot90 (3 nodes, first a)"));
  EXPECT_THAT(r.a.warnings()[0], HasSubstr("fxdp expand and jobs refuse this graph"));
  EXPECT_THAT(r.Why("a"), HasSubstr("NO RULE for aten::rot90"));
}

TEST(BatchDim, BadInput) {
  const std::string ok = R"(
  %x: f32[4, 3] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %output = output([%x]) {specs=[OTHER]}
)";
  EXPECT_THAT(Analyze(ok, 0).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "world size must be >= 1, got 0"));
  EXPECT_THAT(
      Analyze(R"(
  %x: f32[4, 3] = placeholder() {role=INPUT, state="x", batch_dim=2}
  %output = output([%x]) {specs=[OTHER]}
)")
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument, "node 'x' (#0): batch_dim 2 is out of range"));
  EXPECT_THAT(
      Analyze(R"(
  %x: f32[4, 3] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %y: f32[5, 3] = placeholder() {role=INPUT, state="y", batch_dim=0}
  %output = output([%x, %y]) {specs=[OTHER, OTHER]}
)")
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "inputs disagree on the batch size: x has 4 along its batch dim 0, y has 5"));
  // An input without a batch dim is replicated.
  auto r = MustRun(R"(
  %x: f32[4, 3] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %c: f32[3] = placeholder() {role=INPUT, state="c", batch_dim=-1}
  %a: f32[4, 3] = aten::add.Tensor(%x, %c)
  %output = output([%a]) {specs=[OTHER]}
)");
  EXPECT_EQ(r.P("c"), "R");
  EXPECT_EQ(r.P("a"), "S(0)");
}

TEST(BatchDim, JsonAndTableNameEveryNode) {
  auto g = ValueOrDie(ir::ParseGraphText(ReadTestData("mlp_sgd.txt")));
  BatchDimAnalysis a = ValueOrDie(AnalyzeBatchDims(g, {4}));
  const std::string json = AnalysisToJson(g, a);
  EXPECT_THAT(json, HasSubstr("\"world_size\": 4"));
  EXPECT_THAT(json, HasSubstr("\"placement\": \"P(sum)\""));
  const std::string table = AnalysisToTable(g, a);
  for (const ir::Node& n : g.nodes()) EXPECT_THAT(table, HasSubstr(n.name));
  EXPECT_THAT(table, HasSubstr("all-reduce sum of mm:0 before new_w (gradient of fc.weight)"));
}

}  // namespace
}  // namespace fxdp
