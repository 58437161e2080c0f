// The batch-dim analyzer's internals (analysis/batch_dim.h is the interface).
//
// One engine (engine.cc) runs passes over the graph until no pass finds a new
// value to all-reduce or a new factory to build sharded; each pass visits
// every node once and asks the node's rule (op_rules.h, view_rules.h) where
// the batch goes; it names no op: a handler reads the rule's named parameters
// (rule.param(ParamRole::kDim)) and traits. What the engine does with
// operands is shared by every family: linearity.cc (partial and mean-scaled
// operands), shard_upgrade.cc (a replicated operand that a sharded use needs
// sharded), engine.cc (the rule's kReplicated operands). Each family's
// handler lives in the file of its kind of op:
//
//   pointwise.cc    pointwise, shape-preserving along/over dims, like,
//                   foreach, and the size-matching fallback
//   matmul.cc       einsum-like products (the rule's MatmulSpec)
//   coupled.cc      ops along the batch dim: samples coupled across the batch
//   reductions.cc   reductions, histograms, losses and their backwards
//   norms.cc        layer/batch norm, convolution/pooling/attention kernels
//   shape_ops.cc    cat, stack, split, slice, select, scatter into a slice
//   indexing.cc     index, index_put, embedding, embedding bag
//   row_order.cc    rows each rank sorts itself (dropless MoE dispatch), _grouped_mm
//   row_order_gather.cc  the same dispatch with gather/scatter over an expanded index
//   views.cc        view ops (dim maps) and as_strided
//   inputs.cc       the batch size and micro-batches, from the INPUT placeholders
//   args.cc         reading a node's int/bool/dims arguments
#ifndef FXDP_ANALYSIS_BATCH_DIM_ANALYZER_H_
#define FXDP_ANALYSIS_BATCH_DIM_ANALYZER_H_

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "analysis/batch_dim.h"
#include "analysis/dim_spec.h"
#include "analysis/ir/graph.h"
#include "analysis/op_rules.h"

namespace fxdp {

inline const ValueInfo kReplicated{};

inline ValueInfo Shard(int32_t dim, int64_t outer, bool scaled) {
  ValueInfo v;
  v.placement = Placement::Shard(dim);
  v.outer = outer;
  v.mean_scaled = scaled;
  return v;
}

inline ValueInfo Partial(bool avg) {
  ValueInfo v;
  v.placement = Placement::Partial(avg ? ReduceOp::kAvg : ReduceOp::kSum);
  v.mean_scaled = avg;
  return v;
}

// Partial, or sharded and mean-scaled: a value linearity must track.
inline bool IsSpecial(const ValueInfo& v) {
  return v.placement.is_partial() || (v.placement.is_shard() && v.mean_scaled);
}

inline std::string TargetString(const ir::Node& n) { return n.target.ToString(); }

// An operand of the node being analysed: a tensor argument.
struct Operand {
  int arg;   // positional index; 64 + k for keyword argument k.
  int elem;  // index in a list argument, else -1.
  ir::ValueRef ref;
  const ir::TensorType* type;
  ValueInfo info;  // as this use reads it.
};

// Where the batch sits in one output dim of a view (see Locate).
struct BatchLoc {
  enum Kind : int8_t { kNone, kWhole, kBroken } kind = kNone;
  int64_t outer = 1;
  int64_t inner = 1;
};

class BatchDimAnalyzer {
 public:
  BatchDimAnalyzer(const ir::Graph& g, const AnalyzeOptions& options) : g_(g), options_(options) {}

  absl::StatusOr<BatchDimAnalysis> Run();

 private:
  // What linearity found among the operands (linearity.cc).
  struct Special {
    bool partial = false;
    bool scaled = false;  // partial: avg; shard: mean-scaled.
  };

  // A replicated value built sharded for a sharded use (shard_upgrade.cc).
  struct Upgrade {
    int32_t dim;
    int64_t outer;
    ir::NodeId user;
  };

  // Where a broadcasting combination puts the batch (pointwise.cc).
  struct Combined {
    int32_t dim = -1;  // output dim holding the batch, or -1.
    int64_t outer = 1;
    int arg = -1;  // operand that decided.
  };

