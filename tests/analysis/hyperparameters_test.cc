// Hyper-parameter names of a graph and the schedule file's format.
#include "analysis/ir/hyperparameters.h"

#include <gtest/gtest.h>

#include <cmath>

#include "analysis/ir/proto_codec.h"
#include "analysis/ir/text.h"
#include "tests/test_util.h"

namespace fxdp::ir {
namespace {

using ::fxdp::testing::ReadTestData;
using ::fxdp::testing::StatusIs;
using ::fxdp::testing::ValueOrDie;

Graph Hyper() { return ValueOrDie(ParseGraphText(ReadTestData("mlp_sgd_hyper.txt"))); }

TEST(Hyperparameters, NamesInGraphOrderFromTheIrAndTheWire) {
  const Graph g = Hyper();
  const std::vector<std::string> want = {"optim.group0.lr", "optim.group0.weight_decay"};
  EXPECT_EQ(HyperparameterNames(g), want);
  const v1::GraphDef def = EncodeGraph(g);
  EXPECT_EQ(PlaceholderNames::Of(def).Hyperparameters(), want);
  EXPECT_TRUE(HyperparameterNames(ValueOrDie(ParseGraphText(ReadTestData("mlp_sgd.txt")))).empty());
}

TEST(Hyperparameters, CheckNamesWhatIsWrongAndListsTheKnownOnes) {
  const Graph g = Hyper();
  EXPECT_TRUE(CheckHyperparameterNames(g, {"optim.group0.lr"}, "x").ok());
  EXPECT_THAT(CheckHyperparameterNames(g, {"optim.group0.lr", "optim.group0.momentum"},
                                       "--schedule s.json"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--schedule s.json: 'optim.group0.momentum' is not a hyper-parameter of the "
                       "graph (no placeholder has that state name; its hyper-parameters: "
                       "optim.group0.lr, optim.group0.weight_decay)"));
  EXPECT_THAT(CheckHyperparameterNames(g, {"fc.weight"}, "x"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "'fc.weight' is not a hyper-parameter of the graph (it is the state of "
                       "placeholder 'w'"));
  const Graph plain = ValueOrDie(ParseGraphText(ReadTestData("mlp_sgd.txt")));
  EXPECT_THAT(CheckHyperparameterNames(plain, {"optim.group0.lr"}, "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, "the graph has none"));
}

TEST(Schedule, ListsAndClosedForms) {
  const Schedule s = ValueOrDie(Schedule::Parse(R"({
    "optim.group0.lr": [0.5, 0.25, 0.125, 99],
    "wd": {"constant": 0.01},
    "decay": {"step_decay": {"initial": 1.0, "step_size": 2, "gamma": 0.5}},
    "cos": {"linear_warmup_cosine": {"peak": 1.0, "warmup_steps": 1, "total_steps": 3, "final": 0.5}}
  })",
                                                3, "s.json"));
  EXPECT_EQ(s.steps(), 3);
  EXPECT_EQ(s.names(), (std::vector<std::string>{"cos", "decay", "optim.group0.lr", "wd"}));
  EXPECT_EQ(s.series().at("optim.group0.lr"), (std::vector<double>{0.5, 0.25, 0.125}));
  EXPECT_EQ(s.series().at("wd"), (std::vector<double>{0.01, 0.01, 0.01}));
  EXPECT_EQ(s.series().at("decay"), (std::vector<double>{1.0, 1.0, 0.5}));
  // s = 0: warmup 0/1; s = 1: progress 0 -> peak; s = 2: progress 1/2 -> midway to final.
  const std::vector<double>& cos = s.series().at("cos");
  EXPECT_DOUBLE_EQ(cos[0], 0.0);
  EXPECT_DOUBLE_EQ(cos[1], 1.0);
  EXPECT_DOUBLE_EQ(cos[2], 0.5 + 0.5 * 0.5 * (1 + std::cos(M_PI * 0.5)));
  EXPECT_EQ(s.At(2), (HyperparameterValues{
                         {"cos", 1.0}, {"decay", 1.0}, {"optim.group0.lr", 0.25}, {"wd", 0.01}}));
  EXPECT_TRUE(s.At(4).empty());
}

TEST(Schedule, WarmupCosineMatchesTransformersFormula) {
  // transformers.get_cosine_schedule_with_warmup(opt, 10, 100): lr_lambda(s)
  // = s / 10 for s < 10, else 0.5 * (1 + cos(pi * (s - 10) / 90)).
  const Schedule s = ValueOrDie(Schedule::Parse(
      R"({"lr": {"linear_warmup_cosine": {"peak": 0.001, "warmup_steps": 10, "total_steps": 100}}})",
      100, "s"));
  for (int step = 0; step < 100; ++step) {
    const double f = step < 10 ? step / 10.0 : 0.5 * (1 + std::cos(M_PI * (step - 10) / 90.0));
    EXPECT_NEAR(s.series().at("lr")[step], 0.001 * f, 1e-15) << step;
  }
}

TEST(Schedule, Errors) {
  auto err = [](const std::string& json, int64_t steps = 3) {
    return Schedule::Parse(json, steps, "s.json").status();
  };
  EXPECT_THAT(err(R"({"lr": [0.1, 0.2]})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "s.json: 'lr': 2 values for 3 steps (one value per step is needed)"));
  EXPECT_THAT(err("{"), StatusIs(absl::StatusCode::kInvalidArgument, "s.json: not valid JSON"));
  EXPECT_THAT(err("[1, 2]"),
              StatusIs(absl::StatusCode::kInvalidArgument, "expected a JSON object"));
  EXPECT_THAT(err(R"({"lr": [0.1, "x", 0.3]})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "'lr': value 1 (step 2) must be a finite number, got \"x\""));
  EXPECT_THAT(err(R"({"lr": {"cosine": {}}})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "'lr': unknown closed form 'cosine' (known: constant, linear_warmup_cosine, "
                       "step_decay"));
  EXPECT_THAT(
      err(R"({"lr": {"linear_warmup_cosine": {"peak": 1, "warmup": 3}}})"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "'lr'.linear_warmup_cosine: unknown field 'warmup' (fields: peak, warmup_steps, "
               "total_steps, final)"));
  EXPECT_THAT(err(R"({"lr": {"linear_warmup_cosine": {"warmup_steps": 3}}})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "field 'peak' is required"));
  EXPECT_THAT(err(R"({"lr": {"step_decay": {"initial": 1, "step_size": 0.5, "gamma": 0.1}}})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "field 'step_size' must be a non-negative integer, got 0.5"));
  EXPECT_THAT(err(R"({"lr": 0.1})"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "'lr': expected a list of values (one per step) or one closed form"));
  EXPECT_THAT(
      Schedule::ReadFile("/nonexistent/s.json", 3).status(),
      StatusIs(absl::StatusCode::kNotFound, "cannot read the schedule file /nonexistent/s.json"));
}

TEST(Schedule, FromSeries) {
  const Schedule s =
      ValueOrDie(Schedule::FromSeries({{"lr", {1, 2, 3, 4}}}, 3, "JobSpec.schedule"));
  EXPECT_EQ(s.series().at("lr"), (std::vector<double>{1, 2, 3}));
  EXPECT_THAT(Schedule::FromSeries({{"lr", {1, 2}}}, 3, "JobSpec.schedule").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "JobSpec.schedule: 'lr' has 2 values for 3 steps (one value per step)"));
  EXPECT_THAT(Schedule::FromSeries({{"lr", {1, NAN, 3}}}, 3, "JobSpec.schedule").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "'lr' value 1 (step 2) is nan"));
}

}  // namespace
}  // namespace fxdp::ir
