// Internal to expansion/: the builder of one rank's graph (ExpandDataParallel
// in data_parallel.cc runs one per distinct rank).
//
//   rank_expander.cc     the walk over the input graph: names, local types,
//                        sharded reads, size arguments, REPLICATE's buckets
//                        (all-reduce), loss and output, sync batch norm;
//   fully_shard_emit.cc  what FULLY_SHARD adds to the walk (the plan of
//                        expansion/fully_shard.h): gathers, backward copies,
//                        shard-typed optimizer nodes, partial norms,
//                        reduce-scattered buckets.
#ifndef FXDP_EXPANSION_RANK_EXPANDER_H_
#define FXDP_EXPANSION_RANK_EXPANDER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "analysis/batch_dim.h"
#include "analysis/deferred_division.h"
#include "analysis/ir/flat_shard.h"
#include "analysis/ir/graph.h"
#include "expansion/data_parallel.h"
#include "expansion/fully_shard.h"
#include "expansion/sync_batchnorm.h"

namespace fxdp {

// A rank's expanded nodes, not yet verified as a graph.
struct RankNodes {
  ir::GraphHeader header;
  std::vector<ir::Node> nodes;
};

// A planned all-reduce (REPLICATE) or reduce-scatter (FULLY_SHARD) of
// gradients (rank independent).
struct PlannedBucket {
  Bucket info;
  std::vector<ir::ValueRef> values;          // global graph refs, production order.
  std::vector<int32_t> produced, first_use;  // per value: producer, first use.
  int32_t start = 0;                         // collective after this node.
  int32_t wait = 0;                          // wait before this node.
};

// DDP's buckets over the analysis' gradient reductions (data_parallel.h).
absl::StatusOr<std::vector<PlannedBucket>> PlanBuckets(const ir::Graph& g,
                                                       const BatchDimAnalysis& a,
                                                       const ExpandOptions& o);

// FULLY_SHARD's part of the report: the sharded state and one note per unit.
void ReportFullyShard(const FullyShardPlan& fs, Expansion* e);
// Whether FULLY_SHARD slices some gradient per rank (one no bucket reduces):
// then the rank graphs differ.
bool FullyShardSlicesPerRank(const ir::Graph& g, const std::vector<PlannedBucket>& buckets);

inline int64_t Bytes(const ir::TensorType& t) { return t.numel() * ir::DTypeItemSize(t.dtype); }

class RankExpander final : public RankGraphBuilder {
 public:
  // `fs`: the FULLY_SHARD plan, nullptr for REPLICATE.
  // `dd`: the loss's division deferred (analysis/deferred_division.h), nullptr for none.
  RankExpander(const ir::Graph& g, const BatchDimAnalysis& a, const ExpandOptions& o,
               const std::vector<PlannedBucket>& buckets, RankSlice slice,
               const FullyShardPlan* fs = nullptr, const DeferredDivision* dd = nullptr)
      : g_(g),
        a_(a),
        o_(o),
        buckets_(buckets),
        slice_(slice),
        batch_(a.batch_size()),
        fs_(fs),
        dd_(dd) {
    for (const PlannedBucket& b : buckets_) bucketed_.insert(b.values.begin(), b.values.end());
  }

  // Rank 0 also lists its collectives (`collectives` null for the others).
  absl::StatusOr<RankNodes> Run(std::vector<Collective>* collectives);

 private:
  using Argument = ir::Argument;
  using Node = ir::Node;
  using NodeId = ir::NodeId;
  using TensorType = ir::TensorType;
  using ValueRef = ir::ValueRef;
  using ValueType = ir::ValueType;
  using LocalRefs = absl::flat_hash_map<ValueRef, ValueRef>;

  // ---- names, types, refs (rank_expander.cc) ---------------------------------------