  // ---- engine (engine.cc) --------------------------------------------------
  int32_t Offset(ir::ValueRef r) const { return a_.value_offset_[r.node.value] + r.output; }
  void SeedReductions();
  absl::Status Pass();
  absl::Status Visit(ir::NodeId id, const ir::Node& n);
  absl::Status VisitRule(ir::NodeId id, const ir::Node& n, const OpRule& rule);
  void PropagateRankLocal(ir::NodeId id, const ir::Node& n);
  absl::Status VisitPlaceholder(ir::NodeId id, const ir::Node& n);
  absl::Status VisitOutput(ir::NodeId id, const ir::Node& n);
  void SetOut(ir::NodeId id, int k, const ValueInfo& v);
  void SetAllOut(ir::NodeId id, const ValueInfo& v);
  ValueInfo Read(ir::ValueRef r) const;
  void RequireWhole(ir::ValueRef r, ir::NodeId user);
  // This pass changed what the analysis knows, for `user`'s sake.
  void MarkChanged(ir::NodeId user) {
    changed_ = true;
    last_change_ = user;
  }
  const ir::TensorType* TypeOf(ir::ValueRef r) const;
  void AddOperand(std::vector<Operand>& ops, int arg, int elem, const ir::Argument& a) const;
  std::vector<Operand> Operands(const ir::Node& n) const;
  const Operand* Find(const std::vector<Operand>& ops, int arg) const;
  std::string OperandName(const std::vector<Operand>& ops, int arg) const;
  absl::Status Error(const ir::Node& n, const std::string& what) const;
  const ir::TensorType* OutType(const ir::Node& n, int k = 0) const;
  void Finish();

  // ---- inputs (inputs.cc) --------------------------------------------------
  absl::Status FindBatchSize();
  static int64_t EqualSplitSize(const ir::Node& n, int64_t dim, int64_t rank);
  absl::Status FindMicroBatches();

  // ---- arguments (args.cc) -------------------------------------------------
  static int64_t NormDim(int64_t d, int64_t rank);
  static const ir::Argument* ArgAt(const ir::Node& n, int i, absl::string_view name);
  static std::optional<int64_t> IntArg(const ir::Node& n, int i, absl::string_view name);
  static std::optional<bool> BoolArg(const ir::Node& n, int i, absl::string_view name);
  // An int, float or Scalar argument as a double.
  static std::optional<double> NumberArg(const ir::Node& n, int i, absl::string_view name);
  static std::optional<std::vector<int64_t>> DimsArg(const ir::Node& n, int i,
                                                     absl::string_view name);
  // The same, for the argument a rule's parameter names (nullptr: absent).
  static const ir::Argument* ArgOf(const ir::Node& n, const OpParam* p);
  static std::optional<int64_t> IntArg(const ir::Node& n, const OpParam* p);
  static std::optional<bool> BoolArg(const ir::Node& n, const OpParam* p);
  static std::optional<std::vector<int64_t>> DimsArg(const ir::Node& n, const OpParam* p);

  // ---- linearity (linearity.cc) --------------------------------------------
  bool IsZeros(ir::ValueRef r) const;
  static bool InMask(const LinearIn& linear, int arg);
  absl::Status ScaledError(ir::NodeId id, const ir::Node& n, const Operand& o,
                           absl::string_view why);
  absl::StatusOr<Special> Linear(ir::NodeId id, const ir::Node& n, const LinearIn& linear,
                                 std::vector<Operand>& ops, int exempt_arg = -1);
  absl::Status ScaledShards(ir::NodeId id, const ir::Node& n, const LinearIn& linear,
                            std::vector<Operand>& ops, int exempt_arg, Special& s);

  // ---- sharding a replicated operand (shard_upgrade.cc) ----------------------
  void NeedShard(const Operand& o, int32_t dim, int64_t outer, ir::NodeId user);
  bool TryUpgrade(ir::ValueRef r, int32_t dim, int64_t outer, ir::NodeId user,
                  std::vector<std::pair<int32_t, Upgrade>>& marks, int depth);
  // TryUpgrade of a view's output (its input built sharded, or an expand's
  // new dim) and of an op by its rule's family (factories, *_like, along-dim,
  // embedding, pointwise).
  bool TryUpgradeView(ir::ValueRef r, const ir::Node& n, int32_t dim, int64_t outer,
                      ir::NodeId user, std::vector<std::pair<int32_t, Upgrade>>& marks, int depth);
  bool TryUpgradeByRule(ir::ValueRef r, const ir::Node& n, int32_t dim, int64_t outer,
                        ir::NodeId user, std::vector<std::pair<int32_t, Upgrade>>& marks,
                        int depth);

