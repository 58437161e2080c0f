#include "analysis/ir/instantiate.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "google/protobuf/arena.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "analysis/ir/node_error.h"
#include "analysis/ir/proto_codec.h"
#include "analysis/ir/size_exprs.h"
#include "analysis/ir/type_text.h"
#include "analysis/ir/verifier.h"
#include "analysis/ir/wire_decoder.h"
#include "analysis/ir/wire_enums.h"
#include "util/status_macros.h"

namespace fxdp::ir {
namespace {

using absl::InvalidArgumentError;

constexpr char kWhatToDo[] =
    "pad the batch to a shape the trace allows (a collator's pad_to_multiple_of), drop a "
    "partial last batch (DataLoader(drop_last=True)), or re-trace with this batch as the example";

std::vector<int64_t> Ints(const google::protobuf::RepeatedField<int64_t>& r) {
  return {r.begin(), r.end()};
}

bool IsInput(const v1::Node& n) {
  return n.kind() == v1::PLACEHOLDER && n.placeholder().role() == v1::INPUT &&
         n.outputs_size() == 1 && n.outputs(0).kind() == v1::TENSOR;
}

// NodeLabel of a node not decoded yet.
std::string DefNodeLabel(const v1::Node& n) {
  std::string op = n.target().overload().empty()
                       ? n.target().name()
                       : absl::StrCat(n.target().name(), ".", n.target().overload());
  if (n.kind() != v1::CALL_FUNCTION) {
    const std::optional<NodeKind> k = NodeKindFromWire(n.kind());
    op = k.has_value() ? std::string(NodeKindName(*k)) : "node";
  }
  std::string s = NodeLabel(n.name(), op);
  if (!n.source().empty()) absl::StrAppend(&s, " [", n.source().substr(0, 400), "]");
  return s;
}

// A static graph with `shapes`: each named input must have the graph's shape.
absl::Status CheckStaticShapes(const Graph& g, const InputShapes& shapes) {
  for (const auto& [name, shape] : shapes) {
    const std::optional<NodeId> id = g.FindState(name);
    const Node* n = id.has_value() ? &g.node(*id) : nullptr;
    if (n == nullptr || n->placeholder.role != PlaceholderRole::kInput)
      return InvalidArgumentError(absl::StrCat("the graph has no input '", name, "'"));
    const std::vector<int64_t>& traced = n->outputs[0].tensor.shape;
    if (shape != traced)
      return InvalidArgumentError(
          absl::StrCat("input '", name, "' is ", ShapeText(shape),
                       ", but the graph is static, traced at ", ShapeText(traced),
                       ": re-trace with symbolic sizes (trace_step(..., dynamic=True)), "
                       "or with this batch as the example"));
  }
  return absl::OkStatus();
}

class Instantiator {
 public:
  Instantiator(const v1::GraphDef& def, const InputShapes& shapes) : def_(def), shapes_(shapes) {}

  absl::StatusOr<v1::GraphDef> Run() {
    FXDP_RETURN_IF_ERROR(CheckSizeExprs(def_));
    for (const v1::Node& n : def_.nodes()) FXDP_RETURN_IF_ERROR(CheckNodeExprs(n));
    FXDP_RETURN_IF_ERROR(CheckNames());
    FXDP_RETURN_IF_ERROR(BindSymbols());
    // A zero divisor marks its entries undefined: the guards, checked first, refuse such a
    // batch by name (chunk(3) of 4 rows); an undefined entry left after them fails by itself.
    FXDP_ASSIGN_OR_RETURN(values_, EvaluateSizeExprs(def_, symbols_, &undefined_));
    for (const v1::Node& n : def_.nodes())
      if (IsInput(n)) FXDP_RETURN_IF_ERROR(CheckInput(n));
    for (const v1::Guard& g : def_.guards()) FXDP_RETURN_IF_ERROR(CheckGuard(g));
    if (std::find(undefined_.begin(), undefined_.end(), true) != undefined_.end())
      return EvaluateSizeExprs(def_, symbols_).status();
    v1::GraphDef out = def_;
    out.clear_symbols();
    out.clear_size_exprs();
    out.clear_guards();
    for (v1::Node& n : *out.mutable_nodes()) FXDP_RETURN_IF_ERROR(Substitute(&n));
    return out;
  }

