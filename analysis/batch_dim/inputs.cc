// The batch size and micro-batches, read from the INPUT placeholders.
#include "analysis/batch_dim/analyzer.h"

#include <algorithm>
#include <cstdint>
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

absl::Status BatchDimAnalyzer::FindBatchSize() {
  const Node* first = nullptr;
  for (const Node& n : g_.nodes()) {
    if (!n.is_placeholder() || n.placeholder.role != ir::PlaceholderRole::kInput) continue;
    const int32_t bd = n.placeholder.batch_dim;
    if (bd < 0) continue;
    if (n.outputs.empty() || !n.outputs[0].is_tensor()) {
      return absl::InvalidArgumentError(
          absl::StrCat("input ", n.name, " has batch_dim ", bd, " but is not a tensor"));
    }
    const TensorType& t = n.outputs[0].tensor;
    if (bd >= t.rank()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "input %s: batch_dim %d is out of range for a tensor of rank %d (shape %s)", n.name, bd,
          t.rank(), t.ToString()));
    }
    const int64_t b = t.shape[bd];
    if (b < 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "input %s: batch dim %d has size %d; a batch needs at least one sample", n.name, bd, b));
    }
    if (first == nullptr) {
      first = &n;
      a_.batch_size_ = b;
    } else if (b != a_.batch_size_) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "inputs disagree on the batch size: %s has %d along its batch dim %d, %s has %d along "
          "its batch dim %d",
          first->name, a_.batch_size_, first->placeholder.batch_dim, n.name, b, bd));
    }
  }
  return FindMicroBatches();
}

// The split size when `n` splits its arg 0 along `dim` into equal pieces
// (an op with a kSplitSize parameter: split.Tensor(x, s, dim),
// split_with_sizes(x, [s, s, ...], dim)), else 0.
int64_t BatchDimAnalyzer::EqualSplitSize(const Node& n, int64_t dim, int64_t rank) {
  if (n.kind != ir::NodeKind::kCallFunction || n.args.size() < 2) return 0;
  const OpRule* rule = FindOpRule(n.target);
  const OpParam* split = rule == nullptr ? nullptr : rule->param(ParamRole::kSplitSize);
  if (split == nullptr) return 0;
  const Argument* d = ArgOf(n, rule->param(ParamRole::kDim));
  const int64_t got = d == nullptr ? 0 : d->get_if<int64_t>() ? *d->get_if<int64_t>() : -1;
  if (NormDim(got, rank) != dim) return 0;
  const Argument* sizes = ArgOf(n, split);
  if (sizes == nullptr) return 0;
  if (const int64_t* s = sizes->get_if<int64_t>()) return *s;
  if (!sizes->is_list()) return 0;
  int64_t size = 0;
  for (const Argument& a : sizes->as<Argument::List>()) {
    const int64_t* s = a.get_if<int64_t>();
    if (s == nullptr || (size != 0 && *s != size)) return 0;
    size = *s;
  }
  return size;
}

// Gradient accumulation (x.chunk(k) in a loop over micro-batches): when
// every use of every batched input splits it along its batch dim into equal
// micro-batches of one size s < B, each micro-batch is the batch the rest of
// the graph sees. The analysis then runs with B = s: an input (B = k * s
// rows) is S(d) whose local extent is k * s_r, each split piece is S(d) with
// s_r rows: rank r holds its share s_r of EACH micro-batch (ir::RankRows), so
// micro-batch j over the ranks is one device's micro-batch j. Pieces of
// unequal sizes are refused at the split (SplitAlongBatchError).
absl::Status BatchDimAnalyzer::FindMicroBatches() {
  if (a_.batch_size_ <= 1) return absl::OkStatus();
  const ir::UseMap uses = ir::ComputeUses(g_);
  int64_t size = 0;
  for (int32_t i = 0; i < g_.size(); ++i) {
    const Node& n = g_.nodes()[i];
    if (!n.is_placeholder() || n.placeholder.role != ir::PlaceholderRole::kInput ||
        n.placeholder.batch_dim < 0 || uses[i].empty())
      continue;
    for (const ir::Use& u : uses[i][0]) {
      const Node& user = g_.node(u.user);
      const int64_t s = u.arg_index == 0 ? EqualSplitSize(user, n.placeholder.batch_dim,
                                                          n.outputs[0].tensor.rank())
                                         : 0;
      if (s <= 0 || s >= a_.batch_size_ || a_.batch_size_ % s != 0 || (size != 0 && s != size))
        return absl::OkStatus();
      size = s;
    }
  }
  if (size == 0) return absl::OkStatus();
  a_.micro_batches_ = a_.batch_size_ / size;
  a_.batch_size_ = size;
  return absl::OkStatus();
}

}  // namespace fxdp
