// The direct wire-format decoder (analysis/ir/wire_decoder.h) against the
// protobuf path (parse into a v1::GraphDef, then DecodeGraph) as the oracle:
// on the golden graphs, the synthetic transformer step and thousands of
// mutated encodings (bit flips, truncations, fields reordered, duplicated,
// split, inserted, unknown, packed/unpacked, non-minimal varints, oneof
// members replaced, deep nesting), both must accept with equal graphs, or
// both refuse with the same status. A valid input must never need the
// protobuf path.
#include "analysis/ir/wire_decoder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "analysis/ir/proto_codec.h"
#include "analysis/ir/text.h"
#include "bench/synthetic_graph.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/wire_format_lite.h"
#include "tests/analysis/wire_mutator.h"
#include "tests/analysis/wire_oracle.h"
#include "tests/test_util.h"

namespace fxdp::ir {
namespace {

namespace pb = ::google::protobuf;
using ::fxdp::testing::ReadTestData;
using ::fxdp::testing::StatusIs;
using ::fxdp::testing::ValueOrDie;
using wire::WireType;
using wire_test::Compare;
using wire_test::GoldenEncodings;
using wire_test::Mutator;
using wire_test::Parse;
using wire_test::Tally;
using wire_test::WMsg;
using wire_test::Writer;

// ---- The field table is graph.proto's.

TEST(WireFieldsTest, MatchTheGeneratedDescriptors) {
  const pb::FileDescriptor* file = v1::GraphDef::descriptor()->file();
  int listed = 0;
  for (const wire::FieldSpec& spec : wire::kFields) {
    SCOPED_TRACE(absl::StrCat(spec.message, ".", spec.field));
    const pb::Descriptor* m =
        pb::DescriptorPool::generated_pool()->FindMessageTypeByName(std::string(spec.message));
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(m->file(), file);
    const pb::FieldDescriptor* f = m->FindFieldByName(std::string(spec.field));
    ASSERT_NE(f, nullptr);
    EXPECT_EQ(static_cast<uint32_t>(f->number()), spec.number);
    const auto type = static_cast<pb::internal::WireFormatLite::FieldType>(f->type());
    EXPECT_EQ(static_cast<int>(pb::internal::WireFormatLite::WireTypeForFieldType(type)),
              static_cast<int>(spec.wire_type));
    // The decoder reads strings as UTF-8-checked strings, ints as varints
    // (no zigzag): a change to bytes, sint64 or fixed32 must show here.
    EXPECT_TRUE(f->type() == pb::FieldDescriptor::TYPE_STRING ||
                f->type() == pb::FieldDescriptor::TYPE_MESSAGE ||
                f->type() == pb::FieldDescriptor::TYPE_ENUM ||
                f->type() == pb::FieldDescriptor::TYPE_INT64 ||
                f->type() == pb::FieldDescriptor::TYPE_INT32 ||
                f->type() == pb::FieldDescriptor::TYPE_UINT32 ||
                f->type() == pb::FieldDescriptor::TYPE_BOOL ||
                f->type() == pb::FieldDescriptor::TYPE_DOUBLE)
        << f->type_name();
    if (f->is_repeated() && f->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      EXPECT_TRUE(f->is_packed());  // the decoder takes both forms; writers pack
    }
    ++listed;
  }
  // And every field of every message in graph.proto is listed: a new field
  // must be taught to the direct decoder, which would refuse it as unknown.
  int fields = 0;
  for (int i = 0; i < file->message_type_count(); ++i) {
    const pb::Descriptor* m = file->message_type(i);
    EXPECT_EQ(m->nested_type_count(), 0) << m->full_name();
    for (int k = 0; k < m->field_count(); ++k) {
      ++fields;
      const bool found = std::any_of(
          std::begin(wire::kFields), std::end(wire::kFields), [&](const wire::FieldSpec& s) {
            return s.message == m->full_name() && s.field == m->field(k)->name();
          });
      EXPECT_TRUE(found) << m->field(k)->full_name() << " is missing from wire::kFields";
    }
  }
  EXPECT_EQ(listed, fields);
}

TEST(WireDecoderTest, GoldenAndSyntheticGraphsDecodeIdentically) {
  Tally t;
  for (const std::string& bytes : GoldenEncodings()) Compare(bytes, "golden", &t);
  const std::string synthetic = ValueOrDie(bench::BuildSyntheticGraphBytes(20'000));
  Compare(synthetic, "synthetic 20k", &t);
  EXPECT_EQ(t.accepted, static_cast<int>(std::size(::fxdp::testing::kGoldenGraphs)) + 1);
  EXPECT_EQ(t.failures, 0);
  // And the result re-encodes to the same bytes.
  EXPECT_EQ(EncodeGraphBytes(ValueOrDie(DecodeGraphBytes(synthetic))), synthetic);
}

TEST(WireDecoderTest, NodeSourceSurvivesBothDecoders) {
  const Graph g = ValueOrDie(ParseGraphText(
      "graph format=1 producer=\"test\" torch=\"2.13.0\" {\n"
      "  %x: f32[2] = placeholder() {role=INPUT, state=\"x\", batch_dim=0}\n"
      "  %y: f32[2] = aten::relu(%x) {source=\"train.py:3 in model.act: y = self.act(x)\"}\n"
      "  %output = output([%y]) {specs=[OTHER]}\n"
      "}\n"));
  const std::string bytes = EncodeGraphBytes(g);
  const Graph a = ValueOrDie(DecodeGraphBytes(bytes));
  const Graph b = ValueOrDie(DecodeGraphBytesViaMessage(bytes));
  EXPECT_EQ(a.node(NodeId{1}).source, "train.py:3 in model.act: y = self.act(x)");
  EXPECT_TRUE(a == g);
  EXPECT_TRUE(b == g);
}

TEST(WireDecoderTest, AgreesOnMutatedEncodings) {
  std::vector<std::pair<std::string, std::string>> seeds;  // name, bytes
  for (const char* name : ::fxdp::testing::kGoldenGraphs)
    seeds.emplace_back(name, EncodeGraphBytes(ValueOrDie(ParseGraphText(ReadTestData(name)))));
  bench::TransformerShape zoo = bench::TransformerShape::Zoo();
  seeds.emplace_back("synthetic 1 layer",
                     EncodeGraphBytes(ValueOrDie(bench::BuildTransformerStep(zoo, 1))));
  Mutator mu(20261121);
  Tally tree, bytes;
  constexpr int kTreeCases = 1500, kByteCases = 1000;
  for (const auto& [name, encoded] : seeds) {
    const int scale = name.rfind("synthetic", 0) == 0 ? 6 : 1;  // fewer of the larger graph
    for (int i = 0; i < kTreeCases / scale; ++i) {
      std::shared_ptr<WMsg> root = Parse(encoded, v1::GraphDef::descriptor());
      std::string what = name;
      for (size_t k = 1 + mu.Below(3); k > 0; --k)
        absl::StrAppend(&what, "; ", mu.MutateTree(root.get()));
      Writer w{&mu.rng(), mu.OneIn(4) ? 0.3 : 0.0};
      const std::string b = w.Write(*root);
      Compare(b, what, &tree);
      if (mu.OneIn(4)) {  // and some with byte damage on top
        std::string d = b;
        Compare(d, what + "; " + mu.MutateBytes(&d), &bytes);
      }
    }
    for (int i = 0; i < kByteCases / scale; ++i) {
      std::string b = encoded;
      std::string what = name;
      for (size_t k = 1 + mu.Below(2); k > 0; --k) absl::StrAppend(&what, "; ", mu.MutateBytes(&b));
      Compare(b, what, &bytes);
    }
  }
  std::printf(
      "structural mutations: %d cases, %d accepted, %d refused by the verifier, %d refused\n",
      tree.cases, tree.accepted, tree.verifier_refused, tree.refused);
  std::printf("byte mutations: %d cases, %d accepted, %d refused by the verifier, %d refused\n",
              bytes.cases, bytes.accepted, bytes.verifier_refused, bytes.refused);
  EXPECT_EQ(tree.failures + bytes.failures, 0);
  // The mutations reach all three outcomes.
  EXPECT_GT(tree.accepted, tree.cases / 10);
  EXPECT_GT(tree.verifier_refused, 0);
  EXPECT_GT(tree.refused, tree.cases / 10);
  EXPECT_GT(bytes.refused, 0);
}

// ---- Nothing crashes: random bytes and random field streams.

TEST(WireDecoderTest, RandomInputsNeverCrash) {
  std::mt19937_64 rng(7);
  Tally t;
  for (int i = 0; i < 1500; ++i) {
    std::string b;
    const size_t n = rng() % 64;
    for (size_t k = 0; k < n; ++k) {
      // Mostly plausible tags (small field numbers, wire types 0-7).
      b.push_back(static_cast<char>(rng() % 3 == 0 ? rng() : (rng() % 13) << 3 | (rng() % 8)));
    }
    if (i % 2) b = std::string("\x08\x01", 2) + b;
    Compare(b, "random", &t);
  }
  std::printf("random inputs: %d, %d accepted\n", t.cases, t.accepted);
  EXPECT_EQ(t.failures, 0);
}

}  // namespace
}  // namespace fxdp::ir
