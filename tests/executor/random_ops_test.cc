// The executor's random ops (executor/random_ops.h): each rank's draws are its
// slice of one device's, for every op of the table, even and uneven splits, a
// batch inside a dim; the seed, step and node change the draws; dropout's rate;
// a Program draws with the graph's seed and the step it is given.
#include "executor/random_ops.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "analysis/ir/text.h"
#include "executor/interpreter.h"
#include "executor/torch_types.h"
#include "tests/test_util.h"

namespace fxdp::executor {
namespace {

using ::fxdp::testing::StatusIs;
using ::fxdp::testing::ValueOrDie;

// `shape` with dim `dim` (of extent `extent`) split into [outer, extent / outer].
std::vector<int64_t> Blocks(const std::vector<int64_t>& shape, int32_t dim, int64_t outer,
                            int64_t extent) {
  std::vector<int64_t> b(shape.begin(), shape.begin() + dim);
  b.push_back(outer);
  b.push_back(extent / outer);
  b.insert(b.end(), shape.begin() + dim + 1, shape.end());
  return b;
}

struct Case {
  std::string op, overload;
  ir::DType dtype;
  std::map<std::string, c10::IValue> args;  // by schema name; "self"/"input": the global tensor
};

// What node `name` draws as rank `slice` of `batch` (batch == 0: one device),
// its output's global shape `shape`, the batch at `dim` (outer blocks `outer`).
std::vector<at::Tensor> Draw(const Case& c, const std::vector<int64_t>& shape, int32_t dim,
                             int64_t outer, int64_t batch, ir::RankSlice slice, uint64_t seed = 7,
                             int64_t step = 3, const std::string& name = "drop") {
  const ir::Target target{c.op, c.overload};
  const c10::OperatorHandle op = ValueOrDie(FindOperator(target));
  ir::Node n;
  n.name = name;
  n.target = target;
  ir::TensorType t;
  t.shape = shape;
  t.dtype = c.dtype;
  std::vector<ir::RandomLayout> layouts;
  if (batch > 0) {
    layouts.push_back({name, dim, outer, shape[dim]});
    t.shape[dim] = shape[dim] / batch * slice.size;
  }
  t.stride = ir::ContiguousStrides(t.shape);
  n.outputs.push_back(ir::ValueType::Tensor(t));
  const RandomPlan plan =
      ValueOrDie(PlanRandom(*ir::FindRandomOp(target), op.schema(), n, layouts));
  std::vector<c10::IValue> stack(op.schema().arguments().size());
  for (size_t i = 0; i < stack.size(); ++i) {
    auto it = c.args.find(op.schema().arguments()[i].name());
    if (it == c.args.end()) continue;
    stack[i] = it->second;
    if (batch > 0 && it->second.isTensor()) {  // the rank's slice of a global tensor argument
      const int64_t rows = shape[dim] / (outer * batch);
      stack[i] = it->second.toTensor()
                     .reshape(Blocks(shape, dim, outer, shape[dim]))
                     .narrow(dim + 1, slice.start * rows, slice.size * rows)
                     .reshape(t.shape)
                     .contiguous();
    }
  }
  RandomContext ctx{seed, step, batch, slice};
  EXPECT_TRUE(RunRandom(plan, ctx, c10::Device(c10::kCPU), stack).ok());
  std::vector<at::Tensor> out;
  for (const c10::IValue& v : stack) out.push_back(v.toTensor());
  return out;
}

// One case per kind (the tensor arguments of `shape`).
std::vector<Case> Cases(const std::vector<int64_t>& shape) {
  const at::Tensor x = at::randn(shape);
  const at::Tensor probs = at::rand(shape);
  return {
      {"aten::bernoulli", "p", ir::DType::kFloat32, {{"p", 0.3}}},
      {"aten::bernoulli", "", ir::DType::kFloat32, {{"self", probs}}},
      {"aten::native_dropout",
       "",
       ir::DType::kFloat32,
       {{"input", x}, {"p", 0.25}, {"train", true}}},
      {"aten::rand", "", ir::DType::kFloat32, {}},
      {"aten::rand", "", ir::DType::kFloat64, {}},
      {"aten::rand_like", "", ir::DType::kBFloat16, {}},
      {"aten::randn", "", ir::DType::kFloat32, {}},
      {"aten::randint", "low", ir::DType::kInt64, {{"low", int64_t{-3}}, {"high", int64_t{9}}}},
      {"aten::uniform", "", ir::DType::kFloat32, {{"from", -2.0}, {"to", 5.0}}},
      {"aten::normal_functional", "", ir::DType::kFloat64, {{"mean", 1.0}, {"std", 3.0}}},
      {"aten::exponential", "", ir::DType::kFloat32, {{"lambd", 2.0}}},
  };
}

// Rank r's draws, put back where its rows are, give one device's: bit for bit.
void ExpectSlicesMakeTheWhole(const std::vector<int64_t>& shape, int32_t dim, int64_t outer,
                              int64_t batch, int32_t world) {
  for (const Case& c : Cases(shape)) {
    const std::vector<at::Tensor> whole = Draw(c, shape, dim, outer, 0, {});
    for (size_t k = 0; k < whole.size(); ++k) {
      std::vector<at::Tensor> parts;
      for (const ir::RankSlice& s : ir::SplitBatch(batch, world)) {
        const at::Tensor local = Draw(c, shape, dim, outer, batch, s)[k];
        parts.push_back(local.reshape(Blocks(shape, dim, outer, local.size(dim))));
      }
      const at::Tensor joined = at::cat(parts, dim + 1).reshape(shape);
      EXPECT_TRUE(at::equal(joined, whole[k].reshape(shape)))
          << c.op << "." << c.overload << " output " << k << ", batch at dim " << dim << " outer "
          << outer << ", " << world << " ranks";
    }
  }
}

TEST(RandomOps, EachRankDrawsItsSliceOfOneDevice) {
  ExpectSlicesMakeTheWhole({7, 5, 3}, 0, 1, 7, 3);  // uneven: 3 + 2 + 2
  ExpectSlicesMakeTheWhole({7, 5, 3}, 0, 1, 7, 1);
}

TEST(RandomOps, BatchInsideADim) {
  // [T*B, 3] after flattening a seq-first [T, B, 3] (outer T = 4) with B = 7 over 2 ranks.
  ExpectSlicesMakeTheWhole({28, 3}, 0, 4, 7, 2);
}

TEST(RandomOps, SeedStepAndNodeChangeTheDraws) {
  const Case c{"aten::rand", "", ir::DType::kFloat32, {}};
  const at::Tensor a = Draw(c, {64}, 0, 1, 0, {}, 7, 3, "n")[0];
  EXPECT_TRUE(at::equal(a, Draw(c, {64}, 0, 1, 0, {}, 7, 3, "n")[0]));
  EXPECT_FALSE(at::equal(a, Draw(c, {64}, 0, 1, 0, {}, 8, 3, "n")[0]));
  EXPECT_FALSE(at::equal(a, Draw(c, {64}, 0, 1, 0, {}, 7, 4, "n")[0]));
  EXPECT_FALSE(at::equal(a, Draw(c, {64}, 0, 1, 0, {}, 7, 3, "m")[0]));
  EXPECT_GE(a.min().item<float>(), 0.0f);
  EXPECT_LT(a.max().item<float>(), 1.0f);
}

TEST(RandomOps, DropoutKeepsOneMinusPAndScales) {
  const at::Tensor x = at::ones({1 << 22});
  for (double p : {0.1, 0.5}) {
    const Case c{
        "aten::native_dropout", "", ir::DType::kFloat32, {{"input", x}, {"p", p}, {"train", true}}};
    const std::vector<at::Tensor> out = Draw(c, {1 << 22}, 0, 1, 0, {});
    const double dropped = 1.0 - out[1].to(at::kDouble).mean().item<double>();
    EXPECT_NEAR(dropped, p, 0.01 * p) << "p " << p;
    EXPECT_TRUE(at::equal(out[0], x.mul(out[1]).mul_(1.0 / (1.0 - p))));
  }
}

TEST(RandomOps, IndexRunsNameAMismatch) {
  EXPECT_THAT(GlobalIndexRuns({3, 4}, {"n", 0, 1, 8}, 8, {0, 0, 4}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "dim 0 has 3 entries"));
  const auto runs = ValueOrDie(GlobalIndexRuns({2, 3, 4}, {"n", 1, 1, 6}, 6, {1, 3, 3}));
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[1].local, 12);
  EXPECT_EQ(runs[1].global, 24u + 12u);
  EXPECT_EQ(runs[1].count, 12);
}

// A Program draws with the graph's seed (or ProgramOptions::seed) and SetStep's step.
TEST(RandomOps, ProgramUsesTheSeedAndStep) {
  auto graph = [](const std::string& seed) {
    return ValueOrDie(ir::ParseGraphText(
        absl::StrCat("graph format=1 producer=\"test\" torch=\"2.13.0\" {\n", seed,
                     "  %x: f32[16] = placeholder() {role=INPUT, state=\"x\", batch_dim=0}\n"
                     "  %e: f32[16] = aten::empty_like(%x)\n"
                     "  %m: f32[16] = aten::bernoulli.p(%e, 0.5)\n"
                     "  %output = output([%m]) {specs=[OTHER]}\n}\n")));
  };
  auto run = [](const ir::Graph& g, int64_t step, std::optional<uint64_t> seed = std::nullopt) {
    ProgramOptions o;
    o.seed = seed;
    Program p = ValueOrDie(Program::Load(g, o));
    p.SetStep(step);
    std::vector<c10::IValue> in{at::zeros({16})};
    return ValueOrDie(p.Run(in))[0].toTensor();
  };
  const ir::Graph seeded = graph("  meta \"fxdp.seed\" = \"11\"\n");
  const at::Tensor a = run(seeded, 1);
  EXPECT_TRUE(at::equal(a, run(seeded, 1)));
  EXPECT_TRUE(at::equal(a, run(graph(""), 1, 11)));
  EXPECT_FALSE(at::equal(a, run(seeded, 2)));
  EXPECT_FALSE(at::equal(a, run(seeded, 1, 12)));
  EXPECT_THAT(Program::Load(graph("  meta \"fxdp.seed\" = \"-1\"\n"), ProgramOptions{}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "'fxdp.seed' is '-1'"));
}

}  // namespace
}  // namespace fxdp::executor
