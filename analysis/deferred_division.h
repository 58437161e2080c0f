// A loss divided by a sum over the batch whose division waits for nothing.
//
// Cross-entropy's mean over the targets that count is nll's sum divided by its total weight
// (client/python/fxdp/decompositions.py), a count each rank has only its part of: the analysis
// all-reduces it (a Reduction without grad_of). The backward's seed is ones_like(loss) / weight,
// so on N ranks the backward would wait for that all-reduce. Every gradient is linear in the
// seed (the op table's linearity, followed from it), so the backward may start from 1 and each
// all-reduced gradient bucket be divided by the all-reduced weight: nothing waits before the
// backward. FindDeferredDivision proves that or says why not (a second loss term, the loss read
// by more than the output, a seed that reaches a value nonlinearly, micro-batches); the
// expansion (expansion/rank_expander.cc) rewrites the rank graphs by it.
#ifndef FXDP_ANALYSIS_DEFERRED_DIVISION_H_
#define FXDP_ANALYSIS_DEFERRED_DIVISION_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "analysis/batch_dim.h"
#include "analysis/ir/graph.h"
#include "analysis/op_rules.h"

namespace fxdp {

struct DeferredDivision {
  ir::ValueRef divisor;  // a partial scalar, all-reduced (a Reduction without grad_of).
  ir::NodeId seed;       // div(ones, divisor): its readers read `ones`.
  ir::ValueRef ones;     // ones_like(loss) (`ones_like`), which reads `total` instead.
  ir::NodeId ones_like;
  ir::NodeId loss;     // div(total, divisor): the LOSS output; the rank's local loss.
  ir::ValueRef total;  // a per-rank partial sum, of the loss's type.
  // (node, argument) reading the divisor as nll backward's total_weight under the sum reduction
  // (which reads it for nothing but its type): they read the local divisor.
  std::vector<std::pair<ir::NodeId, int>> local_reads;
};

// The deferral, or nullopt. `note` (when the graph has a loss divided by such a sum) says which
// and, when the backward waits, why.
std::optional<DeferredDivision> FindDeferredDivision(const ir::Graph& g, const BatchDimAnalysis& a,
                                                     std::string* note);

// The rule's linearity for node `n`: masked_fill(x, mask, 0) and constant_pad_nd(x, pad, 0)
// (kZeroIsLinear) are linear in x.
LinearIn LinearOf(const ir::Node& n, const OpRule& rule);
// 0 or 0.0 (an int, float or Scalar argument).
bool IsZeroNumber(const ir::Argument& a);
// Whether an argument the op is additive in is a number other than 0 (x + 1.0): it is added on
// every rank, so a partial value next to it is not partial in the result.
bool AddsNumber(const ir::Node& n, const LinearIn& linear);

}  // namespace fxdp

#endif  // FXDP_ANALYSIS_DEFERRED_DIVISION_H_
