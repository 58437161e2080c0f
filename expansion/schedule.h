// Overlap scheduling of an expanded graph: a deterministic reordering of its
// nodes so that communication overlaps more compute.
//
// The expansion places each bucket's all_reduce right after its last gradient
// and its wait_tensor right before the first use of any of its gradients. In a
// training step that first use is the optimizer, which reads the parameters in
// model order: DDP-like, every update waits for the bucket of the first
// parameter, which is the last bucket backward produces. OverlapSchedule moves
// work instead of waits:
//
//   * A wait whose result feeds no collective ("deferrable": in a training
//     step, the bucket waits and the loss/statistics waits at the output) gets
//     a level: 1 + the position of its all_reduce in the order the
//     all_reduces start (below); waits only the graph's outputs read (the
//     loss) get the highest level and come last. Every node's level is the highest level among
//     the deferrable waits it depends on (0 for none). Nodes are ordered by
//     level first: everything that does not need a reduced gradient (forward,
//     backward, every all_reduce start, the optimizer's work on its own state
//     such as Adam's `exp_avg_sq * beta2` and the bias corrections) runs
//     before the first deferrable wait; then the first bucket's wait and the
//     updates that need nothing later, then the next bucket's, ... The last
//     bucket's updates come last, and bucket k's updates run while the
//     all-reduces of later buckets are in flight.
//   * Within level 0, the nodes that feed an all_reduce run in the order of
//     the first all_reduce they feed, so each collective starts as soon as its
//     inputs can be computed (in backward: a bucket's gradients before the
//     input gradients only later buckets need). The all_reduces are ordered
//     by where they can start: an all_reduce and the cheap nodes that exist
//     only to feed it (reshape/view/cat/mul/div: the bucket packing and
//     scaling) move up to right after their last input, so the loss all-reduce
//     (emitted with the outputs) starts as soon as the loss is known. Then
//     the rest, in the original order.
//   * Waits that feed a collective (an all-reduce in the forward pass) and
//     everything else keep their relative order.
//
// The result is a topological order (a node's sort key is never below its
// inputs'), depends only on the graph's structure (node kinds, targets and
// edges; not on shapes), so every rank of an expansion, even with uneven
// splits, gets the same order and starts its collectives in the same order.
// A scheduled graph schedules to itself. Random ops can change their
// relative order only if they feed different collectives.
#ifndef FXDP_EXPANSION_SCHEDULE_H_
#define FXDP_EXPANSION_SCHEDULE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "analysis/ir/graph.h"

namespace fxdp {

struct ScheduleInfo {
  std::vector<int32_t> order;  // order[new position] = old node index
  int32_t deferred_waits = 0;  // waits that got a level
  int32_t hoisted = 0;         // nodes moved up with their all_reduce
  int32_t moved = 0;           // nodes whose position changed
};

// The overlap order of `g` (see above). Never fails on a verified graph.
ScheduleInfo OverlapSchedule(const ir::Graph& g);
// The same on a graph's nodes before they are verified as a graph. Requires
// every reference to be to an output of an earlier node.
ScheduleInfo OverlapSchedule(const std::vector<ir::Node>& nodes);

// `g` with its nodes in `order` (order[new] = old index; a permutation that
// keeps placeholders before everything else and the output node last), every
// reference renumbered. Fails if the order is not topological.
absl::StatusOr<ir::Graph> Reorder(const ir::Graph& g, const std::vector<int32_t>& order);

// Reorder() on nodes, unverified: `order` must be a permutation of their
// indices. The nodes are moved, not copied.
std::vector<ir::Node> ReorderNodes(std::vector<ir::Node> nodes, const std::vector<int32_t>& order);

}  // namespace fxdp

#endif  // FXDP_EXPANSION_SCHEDULE_H_
