// Where the batch lies in each random node's output, for the executor's
// rank-invariant draws (analysis/ir/random_ops.h, docs/randomness.md): the
// expansion writes it into every rank graph's metadata.
#ifndef FXDP_EXPANSION_RANDOM_LAYOUT_H_
#define FXDP_EXPANSION_RANDOM_LAYOUT_H_

#include "absl/status/status.h"
#include "analysis/batch_dim.h"
#include "analysis/ir/graph.h"

namespace fxdp {

// When a random node's output is sharded, appends kBatchSizeKey and
// kRandomLayoutKey to `header` (the same for every rank; nothing otherwise). INVALID_ARGUMENT
// naming the node for a random op whose rows a rank holds in its own order
// (after a rank-local sort: not a slice of one device's rows).
absl::Status AddRandomLayouts(const ir::Graph& g, const BatchDimAnalysis& a,
                              ir::GraphHeader& header);

}  // namespace fxdp

#endif  // FXDP_EXPANSION_RANDOM_LAYOUT_H_
