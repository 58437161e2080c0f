// StepRunner (executor/step_runner.h): the state carried from step to step, hyper-parameters
// written into it before a step, and a kernel failure mid-step.
#include "executor/step_runner.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace fxdp::executor
