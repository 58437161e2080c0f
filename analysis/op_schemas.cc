#include "analysis/op_schemas.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "analysis/ir/node_error.h"

namespace fxdp {
namespace {

struct Row {
  const char* name;
  const char* overload;
  const char* args;
};

constexpr Row kRows[] = {
#include "analysis/op_schemas.inc"
};

constexpr absl::string_view kNamespaces[] = {"aten", "_c10d_functional"};

struct Table {
  std::vector<OpSchema> schemas;
  absl::flat_hash_map<std::pair<absl::string_view, absl::string_view>, const OpSchema*> by_key;
  absl::flat_hash_map<absl::string_view, std::vector<absl::string_view>> overloads;  // by name
};

const Table& GetTable() {
  static const Table* table = [] {
    auto* t = new Table;
    t->schemas.reserve(std::size(kRows));
    for (const Row& r : kRows) {
      OpSchema s;
      s.name = r.name;
      s.overload = r.overload;
      for (absl::string_view w : absl::StrSplit(r.args, ' ', absl::SkipEmpty())) {
        OpSchemaArg a;
        a.kwarg_only = absl::ConsumePrefix(&w, "*");
        a.has_default = absl::ConsumeSuffix(&w, "=");
        a.name = w;
        s.num_positional += !a.kwarg_only;
        if (!a.has_default) s.required |= uint64_t{1} << s.args.size();
        s.args.push_back(a);
      }
      // The argument masks hold 64 bits; scripts/gen_op_schemas.py refuses wider schemas
      // (torch 2.13's widest has 30 arguments).
      if (s.args.size() >= 64) std::abort();
      t->schemas.push_back(std::move(s));
    }
    for (const OpSchema& s : t->schemas) {
      t->by_key.emplace(std::make_pair(s.name, s.overload), &s);
      t->overloads[s.name].push_back(s.overload.empty() ? "<default>" : s.overload);
    }
    return t;
  }();
  return *table;
}

// Checked before the analysis, like the verifier's checks: nodes named by
// their position.
absl::Status NodeError(const ir::Graph& g, int i, absl::string_view msg) {
  const ir::Node& n = g.nodes()[i];
  if (n.source.empty()) return ir::NodeError(n.name, absl::StrCat("#", i), msg);
  return absl::InvalidArgumentError(
      absl::StrCat(ir::NodeLabel(n.name, absl::StrCat("#", i)), " [", n.source, "]: ", msg));
}

std::string ArgNames(const OpSchema& s) {
  return s.args.empty() ? "none"
                        : absl::StrJoin(s.args, ", ", [](std::string* out, const OpSchemaArg& a) {
                            absl::StrAppend(out, a.name);
                          });
}

absl::Status CheckNode(const ir::Graph& g, int i) {
  const ir::Node& n = g.nodes()[i];
  const absl::string_view name = n.target.name;
  const absl::string_view ns = name.substr(0, name.find("::"));
  // Only for messages (a node that fits costs no allocation).
  auto op = [&n] { return n.target.ToString(); };
  auto traced = [&g] {
    return g.header().torch_version.empty()
               ? std::string()
               : absl::StrCat(" (the graph was traced with torch ", g.header().torch_version, ")");
  };
  if (std::find(std::begin(kNamespaces), std::end(kNamespaces), ns) == std::end(kNamespaces)) {
    return NodeError(g, i,
                     absl::StrCat("op ", op(), " is in namespace '", ns,
                                  "': fxdp runs only aten and _c10d_functional ops"));
  }
  const Table& t = GetTable();
  auto it = t.by_key.find(std::make_pair(name, absl::string_view(n.target.overload)));
  if (it == t.by_key.end()) {
    auto o = t.overloads.find(name);
    if (o == t.overloads.end()) {
      return NodeError(g, i,
                       absl::StrCat("unknown op ", op(), ": torch ", OpSchemaTorchVersion(),
                                    " (what fxdp-worker runs) has no such operator", traced()));
    }
    return NodeError(g, i,
                     absl::StrCat("unknown op ", op(), ": torch ", OpSchemaTorchVersion(),
                                  " has no overload '", n.target.overload, "' of ", name,
                                  " (it has ", absl::StrJoin(o->second, ", "), ")", traced()));
  }
  const OpSchema& s = *it->second;
  const int given = static_cast<int>(n.args.size());
  if (given > s.num_positional) {
    return NodeError(g, i,
                     absl::StrCat(op(), " takes at most ", s.num_positional,
                                  " positional arguments (", s.ToString(), "), got ", given));
  }
  // Bit i: argument i was given (no allocation: this runs for every node).
  uint64_t seen = given >= 64 ? ~uint64_t{0} : (uint64_t{1} << given) - 1;
  for (const ir::KeywordArgument& kw : n.kwargs) {
    auto a = std::find_if(s.args.begin(), s.args.end(),
                          [&](const OpSchemaArg& x) { return x.name == kw.name; });
    if (a == s.args.end()) {
      return NodeError(
          g, i,
          absl::StrCat(op(), " has no argument '", kw.name, "' (arguments: ", ArgNames(s), ")"));
    }
    const uint64_t bit = uint64_t{1} << (a - s.args.begin());
    if (seen & bit) {
      return NodeError(g, i,
                       absl::StrCat(op(), ": argument '", kw.name,
                                    "' is given both positionally and by keyword"));
    }
    seen |= bit;
  }
  if ((s.required & ~seen) == 0) return absl::OkStatus();
  for (size_t k = 0; k < s.args.size(); ++k) {
    if (!(seen >> k & 1) && !s.args[k].has_default) {
      return NodeError(g, i,
                       absl::StrCat(op(), " is missing argument '", s.args[k].name, "' (",
                                    s.ToString(), "; got ", given, " positional",
                                    n.kwargs.empty() ? "" : " and keywords", ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string OpSchema::ToString() const {
  std::string out = absl::StrCat(name, overload.empty() ? "" : ".", overload, "(");
  for (size_t k = 0; k < args.size(); ++k) {
    if (k > 0) out += ", ";
    if (args[k].kwarg_only && (k == 0 || !args[k - 1].kwarg_only)) out += "*, ";
    absl::StrAppend(&out, args[k].name, args[k].has_default ? "=" : "");
  }
  return out + ")";
}

absl::string_view OpSchemaTorchVersion() { return FXDP_OP_SCHEMAS_TORCH_VERSION; }

int NumOpSchemas() { return static_cast<int>(std::size(kRows)); }

const OpSchema* FindOpSchema(absl::string_view name, absl::string_view overload) {
  const Table& t = GetTable();
  auto it = t.by_key.find(std::make_pair(name, overload));
  return it == t.by_key.end() ? nullptr : it->second;
}

absl::Status CheckOpSchemas(const ir::Graph& graph) {
  for (int i = 0; i < graph.size(); ++i) {
    const ir::Node& n = graph.nodes()[i];
    if (!n.is_call() || n.is_getitem()) continue;
    if (absl::Status s = CheckNode(graph, i); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace fxdp
