// The direct wire-format decoder (analysis/ir/wire_decoder.h) on hand-made
// encodings at the edges of the wire format, against the protobuf path
// (tests/analysis/wire_oracle.h), and the error contract of DecodeGraphBytes.
#include "analysis/ir/wire_decoder.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "analysis/ir/proto_codec.h"
#include "tests/analysis/wire_mutator.h"
#include "tests/analysis/wire_oracle.h"
#include "tests/test_util.h"

namespace fxdp::ir {
namespace {

using ::fxdp::testing::ReadTestData;
using ::fxdp::testing::StatusIs;
using ::fxdp::testing::ValueOrDie;
using wire_test::CollectMessages;
using wire_test::Compare;
using wire_test::GoldenEncodings;
using wire_test::Parse;
using wire_test::Tally;
using wire_test::WField;
using wire_test::WMsg;
using wire_test::Writer;

// ---- Hand-made encodings at the edges of the wire format.

// Raw encoding helpers.
std::string V(uint64_t v) {
  std::string b;
  do {
    b.push_back(static_cast<char>((v & 0x7f) | (v > 0x7f ? 0x80 : 0)));
    v >>= 7;
  } while (v != 0);
  return b;
}
std::string Field(uint32_t number, const std::string& payload) {
  return V((number << 3) | 2) + V(payload.size()) + payload;
}
std::string VarintField(uint32_t number, uint64_t v) { return V(number << 3) + V(v); }

// mlp_sgd.txt with the payload of node 5 (addmm)'s args[1], or of node 17
// (new_w)'s keyword argument alpha, replaced by `arg`. Node 5's arguments are
// at protobuf nesting level 2, keyword argument values at level 3.
std::string WithArgument(const std::string& arg, bool kwarg = false) {
  v1::GraphDef def = EncodeGraph(ValueOrDie(ParseGraphText(ReadTestData("mlp_sgd.txt"))));
  const std::string marker = "\x01MARK\x01";
  if (kwarg) {
    def.mutable_nodes(17)->mutable_kwargs(0)->mutable_value()->set_string_value(marker);
  } else {
    def.mutable_nodes(5)->mutable_args(1)->set_string_value(marker);
  }
  std::string bytes;
  def.SerializeToString(&bytes);
  std::shared_ptr<WMsg> root = Parse(bytes, v1::GraphDef::descriptor());
  std::vector<WMsg*> all;
  CollectMessages(root.get(), &all);
  std::vector<WField*> found;
  for (WMsg* m : all)
    for (WField& f : m->fields)
      if (f.msg && f.msg->desc == v1::Argument::descriptor() && f.msg->fields.size() == 1 &&
          f.msg->fields[0].bytes == marker)
        found.push_back(&f);
  EXPECT_EQ(found.size(), 1u);
  for (WField* f : found) {
    f->msg = nullptr;
    f->bytes = arg;
  }
  std::mt19937_64 rng(1);
  return Writer{&rng}.Write(*root);
}

struct EdgeCase {
  std::string name;
  std::string bytes;
  int expect;  // 1: accepted, 0: refused, -1: either
};

std::string Ref() { return Field(1, VarintField(1, 4)); }  // %t, output 0

// `inner` as the only item of `depth` nested lists.
std::string Nested(std::string inner, int depth) {
  for (int k = 0; k < depth; ++k) inner = Field(12, Field(1, inner));
  return inner;
}

// Oneof members replacing each other, merged pieces, unknown fields between members.
std::vector<EdgeCase> MergeCases() {
  const std::string ref = Ref();
  const std::string bad_list = Field(12, Field(1, ""));  // a list whose item has no value
  const std::string unknown_ref = Field(1, VarintField(1, 4) + VarintField(42, 1));
  return {
      {"plain ref", WithArgument(ref), 1},
      {"ref merged from two pieces",
       WithArgument(Field(1, VarintField(1, 4)) + Field(1, VarintField(2, 0))), 1},
      {"bad list replaced by a ref", WithArgument(bad_list + ref), 1},
      {"ref replaced by a bad list", WithArgument(ref + bad_list), 0},
      {"ref with unknown field replaced by an int", WithArgument(unknown_ref + VarintField(2, 4)),
       1},
      {"int replaced by ref with unknown field", WithArgument(VarintField(2, 4) + unknown_ref), 0},
      {"unknown field in the argument itself survives replacement",
       WithArgument(VarintField(42, 1) + ref), 0},
      {"unknown field in the argument between two members",
       WithArgument(ref + VarintField(42, 1) + VarintField(2, 4)), 0},
      {"known number with the wrong wire type between two members",
       WithArgument(ref + VarintField(12, 1) + VarintField(2, 4)), 0},
      {"scalar complex with unknown field replaced by int",
       WithArgument(Field(11, Field(4, VarintField(9, 1)) + VarintField(1, 3))), 1},
      {"scalar int replaced by complex with unknown field",
       WithArgument(Field(11, VarintField(1, 3) + Field(4, VarintField(9, 1)))), 0},
      {"list merged from two pieces",
       WithArgument(Field(12, Field(1, ref)) + Field(12, Field(1, ref))), 1},
      {"keyword value merged from two pieces",
       WithArgument(Field(11, VarintField(1, 3)) + Field(11, Field(4, "")), true), 1},
  };
}

// The list depth limit (16) and protobuf's recursion limit: the innermost item
// of 23 nested lists is at protobuf's nesting level 48 (the limit), of 24 at 50.
std::vector<EdgeCase> NestingCases() {
  const std::string ref = Ref();
  const std::string kw = Field(11, VarintField(1, 3));
  return {
      {"list nested 16 deep", WithArgument(Nested(ref, 16)), 1},
      {"list nested 17 deep", WithArgument(Nested(ref, 17)), 0},
      {"list nested 23 deep then replaced", WithArgument(Nested(VarintField(2, 1), 23) + ref), 1},
      {"list nested 24 deep then replaced (recursion limit)",
       WithArgument(Nested(VarintField(2, 1), 24) + ref), 0},
      {"keyword value nested 22 deep then replaced",
       WithArgument(Nested(VarintField(2, 1), 22) + kw, true), 1},
      {"keyword value nested 23 deep then replaced (recursion limit)",
       WithArgument(Nested(VarintField(2, 1), 23) + kw, true), 0},
  };
}

// Varint and tag lengths, groups, bad wire types and UTF-8 in replaced members.
std::vector<EdgeCase> EncodingCases() {
  const std::string ref = Ref();
  return {
      {"10-byte varint",
       WithArgument(std::string("\x10\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 11) + ref), 1},
      {"11-byte varint",
       WithArgument(std::string("\x10\xff\xff\xff\xff\xff\xff\xff\xff\xff\x81\x01", 12) + ref), 0},
      {"tag in 5 bytes wrapping to field 1",
       WithArgument(std::string("\x8a\x80\x80\x80\x10", 5) + V(ref.size() - 2) + ref.substr(2)), 1},
      {"tag in 6 bytes", WithArgument(std::string("\x8a\x80\x80\x80\x80\x00", 6) + ref.substr(1)),
       0},
      {"length in 5 bytes", WithArgument(std::string("\x0a\x82\x80\x80\x80\x00\x08\x04", 8)), 1},
      {"length in 6 bytes", WithArgument(std::string("\x0a\x82\x80\x80\x80\x80\x00\x08\x04", 9)),
       0},
      {"group in a replaced member", WithArgument(Field(12, "\x1b\x08\x01\x1c") + ref), 1},
      {"unclosed group in a replaced member", WithArgument(Field(12, "\x1b\x08\x01") + ref), 0},
      {"mismatched group end in a replaced member",
       WithArgument(Field(12, "\x1b\x08\x01\x24") + ref), 0},
      {"field number 0 in a replaced member",
       WithArgument(Field(12, std::string("\x00\x01", 2)) + ref), 0},
      {"end-group tag in a replaced member", WithArgument(Field(12, "\x0c") + ref), 0},
      {"wire type 6 in a replaced member", WithArgument(Field(12, "\x0e\x01") + ref), 0},
      {"fixed32 in a replaced member", WithArgument(Field(12, "\x0d\x01\x02\x03\x04") + ref), 1},
      {"invalid UTF-8 in a replaced string", WithArgument(Field(5, "\xff") + ref), 0},
  };
}

TEST(WireDecoderTest, EdgeCasesAgree) {
  std::vector<EdgeCase> cases = MergeCases();
  for (auto part : {NestingCases(), EncodingCases()})
    cases.insert(cases.end(), part.begin(), part.end());
  Tally t;
  for (const EdgeCase& c : cases) {
    SCOPED_TRACE(c.name);
    Compare(c.bytes, c.name, &t);
    const bool ok = DecodeGraphBytesViaMessage(c.bytes).ok();
    if (c.expect >= 0) {
      EXPECT_EQ(ok, c.expect == 1) << c.name;
    }
  }
  // Rank limits: 64 dims are fine, a 65th shape or stride entry is not.
  for (const auto& [shape, stride, expect] :
       {std::tuple{64, 64, true}, std::tuple{65, 65, false}, std::tuple{64, 65, false}}) {
    v1::GraphDef def = EncodeGraph(ValueOrDie(ParseGraphText(ReadTestData("mlp_sgd.txt"))));
    v1::TensorMeta* x = def.mutable_nodes(2)->mutable_outputs(0)->mutable_tensor();
    x->clear_shape();
    x->clear_stride();
    for (int k = 0; k < shape; ++k) x->add_shape(1);
    for (int k = 0; k < stride; ++k) x->add_stride(1);
    std::string b;
    def.SerializeToString(&b);
    Compare(b, absl::StrCat("rank ", shape, "/", stride), &t);
    EXPECT_EQ(DecodeGraphBytesViaMessage(b).ok(), expect) << shape << "/" << stride;
  }
  // Top-level oddities.
  const std::string golden = GoldenEncodings()[0];
  for (const std::string& b :
       {golden + std::string(1, '\0'), golden + "\x0c", golden + "\x07", golden + "\x1b\x1c",
        golden + "\x1b\x24", golden + "\xfa\x01\x00", golden.substr(0, golden.size() - 1),
        std::string("\x08\x01", 2) + golden, golden + "\x08\x81\x80\x80\x80\x10",
        golden + "\x08\x02", std::string(""), std::string("\x08\x01", 2)}) {
    Compare(b, "top level", &t);
  }
  std::printf("edge cases: %d, %d accepted\n", t.cases, t.accepted);
  EXPECT_EQ(t.failures, 0);
}

// ---- The error contract holds through DecodeGraphBytes.

TEST(WireDecoderTest, ErrorsAreTheContractMessages) {
  v1::GraphDef def = EncodeGraph(ValueOrDie(ParseGraphText(ReadTestData("mlp_sgd.txt"))));
  auto decode = [](const v1::GraphDef& d) {
    std::string b;
    d.SerializeToString(&b);
    return DecodeGraphBytes(b).status();
  };
  {
    v1::GraphDef d = def;
    v1::Argument* a = d.mutable_nodes(5)->mutable_args(1);
    a->GetReflection()->MutableUnknownFields(a)->AddLengthDelimited(42, "x");
    EXPECT_THAT(decode(d), StatusIs(absl::StatusCode::kInvalidArgument,
                                    "GraphDef.nodes[5].args[1] (fxdp.v1.Argument) has unknown "
                                    "field number 42"));
  }
  {
    v1::GraphDef d = def;
    d.set_format_version(static_cast<v1::FormatVersion>(2));
    EXPECT_THAT(decode(d), StatusIs(absl::StatusCode::kInvalidArgument,
                                    "unsupported format_version 2 (this build reads 1)"));
  }
  {
    v1::GraphDef d = def;
    d.clear_format_version();
    EXPECT_THAT(decode(d),
                StatusIs(absl::StatusCode::kInvalidArgument, "GraphDef has no format_version"));
  }
  {
    v1::GraphDef d = def;
    d.mutable_nodes(5)->mutable_outputs(0)->mutable_tensor()->set_dtype(static_cast<v1::DType>(77));
    EXPECT_THAT(decode(d), StatusIs(absl::StatusCode::kInvalidArgument,
                                    "node 'addmm' (#5): output 0: unknown dtype enum value 77"));
  }
  {
    v1::GraphDef d = def;
    d.mutable_nodes(6)->mutable_args(0)->mutable_ref()->set_node(9);
    EXPECT_THAT(decode(d), StatusIs(absl::StatusCode::kInvalidArgument,
                                    "node 'sub' (#6): argument 0 references node"));
  }
  std::string b;
  def.SerializeToString(&b);
  EXPECT_THAT(DecodeGraphBytes(b.substr(0, b.size() / 2)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a valid fxdp.v1.GraphDef"));
}

}  // namespace
}  // namespace fxdp::ir
