#include "analysis/ir/proto_codec.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "analysis/ir/node_error.h"
#include "analysis/ir/verifier.h"
#include "analysis/ir/wire_decoder.h"
#include "analysis/ir/wire_enums.h"
#include "google/protobuf/arena.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/unknown_field_set.h"
#include "util/status_macros.h"

namespace fxdp::ir {
namespace {

namespace pb = ::google::protobuf;

// Unknown fields anywhere in the message tree mean the sender speaks a
// newer (or different) format: refuse rather than silently drop data.
absl::Status CheckNoUnknownFields(const pb::Message& m, const std::string& path) {
  const pb::Reflection* r = m.GetReflection();
  const pb::UnknownFieldSet& unknown = r->GetUnknownFields(m);
  if (!unknown.empty())
    return absl::InvalidArgumentError(absl::StrCat(
        path, " (", m.GetDescriptor()->full_name(), ") has unknown field number ",
        unknown.field(0).number(), "; it was written by a newer or different producer"));
  std::vector<const pb::FieldDescriptor*> fields;
  r->ListFields(m, &fields);
  for (const pb::FieldDescriptor* f : fields) {
    if (f->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (f->is_repeated()) {
      for (int i = 0; i < r->FieldSize(m, f); ++i)
        FXDP_RETURN_IF_ERROR(CheckNoUnknownFields(r->GetRepeatedMessage(m, f, i),
                                                  absl::StrCat(path, ".", f->name(), "[", i, "]")));
    } else {
      FXDP_RETURN_IF_ERROR(
          CheckNoUnknownFields(r->GetMessage(m, f), absl::StrCat(path, ".", f->name())));
    }
  }
  return absl::OkStatus();
}

class Decoder {
 public:
  explicit Decoder(const v1::GraphDef& def) : def_(def) {}

  // Decodes in one pass, noting whether any message carried unknown fields
  // (a cheap per-message check); only then, or when decoding fails, does the
  // reflective walk run to name the exact path.
  absl::StatusOr<Graph> Run() {
    absl::StatusOr<Graph> g = RunFast();
    if (saw_unknown_ || !g.ok()) FXDP_RETURN_IF_ERROR(CheckNoUnknownFields(def_, "GraphDef"));
    return g;
  }

 private:
  template <typename M>
  static bool Unknown(const M& m) {
    return !m.GetReflection()->GetUnknownFields(m).empty();
  }
  void Seen(bool unknown) { saw_unknown_ |= unknown; }

  // A symbolic graph (docs/shapes.md) is instantiated at concrete shapes before
  // anything decodes it: decoding its hints as sizes would run the traced
  // example's shapes for every batch.
  static absl::Status Symbolic(absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat(what,
                     " (docs/shapes.md): instantiate it at concrete input shapes first; "
                     "this reader takes static graphs only"));
  }

  absl::StatusOr<Graph> RunFast() {
    Seen(Unknown(def_));
    GraphHeader h;
    h.format_version = def_.format_version();
    if (def_.symbols_size() > 0 || def_.size_exprs_size() > 0 || def_.guards_size() > 0)
      return Symbolic(absl::StrCat("the graph has ", def_.symbols_size(), " symbolic sizes and ",
                                   def_.guards_size(), " guards"));
    if (h.format_version == v1::FORMAT_VERSION_UNSPECIFIED)
      return absl::InvalidArgumentError("GraphDef has no format_version");
    h.producer = def_.producer();
    h.torch_version = def_.torch_version();
    for (const v1::StringPair& kv : def_.metadata()) {
      Seen(Unknown(kv));
      h.metadata.emplace_back(kv.key(), kv.value());
    }
    if (def_.nodes_size() > kMaxNodes)
      return absl::InvalidArgumentError(
          absl::StrCat("graph has ", def_.nodes_size(), " nodes, more than the limit ", kMaxNodes));
    std::vector<Node> nodes;
    nodes.reserve(def_.nodes_size());
    for (int i = 0; i < def_.nodes_size(); ++i) {
      FXDP_ASSIGN_OR_RETURN(Node n, DecodeNode(i, def_.nodes(i)));
      nodes.push_back(std::move(n));
    }
    if (saw_unknown_) return absl::InvalidArgumentError("unknown fields");  // named by Run()
    return Graph::Create(std::move(h), std::move(nodes));
  }

  absl::Status Error(int i, const v1::Node& n, absl::string_view msg) {
    // Not decoded yet: named by its position.
    return NodeError(n.name(), absl::StrCat("#", i), msg);
  }

  absl::StatusOr<Node> DecodeNode(int i, const v1::Node& d) {
    Seen(Unknown(d) || Unknown(d.target()));
    Node n;
    n.name = d.name();
    const std::optional<NodeKind> kind = NodeKindFromWire(d.kind());
    if (!kind.has_value()) {
      return Error(i, d,
                   absl::StrCat("unknown or missing node kind (enum value ",
                                static_cast<int>(d.kind()), ")"));
    }
    n.kind = *kind;
    if (!d.has_target()) return Error(i, d, "has no target");
    n.target = {d.target().name(), d.target().overload()};
    n.args.reserve(d.args_size());
    for (int k = 0; k < d.args_size(); ++k) {
      auto a = DecodeArgument(d.args(k), 0);
      if (!a.ok()) return Error(i, d, absl::StrCat("argument ", k, ": ", a.status().message()));
      n.args.push_back(*std::move(a));
    }
    for (const v1::KeywordArgument& kw : d.kwargs()) {
      Seen(Unknown(kw));
      if (!kw.has_value())
        return Error(i, d, absl::StrCat("keyword argument '", kw.name(), "' has no value"));
      auto a = DecodeArgument(kw.value(), 0);
      if (!a.ok())
        return Error(i, d,
                     absl::StrCat("keyword argument '", kw.name(), "': ", a.status().message()));
      n.kwargs.push_back({kw.name(), *std::move(a)});
    }
    for (int k = 0; k < d.outputs_size(); ++k) {
      auto v = DecodeValueMeta(d.outputs(k));
      if (!v.ok()) return Error(i, d, absl::StrCat("output ", k, ": ", v.status().message()));
      n.outputs.push_back(*std::move(v));
    }
    if (d.has_placeholder() != (n.kind == NodeKind::kPlaceholder))
      return Error(
          i, d,
          n.kind == NodeKind::kPlaceholder
              ? "placeholder has no placeholder spec (role, state name)"
              : absl::StrCat("a ", NodeKindName(n.kind), " node carries a placeholder spec"));
    if (d.has_placeholder()) {
      const v1::PlaceholderSpec& p = d.placeholder();
      Seen(Unknown(p));
      const std::optional<PlaceholderRole> role = PlaceholderRoleFromWire(p.role());
      if (!role.has_value()) {
        return Error(i, d,
                     absl::StrCat("placeholder role is missing or unknown (enum value ",
                                  static_cast<int>(p.role()), ")"));
      }
      n.placeholder.role = *role;
      n.placeholder.state_name = p.state_name();
      n.placeholder.batch_dim = p.batch_dim();
    }
    for (int k = 0; k < d.output_specs_size(); ++k) {
      const v1::OutputSpec& s = d.output_specs(k);
      Seen(Unknown(s));
      OutputSpec spec;
      const std::optional<OutputRole> role = OutputRoleFromWire(s.role());
      if (!role.has_value()) {
        return Error(
            i, d,
            absl::StrCat("returned value ", k, ": output role is missing or unknown (enum value ",
                         static_cast<int>(s.role()), ")"));
      }
      spec.role = *role;
      spec.state_name = s.state_name();
      n.output_specs.push_back(std::move(spec));
    }
    n.grad_of = d.grad_of();
    n.source = d.source();
    return n;
  }

  absl::StatusOr<Device> DecodeDevice(const v1::Device& d) {
    Seen(Unknown(d));
    FXDP_ASSIGN_OR_RETURN(DeviceType t, DeviceTypeFromWire(d.type()));
    if (d.index() < -1)
      return absl::InvalidArgumentError(absl::StrCat("device index ", d.index(), " is negative"));
    return Device{t, d.index()};
  }

  absl::StatusOr<ValueType> DecodeValueMeta(const v1::ValueMeta& m) {
    Seen(Unknown(m));
    FXDP_ASSIGN_OR_RETURN(ValueKind kind, ValueKindFromWire(m.kind()));
    if (m.has_tensor() != (kind == ValueKind::kTensor))
      return absl::InvalidArgumentError(kind == ValueKind::kTensor
                                            ? "tensor value without tensor metadata"
                                            : "non-tensor value carries tensor metadata");
    if (kind != ValueKind::kTensor) return ValueType::Of(kind);
    const v1::TensorMeta& t = m.tensor();
    Seen(Unknown(t));
    if (t.shape_expr_size() > 0 || t.stride_expr_size() > 0 || t.storage_offset_expr() != 0)
      return Symbolic("a tensor has symbolic sizes");
    TensorType tt;
    if (t.shape_size() > kMaxRank)
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", t.shape_size(), " exceeds the limit of ", kMaxRank));
    tt.shape.assign(t.shape().begin(), t.shape().end());
    tt.stride.assign(t.stride().begin(), t.stride().end());
    tt.storage_offset = t.storage_offset();
    FXDP_ASSIGN_OR_RETURN(tt.dtype, DTypeFromWire(t.dtype()));
    if (!t.has_device()) return absl::InvalidArgumentError("tensor metadata has no device");
    FXDP_ASSIGN_OR_RETURN(tt.device, DecodeDevice(t.device()));
    tt.requires_grad = t.requires_grad();
    return ValueType::Tensor(std::move(tt));
  }

  absl::StatusOr<Argument> DecodeArgument(const v1::Argument& a, int depth) {
    Seen(Unknown(a));
    if (a.size_expr() != 0) return Symbolic("an argument is a symbolic size");
    if (depth > kMaxListDepth)
      return absl::InvalidArgumentError(absl::StrCat("lists nested deeper than ", kMaxListDepth));
    switch (a.value_case()) {
      case v1::Argument::kRef:
        Seen(Unknown(a.ref()));
        if (a.ref().node() > static_cast<uint32_t>(kMaxNodes) || a.ref().output() > (1u << 30))
          return absl::InvalidArgumentError(absl::StrCat("reference to node #", a.ref().node(),
                                                         " output ", a.ref().output(),
                                                         " is out of range"));
        return Argument(ValueRef{NodeId{static_cast<int32_t>(a.ref().node())},
                                 static_cast<int32_t>(a.ref().output())});
      case v1::Argument::kIntValue: return Argument(int64_t{a.int_value()});
      case v1::Argument::kFloatValue: return Argument(a.float_value());
      case v1::Argument::kBoolValue: return Argument(a.bool_value());
      case v1::Argument::kStringValue: return Argument(a.string_value());
      case v1::Argument::kNone: Seen(Unknown(a.none())); return Argument(NoneArg{});
      case v1::Argument::kDtype: {
        FXDP_ASSIGN_OR_RETURN(DType d, DTypeFromWire(a.dtype()));
        return Argument(d);
      }
      case v1::Argument::kDevice: {
        FXDP_ASSIGN_OR_RETURN(Device d, DecodeDevice(a.device()));
        return Argument(d);
      }
      case v1::Argument::kLayout: {
        FXDP_ASSIGN_OR_RETURN(Layout l, LayoutFromWire(a.layout()));
        return Argument(l);
      }
      case v1::Argument::kMemoryFormat: {
        FXDP_ASSIGN_OR_RETURN(MemoryFormat m, MemoryFormatFromWire(a.memory_format()));
        return Argument(m);
      }
      case v1::Argument::kScalar: {
        const v1::Scalar& s = a.scalar();
        Seen(Unknown(s) || (s.has_complex_value() && Unknown(s.complex_value())));
        switch (s.value_case()) {
          case v1::Scalar::kIntValue: return Argument(Scalar{int64_t{s.int_value()}});
          case v1::Scalar::kFloatValue: return Argument(Scalar{s.float_value()});
          case v1::Scalar::kBoolValue: return Argument(Scalar{s.bool_value()});
          case v1::Scalar::kComplexValue:
            return Argument(
                Scalar{std::complex<double>(s.complex_value().real(), s.complex_value().imag())});
          default: return absl::InvalidArgumentError("scalar argument has no value");
        }
      }
      case v1::Argument::kList: {
        Seen(Unknown(a.list()));
        Argument::List items;
        items.reserve(a.list().items_size());
        for (int k = 0; k < a.list().items_size(); ++k) {
          auto item = DecodeArgument(a.list().items(k), depth + 1);
          if (!item.ok())
            return absl::InvalidArgumentError(
                absl::StrCat("list item ", k, ": ", item.status().message()));
          items.push_back(*std::move(item));
        }
        return Argument(std::move(items));
      }
      case v1::Argument::VALUE_NOT_SET: break;
    }
    return absl::InvalidArgumentError("argument has no value");
  }

  const v1::GraphDef& def_;
  bool saw_unknown_ = false;
};

void EncodeDevice(const Device& d, v1::Device* out) {
  out->set_type(static_cast<v1::DeviceType>(DeviceTypeToWire(d.type)));
  out->set_index(d.index);
}

struct ArgumentEncoder {
  v1::Argument* out;
  void operator()(const ValueRef& r) const {
    out->mutable_ref()->set_node(r.node.value);
    out->mutable_ref()->set_output(r.output);
  }
  void operator()(int64_t v) const { out->set_int_value(v); }
  void operator()(double v) const { out->set_float_value(v); }
  void operator()(bool v) const { out->set_bool_value(v); }
  void operator()(const std::string& v) const { out->set_string_value(v); }
  void operator()(const NoneArg&) const { out->mutable_none(); }
  void operator()(DType d) const { out->set_dtype(static_cast<v1::DType>(DTypeToWire(d))); }
  void operator()(const Device& d) const { EncodeDevice(d, out->mutable_device()); }
  void operator()(Layout l) const { out->set_layout(static_cast<v1::Layout>(LayoutToWire(l))); }
  void operator()(MemoryFormat m) const {
    out->set_memory_format(static_cast<v1::MemoryFormat>(MemoryFormatToWire(m)));
  }
  void operator()(const Scalar& s) const {
    v1::Scalar* o = out->mutable_scalar();
    std::visit(
        [o](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, int64_t>)
            o->set_int_value(v);
          else if constexpr (std::is_same_v<T, double>)
            o->set_float_value(v);
          else if constexpr (std::is_same_v<T, bool>)
            o->set_bool_value(v);
          else {
            o->mutable_complex_value()->set_real(v.real());
            o->mutable_complex_value()->set_imag(v.imag());
          }
        },
        s.value);
  }
  void operator()(const Argument::List& l) const {
    v1::ArgumentList* o = out->mutable_list();
    for (const Argument& a : l) std::visit(ArgumentEncoder{o->add_items()}, a.value());
  }
};

}  // namespace