  bool Used(absl::string_view name) const;
  std::string Fresh(absl::string_view base);
  int64_t LocalExtent(int64_t global) const { return global / batch_ * slice_.size; }
  TensorType Local(const TensorType& t, const ValueInfo& v) const;
  ValueType LocalValue(ValueRef r) const;
  ValueRef Map(ValueRef old) const {
    if (auto it = replaced_.find(old); it != replaced_.end()) return it->second;
    return ValueRef{NodeId{new_id_[old.node.value]}, old.output};
  }
  ValueRef MapLocal(ValueRef r, const LocalRefs& local) const;
  Argument Mapped(const Argument& a, const LocalRefs& local) const;
  void MapArgs(Argument& a, const LocalRefs& local) const;
  ValueRef Emit(Node n) {
    out_.push_back(std::move(n));
    return ValueRef{NodeId{static_cast<int32_t>(out_.size() - 1)}, 0};
  }
  Node Call(absl::string_view base, absl::string_view target, absl::string_view overload,
            std::vector<Argument> args, TensorType type);
  static TensorType Flat(const TensorType& t, int64_t numel) {
    TensorType f = t;
    f.shape = {numel};
    f.stride = {1};
    f.storage_offset = 0;
    f.requires_grad = false;
    return f;
  }
  // `flat` (a Flat(t, t.numel()) value) viewed with `t`'s shape: contiguous,
  // no storage offset, no grad.
  ValueRef ViewAs(absl::string_view base, ValueRef flat, const TensorType& t) {
    TensorType shaped = t;
    shaped.stride = ir::ContiguousStrides(t.shape);
    shaped.storage_offset = 0;
    shaped.requires_grad = false;
    return Emit(Call(base, "aten::view", "", {flat, Ints(t.shape)}, shaped));
  }
  static Argument Ints(const std::vector<int64_t>& v) {
    Argument::List l;
    for (int64_t x : v) l.emplace_back(x);
    return l;
  }
  double Weight(ReduceOp op) const {
    return op == ReduceOp::kAvg ? static_cast<double>(slice_.size) / static_cast<double>(batch_)
                                : 1.0;
  }
  // scale (if needed) + all_reduce(sum) + wait on a 1-D or any tensor value.
  ValueRef AllReduce(ValueRef v, const TensorType& t, ReduceOp op, const std::string& purpose,
                     bool wait_now) {
    return AllReduceWeighted(v, t, Weight(op), purpose, wait_now);
  }
  ValueRef AllReduceWeighted(ValueRef v, const TensorType& t, double w, const std::string& purpose,
                             bool wait_now);
  bool HasTensorInput(const Node& n) const;

  // ---- RankGraphBuilder (sync_batchnorm.h) ------------------------------------------

  ValueRef Add(absl::string_view base, absl::string_view target, absl::string_view overload,
               std::vector<Argument> args, TensorType type) override {
    return Emit(Call(base, target, overload, std::move(args), std::move(type)));
  }
  ValueRef AllReduceSum(ValueRef v, const TensorType& t, double weight,
                        const std::string& purpose) override {
    return AllReduceWeighted(v, t, weight, purpose, true);
  }

  // ---- emission (rank_expander.cc) ----------------------------------------------------

  absl::StatusOr<bool> MaybeSyncBatchNorm(NodeId id, const Node& old);
  absl::Status EmitNode(NodeId id, const Node& old);
  // Sizes in `n` (the rank's copy of node `id`) that spell the global batch
  // become this rank's: a size list of a sharded output (or as_strided_scatter's
  // src), arange(B) indexing the batch rows, a micro-batch split of an input,
  // an int argument that is the batch size (native_group_norm's N).
  absl::Status LocalizeSizes(NodeId id, const Node& old, Node& n);
  absl::Status LocalizeSizeList(NodeId id, const Node& old, Node& n);
  void LocalizeSplitSize(const Node& old, Node& n);
  absl::Status LocalizeBatchSizeArg(NodeId id, const Node& old, Node& n);
  ValueRef EmitRead(const ShardedRead& r);
  ValueRef EmitSlice(const ShardedRead& r);
  ValueRef EmitGathered(const ShardedRead& r);  // gathered_reads.cc
  // The arguments of `n` (the rank's copy of node `id`) that read an operand all-gathered.
  void GatherArgs(ir::NodeId id, ir::Node& n);  // gathered_reads.cc
  ShardedRead GatherRoot(const ShardedRead& r, std::vector<ValueRef>* chain) const;
  ValueRef Whole(const ShardedRead& r);  // gathered_reads.cc
  absl::Status EmitSolo(const Reduction& r);
  // DeferredDivision (analysis/batch_dim.h): the arguments of `n` (the rank's copy of node `id`)
  // that read the seed's ones_like's loss (now `total`) or the local divisor; a bucket's reduced
  // gradients divided by the all-reduced divisor; the LOSS output all_reduce(total) / divisor.
  void DeferredDivisionArgs(NodeId id, Node& n) const;
  ValueRef DivideBucket(ValueRef waited, const TensorType& flat, size_t b);
  ValueRef DeferredLoss(const TensorType& loss);
  absl::Status EmitStart(size_t b);
  absl::Status EmitWait(size_t b);
  absl::Status EmitOutput(const Node& old);

