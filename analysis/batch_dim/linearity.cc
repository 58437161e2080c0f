// Linearity: how partial and mean-scaled operands flow through an op.
#include "analysis/batch_dim/analyzer.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "analysis/deferred_division.h"
#include "analysis/ir/node_error.h"
#include "util/status_macros.h"

namespace fxdp {

using ir::Argument;
using ir::Graph;
using ir::Node;
using ir::NodeId;
using ir::TensorType;
using ir::ValueRef;

// A fresh zero tensor (an op with the kZeros trait: zeros, new_zeros,
// zeros_like): adding a partial value to it keeps the sum partial.
bool BatchDimAnalyzer::IsZeros(ValueRef r) const {
  const Node& n = g_.node(r.node);
  if (!n.is_call()) return false;
  const OpRule* rule = FindOpRule(n.target);
  return rule != nullptr && rule->has(kZeros);
}

bool BatchDimAnalyzer::InMask(const LinearIn& linear, int arg) {
  return arg < 8 && ((linear.args >> arg) & 1);
}

absl::Status BatchDimAnalyzer::ScaledError(NodeId id, const Node& n, const Operand& o,
                                           absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s: arg %d (%s) is a batch value scaled by a mean over the local batch "
      "(it descends from a mean-reduced loss); %s. Reduce the loss by sum, or keep this op "
      "out of the backward path",
      ir::NodeLabel(n), o.arg, g_.node(o.ref.node).name, why));
}

// Linear's mean-scaled shard operands: two multiplied together are an error;
// added to a value at true scale (or a number), each is read times B_r/B (a
// sharded read) and the result is at true scale; else the result is scaled.
absl::Status BatchDimAnalyzer::ScaledShards(NodeId id, const Node& n, const LinearIn& linear,
                                            std::vector<Operand>& ops, int exempt_arg, Special& s) {
  int n_scaled = 0;
  for (const Operand& o : ops) {
    if (o.arg == exempt_arg || !IsSpecial(o.info)) continue;
    ++n_scaled;
    if (linear.kind == Linearity::kMultilinear && n_scaled > 1) {
      return ScaledError(id, n, o, "it is multiplied by another mean-scaled value");
    }
  }
  bool true_scale_term = linear.kind == Linearity::kAdditive && AddsNumber(n, linear);
  for (const Operand& o : ops) {
    true_scale_term |= linear.kind == Linearity::kAdditive && o.arg != exempt_arg &&
                       InMask(linear, o.arg) && !IsSpecial(o.info) && o.type->numel() > 0 &&
                       !IsZeros(o.ref);
  }
  if (true_scale_term) {
    // Added to a value at true scale (or a number): this use reads each mean-scaled shard
    // times B_r/B (the rank's rows at one device's scale), and the sum is at true scale.
    for (Operand& o : ops) {
      if (o.arg == exempt_arg || !IsSpecial(o.info)) continue;
      a_.sharded_reads_.push_back(
          ShardedRead{o.ref, o.info.placement.dim, o.info.outer, id, o.arg, /*unscale=*/true});
      a_.notes_.push_back(absl::StrFormat(
          "%s: reads %s (mean-scaled: rank r holds B/B_r times its rows) times B_r/B, the one "
          "device's scale, to add it to a value at that scale",
          n.name, g_.node(o.ref.node).name));
      o.info.mean_scaled = false;
    }
  } else {
    s.scaled = true;
  }
  return absl::OkStatus();
}

// Applies the op's linearity to its operands. Partial operands that may not
// flow through are all-reduced (and read replicated from then on); a
// mean-scaled operand the op is not linear in is an error.
absl::StatusOr<BatchDimAnalyzer::Special> BatchDimAnalyzer::Linear(NodeId id, const Node& n,
                                                                   const LinearIn& linear,
                                                                   std::vector<Operand>& ops,
                                                                   int exempt_arg) {
  Special s;
  int specials = 0;
  for (Operand& o : ops) {
    if (!IsSpecial(o.info) || o.arg == exempt_arg) continue;
    if (!InMask(linear, o.arg) || linear.kind == Linearity::kNone) {
      if (o.info.placement.is_partial()) {
        RequireWhole(o.ref, id);
        o.info = kReplicated;
        continue;
      }
      return ScaledError(id, n, o, "the op is not linear in it");
    }
    ++specials;
  }
  if (specials == 0) return s;
  // Partial operands next to anything they cannot be combined with are reduced.
  bool any_partial = false, any_scaled_shard = false, other_linear = false;
  bool other_shard = false;
  bool avg = false, sum = false;
  for (const Operand& o : ops) {
    if (o.arg == exempt_arg) continue;
    if (o.info.placement.is_partial()) {
      any_partial = true;
      (o.info.mean_scaled ? avg : sum) = true;
    } else if (IsSpecial(o.info)) {
      any_scaled_shard = true;
    } else {
      if (InMask(linear, o.arg) && !IsZeros(o.ref)) other_linear = true;
      if (o.info.placement.is_shard()) other_shard = true;
    }
  }
  // A number added to a partial value is added on every rank (x + 1.0): a replicated term.
  if (AddsNumber(n, linear)) other_linear = true;
  bool reduce_partials = false;
  if (any_partial) {
    if (any_scaled_shard || (avg && sum)) reduce_partials = true;
    if (linear.kind == Linearity::kAdditive && other_linear) reduce_partials = true;
    if (linear.kind == Linearity::kMultilinear) {
      int n_partial = 0;
      for (const Operand& o : ops)
        n_partial += o.info.placement.is_partial() && o.arg != exempt_arg;
      if (n_partial > 1 || other_shard) reduce_partials = true;
    }
  }
  if (reduce_partials) {
    for (Operand& o : ops) {
      if (o.info.placement.is_partial() && o.arg != exempt_arg) {
        RequireWhole(o.ref, id);
        o.info = kReplicated;
      }
    }
    any_partial = false;
  }
  if (any_scaled_shard) FXDP_RETURN_IF_ERROR(ScaledShards(id, n, linear, ops, exempt_arg, s));
  if (any_partial) {
    s.partial = true;
    s.scaled = avg;
  }
  return s;
}

}  // namespace fxdp
