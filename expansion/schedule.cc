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

}  // namespace

ScheduleInfo OverlapSchedule(const Graph& g) { return OverlapSchedule(g.nodes()); }

ScheduleInfo OverlapSchedule(const std::vector<Node>& nodes) {
  const int32_t n = static_cast<int32_t>(nodes.size());
  // What each node is, looked up once.
  enum : uint8_t {
    kIsAllReduce = 1,
    kIsWait = 2,
    kIsPacking = 4,
    kIsInput = 8,
    kIsOutput = 16,
    kIsGather = 32
  };
  std::vector<uint8_t> what(n, 0);
  for (int32_t i = 0; i < n; ++i) {
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
  // Producers and users of every node (distinct), as flat adjacency arrays.
  std::vector<int32_t> pred_begin(n + 1, 0), pred_list;
  pred_list.reserve(2 * static_cast<size_t>(n));
  std::vector<int32_t> scratch;
  for (int32_t i = 0; i < n; ++i) {
    scratch.clear();
    nodes[i].ForEachInput([&](ValueRef r) { scratch.push_back(r.node.value); });
    std::sort(scratch.begin(), scratch.end());
    scratch.erase(std::unique(scratch.begin(), scratch.end()), scratch.end());
    pred_list.insert(pred_list.end(), scratch.begin(), scratch.end());
    pred_begin[i + 1] = static_cast<int32_t>(pred_list.size());
  }
  std::vector<int32_t> user_begin(n + 1, 0), user_list(pred_list.size());
  for (int32_t p : pred_list) ++user_begin[p + 1];
  for (int32_t i = 0; i < n; ++i) user_begin[i + 1] += user_begin[i];
  {
    std::vector<int32_t> fill(user_begin.begin(), user_begin.end() - 1);
    for (int32_t i = 0; i < n; ++i)
      for (int32_t k = pred_begin[i]; k < pred_begin[i + 1]; ++k)
        user_list[fill[pred_list[k]]++] = i;
  }
  struct Range {
    const int32_t* b;
    const int32_t* e;
    const int32_t* begin() const { return b; }
    const int32_t* end() const { return e; }
    size_t size() const { return static_cast<size_t>(e - b); }
    bool empty() const { return b == e; }
  };
  auto preds_of = [&](int32_t i) {
    return Range{pred_list.data() + pred_begin[i], pred_list.data() + pred_begin[i + 1]};
  };
  auto users_of = [&](int32_t i) {
    return Range{user_list.data() + user_begin[i], user_list.data() + user_begin[i + 1]};
  };

  // Which nodes (transitively) feed an all_reduce: reverse topological order.
  std::vector<bool> feeds(n, false);
  for (int32_t i = n - 1; i >= 0; --i) {
    for (int32_t u : users_of(i)) feeds[i] = feeds[i] || (what[u] & kIsAllReduce) || feeds[u];
  }
  // Hoisted: all_reduces and the packing nodes whose every user is hoisted.
  std::vector<bool> hoist(n, false);
  for (int32_t i = n - 1; i >= 0; --i) {
    if ((what[i] & kIsAllReduce)) {
      hoist[i] = true;
    } else if ((what[i] & kIsPacking) && !users_of(i).empty()) {
      hoist[i] = [&] {
        for (int32_t u : users_of(i))
          if (!hoist[u]) return false;
        return true;
      }();
    }
  }
  // Graph inputs stay first: nothing is hoisted above the last one.
  int32_t last_input = -1;
  for (int32_t i = 0; i < n; ++i) {
    if (what[i] & kIsInput) last_input = i;
  }
  std::vector<int32_t> eff(n);
  int32_t hoisted = 0;
  for (int32_t i = 0; i < n; ++i) {
    eff[i] = i;
    if (!hoist[i]) continue;
    eff[i] = last_input;
    for (int32_t p : preds_of(i)) eff[i] = std::max(eff[i], eff[p]);
    ++hoisted;
  }

  // The all_reduces in the order they can start (hoisted position); every
  // node's priority is the first of them it feeds (kNone: none), so that the
  // nodes a collective needs run before those only later collectives need.
  std::vector<int32_t> starts;
  for (int32_t i = 0; i < n; ++i)
    if ((what[i] & kIsAllReduce)) starts.push_back(i);
  std::sort(starts.begin(), starts.end(),
            [&](int32_t a, int32_t b) { return std::tie(eff[a], a) < std::tie(eff[b], b); });
  constexpr int32_t kNone = std::numeric_limits<int32_t>::max();
  std::vector<int32_t> first(n, kNone), start_rank(n, kNone);
  for (int32_t k = 0; k < static_cast<int32_t>(starts.size()); ++k) {
    first[starts[k]] = k;
    start_rank[starts[k]] = k;
  }
  for (int32_t i = n - 1; i >= 0; --i) {
    for (int32_t u : users_of(i)) first[i] = std::min(first[i], first[u]);
  }

  // Deferrable waits get levels in the order their all_reduces start (so a
  // scheduled graph schedules to itself), those only outputs read the last.
  ScheduleInfo info;
  std::vector<int32_t> level(n, 0);
  for (int32_t i = 0; i < n; ++i) {
    for (int32_t p : preds_of(i)) level[i] = std::max(level[i], level[p]);
    if ((what[i] & kIsWait) && !feeds[i] && preds_of(i).size() == 1 &&
        (what[*preds_of(i).begin()] & kIsAllReduce)) {
      // Waits only the graph's outputs read (the loss) go last.
      bool output_only = true;
      for (int32_t u : users_of(i)) output_only = output_only && (what[u] & kIsOutput);
      const int32_t l = output_only ? static_cast<int32_t>(starts.size()) + 1
                                    : 1 + start_rank[*preds_of(i).begin()];
      level[i] = std::max(level[i], l);
      ++info.deferred_waits;
    }
  }
  // Graph inputs (placeholders, get_attr) keep their places at the top.
  for (int32_t i = 0; i < n; ++i) {
    if (what[i] & kIsInput) level[i] = -1;
  }
  // (level, first, eff, index) never decreases along an edge and the index
  // breaks ties: sorting by it is a topological order.
  info.hoisted = hoisted;
  struct Key {
    int32_t level, first, eff, index;
  };
  std::vector<Key> keys(n);
  for (int32_t i = 0; i < n; ++i) keys[i] = Key{level[i], first[i], eff[i], i};
  // All-gathers (and the packing that only feeds them) keep their place: right
  // after the node before them, unless their own key is earlier. Lowering a
  // key never breaks an edge: their users' keys are at least their own.
  for (int32_t i = n - 1; i >= 1; --i) {
    bool anchored = (what[i] & kIsGather) != 0;
    if (!anchored && (what[i] & kIsPacking) && !users_of(i).empty()) {
      anchored = true;
      for (int32_t u : users_of(i)) anchored = anchored && (what[u] & kIsGather);
    }
    if (anchored) what[i] |= kIsGather;
  }
  for (int32_t i = 1; i < n; ++i) {
    if (!(what[i] & kIsGather) || (what[i] & kIsInput)) continue;
    const Key& prev = keys[i - 1];
    const Key anchor{std::max(prev.level, 0), prev.first, prev.eff, i};
    if (std::tie(anchor.level, anchor.first, anchor.eff) <
        std::tie(keys[i].level, keys[i].first, keys[i].eff)) {
      keys[i] = anchor;
    }
  }
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