  // ---- FULLY_SHARD (fully_shard_emit.cc; expansion/fully_shard.h) ------------------

  int64_t ShardNumel(int64_t numel) const {
    return ir::FlatShardOf(numel, o_.world_size, 0).shard_numel;
  }
  ValueRef Collect(Node n, const std::string& purpose, int64_t bytes);
  // The metadata fxdp-worker run reads to slice and reassemble state files.
  void FullyShardMetadata(ir::GraphHeader& header) const;
  // A node the rank graph does not compute: an optimizer view of a shard (the
  // shard itself) or an element of a norm of shards (the whole norm). Whether
  // `old` was one.
  bool FullyShardReplaces(NodeId id, const Node& old);
  absl::Status FullyShardReads(NodeId id, const Node& old, LocalRefs& local);
  absl::StatusOr<ValueRef> BackwardCopy(ValueRef r);
  // Sharded placeholders and optimizer math on shards: [s] outputs.
  void FullyShardOutputs(NodeId id, Node& n) const;
  // After `old` is emitted: a norm of shards made whole, a gradient no bucket
  // reduces sliced to this rank's shard.
  absl::Status FullyShardAfter(NodeId id, const Node& old);
  absl::Status EmitPartialNorm(NodeId id, const Node& old);
  absl::Status EmitGatherWait(int32_t e);
  absl::Status EmitGatherStart(int32_t e);
  absl::Status EmitReduceScatter(size_t b);
  absl::Status EmitReduceScatterWait(size_t b, ValueRef started);

  const ir::Graph& g_;
  const BatchDimAnalysis& a_;
  const ExpandOptions& o_;
  const std::vector<PlannedBucket>& buckets_;
  const RankSlice slice_;
  const int64_t batch_;
  std::vector<Node> out_;
  std::vector<int32_t> new_id_;
  absl::flat_hash_set<std::string> fresh_names_;       // names Fresh() gave out
  absl::flat_hash_map<std::string, int> next_suffix_;  // per base: first suffix to try
  absl::flat_hash_map<ValueRef, ValueRef> replaced_;
  absl::flat_hash_set<ValueRef> sync_bn_outputs_;  // outputs of rewritten batch-norm nodes
  absl::flat_hash_map<int32_t, std::vector<ShardedRead>> reads_;
  absl::flat_hash_map<int32_t, std::vector<ShardedRead>>
      gathered_;                                   // user -> operands all-gathered
  absl::flat_hash_map<ValueRef, ValueRef> whole_;  // gathered value (or a view of it) -> whole
  absl::flat_hash_map<int32_t, std::vector<Reduction>> solo_;
  absl::flat_hash_map<size_t, ValueRef> started_;
  std::vector<Collective>* collectives_ = nullptr;
  // FULLY_SHARD.
  const FullyShardPlan* fs_ = nullptr;
  const DeferredDivision* dd_ = nullptr;
  absl::flat_hash_map<int32_t, ValueRef> gathered_fwd_, gathered_bwd_;  // placeholder -> whole
  absl::flat_hash_map<int32_t, ValueRef> gather_started_;               // event -> all_gather
  absl::flat_hash_map<int32_t, int32_t> backward_copies_;               // old node -> new node
  absl::flat_hash_map<ValueRef, ValueRef> norms_;  // _foreach_norm output -> whole norm
  absl::flat_hash_set<ValueRef> bucketed_;         // gradients some bucket reduces
};

}  // namespace fxdp

#endif  // FXDP_EXPANSION_RANK_EXPANDER_H_
