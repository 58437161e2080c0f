// ExpandDataParallel: checks, bucket planning and the driver that builds each
// rank's graph (expansion/rank_expander.h), schedules and verifies it.
#include "expansion/data_parallel.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "expansion/fully_shard.h"
#include "expansion/rank_expander.h"
#include "expansion/schedule.h"
#include "expansion/shape_check.h"
#include "util/status_macros.h"

namespace fxdp {

using ir::Argument;
using ir::Graph;
using ir::Node;
using ir::NodeId;
using ir::TensorType;
using ir::ValueRef;

absl::string_view DataParallelStyleName(DataParallelStyle s) {
  return s == DataParallelStyle::kFullyShard ? "fully_shard" : "replicate";
}

absl::StatusOr<DataParallelStyle> ParseDataParallelStyle(absl::string_view s) {
  const std::string l = absl::AsciiStrToLower(s);
  if (l == "replicate") return DataParallelStyle::kReplicate;
  if (l == "fully_shard" || l == "full_shard") return DataParallelStyle::kFullyShard;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown data-parallel style '", s, "': expected 'replicate' or 'fully_shard'"));
}

namespace {

// Whether every reference is to an output of an earlier node.
bool RefsPointBackwards(const std::vector<Node>& nodes) {
  bool ok = true;
  for (int32_t i = 0; i < static_cast<int32_t>(nodes.size()) && ok; ++i) {
    nodes[i].ForEachInput([&](ValueRef r) {
      ok = ok && r.node.value >= 0 && r.node.value < i && r.output >= 0 &&
           r.output < static_cast<int32_t>(nodes[r.node.value].outputs.size());
    });
  }
  return ok;
}

}  // namespace

namespace {

// Buckets being filled in order: Add puts a gradient into the open bucket,
// Close files it (its index, and after which node its collective starts and
// before which its wait goes).
class BucketFiller {
 public:
  explicit BucketFiller(const Graph& g) : g_(g) {}

  const PlannedBucket& open() const { return cur_; }
  size_t closed() const { return buckets_.size(); }

  void Add(ValueRef v, int32_t produced, int32_t first_use, const std::string& grad_of,
           ReduceOp op) {
    if (cur_.values.empty()) {
      cur_.info.op = op;
      cur_.wait = first_use;
    }
    cur_.values.push_back(v);
    cur_.produced.push_back(produced);
    cur_.first_use.push_back(first_use);
    cur_.info.gradients.push_back(grad_of);
    cur_.info.bytes += Bytes(g_.type(v).tensor);
    cur_.start = std::max(cur_.start, produced);
    cur_.wait = std::min(cur_.wait, first_use);
  }

  void Close() {
    if (cur_.values.empty()) return;
    cur_.info.index = static_cast<int32_t>(buckets_.size());
    cur_.info.start_after = g_.node(NodeId{cur_.start}).name;
    cur_.info.wait_before = g_.node(NodeId{cur_.wait}).name;
    cur_.info.start_position = cur_.start;
    cur_.info.wait_position = cur_.wait;
    buckets_.push_back(std::move(cur_));
    cur_ = PlannedBucket{};
  }

  std::vector<PlannedBucket>& buckets() { return buckets_; }

