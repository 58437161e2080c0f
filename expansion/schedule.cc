#include "expansion/schedule.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "analysis/ir/collectives.h"
#include "analysis/op_queries.h"
#include "analysis/op_rules.h"

namespace fxdp {

using ir::Argument;
using ir::Graph;
using ir::Node;
using ir::ValueRef;

namespace {

// The collectives' names: analysis/ir/collectives.h. FULLY_SHARD
// (expansion/fully_shard.h): reduce-scatters are scheduled as all-reduces
// are; all-gathers stay where the expansion put them (one unit ahead of their
// use).
using ir::kAllGather;
using ir::kAllReduce;
using ir::kReduceScatter;
using ir::kWaitTensor;

// Cheap ops that may move up with the all_reduce they alone feed (packing a
// bucket, scaling it): the kPacking trait of their rule (op_rules.h).
bool IsPackingNode(const Node& n) { return n.is_call() && IsPackingOp(n.target); }

// Lists without references (sizes, dims) are left as they are.
void Renumber(Argument& a, const std::vector<int32_t>& new_index) {
  if (const ValueRef* r = a.get_if<ValueRef>()) {
    a = Argument(ValueRef{ir::NodeId{new_index[r->node.value]}, r->output});
  } else if (a.is_list() && a.HasRef()) {
    Argument::List l = a.as<Argument::List>();
    for (Argument& e : l) Renumber(e, new_index);
    a = Argument(std::move(l));
  }
}

void RenumberNode(Node& node, const std::vector<int32_t>& new_index) {
  for (Argument& a : node.args) Renumber(a, new_index);
  for (ir::KeywordArgument& kw : node.kwargs) Renumber(kw.value, new_index);
}

// What each node is, looked up once.
enum : uint8_t {
  kIsAllReduce = 1,  // an all_reduce or reduce_scatter
  kIsWait = 2,
  kIsPacking = 4,
  kIsInput = 8,
  kIsOutput = 16,
  kIsGather = 32  // an all_gather, or (AnchorGathers) packing only gathers read
};

std::vector<uint8_t> Classify(const std::vector<Node>& nodes) {
  std::vector<uint8_t> what(nodes.size(), 0);
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& node = nodes[i];
    if (node.is_call()) {
      if (node.target.name == kAllReduce || node.target.name == kReduceScatter)
        what[i] |= kIsAllReduce;
      if (node.target.name == kAllGather) what[i] |= kIsGather;
      if (node.target.name == kWaitTensor) what[i] |= kIsWait;
      if (IsPackingNode(node)) what[i] |= kIsPacking;
    } else if (node.is_output()) {
      what[i] |= kIsOutput;
    } else {
      what[i] |= kIsInput;
    }
  }
  return what;
}

struct Range {
  const int32_t* b;
  const int32_t* e;
  const int32_t* begin() const { return b; }
  const int32_t* end() const { return e; }
  size_t size() const { return static_cast<size_t>(e - b); }
  bool empty() const { return b == e; }
};

// Producers and users of every node (distinct), as flat adjacency arrays.
class Edges {
 public:
  explicit Edges(const std::vector<Node>& nodes) {
    const int32_t n = static_cast<int32_t>(nodes.size());
    pred_begin_.assign(n + 1, 0);
    pred_list_.reserve(2 * static_cast<size_t>(n));
    std::vector<int32_t> scratch;
    for (int32_t i = 0; i < n; ++i) {
      scratch.clear();
      nodes[i].ForEachInput([&](ValueRef r) { scratch.push_back(r.node.value); });
      std::sort(scratch.begin(), scratch.end());
      scratch.erase(std::unique(scratch.begin(), scratch.end()), scratch.end());
      pred_list_.insert(pred_list_.end(), scratch.begin(), scratch.end());
      pred_begin_[i + 1] = static_cast<int32_t>(pred_list_.size());
    }
    user_begin_.assign(n + 1, 0);
    user_list_.resize(pred_list_.size());
    for (int32_t p : pred_list_) ++user_begin_[p + 1];
    for (int32_t i = 0; i < n; ++i) user_begin_[i + 1] += user_begin_[i];
    std::vector<int32_t> fill(user_begin_.begin(), user_begin_.end() - 1);
    for (int32_t i = 0; i < n; ++i)
      for (int32_t k = pred_begin_[i]; k < pred_begin_[i + 1]; ++k)
        user_list_[fill[pred_list_[k]]++] = i;
  }
  Range preds(int32_t i) const {
    return Range{pred_list_.data() + pred_begin_[i], pred_list_.data() + pred_begin_[i + 1]};
  }
  Range users(int32_t i) const {
    return Range{user_list_.data() + user_begin_[i], user_list_.data() + user_begin_[i + 1]};
  }

