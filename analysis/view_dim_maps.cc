// Dim maps of the non-reshape view ops; the reshape family is in view_groups.cc.
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "analysis/ir/type_text.h"
#include "analysis/view_dim_maps.h"
#include "util/status_macros.h"

namespace fxdp::view_rules_internal {

absl::Status RuleCall::Error(absl::string_view message) const {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", message));
}

namespace {

DimMap Identity(int64_t ndim) {
  DimMap map;
  for (int64_t i = 0; i < ndim; ++i) map.push_back(DimSpec::InputDim(i));
  return map;
}

// at::maybe_wrap_dim: `dim` of a `rank`-d tensor, a 0-d tensor accepting 0 and
// -1 as a 1-d one does.
absl::StatusOr<int64_t> WrapDim(const RuleCall& c, absl::string_view what, int64_t dim,
                                int64_t rank) {
  const int64_t n = std::max<int64_t>(rank, 1);
  if (dim < -n || dim >= n) {
    return c.Error(absl::StrCat(what, " ", dim, " is out of range for a ", rank,
                                "-d input (expected [", -n, ", ", n - 1, "])"));
  }
  return dim < 0 ? dim + n : dim;
}

// WrapDim over a list; a dim named twice is an error.
absl::StatusOr<std::vector<int64_t>> WrapDims(const RuleCall& c, int param, int64_t rank) {
  const RuleParam& p = c.params[param];
  std::vector<int64_t> out;
  absl::flat_hash_set<int64_t> seen;
  for (int64_t dim : *p.ints) {
    FXDP_ASSIGN_OR_RETURN(const int64_t d, WrapDim(c, p.name, dim, rank));
    if (!seen.insert(d).second) {
      return c.Error(absl::StrCat(p.name, " ", ir::ShapeText(*p.ints), " names dim ", d, " twice"));
    }
    out.push_back(d);
  }
  return out;
}

absl::Status CheckNonNegative(const RuleCall& c, int param) {
  const RuleParam& p = c.params[param];
  for (size_t i = 0; i < p.ints->size(); ++i) {
    if ((*p.ints)[i] < 0) {
      return c.Error(absl::StrCat(p.name, " ", ir::ShapeText(*p.ints), " has negative entry ",
                                  (*p.ints)[i], " at index ", i));
    }
  }
  return absl::OkStatus();
}

// dim_repeat: leading extra entries repeat a Singleton, the rest input dims.
DimMap RepeatMap(int64_t ndim, absl::Span<const int64_t> repeats) {
  const int64_t pad = static_cast<int64_t>(repeats.size()) - ndim;
  DimMap map;
  for (int64_t k = 0; k < static_cast<int64_t>(repeats.size()); ++k) {
    map.push_back(
        DimSpec::Repeat(k < pad ? DimSpec::Singleton() : DimSpec::InputDim(k - pad), repeats[k]));
  }
  return map;
}

// dim_flatten(ndim, start, end) with 0 <= start <= end < ndim.
DimMap FlattenMap(int64_t ndim, int64_t start, int64_t end) {
  if (ndim == 0) return {DimSpec::Singleton()};
  if (ndim == 1) return {DimSpec::InputDim(0)};
  DimMap map;
  std::vector<DimSpec> merged;
  for (int64_t i = 0; i < ndim; ++i) {
    if (i < start || i > end) {
      map.push_back(DimSpec::InputDim(i));
    } else {
      merged.push_back(DimSpec::InputDim(i));
      if (i == end) map.push_back(DimSpec::Flatten(std::move(merged)));
    }
  }
  return map;
}

}  // namespace

absl::StatusOr<DimMap> ExpandRule(const RuleCall& c) {
  const std::vector<int64_t>& sizes = c.Ints(0);
  const int64_t pad = static_cast<int64_t>(sizes.size()) - c.ndim();
  if (pad < 0) {
    return c.Error(absl::StrCat(c.params[0].name, " ", ir::ShapeText(sizes), " has ", sizes.size(),
                                " entries, fewer than the input's ", c.ndim(), " dims"));
  }
  DimMap map;
  for (int64_t k = 0; k < static_cast<int64_t>(sizes.size()); ++k) {
    const int64_t want = sizes[k];
    if (want < -1 || (k < pad && want == -1)) {
      return c.Error(absl::StrCat(c.params[0].name, " ", ir::ShapeText(sizes), ": size ", want,
                                  " is not allowed at dim ", k,
                                  k < pad ? " (a new leading dim)" : ""));
    }
    if (k < pad) {
      map.push_back(want == 1 ? DimSpec::Singleton()
                              : DimSpec::Broadcast(DimSpec::Singleton(), want));
      continue;
    }
    const int64_t actual = c.shape[k - pad];
    if (want == -1 || want == actual) {
      map.push_back(DimSpec::InputDim(k - pad));
    } else if (actual == 1) {
      map.push_back(DimSpec::Broadcast(DimSpec::InputDim(k - pad), want));
    } else {
      return c.Error(absl::StrCat(c.params[0].name, " ", ir::ShapeText(sizes), ": size ", want,
                                  " must match the existing size ", actual,
                                  " at non-singleton input dim ", k - pad));
    }
  }
  return map;
}

absl::StatusOr<DimMap> FlattenRule(const RuleCall& c) {
  FXDP_ASSIGN_OR_RETURN(const int64_t start, WrapDim(c, c.params[0].name, c.Int(0), c.ndim()));
  FXDP_ASSIGN_OR_RETURN(const int64_t end, WrapDim(c, c.params[1].name, c.Int(1), c.ndim()));
  if (start > end) {
    return c.Error(absl::StrCat("start_dim ", c.Int(0), " comes after end_dim ", c.Int(1)));
  }
  return FlattenMap(c.ndim(), start, end);
}

absl::StatusOr<DimMap> SqueezeRule(const RuleCall& c) {
  std::vector<bool> target(c.ndim(), !c.params[0].ints.has_value());
  if (c.params[0].ints.has_value()) {
    FXDP_ASSIGN_OR_RETURN(const std::vector<int64_t> dims, WrapDims(c, 0, c.ndim()));
    for (int64_t d : dims) {
      if (d < c.ndim()) target[d] = true;  // d == 0 of a 0-d input names nothing
    }
  }
  DimMap map;
  for (int64_t i = 0; i < c.ndim(); ++i) {
    // See [View Rule Divergences]: size-0 dims stay.
    if (c.shape[i] != 1 || !target[i]) map.push_back(DimSpec::InputDim(i));
  }
  return map;
}

absl::StatusOr<DimMap> UnsqueezeRule(const RuleCall& c) {
  const int64_t n = c.ndim() + 1;
  const int64_t dim = c.Int(0);
  if (dim < -n || dim >= n) {
    return c.Error(absl::StrCat("dim ", dim, " is out of range for unsqueezing a ", c.ndim(),
                                "-d input (expected [", -n, ", ", n - 1, "])"));
  }
  DimMap map = Identity(c.ndim());
  map.insert(map.begin() + (dim < 0 ? dim + n : dim), DimSpec::Singleton());
  return map;
}

absl::StatusOr<DimMap> PermuteRule(const RuleCall& c) {
  if (static_cast<int64_t>(c.Ints(0).size()) != c.ndim()) {
    return c.Error(absl::StrCat(c.params[0].name, " ", ir::ShapeText(c.Ints(0)), " has ",
                                c.Ints(0).size(), " entries for a ", c.ndim(), "-d input"));
  }
  FXDP_ASSIGN_OR_RETURN(const std::vector<int64_t> dims, WrapDims(c, 0, c.ndim()));
  DimMap map;
  for (int64_t d : dims) map.push_back(DimSpec::InputDim(d));
  return map;
}

absl::StatusOr<DimMap> TransposeRule(const RuleCall& c) {
  FXDP_ASSIGN_OR_RETURN(const int64_t a, WrapDim(c, c.params[0].name, c.Int(0), c.ndim()));
  FXDP_ASSIGN_OR_RETURN(const int64_t b, WrapDim(c, c.params[1].name, c.Int(1), c.ndim()));
  if (c.ndim() == 0) return c.Error("DTensor's transpose rule rejects a 0-d input");
  DimMap map = Identity(c.ndim());
  std::swap(map[a], map[b]);
  return map;
}

absl::StatusOr<DimMap> TRule(const RuleCall& c) {
  // torch._refs.t: transpose(0, 0 if ndim < 2 else 1), for ndim <= 2.
  if (c.ndim() > 2) return c.Error(absl::StrCat("expects <= 2 dims, got a ", c.ndim(), "-d input"));
  if (c.ndim() == 0) return c.Error("DTensor's transpose rule rejects a 0-d input");
  DimMap map = Identity(c.ndim());
  std::reverse(map.begin(), map.end());
  return map;
}

absl::StatusOr<DimMap> MovedimRule(const RuleCall& c) {
  if (c.Ints(0).size() != c.Ints(1).size()) {
    return c.Error(absl::StrCat("source ", ir::ShapeText(c.Ints(0)), " and destination ",
                                ir::ShapeText(c.Ints(1)), " differ in length"));
  }
  FXDP_ASSIGN_OR_RETURN(const std::vector<int64_t> src, WrapDims(c, 0, c.ndim()));
  FXDP_ASSIGN_OR_RETURN(const std::vector<int64_t> dst, WrapDims(c, 1, c.ndim()));
  if (src.empty()) return c.Error("DTensor's movedim rule rejects empty source and destination");
  if (c.ndim() == 0) return c.Error("DTensor's movedim rule rejects a 0-d input");
  std::vector<int64_t> order(c.ndim(), -1);
  std::vector<bool> moved(c.ndim(), false);
  for (size_t i = 0; i < src.size(); ++i) {
    order[dst[i]] = src[i];
    moved[src[i]] = true;
  }
  int64_t next = 0;  // unmoved input dims fill the free slots in order
  for (int64_t& o : order) {
    if (o != -1) continue;
    while (moved[next]) ++next;
    o = next++;
  }
  DimMap map;
  for (int64_t o : order) map.push_back(DimSpec::InputDim(o));
  return map;
}

absl::StatusOr<DimMap> RepeatRule(const RuleCall& c) {
  if (static_cast<int64_t>(c.Ints(0).size()) < c.ndim()) {
    return c.Error(absl::StrCat(c.params[0].name, " ", ir::ShapeText(c.Ints(0)), " has ",
                                c.Ints(0).size(), " entries, fewer than the input's ", c.ndim(),
                                " dims"));
  }
  FXDP_RETURN_IF_ERROR(CheckNonNegative(c, 0));
  return RepeatMap(c.ndim(), c.Ints(0));
}

absl::StatusOr<DimMap> TileRule(const RuleCall& c) {
  FXDP_RETURN_IF_ERROR(CheckNonNegative(c, 0));
  std::vector<int64_t> reps = c.Ints(0);
  if (static_cast<int64_t>(reps.size()) < c.ndim()) {
    reps.insert(reps.begin(), c.ndim() - reps.size(), 1);
  }
  // torch's dim_repeat reads sizes[0] (normalize_sizes).
  if (reps.empty()) return c.Error("DTensor's tile rule rejects empty dims for a 0-d input");
  return RepeatMap(c.ndim(), reps);
}

absl::StatusOr<DimMap> PadLeftRule(const RuleCall& c) {
  DimMap map(std::max<int64_t>(0, c.Int(0) - c.ndim()), DimSpec::Singleton());
  for (int64_t i = 0; i < c.ndim(); ++i) map.push_back(DimSpec::InputDim(i));
  return map;
}

absl::StatusOr<DimMap> AtLeast3dRule(const RuleCall& c) {
  const DimSpec s = DimSpec::Singleton();
  switch (c.ndim()) {
    case 0: return DimMap{s, s, s};
    case 1: return DimMap{s, DimSpec::InputDim(0), s};
    case 2: return DimMap{DimSpec::InputDim(0), DimSpec::InputDim(1), s};
    default: return Identity(c.ndim());
  }
}

absl::StatusOr<DimMap> ViewAsRealRule(const RuleCall& c) {
  if (c.ndim() == 0) return c.Error("DTensor's view_as_real rule rejects a 0-d input");
  const int64_t last = c.ndim() - 1;
  DimMap map = Identity(last);
  const std::vector<int64_t> group = {c.shape[last], 2};  // raw Split, as torch builds it
  map.push_back(DimSpec::RawSplit(DimSpec::InputDim(last), group, 0));
  map.push_back(DimSpec::RawSplit(DimSpec::InputDim(last), group, 1));
  return map;
}

absl::StatusOr<DimMap> ViewAsComplexRule(const RuleCall& c) {
  if (c.ndim() == 0) return c.Error("input must have at least one dim");
  if (c.shape.back() != 2) {
    return c.Error(absl::StrCat("last dim must have size 2, got ", c.shape.back()));
  }
  if (c.ndim() == 1) return DimMap{};  // See [View Rule Divergences].
  return FlattenMap(c.ndim(), c.ndim() - 2, c.ndim() - 1);
}

}  // namespace fxdp::view_rules_internal