absl::StatusOr<Graph> DecodeGraph(const v1::GraphDef& def) { return Decoder(def).Run(); }

namespace {

absl::Status TooLarge(absl::string_view bytes) {
  return absl::InvalidArgumentError(absl::StrCat("serialized graph is ", bytes.size(),
                                                 " bytes, more than the limit ", kMaxGraphBytes));
}

}  // namespace

absl::StatusOr<Graph> DecodeGraphBytes(absl::string_view bytes) {
  if (static_cast<int64_t>(bytes.size()) > kMaxGraphBytes) return TooLarge(bytes);
  // The direct decoder accepts and builds exactly what the message path does;
  // when it refuses, the message path words the error.
  absl::StatusOr<Graph> g;
  if (DecodeGraphWire(bytes, &g)) return g;
  return DecodeGraphBytesViaMessage(bytes);
}

absl::StatusOr<v1::GraphDef*> ParseGraphDefBytes(absl::string_view bytes, pb::Arena* arena) {
  if (static_cast<int64_t>(bytes.size()) > kMaxGraphBytes) return TooLarge(bytes);
  v1::GraphDef* def = pb::Arena::CreateMessage<v1::GraphDef>(arena);
  pb::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                              static_cast<int>(bytes.size()));
  in.SetRecursionLimit(wire::kRecursionLimit);
  if (!def->ParseFromCodedStream(&in) || !in.ConsumedEntireMessage())
    return absl::InvalidArgumentError(
        absl::StrCat("bytes are not a valid fxdp.v1.GraphDef (", bytes.size(),
                     " bytes; truncated, corrupt, or nested too deeply)"));
  return def;
}

