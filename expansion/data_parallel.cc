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

absl::StatusOr<std::vector<PlannedBucket>> PlanBuckets(const Graph& g, const BatchDimAnalysis& a,
                                                       const ExpandOptions& o) {
  std::vector<const Reduction*> grads;
  for (const Reduction& r : a.reductions()) {
    if (!r.grad_of.empty()) grads.push_back(&r);
  }
  std::sort(grads.begin(), grads.end(),
            [](const Reduction* x, const Reduction* y) { return x->value.node < y->value.node; });
  std::vector<PlannedBucket> buckets;
  const auto cap = [&](size_t index) {
    return static_cast<int64_t>((index == 0 ? o.first_bucket_mb : o.bucket_cap_mb) * 1024 * 1024);
  };
  PlannedBucket cur;
  auto close = [&]() {
    if (cur.values.empty()) return;
    cur.info.index = static_cast<int32_t>(buckets.size());
    cur.info.start_after = g.node(NodeId{cur.start}).name;
    cur.info.wait_before = g.node(NodeId{cur.wait}).name;
    cur.info.start_position = cur.start;
    cur.info.wait_position = cur.wait;
    buckets.push_back(std::move(cur));
    cur = PlannedBucket{};
  };
  for (const Reduction* r : grads) {
    const TensorType* t = g.type(r->value).is_tensor() ? &g.type(r->value).tensor : nullptr;
    if (t == nullptr) continue;
    const int32_t produced = r->value.node.value;
    const int32_t first_use = r->first_use.valid() ? r->first_use.value : g.size() - 1;
    if (!cur.values.empty()) {
      const TensorType& head = g.type(cur.values[0]).tensor;
      if (produced >= cur.wait || head.dtype != t->dtype || head.device != t->device ||
          cur.info.op != r->op || cur.info.bytes >= cap(buckets.size())) {
        close();
      }
    }
    if (cur.values.empty()) {
      cur.info.op = r->op;
      cur.wait = first_use;
    }
    cur.values.push_back(r->value);
    cur.produced.push_back(produced);
    cur.first_use.push_back(first_use);
    cur.info.gradients.push_back(r->grad_of);
    cur.info.bytes += Bytes(*t);
    cur.start = std::max(cur.start, produced);
    cur.wait = std::min(cur.wait, first_use);
  }
  close();
  // The tail: the last bucket is split again from its end, with DDP's rule
  // (a bucket closes once it reaches its cap) and caps last_bucket_mb,
  // 2 * last_bucket_mb, 4 * ... (at most bucket_cap_mb); the front piece
  // left over is a bucket of its own if it holds at least half its cap.
  if (o.last_bucket_mb > 0 && !buckets.empty() && buckets.back().values.size() > 1) {
    PlannedBucket last = std::move(buckets.back());
    buckets.pop_back();
    const int64_t max_cap = static_cast<int64_t>(o.bucket_cap_mb * 1024 * 1024);
    int64_t piece_cap = static_cast<int64_t>(o.last_bucket_mb * 1024 * 1024);
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
      cur = PlannedBucket{};
      cur.info.op = last.info.op;
      cur.wait = g.size() - 1;
      for (size_t k = it->first; k < it->second; ++k) {
        cur.values.push_back(last.values[k]);
        cur.produced.push_back(last.produced[k]);
        cur.first_use.push_back(last.first_use[k]);
        cur.info.gradients.push_back(last.info.gradients[k]);
        cur.info.bytes += Bytes(g.type(last.values[k]).tensor);
        cur.start = std::max(cur.start, last.produced[k]);
        cur.wait = std::min(cur.wait, last.first_use[k]);
      }
      close();
    }
  }
  return buckets;
}

absl::StatusOr<Expansion> ExpandDataParallel(const Graph& graph, const BatchDimAnalysis& analysis,
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
  // Micro-batches (batch_dim.h): rank r splits its own rows into k pieces of
  // s_r, as DDP with no_sync() does; the workers hand rank r its balanced
  // slice of the k * s rows, which is k * s_r only when N divides s.
  if (const int64_t k = analysis.micro_batches(); k > 1 && batch % world != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the step splits its batch of %d samples into %d micro-batches of %d; over %d ranks each "
        "rank's rows must split into %d equal micro-batches, so the micro-batch size must be a "
        "multiple of the world size (make the batch a multiple of %d)",
        k * batch, k, batch, world, k, k * world));
  }
  bool any_grad = false;
  for (const Node& n : graph.nodes()) any_grad |= !n.grad_of.empty();
  if (!any_grad) {
    return absl::InvalidArgumentError(
        "the graph marks no gradients (no node has grad_of): nothing to all-reduce; trace it "
        "with fxdp.trace");
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
  FXDP_ASSIGN_OR_RETURN(std::vector<PlannedBucket> buckets, PlanBuckets(graph, analysis, options));
  std::optional<FullyShardPlan> fs;
  if (options.style == DataParallelStyle::kFullyShard) {
    FXDP_ASSIGN_OR_RETURN(fs, PlanFullyShard(graph, analysis, options));
  }

  Expansion e;
  ExpansionReport& rep = e.report;
  rep.world_size = world;
  rep.style = options.style;
  if (fs.has_value()) ReportFullyShard(*fs, &e);
  rep.batch_size = batch;
  rep.slices = SplitBatch(batch, world);
  rep.sharded_reads = static_cast<int32_t>(analysis.sharded_reads().size());
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
  e.identical = batch % world == 0 && analysis.sharded_reads().empty();
  if (fs.has_value() && FullyShardSlicesPerRank(graph, buckets)) e.identical = false;
  // The overlap schedule: one order for every rank. The rank graphs have the
  // same structure, so each rank's own schedule is rank 0's (checked) and
  // they start their collectives in the same order.
  // Identical ranks share one graph: only rank 0's is built.
  ScheduleInfo schedule;
  const int32_t distinct = e.identical ? 1 : world;
  if (options.before_rank_graphs) FXDP_RETURN_IF_ERROR(options.before_rank_graphs(distinct));
  e.distinct_graphs.reserve(distinct);
  for (int32_t r = 0; r < distinct; ++r) {
    RankExpander x(graph, analysis, options, buckets, rep.slices[r],
                   fs.has_value() ? &*fs : nullptr);
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
  for (const Collective& c : rep.collectives) rep.bytes_per_step += c.bytes;
  return e;
}

}  // namespace fxdp
