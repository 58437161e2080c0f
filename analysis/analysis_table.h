// The analysis as the Analyze RPC answers it (v1::AnalyzeResponse), and the one
// printer of its table: `fxdp analyze` prints it locally and with --server, the
// server fills the same proto.
#ifndef FXDP_ANALYSIS_ANALYSIS_TABLE_H_
#define FXDP_ANALYSIS_ANALYSIS_TABLE_H_

#include <string>

#include "analysis/batch_dim.h"
#include "analysis/ir/graph.h"
#include "proto/fxdp/v1/compile.pb.h"

namespace fxdp {

// "sum", "avg": a reduce op as placements ("P(avg)"), tables, reports and
// v1.Reduction.op name it.
const char* ReduceOpName(ReduceOp op);

// World size, batch size, a row per node (name, target, batch dim, placement,
// reason, source), the reductions, sharded reads, warnings and notes.
// `overrides` replace the placement and reason of the nodes they name (a
// style's sharded state, AnalyzeStyle). Leaves json, memory and
// sharded_state unset.
v1::AnalyzeResponse AnalysisToProto(const ir::Graph& graph, const BatchDimAnalysis& analysis,
                                    const PlacementOverrides* overrides = nullptr);

// The table: a header line, a row per node (with `with_source`, each reason
// followed by "  <- " and the node's source line), then the reductions,
// sharded reads (if any), warnings and notes (if any). Not the memory summary
// (StateMemoryToTable).
std::string AnalysisTableText(const v1::AnalyzeResponse& response, bool with_source = false);

}  // namespace fxdp

#endif  // FXDP_ANALYSIS_ANALYSIS_TABLE_H_
