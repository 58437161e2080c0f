// What the expansion tests share: a text graph analysed and expanded, and
// lookups in the rank graphs it gives.
#ifndef FXDP_TESTS_EXPANSION_EXPAND_UTIL_H_
#define FXDP_TESTS_EXPANSION_EXPAND_UTIL_H_

#include <gtest/gtest.h>

#include <string>

#include "absl/status/statusor.h"
#include "analysis/batch_dim.h"
#include "analysis/ir/text.h"
#include "expansion/data_parallel.h"

namespace fxdp::testing {

// The graph of `text` analysed for `o.world_size` ranks (`analyze_sync`: with
// AnalyzeOptions::sync_batchnorm) and expanded with `o`.
inline absl::StatusOr<Expansion> ExpandText(const std::string& text, ExpandOptions o,
                                            bool analyze_sync = false) {
  auto g = ir::ParseGraphText(text);
  if (!g.ok()) return g.status();
  auto a = AnalyzeBatchDims(*g, AnalyzeOptions{o.world_size, analyze_sync});
  if (!a.ok()) return a.status();
  return ExpandDataParallel(*g, *a, o);
}

// The node named `name` (a test failure when there is none).
inline const ir::Node& Find(const ir::Graph& g, const std::string& name) {
  auto id = g.FindNode(name);
  EXPECT_TRUE(id.has_value()) << name;
  return g.node(*id);
}

// The position of the node named `name` (-1, and a test failure, when there is none).
inline int IndexOf(const ir::Graph& g, const std::string& name) {
  auto id = g.FindNode(name);
  EXPECT_TRUE(id.has_value()) << name;
  return id.has_value() ? id->value : -1;
}

// How many nodes call `target` (its ToString form).
inline int Count(const ir::Graph& g, const std::string& target) {
  int c = 0;
  for (const ir::Node& n : g.nodes()) c += n.target.ToString() == target;
  return c;
}

}  // namespace fxdp::testing

#endif  // FXDP_TESTS_EXPANSION_EXPAND_UTIL_H_