absl::StatusOr<Graph> DecodeGraphBytesViaMessage(absl::string_view bytes) {
  // An arena: the parsed message is freed in a few large blocks, not node by node.
  pb::ArenaOptions options;
  options.start_block_size = 64 << 10;
  options.max_block_size = 8 << 20;
  pb::Arena arena(options);
  FXDP_ASSIGN_OR_RETURN(v1::GraphDef * def, ParseGraphDefBytes(bytes, &arena));
  return DecodeGraph(*def);
}

v1::GraphDef EncodeGraph(const Graph& g) {
  v1::GraphDef def;
  const GraphHeader& h = g.header();
  def.set_format_version(static_cast<v1::FormatVersion>(h.format_version));
  def.set_producer(h.producer);
  def.set_torch_version(h.torch_version);
  def.mutable_nodes()->Reserve(g.size());
  for (const Node& n : g.nodes()) {
    v1::Node* d = def.add_nodes();
    d->set_name(n.name);
    d->set_kind(static_cast<v1::NodeKind>(NodeKindToWire(n.kind)));
    d->mutable_target()->set_name(n.target.name);
    d->mutable_target()->set_overload(n.target.overload);
    for (const Argument& a : n.args) std::visit(ArgumentEncoder{d->add_args()}, a.value());
    for (const KeywordArgument& kw : n.kwargs) {
      v1::KeywordArgument* k = d->add_kwargs();
      k->set_name(kw.name);
      std::visit(ArgumentEncoder{k->mutable_value()}, kw.value.value());
    }
    for (const ValueType& v : n.outputs) {
      v1::ValueMeta* m = d->add_outputs();
      m->set_kind(static_cast<v1::ValueKind>(ValueKindToWire(v.kind)));
      if (!v.is_tensor()) continue;
      v1::TensorMeta* t = m->mutable_tensor();
      for (int64_t s : v.tensor.shape) t->add_shape(s);
      for (int64_t s : v.tensor.stride) t->add_stride(s);
      t->set_storage_offset(v.tensor.storage_offset);
      t->set_dtype(static_cast<v1::DType>(DTypeToWire(v.tensor.dtype)));
      EncodeDevice(v.tensor.device, t->mutable_device());
      t->set_requires_grad(v.tensor.requires_grad);
    }
    if (n.is_placeholder()) {
      v1::PlaceholderSpec* p = d->mutable_placeholder();
      p->set_role(static_cast<v1::PlaceholderRole>(PlaceholderRoleToWire(n.placeholder.role)));
      p->set_state_name(n.placeholder.state_name);
      p->set_batch_dim(n.placeholder.batch_dim);
    }
    for (const OutputSpec& s : n.output_specs) {
      v1::OutputSpec* o = d->add_output_specs();
      o->set_role(static_cast<v1::OutputRole>(OutputRoleToWire(s.role)));
      o->set_state_name(s.state_name);
    }
    d->set_grad_of(n.grad_of);
    d->set_source(n.source);
  }
  for (const auto& [k, v] : h.metadata) {
    v1::StringPair* kv = def.add_metadata();
    kv->set_key(k);
    kv->set_value(v);
  }
  return def;
}

