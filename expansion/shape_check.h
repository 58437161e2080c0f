// Shape check of an expanded per-rank graph: every node whose op or view rule
// names a shape check (op_rules.h ShapeCheck, kRowsAgree; pointwise ops by
// broadcasting) is checked against the shapes the
// rank's graph records for its inputs and outputs and against its size
// arguments. A rewrite that left a global batch size behind (a size list, a
// replicated input read next to a sharded one) is then INVALID_ARGUMENT at
// compile time, naming the rank, the node and both shapes, instead of a
// kernel failure on a worker at step 1.
//
//   FXDP_RETURN_IF_ERROR(CheckRankShapes(expansion.graph(r), r));
#ifndef FXDP_EXPANSION_SHAPE_CHECK_H_
#define FXDP_EXPANSION_SHAPE_CHECK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "analysis/ir/graph.h"

namespace fxdp {

// OK, or INVALID_ARGUMENT for the first node whose shapes disagree with its
// op's shape rule: "rank 1: node 'e' (aten::embedding_dense_backward): ...".
absl::Status CheckRankShapes(const ir::Graph& graph, int32_t rank);

}  // namespace fxdp

#endif  // FXDP_EXPANSION_SHAPE_CHECK_H_
