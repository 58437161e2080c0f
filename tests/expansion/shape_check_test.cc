// The shape check of expanded per-rank graphs: consistent graphs pass, a size
// or input that kept the global batch is INVALID_ARGUMENT naming rank and node,
// also through ExpandDataParallel (a deliberately inconsistent input graph).
#include "expansion/shape_check.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "analysis/batch_dim.h"
#include "analysis/ir/text.h"
#include "expansion/data_parallel.h"
#include "tests/test_util.h"

namespace fxdp {
namespace {

using ::fxdp::testing::StatusIs;
using ::fxdp::testing::ValueOrDie;

ir::Graph Parse(const std::string& body) {
  return ValueOrDie(ir::ParseGraphText("graph format=1 producer=\"test\" torch=\"2.13.0+cpu\" {\n" +
                                       body + "}\n"));
}

TEST(ShapeCheck, ConsistentLocalGraphPasses) {
  ir::Graph g = Parse(R"(
  %w: f32[10, 4] rg = placeholder() {role=PARAMETER, state="w"}
  %buf: i64[1, 5] = placeholder() {role=BUFFER, state="buf"}
  %tok: i64[2, 5] = placeholder() {role=INPUT, state="tok", batch_dim=0}
  %ex: i64[2, 5]{0, 1} = aten::expand(%buf, [2, 5])
  %e: f32[2, 5, 4] = aten::embedding(%w, %ex)
  %v: f32[10, 4] = aten::view(%e, [10, 4])
  %a: f32[2, 5, 4] = aten::add.Tensor(%e, %e)
  %g: f32[10, 4] = aten::embedding_dense_backward(%a, %tok, 10, -1, false)
  %s: f32[2, 4, 1, 1] = aten::as_strided(%v, [2, 4, 1, 1], [20, 1, 1, 1])
  %output = output([%g, %s]) {specs=[OTHER, OTHER]}
)");
  EXPECT_TRUE(CheckRankShapes(g, 0).ok()) << CheckRankShapes(g, 0);
}

TEST(ShapeCheck, GlobalSizesLeftBehindAreErrorsNamingRankAndNode) {
  // BERT's failure: the gradient is local, the expanded token_type_ids global.
  ir::Graph g = Parse(R"(
  %buf: i64[1, 5] = placeholder() {role=BUFFER, state="buf"}
  %gr: f32[2, 5, 4] = placeholder() {role=INPUT, state="g", batch_dim=0}
  %ex: i64[4, 5]{0, 1} = aten::expand(%buf, [4, 5])
  %g: f32[2, 4] = aten::embedding_dense_backward(%gr, %ex, 2, -1, false)
  %output = output([%g]) {specs=[OTHER]}
)");
  EXPECT_THAT(CheckRankShapes(g, 1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "rank 1's expanded graph: node 'g' (aten::embedding_dense_backward): "
                       "grad_output [2, 5, 4] does not match indices [4, 5]"));
  // Swin's failure: as_strided's size list spells the global batch.
  EXPECT_THAT(CheckRankShapes(Parse(R"(
  %x: f32[2, 32] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %s: f32[2, 32, 1, 1] = aten::as_strided(%x, [4, 32, 1, 1], [32, 1, 32, 32])
  %output = output([%s]) {specs=[OTHER]}
)"),
                              0),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "size argument [4, 32, 1, 1] but the output is recorded as [2, 32, 1, 1]"));
  EXPECT_THAT(
      CheckRankShapes(Parse(R"(
  %x: f32[2, 32] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %s: f32[4, 32] = aten::as_strided(%x, [4, 32], [32, 1])
  %output = output([%s]) {specs=[OTHER]}
)"),
                      0),
      StatusIs(absl::StatusCode::kInvalidArgument, "reaches element 127 of an input with 64"));
  EXPECT_THAT(
      CheckRankShapes(Parse(R"(
  %x: f32[2, 3] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %p: f32[4, 3] = placeholder() {role=PARAMETER, state="p"}
  %a: f32[2, 3] = aten::add.Tensor(%x, %p)
  %output = output([%a]) {specs=[OTHER]}
)"),
                      0),
      StatusIs(absl::StatusCode::kInvalidArgument, "operands [2, 3], [4, 3] do not broadcast"));
  EXPECT_THAT(CheckRankShapes(Parse(R"(
  %x: f32[2, 3] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %v: f32[4, 3] = aten::view(%x, [4, 3])
  %output = output([%v]) {specs=[OTHER]}
)"),
                              0),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "size [4, 3] has 12 elements, its input [2, 3] has 6"));
  EXPECT_THAT(CheckRankShapes(Parse(R"(
  %x: f32[2, 3] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %t: i64[4] = placeholder() {role=BUFFER, state="t"}
  %l: (f32[], f32[]) = aten::nll_loss_forward(%x, %t, None, 1, -100)
  %output = output([%l#0]) {specs=[OTHER]}
)"),
                              0),
              StatusIs(absl::StatusCode::kInvalidArgument, "input [2, 3] and target [4] disagree"));
}

TEST(ShapeCheck, UpsampleBackwardInputSizeIsRewrittenAndChecked) {
  // MobileViT: upsample_bilinear2d_backward's input_size spells the batch.
  ir::Graph g = Parse(R"(
  %w: f32[2] rg = placeholder() {role=PARAMETER, state="w"}
  %x: f32[4, 2, 4, 4] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %u: f32[4, 2, 8, 8] = aten::upsample_bilinear2d(%x, [8, 8], false)
  %gx: f32[4, 2, 4, 4] = aten::upsample_bilinear2d_backward(%u, [8, 8], [4, 2, 4, 4], false)
  %m: f32[4, 2, 4, 4] = aten::mul.Tensor(%gx, %x)
  %s: f32[2] = aten::sum.dim_IntList(%m, [0, 2, 3], false) {grad_of="w"}
  %output = output([%s]) {specs=[OTHER]}
)");
  BatchDimAnalysis a = ValueOrDie(AnalyzeBatchDims(g, AnalyzeOptions{2}));
  Expansion e = ValueOrDie(ExpandDataParallel(g, a, ExpandOptions{.world_size = 2}));
  const ir::Graph& r0 = e.graph(0);
  EXPECT_EQ(ir::PrintArgument(r0, r0.node(*r0.FindNode("gx")).args[2]), "[2, 2, 4, 4]");
  EXPECT_THAT(
      CheckRankShapes(Parse(R"(
  %u: f32[2, 2, 8, 8] = placeholder() {role=INPUT, state="u", batch_dim=0}
  %gx: f32[2, 2, 4, 4] = aten::upsample_bilinear2d_backward(%u, [8, 8], [4, 2, 4, 4], false)
  %output = output([%gx]) {specs=[OTHER]}
)"),
                      1),
      StatusIs(absl::StatusCode::kInvalidArgument, "size argument [4, 2, 4, 4] but the output"));
}

TEST(ShapeCheck, ExpandRefusesAGraphThatCannotRunAtCompileTime) {
  // A single-device graph that is already inconsistent (indices of 6 tokens,
  // gradients for 5): the expansion must refuse it, not a kernel at step 1.
  ir::Graph g = Parse(R"(
  %w: f32[7, 3] rg = placeholder() {role=PARAMETER, state="w"}
  %gr: f32[4, 5, 3] = placeholder() {role=INPUT, state="g", batch_dim=0}
  %idx: i64[4, 6] = placeholder() {role=INPUT, state="idx", batch_dim=0}
  %ge: f32[7, 3] = aten::embedding_dense_backward(%gr, %idx, 7, -1, false) {grad_of="w"}
  %output = output([%ge]) {specs=[OTHER]}
)");
  BatchDimAnalysis a = ValueOrDie(AnalyzeBatchDims(g, AnalyzeOptions{2}));
  EXPECT_THAT(ExpandDataParallel(g, a, ExpandOptions{.world_size = 2}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "rank 0's expanded graph: node 'ge' (aten::embedding_dense_backward): "
                       "grad_output [2, 5, 3] does not match indices [2, 6]"));
}

}  // namespace
}  // namespace fxdp
