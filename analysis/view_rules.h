// Dim maps of view-like aten ops: which input dims make each output dim.
//
// Every view op DTensor's view-op table covers (plus the composite ops that
// reach a graph before decomposition: flatten, unflatten, t, movedim, tile,
// atleast_*, ravel, broadcast_to) is one row of a sorted table in
// view_rules.cc: the schema name and overload, the rule (a torch dim_maps
// function, view_dim_maps.h) and the arguments it reads. One engine binds a
// node's arguments to the row and runs the rule.
//
//   auto map = ComputeViewDimMap(node.target, input_shape, node.args, node.kwargs);
//   // map: (In0, Fl(In1,In2)) for aten::view of f32[4, 3, 2] to [4, 6]
//   auto flow = TraceInputDim(*map, batch_dim);  // dim_spec.h
#ifndef FXDP_ANALYSIS_VIEW_RULES_H_
#define FXDP_ANALYSIS_VIEW_RULES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "analysis/dim_spec.h"
#include "analysis/ir/graph.h"

namespace fxdp {

// Whether `target` has a view rule.
bool IsViewOp(const ir::Target& target);

// The DimMap of view op `target` applied to a tensor of `input_shape`, with
// the node's arguments (args[0] is the input tensor; the others as the aten
// schema orders them, positional or keyword, defaults filled in).
// NOT_FOUND when the op has no view rule. INVALID_ARGUMENT, naming the op, the
// argument and the numbers, when the arguments do not fit the schema, when
// the aten op would reject them for this shape, or when DTensor's rule
// raises for them (see [View Rule Divergences] in view_dim_maps.h).
absl::StatusOr<DimMap> ComputeViewDimMap(const ir::Target& target,
                                         absl::Span<const int64_t> input_shape,
                                         const std::vector<ir::Argument>& args,
                                         const std::vector<ir::KeywordArgument>& kwargs);

// How FULLY_SHARD's optimizer may read a flat shard through a view
// (expansion/fully_shard.h): the rank graph reads the shard itself.
enum class ShardView : int8_t {
  kNo,        // refused on a shard.
  kFlat,      // the same elements in the same order, reshaped (view, reshape, squeeze).
  kPermuted,  // the input's dims permuted (t, transpose, permute: the row's dim map).
};

// What the expansion, its shape check and the schedule need of a view op's row.
struct ViewOpFacts {
  int sizes_arg = -1;    // the size list that spells the output's shape, or -1.
  bool expands = false;  // the sizes broadcast the input (expand); else reshape it (view).
  bool packing = false;  // cheap: may move up with the all_reduce it feeds (schedule.h).
  ShardView shard_view = ShardView::kNo;
};
std::optional<ViewOpFacts> FindViewOpFacts(const ir::Target& target);

// Every row in text form, one line each ("aten::view sizes=1:size [packing]"),
// in table order: part of tests/testdata/op_rules.txt.
std::string ViewRulesText();

// Every op with a view rule, as "aten::squeeze.dims", in table order.
std::vector<std::string> ViewOpNames();

}  // namespace fxdp

#endif  // FXDP_ANALYSIS_VIEW_RULES_H_