 private:
  std::string At() const { return absl::StrCat("at ", InputShapesText(shapes_), ": "); }

  // The indices a node refers to, before anything reads them.
  absl::Status CheckIndices(const v1::Node& n, absl::string_view what,
                            const google::protobuf::RepeatedField<uint32_t>& exprs, int dims) {
    if (!exprs.empty() && exprs.size() != dims)
      return InvalidArgumentError(absl::StrCat(DefNodeLabel(n), ": ", what, " has ", exprs.size(),
                                               " entries for ", dims, " dims"));
    for (uint32_t e : exprs) FXDP_RETURN_IF_ERROR(CheckIndex(n, what, e));
    return absl::OkStatus();
  }
  absl::Status CheckIndex(const v1::Node& n, absl::string_view what, uint32_t e) {
    if (e <= static_cast<uint32_t>(def_.size_exprs_size())) return absl::OkStatus();
    return InvalidArgumentError(absl::StrCat(DefNodeLabel(n), ": ", what, " is ", e,
                                             " (1 + an index), but the graph has ",
                                             def_.size_exprs_size(), " size expressions"));
  }
  absl::Status CheckArgument(const v1::Node& n, const v1::Argument& a, int depth) {
    if (depth > kMaxListDepth)
      return InvalidArgumentError(
          absl::StrCat(DefNodeLabel(n), ": lists nested deeper than ", kMaxListDepth));
    if (a.size_expr() != 0) {
      if (a.value_case() != v1::Argument::kIntValue)
        return InvalidArgumentError(
            absl::StrCat(DefNodeLabel(n), ": a size expression on an argument that is not an int"));
      FXDP_RETURN_IF_ERROR(CheckIndex(n, "an argument's size_expr", a.size_expr()));
    }
    if (a.value_case() == v1::Argument::kList)
      for (const v1::Argument& item : a.list().items())
        FXDP_RETURN_IF_ERROR(CheckArgument(n, item, depth + 1));
    return absl::OkStatus();
  }
  absl::Status CheckNodeExprs(const v1::Node& n) {
    for (const v1::Argument& a : n.args()) FXDP_RETURN_IF_ERROR(CheckArgument(n, a, 0));
    for (const v1::KeywordArgument& kw : n.kwargs())
      FXDP_RETURN_IF_ERROR(CheckArgument(n, kw.value(), 0));
    for (const v1::ValueMeta& v : n.outputs()) {
      const v1::TensorMeta& t = v.tensor();
      const bool symbolic =
          !t.shape_expr().empty() || !t.stride_expr().empty() || t.storage_offset_expr() != 0;
      if (!symbolic) continue;
      if (n.kind() == v1::PLACEHOLDER && n.placeholder().role() != v1::INPUT)
        return InvalidArgumentError(absl::StrCat(
            DefNodeLabel(n), ": state '", n.placeholder().state_name(),
            "' has a symbolic size; only batch INPUTs may (the state never changes shape)"));
      FXDP_RETURN_IF_ERROR(CheckIndices(n, "shape_expr", t.shape_expr(), t.shape_size()));
      FXDP_RETURN_IF_ERROR(CheckIndices(n, "stride_expr", t.stride_expr(), t.stride_size()));
      FXDP_RETURN_IF_ERROR(CheckIndex(n, "storage_offset_expr", t.storage_offset_expr()));
    }
    return absl::OkStatus();
  }

  absl::Status CheckNames() {
    absl::flat_hash_set<absl::string_view> inputs;
    for (const v1::Node& n : def_.nodes())
      if (IsInput(n)) inputs.insert(n.placeholder().state_name());
    for (const auto& [name, shape] : shapes_) {
      if (!inputs.contains(name))
        return InvalidArgumentError(absl::StrCat("the graph has no input '", name, "'"));
      for (int64_t d : shape)
        if (d < 0)
          return InvalidArgumentError(
              absl::StrCat("input '", name, "' is ", ShapeText(shape), ": sizes are >= 0"));
    }
    return absl::OkStatus();
  }

