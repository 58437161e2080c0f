// Einsum-like products.
#include "analysis/batch_dim/analyzer.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "util/status_macros.h"

namespace fxdp {

using ir::Argument;
using ir::Graph;
using ir::Node;
using ir::NodeId;
using ir::TensorType;
using ir::ValueRef;

namespace {

// A label of MatmulLabels: 'k' for a letter, "broadcast dim i" for 1000 + i.
std::string LabelName(int label) {
  return label >= 1000 ? absl::StrCat("broadcast dim ", label - 1000)
                       : absl::StrCat("'", std::string(1, static_cast<char>(label)), "'");
}

// The rank of each positional tensor argument (-1 where there is none), as MatmulSpec::Bind
// takes them.
std::vector<int64_t> PositionalRanks(const std::vector<Operand>& ops) {
  std::vector<int64_t> ranks;
  for (const Operand& o : ops) {
    if (o.arg >= 64 || o.elem >= 0) continue;
    if (o.arg >= static_cast<int>(ranks.size())) ranks.resize(o.arg + 1, -1);
    if (ranks[o.arg] < 0) ranks[o.arg] = o.type->rank();
  }
  return ranks;
}

// The label of operand `o`'s dim `dim` (a bias is right-aligned against its labels), or -1.
int OperandLabel(const MatmulLabels& labels, const Operand& o, int64_t dim) {
  for (size_t i = 0; i < labels.args.size(); ++i) {
    if (labels.args[i] != o.arg) continue;
    const auto& l = labels.operands[i];
    const int64_t shift = static_cast<int64_t>(l.size()) - o.type->rank();
    if (shift < 0 || dim + shift >= static_cast<int64_t>(l.size())) return -1;
    return l[dim + shift];
  }
  return -1;
}

// Where the sharded operands of a product put the batch: its label (-1: no operand holds the
// batch), its blocks and the operand that decided them.
struct ProductBatch {
  int label = -1;
  int64_t outer = 1;
  const Operand* decided = nullptr;
};

// INVALID_ARGUMENT (the message only) when a sharded operand's dim has no label, or two put the
// batch on different labels or blocks.
absl::StatusOr<ProductBatch> FindProductBatch(
    const Graph& g, const OpRule& rule, const std::vector<Operand>& ops,
    const std::function<int(const Operand&, int64_t)>& label_of) {
  ProductBatch b;
  for (const Operand& o : ops) {
    if (!o.info.placement.is_shard()) continue;
    const int l = label_of(o, o.info.placement.dim);
    if (l < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("arg %d has an unexpected rank %d for the product %s", o.arg,
                          o.type->rank(), rule.spec.ToString()));
    }
    if (b.label < 0) {
      b = ProductBatch{l, o.info.outer, &o};
    } else if (b.label != l || b.outer != o.info.outer) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "operands put the batch on different dims of the product %s: arg %d (%s) on its dim "
          "%d (label %s, %d blocks), arg %d (%s) on its dim %d (label %s, %d blocks); samples "
          "coupled across the batch (an in-batch contrastive loss, a @ b.T) need the "
          "operands of one label all-gathered, and neither label's can be (rows in a sort's "
          "order, a list element, folded inside a dim, or spanning the other label), or more "
          "than two labels hold the batch",
          rule.spec.ToString(), b.decided->arg, g.node(b.decided->ref.node).name,
          b.decided->info.placement.dim, LabelName(b.label), b.outer, o.arg,
          g.node(o.ref.node).name, o.info.placement.dim, LabelName(l), o.info.outer));
    }
  }
  return b;
}

}  // namespace

// The batch follows its label through the product (the row's MatmulSpec,
// bound to this call's operand ranks): kept when the output has the label,
// contracted (partial) when it does not.
absl::Status BatchDimAnalyzer::Matmul(NodeId id, const Node& n, const OpRule& rule) {
  std::vector<Operand> ops = Operands(n);
  const TensorType* out = OutType(n);
  if (out == nullptr) return Error(n, "expected a tensor output");
  absl::StatusOr<MatmulLabels> bound = rule.spec.Bind(PositionalRanks(ops));
  if (!bound.ok()) return Error(n, std::string(bound.status().message()));
  const MatmulLabels& labels = *bound;
  auto label_of = [&](const Operand& o, int64_t dim) { return OperandLabel(labels, o, dim); };
  FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule.linear, ops));
  FXDP_RETURN_IF_ERROR(GatherCoupled(id, n, ops, label_of));
  absl::StatusOr<ProductBatch> found = FindProductBatch(g_, rule, ops, label_of);
  if (!found.ok()) return Error(n, std::string(found.status().message()));
  const int batch_label = found->label;
  const int64_t outer = found->outer;
  const Operand* decided = found->decided;
  NodeInfo& info = a_.nodes_[id.value];
  if (batch_label < 0) {
    SetCombined(id, Combined{}, s);
    return absl::OkStatus();
  }
  // Replicated operands that span the batch label are sharded too.
  for (const Operand& o : ops) {
    if (!o.info.placement.is_replicate()) continue;
    for (int64_t d = 0; d < o.type->rank(); ++d) {
      if (label_of(o, d) == batch_label) NeedShard(o, static_cast<int32_t>(d), outer, id);
    }
  }
  auto pos = std::find(labels.output.begin(), labels.output.end(), batch_label);
  info.arg = static_cast<int8_t>(decided->arg);
  if (pos != labels.output.end()) {
    info.detail = Detail::kFromArg;
    SetAllOut(id, Shard(static_cast<int32_t>(pos - labels.output.begin()), outer, s.scaled));
    return absl::OkStatus();
  }
  if (rule.has(kNoSum)) {
    return Error(
        n, absl::StrFormat(
               "arg %d (%s) holds the batch on its dim %d (label %s), which the op %s works across "
               "without summing products; each rank's part is not a share of a sum",
               decided->arg, g_.node(decided->ref.node).name, decided->info.placement.dim,
               LabelName(batch_label), rule.spec.ToString()));
  }
  if (labels.bias_arg >= 0 && Find(ops, labels.bias_arg) != nullptr) {
    return Error(n,
                 "adds a bias to a product that contracts the batch; the bias would "
                 "be counted once per rank");
  }
  info.detail = Detail::kContracted;
  SetAllOut(id, Partial(s.scaled));
  return absl::OkStatus();
}

}  // namespace fxdp
