// BatchDimAnalyzer: where the batch dimension lives in every value of a
// traced training step, and each value's placement on N data-parallel ranks.
//
// The batch dim is followed by provenance, never by matching sizes: it starts
// at the INPUT placeholders (PlaceholderSpec::batch_dim) and moves through
// each op by that op's rule (op_rules.h: view-op dim maps, broadcasting,
// einsum-like specs for matmuls, reductions, convolutions, norms, losses,
// indexing, factories, foreach ops). A (B, B) tensor, or a view that folds
// the batch into another dim and splits it back, is therefore analysed
// exactly. An op with no rule is refused; only when asked to guess
// (AnalyzeOptions::guess_unruled_ops, `fxdp analyze`) is it placed by size
// matching, and the result names it in `warnings`.
//
// Placements (docs/analysis.md) describe the per-rank graph that expansion builds,
// in which every shape is local (B_r rows on rank r) but scalar literals are
// kept:
//   S(d)    the rank holds its contiguous slice of the batch along dim d.
//   R       every rank holds the same, whole value.
//   P(sum)  the global value is the sum of the ranks' values.
//   P(avg)  the global value is the batch-weighted mean of the ranks' values
//           (sum of (B_r / B) * value_r; the plain mean when B % N == 0).
// P(avg) comes from ops that divide by a size the local graph computes from
// its own batch (mean over the batch, a loss or loss backward with
// reduction=mean, nll's total_weight). A sharded value downstream of such an
// op is "mean-scaled" (ValueInfo::mean_scaled): rank r holds its slice times
// B / B_r; contracting it over the batch gives P(avg).
//
// Partial values are combined linearly (add, scale, view, matmul with a
// replicated operand) and stay partial; an op that needs the whole value
// reads it after an all-reduce, listed in `reductions`. Every gradient
// (Node::grad_of) that comes out partial is such a reduction, so the
// optimizer reads replicated gradients, as in DDP.
//
//   FXDP_ASSIGN_OR_RETURN(BatchDimAnalysis a, AnalyzeBatchDims(graph, {.world_size = 4}));
//   a.value(ValueRef{id, 0}).placement.ToString();  // "S(0)"
#ifndef FXDP_ANALYSIS_BATCH_DIM_H_
#define FXDP_ANALYSIS_BATCH_DIM_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "analysis/ir/graph.h"

namespace fxdp {

enum class ReduceOp : int8_t { kSum, kAvg };

struct Placement {
  enum class Kind : int8_t { kReplicate, kShard, kPartial };
  Kind kind = Kind::kReplicate;
  int32_t dim = -1;                  // kShard only.
  ReduceOp reduce = ReduceOp::kSum;  // kPartial only.

  static Placement Replicate() { return {}; }
  static Placement Shard(int32_t d) { return {Kind::kShard, d, ReduceOp::kSum}; }
  static Placement Partial(ReduceOp op) { return {Kind::kPartial, -1, op}; }
  bool is_replicate() const { return kind == Kind::kReplicate; }
  bool is_shard() const { return kind == Kind::kShard; }
  bool is_partial() const { return kind == Kind::kPartial; }
  bool operator==(const Placement& o) const;
  bool operator!=(const Placement& o) const { return !(*this == o); }
  std::string ToString() const;  // "S(0)", "R", "P(sum)", "P(avg)"
};

// What the analysis knows about one output value of a node.
//
// A sharded dim d of size n holds the batch as one factor of n = outer * B *
// inner in row-major order: outer == 1 is the usual batch-major dim ([B*T]
// after flattening [B, T]); outer > 1 is a batch folded inside a dim ([T*B]
// after flattening a seq-first [T, B]). Each rank holds outer * B_r * inner
// entries, its batch slice within every outer block, so the local size is
// always n / B * B_r.
struct ValueInfo {
  Placement placement;
  int64_t outer = 1;  // kShard only.
  // kShard: rank r's slice is the global slice times B / B_r (the value
  // descends from a mean over the local batch). kPartial: the reduce op is
  // kAvg. Always false for kReplicate.
  bool mean_scaled = false;
  // kReplicate only: the value is computed from this rank's batch (batch-norm
  // running statistics), so ranks hold different values. Updated state that
  // is rank-local gets averaged over ranks by the expansion.
  bool rank_local = false;
  // kShard: the order of the rank's rows along the batch dim (row_order.cc):
  // 0 the slice's own, k > 0 the order sort node k - 1 put them in on each
  // rank (rank-local, so not a slice of the one-device value), -1 any (a
  // constant built sharded: zeros, ones_like...).
  int32_t order = 0;
  // kShard, integer tensors: positions along a batch dim. kGather (sort's
  // indices, maybe // repeat): x[p] puts x's rows in order `order`, each
  // repeated `repeat` times; kRestore (their inverse, rows in the slice's
  // order): x[p] puts the rows of an x in order `restores` back in order.
  enum class Positions : int8_t { kNone, kGather, kRestore };
  Positions positions = Positions::kNone;
  int32_t restores = 0;
  int64_t repeat = 1;

