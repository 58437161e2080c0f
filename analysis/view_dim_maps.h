// The dim-map rules behind the view-op table (view_rules.cc): a C++ port of
// the `dim_maps` functions of torch 2.13's
// torch/distributed/tensor/_ops/_view_ops.py (SPMD_REFERENCE §1.3), each
// preceded by the argument checks the aten op itself makes.
//
// Contract of every rule: INVALID_ARGUMENT when the aten op rejects its
// arguments for this input shape, or when DTensor's rule raises for them;
// otherwise DTensor's DimMap. Where DTensor's map has a different rank from
// the op's real output it is corrected; see [View Rule Divergences].
//
// [View Rule Divergences]
//   * squeeze: DTensor drops targeted dims of size <= 1; the op only drops
//     size-1 dims, so size-0 dims are kept here.
//   * view_as_complex of a 1-d input (shape [2]): DTensor gives (In0) for a
//     0-d output; here ().
// Everything else follows torch, quirks included, so that a map computed here
// is the one DTensor would use: size-0 dims are left out of Flatten groups;
// and these are errors although the op accepts them: view_groups never
// terminating or dividing by zero on some zero-size reshapes, reshape to []
// (view to [] is fine), transpose, t, movedim and view_as_real of a 0-d
// input, movedim with empty dim lists, tile of a 0-d input with empty dims.
#ifndef FXDP_ANALYSIS_VIEW_DIM_MAPS_H_
#define FXDP_ANALYSIS_VIEW_DIM_MAPS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "analysis/dim_spec.h"

namespace fxdp::view_rules_internal {

// One bound argument of a view op, as the rule reads it.
struct RuleParam {
  absl::string_view name;                    // schema name, for messages.
  std::optional<std::vector<int64_t>> ints;  // nullopt: None (squeeze all dims).
  bool scalar = false;                       // an `int`, not an `int[]`.
};

// A view op applied to an input shape, its arguments bound.
struct RuleCall {
  std::string op;  // "aten::squeeze.dims", names the op in every message.
  absl::Span<const int64_t> shape;
  std::vector<RuleParam> params;

  int64_t ndim() const { return static_cast<int64_t>(shape.size()); }
  int64_t Int(int i) const { return (*params[i].ints)[0]; }
  const std::vector<int64_t>& Ints(int i) const { return *params[i].ints; }
  // INVALID_ARGUMENT "<op>: <message>".
  absl::Status Error(absl::string_view message) const;
};

using RuleFn = absl::StatusOr<DimMap> (*)(const RuleCall&);

// Parameters, in order, are those the table row binds for the rule.
absl::StatusOr<DimMap> ViewRule(const RuleCall& c);           // size
absl::StatusOr<DimMap> ReshapeRule(const RuleCall& c);        // shape
absl::StatusOr<DimMap> UnflattenRule(const RuleCall& c);      // dim, sizes
absl::StatusOr<DimMap> ExpandRule(const RuleCall& c);         // size
absl::StatusOr<DimMap> FlattenRule(const RuleCall& c);        // start_dim, end_dim
absl::StatusOr<DimMap> SqueezeRule(const RuleCall& c);        // dim (None: all)
absl::StatusOr<DimMap> UnsqueezeRule(const RuleCall& c);      // dim
absl::StatusOr<DimMap> PermuteRule(const RuleCall& c);        // dims
absl::StatusOr<DimMap> TransposeRule(const RuleCall& c);      // dim0, dim1
absl::StatusOr<DimMap> TRule(const RuleCall& c);              // (none)
absl::StatusOr<DimMap> MovedimRule(const RuleCall& c);        // source, destination
absl::StatusOr<DimMap> RepeatRule(const RuleCall& c);         // repeats
absl::StatusOr<DimMap> TileRule(const RuleCall& c);           // dims
absl::StatusOr<DimMap> PadLeftRule(const RuleCall& c);        // min_dims (atleast_1d/2d)
absl::StatusOr<DimMap> AtLeast3dRule(const RuleCall& c);      // (none)
absl::StatusOr<DimMap> ViewAsRealRule(const RuleCall& c);     // (none)
absl::StatusOr<DimMap> ViewAsComplexRule(const RuleCall& c);  // (none)

// DTensor's view_groups: the DimMap of reshaping `from` to `to` (no -1 left,
// equal element counts). Errors where torch's loop divides by zero or never
// terminates (some reshapes between zero-size shapes).
absl::StatusOr<DimMap> ViewGroups(const RuleCall& c, absl::Span<const int64_t> from,
                                  absl::Span<const int64_t> to);

}  // namespace fxdp::view_rules_internal

#endif  // FXDP_ANALYSIS_VIEW_DIM_MAPS_H_
