// A direct decoder of the fxdp.v1.GraphDef wire format (proto/fxdp/v1/graph.proto):
// reads the serialized bytes straight into ir::Node values, without building
// the protobuf message first, so decoding holds nothing but the IR being built.
//
// It accepts exactly the inputs the protobuf path (protobuf's parser, then
// DecodeGraph) accepts and builds the same Graph from them: fields in any
// order and repeated (last wins for singular scalars and strings, merge for
// singular messages, last member wins in a oneof), packed and unpacked
// repeated scalars, non-minimal varints, protobuf's limits on varint, tag and
// length encodings, strict UTF-8 in string fields, and the recursion limit
// below. Anything else is refused without a reason: DecodeGraphBytes then asks
// the protobuf path for the error text, so that text has one source. A graph
// the verifier refuses is the exception: there both paths would call
// Graph::Create with the same nodes, so its status is returned directly.
//
// tests/analysis/ir_wire_decoder_test.cc checks the field table below against
// the generated descriptors and the two decoders against each other.
#ifndef FXDP_ANALYSIS_IR_WIRE_DECODER_H_
#define FXDP_ANALYSIS_IR_WIRE_DECODER_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "analysis/ir/graph.h"
#include "analysis/ir/verifier.h"

namespace fxdp::ir {

// True with *out the graph or the verifier's error; false when the bytes are
// not an acceptable GraphDef in any other way (corrupt, unknown fields,
// unknown enum values, no format_version, a size limit...): the caller asks
// the protobuf path why. Does not check kMaxGraphBytes (DecodeGraphBytes does).
bool DecodeGraphWire(absl::string_view bytes, absl::StatusOr<Graph>* out);

namespace wire {

// Nesting limit on sub-messages and groups, as protobuf counts it (GraphDef's
// own fields are at level 0; a node's at 1, an argument's at 2). The protobuf
// path sets it as the CodedInputStream recursion limit.
inline constexpr int kRecursionLimit = 2 * kMaxListDepth + 16;

enum class WireType : uint8_t {
  kVarint = 0,
  kFixed64 = 1,
  kLengthDelimited = 2,
  kStartGroup = 3,
  kEndGroup = 4,
  kFixed32 = 5,
};

constexpr uint32_t Tag(uint32_t field, WireType type) {
  return (field << 3) | static_cast<uint32_t>(type);
}

// Field numbers of graph.proto, the only place the direct decoder takes them
// from (kFields below lists them for the test against the descriptors).
namespace graph_def {
enum : uint32_t {
  kFormatVersion = 1,
  kProducer = 2,
  kTorchVersion = 3,
  kNodes = 4,
  kMetadata = 5,
  kSymbols = 6,
  kSizeExprs = 7,
  kGuards = 8,
};
}
namespace string_pair {
enum : uint32_t { kKey = 1, kValue = 2 };
}
namespace node {
enum : uint32_t {
  kName = 1,
  kKind = 2,
  kTarget = 3,
  kArgs = 4,
  kKwargs = 5,
  kOutputs = 6,
  kPlaceholder = 7,
  kOutputSpecs = 8,
  kGradOf = 9,
  kSource = 10,
};
}
namespace target {
enum : uint32_t { kName = 1, kOverload = 2 };
}
namespace argument {
enum : uint32_t {
  kRef = 1,
  kIntValue = 2,
  kFloatValue = 3,
  kBoolValue = 4,
  kStringValue = 5,
  kNone = 6,
  kDtype = 7,
  kDevice = 8,
  kLayout = 9,
  kMemoryFormat = 10,
  kScalar = 11,
  kList = 12,
  kSizeExpr = 13,
};
}
namespace argument_list {
enum : uint32_t { kItems = 1 };
}
namespace keyword_argument {
enum : uint32_t { kName = 1, kValue = 2 };
}
namespace value_ref {
enum : uint32_t { kNode = 1, kOutput = 2 };
}
namespace device {
enum : uint32_t { kType = 1, kIndex = 2 };
}
namespace scalar {
enum : uint32_t { kIntValue = 1, kFloatValue = 2, kBoolValue = 3, kComplexValue = 4 };
}
namespace complex {
enum : uint32_t { kReal = 1, kImag = 2 };
}
namespace value_meta {
enum : uint32_t { kKind = 1, kTensor = 2 };
}
namespace tensor_meta {
enum : uint32_t {
  kShape = 1,
  kStride = 2,
  kStorageOffset = 3,
  kDtype = 4,
  kDevice = 5,
  kRequiresGrad = 6,
  kShapeExpr = 7,
  kStrideExpr = 8,
  kStorageOffsetExpr = 9,
};
}
// The symbolic-size messages (docs/shapes.md): the direct decoder reads static
// graphs only and leaves a graph that uses them to the protobuf path, which
// refuses it; the numbers are listed so that the field table stays complete.
namespace symbol {
enum : uint32_t { kName = 1, kInputNode = 2, kDim = 3, kHint = 4, kMin = 5, kMax = 6 };
}
namespace size_expr {
enum : uint32_t { kOp = 1, kValue = 2, kSymbol = 3, kOperands = 4 };
}
namespace guard {
enum : uint32_t { kKind = 1, kLhs = 2, kRhs = 3, kSource = 4 };
}
namespace placeholder_spec {
enum : uint32_t { kRole = 1, kStateName = 2, kBatchDim = 3 };
}
namespace output_spec {
enum : uint32_t { kRole = 1, kStateName = 2 };
}

// Every field of every message of graph.proto, with the wire type the direct
// decoder reads it as (packed repeated scalars: the element's type).
struct FieldSpec {
  absl::string_view message;  // full name, "fxdp.v1.Node"
  absl::string_view field;
  uint32_t number;
  WireType wire_type;
};

inline constexpr FieldSpec kFields[] = {
    {"fxdp.v1.GraphDef", "format_version", graph_def::kFormatVersion, WireType::kVarint},
    {"fxdp.v1.GraphDef", "producer", graph_def::kProducer, WireType::kLengthDelimited},
    {"fxdp.v1.GraphDef", "torch_version", graph_def::kTorchVersion, WireType::kLengthDelimited},
    {"fxdp.v1.GraphDef", "nodes", graph_def::kNodes, WireType::kLengthDelimited},
    {"fxdp.v1.GraphDef", "metadata", graph_def::kMetadata, WireType::kLengthDelimited},
    {"fxdp.v1.StringPair", "key", string_pair::kKey, WireType::kLengthDelimited},
    {"fxdp.v1.StringPair", "value", string_pair::kValue, WireType::kLengthDelimited},
    {"fxdp.v1.Node", "name", node::kName, WireType::kLengthDelimited},
    {"fxdp.v1.Node", "kind", node::kKind, WireType::kVarint},
    {"fxdp.v1.Node", "target", node::kTarget, WireType::kLengthDelimited},
    {"fxdp.v1.Node", "args", node::kArgs, WireType::kLengthDelimited},
    {"fxdp.v1.Node", "kwargs", node::kKwargs, WireType::kLengthDelimited},
    {"fxdp.v1.Node", "outputs", node::kOutputs, WireType::kLengthDelimited},
    {"fxdp.v1.Node", "placeholder", node::kPlaceholder, WireType::kLengthDelimited},
    {"fxdp.v1.Node", "output_specs", node::kOutputSpecs, WireType::kLengthDelimited},
    {"fxdp.v1.Node", "grad_of", node::kGradOf, WireType::kLengthDelimited},
    {"fxdp.v1.Node", "source", node::kSource, WireType::kLengthDelimited},
    {"fxdp.v1.Target", "name", target::kName, WireType::kLengthDelimited},
    {"fxdp.v1.Target", "overload", target::kOverload, WireType::kLengthDelimited},
    {"fxdp.v1.Argument", "ref", argument::kRef, WireType::kLengthDelimited},
    {"fxdp.v1.Argument", "int_value", argument::kIntValue, WireType::kVarint},
    {"fxdp.v1.Argument", "float_value", argument::kFloatValue, WireType::kFixed64},
    {"fxdp.v1.Argument", "bool_value", argument::kBoolValue, WireType::kVarint},
    {"fxdp.v1.Argument", "string_value", argument::kStringValue, WireType::kLengthDelimited},
    {"fxdp.v1.Argument", "none", argument::kNone, WireType::kLengthDelimited},
    {"fxdp.v1.Argument", "dtype", argument::kDtype, WireType::kVarint},
    {"fxdp.v1.Argument", "device", argument::kDevice, WireType::kLengthDelimited},
    {"fxdp.v1.Argument", "layout", argument::kLayout, WireType::kVarint},
    {"fxdp.v1.Argument", "memory_format", argument::kMemoryFormat, WireType::kVarint},
    {"fxdp.v1.Argument", "scalar", argument::kScalar, WireType::kLengthDelimited},
    {"fxdp.v1.Argument", "list", argument::kList, WireType::kLengthDelimited},
    {"fxdp.v1.ArgumentList", "items", argument_list::kItems, WireType::kLengthDelimited},
    {"fxdp.v1.KeywordArgument", "name", keyword_argument::kName, WireType::kLengthDelimited},
    {"fxdp.v1.KeywordArgument", "value", keyword_argument::kValue, WireType::kLengthDelimited},
    {"fxdp.v1.ValueRef", "node", value_ref::kNode, WireType::kVarint},
    {"fxdp.v1.ValueRef", "output", value_ref::kOutput, WireType::kVarint},
    {"fxdp.v1.Device", "type", device::kType, WireType::kVarint},
    {"fxdp.v1.Device", "index", device::kIndex, WireType::kVarint},
    {"fxdp.v1.Scalar", "int_value", scalar::kIntValue, WireType::kVarint},
    {"fxdp.v1.Scalar", "float_value", scalar::kFloatValue, WireType::kFixed64},
    {"fxdp.v1.Scalar", "bool_value", scalar::kBoolValue, WireType::kVarint},
    {"fxdp.v1.Scalar", "complex_value", scalar::kComplexValue, WireType::kLengthDelimited},
    {"fxdp.v1.Complex", "real", complex::kReal, WireType::kFixed64},
    {"fxdp.v1.Complex", "imag", complex::kImag, WireType::kFixed64},
    {"fxdp.v1.ValueMeta", "kind", value_meta::kKind, WireType::kVarint},
    {"fxdp.v1.ValueMeta", "tensor", value_meta::kTensor, WireType::kLengthDelimited},
    {"fxdp.v1.TensorMeta", "shape", tensor_meta::kShape, WireType::kVarint},
    {"fxdp.v1.TensorMeta", "stride", tensor_meta::kStride, WireType::kVarint},
    {"fxdp.v1.TensorMeta", "storage_offset", tensor_meta::kStorageOffset, WireType::kVarint},
    {"fxdp.v1.TensorMeta", "dtype", tensor_meta::kDtype, WireType::kVarint},
    {"fxdp.v1.TensorMeta", "device", tensor_meta::kDevice, WireType::kLengthDelimited},
    {"fxdp.v1.TensorMeta", "requires_grad", tensor_meta::kRequiresGrad, WireType::kVarint},
    {"fxdp.v1.PlaceholderSpec", "role", placeholder_spec::kRole, WireType::kVarint},
    {"fxdp.v1.PlaceholderSpec", "state_name", placeholder_spec::kStateName,
     WireType::kLengthDelimited},
    {"fxdp.v1.PlaceholderSpec", "batch_dim", placeholder_spec::kBatchDim, WireType::kVarint},
    {"fxdp.v1.OutputSpec", "role", output_spec::kRole, WireType::kVarint},
    {"fxdp.v1.OutputSpec", "state_name", output_spec::kStateName, WireType::kLengthDelimited},
    {"fxdp.v1.GraphDef", "symbols", graph_def::kSymbols, WireType::kLengthDelimited},
    {"fxdp.v1.GraphDef", "size_exprs", graph_def::kSizeExprs, WireType::kLengthDelimited},
    {"fxdp.v1.GraphDef", "guards", graph_def::kGuards, WireType::kLengthDelimited},
    {"fxdp.v1.TensorMeta", "shape_expr", tensor_meta::kShapeExpr, WireType::kVarint},
    {"fxdp.v1.TensorMeta", "stride_expr", tensor_meta::kStrideExpr, WireType::kVarint},
    {"fxdp.v1.TensorMeta", "storage_offset_expr", tensor_meta::kStorageOffsetExpr,
     WireType::kVarint},
    {"fxdp.v1.Argument", "size_expr", argument::kSizeExpr, WireType::kVarint},
    {"fxdp.v1.Symbol", "name", symbol::kName, WireType::kLengthDelimited},
    {"fxdp.v1.Symbol", "input_node", symbol::kInputNode, WireType::kVarint},
    {"fxdp.v1.Symbol", "dim", symbol::kDim, WireType::kVarint},
    {"fxdp.v1.Symbol", "hint", symbol::kHint, WireType::kVarint},
    {"fxdp.v1.Symbol", "min", symbol::kMin, WireType::kVarint},
    {"fxdp.v1.Symbol", "max", symbol::kMax, WireType::kVarint},
    {"fxdp.v1.SizeExpr", "op", size_expr::kOp, WireType::kVarint},
    {"fxdp.v1.SizeExpr", "value", size_expr::kValue, WireType::kVarint},
    {"fxdp.v1.SizeExpr", "symbol", size_expr::kSymbol, WireType::kVarint},
    {"fxdp.v1.SizeExpr", "operands", size_expr::kOperands, WireType::kVarint},
    {"fxdp.v1.Guard", "kind", guard::kKind, WireType::kVarint},
    {"fxdp.v1.Guard", "lhs", guard::kLhs, WireType::kVarint},
    {"fxdp.v1.Guard", "rhs", guard::kRhs, WireType::kVarint},
    {"fxdp.v1.Guard", "source", guard::kSource, WireType::kLengthDelimited},
};

}  // namespace wire
}  // namespace fxdp::ir

#endif  // FXDP_ANALYSIS_IR_WIRE_DECODER_H_