  int32_t batch_dim() const { return placement.is_shard() ? placement.dim : -1; }
  bool operator==(const ValueInfo& o) const {
    return placement == o.placement && mean_scaled == o.mean_scaled && outer == o.outer &&
           rank_local == o.rank_local && order == o.order && positions == o.positions &&
           restores == o.restores && repeat == o.repeat;
  }
};

// Which rule decided a node (printed by DescribeDecision).
enum class Decision : int8_t {
  kInput,        // INPUT placeholder: sharded on its batch dim, or replicated (batch_dim -1).
  kState,        // PARAMETER / BUFFER / OPTIMIZER_STATE / CONSTANT placeholder.
  kRule,         // the op's rule (op_rules.h).
  kView,         // a view-op dim map.
  kGetItem,      // output k of a multi-output op.
  kShapedByUse,  // a factory-like value sharded because a use needs its batch rows.
  kFallback,     // no rule: a size-matching guess (guess_unruled_ops only; a warning names it).
  kNoTensor,     // outputs no tensor.
  kOutput,       // the graph's output node.
};

// How a rule decided (printed by DescribeDecision).
enum class Detail : int8_t {
  kNone,
  kNoBatch,        // no operand carries the batch: replicated.
  kFromArg,        // the batch dim comes from operand `arg`.
  kContracted,     // a matmul contracts the batch: partial.
  kReducedBatch,   // a sum/mean over the batch dim: partial.
  kLossReduced,    // a loss reduced over the batch: partial.
  kPartialLinear,  // a partial operand flows through a linear op.
  kLocalStats,     // batch norm: local batch statistics, as DDP.
  kSyncStats,      // batch norm: global batch statistics (AnalyzeOptions::sync_batchnorm).
  kGathered,       // works along the batch dim: sharded operands all-gathered, whole result.
};

struct NodeInfo {
  Decision decision = Decision::kNoTensor;
  Detail detail = Detail::kNone;
  int8_t arg = -1;    // kFromArg: the positional argument.
  int16_t rule = -1;  // index into the op-rule table (kRule, kShapedByUse), else -1.
  // kShapedByUse: the node whose use required the batch rows.
  ir::NodeId shaped_by;
};

// A partial value that must be all-reduced before some of its uses.
struct Reduction {
  ir::ValueRef value;
  ReduceOp op = ReduceOp::kSum;
  // The first node that needs the whole value.
  ir::NodeId first_use;
  // The parameter, when the value is that parameter's gradient.
  std::string grad_of;
};

// A replicated value that a sharded use reads only its batch rows of: the
// expansion slices it (no communication).
struct ShardedRead {
  ir::ValueRef value;
  int32_t dim = 0;    // the batch dim the use needs it sharded on.
  int64_t outer = 1;  // ValueInfo::outer of that dim.
  ir::NodeId user;
  // gathered_reads: the argument of `user` that reads it gathered (positional index, 64 + k for
  // keyword k; cdist(x, x) may gather one of two arguments holding the same value).
  int32_t arg = -1;
  // Mean-scaled (rank r holds B/B_r times its rows): each rank multiplies its rows by B_r/B
  // for this use (gathered_reads: before the gather; sharded_reads: a shard, not sliced, that an
  // additive op adds to a value at true scale, linearity.cc), so it reads one device's values.
  bool unscale = false;
};

struct AnalyzeOptions {
  int32_t world_size = 1;
  // Batch norm in training normalises with the statistics of the global batch
  // (torch's SyncBatchNorm; the expansion all-reduces them,
  // expansion/sync_batchnorm.h): its statistics outputs are replicated, not
  // rank-local. Default: each rank's local statistics, as DDP.
  bool sync_batchnorm = false;
  // An op with no rule (op_rules.h) is placed by matching tensor sizes, a
  // guess the report labels (`fxdp analyze` only). Default: such a graph is
  // refused (INVALID_ARGUMENT naming the node, the op, the user's source line
  // and the table row to add), as the compile path (expand, jobs) needs.
  bool guess_unruled_ops = false;
};

class BatchDimAnalysis {
 public:
  int32_t world_size() const { return world_size_; }
  // The global batch size B; 0 when the graph has no batched input. With
  // micro-batches (gradient accumulation: every batched input is split into
  // micro_batches() equal pieces), the size of one micro-batch: each input
  // holds micro_batches() * B rows.
  int64_t batch_size() const { return batch_size_; }
  int64_t micro_batches() const { return micro_batches_; }
  // AnalyzeOptions::sync_batchnorm of the run that produced this analysis.
  bool sync_batchnorm() const { return sync_batchnorm_; }
  const ValueInfo& value(ir::ValueRef r) const {
    return values_[value_offset_[r.node.value] + r.output];
  }
  // Output 0's info, or a replicated default for nodes without outputs.
  const ValueInfo& primary(ir::NodeId n) const;
  int32_t num_outputs(ir::NodeId n) const {
    return value_offset_[n.value + 1] - value_offset_[n.value];
  }
  const NodeInfo& node(ir::NodeId n) const { return nodes_[n.value]; }
  const std::vector<Reduction>& reductions() const { return reductions_; }
  const std::vector<ShardedRead>& sharded_reads() const { return sharded_reads_; }
  // Sharded operands all-gathered (along `dim`) for one use: a product of two
  // batch-sharded operands (samples coupled across the batch, a @ b.T).
  const std::vector<ShardedRead>& gathered_reads() const { return gathered_reads_; }
  // One line per op that had no rule and was placed by a guess
  // (AnalyzeOptions::guess_unruled_ops): "GUESSED: no batch-dim rule for aten::foo (3 nodes, first
  // n12): ...".
  const std::vector<std::string>& warnings() const { return warnings_; }
  // Notes about semantics the user should know (local batch statistics, ...).
  const std::vector<std::string>& notes() const { return notes_; }
  // Flat inputs split by bags (ragged inputs, ir::kRaggedKey): (input, its offsets) INPUT
  // placeholders; each rank reads its bags' part of the input and its offsets rebased to it.
  const std::vector<std::pair<ir::NodeId, ir::NodeId>>& ragged() const { return ragged_; }