  absl::Status NoShape(const v1::Node& n, absl::string_view why) const {
    const std::string& name = n.placeholder().state_name();
    const std::vector<int64_t> traced = Ints(n.outputs(0).tensor().shape());
    return InvalidArgumentError(absl::StrCat(
        "the graph has symbolic sizes and no shape was given for input '", name, "' (traced at ",
        ShapeText(traced), "; ", why,
        "): give the shape of every input with a symbolic dim (the fxdp CLI: `--shape ", name, "=",
        absl::StrJoin(traced, "x"), "`)"));
  }

  const std::vector<int64_t>* Given(const v1::Node& n) const {
    auto it = shapes_.find(n.placeholder().state_name());
    return it == shapes_.end() ? nullptr : &it->second;
  }

  absl::Status BindSymbols() {
    symbols_.resize(def_.symbols_size());
    for (int i = 0; i < def_.symbols_size(); ++i) {
      const v1::Symbol& s = def_.symbols(i);
      const v1::Node& n = def_.nodes(s.input_node());
      const std::string& name = n.placeholder().state_name();
      const std::vector<int64_t>* given = Given(n);
      const std::vector<int64_t> traced = Ints(n.outputs(0).tensor().shape());
      if (given == nullptr) return NoShape(n, absl::StrCat("its dim ", s.dim(), " is ", s.name()));
      if (given->size() != traced.size())
        return InvalidArgumentError(absl::StrCat("input '", name, "' is ", ShapeText(*given),
                                                 ", but the graph's has ", traced.size(),
                                                 " dims (traced at ", ShapeText(traced), ")"));
      const int64_t v = (*given)[s.dim()];
      if (v < s.min() || (s.max() != 0 && v > s.max()))
        return InvalidArgumentError(absl::StrCat(
            At(), "input '", name, "' is ", ShapeText(*given), ": its dim ", s.dim(), " (",
            s.name(), ") is ", v, ", but the trace holds for ", s.name(), " in [", s.min(), ", ",
            s.max() == 0 ? std::string("inf") : absl::StrCat(s.max()), "] (traced at ", s.hint(),
            "): ", kWhatToDo));
      symbols_[i] = v;
    }
    return absl::OkStatus();
  }

  // "s15=5 (input 'input_ids' dim 0)" for every symbol of entry `e`.
  std::string Symbols(uint32_t e) const {
    std::vector<std::string> parts;
    for (uint32_t i : SizeExprSymbols(def_, e)) {
      const v1::Symbol& s = def_.symbols(i);
      parts.push_back(absl::StrCat(s.name(), "=", symbols_[i], " (input '",
                                   def_.nodes(s.input_node()).placeholder().state_name(), "' dim ",
                                   s.dim(), ")"));
    }
    return absl::StrJoin(parts, ", ");
  }

  absl::Status CheckInput(const v1::Node& n) {
    const v1::TensorMeta& t = n.outputs(0).tensor();
    const std::string& name = n.placeholder().state_name();
    const std::vector<int64_t> traced = Ints(t.shape());
    const std::vector<int64_t>* given = Given(n);
    if (given == nullptr) {
      if (t.shape_expr().empty()) return absl::OkStatus();  // all static: its traced shape
      return NoShape(n, "it has symbolic dims");
    }
    if (given->size() != traced.size())
      return InvalidArgumentError(absl::StrCat("input '", name, "' is ", ShapeText(*given),
                                               ", but the graph's has ", traced.size(),
                                               " dims (traced at ", ShapeText(traced), ")"));
    for (int d = 0; d < t.shape_size(); ++d) {
      const uint32_t e = t.shape_expr().empty() ? 0 : t.shape_expr(d);
      const int64_t want = e == 0 ? traced[d] : values_[e - 1];
      if ((*given)[d] == want) continue;
      const std::string why =
          e == 0 ? absl::StrCat("static in the trace: ", want)
                 : absl::StrCat(SizeExprText(def_, e - 1), " = ", want, ", from ", Symbols(e - 1));
      return InvalidArgumentError(absl::StrCat(At(), "input '", name, "' is ", ShapeText(*given),
                                               ", but its dim ", d, " must be ", why, ": ",
                                               kWhatToDo));
    }
    return absl::OkStatus();
  }