 private:
  std::vector<int32_t> pred_begin_, pred_list_, user_begin_, user_list_;
};

// Which nodes (transitively) feed an all_reduce: reverse topological order.
std::vector<bool> FeedsAllReduce(const Edges& edges, const std::vector<uint8_t>& what) {
  const int32_t n = static_cast<int32_t>(what.size());
  std::vector<bool> feeds(n, false);
  for (int32_t i = n - 1; i >= 0; --i) {
    for (int32_t u : edges.users(i)) feeds[i] = feeds[i] || (what[u] & kIsAllReduce) || feeds[u];
  }
  return feeds;
}

// Each node's effective position: its own index, or for a hoisted node (an
// all_reduce, or packing whose every user is hoisted) the latest of its
// producers' and the last graph input's (nothing moves above the inputs).
std::vector<int32_t> HoistedPositions(const Edges& edges, const std::vector<uint8_t>& what,
                                      int32_t* hoisted) {
  const int32_t n = static_cast<int32_t>(what.size());
  std::vector<bool> hoist(n, false);
  for (int32_t i = n - 1; i >= 0; --i) {
    if ((what[i] & kIsAllReduce)) {
      hoist[i] = true;
    } else if ((what[i] & kIsPacking) && !edges.users(i).empty()) {
      hoist[i] = [&] {
        for (int32_t u : edges.users(i))
          if (!hoist[u]) return false;
        return true;
      }();
    }
  }
  int32_t last_input = -1;
  for (int32_t i = 0; i < n; ++i) {
    if (what[i] & kIsInput) last_input = i;
  }
  std::vector<int32_t> eff(n);
  *hoisted = 0;
  for (int32_t i = 0; i < n; ++i) {
    eff[i] = i;
    if (!hoist[i]) continue;
    eff[i] = last_input;
    for (int32_t p : edges.preds(i)) eff[i] = std::max(eff[i], eff[p]);
    ++*hoisted;
  }
  return eff;
}

constexpr int32_t kNone = std::numeric_limits<int32_t>::max();

// The all_reduces in the order they can start (hoisted position): `starts`,
// and each one's rank in it (kNone for other nodes); every node's priority is
// the first of them it feeds (kNone: none), so that the nodes a collective
// needs run before those only later collectives need.
struct Priorities {
  std::vector<int32_t> starts, start_rank, first;
};

Priorities CollectivePriorities(const Edges& edges, const std::vector<uint8_t>& what,
                                const std::vector<int32_t>& eff) {
  const int32_t n = static_cast<int32_t>(what.size());
  Priorities p;
  for (int32_t i = 0; i < n; ++i)
    if ((what[i] & kIsAllReduce)) p.starts.push_back(i);
  std::sort(p.starts.begin(), p.starts.end(),
            [&](int32_t a, int32_t b) { return std::tie(eff[a], a) < std::tie(eff[b], b); });
  p.first.assign(n, kNone);
  p.start_rank.assign(n, kNone);
  for (int32_t k = 0; k < static_cast<int32_t>(p.starts.size()); ++k) {
    p.first[p.starts[k]] = k;
    p.start_rank[p.starts[k]] = k;
  }
  for (int32_t i = n - 1; i >= 0; --i) {
    for (int32_t u : edges.users(i)) p.first[i] = std::min(p.first[i], p.first[u]);
  }
  return p;
}

// Deferrable waits get levels in the order their all_reduces start (so a
// scheduled graph schedules to itself), those only outputs read the last;
// graph inputs (placeholders, get_attr) keep their places at the top (-1).
std::vector<int32_t> WaitLevels(const Edges& edges, const std::vector<uint8_t>& what,
                                const std::vector<bool>& feeds, const Priorities& p,
                                int32_t* deferred_waits) {
  const int32_t n = static_cast<int32_t>(what.size());
  std::vector<int32_t> level(n, 0);
  for (int32_t i = 0; i < n; ++i) {
    for (int32_t q : edges.preds(i)) level[i] = std::max(level[i], level[q]);
    if ((what[i] & kIsWait) && !feeds[i] && edges.preds(i).size() == 1 &&
        (what[*edges.preds(i).begin()] & kIsAllReduce)) {
      // Waits only the graph's outputs read (the loss) go last.
      bool output_only = true;
      for (int32_t u : edges.users(i)) output_only = output_only && (what[u] & kIsOutput);
      const int32_t l = output_only ? static_cast<int32_t>(p.starts.size()) + 1
                                    : 1 + p.start_rank[*edges.preds(i).begin()];
      level[i] = std::max(level[i], l);
      ++*deferred_waits;
    }
  }
  for (int32_t i = 0; i < n; ++i) {
    if (what[i] & kIsInput) level[i] = -1;
  }
  return level;
}

// (level, first, eff, index) never decreases along an edge and the index
// breaks ties: sorting by it is a topological order.
struct Key {
  int32_t level, first, eff, index;
};

// All-gathers (and the packing that only feeds them) keep their place: right
// after the node before them (or their last producer), unless their own key is earlier.
// Lowering a key never breaks an edge: their users' keys are at least their own, their
// producers' at most the anchor.
void AnchorGathers(const Edges& edges, std::vector<uint8_t>& what, std::vector<Key>& keys) {
  const int32_t n = static_cast<int32_t>(what.size());
  for (int32_t i = n - 1; i >= 1; --i) {
    bool anchored = (what[i] & kIsGather) != 0;
    if (!anchored && (what[i] & kIsPacking) && !edges.users(i).empty()) {
      anchored = true;
      for (int32_t u : edges.users(i)) anchored = anchored && (what[u] & kIsGather);
    }
    if (anchored) what[i] |= kIsGather;
  }
  for (int32_t i = 1; i < n; ++i) {
    if (!(what[i] & kIsGather) || (what[i] & kIsInput)) continue;
    // Never above a producer: the node before may be a hoisted all_reduce (a bucket that
    // ended right before a mean-scaled gradient's gather), whose key is earlier than the
    // gathered value's.
    Key anchor{std::max(keys[i - 1].level, 0), keys[i - 1].first, keys[i - 1].eff, i};
    for (int32_t p : edges.preds(i)) {
      if (std::tie(keys[p].level, keys[p].first, keys[p].eff) >
          std::tie(anchor.level, anchor.first, anchor.eff)) {
        anchor = Key{keys[p].level, keys[p].first, keys[p].eff, i};
      }
    }
    if (std::tie(anchor.level, anchor.first, anchor.eff) <
        std::tie(keys[i].level, keys[i].first, keys[i].eff)) {
      keys[i] = anchor;
    }
  }
}

}  // namespace