  // ---- views (views.cc) ----------------------------------------------------
  BatchLoc Locate(const DimSpec& spec, const std::vector<int64_t>& in_shape, int64_t d,
                  int64_t outer, int64_t inner, int64_t* size) const;
  absl::Status VisitView(ir::NodeId id, const ir::Node& n);
  int64_t SampleSpan(const std::vector<int64_t>& size, const std::vector<int64_t>& stride,
                     int64_t offset, int64_t d) const;
  int64_t ViewBatchDim(const std::vector<int64_t>& size, const std::vector<int64_t>& stride,
                       int64_t offset, int64_t span) const;
  absl::Status AsStrided(ir::NodeId id, const ir::Node& n, const OpRule& rule);

  // ---- pointwise and shape-preserving (pointwise.cc) -------------------------
  absl::StatusOr<Combined> Broadcast(ir::NodeId id, const ir::Node& n,
                                     const std::vector<Operand>& ops, int64_t out_rank,
                                     bool broadcast = true);
  void SetCombined(ir::NodeId id, const Combined& c, const Special& s);
  absl::Status Pointwise(ir::NodeId id, const ir::Node& n, const OpRule& rule, int64_t out_rank,
                         bool broadcast = true);
  absl::Status ShapePreserving(ir::NodeId id, const ir::Node& n, const OpRule& rule);
  absl::Status Like(ir::NodeId id, const ir::Node& n, const OpRule& rule);
  absl::Status Foreach(ir::NodeId id, const ir::Node& n, const OpRule& rule);
  absl::Status VisitFallback(ir::NodeId id, const ir::Node& n);
  // INVALID_ARGUMENT for the first node whose op has no rule, naming every
  // such op, the user's line and the row to add; OK when every op has one.
  absl::Status RefuseUnruledOps() const;

