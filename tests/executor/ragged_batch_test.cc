// Ragged inputs on the worker (issue 23): a rank graph whose metadata fxdp.ragged names a flat
// 1-D text and its offsets (EmbeddingBag's text classification input). Program::Load checks and
// records them; CheckInputs and CheckBatch take any text length up to the graph's (the global
// one, an upper bound); ShardBatch gives each rank its bags' tokens and its offsets rebased to
// them (ir::CutRagged), per_sample_weights cut by the same spans; together the ranks compute the
// global batch's bags. A streamed batch's chunks (already cut by the server) are checked likewise
// (ir::DeclaredTensors).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "analysis/ir/declared_tensors.h"
#include "analysis/ir/proto_codec.h"
#include "executor/interpreter.h"
#include "executor/worker/common.h"
#include "tests/executor/interpreter_test_util.h"
#include "tests/test_util.h"

namespace fxdp::executor {
namespace {

using ::fxdp::testing::StatusIs;
using ::fxdp::testing::ValueOrDie;
constexpr auto kBad = absl::StatusCode::kInvalidArgument;

constexpr int64_t kTokens = 17;  // the global text's length
constexpr int64_t kRows = 5;     // the global batch's bags

// A rank graph of `rows` bags (mode sum, per_sample_weights) over a text of up to kTokens
// tokens: `meta` is its fxdp.ragged value, `offsets` the offsets' type.
ir::Graph BagsGraph(int64_t rows, const std::string& meta = "text offsets\\nweights offsets\\n",
                    const std::string& offsets = "", const std::string& extra_meta = "") {
  const std::string off = offsets.empty() ? absl::StrCat("i64[", rows, "]") : offsets;
  return Parse(absl::StrCat(
      "  meta \"fxdp.ragged\" = \"", meta, "\"\n", extra_meta,
      "  %w: f32[20, 3] = placeholder() {role=PARAMETER, state=\"w\"}\n"
      "  %text: i64[17] = placeholder() {role=INPUT, state=\"text\", batch_dim=-1}\n"
      "  %offsets: ",
      off,
      " = placeholder() {role=INPUT, state=\"offsets\", batch_dim=0}\n"
      "  %weights: f32[17] = placeholder() {role=INPUT, state=\"weights\", batch_dim=-1}\n"
      "  %eb: (f32[",
      rows, ", 3], i64[17], i64[", rows, "], i64[", rows,
      "]) = aten::_embedding_bag(%w, %text, %offsets, false, 0, false, %weights, false, -1)\n"
      "  %bags: f32[",
      rows, ", 3] = operator.getitem(%eb#0, 0)\n",
      "  %output = output([%bags]) {specs=[OTHER]}\n"));
}

// The global batch: 5 bags of 4 1 3 2 7 tokens.
TensorMap GlobalBatch(at::ScalarType offsets = at::kLong) {
  at::manual_seed(3);
  return {{"text", at::randint(0, 20, {kTokens}, at::kLong)},
          {"offsets", at::tensor({0, 4, 5, 8, 10}, at::kLong).to(offsets)},
          {"weights", at::rand({kTokens})}};
}

const ProgramInput& Input(const Program& p, const std::string& name) {
  for (const ProgramInput& in : p.inputs())
    if (in.state_name == name) return in;
  ADD_FAILURE() << "no input " << name;
  return p.inputs().front();
}

TEST(RaggedLoad, RecordsEachRaggedInputWithItsOffsets) {
  const Program p = LoadCpu(BagsGraph(3));
  EXPECT_EQ(Input(p, "text").ragged_offsets, "offsets");
  EXPECT_EQ(Input(p, "weights").ragged_offsets, "offsets");
  EXPECT_EQ(Input(p, "offsets").ragged_offsets, "");
  EXPECT_EQ(InputTypeText(Input(p, "text")), "i64[<= 17] (ragged: bags by the offsets 'offsets')");
}

TEST(RaggedLoad, RefusesInputsThatCannotBeRagged) {
  auto load = [](const ir::Graph& g) { return Program::Load(g, ProgramOptions{}).status(); };
  EXPECT_THAT(load(BagsGraph(3, "txt offsets")),
              StatusIs(kBad,
                       "graph metadata fxdp.ragged line 'txt offsets': the graph has no "
                       "INPUT placeholder 'txt'"));
  EXPECT_THAT(load(BagsGraph(3, "text offs")), StatusIs(kBad, "no INPUT placeholder 'offs'"));
  EXPECT_THAT(load(BagsGraph(3, "w offsets")), StatusIs(kBad, "no INPUT placeholder 'w'"));
  EXPECT_THAT(load(BagsGraph(3, "offsets offsets")),
              StatusIs(kBad,
                       "input 'offsets' is i64[3] batched on dim 0; a ragged input is a "
                       "1-D tensor without a batch dim"));
  EXPECT_THAT(load(BagsGraph(3, "text weights")),
              StatusIs(kBad,
                       "its offsets 'weights' are f32[17] without a batch dim; offsets are "
                       "a 1-D int64 or int32 tensor batched on dim 0"));
  EXPECT_THAT(load(BagsGraph(3, "text offsets", "f32[3]")),
              StatusIs(kBad, "its offsets 'offsets' are f32[3] batched on dim 0"));
  EXPECT_THAT(load(BagsGraph(3, "text")), StatusIs(absl::StatusCode::kInternal, "'text'"));
}

TEST(RaggedInputs, TakeAnyLengthUpToTheGraphs) {
  Program p = LoadCpu(BagsGraph(2));
  auto values = [](const at::Tensor& text, const at::Tensor& weights) {
    return std::vector<c10::IValue>{at::rand({20, 3}), text, at::tensor({0, 1}, at::kLong),
                                    weights};
  };
  const at::Tensor five = at::arange(5, at::kLong);
  EXPECT_TRUE(p.CheckInputs(values(five, at::ones({5}))).ok());
  EXPECT_TRUE(p.CheckInputs(values(at::arange(17, at::kLong), at::ones({17}))).ok());
  EXPECT_THAT(p.CheckInputs(values(at::arange(18, at::kLong), at::ones({5}))),
              StatusIs(kBad,
                       "placeholder 'text' (INPUT 'text'): expected i64[<= 17] (ragged: "
                       "bags by the offsets 'offsets'), got i64[18]"));
  EXPECT_THAT(p.CheckInputs(values(five.to(at::kInt), at::ones({5}))),
              StatusIs(kBad, "expected i64[<= 17]"));
  EXPECT_THAT(p.CheckInputs(values(five.reshape({1, 5}), at::ones({5}))),
              StatusIs(kBad, "got i64[1, 5]"));
  const TensorMap batch{
      {"text", five}, {"offsets", at::tensor({0, 1}, at::kLong)}, {"weights", at::ones({5})}};
  EXPECT_TRUE(CheckBatch(batch, p).ok());
  TensorMap longer = batch;
  longer["weights"] = at::ones({18});
  EXPECT_THAT(CheckBatch(longer, p),
              StatusIs(kBad,
                       "input 'weights' is f32[18], this rank's graph expects f32[<= 17] "
                       "(ragged: bags by the offsets 'offsets')"));
  // Run: the bags of 5 tokens.
  auto out = ValueOrDie(p.Run(values(five, at::ones({5}))));
  EXPECT_EQ(out[0].toTensor().sizes(), (std::vector<int64_t>{2, 3}));
  // --check-outputs: _embedding_bag's offset2bag follows the text (i64[0] here against the
  // declared i64[17]): with ragged inputs every size is at most the graph's.
  ProgramOptions checked;
  checked.check_outputs = true;
  Program c = LoadCpu(BagsGraph(2), checked);
  ValueOrDie(c.Run(values(five, at::ones({5}))));
}

// Each rank's shard of the global batch, run through its graph: its offsets rebased to its
// bags' tokens, and together the rows of one device's bags.
void ExpectRanksComputeTheGlobalBags(at::ScalarType offsets_type, int64_t micro,
                                     const std::vector<std::vector<int64_t>>& want_rows) {
  const TensorMap global = GlobalBatch(offsets_type);
  const at::Tensor table = at::rand({20, 3});
  const at::Tensor want =
      std::get<0>(at::_embedding_bag(table, global.at("text"), global.at("offsets").to(at::kLong),
                                     false, 0, false, global.at("weights")));
  const std::string extra =
      micro > 0 ? absl::StrCat("  meta \"fxdp.micro_batch\" = \"", micro, "\"\n") : std::string();
  const std::string type = offsets_type == at::kInt ? "i32" : "i64";
  for (int rank = 0; rank < 2; ++rank) {
    const auto& rows = want_rows[static_cast<size_t>(rank)];
    const int64_t n = static_cast<int64_t>(rows.size());
    Program p = LoadCpu(
        BagsGraph(n, "text offsets\\nweights offsets\\n", absl::StrCat(type, "[", n, "]"), extra));
    const TensorMap shard = ValueOrDie(ShardBatch(global, p, rank, 2));
    ASSERT_TRUE(CheckBatch(shard, p).ok()) << CheckBatch(shard, p);
    EXPECT_EQ(shard.at("offsets").scalar_type(), offsets_type);
    EXPECT_EQ(shard.at("offsets")[0].item<int64_t>(), 0) << "rank " << rank;
    EXPECT_EQ(shard.at("text").size(0), shard.at("weights").size(0));
    EXPECT_LT(shard.at("text").size(0), kTokens);
    auto out = ValueOrDie(p.Run(std::vector<c10::IValue>{
        table, shard.at("text"), shard.at("offsets"), shard.at("weights")}));
    const at::Tensor index = at::tensor(rows, at::kLong);
    ExpectClose(out[0].toTensor(), want.index_select(0, index), absl::StrCat("rank ", rank));
  }
}

TEST(RaggedShardBatch, EachRankGetsItsBagsAndRebasedOffsets) {
  // 5 bags of 4 1 3 2 7 tokens: rank 0 bags 0-2 (tokens [0, 8)), rank 1 bags 3-4 ([8, 17)).
  const TensorMap global = GlobalBatch();
  Program p1 = LoadCpu(BagsGraph(2));
  const TensorMap shard = ValueOrDie(ShardBatch(global, p1, 1, 2));
  EXPECT_TRUE(at::equal(shard.at("offsets"), at::tensor({0, 2}, at::kLong)));
  EXPECT_TRUE(at::equal(shard.at("text"), global.at("text").narrow(0, 8, 9)));
  EXPECT_TRUE(at::equal(shard.at("weights"), global.at("weights").narrow(0, 8, 9)));
  ExpectRanksComputeTheGlobalBags(at::kLong, 0, {{0, 1, 2}, {3, 4}});
  ExpectRanksComputeTheGlobalBags(at::kInt, 0, {{0, 1, 2}, {3, 4}});
  // Micro-batches of 2 rows: rank 0 rows 0, 2, 4 (one of each), rank 1 rows 1, 3.
  ExpectRanksComputeTheGlobalBags(at::kLong, 2, {{0, 2, 4}, {1, 3}});
}

TEST(RaggedShardBatch, LeavesARanksBatchAndDeclaredShapesAlone) {
  Program p = LoadCpu(BagsGraph(2));
  const TensorMap own{{"text", at::arange(6, at::kLong)},
                      {"offsets", at::tensor({0, 4}, at::kLong)},
                      {"weights", at::ones({6})}};
  const TensorMap same = ValueOrDie(ShardBatch(own, p, 1, 2));
  EXPECT_TRUE(at::equal(same.at("text"), own.at("text")));
  EXPECT_TRUE(at::equal(same.at("offsets"), own.at("offsets")));
  // A file's declared tensors (meta, no values): the offsets narrowed, the text's global length
  // within the bound.
  auto meta = [](std::vector<int64_t> shape, at::ScalarType t) {
    return at::empty(shape, at::TensorOptions().dtype(t).device(at::kMeta));
  };
  const TensorMap declared{{"text", meta({kTokens}, at::kLong)},
                           {"offsets", meta({kRows}, at::kLong)},
                           {"weights", meta({kTokens}, at::kFloat)}};
  const TensorMap shapes = ValueOrDie(ShardBatch(declared, p, 1, 2));
  EXPECT_EQ(shapes.at("offsets").sizes(), (std::vector<int64_t>{2}));
  EXPECT_TRUE(CheckBatch(shapes, p).ok()) << CheckBatch(shapes, p);
}

TEST(RaggedShardBatch, RefusesOffsetsThatDecreaseOrPassTheText) {
  Program p = LoadCpu(BagsGraph(2));
  TensorMap bad = GlobalBatch();
  bad["offsets"] = at::tensor({0, 4, 9, 8, 10}, at::kLong);
  EXPECT_THAT(ShardBatch(bad, p, 1, 2).status(),
              StatusIs(kBad,
                       "input 'text' cut by the offsets 'offsets' for rank 1 of 2: "
                       "offsets[3] is 8, outside [9, 17]"));
  bad["offsets"] = at::tensor({0, 4, 5, 8, 18}, at::kLong);
  EXPECT_THAT(ShardBatch(bad, p, 1, 2).status(), StatusIs(kBad, "offsets[4] is 18"));
  bad["offsets"] = at::tensor({0.F, 4.F, 5.F, 8.F, 10.F});
  EXPECT_THAT(ShardBatch(bad, p, 1, 2).status(),
              StatusIs(kBad,
                       "'offsets' for rank 1 of 2: the offsets are f32[5]; offsets are "
                       "a 1-D int64 or int32 tensor"));
  // Rows the graph does not take: the plain narrowing's error.
  bad["offsets"] = at::tensor({0, 4, 5, 8, 10, 12, 14}, at::kLong);
  EXPECT_THAT(ShardBatch(bad, p, 1, 2).status(),
              StatusIs(kBad, "input 'offsets' has 7 samples on dim 0; rank 1 of 2 would get 3"));
}

// A streamed batch's first chunk (attach mode, the server's BatchSharder cut it): the rank graph's
// ragged INPUTs take any length up to the declared, every other INPUT its declared shape.
TEST(RaggedStreamedBatch, FirstChunksTakeARanksBagsOnly) {
  const v1::GraphDef g = ir::EncodeGraph(BagsGraph(2));
  const ir::DeclaredTensors declared =
      ir::DeclaredTensors::Of(g, ir::DeclaredTensors::Kind::kBatch);
  auto chunk = [](const std::string& name, v1::DType dtype, int64_t n) {
    v1::TensorChunk c;
    c.set_name(name);
    c.set_dtype(dtype);
    c.add_shape(n);
    return c;
  };
  EXPECT_TRUE(declared.CheckFirstChunk(chunk("text", v1::INT64, 9), "", 2).ok());
  EXPECT_TRUE(declared.CheckFirstChunk(chunk("text", v1::INT64, 0), "").ok());
  EXPECT_TRUE(declared.CheckFirstChunk(chunk("weights", v1::FLOAT32, 17), "").ok());
  EXPECT_THAT(declared.CheckFirstChunk(chunk("text", v1::INT64, 18), "step 1's batch", 2),
              StatusIs(kBad,
                       "step 1's batch: tensor 'text' is i64[18], the graph's placeholder "
                       "'text' declares i64[<= 17] (ragged: this rank's bags of it)"));
  EXPECT_THAT(declared.CheckFirstChunk(chunk("text", v1::INT32, 9), ""),
              StatusIs(kBad, "is i32[9]"));
  EXPECT_THAT(declared.CheckFirstChunk(chunk("offsets", v1::INT64, 3), ""),
              StatusIs(kBad,
                       "tensor 'offsets' is i64[3], the graph's placeholder 'offsets' "
                       "declares i64[2]"));
  // Without the metadata the text is exact.
  const ir::DeclaredTensors plain =
      ir::DeclaredTensors::Of(ir::EncodeGraph(BagsGraph(2, "")), ir::DeclaredTensors::Kind::kBatch);
  EXPECT_THAT(plain.CheckFirstChunk(chunk("text", v1::INT64, 9), ""),
              StatusIs(kBad, "declares i64[17]"));
}

}  // namespace
}  // namespace fxdp::executor
