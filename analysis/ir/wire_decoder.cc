#include "analysis/ir/wire_decoder.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "analysis/ir/wire_arguments.h"
#include "analysis/ir/wire_enums.h"
#include "analysis/ir/wire_reader.h"
#include "proto/fxdp/v1/graph.pb.h"

namespace fxdp::ir {
namespace {

using namespace wire_reader;  // NOLINT: the decoder's own reading vocabulary

// ---- The rest of the graph. These messages are never inside a oneof, so any
// unknown field or bad value refuses the input at once.

bool DecodeTarget(Reader r, Target* t) {
  return ForEachField(
      r,
      [t](uint32_t tag, Reader& in) {
        switch (tag) {
          case Tag(w::target::kName, kLen): return String(in, &t->name);
          case Tag(w::target::kOverload, kLen): return String(in, &t->overload);
          default: return Field::kUnknown;
        }
      },
      RefuseUnknown);
}

// Appends a packed (length-delimited) or unpacked (one varint) repeated int64,
// refusing more than kMaxRank entries: DecodeGraph refuses such a shape, and
// the verifier such a stride (one entry per dim).
bool ReadRankList(Reader& r, uint32_t tag, std::vector<int64_t>* out) {
  uint64_t v;
  if ((tag & 7) == static_cast<uint32_t>(WireType::kVarint)) {
    if (!ReadVarint(r, &v) || out->size() >= static_cast<size_t>(kMaxRank)) return false;
    out->push_back(static_cast<int64_t>(v));
    return true;
  }
  Reader packed;
  if (!ReadLength(r, &packed)) return false;
  const size_t n = CountVarints(packed);
  if (out->size() + n > static_cast<size_t>(kMaxRank)) return false;
  out->reserve(out->size() + n);
  while (!packed.done()) {
    if (!ReadVarint(packed, &v)) return false;
    out->push_back(static_cast<int64_t>(v));
  }
  return true;
}

struct TensorFields {
  uint32_t dtype = 0;
  DeviceFields device;
  bool has_device = false;
};

bool DecodeTensorMeta(Reader r, TensorType* t, TensorFields* f) {
  return ForEachField(
      r,
      [t, f](uint32_t tag, Reader& in) {
        switch (tag) {
          case Tag(w::tensor_meta::kShape, kLen):
          case Tag(w::tensor_meta::kShape, kVarint): return Check(ReadRankList(in, tag, &t->shape));
          case Tag(w::tensor_meta::kStride, kLen):
          case Tag(w::tensor_meta::kStride, kVarint):
            return Check(ReadRankList(in, tag, &t->stride));
          case Tag(w::tensor_meta::kStorageOffset, kVarint):
            return VarintAs(in, &t->storage_offset);
          case Tag(w::tensor_meta::kDtype, kVarint): return VarintAs(in, &f->dtype);
          case Tag(w::tensor_meta::kDevice, kLen):
            f->has_device = true;
            // TensorMeta's fields are at level 3 (node, outputs[k], tensor).
            return Message(in, [f](Reader sub) {
              return ParseDevice(sub, 4, &f->device) && !f->device.unknown;
            });
          case Tag(w::tensor_meta::kRequiresGrad, kVarint):
            return VarintBool(in, &t->requires_grad);
          case Tag(w::tensor_meta::kShapeExpr, kLen):
          case Tag(w::tensor_meta::kStrideExpr, kLen): return EmptyPacked(in);
          case Tag(w::tensor_meta::kStorageOffsetExpr, kVarint): return DefaultUint32(in);
          default: return Field::kUnknown;
        }
      },
      RefuseUnknown);
}

bool DecodeValueMeta(Reader r, ValueType* out) {
  uint32_t kind = 0;
  bool has_tensor = false;
  TensorFields f;
  const bool read = ForEachField(
      r,
      [out, &kind, &has_tensor, &f](uint32_t tag, Reader& in) {
        switch (tag) {
          case Tag(w::value_meta::kKind, kVarint): return VarintAs(in, &kind);
          case Tag(w::value_meta::kTensor, kLen):
            has_tensor = true;
            return Message(
                in, [out, &f](Reader sub) { return DecodeTensorMeta(sub, &out->tensor, &f); });
          default: return Field::kUnknown;
        }
      },
      RefuseUnknown);
  if (!read) return false;
  absl::StatusOr<ValueKind> k = ValueKindFromWire(static_cast<int>(kind));
  if (!k.ok() || has_tensor != (*k == ValueKind::kTensor)) return false;
  out->kind = *k;
  if (!has_tensor) return true;
  absl::StatusOr<DType> d = DTypeFromWire(static_cast<int>(f.dtype));
  if (!d.ok() || !f.has_device) return false;
  out->tensor.dtype = *d;
  return FinishDevice(f.device, &out->tensor.device);
}

bool DecodePlaceholder(Reader r, uint32_t* role, PlaceholderSpec* p) {
  return ForEachField(
      r,
      [role, p](uint32_t tag, Reader& in) {
        switch (tag) {
          case Tag(w::placeholder_spec::kRole, kVarint): return VarintAs(in, role);
          case Tag(w::placeholder_spec::kStateName, kLen): return String(in, &p->state_name);
          case Tag(w::placeholder_spec::kBatchDim, kVarint): return VarintLow32(in, &p->batch_dim);
          default: return Field::kUnknown;
        }
      },
      RefuseUnknown);
}

bool DecodeOutputSpec(Reader r, OutputSpec* s) {
  uint32_t role = 0;
  const bool read = ForEachField(
      r,
      [s, &role](uint32_t tag, Reader& in) {
        switch (tag) {
          case Tag(w::output_spec::kRole, kVarint): return VarintAs(in, &role);
          case Tag(w::output_spec::kStateName, kLen): return String(in, &s->state_name);
          default: return Field::kUnknown;
        }
      },
      RefuseUnknown);
  if (!read) return false;
  const std::optional<OutputRole> parsed = OutputRoleFromWire(static_cast<int>(role));
  if (!parsed.has_value()) return false;
  s->role = *parsed;
  return true;
}

struct NodeFieldCounts {
  size_t args = 0, kwargs = 0, outputs = 0, output_specs = 0;
};

NodeFieldCounts CountNodeFields(Reader r) {
  NodeFieldCounts c;
  uint32_t tag;
  while (!r.done() && ReadTag(r, &tag)) {
    switch (tag) {
      case Tag(w::node::kArgs, kLen): ++c.args; break;
      case Tag(w::node::kKwargs, kLen): ++c.kwargs; break;
      case Tag(w::node::kOutputs, kLen): ++c.outputs; break;
      case Tag(w::node::kOutputSpecs, kLen): ++c.output_specs; break;
      default: break;
    }
    if (!SkipAny(r, tag)) break;
  }
  return c;
}

bool DecodeNode(Reader r, Node* n) {
  const NodeFieldCounts c = CountNodeFields(r);
  // The verifier refuses more arguments than this.
  if (c.args + c.kwargs > static_cast<size_t>(kMaxArgsPerNode)) return false;
  n->args.reserve(c.args);
  n->kwargs.reserve(c.kwargs);
  n->outputs.reserve(std::min(c.outputs, kMaxReserveHint));
  n->output_specs.reserve(std::min(c.output_specs, kMaxReserveHint));

  uint32_t kind = 0, role = 0;
  bool has_target = false, has_placeholder = false;
  const bool read = ForEachField(
      r,
      [n, &kind, &role, &has_target, &has_placeholder](uint32_t tag, Reader& in) {
        switch (tag) {
          case Tag(w::node::kName, kLen): return String(in, &n->name);
          case Tag(w::node::kKind, kVarint): return VarintAs(in, &kind);
          case Tag(w::node::kTarget, kLen):
            has_target = true;
            return Message(in, [n](Reader sub) { return DecodeTarget(sub, &n->target); });
          case Tag(w::node::kArgs, kLen):
            // Node fields are at level 1, an argument's at 2.
            return Message(
                in, [n](Reader sub) { return DecodeArgument(sub, 2, &n->args.emplace_back()); });
          case Tag(w::node::kKwargs, kLen):
            return Message(in, [n](Reader sub) {
              return DecodeKeywordArgument(sub, &n->kwargs.emplace_back());
            });
          case Tag(w::node::kOutputs, kLen):
            return Message(
                in, [n](Reader sub) { return DecodeValueMeta(sub, &n->outputs.emplace_back()); });
          case Tag(w::node::kPlaceholder, kLen):
            has_placeholder = true;
            return Message(in, [n, &role](Reader sub) {
              return DecodePlaceholder(sub, &role, &n->placeholder);
            });
          case Tag(w::node::kOutputSpecs, kLen):
            return Message(in, [n](Reader sub) {
              return DecodeOutputSpec(sub, &n->output_specs.emplace_back());
            });
          case Tag(w::node::kGradOf, kLen): return String(in, &n->grad_of);
          case Tag(w::node::kSource, kLen): return String(in, &n->source);
          default:  // unknown field (or a known one with the wrong wire type)
            return Field::kUnknown;
        }
      },
      RefuseUnknown);
  if (!read) return false;
  const std::optional<NodeKind> parsed_kind = NodeKindFromWire(static_cast<int>(kind));
  if (!parsed_kind.has_value()) return false;
  n->kind = *parsed_kind;
  if (!has_target || has_placeholder != (n->kind == NodeKind::kPlaceholder)) return false;
  if (has_placeholder) {
    const std::optional<PlaceholderRole> parsed = PlaceholderRoleFromWire(static_cast<int>(role));
    if (!parsed.has_value()) return false;
    n->placeholder.role = *parsed;
  }
  return true;
}

bool DecodeStringPair(Reader r, std::pair<std::string, std::string>* kv) {
  return ForEachField(
      r,
      [kv](uint32_t tag, Reader& in) {
        switch (tag) {
          case Tag(w::string_pair::kKey, kLen): return String(in, &kv->first);
          case Tag(w::string_pair::kValue, kLen): return String(in, &kv->second);
          default: return Field::kUnknown;
        }
      },
      RefuseUnknown);
}

}  // namespace

bool DecodeGraphWire(absl::string_view bytes, absl::StatusOr<Graph>* out) {
  const auto* begin = reinterpret_cast<const uint8_t*>(bytes.data());
  Reader r{begin, begin + bytes.size()};
  const size_t node_count = CountField(r, w::graph_def::kNodes);
  if (node_count > static_cast<size_t>(kMaxNodes)) return false;
  std::vector<Node> nodes;
  nodes.reserve(node_count);
  GraphHeader h;
  h.format_version = 0;
  const bool read = ForEachField(
      r,
      [&h, &nodes](uint32_t tag, Reader& in) {
        switch (tag) {
          case Tag(w::graph_def::kFormatVersion, kVarint):
            return VarintLow32(in, &h.format_version);
          case Tag(w::graph_def::kProducer, kLen): return String(in, &h.producer);
          case Tag(w::graph_def::kTorchVersion, kLen): return String(in, &h.torch_version);
          case Tag(w::graph_def::kNodes, kLen):
            return Message(in, [&nodes](Reader sub) {
              return nodes.size() < static_cast<size_t>(kMaxNodes) &&
                     DecodeNode(sub, &nodes.emplace_back());
            });
          case Tag(w::graph_def::kMetadata, kLen):
            return Message(
                in, [&h](Reader sub) { return DecodeStringPair(sub, &h.metadata.emplace_back()); });
          default: return Field::kUnknown;  // unknown field, wrong wire type, or corrupt
        }
      },
      RefuseUnknown);
  if (!read) return false;
  // A missing version is DecodeGraph's error; any other is the verifier's.
  if (h.format_version == 0) return false;
  *out = Graph::Create(std::move(h), std::move(nodes));
  return true;
}

}  // namespace fxdp::ir
