// The LibTorch interpreter (executor/interpreter.h): results against plain
// LibTorch ops, argument binding and its errors, value lifetimes, host overhead.
// Its collectives: interpreter_collectives_test.cc; StepRunner: step_runner_test.cc.
#include "executor/interpreter.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "analysis/ir/text.h"
#include "tests/executor/interpreter_test_util.h"
#include "tests/test_util.h"

namespace fxdp::executor {
namespace {

using ::fxdp::testing::ReadTestData;
using ::fxdp::testing::StatusIs;
using ::fxdp::testing::ValueOrDie;

// ---- results -------------------------------------------------------------------------

TEST(InterpreterTest, MlpSgdMatchesPlainLibTorch) {
  const ir::Graph g = ValueOrDie(ir::ParseGraphText(ReadTestData("mlp_sgd.txt")));
  Program p = LoadCpu(g);
  ASSERT_EQ(p.inputs().size(), 4u);
  EXPECT_EQ(p.inputs()[2].role, ir::PlaceholderRole::kInput);
  EXPECT_EQ(p.inputs()[2].state_name, "input.0");
  EXPECT_EQ(p.inputs()[2].batch_dim, 0);
  at::manual_seed(0);
  const at::Tensor w = at::randn({3, 4}), b = at::randn({3}), x = at::randn({8, 4}),
                   y = at::randn({8, 3});
  const at::Tensor w_before = w.clone();
  auto out = ValueOrDie(p.Run(Values({w, b, x, y})));
  ASSERT_EQ(out.size(), 3u);

  const at::Tensor sub = at::addmm(b, x, w.t()) - y;
  const at::Tensor loss = sub.pow(2).mean();
  const at::Tensor d = sub * 2.0 / 24.0;
  const at::Tensor new_w = w - 0.1 * d.t().mm(x);
  const at::Tensor new_b = b - 0.1 * d.sum(0);
  ExpectClose(out[0].toTensor(), new_w, "new_w");
  ExpectClose(out[1].toTensor(), new_b, "new_b");
  ExpectClose(out[2].toTensor(), loss, "loss");
  EXPECT_EQ(p.live_values(), 0);
  // The inputs are untouched (the graph is functional).
  EXPECT_TRUE(at::equal(w, w_before));

  // A second run on the same program gives the same result.
  auto again = ValueOrDie(p.Run(Values({w, b, x, y})));
  EXPECT_TRUE(at::equal(again[0].toTensor(), out[0].toTensor()));
}

TEST(InterpreterTest, MultiOutputOpsAreTakenApartByGetitem) {
  const ir::Graph g = ValueOrDie(ir::ParseGraphText(ReadTestData("batchnorm_getitem.txt")));
  Program p = LoadCpu(g);
  at::manual_seed(1);
  const at::Tensor x = at::randn({6, 2, 5, 5}), w = at::rand({2}) + 0.5, b = at::randn({2}),
                   rm = at::zeros({2}), rv = at::ones({2}), nb = at::zeros({}, at::kLong);
  auto out = ValueOrDie(p.Run(Values({x, w, b, rm, rv, nb})));
  ASSERT_EQ(out.size(), 7u);
  // new running mean = 0.9 * rm + 0.1 * batch mean; num_batches + 1 stays int64.
  ExpectClose(out[2].toTensor(), 0.1 * x.mean({0, 2, 3}), "running_mean");
  ExpectClose(out[4].toTensor(), at::ones({}, at::kLong), "num_batches_tracked");
  // sum(y) of a normalised batch is sum(bias) * count.
  ExpectClose(out[5].toTensor(), b.sum() * 150, "loss");
}

TEST(InterpreterTest, ListsWrappedNumbersAndTensorListReturns) {
  const ir::Graph g = Parse(R"(
  %a: f32[2, 3] = placeholder() {role=INPUT, state="a", batch_dim=0}
  %i: i64[2] = placeholder() {role=INPUT, state="i", batch_dim=-1}
  %n: i64[] = placeholder() {role=BUFFER, state="n"}
  %cat: f32[4, 3] = aten::cat([%a, %a], 0)
  %idx: f32[4, 2] = aten::index.Tensor(%cat, [None, %i])
  %parts: (f32[2, 2], f32[2, 2]) = aten::split.Tensor(%idx, 2)
  %p0: f32[2, 2] = operator.getitem(%parts#0, 0)
  %p1: f32[2, 2] = operator.getitem(%parts#1, 1)
  %sum: f32[2, 2] = aten::add.Tensor(%p0, %p1, alpha=scalar(2))
  %half: f32[2, 2] = aten::mul.Tensor(%sum, 0.5)
  %n1: i64[] = aten::add.Tensor(%n, 1)
  %fe: (f32[2, 2], f32[2, 2]) = aten::_foreach_add.Scalar([%p0, %p1], 1.0)
  %pad: f32[4, 4] = aten::constant_pad_nd(%half, [1, 1, 1, 1], 0.0)
  %rows: f32[4] = aten::sum.dim_IntList(%pad, 1)
  %ones: f32[2] = aten::ones([2], dtype=torch.float32, layout=torch.strided, device=device(cpu), pin_memory=false)
  %output = output([%half, %n1, %fe#1, %rows, %ones]) {specs=[OTHER, UPDATED_BUFFER "n", OTHER, OTHER, OTHER]}
)");
  Program p = LoadCpu(g, {});
  const at::Tensor a = at::arange(6, at::kFloat).reshape({2, 3});
  const at::Tensor i = at::tensor({2, 0}, at::kLong);
  const at::Tensor n = at::full({}, 4, at::kLong);
  auto out = ValueOrDie(p.Run({a, i, n}));
  const at::Tensor idx = at::cat({a, a}, 0).index_select(1, i);
  const at::Tensor half = (idx.slice(0, 0, 2) + 2 * idx.slice(0, 2, 4)) * 0.5;
  ExpectClose(out[0].toTensor(), half, "half");
  ExpectClose(out[1].toTensor(), at::full({}, 5, at::kLong), "n + 1 stays int64");
  ExpectClose(out[2].toTensor(), idx.slice(0, 2, 4) + 1, "foreach element 1");
  ExpectClose(out[3].toTensor(), at::constant_pad_nd(half, {1, 1, 1, 1}).sum(1),
              "int[1]? from a bare int");
  ExpectClose(out[4].toTensor(), at::ones({2}), "factory");
}

TEST(InterpreterTest, DeviceArgumentsNameTheWorkersDevice) {
  // Traced on `meta` (a model built there, placeholders @meta) with factory ops
  // recorded on meta, cpu and the user's cuda:1: run on a CPU worker, every
  // factory op makes real CPU tensors (issue 27).
  const ir::Graph g = Parse(R"(
  %x: f32[2]@meta = placeholder() {role=INPUT, state="x", batch_dim=0}
  %a: f32[2]@meta = aten::ones([2], dtype=torch.float32, layout=torch.strided, device=device(meta), pin_memory=false)
  %b: f32[2] = aten::full([2], 2.0, dtype=torch.float32, layout=torch.strided, device=device(cpu), pin_memory=false)
  %c: f32[2]@cuda:1 = aten::ones([2], dtype=torch.float32, layout=torch.strided, device=device(cuda:1), pin_memory=false)
  %ab: f32[2]@meta = aten::add.Tensor(%a, %b)
  %abc: f32[2]@meta = aten::add.Tensor(%ab, %c)
  %y: f32[2]@meta = aten::mul.Tensor(%abc, %x)
  %output = output([%y]) {specs=[OTHER]}
)");
  Program p = LoadCpu(g, {});
  auto out = ValueOrDie(p.Run({at::full({2}, 3.0)}));
  EXPECT_TRUE(out[0].toTensor().device().is_cpu()) << out[0].toTensor().device();
  ExpectClose(out[0].toTensor(), at::full({2}, 12.0), "(1 + 2 + 1) * 3 on the CPU");
}

TEST(InterpreterTest, EveryGoldenGraphLoads) {
  // foreach_adam_like.txt has every argument kind (complex scalars, inf/nan,
  // strings, dtypes, devices, layouts, memory formats, Tensor[] lists).
  for (const char* name : ::fxdp::testing::kGoldenGraphs) {
    const ir::Graph g = ValueOrDie(ir::ParseGraphText(ReadTestData(name)));
    auto p = Program::Load(g, ProgramOptions{});
    EXPECT_TRUE(p.ok()) << name << ": " << p.status();
  }
}

// ---- errors --------------------------------------------------------------------------

constexpr char kInputs[] = R"(
  %x: f32[8, 4] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %w: f32[4, 3] = placeholder() {role=PARAMETER, state="w"}
)";

absl::Status LoadError(const std::string& body) {
  auto p = Program::Load(Parse(absl::StrCat(kInputs, body)), ProgramOptions{});
  return p.status();
}

TEST(InterpreterErrorsTest, UnknownOpNamesNodeAndOp) {
  EXPECT_THAT(LoadError(R"(
  %y: f32[8, 4] = aten::no_such_op(%x)
  %output = output([%y]) {specs=[OTHER]}
)"),
              StatusIs(absl::StatusCode::kNotFound,
                       "node 'y' (aten::no_such_op): operator aten::no_such_op is not known"));
  EXPECT_THAT(LoadError(R"(
  %y: f32[8, 4] = aten::add.NoSuchOverload(%x, %x)
  %output = output([%y]) {specs=[OTHER]}
)"),
              StatusIs(absl::StatusCode::kNotFound, "node 'y' (aten::add.NoSuchOverload)"));
  EXPECT_THAT(LoadError(R"(
  %y: f32[8, 4] = _c10d_functional::broadcast(%x, 0, "0")
  %output = output([%y]) {specs=[OTHER]}
)"),
              StatusIs(absl::StatusCode::kUnimplemented, "node 'y' (_c10d_functional::broadcast)"));
}

// A graph from a newer torch loaded by an older LibTorch: every missing op
// is named at once, with its nodes and the overloads this LibTorch has.
TEST(InterpreterErrorsTest, EveryUnknownOpIsNamedBeforeRunning) {
  const absl::Status s = LoadError(R"(
  %a: f32[8, 4] = aten::no_such_op(%x)
  %b: f32[8, 4] = aten::add.NoSuchOverload(%a, %x)
  %c: f32[8, 4] = aten::no_such_op(%b)
  %output = output([%c]) {specs=[OTHER]}
)");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound, "2 operators of the graph (traced with"));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound,
                          "node 'b' (aten::add.NoSuchOverload): operator aten::add.NoSuchOverload "
                          "is not known to this LibTorch"));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound, "which has the overloads "));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound, ", Tensor,"));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound,
                          "node 'a' (aten::no_such_op): operator aten::no_such_op is not known to "
                          "this LibTorch"));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound,
                          "(and 1 more node), nor any overload of aten::no_such_op"));
}