  // ---- families in their own files -------------------------------------------
  absl::Status Matmul(ir::NodeId id, const ir::Node& n, const OpRule& rule);
  // An op along the batch dim (coupled.cc): its sharded operands all-gathered; false when none
  // holds the batch on `dim`.
  absl::StatusOr<bool> GatherAlong(ir::NodeId id, const ir::Node& n, const OpRule& rule,
                                   int64_t dim);
  // Operands holding the batch on two labels of a product: one label's all-gathered
  // (coupled.cc).
  absl::Status GatherCoupled(ir::NodeId id, const ir::Node& n, std::vector<Operand>& ops,
                             const std::function<int(const Operand&, int64_t)>& label_of);
  absl::Status Reduce(ir::NodeId id, const ir::Node& n, const OpRule& rule);
  int64_t ReductionArg(const ir::Node& n, const OpRule& rule) const;
  absl::Status Loss(ir::NodeId id, const ir::Node& n, const OpRule& rule);
  absl::Status LossBackward(ir::NodeId id, const ir::Node& n, const OpRule& rule);
  absl::Status Histogram(ir::NodeId id, const ir::Node& n, const OpRule& rule);
  // Every operand the rule lists as kReplicated is not batch-sharded.
  absl::Status RequireReplicatedArgs(const ir::Node& n, const std::vector<Operand>& ops,
                                     const OpRule& rule) const;
  // The start of a handler whose batch follows operand `arg`: linearity (into
  // *s) and the rule's replicated operands are checked; `arg` when it is
  // batch-sharded, else nullptr with the node recorded as holding no batch.
  absl::StatusOr<const Operand*> ShardedOperand(ir::NodeId id, const ir::Node& n,
                                                const OpRule& rule, std::vector<Operand>& ops,
                                                int arg, Special* s);
  // The start of a backward whose args 0 and 1 (grad_output and the input or
  // indices) hold the batch on the same dim: linearity (into *s); nullopt, the
  // node recorded as holding no batch, when neither is sharded; else the rule's
  // replicated operands are checked and the two combined over `out_rank` dims
  // (a replicated one is built sharded).
  absl::StatusOr<std::optional<Combined>> GradAndInputBatch(ir::NodeId id, const ir::Node& n,
                                                            const OpRule& rule,
                                                            std::vector<Operand>& ops,
                                                            int64_t out_rank, Special* s);
  absl::Status LayerNorm(ir::NodeId id, const ir::Node& n, const OpRule& rule);
  absl::Status NormOrConvBackward(ir::NodeId id, const ir::Node& n, const OpRule& rule);
  absl::Status BatchNorm(ir::NodeId id, const ir::Node& n, const OpRule& rule);
  absl::Status Spatial(ir::NodeId id, const ir::Node& n, const OpRule& rule);
  absl::Status CatStack(ir::NodeId id, const ir::Node& n, const OpRule& rule);
  absl::Status DimOp(ir::NodeId id, const ir::Node& n, const OpRule& rule);
  // The error for a split along the batch dim `d` of `self` (shape_ops.cc): unequal micro-batches
  // named, with what to do.
  absl::Status SplitAlongBatchError(const ir::Node& n, const Operand& self, int32_t d) const;
  // Where arg 0's batch dim (sharded, `self`) lands after a dim op along
  // `dim`, or the error when the op splits, selects, indexes or takes part of
  // the batch dim.
  absl::StatusOr<int32_t> ShardedDimAfter(const ir::Node& n, const OpRule& rule,
                                          const Operand& self, int64_t dim) const;
  // Whether a slice/narrow takes all of a dim of `size`.
  static bool SliceTakesAll(const ir::Node& n, const OpRule& rule, int64_t size);
  absl::Status ScatterInto(ir::NodeId id, const ir::Node& n, const OpRule& rule);
  absl::Status Embedding(ir::NodeId id, const ir::Node& n, const OpRule& rule);
  absl::Status EmbeddingBackward(ir::NodeId id, const ir::Node& n, const OpRule& rule);
  absl::Status EmbeddingBag(ir::NodeId id, const ir::Node& n, const OpRule& rule);
  absl::Status WholeInputBags(ir::NodeId id, const ir::Node& n, const OpRule& rule,
                              const std::vector<Operand>& ops);
  bool IsBagOffsets(const ir::Argument& a, int64_t bag) const;
  // Flat inputs split by bags (ragged_bags.cc).
  void FindRaggedInputs();
  bool OnlyBagsRead(const ir::UseMap& uses, ir::ValueRef text, ir::ValueRef offsets,
                    const ir::ValueRef* weights) const;
  struct BagBytes {
    int64_t split = 0, whole = 0;
  };
  BagBytes BagBytesOf(const ir::UseMap& uses, ir::ValueRef text, ir::ValueRef offsets,
                      const ir::ValueRef* weights) const;
  std::string BagChoiceNote(ir::ValueRef text, ir::ValueRef offsets, const ir::ValueRef* weights,
                            const BagBytes& b) const;
  // The note on how the bags of forward node `id` are computed, split or whole, and why.
  void NoteBagChoice(ir::NodeId id);
  // `n` is a bags' op over a ragged input.
  bool IsRagged(const ir::Node& n) const;
  void RaggedBags(ir::NodeId id, const ir::Node& n, const Special& s);
  absl::Status RaggedBagsBackward(ir::NodeId id, const ir::Node& n, const OpRule& rule,
                                  std::vector<Operand>& ops);
  bool OnlyOffsets(ir::ValueRef r) const;
  bool IsBatchPositions(const ir::Argument& a) const;
  bool OnlyIndexesDim(ir::ValueRef r, int64_t pos) const;
  int64_t BatchPositionsIndex(ir::NodeId id, const ir::Node& n, const std::vector<Operand>& ops,
                              const ir::Argument::List& list, int64_t pos);
  absl::Status IndexPut(ir::NodeId id, const ir::Node& n, const OpRule& rule);
  // The index of `list` that is arange(B) indexing the batch rows next to a
  // batch-sharded self or index, or -1.
  int64_t BatchPositionsArg(const std::vector<Operand>& ops, const Operand& self,
                            const ir::Argument::List& list) const;
  // The dim of self that holds the batch (checked against self's and the
  // values' placements, which are upgraded to sharded where replicated).
  absl::StatusOr<int64_t> IndexPutBatchDim(ir::NodeId id, const ir::Node& n,
                                           const std::vector<Operand>& ops,
                                           const ir::Argument::List& list, int64_t pos);
  absl::Status IndexAdd(ir::NodeId id, const ir::Node& n, const OpRule& rule);  // coupled.cc
  struct IndexLayout {
    int64_t front = 0;       // values' dim of the indices' first broadcast dim.
    int64_t bcast_rank = 0;  // rank of the indices' broadcast.
    int64_t res_rank = -1;   // rank of the indexed result (the values' broadcast).
  };
  IndexLayout LayoutOf(const std::vector<Operand>& ops, const ir::Argument::List& list) const;
  bool IndicesHoldBatch(const std::vector<Operand>& ops, const ir::Argument::List& list) const;
  absl::Status IndexAccumulate(ir::NodeId id, const ir::Node& n, const OpRule& rule,
                               std::vector<Operand> ops, const ir::Argument::List& list);
  absl::Status Index(ir::NodeId id, const ir::Node& n, const OpRule& rule);

