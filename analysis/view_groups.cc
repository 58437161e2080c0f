// The reshape family: view, reshape, unflatten, and DTensor's view_groups.
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "analysis/ir/type_text.h"
#include "analysis/view_dim_maps.h"
#include "util/status_macros.h"

namespace fxdp::view_rules_internal {
namespace {

absl::StatusOr<int64_t> CheckedMul(const RuleCall& c, int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_mul_overflow(a, b, &out)) {
    return c.Error(absl::StrCat("size product ", a, " * ", b, " overflows int64"));
  }
  return out;
}

absl::StatusOr<int64_t> Numel(const RuleCall& c, absl::Span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t s : shape) {
    FXDP_ASSIGN_OR_RETURN(n, CheckedMul(c, n, s));
  }
  return n;
}

// at::infer_size: resolves a single -1 in `sizes` so that they hold `numel`
// elements. `what` names the argument ("shape"), `of` what it must fill
// ("input of size 12").
absl::StatusOr<std::vector<int64_t>> InferSize(const RuleCall& c, absl::string_view what,
                                               absl::Span<const int64_t> sizes, int64_t numel,
                                               absl::string_view of) {
  std::vector<int64_t> out(sizes.begin(), sizes.end());
  int64_t infer = -1;
  int64_t known = 1;
  for (int64_t i = 0; i < static_cast<int64_t>(sizes.size()); ++i) {
    if (sizes[i] == -1) {
      if (infer >= 0) {
        return c.Error(
            absl::StrCat(what, " ", ir::ShapeText(sizes), ": only one dimension can be inferred"));
      }
      infer = i;
    } else if (sizes[i] < -1) {
      return c.Error(absl::StrCat("invalid ", what, " dimension ", sizes[i], " at index ", i,
                                  " of ", ir::ShapeText(sizes)));
    } else {
      FXDP_ASSIGN_OR_RETURN(known, CheckedMul(c, known, sizes[i]));
    }
  }
  const auto invalid = [&] {
    return c.Error(absl::StrCat(what, " ", ir::ShapeText(sizes), " is invalid for ", of));
  };
  if (infer < 0) {
    if (known != numel) return invalid();
    return out;
  }
  if (known == 0) {
    if (numel != 0) return invalid();
    return c.Error(absl::StrCat(what, " ", ir::ShapeText(sizes), " is ambiguous for ", of,
                                ": the -1 could be any value"));
  }
  if (numel % known != 0) return invalid();
  out[infer] = numel / known;
  return out;
}

}  // namespace

absl::StatusOr<DimMap> ViewGroups(const RuleCall& c, absl::Span<const int64_t> from,
                                  absl::Span<const int64_t> to) {
  const size_t from_len = from.size(), to_len = to.size();
  size_t fi = 0, ti = 0;
  DimMap result;
  const auto zero_group = [&] {
    return c.Error(absl::StrCat("DTensor's view_groups divides by a size-0 group reshaping ",
                                ir::ShapeText(from), " to ", ir::ShapeText(to)));
  };
  while (fi < from_len || ti < to_len) {
    const size_t fi_before = fi, ti_before = ti;
    std::vector<int64_t> from_group;  // input dims
    std::vector<int64_t> to_group;    // output sizes
    int64_t f = 1, t = 1;
    if (fi < from_len) {
      f = from[fi];
      from_group.push_back(static_cast<int64_t>(fi++));
    }
    if (ti < to_len) {
      t = to[ti++];
      to_group.push_back(t);
    }
    if (f == 1 && t != 1) {  // a size-1 input dim on its own: emits nothing.
      --ti;
      to_group.clear();
    } else if (f != 1 && t == 1) {  // a size-1 output dim on its own: S.
      --fi;
      from_group.clear();
    } else {  // grow the smaller side until the products meet.
      while (f != t) {
        const bool more_from = fi < from_len, more_to = ti < to_len;
        if (more_from && more_to && f == 0) return zero_group();
        if (more_from && (!more_to || t % f == 0 || t > f)) {
          FXDP_ASSIGN_OR_RETURN(f, CheckedMul(c, f, from[fi]));
          from_group.push_back(static_cast<int64_t>(fi++));
          continue;
        }
        if (more_from && more_to && t == 0) return zero_group();
        if (more_to) {
          FXDP_ASSIGN_OR_RETURN(t, CheckedMul(c, t, to[ti]));
          to_group.push_back(to[ti++]);
          continue;
        }
        break;  // both exhausted
      }
    }
    if (fi == fi_before && ti == ti_before) {
      return c.Error(absl::StrCat("DTensor's view_groups does not terminate reshaping ",
                                  ir::ShapeText(from), " to ", ir::ShapeText(to)));
    }
    if (to_group.empty()) continue;
    std::vector<DimSpec> members;  // torch leaves size-0 input dims out
    for (int64_t d : from_group) {
      if (from[d] >= 1) members.push_back(DimSpec::InputDim(d));
    }
    const DimSpec flat = DimSpec::Flatten(std::move(members));
    for (int64_t k = 0; k < static_cast<int64_t>(to_group.size()); ++k) {
      result.push_back(DimSpec::Split(flat, to_group, k));
    }
  }
  return result;
}

absl::StatusOr<DimMap> ViewRule(const RuleCall& c) {
  FXDP_ASSIGN_OR_RETURN(const int64_t numel, Numel(c, c.shape));
  FXDP_ASSIGN_OR_RETURN(
      const std::vector<int64_t> to,
      InferSize(c, c.params[0].name, c.Ints(0), numel, absl::StrCat("input of size ", numel)));
  return ViewGroups(c, c.shape, to);
}

absl::StatusOr<DimMap> ReshapeRule(const RuleCall& c) {
  if (c.Ints(0).empty()) {
    // torch.reshape's dim map reads shape[0] (normalize_sizes); only
    // Tensor.view's accepts an empty shape.
    return c.Error("DTensor's reshape rule rejects an empty shape []");
  }
  return ViewRule(c);
}

absl::StatusOr<DimMap> UnflattenRule(const RuleCall& c) {
  // aten::unflatten is composite: it is view() to the unflattened shape.
  const int64_t ndim = c.ndim();
  const int64_t dim = c.Int(0);
  if (dim < -ndim || dim >= ndim || ndim == 0) {
    return c.Error(absl::StrCat("dim ", dim, " is out of range for a ", ndim, "-d input"));
  }
  const int64_t d = dim < 0 ? dim + ndim : dim;
  if (c.Ints(1).empty()) return c.Error("sizes must be non-empty");
  FXDP_ASSIGN_OR_RETURN(const std::vector<int64_t> sizes,
                        InferSize(c, c.params[1].name, c.Ints(1), c.shape[d],
                                  absl::StrCat("dim ", dim, " of size ", c.shape[d])));
  std::vector<int64_t> to(c.shape.begin(), c.shape.begin() + d);
  to.insert(to.end(), sizes.begin(), sizes.end());
  to.insert(to.end(), c.shape.begin() + d + 1, c.shape.end());
  return ViewGroups(c, c.shape, to);
}

}  // namespace fxdp::view_rules_internal
