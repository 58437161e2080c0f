// The functional collectives of fxdp graphs (torch's `_c10d_functional`
// ops): the one place their names are spelled. The expansion emits them,
// the schedule moves them, the interpreter runs them.
#ifndef FXDP_ANALYSIS_IR_COLLECTIVES_H_
#define FXDP_ANALYSIS_IR_COLLECTIVES_H_

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace fxdp::ir {

inline constexpr absl::string_view kCollectiveNamespace = "_c10d_functional";
// all_reduce(Tensor input, str reduce_op, str group_name) -> Tensor
inline constexpr absl::string_view kAllReduce = "_c10d_functional::all_reduce";
// all_gather_into_tensor(Tensor input, int group_size, str group_name) -> Tensor
inline constexpr absl::string_view kAllGather = "_c10d_functional::all_gather_into_tensor";
// reduce_scatter_tensor(Tensor input, str reduce_op, int group_size, str group_name) -> Tensor
inline constexpr absl::string_view kReduceScatter = "_c10d_functional::reduce_scatter_tensor";
// wait_tensor(Tensor tensor) -> Tensor: waits for the collective that made it.
inline constexpr absl::string_view kWaitTensor = "_c10d_functional::wait_tensor";

// Whether an op target name ("_c10d_functional::all_reduce") is a
// functional collective.
inline bool IsCollective(absl::string_view target_name) {
  return absl::StartsWith(target_name, kCollectiveNamespace) &&
         absl::StartsWith(target_name.substr(kCollectiveNamespace.size()), "::");
}

}  // namespace fxdp::ir

#endif  // FXDP_ANALYSIS_IR_COLLECTIVES_H_
