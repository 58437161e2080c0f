// What the batch-dim tests (batch_dim_test.cc, batch_dim_ops_test.cc) run: a
// text-form graph body analysed, with its placements and reasons by node name.
#ifndef FXDP_TESTS_ANALYSIS_BATCH_DIM_UTIL_H_
#define FXDP_TESTS_ANALYSIS_BATCH_DIM_UTIL_H_

#include <gtest/gtest.h>

#include <string>

#include "analysis/batch_dim.h"
#include "analysis/ir/text.h"
#include "tests/test_util.h"

namespace fxdp::testing {

struct Analysed {
  ir::Graph graph;
  BatchDimAnalysis a;

  // Placement string of every output of node `name`.
  std::string P(const std::string& name) const {
    auto id = graph.FindNode(name);
    EXPECT_TRUE(id.has_value()) << name;
    return id ? PlacementsString(graph, a, *id) : "?";
  }
  const ValueInfo& V(const std::string& name, int k = 0) const {
    return a.value(ir::ValueRef{*graph.FindNode(name), k});
  }
  std::string Why(const std::string& name) const {
    return DescribeDecision(graph, a, *graph.FindNode(name));
  }
};

inline std::string Wrap(const std::string& body) {
  return "graph format=1 producer=\"test\" torch=\"2.13.0+cpu\" {\n" + body + "}\n";
}

inline absl::StatusOr<Analysed> Analyze(const std::string& body, int world = 2) {
  auto g = ir::ParseGraphText(Wrap(body));
  if (!g.ok()) return g.status();
  auto a = AnalyzeBatchDims(*g, AnalyzeOptions{world});
  if (!a.ok()) return a.status();
  return Analysed{*std::move(g), *std::move(a)};
}

inline Analysed MustRun(const std::string& body, int world = 2) {
  return ValueOrDie(Analyze(body, world));
}

}  // namespace fxdp::testing

#endif  // FXDP_TESTS_ANALYSIS_BATCH_DIM_UTIL_H_