ScheduleInfo OverlapSchedule(const Graph& g) { return OverlapSchedule(g.nodes()); }

ScheduleInfo OverlapSchedule(const std::vector<Node>& nodes) {
  const int32_t n = static_cast<int32_t>(nodes.size());
  std::vector<uint8_t> what = Classify(nodes);
  const Edges edges(nodes);
  const std::vector<bool> feeds = FeedsAllReduce(edges, what);
  ScheduleInfo info;
  const std::vector<int32_t> eff = HoistedPositions(edges, what, &info.hoisted);
  const Priorities p = CollectivePriorities(edges, what, eff);
  const std::vector<int32_t> level = WaitLevels(edges, what, feeds, p, &info.deferred_waits);
  std::vector<Key> keys(n);
  // Graph inputs keep their order (every one at level -1, ordered by index alone): the
  // placeholders' order is the step's signature, which callers bind inputs by.
  for (int32_t i = 0; i < n; ++i) {
    keys[i] = (what[i] & kIsInput) ? Key{-1, -1, -1, i} : Key{level[i], p.first[i], eff[i], i};
  }
  AnchorGathers(edges, what, keys);
  std::sort(keys.begin(), keys.end(), [](const Key& a, const Key& b) {
    return std::tie(a.level, a.first, a.eff, a.index) < std::tie(b.level, b.first, b.eff, b.index);
  });
  info.order.resize(n);
  for (int32_t k = 0; k < n; ++k) info.order[k] = keys[k].index;
  for (int32_t k = 0; k < n; ++k) info.moved += info.order[k] != k;
  return info;
}

absl::StatusOr<Graph> Reorder(const Graph& g, const std::vector<int32_t>& order) {
  const int32_t n = g.size();
  if (static_cast<int32_t>(order.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("the order has ", order.size(), " entries, the graph ", n, " nodes"));
  }
  std::vector<int32_t> new_index(n, -1);
  for (int32_t k = 0; k < n; ++k) {
    const int32_t old = order[k];
    if (old < 0 || old >= n || new_index[old] >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("the order is not a permutation (entry ", k, " is ", old, ")"));
    }
    new_index[old] = k;
  }
  std::vector<Node> nodes;
  nodes.reserve(n);
  for (int32_t k = 0; k < n; ++k) {
    Node node = g.nodes()[order[k]];
    RenumberNode(node, new_index);
    nodes.push_back(std::move(node));
  }
  return Graph::Create(g.header(), std::move(nodes));
}

std::vector<Node> ReorderNodes(std::vector<Node> nodes, const std::vector<int32_t>& order) {
  const int32_t n = static_cast<int32_t>(nodes.size());
  std::vector<int32_t> new_index(n);
  for (int32_t k = 0; k < n; ++k) new_index[order[k]] = k;
  std::vector<Node> out;
  out.reserve(n);
  for (int32_t k = 0; k < n; ++k) {
    out.push_back(std::move(nodes[order[k]]));
    RenumberNode(out.back(), new_index);
  }
  return out;
}

}  // namespace fxdp
