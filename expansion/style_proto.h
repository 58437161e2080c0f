// The data-parallel style on the wire (compile.proto's DataParallelStyle,
// used by ExpandRequest, ExpandResponse, JobSpec, JobInfo) and in the library
// (ExpandOptions::style): the one mapping between them, for the server and
// the CLI. Header-only; the user of it links fxdp_proto.
#ifndef FXDP_EXPANSION_STYLE_PROTO_H_
#define FXDP_EXPANSION_STYLE_PROTO_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "expansion/data_parallel.h"
#include "expansion/state_memory.h"
#include "proto/fxdp/v1/compile.pb.h"

namespace fxdp {

inline v1::DataParallelStyle StyleToProto(DataParallelStyle s) {
  return s == DataParallelStyle::kFullyShard ? v1::DATA_PARALLEL_STYLE_FULLY_SHARD
                                             : v1::DATA_PARALLEL_STYLE_REPLICATE;
}

// INVALID_ARGUMENT for a value this build does not know (proto3 keeps unknown
// enum numbers), naming `field` and the accepted values.
inline absl::StatusOr<DataParallelStyle> StyleFromProto(int value, absl::string_view field) {
  switch (value) {
    case v1::DATA_PARALLEL_STYLE_REPLICATE: return DataParallelStyle::kReplicate;
    case v1::DATA_PARALLEL_STYLE_FULLY_SHARD: return DataParallelStyle::kFullyShard;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": unknown data-parallel style ", value, "; accepted: ",
          v1::DATA_PARALLEL_STYLE_REPLICATE, " (DATA_PARALLEL_STYLE_REPLICATE, the default), ",
          v1::DATA_PARALLEL_STYLE_FULLY_SHARD, " (DATA_PARALLEL_STYLE_FULLY_SHARD)"));
  }
}

// "replicate", "fully_shard" (DataParallelStyleName), or "unknown (N)".
inline std::string StyleName(int value) {
  absl::StatusOr<DataParallelStyle> s = StyleFromProto(value, "");
  return s.ok() ? std::string(DataParallelStyleName(*s)) : absl::StrCat("unknown (", value, ")");
}

inline v1::StateMemory StateMemoryToProto(const StateMemory& m) {
  v1::StateMemory p;
  p.set_world_size(m.world_size);
  p.set_style(StyleToProto(m.style));
  p.set_parameter_bytes(m.parameter_bytes);
  p.set_gradient_bytes(m.gradient_bytes);
  p.set_optimizer_state_bytes(m.optimizer_state_bytes);
  p.set_other_state_bytes(m.other_state_bytes);
  p.set_largest_unit_bytes(m.largest_unit_bytes);
  p.set_gathered_bytes(m.gathered_bytes);
  p.set_largest_bucket_bytes(m.largest_bucket_bytes);
  p.set_total_bytes(m.total_bytes());
  return p;
}

// An unknown style reads as REPLICATE (the figures are what they are).
inline StateMemory StateMemoryFromProto(const v1::StateMemory& p) {
  StateMemory m;
  m.world_size = p.world_size();
  m.style = StyleFromProto(p.style(), "").value_or(DataParallelStyle::kReplicate);
  m.parameter_bytes = p.parameter_bytes();
  m.gradient_bytes = p.gradient_bytes();
  m.optimizer_state_bytes = p.optimizer_state_bytes();
  m.other_state_bytes = p.other_state_bytes();
  m.largest_unit_bytes = p.largest_unit_bytes();
  m.gathered_bytes = p.gathered_bytes();
  m.largest_bucket_bytes = p.largest_bucket_bytes();
  return m;
}

}  // namespace fxdp

#endif  // FXDP_EXPANSION_STYLE_PROTO_H_
