// Einsum-like products.
#include "analysis/batch_dim/analyzer.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "analysis/ir/status_macros.h"

namespace fxdp {

using ir::Argument;
using ir::Graph;
using ir::Node;
using ir::NodeId;
using ir::TensorType;
using ir::ValueRef;

absl::Status BatchDimAnalyzer::Matmul(NodeId id, const Node& n, const OpRule& rule) {
  std::vector<Operand> ops = Operands(n);
  const TensorType* out = OutType(n);
  if (out == nullptr) return Error(n, "expected a tensor output");
  // Labels: letters for named dims, 1000+i for broadcast dims.
  std::vector<std::vector<int>> labels;  // per operand, by operand position.
  std::vector<int> out_labels;
  std::vector<int> operand_args;
  bool bias = false;
  auto letters = [](absl::string_view s) {
    std::vector<int> v;
    for (char ch : s) v.push_back(ch);
    return v;
  };
  auto ell = [](int64_t k, int64_t total) {
    std::vector<int> v;
    for (int64_t i = total - k; i < total; ++i) v.push_back(1000 + static_cast<int>(i));
    return v;
  };
  auto cat = [](std::vector<int> a, const std::vector<int>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  auto rank_of = [&](int arg) -> int64_t {
    for (const Operand& o : ops) {
      if (o.arg == arg) return o.type->rank();
    }
    return -1;
  };
  if (rule.spec == "linear") {
    const int64_t r = rank_of(0);
    if (r < 1) return Error(n, "arg 0 must be a tensor of rank >= 1");
    labels = {cat(ell(r - 1, r - 1), letters("k")), letters("nk"), letters("n")};
    out_labels = cat(ell(r - 1, r - 1), letters("n"));
    operand_args = {0, 1, 2};
    bias = true;
  } else if (rule.spec == "matmul") {
    const int64_t ra = rank_of(0), rb = rank_of(1);
    if (ra < 1 || rb < 1) return Error(n, "args 0 and 1 must be tensors of rank >= 1");
    const int64_t e = std::max<int64_t>({ra - 2, rb - 2, 0});
    if (ra == 1 && rb == 1) {
      labels = {letters("k"), letters("k")};
    } else if (rb == 1) {
      labels = {cat(ell(ra - 2, e), letters("ik")), letters("k")};
      out_labels = cat(ell(ra - 2, e), letters("i"));
    } else if (ra == 1) {
      labels = {letters("k"), cat(ell(rb - 2, e), letters("kj"))};
      out_labels = cat(ell(rb - 2, e), letters("j"));
    } else {
      labels = {cat(ell(ra - 2, e), letters("ik")), cat(ell(rb - 2, e), letters("kj"))};
      out_labels = cat(ell(e, e), letters("ij"));
    }
    operand_args = {0, 1};
  } else {
    absl::string_view spec = rule.spec;
    if (absl::ConsumePrefix(&spec, "+")) bias = true;
    const size_t arrow = spec.find("->");
    std::vector<absl::string_view> ins = absl::StrSplit(spec.substr(0, arrow), ',');
    for (absl::string_view s : ins) labels.push_back(letters(s));
    out_labels = letters(spec.substr(arrow + 2));
    for (size_t i = 0; i < labels.size(); ++i) operand_args.push_back(static_cast<int>(i));
  }
  // Operand dim -> label (a bias is right-aligned against its labels).
  auto label_of = [&](const Operand& o, int64_t dim) -> int {
    for (size_t i = 0; i < operand_args.size(); ++i) {
      if (operand_args[i] != o.arg) continue;
      const auto& l = labels[i];
      const int64_t shift = static_cast<int64_t>(l.size()) - o.type->rank();
      if (shift < 0 || dim + shift >= static_cast<int64_t>(l.size())) return -1;
      return l[dim + shift];
    }
    return -1;
  };
  FXDP_ASSIGN_OR_RETURN(Special s, Linear(id, n, rule, ops));
  int batch_label = -1;
  int64_t outer = 1;
  int decided = -1;
  for (const Operand& o : ops) {
    if (!o.info.placement.is_shard()) continue;
    const int l = label_of(o, o.info.placement.dim);
    if (l < 0) return Error(n, absl::StrFormat("arg %d has an unexpected rank %d", o.arg,
                                              o.type->rank()));
    if (batch_label < 0) {
      batch_label = l;
      outer = o.info.outer;
      decided = o.arg;
    } else if (batch_label != l || outer != o.info.outer) {
      return Error(n, absl::StrFormat(
          "operands put the batch on different dims of the product (arg %d and arg %d)",
          decided, o.arg));
    }
  }
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
  auto pos = std::find(out_labels.begin(), out_labels.end(), batch_label);
  info.arg = static_cast<int8_t>(decided);
  if (pos != out_labels.end()) {
    info.detail = Detail::kFromArg;
    SetAllOut(id, Shard(static_cast<int32_t>(pos - out_labels.begin()), outer, s.scaled));
    return absl::OkStatus();
  }
  if (bias) {
    for (const Operand& o : ops) {
      if (o.arg == operand_args[0] && rule.spec != "linear") {
        return Error(n, "adds a bias to a product that contracts the batch; the bias would "
                        "be counted once per rank");
      }
      if (rule.spec == "linear" && o.arg == 2) {
        return Error(n, "adds a bias to a product that contracts the batch; the bias would "
                        "be counted once per rank");
      }
    }
  }
  info.detail = Detail::kContracted;
  SetAllOut(id, Partial(s.scaled));
  return absl::OkStatus();
}

}  // namespace fxdp
