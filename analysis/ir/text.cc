#include "analysis/ir/text.h"

#include <charconv>
#include <cmath>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "util/status_macros.h"

namespace fxdp::ir {
namespace {

std::string Quote(absl::string_view s) { return absl::StrCat("\"", absl::CEscape(s), "\""); }

// Shortest text that reads back to the same double, always float-looking.
std::string FormatDouble(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  std::string s(buf, res.ptr);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string FormatTypes(const std::vector<ValueType>& outs) {
  if (outs.size() == 1) return outs[0].ToString();
  return absl::StrCat(
      "(",
      absl::StrJoin(outs, ", ",
                    [](std::string* o, const ValueType& v) { absl::StrAppend(o, v.ToString()); }),
      ")");
}

struct ArgPrinter {
  const Graph& g;
  std::string operator()(const ValueRef& r) const {
    const Node& src = g.node(r.node);
    if (src.outputs.size() == 1 && r.output == 0) return absl::StrCat("%", src.name);
    return absl::StrCat("%", src.name, "#", r.output);
  }
  std::string operator()(int64_t v) const { return absl::StrCat(v); }
  std::string operator()(double v) const { return FormatDouble(v); }
  std::string operator()(bool v) const { return v ? "true" : "false"; }
  std::string operator()(const std::string& v) const { return Quote(v); }
  std::string operator()(const NoneArg&) const { return "None"; }
  std::string operator()(DType d) const { return std::string(DTypeTorchName(d)); }
  std::string operator()(const Device& d) const {
    return absl::StrCat("device(", d.ToString(), ")");
  }
  std::string operator()(Layout l) const { return std::string(LayoutTorchName(l)); }
  std::string operator()(MemoryFormat m) const { return std::string(MemoryFormatTorchName(m)); }
  std::string operator()(const Scalar& s) const {
    std::string inner = std::visit(
        [](const auto& v) -> std::string {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, int64_t>)
            return absl::StrCat(v);
          else if constexpr (std::is_same_v<T, double>)
            return FormatDouble(v);
          else if constexpr (std::is_same_v<T, bool>)
            return v ? "true" : "false";
          else
            return absl::StrCat("complex(", FormatDouble(v.real()), ", ", FormatDouble(v.imag()),
                                ")");
        },
        s.value);
    return absl::StrCat("scalar(", inner, ")");
  }
  std::string operator()(const Argument::List& l) const {
    return absl::StrCat("[",
                        absl::StrJoin(l, ", ",
                                      [this](std::string* o, const Argument& a) {
                                        absl::StrAppend(o, std::visit(*this, a.value()));
                                      }),
                        "]");
  }
};

}  // namespace

std::string PrintArgument(const Graph& g, const Argument& a) {
  return std::visit(ArgPrinter{g}, a.value());
}

std::string PrintNode(const Graph& g, NodeId id, bool with_source) {
  const Node& n = g.node(id);
  std::string s = absl::StrCat("%", n.name);
  if (!n.outputs.empty()) absl::StrAppend(&s, ": ", FormatTypes(n.outputs));
  absl::StrAppend(&s, " = ", n.is_call() ? n.target.ToString() : NodeKindName(n.kind), "(");
  std::vector<std::string> args;
  for (const Argument& a : n.args) args.push_back(PrintArgument(g, a));
  for (const KeywordArgument& k : n.kwargs)
    args.push_back(absl::StrCat(k.name, "=", PrintArgument(g, k.value)));
  absl::StrAppend(&s, absl::StrJoin(args, ", "), ")");

  std::vector<std::string> attrs;
  if (!n.is_call()) {
    const absl::string_view default_target = n.is_output() ? absl::string_view("output") : n.name;
    if (n.target.name != default_target)
      attrs.push_back(absl::StrCat("target=", Quote(n.target.name)));
    if (!n.target.overload.empty())
      attrs.push_back(absl::StrCat("overload=", Quote(n.target.overload)));
  }
  if (n.is_placeholder()) {
    attrs.push_back(absl::StrCat("role=", PlaceholderRoleName(n.placeholder.role)));
    attrs.push_back(absl::StrCat("state=", Quote(n.placeholder.state_name)));
    if (n.placeholder.role == PlaceholderRole::kInput || n.placeholder.batch_dim != 0)
      attrs.push_back(absl::StrCat("batch_dim=", n.placeholder.batch_dim));
  }
  if (n.is_output()) {
    attrs.push_back(absl::StrCat("specs=[",
                                 absl::StrJoin(n.output_specs, ", ",
                                               [](std::string* o, const OutputSpec& sp) {
                                                 absl::StrAppend(o, OutputRoleName(sp.role));
                                                 if (!sp.state_name.empty())
                                                   absl::StrAppend(o, " ", Quote(sp.state_name));
                                               }),
                                 "]"));
  }
  if (!n.grad_of.empty()) attrs.push_back(absl::StrCat("grad_of=", Quote(n.grad_of)));
  if (with_source && !n.source.empty()) attrs.push_back(absl::StrCat("source=", Quote(n.source)));
  if (!attrs.empty()) absl::StrAppend(&s, " {", absl::StrJoin(attrs, ", "), "}");
  return s;
}

std::string PrintGraph(const Graph& g, bool with_source) {
  const GraphHeader& h = g.header();
  std::string s = absl::StrCat("graph format=", h.format_version, " producer=", Quote(h.producer),
                               " torch=", Quote(h.torch_version), " {\n");
  for (const auto& [k, v] : h.metadata)
    absl::StrAppend(&s, "  meta ", Quote(k), " = ", Quote(v), "\n");
  for (int32_t i = 0; i < g.size(); ++i)
    absl::StrAppend(&s, "  ", PrintNode(g, NodeId{i}, with_source), "\n");
  absl::StrAppend(&s, "}\n");
  return s;
}

}  // namespace fxdp::ir