  // The placement a use of `r` sees: R when the value is all-reduced first.
  Placement ReadPlacement(ir::ValueRef r) const;
  // Whether `r` is all-reduced before its non-output uses.
  bool IsReduced(ir::ValueRef r) const;

 private:
  friend class BatchDimAnalyzer;
  int32_t world_size_ = 1;
  int64_t batch_size_ = 0;
  int64_t micro_batches_ = 1;
  bool sync_batchnorm_ = false;
  std::vector<int32_t> value_offset_;  // size nodes + 1
  std::vector<ValueInfo> values_;
  std::vector<NodeInfo> nodes_;
  std::vector<Reduction> reductions_;
  std::vector<uint8_t> reduced_;  // per value
  std::vector<ShardedRead> sharded_reads_;
  std::vector<ShardedRead> gathered_reads_;
  std::vector<std::string> warnings_;
  std::vector<std::string> notes_;
  std::vector<std::pair<ir::NodeId, ir::NodeId>> ragged_;
};

// Analyses `graph`. INVALID_ARGUMENT naming the node for: an op or arguments
// not in torch 2.13's schemas (CheckOpSchemas, op_schemas.h), an op without a
// batch-dim rule (unless AnalyzeOptions::guess_unruled_ops), world size < 1, an
// input batch dim out of range, inputs whose batch sizes disagree, and ops
// whose use of the batch cannot be split across ranks (a reduction over the
// batch that is not a sum or mean, a cat along the batch, a view that moves
// the batch inside another dim, sharded operands on different dims, ...).
absl::StatusOr<BatchDimAnalysis> AnalyzeBatchDims(const ir::Graph& graph,
                                                  const AnalyzeOptions& options);

// Human-readable reason for a node's placement: "mm: batch dim contracted
// (arg 0 dim 1, arg 1 dim 0) -> P(avg)", "view (In0, Fl(In1,In2)): batch dim 0
// -> 0", ...
std::string DescribeDecision(const ir::Graph& graph, const BatchDimAnalysis& analysis,
                             ir::NodeId node);

// All output placements of a node: "S(0)" when it has one output or all are
// equal, else "(S(0), P(avg), P(avg))"; "-" when it has no tensor outputs.
std::string PlacementsString(const ir::Graph& graph, const BatchDimAnalysis& analysis,
                             ir::NodeId node);

// What a data-parallel style prints for some nodes instead of the analysis'
// placement and reason (FULLY_SHARD's sharded state is S(0) of its flat
// shard: expansion/state_memory.h): node index -> {placement, reason}.
using PlacementOverrides = absl::flat_hash_map<int32_t, std::pair<std::string, std::string>>;

// The analysis as JSON (`fxdp analyze --json`, docs/analysis.md): {"world_size": N, "batch_size":
// B, "nodes": [{"name", "target", "batch_dim", "placement", "reason", "source" (when the graph has
// it)}], "reductions": [...], "warnings": [...], "notes": [...]}.
std::string AnalysisToJson(const ir::Graph& graph, const BatchDimAnalysis& analysis,
                           const PlacementOverrides* overrides = nullptr);

// A table: name, op, batch dim, placement, reason (then "  <- SOURCE", the
// user's line, with `with_source`); then reductions, warnings and notes.
std::string AnalysisToTable(const ir::Graph& graph, const BatchDimAnalysis& analysis,
                            const PlacementOverrides* overrides = nullptr,
                            bool with_source = false);

}  // namespace fxdp

#endif  // FXDP_ANALYSIS_BATCH_DIM_H_
