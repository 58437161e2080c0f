// analysis/ir/checkpoint_index.h: where each rank's part of each tensor goes
// (FULLY_SHARD's flat shards, the rest spread over the ranks), the index's
// JSON both ways (non-persistent buffers marked), and the refusal of an index
// whose parts do not cover a tensor exactly or that names files outside its
// directory.
#include "analysis/ir/checkpoint_index.h"

#include <string>

#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace fxdp::ir {
namespace {

using ::fxdp::testing::StatusIs;
using ::fxdp::testing::ValueOrDie;

std::map<std::string, CheckpointStateTensor> State() {
  return {{"a.weight", {DType::kFloat32, {5, 2}, "PARAMETER", true}},
          {"b", {DType::kBFloat16, {3}, "BUFFER", false}},
          {"c", {DType::kFloat32, {}, "HYPERPARAMETER", false}},
          {"d", {DType::kInt64, {2}, "CONSTANT", false}},
          {"e", {DType::kFloat32, {0}, "PARAMETER", true}}};
}

TEST(CheckpointIndex, ShardsGoToEveryRankTheRestRoundRobin) {
  const CheckpointIndex x = PlanCheckpoint(State(), 3, 7, "fully_shard");
  EXPECT_EQ(x.files, (std::vector<std::string>{"rank-0-of-3.safetensors", "rank-1-of-3.safetensors",
                                               "rank-2-of-3.safetensors"}));
  // 10 elements over 3 ranks: shards of 4, rank 2 holds 2 real ones.
  const auto& a = x.tensors.at("a.weight").parts;
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a[2].file, 2);
  EXPECT_EQ(a[2].begin, 8);
  EXPECT_EQ(a[2].end, 10);
  // b, c, d whole: ranks 0, 1, 2 in name order; an empty tensor has no part.
  EXPECT_EQ(x.tensors.at("b").parts[0].file, 0);
  EXPECT_EQ(x.tensors.at("c").parts[0].file, 1);
  EXPECT_EQ(x.tensors.at("d").parts[0].file, 2);
  EXPECT_TRUE(x.tensors.at("e").parts.empty());
  EXPECT_EQ(CheckpointStepDir(7), "step-7");
}

TEST(CheckpointIndex, JsonRoundTrips) {
  const CheckpointIndex x = PlanCheckpoint(State(), 2, 3, "replicate");
  const CheckpointIndex y = ValueOrDie(ParseCheckpointIndex(CheckpointIndexJson(x), "i.json"));
  EXPECT_EQ(y.step, 3);
  EXPECT_EQ(y.world_size, 2);
  EXPECT_EQ(y.style, "replicate");
  EXPECT_EQ(y.files, x.files);
  ASSERT_EQ(y.tensors.size(), x.tensors.size());
  EXPECT_EQ(y.tensors.at("b").dtype, DType::kBFloat16);
  EXPECT_EQ(y.tensors.at("a.weight").shape, (std::vector<int64_t>{5, 2}));
  EXPECT_EQ(y.tensors.at("a.weight").role, "PARAMETER");
  EXPECT_EQ(y.tensors.at("a.weight").parts.size(), 2u);
  EXPECT_EQ(CheckpointIndexJson(y), CheckpointIndexJson(x));
}

TEST(CheckpointIndex, RefusesPartsThatDoNotCoverATensorAndForeignFiles) {
  const std::string good = CheckpointIndexJson(PlanCheckpoint(State(), 2, 3, "fully_shard"));
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  auto parse = [](const std::string& j) { return ParseCheckpointIndex(j, "D/i.json").status(); };
  EXPECT_THAT(parse("{"), StatusIs(kInvalid, "checkpoint index 'D/i.json': not JSON"));
  EXPECT_THAT(parse("{\"weight_map\": {}}"), StatusIs(kInvalid, "not an fxdp checkpoint index"));
  // A gap, an overlap, past the end, an unlisted file.
  EXPECT_THAT(parse(absl::StrReplaceAll(good, {{"[\n     1,\n     5,", "[\n     1,\n     6,"}})),
              StatusIs(kInvalid, "tensor 'a.weight': part [1, 6, 10] does not follow element 5"));
  EXPECT_THAT(parse(absl::StrReplaceAll(good, {{"[\n     1,\n     5,", "[\n     1,\n     4,"}})),
              StatusIs(kInvalid, "does not follow element 5"));
  EXPECT_THAT(parse(absl::StrReplaceAll(good, {{"\"shape\": [\n    5,", "\"shape\": [\n    4,"}})),
              StatusIs(kInvalid, "of 8 in one of the 2 files"));
  EXPECT_THAT(parse(absl::StrReplaceAll(good, {{"[\n     1,\n     5,", "[\n     2,\n     5,"}})),
              StatusIs(kInvalid, "part [2, 5, 10]"));
  EXPECT_THAT(parse(absl::StrReplaceAll(good, {{"rank-1-of-2", "../rank-1-of-2"}})),
              StatusIs(kInvalid, "not a file name in its directory"));
  EXPECT_THAT(parse(absl::StrReplaceAll(good, {{"\"world_size\": 2", "\"world_size\": 3"}})),
              StatusIs(kInvalid, "world_size 3 with 2 files"));
}

// A non-persistent buffer (not in the model's state_dict) is marked and
// read back as such; every other entry carries no field, and an index
// without it (written before the tracer recorded persistence) reads as
// persistent. A field that is not a boolean is refused.
TEST(CheckpointIndex, MarksNonPersistentBuffersOnly) {
  std::map<std::string, CheckpointStateTensor> state = State();
  state["b"].persistent = false;
  const std::string json = CheckpointIndexJson(PlanCheckpoint(state, 2, 3, "replicate"));
  EXPECT_EQ(std::vector<std::string>(absl::StrSplit(json, "\"persistent\"")).size(), 2u) << json;
  const CheckpointIndex y = ValueOrDie(ParseCheckpointIndex(json, "i.json"));
  EXPECT_FALSE(y.tensors.at("b").persistent);
  EXPECT_TRUE(y.tensors.at("a.weight").persistent);
  EXPECT_EQ(CheckpointIndexJson(y), json);
  const CheckpointIndex old = ValueOrDie(ParseCheckpointIndex(
      absl::StrReplaceAll(json, {{",\n   \"persistent\": false", ""}}), "i.json"));
  EXPECT_TRUE(old.tensors.at("b").persistent);
  EXPECT_THAT(
      ParseCheckpointIndex(
          absl::StrReplaceAll(json, {{"\"persistent\": false", "\"persistent\": 0"}}), "D/i.json")
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "tensor 'b': \"persistent\" is 0, not true or false"));
}

}  // namespace
}  // namespace fxdp::ir