TEST(InterpreterErrorsTest, ArgumentsThatDoNotFitTheSchema) {
  EXPECT_THAT(LoadError(R"(
  %y: f32[8, 4] = aten::add.Tensor(%x, %x, alpha="two")
  %output = output([%y]) {specs=[OTHER]}
)"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "node 'y' (aten::add.Tensor): argument 'alpha' expects Scalar, got string "
                       "\"two\""));
  EXPECT_THAT(LoadError(R"(
  %y: f32[8, 3] = aten::mm(%x)
  %output = output([%y]) {specs=[OTHER]}
)"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "node 'y' (aten::mm): required argument 'mat2' (Tensor) is missing"));
  EXPECT_THAT(LoadError(R"(
  %y: f32[8, 3] = aten::mm(%x, "w")
  %output = output([%y]) {specs=[OTHER]}
)"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "argument 'mat2' expects Tensor, got string \"w\""));
  EXPECT_THAT(LoadError(R"(
  %y: f32[8] = aten::sum.dim_IntList(%x, [1.5], false)
  %output = output([%y]) {specs=[OTHER]}
)"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "node 'y' (aten::sum.dim_IntList): argument 'dim' element 0 expects int, "
                       "got float 1.5"));
  EXPECT_THAT(LoadError(R"(
  %y: f32[8, 4] = aten::view(%x, %w)
  %output = output([%y]) {specs=[OTHER]}
)"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "argument 'size' expects SymInt[], got a reference to %w (f32[4, 3])"));
  EXPECT_THAT(LoadError(R"(
  %y: f32[8, 3] = aten::mm(%x, %w, bogus=1)
  %output = output([%y]) {specs=[OTHER]}
)"),
              StatusIs(absl::StatusCode::kInvalidArgument, "has no argument named 'bogus'"));
  EXPECT_THAT(LoadError(R"(
  %y: f32[8, 3] = aten::mm(%x, %w, mat2=%w)
  %output = output([%y]) {specs=[OTHER]}
)"),
              StatusIs(absl::StatusCode::kInvalidArgument, "argument 'mat2' given twice"));
  EXPECT_THAT(
      LoadError(R"(
  %y: f32[8, 3] = aten::mm(%x, %w, %w)
  %output = output([%y]) {specs=[OTHER]}
)"),
      StatusIs(absl::StatusCode::kInvalidArgument, "takes at most 2 positional arguments, got 3"));
  EXPECT_THAT(LoadError(R"(
  %y: (f32[8, 3], f32[8, 3]) = aten::mm(%x, %w)
  %output = output([%y#0]) {specs=[OTHER]}
)"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "the op returns one value, the graph declares 2"));
}

TEST(InterpreterErrorsTest, KernelErrorsNameNodeAndOp) {
  Program p = LoadCpu(Parse(absl::StrCat(kInputs, R"(
  %y: f32[8, 3] = aten::mm(%x, %x)
  %output = output([%y]) {specs=[OTHER]}
)")));
  auto r = p.Run(Values({at::ones({8, 4}), at::ones({4, 3})}));
  EXPECT_THAT(r.status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                   "node 'y' (aten::mm): kernel failed: mat1 and mat2 shapes "
                                   "cannot be multiplied (8x4 and 8x4)"));
  EXPECT_EQ(std::string(r.status().message()).find("Exception raised from"), std::string::npos);
  EXPECT_EQ(p.live_values(), 0);  // everything released after the failure
}

// A run-time error on a worker quotes the user's line that produced the node (Node::source), as
// compile-time errors do.
TEST(InterpreterErrorsTest, KernelErrorsQuoteTheUsersLine) {
  Program p = LoadCpu(Parse(absl::StrCat(kInputs, R"(
  %y: f32[8, 3] = aten::mm(%x, %x) {source="train.py:42 in model.fc: h = x @ x"}
  %output = output([%y]) {specs=[OTHER]}
)")));
  EXPECT_THAT(p.Run(Values({at::ones({8, 4}), at::ones({4, 3})})).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "node 'y' (aten::mm) [train.py:42 in model.fc: h = x @ x]: kernel failed: "
                       "mat1 and mat2 shapes cannot be multiplied (8x4 and 8x4)"));
}

TEST(InterpreterErrorsTest, InputsAreCheckedAgainstThePlaceholders) {
  Program p = LoadCpu(Parse(absl::StrCat(kInputs, R"(
  %y: f32[8, 3] = aten::mm(%x, %w)
  %output = output([%y]) {specs=[OTHER]}
)")));
  EXPECT_THAT(p.Run(Values({at::ones({8, 4})})).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "the graph takes 2 inputs, got 1"));
  EXPECT_THAT(p.Run(Values({at::ones({8, 4}), at::ones({4, 3}, at::kDouble)})).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "placeholder 'w' (PARAMETER 'w'): expected f32[4, 3], got f64[4, 3]"));
}

TEST(InterpreterErrorsTest, CheckOutputsComparesWithTheGraphsTypes) {
  const ir::Graph g = Parse(absl::StrCat(kInputs, R"(
  %y: f32[8, 4] = aten::mm(%x, %w)
  %output = output([%y]) {specs=[OTHER]}
)"));
  ProgramOptions o;
  EXPECT_TRUE(LoadCpu(g, o).Run(Values({at::ones({8, 4}), at::ones({4, 3})})).ok());
  o.check_outputs = true;
  EXPECT_THAT(LoadCpu(g, o).Run(Values({at::ones({8, 4}), at::ones({4, 3})})).status(),
              StatusIs(absl::StatusCode::kInternal,
                       "node 'y' (aten::mm): output 0 is f32[8, 3], the graph says f32[8, 4]"));
}

TEST(InterpreterErrorsTest, CudaWithoutCuda) {
  if (at::hasCUDA()) GTEST_SKIP() << "this machine has CUDA";
  const ir::Graph g = ValueOrDie(ir::ParseGraphText(ReadTestData("mlp_sgd.txt")));
  EXPECT_THAT(Program::Load(g, c10::Device("cuda:0")).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "no usable CUDA"));
}

// ---- lifetimes -----------------------------------------------------------------------

TEST(InterpreterLifetimeTest, ValuesAreFreedAfterTheirLastUse) {
  const ir::Graph g = ValueOrDie(ir::ParseGraphText(ReadTestData("mlp_sgd.txt")));
  ProgramOptions o;
  o.record_live = true;
  Program p = LoadCpu(g, o);
  const auto inputs =
      Values({at::randn({3, 4}), at::randn({3}), at::randn({8, 4}), at::randn({8, 3})});
  ValueOrDie(p.Run(inputs));

  // The expected count, independently: after call node i, a value is live when
  // it was produced at or before i and read after i (or returned).
  const ir::UseMap uses = ir::ComputeUses(g);
  const int32_t out_node = g.size() - 1;
  std::vector<std::pair<std::string, int64_t>> want;
  for (int32_t i = 0; i < g.size(); ++i) {
    if (!g.nodes()[i].is_call()) continue;
    int64_t live = 0;
    for (int32_t v = 0; v <= i; ++v) {
      int32_t last = -1;
      for (const ir::Use& u : uses[v][0]) last = std::max(last, u.user.value);
      live += last > i || last == out_node;
    }
    want.emplace_back(g.nodes()[i].name, live);
  }
  EXPECT_EQ(p.live_trace(), want);
  int64_t peak = 0;
  for (const auto& [name, n] : p.live_trace()) peak = std::max(peak, n);
  EXPECT_LE(peak, 8);  // of 19 values
  EXPECT_EQ(p.live_values(), 0);
}

TEST(InterpreterLifetimeTest, ALongChainHoldsAFewValues) {
  std::string body = "  %x: f32[1000] = placeholder() {role=INPUT, state=\"x\", batch_dim=0}\n";
  std::string prev = "x";
  for (int i = 0; i < 50; ++i) {
    absl::StrAppend(&body, "  %v", i, ": f32[1000] = aten::mul.Tensor(%", prev, ", 1.0)\n");
    prev = absl::StrCat("v", i);
  }
  absl::StrAppend(&body, "  %output = output([%", prev, "]) {specs=[OTHER]}\n");
  ProgramOptions o;
  o.record_live = true;
  Program p = LoadCpu(Parse(body), o);
  at::Tensor x = at::ones({1000});
  c10::weak_intrusive_ptr<c10::StorageImpl> weak(x.storage().getWeakStorageImpl());
  std::vector<c10::IValue> in;
  in.emplace_back(std::move(x));
  auto out = ValueOrDie(p.Run(std::move(in)));
  for (const auto& [name, n] : p.live_trace()) EXPECT_EQ(n, 1) << name;
  // The input moved in dies at its only use, so the chain runs in place in
  // its buffer (mul_): the output is that buffer.
  ASSERT_FALSE(weak.expired());
  EXPECT_EQ(out[0].toTensor().storage().unsafeGetStorageImpl(), weak.lock().get());
  EXPECT_TRUE(at::equal(out[0].toTensor(), at::ones({1000})));
}

// A pointwise op whose `self` dies at that node and is not shared writes its
// result into self's buffer (its in-place variant); anything else gets a new
// tensor, and the values are the same either way.
TEST(InterpreterLifetimeTest, DyingInputsAreReusedInPlace) {
  const ir::Graph g = Parse(R"(
  %x: f32[3, 4] = placeholder() {role=INPUT, state="x", batch_dim=0}
  %m: f32[3, 4] = placeholder() {role=INPUT, state="m", batch_dim=0}
  %b: f32[4] = placeholder() {role=INPUT, state="b", batch_dim=-1}
  %i: i64[3, 4] = placeholder() {role=INPUT, state="i", batch_dim=0}
  %a: f32[3, 4] = aten::mul.Tensor(%x, 2.0)
  %c: f32[3, 4] = aten::add.Tensor(%a, %b)
  %t: f32[4, 3]{1, 4} = aten::t(%c)
  %s: f32[4, 3]{1, 4} = aten::sqrt(%t)
  %k: f32[3, 4] = aten::mul.Tensor(%x, 3.0)
  %bb: f32[3, 4] = aten::add.Tensor(%b, %k)
  %f: f32[3, 4] = aten::add.Tensor(%i, 0.5)
  %l: f32[3, 4] = aten::lerp.Scalar(%f, %x, 0.25)
  %n: f32[3, 4] = aten::neg(%m)
  %q: f32[3, 4] = aten::addcmul(%n, %k, %k, value=0.5)
  %output = output([%s, %bb, %l, %q, %k]) {specs=[OTHER, OTHER, OTHER, OTHER, OTHER]}
)");
  at::manual_seed(0);
  const at::Tensor x = at::rand({3, 4}), b = at::rand({4}), i = at::randint(0, 9, {3, 4});
  const at::Tensor x_before = x.clone(), b_before = b.clone();
  at::Tensor m = at::rand({3, 4});
  const at::Tensor m_before = m.clone();
  c10::weak_intrusive_ptr<c10::StorageImpl> weak(m.storage().getWeakStorageImpl());
  Program p = LoadCpu(g);
  std::vector<c10::IValue> in = Values({x});
  in.emplace_back(std::move(m));
  in.emplace_back(b);
  in.emplace_back(i);
  auto out = ValueOrDie(p.Run(std::move(in)));
  ASSERT_EQ(out.size(), 5u);
  // Values held by the caller are never written to.
  EXPECT_TRUE(at::equal(x, x_before));
  EXPECT_TRUE(at::equal(b, b_before));
  // neg ran in m's buffer (m died there), addcmul in neg's result.
  ASSERT_FALSE(weak.expired());
  EXPECT_EQ(out[3].toTensor().storage().unsafeGetStorageImpl(), weak.lock().get());
  // Not in place, with the functional op's result: a transposed self (s), a
  // self broadcast to the result's shape (bb), a dtype change (f).
  const at::Tensor k = x_before * 3.0;
  ExpectClose(out[0].toTensor(), at::sqrt((x_before * 2.0 + b_before).t()), "s");
  EXPECT_EQ(out[0].toTensor().strides(), (c10::IntArrayRef{1, 4}));
  ExpectClose(out[1].toTensor(), b_before + k, "bb");
  ExpectClose(out[2].toTensor(), at::lerp(i + 0.5, x_before, 0.25), "l");
  ExpectClose(out[3].toTensor(), at::addcmul(-m_before, k, k, 0.5), "q");
  ExpectClose(out[4].toTensor(), k, "k");
  EXPECT_EQ(p.live_values(), 0);
}

// Host overhead per node: a chain of tiny ops (printed, not asserted).
TEST(InterpreterOverheadTest, MicrosecondsPerTinyOp) {
  std::string body = "  %x: f32[1] = placeholder() {role=INPUT, state=\"x\", batch_dim=0}\n";
  std::string prev = "x";
  constexpr int kOps = 2000;
  for (int i = 0; i < kOps; ++i) {
    absl::StrAppend(&body, "  %v", i, ": f32[1] = aten::add.Tensor(%", prev, ", %x)\n");
    prev = absl::StrCat("v", i);
  }
  absl::StrAppend(&body, "  %output = output([%", prev, "]) {specs=[OTHER]}\n");
  Program p = LoadCpu(Parse(body));
  const at::Tensor x = at::ones({1});
  ValueOrDie(p.Run(Values({x})));  // warm up
  double best = 1e9, eager = 1e9;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    auto out = ValueOrDie(p.Run(Values({x})));
    best = std::min(
        best,
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
            kOps);
    ASSERT_EQ(out[0].toTensor().item<float>(), kOps + 1);
    c10::InferenceMode guard;
    t0 = std::chrono::steady_clock::now();
    at::Tensor v = x;
    for (int i = 0; i < kOps; ++i) v = at::add(v, x);
    eager = std::min(
        eager,
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
            kOps);
  }
  std::printf("interpreter: %.2f us per tiny op; direct at::add in C++: %.2f us\n", best, eager);
}

}  // namespace
}  // namespace fxdp::executor
