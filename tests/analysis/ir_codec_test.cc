// Decode/encode of GraphDef: byte-exact round trips and every decode-time
// rejection (unknown fields, unknown enums, versions, hostile sizes).
#include "analysis/ir/proto_codec.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <random>

#include "analysis/ir/text.h"
#include "analysis/ir/verifier.h"
#include "google/protobuf/unknown_field_set.h"
#include "tests/test_util.h"

namespace fxdp::ir {
namespace {

using ::fxdp::testing::ReadTestData;
using ::fxdp::testing::StatusIs;
using ::fxdp::testing::ValueOrDie;

v1::GraphDef GoldenProto(const std::string& name = "mlp_sgd.txt") {
  return EncodeGraph(ValueOrDie(ParseGraphText(ReadTestData(name))));
}

TEST(CodecTest, GoldenGraphsRoundTripByteForByte) {
  for (const char* name : ::fxdp::testing::kGoldenGraphs) {
    SCOPED_TRACE(name);
    const std::string text = ReadTestData(name);
    Graph g = ValueOrDie(ParseGraphText(text));
    const std::string bytes = EncodeGraphBytes(g);
    Graph decoded = ValueOrDie(DecodeGraphBytes(bytes));
    EXPECT_TRUE(decoded == g);
    EXPECT_EQ(EncodeGraphBytes(decoded), bytes);
    EXPECT_EQ(PrintGraph(decoded), text);
  }
}

TEST(CodecTest, RoundTripPreservesHeaderAndMetadataOrder) {
  v1::GraphDef def = GoldenProto();
  def.set_producer("fxdp-python 0.1.0");
  def.set_torch_version("2.13.0+cpu");
  auto* kv = def.add_metadata();
  kv->set_key("a");
  kv->set_value("z");
  std::string bytes;
  def.SerializeToString(&bytes);
  Graph g = ValueOrDie(DecodeGraphBytes(bytes));
  EXPECT_EQ(g.header().producer, "fxdp-python 0.1.0");
  EXPECT_EQ(g.header().metadata.back().first, "a");
  EXPECT_EQ(EncodeGraphBytes(g), bytes);
}

TEST(CodecTest, FileRoundTrip) {
  Graph g = ValueOrDie(ParseGraphText(ReadTestData("batchnorm_getitem.txt")));
  const std::string path = ::testing::TempDir() + "/bn.pb";
  ASSERT_TRUE(WriteGraphFile(g, path).ok());
  EXPECT_TRUE(ValueOrDie(ReadGraphFile(path)) == g);
  EXPECT_THAT(ReadGraphFile(path + ".missing").status(),
              StatusIs(absl::StatusCode::kNotFound, "cannot open"));
}

struct RejectCase {
  std::string name;
  std::function<void(v1::GraphDef&)> mutate;
  std::string expected;  // substring of the error message
};

void PrintTo(const RejectCase& c, std::ostream* os) { *os << c.name; }

class CodecRejectTest : public ::testing::TestWithParam<RejectCase> {};

TEST_P(CodecRejectTest, RejectsWithClearMessage) {
  v1::GraphDef def = GoldenProto();
  GetParam().mutate(def);
  EXPECT_THAT(DecodeGraph(def).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, GetParam().expected));
}

// Node indices in mlp_sgd.txt: 0 w, 1 b, 2 x, 3 y, 4 t, 5 addmm, 6 sub, 7 pow,
// 8 loss, 9 ones, 10 expand, ..., 15 mm, 16 sum, 17 new_w, 18 new_b, 19 output.
const RejectCase kRejectCases[] = {
    {"FutureFormatVersion",
     [](v1::GraphDef& d) { d.set_format_version(static_cast<v1::FormatVersion>(2)); },
     "unsupported format_version 2 (this build reads 1)"},
    {"MissingFormatVersion", [](v1::GraphDef& d) { d.clear_format_version(); },
     "GraphDef has no format_version"},
    {"UnknownTopLevelField",
     [](v1::GraphDef& d) { d.GetReflection()->MutableUnknownFields(&d)->AddVarint(99, 1); },
     "GraphDef (fxdp.v1.GraphDef) has unknown field number 99"},
    {"UnknownNestedField",
     [](v1::GraphDef& d) {
       v1::Argument* a = d.mutable_nodes(5)->mutable_args(1);
       a->GetReflection()->MutableUnknownFields(a)->AddLengthDelimited(42, "x");
     },
     "GraphDef.nodes[5].args[1] (fxdp.v1.Argument) has unknown field number 42"},
    {"UnknownDType",
     [](v1::GraphDef& d) {
       d.mutable_nodes(5)->mutable_outputs(0)->mutable_tensor()->set_dtype(
           static_cast<v1::DType>(77));
     },
     "node 'addmm' (#5): output 0: unknown dtype enum value 77"},
    {"UnknownNodeKind",
     [](v1::GraphDef& d) { d.mutable_nodes(4)->set_kind(static_cast<v1::NodeKind>(9)); },
     "node 't' (#4): unknown or missing node kind (enum value 9)"},
    {"MissingTarget", [](v1::GraphDef& d) { d.mutable_nodes(4)->clear_target(); },
     "node 't' (#4): has no target"},
    {"UnknownDeviceType",
     [](v1::GraphDef& d) {
       d.mutable_nodes(0)->mutable_outputs(0)->mutable_tensor()->mutable_device()->set_type(
           static_cast<v1::DeviceType>(12));
     },
     "node 'w' (#0): output 0: unknown device type enum value 12"},
    {"MissingDevice",
     [](v1::GraphDef& d) {
       d.mutable_nodes(0)->mutable_outputs(0)->mutable_tensor()->clear_device();
     },
     "node 'w' (#0): output 0: tensor metadata has no device"},
    {"TensorKindWithoutMetadata",
     [](v1::GraphDef& d) { d.mutable_nodes(6)->mutable_outputs(0)->clear_tensor(); },
     "node 'sub' (#6): output 0: tensor value without tensor metadata"},
    {"NoneKindWithMetadata",
     [](v1::GraphDef& d) { d.mutable_nodes(6)->mutable_outputs(0)->set_kind(v1::NONE_VALUE); },
     "node 'sub' (#6): output 0: non-tensor value carries tensor metadata"},
    {"MissingPlaceholderRole",
     [](v1::GraphDef& d) { d.mutable_nodes(1)->mutable_placeholder()->clear_role(); },
     "node 'b' (#1): placeholder role is missing or unknown (enum value 0)"},
    {"PlaceholderWithoutSpec", [](v1::GraphDef& d) { d.mutable_nodes(1)->clear_placeholder(); },
     "node 'b' (#1): placeholder has no placeholder spec"},
    {"CallWithPlaceholderSpec", [](v1::GraphDef& d) { d.mutable_nodes(4)->mutable_placeholder(); },
     "node 't' (#4): a call_function node carries a placeholder spec"},
    {"UnknownOutputRole",
     [](v1::GraphDef& d) {
       d.mutable_nodes(19)->mutable_output_specs(2)->set_role(static_cast<v1::OutputRole>(31));
     },
     "returned value 2: output role is missing or unknown (enum value 31)"},
    {"ArgumentWithoutValue", [](v1::GraphDef& d) { d.mutable_nodes(5)->mutable_args(0)->Clear(); },
     "node 'addmm' (#5): argument 0: argument has no value"},
    {"KeywordWithoutValue",
     [](v1::GraphDef& d) { d.mutable_nodes(17)->mutable_kwargs(0)->clear_value(); },
     "node 'new_w' (#17): keyword argument 'alpha' has no value"},
    {"ScalarWithoutValue",
     [](v1::GraphDef& d) {
       d.mutable_nodes(17)->mutable_kwargs(0)->mutable_value()->mutable_scalar();
     },
     "scalar argument has no value"},
    {"UnknownLayoutInList",
     [](v1::GraphDef& d) {
       d.mutable_nodes(10)->mutable_args(1)->mutable_list()->add_items()->set_layout(
           static_cast<v1::Layout>(8));
     },
     "node 'expand' (#10): argument 1: list item 2: unknown layout enum value 8"},
    {"ShapeOf2To62Elements",
     [](v1::GraphDef& d) {
       auto* t = d.mutable_nodes(2)->mutable_outputs(0)->mutable_tensor();
       t->set_shape(0, int64_t{1} << 31);
       t->set_shape(1, int64_t{1} << 31);
     },
     "node 'x' (#2): output 0: shape [2147483648, 2147483648] has more than"},
    {"ReferenceToNodeBeyondTwoTo40",
     [](v1::GraphDef& d) {
       d.mutable_nodes(5)->mutable_args(0)->mutable_ref()->set_node(0xFFFFFFFFu);
     },
     "reference to node #4294967295 output 0 is out of range"},
    {"ListsNestedTooDeep",
     [](v1::GraphDef& d) {
       v1::Argument* a = d.mutable_nodes(10)->mutable_args(1);
       for (int i = 0; i < 40; ++i) a = a->mutable_list()->add_items();
       a->set_int_value(1);
     },
     "lists nested deeper than 16"},
    // A symbolic graph (docs/shapes.md) decoded as it is would run its hints.
    {"SymbolicGraph",
     [](v1::GraphDef& d) {
       v1::Symbol* s = d.add_symbols();
       s->set_input_node(2);
       s->set_hint(4);
     },
     "the graph has 1 symbolic sizes and 0 guards (docs/shapes.md): instantiate it"},
    {"SymbolicTensorDim",
     [](v1::GraphDef& d) {
       d.mutable_nodes(5)->mutable_outputs(0)->mutable_tensor()->add_shape_expr(1);
     },
     "node 'addmm' (#5): output 0: a tensor has symbolic sizes"},
    {"SymbolicSizeArgument",
     [](v1::GraphDef& d) { d.mutable_nodes(10)->mutable_args(1)->set_size_expr(1); },
     "node 'expand' (#10): argument 1: an argument is a symbolic size"},
};

INSTANTIATE_TEST_SUITE_P(All, CodecRejectTest, ::testing::ValuesIn(kRejectCases),
                         [](const auto& info) { return info.param.name; });

TEST(CodecTest, TruncatedMessageClaimingHugeNodeIsRefused) {
  // Field 4 (nodes), wire type 2, then a varint length of 2^40 with no bytes.
  std::string bytes = "\x22";
  uint64_t len = uint64_t{1} << 40;
  while (len >= 0x80) {
    bytes.push_back(static_cast<char>((len & 0x7F) | 0x80));
    len >>= 7;
  }
  bytes.push_back(static_cast<char>(len));
  EXPECT_THAT(DecodeGraphBytes(bytes).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a valid fxdp.v1.GraphDef"));
}

TEST(CodecTest, GarbageBytesAreRefused) {
  EXPECT_THAT(DecodeGraphBytes("\xff\xff\xff\xff garbage").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a valid fxdp.v1.GraphDef"));
  EXPECT_THAT(DecodeGraphBytes("").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "no format_version"));
}

TEST(CodecTest, DeeplyNestedBytesHitTheRecursionLimit) {
  v1::GraphDef def = GoldenProto();
  v1::Argument* a = def.mutable_nodes(10)->mutable_args(1);
  for (int i = 0; i < 200; ++i) a = a->mutable_list()->add_items();
  std::string bytes;
  def.SerializeToString(&bytes);
  EXPECT_FALSE(DecodeGraphBytes(bytes).ok());
}

}  // namespace
}  // namespace fxdp::ir