 private:
  const Graph& g_;
  PlannedBucket cur_;
  std::vector<PlannedBucket> buckets_;
};

int64_t MiBToBytes(double mb) { return static_cast<int64_t>(mb * 1024 * 1024); }

// DDP's rule over the gradients in production order: a bucket closes once it
// reaches its cap (first_bucket_mb for the first), or before a gradient of
// another dtype, device or reduce op, or one produced after the bucket's
// first use.
void FillBuckets(const Graph& g, const BatchDimAnalysis& a, const ExpandOptions& o,
                 BucketFiller& f) {
  std::vector<const Reduction*> grads;
  for (const Reduction& r : a.reductions()) {
    if (!r.grad_of.empty()) grads.push_back(&r);
  }
  std::sort(grads.begin(), grads.end(),
            [](const Reduction* x, const Reduction* y) { return x->value.node < y->value.node; });
  for (const Reduction* r : grads) {
    const TensorType* t = g.type(r->value).is_tensor() ? &g.type(r->value).tensor : nullptr;
    if (t == nullptr) continue;
    const int32_t produced = r->value.node.value;
    const int32_t first_use = r->first_use.valid() ? r->first_use.value : g.size() - 1;
    const PlannedBucket& cur = f.open();
    if (!cur.values.empty()) {
      const TensorType& head = g.type(cur.values[0]).tensor;
      const double cap_mb = f.closed() == 0 ? o.first_bucket_mb : o.bucket_cap_mb;
      if (produced >= cur.wait || head.dtype != t->dtype || head.device != t->device ||
          cur.info.op != r->op || cur.info.bytes >= MiBToBytes(cap_mb)) {
        f.Close();
      }
    }
    f.Add(r->value, produced, first_use, r->grad_of, r->op);
  }
  f.Close();
}

// The tail: the last bucket is split again from its end, with DDP's rule
// (a bucket closes once it reaches its cap) and caps last_bucket_mb,
// 2 * last_bucket_mb, 4 * ... (at most bucket_cap_mb); the front piece
// left over is a bucket of its own if it holds at least half its cap.
void SplitLastBucket(const Graph& g, const ExpandOptions& o, BucketFiller& f) {
  std::vector<PlannedBucket>& buckets = f.buckets();
  if (o.last_bucket_mb <= 0 || buckets.empty() || buckets.back().values.size() <= 1) return;
  PlannedBucket last = std::move(buckets.back());
  buckets.pop_back();
  const int64_t max_cap = MiBToBytes(o.bucket_cap_mb);
  int64_t piece_cap = MiBToBytes(o.last_bucket_mb);
  std::vector<std::pair<size_t, size_t>> pieces;  // [from, to), last piece first
  size_t to = last.values.size();
  int64_t bytes = 0;
  for (size_t k = last.values.size(); k-- > 0;) {
    bytes += Bytes(g.type(last.values[k]).tensor);
    if (bytes >= piece_cap) {
      pieces.emplace_back(k, to);
      to = k;
      bytes = 0;
      piece_cap = std::min(2 * piece_cap, std::max(max_cap, piece_cap));
    }
  }
  if (to > 0) {
    // A front piece under half its cap joins the piece after it (which then
    // starts no later: it holds the later gradients).
    if (pieces.empty() || 2 * bytes >= piece_cap) {
      pieces.emplace_back(0, to);
    } else {
      pieces.back().first = 0;
    }
  }
  for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {
    for (size_t k = it->first; k < it->second; ++k) {
      f.Add(last.values[k], last.produced[k], last.first_use[k], last.info.gradients[k],
            last.info.op);
    }
    f.Close();
  }
}

}  // namespace

absl::StatusOr<std::vector<PlannedBucket>> PlanBuckets(const Graph& g, const BatchDimAnalysis& a,
                                                       const ExpandOptions& o) {
  BucketFiller f(g);
  FillBuckets(g, a, o, f);
  SplitLastBucket(g, o, f);
  return std::move(f.buckets());
}

namespace {

// What the expansion needs of its inputs: a world size the analysis was run
// for and the batch (each micro-batch) can feed, gradients to all-reduce, sane bucket caps, the
// same sync_batchnorm.
absl::Status CheckExpandable(const Graph& graph, const BatchDimAnalysis& analysis,
                             const ExpandOptions& options) {
  const int32_t world = options.world_size;
  if (world < 1) {
    return absl::InvalidArgumentError(absl::StrCat("world size must be >= 1, got ", world));
  }
  if (analysis.world_size() != world) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the analysis is for world size %d, the expansion for %d", analysis.world_size(), world));
  }
  const int64_t batch = analysis.batch_size();
  if (batch == 0) {
    return absl::InvalidArgumentError(
        "the graph has no input with a batch dim (every INPUT placeholder has batch_dim -1)");
  }
  if (world > batch) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "world size %d is larger than the batch (%d samples): every rank needs at least one", world,
        batch));
  }
  // A training step all-reduces gradients; an evaluation step (fxdp.trace_eval:
  // no UPDATED_* output, docs/evaluation.md) has none and only its outputs are
  // reduced.
  bool any_grad = false, any_update = false;
  for (const Node& n : graph.nodes()) {
    any_grad |= !n.grad_of.empty();
    for (const ir::OutputSpec& s : n.output_specs)
      any_update |= ir::UpdatedRole(s.role).has_value();
  }
  if (!any_grad && any_update) {
    return absl::InvalidArgumentError(
        "the graph updates state but marks no gradients (no node has grad_of): nothing to "
        "all-reduce; trace it with fxdp.trace (an evaluation step, which updates nothing, with "
        "fxdp.trace_eval)");
  }
  if (options.bucket_cap_mb <= 0 || options.first_bucket_mb <= 0) {
    return absl::InvalidArgumentError("bucket sizes must be positive");
  }
  if (options.last_bucket_mb < 0) {
    return absl::InvalidArgumentError("the last bucket's cap must be >= 0 (0: no split)");
  }
  if (options.sync_batchnorm != analysis.sync_batchnorm()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the expansion asks for sync_batchnorm=%s but the analysis was run with %s",
        options.sync_batchnorm ? "true" : "false", analysis.sync_batchnorm() ? "true" : "false"));
  }
  return absl::OkStatus();
}

