// The text form: PrintGraph(ParseGraphText(s)) == s for the goldens, and
// parse errors that name line and column.
#include "analysis/ir/text.h"

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace fxdp::ir {
namespace {

using ::fxdp::testing::ReadTestData;
using ::fxdp::testing::StatusIs;
using ::fxdp::testing::ValueOrDie;

TEST(TextTest, GoldensPrintBackIdentically) {
  for (const char* name : ::fxdp::testing::kGoldenGraphs) {
    const std::string text = ReadTestData(name);
    EXPECT_EQ(PrintGraph(ValueOrDie(ParseGraphText(text))), text) << name;
  }
}

TEST(TextTest, ParsesEveryArgumentKind) {
  const Graph g = ValueOrDie(ParseGraphText(ReadTestData("foreach_adam_like.txt")));
  const Node& to_copy = g.node(*g.FindNode("f"));
  EXPECT_EQ(to_copy.target.name, "aten::_to_copy");
  EXPECT_EQ(to_copy.target.overload, "");
  EXPECT_EQ(to_copy.kwarg("dtype")->as<DType>(), DType::kFloat32);
  EXPECT_EQ(to_copy.kwarg("layout")->as<Layout>(), Layout::kStrided);
  EXPECT_EQ(to_copy.kwarg("device")->as<Device>(), (Device{DeviceType::kCpu, -1}));
  const Node& add = g.node(*g.FindNode("g0"));
  EXPECT_EQ(std::get<int64_t>(add.kwarg("alpha")->as<Scalar>().value), 2);
  const Node& lerp = g.node(*g.FindNode("lerp"));
  EXPECT_EQ(lerp.target.ToString(), "aten::_foreach_lerp.Scalar");
  EXPECT_EQ(lerp.outputs.size(), 2u);
  EXPECT_EQ(lerp.args[0].as<Argument::List>().size(), 2u);
  EXPECT_DOUBLE_EQ(lerp.args[2].as<double>(), 0.1);
  const Node& fill = g.node(*g.FindNode("odd"));
  auto c = std::get<std::complex<double>>(fill.args[1].as<Scalar>().value);
  EXPECT_EQ(c.real(), 1.5);
  EXPECT_TRUE(std::signbit(c.imag()));
  const Node& clamp = g.node(*g.FindNode("inf"));
  EXPECT_TRUE(std::isinf(clamp.args[1].as<double>()) && clamp.args[1].as<double>() < 0);
  EXPECT_EQ(g.node(*g.FindNode("str")).kwarg("rounding_mode")->as<std::string>(), "floor");
  EXPECT_TRUE(std::isnan(g.node(*g.FindNode("n")).args[2].as<double>()));
  EXPECT_TRUE(g.output_node().args[0].as<Argument::List>().back().is_none());
  EXPECT_EQ(g.node(*g.FindNode("tok")).placeholder.batch_dim, 1);
  EXPECT_EQ(g.node(*g.FindNode("mask")).placeholder.batch_dim, -1);
}

TEST(TextTest, FloatsKeepTheirKindAndValue) {
  const std::string text =
      "graph format=1 producer=\"\" torch=\"\" {\n"
      "  %x: f32[2] = placeholder() {role=INPUT, state=\"x\", batch_dim=0}\n"
      "  %y: f32[2] = aten::add.Scalar(%x, 1.0)\n"
      "  %z: f32[2] = aten::add.Scalar(%y, 1)\n"
      "  %w: f32[2] = aten::mul.Scalar(%z, 1e-08)\n"
      "  %v: f32[2] = aten::mul.Scalar(%w, 0.30000000000000004)\n"
      "  %output = output([%v]) {specs=[OTHER]}\n"
      "}\n";
  const Graph g = ValueOrDie(ParseGraphText(text));
  EXPECT_TRUE(g.node(NodeId{1}).args[1].is<double>());
  EXPECT_TRUE(g.node(NodeId{2}).args[1].is<int64_t>());
  EXPECT_EQ(g.node(NodeId{4}).args[1].as<double>(), 0.1 + 0.2);
  EXPECT_EQ(PrintGraph(g), text);
}

TEST(TextTest, NodeSourcePrintsOnlyWhenAsked) {
  const std::string text =
      "graph format=1 producer=\"test\" torch=\"\" {\n"
      "  %x: f32[2] = placeholder() {role=INPUT, state=\"x\", batch_dim=0}\n"
      "  %y: f32[2] = aten::relu(%x) {source=\"train.py:3 in model: y = \\\"a\\\"\"}\n"
      "  %output = output([%y]) {specs=[OTHER]}\n"
      "}\n";
  const Graph g = ValueOrDie(ParseGraphText(text));
  EXPECT_EQ(g.node(NodeId{1}).source, "train.py:3 in model: y = \"a\"");
  EXPECT_EQ(PrintGraph(g, /*with_source=*/true), text);
  EXPECT_EQ(PrintGraph(g).find("source="), std::string::npos);
}

TEST(TextTest, StringsAreEscaped) {
  const std::string text =
      "graph format=1 producer=\"a \\\"quoted\\\" \\n name\" torch=\"\" {\n"
      "  %x: f32[2] = placeholder() {target=\"x_in\", role=INPUT, state=\"weird\\tname\", "
      "batch_dim=0}\n"
      "  %output = output([%x]) {specs=[OTHER]}\n"
      "}\n";
  const Graph g = ValueOrDie(ParseGraphText(text));
  EXPECT_EQ(g.header().producer, "a \"quoted\" \n name");
  EXPECT_EQ(g.node(NodeId{0}).placeholder.state_name, "weird\tname");
  EXPECT_EQ(g.node(NodeId{0}).target.name, "x_in");
  EXPECT_EQ(PrintGraph(g), text);
}

struct ParseErrorCase {
  const char* name;
  const char* text;
  const char* expected;
};

class TextParseErrorTest : public ::testing::TestWithParam<ParseErrorCase> {};

TEST_P(TextParseErrorTest, NamesLineAndColumn) {
  EXPECT_THAT(ParseGraphText(GetParam().text).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, GetParam().expected));
}

const ParseErrorCase kParseErrors[] = {
    {"MissingGraphKeyword", "grph {}", "line 1, column 1: expected 'graph', got 'grph'"},
    {"UndefinedValue", "graph format=1 {\n  %y: f32[2] = aten::neg(%x)\n}",
     "line 2, column 28: '%x' is not defined before this use"},
    {"UnknownDType", "graph format=1 {\n  %x: q7[2] = placeholder()\n}",
     "line 2, column 7: unknown dtype 'q7'"},
    {"UnterminatedString", "graph producer=\"abc {}", "line 1, column 16: unterminated string"},
    // Found by tests/fuzz/text_fuzzer: it used to parse into a graph whose GraphDef no decoder
    // accepts (proto3 strings are UTF-8). Raw and escaped bytes alike.
    {"NonUtf8String", "graph format=1 {\n  meta \"optimize\xe0`\" = \"SGD\"\n}",
     "line 2, column 8: string is not valid UTF-8"},
    {"NonUtf8Escape", "graph format=1 {\n  meta \"k\" = \"\\377\"\n}",
     "line 2, column 14: string is not valid UTF-8"},
    {"UnknownAttribute", "graph format=1 {\n  %x: f32[2] = placeholder() {colour=INPUT}\n}",
     "unknown node attribute 'colour'"},
    {"UnknownArgument", "graph format=1 {\n  %x: f32[2] = aten::neg(torch.float99)\n}",
     "unknown argument 'torch.float99'"},
    {"PositionalAfterKeyword", "graph format=1 {\n  %x: f32[2] = aten::neg(a=1, 2)\n}",
     "positional argument after a keyword argument"},
    {"DuplicateDefinition",
     "graph format=1 {\n  %x: f32[2] = placeholder() {role=INPUT, state=\"a\", batch_dim=0}\n"
     "  %x: f32[2] = placeholder() {role=INPUT, state=\"b\", batch_dim=0}\n}",
     "'%x' is defined twice"},
    {"VerifierRunsAfterParsing",
     "graph format=1 {\n  %x: f32[2] = placeholder() {role=INPUT, state=\"a\", batch_dim=0}\n}",
     "graph has no output node"},
    {"TrailingText", "graph format=1 {\n} extra", "text after the closing '}'"},
    {"BadCharacter", "graph format=1 { $ }", "unexpected character '$'"},
    // The contiguous strides of this shape overflow int64 (empty dims count as 1).
    {"HugeShape", "graph format=1 {\n  %x: f32[0, 4294967296, 4294967296] = placeholder()\n}",
     "line 2, column 7: shape [0, 4294967296, 4294967296] spans more than 281474976710656 "
     "elements"},
    {"NegativeSize", "graph format=1 {\n  %x: f32[-2] = placeholder()\n}",
     "size of dim 0 is negative (-2)"},
};

INSTANTIATE_TEST_SUITE_P(All, TextParseErrorTest, ::testing::ValuesIn(kParseErrors),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace fxdp::ir
