// StepRunner (executor/step_runner.h): the state carried from step to step, hyper-parameters
// written into it before a step, a kernel failure mid-step, and programs of several batch shapes
// over one state (docs/shapes.md).
#include "executor/step_runner.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "absl/strings/str_replace.h"

#include "analysis/ir/text.h"
#include "executor/interpreter.h"
#include "tests/executor/interpreter_test_util.h"
#include "tests/test_util.h"

namespace fxdp::executor {
namespace {

using ::fxdp::testing::ReadTestData;
using ::fxdp::testing::StatusIs;
using ::fxdp::testing::ValueOrDie;

// ---- StepRunner ----------------------------------------------------------------------

TEST(StepRunnerTest, UpdatesTheStateStepByStep) {
  const ir::Graph g = ValueOrDie(ir::ParseGraphText(ReadTestData("mlp_sgd.txt")));
  at::manual_seed(2);
  TensorMap state{
      {"fc.weight", at::randn({3, 4})}, {"fc.bias", at::randn({3})}, {"unrelated", at::ones({2})}};
  TensorMap batch{{"input.0", at::randn({8, 4})}, {"input.1", at::randn({8, 3})}};
  Program once = ValueOrDie(Program::Load(g, ProgramOptions{}));
  auto ref = ValueOrDie(
      once.Run(Values({state["fc.weight"], state["fc.bias"], batch["input.0"], batch["input.1"]})));
  StepRunner r =
      ValueOrDie(StepRunner::Create(ValueOrDie(Program::Load(g, ProgramOptions{})), state));
  const at::Tensor loss = ValueOrDie(r.Step(batch));
  ExpectClose(loss, ref[2].toTensor(), "loss");
  ExpectClose(r.state().at("fc.weight"), ref[0].toTensor(), "fc.weight");
  EXPECT_TRUE(at::equal(r.state().at("unrelated"), at::ones({2})));
  // The caller's state map was not modified.
  EXPECT_FALSE(at::equal(state["fc.weight"], r.state().at("fc.weight")));
  ValueOrDie(r.Step(batch));

  EXPECT_THAT(
      r.Step({{"input.0", at::randn({8, 4})}}).status(),
      StatusIs(absl::StatusCode::kNotFound,
               "the batch has no tensor 'input.1' (INPUT placeholder 'y'); it has: input.0"));
  EXPECT_THAT(StepRunner::Create(ValueOrDie(Program::Load(g, ProgramOptions{})),
                                 {{"fc.bias", at::ones({3})}})
                  .status(),
              StatusIs(absl::StatusCode::kNotFound, "the state lacks 'fc.weight'"));
  EXPECT_THAT(StepRunner::Create(ValueOrDie(Program::Load(g, ProgramOptions{})),
                                 {{"fc.bias", at::ones({3})}, {"fc.weight", at::ones({4, 3})}})
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "state 'fc.weight' is f32[4, 3], placeholder 'w' expects f32[3, 4]"));
}

TEST(StepRunnerTest, HyperparametersAreWrittenIntoTheStateBeforeTheStep) {
  const ir::Graph g = ValueOrDie(ir::ParseGraphText(ReadTestData("mlp_sgd_hyper.txt")));
  at::manual_seed(3);
  const at::Tensor w = at::randn({3, 4}), b = at::randn({3});
  TensorMap state{{"fc.weight", w},
                  {"fc.bias", b},
                  {"optim.group0.lr", at::scalar_tensor(0.1, at::kFloat)},
                  {"optim.group0.weight_decay", at::scalar_tensor(0.0, at::kFloat)}};
  TensorMap batch{{"input.0", at::randn({8, 4})}, {"input.1", at::randn({8, 3})}};
  StepRunner r =
      ValueOrDie(StepRunner::Create(ValueOrDie(Program::Load(g, ProgramOptions{})), state));
  // A value given as a double becomes the placeholder's f32[] tensor.
  ASSERT_TRUE(
      r.SetHyperparameters({{"optim.group0.lr", 0.5}, {"optim.group0.weight_decay", 0.25}}).ok());
  EXPECT_EQ(r.state().at("optim.group0.lr").scalar_type(), at::kFloat);
  EXPECT_EQ(r.state().at("optim.group0.lr").dim(), 0);
  EXPECT_FLOAT_EQ(r.state().at("optim.group0.lr").item<float>(), 0.5f);
  ValueOrDie(r.Step(batch));
  // The same step by hand: w - lr * (grad + wd * w) with the new values.
  const at::Tensor x = batch["input.0"], y = batch["input.1"];
  const at::Tensor d = (at::addmm(b, x, w.t()) - y) * 2.0 / 24.0;
  ExpectClose(r.state().at("fc.weight"), w - 0.5 * (d.t().mm(x) + 0.25 * w), "fc.weight");
  ExpectClose(r.state().at("fc.bias"), b - 0.5 * (d.sum(0) + 0.25 * b), "fc.bias");
  // Unknown names and names of other state refuse the whole call, naming them.
  EXPECT_THAT(
      r.SetHyperparameters({{"optim.group0.lr", 9.0}, {"optim.group0.momentum", 0.9}}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "'optim.group0.momentum' is not a hyper-parameter of the graph (no placeholder "
               "has that state name; its hyper-parameters: optim.group0.lr, "
               "optim.group0.weight_decay)"));
  EXPECT_FLOAT_EQ(r.state().at("optim.group0.lr").item<float>(), 0.5f);
  EXPECT_THAT(r.SetHyperparameters({{"fc.bias", 1.0}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "'fc.bias' is not a hyper-parameter of the graph (it is the state of "
                       "placeholder 'b'"));
  EXPECT_THAT(r.SetHyperparameters({{"input.0", 1.0}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "placeholder 'x'"));
}

TEST(StepRunnerTest, AKernelFailureMidStepLosesTheHandedOverState) {
  const ir::Graph g = Parse(R"(
  %w: f32[2] = placeholder() {role=PARAMETER, state="w"}
  %x: f32[3] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %y: f32[2] = aten::add.Tensor(%w, %x)
  %output = output([%y]) {specs=[UPDATED_PARAMETER "w"]}
)");
  StepRunner r = ValueOrDie(
      StepRunner::Create(ValueOrDie(Program::Load(g, ProgramOptions{})), {{"w", at::ones({2})}}));
  EXPECT_THAT(
      r.Step({{"x", at::ones({3})}}).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, "node 'y' (aten::add.Tensor): kernel failed"));
  EXPECT_THAT(r.Step({{"x", at::ones({3})}}).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "the state is lost"));
}

// ---- Programs of several batch shapes over one state ---------------------------------------

// mlp_sgd.txt (batch 8) at batch `b`: its sizes and the mean's divisor (b * 3).
ir::Graph MlpAtBatch(int b) {
  const std::string bs = std::to_string(b);
  return ValueOrDie(ir::ParseGraphText(absl::StrReplaceAll(
      ReadTestData("mlp_sgd.txt"), {{"[8, ", "[" + bs + ", "},
                                    {"[3, 8]", "[3, " + bs + "]"},
                                    {"%expand, 24)", "%expand, " + std::to_string(3 * b) + ")"}})));
}

TEST(StepRunnerTest, ProgramsOfSeveralShapesShareOneState) {
  at::manual_seed(4);
  const TensorMap start{{"fc.weight", at::randn({3, 4})}, {"fc.bias", at::randn({3})}};
  auto batch = [](int b) {
    return TensorMap{{"input.0", at::randn({b, 4})}, {"input.1", at::randn({b, 3})}};
  };
  const std::vector<std::pair<uint32_t, TensorMap>> steps = {
      {0, batch(8)}, {1, batch(5)}, {2, batch(3)}, {1, batch(5)}, {0, batch(8)}};
  const int sizes[] = {8, 5, 3};
  StepRunner r =
      ValueOrDie(StepRunner::Create(ValueOrDie(Program::Load(MlpAtBatch(8), {})), start));
  ASSERT_TRUE(r.AddProgram(1, ValueOrDie(Program::Load(MlpAtBatch(5), {}))).ok());
  ASSERT_TRUE(r.AddProgram(2, ValueOrDie(Program::Load(MlpAtBatch(3), {}))).ok());
  EXPECT_EQ(r.ProgramIds(), "0, 1, 2");
  // Each step equals a runner of that shape alone started from the state before it.
  TensorMap want = start;
  for (const auto& [id, b] : steps) {
    StepRunner one =
        ValueOrDie(StepRunner::Create(ValueOrDie(Program::Load(MlpAtBatch(sizes[id]), {})), want));
    const at::Tensor want_loss = ValueOrDie(one.Step(b));
    want = one.state();
    ExpectClose(ValueOrDie(r.Step(b, id)), want_loss, "loss");
    for (const auto& [name, t] : want) EXPECT_TRUE(at::equal(r.state().at(name), t)) << name;
  }
  EXPECT_EQ(r.state().size(), 2u);  // one state, no copy per program
  // A batch of one shape given to another's program is refused before it runs.
  EXPECT_THAT(r.Step(batch(5), 2).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "placeholder 'x' (INPUT 'input.0'): expected f32[3, 4], got f32[5, 4]"));
  EXPECT_THAT(r.Step(batch(5), 7).status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                                     "program 7 is not held (held: 0, 1, 2)"));
  ASSERT_TRUE(r.DropProgram(1).ok());
  EXPECT_THAT(r.Step(batch(5), 1).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "program 1 is not held (held: 0, 2)"));
  EXPECT_THAT(r.DropProgram(1), StatusIs(absl::StatusCode::kInvalidArgument,
                                         "program 1 is not one that can be dropped (held: 0, 2)"));
  EXPECT_THAT(r.DropProgram(0), StatusIs(absl::StatusCode::kInvalidArgument, "program 0 stays"));
  EXPECT_THAT(r.AddProgram(2, ValueOrDie(Program::Load(MlpAtBatch(3), {}))),
              StatusIs(absl::StatusCode::kInvalidArgument, "program 2 is already held"));
  EXPECT_THAT(r.AddProgram(0, ValueOrDie(Program::Load(MlpAtBatch(3), {}))),
              StatusIs(absl::StatusCode::kInvalidArgument, "program 0 is the first one"));
}