// The report's facts that do not depend on the rank graphs: style, batch and
// slices, notes (the analysis' and rank-local updated state), batch norm,
// buckets (FULLY_SHARD's units and sharded state: ReportFullyShard).
void StartReport(const Graph& graph, const BatchDimAnalysis& analysis, const ExpandOptions& options,
                 const std::vector<PlannedBucket>& buckets, const FullyShardPlan* fs,
                 Expansion* out) {
  Expansion& e = *out;
  const int32_t world = options.world_size;
  const int64_t batch = analysis.batch_size();
  ExpansionReport& rep = e.report;
  rep.world_size = world;
  rep.style = options.style;
  if (fs != nullptr) ReportFullyShard(*fs, &e);
  rep.batch_size = batch;
  rep.slices = SplitBatch(batch, world);
  if (const int64_t k = analysis.micro_batches(); k > 1) {
    rep.micro_batches = k;
    for (int32_t r = 0; r < world; ++r)
      rep.rank_rows.push_back(ir::RankRows(k * batch, batch, world, r));
  }
  rep.sharded_reads = static_cast<int32_t>(
      std::count_if(analysis.sharded_reads().begin(), analysis.sharded_reads().end(),
                    [](const ShardedRead& r) { return !r.unscale; }));
  rep.notes.insert(rep.notes.begin(), analysis.notes().begin(), analysis.notes().end());
  for (const Node& n : graph.nodes()) {
    if (!n.is_output() || n.args.empty() || !n.args[0].is_list()) continue;
    const auto& list = n.args[0].as<Argument::List>();
    for (size_t k = 0; k < list.size() && k < n.output_specs.size(); ++k) {
      const ValueRef* r = list[k].get_if<ValueRef>();
      if (r != nullptr && ir::UpdatedRole(n.output_specs[k].role).has_value() &&
          analysis.value(*r).rank_local) {
        rep.notes.push_back(absl::StrCat("updated state '", n.output_specs[k].state_name,
                                         "' comes from local batch statistics: all-reduced to "
                                         "the batch-weighted mean over ranks each step"));
      }
    }
  }
  for (ir::NodeId id{0}; id.value < graph.size(); ++id.value) {
    const Detail d = analysis.node(id).detail;
    if (d == Detail::kSyncStats) rep.batch_norm = "global";
    if (d == Detail::kLocalStats) rep.batch_norm = "local";
  }
  for (const PlannedBucket& b : buckets) rep.buckets.push_back(b.info);
  // Rank-specific slices of replicated values make the graphs differ too.
  // (A mean-scaled shard read at true scale is times B_r/B: the same on every rank of an even
  // split.)
  e.identical = batch % world == 0 &&
                std::all_of(analysis.sharded_reads().begin(), analysis.sharded_reads().end(),
                            [](const ShardedRead& r) { return r.unscale; });
  if (fs != nullptr && FullyShardSlicesPerRank(graph, buckets)) e.identical = false;
}