  absl::Status CheckGuard(const v1::Guard& g) {
    const int64_t l = values_[g.lhs()], r = values_[g.rhs()];
    const bool defined = !undefined_[g.lhs()] && !undefined_[g.rhs()];
    if (defined && GuardHolds(g.kind(), l, r)) return absl::OkStatus();
    std::string where =
        g.source().empty() ? std::string() : absl::StrCat(" [", g.source().substr(0, 400), "]");
    std::string vars = Symbols(g.lhs());
    const std::string rvars = Symbols(g.rhs());
    if (!rvars.empty() && rvars != vars) absl::StrAppend(&vars, vars.empty() ? "" : "; ", rvars);
    return InvalidArgumentError(absl::StrCat(
        At(), "the trace assumed ", GuardText(def_, g), where, ", which does not hold here: ",
        defined ? absl::StrCat(l, " against ", r) : std::string("a side divides by zero"), " (",
        vars, "): ", kWhatToDo));
  }

  // The value of entry `e` (1 + index) for dim/stride/offset `what` of `n`.
  absl::Status Value(const v1::Node& n, absl::string_view what, uint32_t e, bool size,
                     int64_t* out) {
    if (e == 0) return absl::OkStatus();
    *out = values_[e - 1];
    if (size && *out < 0)
      return InvalidArgumentError(absl::StrCat(At(), DefNodeLabel(n), ": ", what, " is ",
                                               SizeExprText(def_, e - 1), " = ", *out, " < 0 (",
                                               Symbols(e - 1), "): ", kWhatToDo));
    return absl::OkStatus();
  }

  void SubstituteArgument(v1::Argument* a) {
    if (a->size_expr() != 0) {
      a->set_int_value(values_[a->size_expr() - 1]);
      a->set_size_expr(0);
    }
    if (a->value_case() == v1::Argument::kList)
      for (v1::Argument& item : *a->mutable_list()->mutable_items()) SubstituteArgument(&item);
  }

  absl::Status Substitute(v1::Node* n) {
    for (v1::Argument& a : *n->mutable_args()) SubstituteArgument(&a);
    for (v1::KeywordArgument& kw : *n->mutable_kwargs()) SubstituteArgument(kw.mutable_value());
    for (int k = 0; k < n->outputs_size(); ++k) {
      if (!n->outputs(k).has_tensor()) continue;
      v1::TensorMeta* t = n->mutable_outputs(k)->mutable_tensor();
      for (int d = 0; d < t->shape_expr_size(); ++d)
        FXDP_RETURN_IF_ERROR(Value(*n, absl::StrCat("output ", k, " dim ", d), t->shape_expr(d),
                                   true, t->mutable_shape()->Mutable(d)));
      for (int d = 0; d < t->stride_expr_size(); ++d)
        FXDP_RETURN_IF_ERROR(Value(*n, absl::StrCat("output ", k, " stride ", d), t->stride_expr(d),
                                   false, t->mutable_stride()->Mutable(d)));
      int64_t offset = t->storage_offset();
      FXDP_RETURN_IF_ERROR(Value(*n, absl::StrCat("output ", k, " storage offset"),
                                 t->storage_offset_expr(), true, &offset));
      t->set_storage_offset(offset);
      t->clear_shape_expr();
      t->clear_stride_expr();
      t->clear_storage_offset_expr();
    }
    return absl::OkStatus();
  }