// A program whose placeholders differ from program 0's is refused naming the placeholder, program
// 0's declaration and this one's.
TEST(StepRunnerTest, AProgramWhosePlaceholdersDifferIsRefused) {
  const std::string first = R"(
  %w: f32[2] = placeholder() {role=PARAMETER, state="w"}
  %lr: f32[] = placeholder() {role=HYPERPARAMETER, state="lr"}
  %x: f32[2] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %m: f32[2] = aten::mul.Tensor(%x, %lr)
  %y: f32[2] = aten::add.Tensor(%w, %m)
  %output = output([%y]) {specs=[UPDATED_PARAMETER "w"]}
)";
  StepRunner r = ValueOrDie(StepRunner::Create(ValueOrDie(Program::Load(Parse(first), {})),
                                               {{"w", at::ones({2})}, {"lr", at::ones({})}}));
  auto variant = [&](std::vector<std::pair<std::string, std::string>> edits) {
    return ValueOrDie(Program::Load(Parse(absl::StrReplaceAll(first, edits)), {}));
  };
  // Another batch size: accepted.
  EXPECT_TRUE(
      r.AddProgram(1, variant({{"%x: f32[2]", "%x: f32[1]"}, {"%m: f32[2]", "%m: f32[1]"}})).ok());
  const std::vector<std::pair<std::vector<std::pair<std::string, std::string>>, std::string>>
      cases = {
          {{{"%lr: f32[]", "%lr: f64[]"}},
           "'lr': program 0 declares f32[] HYPERPARAMETER (placeholder 'lr'), this one f64[] "
           "HYPERPARAMETER (placeholder 'lr')"},
          {{{"role=HYPERPARAMETER", "role=BUFFER"}},
           "'lr': program 0 declares f32[] HYPERPARAMETER (placeholder 'lr'), this one f32[] "
           "BUFFER"},
          {{{"state=\"lr\"", "state=\"lr2\""}},
           "'lr': program 0 declares f32[] HYPERPARAMETER (placeholder 'lr'), this one has no such "
           "placeholder"},
          {{{"%x: f32[2]", "%x: f64[2]"}, {"%m: f32[2]", "%m: f64[2]"}},
           "'x': program 0 declares f32[2] INPUT batch dim 0 (placeholder 'x'), this one f64[2] "
           "INPUT batch dim 0"},
          {{{"batch_dim=0", "batch_dim=-1"}},
           "'x': program 0 declares f32[2] INPUT batch dim 0 (placeholder 'x'), this one f32[2] "
           "INPUT batch dim -1"},
          {{{"specs=[UPDATED_PARAMETER \"w\"]", "specs=[LOSS]"},
            {"%y: f32[2]", "%y: f32[]"},
            {"aten::add.Tensor(%w, %m)", "aten::dot(%w, %m)"}},
           "output 0: program 0's is UPDATED_PARAMETER 'w', this one's LOSS ''"},
      };
  for (const auto& [edits, message] : cases) {
    EXPECT_THAT(r.AddProgram(2, variant(edits)),
                StatusIs(absl::StatusCode::kInvalidArgument, message))
        << message;
  }
  // A state entry program 0 does not have.
  EXPECT_THAT(r.AddProgram(2, variant({{"%lr: f32[] = placeholder() {role=HYPERPARAMETER, "
                                        "state=\"lr\"}",
                                        "%lr: f32[] = placeholder() {role=HYPERPARAMETER, "
                                        "state=\"lr\"}\n  %v: f32[2] = placeholder() "
                                        "{role=BUFFER, state=\"v\"}"}})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "'v': this one declares f32[2] BUFFER (placeholder 'v'), program 0 has no "
                       "such placeholder (it has 3)"));
  EXPECT_EQ(r.ProgramIds(), "0, 1");
}

}  // namespace
}  // namespace fxdp::executor