// The distinct rank graphs (one when every rank's is the same), each in the
// overlap schedule's order (rank 0's, the same for every rank: checked), and
// the report's collectives in that order.
absl::Status BuildRankGraphs(const Graph& graph, const BatchDimAnalysis& analysis,
                             const ExpandOptions& options,
                             const std::vector<PlannedBucket>& buckets, const FullyShardPlan* fs,
                             const DeferredDivision* dd, Expansion* out) {
  Expansion& e = *out;
  ExpansionReport& rep = e.report;
  const int32_t world = options.world_size;
  // The overlap schedule: one order for every rank. The rank graphs have the
  // same structure, so each rank's own schedule is rank 0's (checked) and
  // they start their collectives in the same order.
  // Identical ranks share one graph: only rank 0's is built.
  ScheduleInfo schedule;
  const int32_t distinct = e.identical ? 1 : world;
  if (options.before_rank_graphs) FXDP_RETURN_IF_ERROR(options.before_rank_graphs(distinct));
  e.distinct_graphs.reserve(distinct);
  for (int32_t r = 0; r < distinct; ++r) {
    RankExpander x(graph, analysis, options, buckets, rep.slices[r], fs, dd);
    FXDP_ASSIGN_OR_RETURN(RankNodes local, x.Run(r == 0 ? &rep.collectives : nullptr));
    if (options.overlap_schedule) {
      // Scheduling reads the edges before the graph is verified: a reference
      // that is not to an earlier node is reported as the verifier does.
      if (!RefsPointBackwards(local.nodes)) {
        absl::Status s = Graph::Create(std::move(local.header), std::move(local.nodes)).status();
        return s.ok() ? absl::InternalError("the expanded graph reads a value before it exists")
                      : s;
      }
      if (r == 0) {
        schedule = OverlapSchedule(local.nodes);
      } else if (OverlapSchedule(local.nodes).order != schedule.order) {
        return absl::InternalError(
            absl::StrCat("rank ", r, "'s expanded graph schedules differently from rank 0's"));
      }
      local.nodes = ReorderNodes(std::move(local.nodes), schedule.order);
    }
    FXDP_ASSIGN_OR_RETURN(Graph g, Graph::Create(std::move(local.header), std::move(local.nodes)));
    FXDP_RETURN_IF_ERROR(CheckRankShapes(g, r));
    e.distinct_graphs.push_back(std::move(g));
  }
  if (options.overlap_schedule) {
    std::vector<int32_t> new_index(schedule.order.size());
    for (size_t k = 0; k < schedule.order.size(); ++k)
      new_index[schedule.order[k]] = static_cast<int32_t>(k);
    for (Collective& c : rep.collectives) c.position = new_index[c.position];
    std::stable_sort(
        rep.collectives.begin(), rep.collectives.end(),
        [](const Collective& a, const Collective& b) { return a.position < b.position; });
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Expansion> ExpandDataParallel(const Graph& graph, const BatchDimAnalysis& analysis,
                                             const ExpandOptions& options) {
  FXDP_RETURN_IF_ERROR(CheckExpandable(graph, analysis, options));
  FXDP_ASSIGN_OR_RETURN(std::vector<PlannedBucket> buckets, PlanBuckets(graph, analysis, options));
  std::optional<FullyShardPlan> fs;
  if (options.style == DataParallelStyle::kFullyShard) {
    FXDP_ASSIGN_OR_RETURN(fs, PlanFullyShard(graph, analysis, options));
  }
  const FullyShardPlan* plan = fs.has_value() ? &*fs : nullptr;
  Expansion e;
  StartReport(graph, analysis, options, buckets, plan, &e);
  // The loss's divisor (cross-entropy's total weight) all-reduced while the backward runs.
  std::string note;
  const std::optional<DeferredDivision> dd = FindDeferredDivision(graph, analysis, &note);
  if (!note.empty()) e.report.notes.push_back(note);
  FXDP_RETURN_IF_ERROR(
      BuildRankGraphs(graph, analysis, options, buckets, plan, dd ? &*dd : nullptr, &e));
  for (const Collective& c : e.report.collectives) {
    ExpansionReport& rep = e.report;
    (c.op == "all_gather_into_tensor"  ? rep.bytes_gathered_per_step
     : c.op == "reduce_scatter_tensor" ? rep.bytes_reduce_scattered_per_step
                                       : rep.bytes_per_step) += c.bytes;
  }
  return e;
}

}  // namespace fxdp
