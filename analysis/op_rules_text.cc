// The text form of the op-rule rows (op_rules.h OpRuleText), the notation of
// tests/testdata/op_rules.txt.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "analysis/op_rules.h"

namespace fxdp {
namespace {

using R = ParamRole;

absl::string_view RoleName(ParamRole r) {
  switch (r) {
    case R::kNone: return "none";
    case R::kDim: return "dim";
    case R::kDims: return "dims";
    case R::kKeepDim: return "keepdim";
    case R::kReduces: return "reduces";
    case R::kReduction: return "reduction";
    case R::kTraining: return "training";
    case R::kReplicated: return "replicated";
    case R::kBatchSize: return "batch_size";
    case R::kTotalWeight: return "total_weight";
    case R::kSizes: return "sizes";
    case R::kStride: return "stride";
    case R::kStorageOffset: return "storage_offset";
    case R::kStart: return "start";
    case R::kEnd: return "end";
    case R::kStep: return "step";
    case R::kLength: return "length";
    case R::kSplitSize: return "split_size";
    case R::kNormalizedShape: return "normalized_shape";
    case R::kPad: return "pad";
    case R::kLastDims: return "last_dims";
    case R::kIndices: return "indices";
    case R::kZeroIsLinear: return "zero_is_linear";
    case R::kScaleGradByFreq: return "scale_grad_by_freq";
    case R::kOrd: return "ord";
    case R::kOffsets: return "offsets";
    case R::kIncludeLastOffset: return "include_last_offset";
    case R::kBinRange: return "bin_range";
    case R::kAccumulate: return "accumulate";
    case R::kMomentum: return "momentum";
    case R::kEps: return "eps";
    case R::kSaveMean: return "save_mean";
    case R::kSaveInvstd: return "save_invstd";
  }
  return "?";
}

absl::string_view ReduceKindName(int8_t k) {
  switch (static_cast<ReduceKind>(k)) {
    case ReduceKind::kSum: return "sum";
    case ReduceKind::kMean: return "mean";
    case ReduceKind::kOther: return "other";
  }
  return "?";
}

absl::string_view ShapeCheckName(ShapeCheck s) {
  switch (s) {
    case ShapeCheck::kDefault: return "default";
    case ShapeCheck::kNone: return "none";
    case ShapeCheck::kSameAsArg: return "same_as";
    case ShapeCheck::kSizes: return "sizes";
    case ShapeCheck::kView: return "view";
    case ShapeCheck::kExpand: return "expand";
    case ShapeCheck::kAsStrided: return "as_strided";
    case ShapeCheck::kProduct: return "product";
    case ShapeCheck::kEmbedding: return "embedding";
    case ShapeCheck::kEmbeddingBackward: return "embedding_backward";
    case ShapeCheck::kBatchAgrees: return "batch_agrees";
  }
  return "?";
}

std::string ParamText(const OpParam& p) {
  switch (p.role) {
    case R::kReduces: return absl::StrCat("reduces=", ReduceKindName(p.value));
    case R::kLastDims: return absl::StrCat("last_dims=", p.value);
    default: break;
  }
  std::string s = absl::StrCat(RoleName(p.role), "=", p.index, ":", p.name);
  if (p.role == R::kZeroIsLinear && p.value != 0) absl::StrAppend(&s, "(absent=0)");
  return s;
}

}  // namespace

std::string OpRuleText(const OpRule& r) {
  std::string s =
      absl::StrCat(r.name, r.overload.empty() ? "" : ".", r.overload, "  ", OpFamilyName(r.family));
  if (r.linear.kind != Linearity::kNone) {
    std::vector<int> args;
    for (int i = 0; i < 8; ++i) {
      if ((r.linear.args >> i) & 1) args.push_back(i);
    }
    absl::StrAppend(&s, "  ", r.linear.kind == Linearity::kAdditive ? "additive" : "multilinear",
                    "(", absl::StrJoin(args, ","), ")");
  }
  std::vector<std::string> params;
  for (const OpParam& p : r.params) {
    if (p.role != R::kNone) params.push_back(ParamText(p));
  }
  if (!params.empty()) absl::StrAppend(&s, "  ", absl::StrJoin(params, " "));
  if (r.spec.kind() != MatmulSpec::Kind::kNone) absl::StrAppend(&s, "  spec=", r.spec.ToString());
  static constexpr std::pair<OpTrait, absl::string_view> kTraitNames[] = {
      {kZeros, "zeros"},          {kDropsDim, "drops_dim"},
      {kAligned, "aligned"},      {kPacking, "packing"},
      {kInplace, "inplace"},      {kRowsAgree, "rows_agree"},
      {kRandom, "random"},        {kSelfAlias, "self_alias"},
      {kSortsRows, "sorts_rows"}, {kDividesPositions, "divides_positions"},
      {kNoSum, "no_sum"},         {kReturnsRunningStats, "returns_running_stats"},
  };
  std::vector<absl::string_view> traits;
  for (const auto& [t, name] : kTraitNames) {
    if (r.has(t)) traits.push_back(name);
  }
  if (!traits.empty()) absl::StrAppend(&s, "  [", absl::StrJoin(traits, " "), "]");
  if (r.shape.kind != ShapeCheck::kDefault) {
    absl::StrAppend(&s, "  shape=", ShapeCheckName(r.shape.kind));
    if (r.shape.arg >= 0) absl::StrAppend(&s, "(", r.shape.arg, ")");
  }
  return s;
}

std::string OpRulesText() {
  std::string out;
  for (int i = 0; i < NumOpRules(); ++i) absl::StrAppend(&out, OpRuleText(OpRuleAt(i)), "\n");
  return out;
}

}  // namespace fxdp
