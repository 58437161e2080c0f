// One test per verifier error: each mutates a valid golden graph in exactly
// one way and checks the error names the node and says expected vs got.
#include "analysis/ir/verifier.h"

#include <gtest/gtest.h>

#include <functional>

#include "analysis/ir/proto_codec.h"
#include "analysis/ir/text.h"
#include "tests/test_util.h"

namespace fxdp::ir {
namespace {

using ::fxdp::testing::ReadTestData;
using ::fxdp::testing::StatusIs;
using ::fxdp::testing::ValueOrDie;

struct VerifyCase {
  std::string name;
  std::string golden;
  std::function<void(GraphHeader&, std::vector<Node>&)> mutate;
  std::string expected;
};

void PrintTo(const VerifyCase& c, std::ostream* os) { *os << c.name; }

class VerifierTest : public ::testing::TestWithParam<VerifyCase> {};

TEST_P(VerifierTest, RejectsWithClearMessage) {
  const Graph g = ValueOrDie(ParseGraphText(ReadTestData(GetParam().golden)));
  GraphHeader h = g.header();
  std::vector<Node> nodes = g.nodes();
  GetParam().mutate(h, nodes);
  EXPECT_THAT(VerifyGraph(h, nodes),
              StatusIs(absl::StatusCode::kInvalidArgument, GetParam().expected));
  // Graph::Create refuses the same graph.
  EXPECT_FALSE(Graph::Create(h, nodes).ok());
}

ValueRef Ref(int node, int output = 0) { return ValueRef{NodeId{node}, output}; }

// mlp_sgd.txt: 0 w, 1 b, 2 x, 3 y, 4 t, 5 addmm, 6 sub, 7 pow, 8 loss, 9 ones,
// 10 expand, 11 div, 12 mul, 13 mul_1, 14 t_1, 15 mm, 16 sum, 17 new_w,
// 18 new_b, 19 output.
// batchnorm_getitem.txt: 7 bn (5 outputs), 8..12 getitems, 15 bwd, 17 gw.
const std::string kMlp = "mlp_sgd.txt";
const std::string kBn = "batchnorm_getitem.txt";
// mlp_sgd_hyper.txt: 0 w, 1 b, 2 lr, 3 wd (HYPERPARAMETER), ..., 22 new_w, 27 output.
const std::string kHyper = "mlp_sgd_hyper.txt";

const VerifyCase kCases[] = {
    {"ForwardReference", kMlp, [](auto&, auto& n) { n[5].args[1] = Ref(6); },
     "node 'addmm' (#5): argument 1 references node 'sub' (#6), which is not defined before it"},
    {"SelfReferenceCycle", kMlp, [](auto&, auto& n) { n[6].args[0] = Ref(6); },
     "node 'sub' (#6): argument 0 references node 'sub' (#6), which is not defined before it"},
    {"UnknownNode", kMlp, [](auto&, auto& n) { n[5].args[0] = Ref(500); },
     "argument 0 references node #500, which does not exist (20 nodes)"},
    {"OutputIndexOutOfRange", kMlp, [](auto&, auto& n) { n[5].args[0] = Ref(1, 3); },
     "node 'addmm' (#5): argument 0 references output 3 of node 'b', which has 1 output(s)"},
    {"ReferenceInsideListChecked", kMlp,
     [](auto&, auto& n) { n[19].args[0] = Argument(Argument::List{Ref(17), Ref(99)}); },
     "node 'output' (#19): argument 0[1] references node #99"},
    {"ReferenceInKwargChecked", kMlp, [](auto&, auto& n) { n[17].kwargs[0].value = Ref(18); },
     "node 'new_w' (#17): keyword argument 'alpha' references node 'new_b' (#18)"},
    {"DuplicateName", kMlp, [](auto&, auto& n) { n[7].name = "sub"; },
     "node 'sub' (#7): duplicate node name (also node #6)"},
    {"EmptyName", kMlp, [](auto&, auto& n) { n[7].name = ""; }, "node #7 has no name"},
    {"EmptyTarget", kMlp, [](auto&, auto& n) { n[7].target.name = ""; },
     "node 'pow' (#7): target name is empty"},
    {"TargetIsNotASchemaName", kMlp, [](auto&, auto& n) { n[7].target.name = "torch.pow"; },
     "node 'pow' (#7): target 'torch.pow' is not a schema name"},
    {"FutureFormatVersion", kMlp, [](auto& h, auto&) { h.format_version = 3; },
     "unsupported format_version 3 (this build reads 1)"},
    {"NoOutputNode", kMlp, [](auto&, auto& n) { n.pop_back(); }, "the last node must be OUTPUT"},
    {"OutputNotLast", kMlp, [](auto&, auto& n) { std::swap(n[18], n[19]); },
     "the last node must be OUTPUT"},
    {"TwoOutputNodes", kMlp,
     [](auto&, auto& n) {
       n[18].kind = NodeKind::kOutput;
       n[18].outputs.clear();
     },
     "node 'new_b' (#18): the output node must be the last node"},
    {"CallWithoutOutputMetadata", kMlp, [](auto&, auto& n) { n[7].outputs.clear(); },
     "node 'pow' (#7): call to aten::pow.Tensor_Scalar has no output metadata"},
    {"NegativeSize", kMlp, [](auto&, auto& n) { n[6].outputs[0].tensor.shape[0] = -8; },
     "node 'sub' (#6): output 0: size of dim 0 is negative (-8)"},
    {"StrideRankMismatch", kMlp, [](auto&, auto& n) { n[6].outputs[0].tensor.stride.pop_back(); },
     "node 'sub' (#6): output 0: stride has 1 entries, expected one per dim (2)"},
    {"OverflowingShape", kMlp,
     [](auto&, auto& n) { n[6].outputs[0].tensor.shape = {int64_t{1} << 62, 4}; },
     "node 'sub' (#6): output 0: shape [4611686018427387904, 4] has more than"},
    {"PlaceholderWithArguments", kMlp,
     [](auto&, auto& n) { n[1].args.push_back(Argument(int64_t{1})); },
     "node 'b' (#1): a placeholder takes no arguments"},
    {"PlaceholderNotATensor", kMlp,
     [](auto&, auto& n) { n[1].outputs[0] = ValueType::Of(ValueKind::kInt); },
     "node 'b' (#1): a placeholder must produce exactly one tensor, got 1 output(s) of kind int"},
    {"PlaceholderWithoutStateName", kMlp, [](auto&, auto& n) { n[1].placeholder.state_name = ""; },
     "node 'b' (#1): placeholder with role PARAMETER has no state name"},
    {"DuplicateStateName", kMlp, [](auto&, auto& n) { n[1].placeholder.state_name = "fc.weight"; },
     "node 'b' (#1): state name 'fc.weight' is already used by node 'w' (#0)"},
    {"BatchDimOutOfRange", kMlp, [](auto&, auto& n) { n[2].placeholder.batch_dim = 2; },
     "node 'x' (#2): batch_dim 2 is out of range for a rank-2 input (expected -1 or 0..1)"},
    {"BatchDimOnParameter", kMlp, [](auto&, auto& n) { n[0].placeholder.batch_dim = 1; },
     "node 'w' (#0): batch_dim 1 set on a PARAMETER placeholder"},
    {"PlaceholderSpecOnCall", kMlp, [](auto&, auto& n) { n[7].placeholder.state_name = "p"; },
     "node 'pow' (#7): is a call_function but carries a placeholder spec"},
    {"OutputRolesOnCall", kMlp, [](auto&, auto& n) { n[7].output_specs.push_back({}); },
     "node 'pow' (#7): is a call_function but carries output roles"},
    {"OutputSpecCountMismatch", kMlp, [](auto&, auto& n) { n[19].output_specs.pop_back(); },
     "node 'output' (#19): has 2 output roles for 3 returned values"},
    {"OutputArgumentNotAList", kMlp, [](auto&, auto& n) { n[19].args[0] = Ref(17); },
     "the output node must take exactly one list argument"},
    {"UpdatedStateUnknown", kMlp,
     [](auto&, auto& n) { n[19].output_specs[0].state_name = "fc.wieght"; },
     "returned value 0 (UPDATED_PARAMETER 'fc.wieght'): no placeholder has that state name"},
    {"UpdatedRoleContradictsPlaceholder", kMlp,
     [](auto&, auto& n) { n[19].output_specs[0].role = OutputRole::kUpdatedBuffer; },
     "expected a placeholder of role BUFFER, but 'w' is PARAMETER"},
    {"UpdatedShapeMismatch", kMlp,
     [](auto&, auto& n) { std::swap(n[19].output_specs[0], n[19].output_specs[1]); },
     "returned value 0 (UPDATED_PARAMETER 'fc.bias'): type f32[3, 4] differs from the state it "
     "replaces (f32[3] rg)"},
    {"StateUpdatedTwice", kMlp,
     [](auto&, auto& n) {
       n[19].args[0] = Argument(Argument::List{Ref(17), Ref(17), Ref(8)});
       n[19].output_specs[1] = {OutputRole::kUpdatedParameter, "fc.weight"};
     },
     "returned value 1 (UPDATED_PARAMETER 'fc.weight'): that state is updated twice"},
    {"UpdatedValueNotATensor", kMlp,
     [](auto&, auto& n) {
       n[19].args[0] = Argument(Argument::List{Argument(int64_t{3}), Ref(18), Ref(8)});
     },
     "returned value 0 (UPDATED_PARAMETER 'fc.weight'): expected a tensor"},
    {"TwoLosses", kMlp,
     [](auto&, auto& n) {
       n[19].args[0] = Argument(Argument::List{Ref(17), Ref(8), Ref(8)});
       n[19].output_specs[1] = {OutputRole::kLoss, ""};
     },
     "returned value 2 (LOSS): a second LOSS output"},
    {"LossNotScalar", kMlp,
     [](auto&, auto& n) { n[19].args[0] = Argument(Argument::List{Ref(17), Ref(18), Ref(7)}); },
     "returned value 2 (LOSS): the loss must have one element, got f32[8, 3]"},
    {"LossWithStateName", kMlp, [](auto&, auto& n) { n[19].output_specs[2].state_name = "x"; },
     "a LOSS output has no state name"},
    {"GradOfUnknownParameter", kMlp, [](auto&, auto& n) { n[15].grad_of = "fc.w"; },
     "node 'mm' (#15): grad_of names 'fc.w', which is not a parameter"},
    {"GradOfInput", kMlp, [](auto&, auto& n) { n[15].grad_of = "input.0"; },
     "node 'mm' (#15): grad_of names 'input.0', which is not a parameter"},
    {"SecondGradient", kMlp, [](auto&, auto& n) { n[17].grad_of = "fc.weight"; },
     "node 'new_w' (#17): a second gradient for parameter 'fc.weight' (the first is node 'mm' "
     "(#15))"},
    {"GradientShapeMismatch", kMlp,
     [](auto&, auto& n) {
       n[16].grad_of = "fc.weight";
       n[15].grad_of = "";
     },
     "node 'sum' (#16): gradient of 'fc.weight' has type f32[3], expected the parameter's shape "
     "(f32[3, 4] rg)"},
    {"GradOfOnPlaceholder", kMlp, [](auto&, auto& n) { n[2].grad_of = "fc.weight"; },
     "node 'x' (#2): grad_of is set but the node does not produce a tensor"},
    {"GetItemIndexMismatch", kBn, [](auto&, auto& n) { n[9].args[1] = Argument(int64_t{2}); },
     "node 'save_mean' (#9): operator.getitem index 2 does not match the referenced output 1"},
    {"GetItemTypeMismatch", kBn, [](auto&, auto& n) { n[9].outputs[0].tensor.shape = {3}; },
     "node 'save_mean' (#9): operator.getitem output type f32[3] differs from the element it "
     "extracts (f32[2])"},
    {"GetItemBadArguments", kBn, [](auto&, auto& n) { n[9].args.pop_back(); },
     "node 'save_mean' (#9): operator.getitem expects (ref, int) arguments"},
    {"HyperparameterNotScalar", kHyper,
     [](auto&, auto& n) {
       n[2].outputs[0].tensor.shape = {1};
       n[2].outputs[0].tensor.stride = {1};
     },
     "node 'lr' (#2): HYPERPARAMETER placeholder 'optim.group0.lr' must be a 0-d tensor (one value "
     "per step), got f32[1]"},
    {"HyperparameterNotFloating", kHyper,
     [](auto&, auto& n) { n[3].outputs[0].tensor.dtype = DType::kInt64; },
     "node 'wd' (#3): HYPERPARAMETER placeholder 'optim.group0.weight_decay' must have a floating "
     "dtype, got i64[]"},
    {"HyperparameterWithoutStateName", kHyper,
     [](auto&, auto& n) { n[2].placeholder.state_name = ""; },
     "node 'lr' (#2): placeholder with role HYPERPARAMETER has no state name"},
    {"HyperparameterUpdated", kHyper,
     [](auto&, auto& n) {
       n[27].output_specs[0] = {OutputRole::kUpdatedOptimizerState, "optim.group0.lr"};
     },
     "node 'output' (#27): returned value 0 (UPDATED_OPTIMIZER_STATE 'optim.group0.lr'): 'lr' is a "
     "HYPERPARAMETER placeholder, which the step never updates"},
    {"ListsTooDeep", kMlp,
     [](auto&, auto& n) {
       Argument a(int64_t{1});
       for (int i = 0; i < 20; ++i) a = Argument(Argument::List{a});
       n[10].args[1] = a;
     },
     "node 'expand' (#10): argument 1[0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0][0]: lists "
     "nested deeper than 16"},
};

INSTANTIATE_TEST_SUITE_P(All, VerifierTest, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return info.param.name; });

TEST(VerifierTest, GoldenGraphsVerify) {
  for (const char* name : ::fxdp::testing::kGoldenGraphs) {
    const Graph g = ValueOrDie(ParseGraphText(ReadTestData(name)));
    EXPECT_TRUE(VerifyGraph(g.header(), g.nodes()).ok()) << name;
  }
}

TEST(VerifierTest, UsesAreComputedOnDemand) {
  const Graph g = ValueOrDie(ParseGraphText(ReadTestData("mlp_sgd.txt")));
  const UseMap uses = ComputeUses(g);
  // %sub feeds %pow and %mul; %x feeds %addmm and %mm (the weight gradient).
  const NodeId sub = *g.FindNode("sub");
  ASSERT_EQ(uses[sub.value][0].size(), 2u);
  EXPECT_EQ(g.node(uses[sub.value][0][0].user).name, "pow");
  EXPECT_EQ(g.node(uses[sub.value][0][1].user).name, "mul");
  const NodeId x = *g.FindNode("x");
  ASSERT_EQ(uses[x.value][0].size(), 2u);
  EXPECT_EQ(g.node(uses[x.value][0][1].user).name, "mm");
  EXPECT_EQ(uses[x.value][0][1].arg_index, 1);
  // The loss is read by ones_like and returned by the output node.
  EXPECT_EQ(uses[g.FindNode("loss")->value][0].size(), 2u);
  EXPECT_EQ(g.FindState("fc.bias")->value, 1);
  EXPECT_FALSE(g.FindState("nope").has_value());
}

}  // namespace
}  // namespace fxdp::ir