  // ---- rows in a rank-local order (row_order.cc) -----------------------------
  // sort along the batch dim: each rank sorts its own rows.
  absl::Status SortRows(ir::NodeId id, const ir::Node& n, const OpRule& rule, int32_t d);
  // Operand `arg` when it holds positions (ValueInfo::positions), else nullptr.
  const Operand* PositionsOperand(const std::vector<Operand>& ops, int arg = 1) const;
  absl::Status IndexRows(ir::NodeId id, const ir::Node& n, const OpRule& rule,
                         std::vector<Operand>& ops, const Operand& p);
  absl::Status IndexPutRows(ir::NodeId id, const ir::Node& n, const OpRule& rule,
                            std::vector<Operand>& ops, const Operand& p);
  // x[p] = v (accumulate: +=) with v's rows in the order p gathers into, or in batch order.
  absl::Status PutRows(ir::NodeId id, const ir::Node& n, const Operand& self, const Operand& vals,
                       const Operand& p, int32_t d, bool accumulate, bool scaled);
  absl::Status PutInto(ir::NodeId id, const ir::Node& n, const Operand& self, int32_t d,
                       int64_t outer, int32_t order);
  // gather / scatter / scatter_add along dim d with positions expanded over the other dims
  // (row_order_gather.cc); unsqueeze/expand carry positions (FollowPositions).
  absl::Status AlignedRows(ir::NodeId id, const ir::Node& n, const OpRule& rule,
                           std::vector<Operand>& ops, const Operand& p);
  bool IsPositionsView(const ir::Node& n) const;
  void FollowPositions(ir::NodeId id, const ir::Node& n);
  absl::Status GroupedMm(ir::NodeId id, const ir::Node& n, const OpRule& rule);
  absl::Status CheckGroupOffsets(const ir::Node& n, const Operand& offs, int32_t order) const;
  ir::ValueRef ThroughCasts(ir::ValueRef r, bool views) const;
  bool KeysAreGroups(int32_t order, int64_t groups) const;
  int64_t GroupCounts(ir::ValueRef r, int32_t order) const;
  bool IsPositionsOf(ir::ValueRef r, int64_t extent) const;
  // After a node's handler: its outputs take the order of its ordered operands, or
  // the node is refused when it mixes orders or may depend on the rows' order.
  absl::Status OrderRows(ir::NodeId id, const ir::Node& n, const OpRule* rule);
  // A sort's positions are each rank's own row numbers: the node may read them only as the
  // index of x[p] / x[p] = v (positions_index_), or to make coarser positions (p // k).
  absl::Status CheckPositionsUse(ir::NodeId id, const ir::Node& n, const OpRule* rule) const;
  std::string OrderName(int32_t order) const;

  const ir::Graph& g_;
  const AnalyzeOptions options_;
  BatchDimAnalysis a_;
  // Ragged inputs (FindRaggedInputs): input node -> its offsets' node.
  absl::flat_hash_map<int32_t, int32_t> ragged_;
  absl::flat_hash_map<int32_t, std::string> bag_notes_;  // forward bags' node -> its choice
  bool changed_ = false;
  ir::NodeId last_change_{0};  // the node whose use made the last change (for errors).
  absl::flat_hash_map<int32_t, Upgrade> upgrades_;
  absl::flat_hash_map<std::string, std::tuple<int, ir::NodeId, std::string>> fallback_ops_;
  std::vector<std::string> fallback_order_;
  bool order_set_ = false;  // the visited node's handler set its outputs' row order.
  std::optional<ir::ValueRef> positions_index_;  // the positions the visited node indexes with.
};

}  // namespace fxdp

#endif  // FXDP_ANALYSIS_BATCH_DIM_ANALYZER_H_