namespace fxdp::ir {
namespace {

// Hostile input: thousands of corrupted encodings of every golden graph
// (flipped bytes, truncations, duplicated spans) must each decode to a
// graph or a status, never crash or hang. The parser gets the same test.
TEST(CodecTest, CorruptedInputsNeverCrash) {
  std::mt19937 rng(1234);
  int accepted = 0, rejected = 0;
  for (const char* name : ::fxdp::testing::kGoldenGraphs) {
    const std::string text = ReadTestData(name);
    const std::string bytes = EncodeGraphBytes(ValueOrDie(ParseGraphText(text)));
    for (int i = 0; i < 1500; ++i) {
      std::string b = bytes;
      std::string t = text;
      switch (i % 3) {
        case 0:
          for (int k = 0; k < 1 + static_cast<int>(rng() % 4); ++k) {
            b[rng() % b.size()] = static_cast<char>(rng());
            t[rng() % t.size()] = static_cast<char>(rng() % 96 + 32);
          }
          break;
        case 1:
          b.resize(rng() % b.size());
          t.resize(rng() % t.size());
          break;
        default: {
          const size_t at = rng() % b.size(), len = rng() % 16;
          b.insert(at, b.substr(at, len));
          const size_t tat = rng() % t.size();
          t.insert(tat, t.substr(tat, len));
        }
      }
      auto g = DecodeGraphBytes(b);
      (g.ok() ? accepted : rejected)++;
      if (g.ok()) {
        EXPECT_TRUE(VerifyGraph(g->header(), g->nodes()).ok());
      }
      auto p = ParseGraphText(t);
      (p.ok() ? accepted : rejected)++;
    }
  }
  EXPECT_GT(rejected, 0);
  std::printf("corrupted inputs: %d accepted (still valid graphs), %d rejected\n", accepted,
              rejected);
}

}  // namespace
}  // namespace fxdp::ir