std::string EncodeGraphBytes(const Graph& g) {
  std::string out;
  EncodeGraph(g).SerializeToString(&out);
  return out;
}

absl::StatusOr<std::string> ReadFileBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  f.seekg(0, std::ios::end);
  const std::streamoff size = f.tellg();
  if (size < 0) return absl::InternalError(absl::StrCat("cannot read '", path, "'"));
  if (size > kMaxGraphBytes)
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is ", size, " bytes, more than the limit ", kMaxGraphBytes));
  std::string bytes(static_cast<size_t>(size), '\0');
  f.seekg(0);
  f.read(bytes.data(), size);
  if (!f) return absl::InternalError(absl::StrCat("short read on '", path, "'"));
  return bytes;
}

absl::StatusOr<Graph> ReadGraphFile(const std::string& path) {
  FXDP_ASSIGN_OR_RETURN(std::string bytes, ReadFileBytes(path));
  auto g = DecodeGraphBytes(bytes);
  if (!g.ok())
    return absl::Status(g.status().code(), absl::StrCat(path, ": ", g.status().message()));
  return g;
}

absl::Status WriteGraphFile(const Graph& g, const std::string& path) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return absl::PermissionDeniedError(absl::StrCat("cannot write '", path, "'"));
  const std::string bytes = EncodeGraphBytes(g);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) return absl::InternalError(absl::StrCat("short write on '", path, "'"));
  return absl::OkStatus();
}

}  // namespace fxdp::ir
