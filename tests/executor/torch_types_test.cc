// The IR <-> LibTorch boundary: dtype tables, dispatcher lookup of every op
// the golden graphs use, and a real 2-rank Gloo allreduce through c10d.
#include "executor/torch_types.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <thread>

#include "analysis/ir/text.h"
#include "executor/gloo/gloo_backend.h"
#include "tests/executor/local_rendezvous.h"
#include "tests/test_util.h"

namespace fxdp::executor {
namespace {

using ::fxdp::testing::LocalRendezvous;
using ::fxdp::testing::ReadTestData;
using ::fxdp::testing::StatusIs;
using ::fxdp::testing::ValueOrDie;

TEST(TorchTypesTest, EveryDTypeMapsToADistinctScalarTypeOfTheSameSize) {
  std::set<c10::ScalarType> seen;
  for (int i = 0; i <= static_cast<int>(ir::DType::kUInt64); ++i) {
    const auto d = static_cast<ir::DType>(i);
    const c10::ScalarType t = ToTorch(d);
    EXPECT_TRUE(seen.insert(t).second) << ir::DTypeShortName(d);
    EXPECT_EQ(c10::elementSize(t), static_cast<size_t>(ir::DTypeItemSize(d)))
        << ir::DTypeShortName(d);
    EXPECT_EQ(ValueOrDie(FromTorch(t)), d);
    // The torch name of the IR matches torch's own spelling.
    EXPECT_EQ(std::string(ir::DTypeTorchName(d)),
              "torch." + std::string(c10::getDtypeNames(t).first));
  }
  EXPECT_FALSE(FromTorch(c10::ScalarType::QInt8).ok());
}

TEST(TorchTypesTest, DevicesLayoutsAndFormats) {
  EXPECT_EQ(ToTorch(ir::Device{ir::DeviceType::kCuda, 2}), c10::Device("cuda:2"));
  EXPECT_EQ(ToTorch(ir::Device{}), c10::Device("cpu"));
  EXPECT_EQ(ToTorch(ir::Layout::kStrided), c10::kStrided);
  EXPECT_EQ(ToTorch(ir::MemoryFormat::kChannelsLast), c10::MemoryFormat::ChannelsLast);
}

TEST(TorchTypesTest, EveryOpInTheGoldenGraphsIsKnownToTheDispatcher) {
  int resolved = 0;
  for (const char* name : ::fxdp::testing::kGoldenGraphs) {
    const ir::Graph g = ValueOrDie(ir::ParseGraphText(ReadTestData(name)));
    for (const ir::Node& n : g.nodes()) {
      if (!n.is_call() || n.is_getitem()) continue;
      auto op = FindOperator(n.target);
      ASSERT_TRUE(op.ok()) << name << ": " << op.status();
      const auto& schema = op->schema();
      EXPECT_GE(schema.arguments().size(), n.args.size()) << schema;
      for (const ir::KeywordArgument& kw : n.kwargs)
        EXPECT_TRUE(schema.argumentIndexWithName(kw.name).has_value()) << schema << " " << kw.name;
      EXPECT_EQ(
          schema.returns().size() == 1 && !schema.returns()[0].type()->castRaw<c10::ListType>(),
          n.outputs.size() == 1)
          << schema;
      ++resolved;
    }
  }
  EXPECT_GE(resolved, 35);  // every call in the three goldens
  EXPECT_THAT(FindOperator({"aten::no_such_op", ""}).status(),
              StatusIs(absl::StatusCode::kNotFound, "operator aten::no_such_op is not known"));
  EXPECT_THAT(FindOperator({"aten::add", "NoSuchOverload"}).status(),
              StatusIs(absl::StatusCode::kNotFound, "aten::add.NoSuchOverload"));
}

TEST(GlooBackendTest, TwoRanksAllReduceThroughC10d) {
  const LocalRendezvous rv(2, std::chrono::milliseconds(10000));

  at::Tensor results[2];
  auto run = [&](const RendezvousOptions& o, c10::intrusive_ptr<c10d::Store> store) {
    if (!store) store = ValueOrDie(ConnectStore(o));
    auto pg = ValueOrDie(CreateGlooBackend(store, o, "127.0.0.1"));
    std::vector<at::Tensor> t{at::full({1000}, static_cast<float>(o.rank + 1))};
    pg->allreduce(t)->wait();
    results[o.rank] = t[0];
  };
  std::thread r1(run, rv.Options(1), nullptr);
  run(rv.Options(0), rv.store0);
  r1.join();
  for (const at::Tensor& t : results) EXPECT_TRUE(at::equal(t, at::full({1000}, 3.0f)));
}

TEST(GlooBackendTest, MissingPeerFailsWithinTheTimeoutNamingTheRank) {
  const LocalRendezvous rv(2, std::chrono::milliseconds(1500));  // rank 1 never comes
  const auto start = std::chrono::steady_clock::now();
  auto pg = CreateGlooBackend(rv.store0, rv.Options(0), "127.0.0.1");
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_THAT(pg.status(), StatusIs(absl::StatusCode::kUnavailable, "rank 0 of 2"));
  EXPECT_LT(elapsed, std::chrono::seconds(10));
}

}  // namespace
}  // namespace fxdp::executor
