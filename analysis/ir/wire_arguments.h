// Internal to the direct wire decoder (wire_decoder.h): Argument messages
// (the oneof tree of ints, refs, scalars, devices, nested lists) and keyword
// arguments, accepted exactly as the protobuf path accepts them.
#ifndef FXDP_ANALYSIS_IR_WIRE_ARGUMENTS_H_
#define FXDP_ANALYSIS_IR_WIRE_ARGUMENTS_H_

#include <cstdint>

#include "analysis/ir/graph.h"
#include "analysis/ir/wire_reader.h"

namespace fxdp::ir::wire_reader {

// A Device message (inside an Argument, and a TensorMeta's device): an
// unknown field is recorded, not refused, as a oneof member needs.
struct DeviceFields {
  uint32_t type = 0;
  int32_t index = 0;
  bool unknown = false;
};
bool ParseDevice(Reader r, int level, DeviceFields* d);
// False for an unknown field, an index below -1 or an unknown device type.
bool FinishDevice(const DeviceFields& d, Device* out);

// The common arguments, a lone ref or int, without the general machinery.
// Returns false when `r` holds anything else, or anything near the nesting
// limit (nothing is written then: ParseArgument decides); otherwise *ok says
// whether the argument is acceptable.
inline bool DecodeSimpleArgument(Reader r, int level, int depth, Argument* out, bool* ok) {
  uint32_t tag;
  uint64_t v;
  if (level + 1 > kRecursionLimit || !ReadTag(r, &tag)) return false;
  if (tag == Tag(w::argument::kIntValue, kVarint)) {
    if (!ReadVarint(r, &v) || !r.done()) return false;
    *ok = depth <= kMaxListDepth;
    if (*ok) *out = Argument(static_cast<int64_t>(v));
    return true;
  }
  Reader ref;
  if (tag != Tag(w::argument::kRef, kLen) || !ReadLength(r, &ref) || !r.done()) return false;
  uint32_t node = 0, output = 0;
  while (!ref.done()) {
    if (!ReadTag(ref, &tag) || !ReadVarint(ref, &v)) return false;
    if (tag == Tag(w::value_ref::kNode, kVarint))
      node = static_cast<uint32_t>(v);
    else if (tag == Tag(w::value_ref::kOutput, kVarint))
      output = static_cast<uint32_t>(v);
    else
      return false;
  }
  *ok = depth <= kMaxListDepth && node <= static_cast<uint32_t>(kMaxNodes) && output <= (1u << 30);
  if (*ok)
    *out = Argument(ValueRef{NodeId{static_cast<int32_t>(node)}, static_cast<int32_t>(output)});
  return true;
}

// Any argument DecodeSimpleArgument does not take (wire_arguments.cc).
bool DecodeGeneralArgument(Reader r, int level, Argument* out);

// A top-level argument (node.args[k], or a keyword argument's value), its
// fields at `level`.
inline bool DecodeArgument(Reader r, int level, Argument* out) {
  bool ok;
  if (DecodeSimpleArgument(r, level, 0, out, &ok)) return ok;
  return DecodeGeneralArgument(r, level, out);
}

// A KeywordArgument message (its fields at level 2).
bool DecodeKeywordArgument(Reader r, KeywordArgument* kw);

}  // namespace fxdp::ir::wire_reader

#endif  // FXDP_ANALYSIS_IR_WIRE_ARGUMENTS_H_