  const v1::GraphDef& def_;
  const InputShapes& shapes_;
  std::vector<int64_t> symbols_;  // each symbol's value
  std::vector<int64_t> values_;   // each size expression's value
  std::vector<bool> undefined_;   // each size expression's: divides by zero here
};

}  // namespace

absl::Status ParseInputShape(absl::string_view text, InputShapes* shapes) {
  const size_t eq = text.find('=');
  const std::string bad = absl::StrCat("'", text, "' is not NAME=SHAPE (input_ids=8x60)");
  if (eq == absl::string_view::npos || eq == 0) return InvalidArgumentError(bad);
  const std::string name(text.substr(0, eq));
  std::vector<int64_t> shape;
  const absl::string_view dims = text.substr(eq + 1);
  if (!dims.empty()) {
    for (absl::string_view d : absl::StrSplit(dims, 'x')) {
      int64_t v;
      if (!absl::SimpleAtoi(d, &v) || v < 0 || shape.size() >= static_cast<size_t>(kMaxRank))
        return InvalidArgumentError(absl::StrCat(bad, ": '", d, "' is not a size >= 0"));
      shape.push_back(v);
    }
  }
  if (!shapes->emplace(name, std::move(shape)).second)
    return InvalidArgumentError(absl::StrCat("input '", name, "' is given twice"));
  return absl::OkStatus();
}

std::string InputShapesText(const InputShapes& shapes, absl::string_view sep) {
  return absl::StrJoin(shapes, sep, [](std::string* out, const auto& kv) {
    absl::StrAppend(out, kv.first, "=", absl::StrJoin(kv.second, "x"));
  });
}

InputShapes InputShapesOf(const Graph& graph) {
  InputShapes out;
  for (const Node& n : graph.nodes()) {
    if (n.is_placeholder() && n.placeholder.role == PlaceholderRole::kInput && !n.outputs.empty() &&
        n.outputs[0].is_tensor())
      out.emplace(n.placeholder.state_name, n.outputs[0].tensor.shape);
  }
  return out;
}

absl::StatusOr<v1::GraphDef> InstantiateDef(const v1::GraphDef& def, const InputShapes& shapes) {
  if (!HasSymbolicSizes(def)) {
    FXDP_ASSIGN_OR_RETURN(Graph g, DecodeGraph(def));
    FXDP_RETURN_IF_ERROR(CheckStaticShapes(g, shapes));
    return def;
  }
  return Instantiator(def, shapes).Run();
}

absl::StatusOr<Graph> Instantiate(const v1::GraphDef& def, const InputShapes& shapes) {
  if (!HasSymbolicSizes(def)) {
    FXDP_ASSIGN_OR_RETURN(Graph g, DecodeGraph(def));
    FXDP_RETURN_IF_ERROR(CheckStaticShapes(g, shapes));
    return g;
  }
  FXDP_ASSIGN_OR_RETURN(v1::GraphDef out, Instantiator(def, shapes).Run());
  absl::StatusOr<Graph> g = DecodeGraph(out);
  if (!g.ok())
    return absl::Status(g.status().code(),
                        absl::StrCat("the graph instantiated at ", InputShapesText(shapes), ": ",
                                     g.status().message()));
  return g;
}

absl::StatusOr<Graph> InstantiateBytes(absl::string_view bytes, const InputShapes& shapes) {
  absl::StatusOr<Graph> g;
  if (static_cast<int64_t>(bytes.size()) <= kMaxGraphBytes && DecodeGraphWire(bytes, &g)) {
    if (g.ok()) FXDP_RETURN_IF_ERROR(CheckStaticShapes(*g, shapes));
    return g;
  }
  google::protobuf::Arena arena;
  FXDP_ASSIGN_OR_RETURN(v1::GraphDef * def, ParseGraphDefBytes(bytes, &arena));
  return Instantiate(*def, shapes);
}

absl::StatusOr<Graph> ReadGraphFileAt(const std::string& path, const InputShapes& shapes) {
  FXDP_ASSIGN_OR_RETURN(std::string bytes, ReadFileBytes(path));
  absl::StatusOr<Graph> g = InstantiateBytes(bytes, shapes);
  if (!g.ok())
    return absl::Status(g.status().code(), absl::StrCat(path, ": ", g.status().message()));
  return g;
}

}  // namespace fxdp::ir
