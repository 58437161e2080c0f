#include "analysis/view_rules.h"

#include <algorithm>
#include <iterator>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "analysis/view_dim_maps.h"
#include "util/status_macros.h"

namespace fxdp {
namespace {

using view_rules_internal::RuleCall;
using view_rules_internal::RuleFn;
using view_rules_internal::RuleParam;

// Where a rule's parameter comes from.
struct Param {
  enum class Kind : int8_t {
    kUnused,       // no parameter in this slot
    kInt,          // an `int` schema argument
    kIntList,      // an `int[]` / `SymInt[]` schema argument (a bare int is one entry)
    kSizes,        // kIntList that spells the output's shape (-1: inferred); made local
                   // by the expansion
    kExpandSizes,  // kSizes that broadcasts the input (-1: the input's size)
    kFixedInt,     // not an argument: `value`, fixed by the row
    kNone,         // not an argument: None (squeeze of every dim)
    kIgnored,      // a keyword-only argument the rule does not read
  };
  Kind kind = Kind::kUnused;
  absl::string_view name;
  bool has_default = false;
  int64_t value = 0;  // kInt default, or the kFixedInt value.

  bool list() const {
    return kind == Kind::kIntList || kind == Kind::kSizes || kind == Kind::kExpandSizes;
  }
  bool positional() const { return kind == Kind::kInt || list(); }
};

constexpr Param Int(absl::string_view name) { return {Param::Kind::kInt, name}; }
constexpr Param Int(absl::string_view name, int64_t def) {
  return {Param::Kind::kInt, name, true, def};
}
constexpr Param IntList(absl::string_view name) { return {Param::Kind::kIntList, name}; }
constexpr Param Sizes(absl::string_view name) { return {Param::Kind::kSizes, name}; }
constexpr Param ExpandSizes(absl::string_view name) { return {Param::Kind::kExpandSizes, name}; }
constexpr Param Fixed(absl::string_view name, int64_t v) {
  return {Param::Kind::kFixedInt, name, true, v};
}
constexpr Param AllDims(absl::string_view name) { return {Param::Kind::kNone, name}; }
constexpr Param Ignored(absl::string_view name) { return {Param::Kind::kIgnored, name}; }

// kPacking (op_rules.h): cheap enough to move up with the all_reduce it feeds.
constexpr bool kPacks = true;
constexpr bool kNoPacking = false;
// view_rules.h's ShardView.
constexpr ShardView kFlatShard = ShardView::kFlat;
constexpr ShardView kPermutedShard = ShardView::kPermuted;

struct Row {
  absl::string_view name;
  absl::string_view overload;
  RuleFn rule;
  Param params[2];
  bool packing = false;
  ShardView shard_view = ShardView::kNo;
};

namespace r = view_rules_internal;

// Sorted by (name, overload); one line per aten overload.
// clang-format off
constexpr Row kRows[] = {
    {"aten::_unsafe_view", "", r::ViewRule, {Sizes("size")}, kPacks, kFlatShard},
    {"aten::atleast_1d", "", r::PadLeftRule, {Fixed("min_dims", 1)}},
    {"aten::atleast_2d", "", r::PadLeftRule, {Fixed("min_dims", 2)}},
    {"aten::atleast_3d", "", r::AtLeast3dRule, {}},
    {"aten::broadcast_to", "", r::ExpandRule, {ExpandSizes("size")}},
    {"aten::expand", "", r::ExpandRule, {ExpandSizes("size"), Ignored("implicit")}},
    {"aten::expand_copy", "", r::ExpandRule, {ExpandSizes("size"), Ignored("implicit")}},
    {"aten::flatten", "using_ints", r::FlattenRule, {Int("start_dim", 0), Int("end_dim", -1)}},
    {"aten::movedim", "int", r::MovedimRule, {Int("source"), Int("destination")}},
    {"aten::movedim", "intlist", r::MovedimRule, {IntList("source"), IntList("destination")}},
    {"aten::permute", "", r::PermuteRule, {IntList("dims")}, kNoPacking, kPermutedShard},
    {"aten::ravel", "", r::FlattenRule, {Fixed("start_dim", 0), Fixed("end_dim", -1)}},
    {"aten::repeat", "", r::RepeatRule, {IntList("repeats")}},
    {"aten::reshape", "", r::ReshapeRule, {Sizes("shape")}, kPacks, kFlatShard},
    {"aten::squeeze", "", r::SqueezeRule, {AllDims("dim")}, kNoPacking, kFlatShard},
    {"aten::squeeze", "dim", r::SqueezeRule, {Int("dim")}, kNoPacking, kFlatShard},
    {"aten::squeeze", "dims", r::SqueezeRule, {IntList("dim")}, kNoPacking, kFlatShard},
    {"aten::squeeze_", "", r::SqueezeRule, {AllDims("dim")}},
    {"aten::squeeze_", "dim", r::SqueezeRule, {Int("dim")}},
    {"aten::squeeze_", "dims", r::SqueezeRule, {IntList("dim")}},
    {"aten::t", "", r::TRule, {}, kNoPacking, kPermutedShard},
    {"aten::tile", "", r::TileRule, {IntList("dims")}},
    {"aten::transpose", "int", r::TransposeRule, {Int("dim0"), Int("dim1")}, kNoPacking,
     kPermutedShard},
    {"aten::unflatten", "int", r::UnflattenRule, {Int("dim"), IntList("sizes")}},
    {"aten::unsqueeze", "", r::UnsqueezeRule, {Int("dim")}, kNoPacking, kFlatShard},
    {"aten::view", "", r::ViewRule, {Sizes("size")}, kPacks, kFlatShard},
    {"aten::view_as_complex", "", r::ViewAsComplexRule, {}},
    {"aten::view_as_real", "", r::ViewAsRealRule, {}},
    {"aten::view_copy", "", r::ViewRule, {Sizes("size")}},
};
// clang-format on

constexpr bool RowsSorted() {
  for (size_t i = 1; i < std::size(kRows); ++i) {
    const Row& a = kRows[i - 1];
    const Row& b = kRows[i];
    if (a.name > b.name || (a.name == b.name && a.overload >= b.overload)) return false;
  }
  return true;
}
static_assert(RowsSorted(), "kRows must be sorted by (name, overload) without duplicates");

const Row* FindRow(const ir::Target& target) {
  const auto key =
      std::make_tuple(absl::string_view(target.name), absl::string_view(target.overload));
  const Row* it = std::lower_bound(
      std::begin(kRows), std::end(kRows), key,
      [](const Row& row, const auto& k) { return std::make_tuple(row.name, row.overload) < k; });
  if (it == std::end(kRows) || it->name != target.name || it->overload != target.overload) {
    return nullptr;
  }
  return it;
}

// An int, or a list of ints, as one entry list.
absl::StatusOr<std::vector<int64_t>> IntsOf(const RuleCall& c, const Param& p,
                                            const ir::Argument& a) {
  if (const int64_t* v = a.get_if<int64_t>()) return std::vector<int64_t>{*v};
  if (p.list() && a.is_list()) {
    std::vector<int64_t> out;
    for (const ir::Argument& e : a.as<ir::Argument::List>()) {
      const int64_t* v = e.get_if<int64_t>();
      if (v == nullptr) {
        return c.Error(absl::StrCat("argument '", p.name, "' must be a list of ints"));
      }
      out.push_back(*v);
    }
    return out;
  }
  return c.Error(absl::StrCat("argument '", p.name, "' must be ",
                              p.kind == Param::Kind::kInt ? "an int" : "a list of ints"));
}

// Binds the node's arguments to the row's parameters.
absl::StatusOr<RuleCall> Bind(const Row& row, absl::Span<const int64_t> shape,
                              const std::vector<ir::Argument>& args,
                              const std::vector<ir::KeywordArgument>& kwargs) {
  RuleCall c{absl::StrCat(row.name, row.overload.empty() ? "" : ".", row.overload), shape, {}};
  if (args.empty() || !args[0].is_ref()) return c.Error("argument 0 (self) must be a tensor");
  size_t next_positional = 1;
  for (const Param& p : row.params) {
    if (p.kind == Param::Kind::kUnused || p.kind == Param::Kind::kIgnored) continue;
    RuleParam& out = c.params.emplace_back();
    out.name = p.name;
    out.scalar = !p.list();
    if (p.kind == Param::Kind::kFixedInt) out.ints = std::vector<int64_t>{p.value};
    if (!p.positional()) continue;
    const ir::Argument* a = nullptr;
    if (next_positional < args.size()) a = &args[next_positional++];
    for (const ir::KeywordArgument& k : kwargs) {
      if (k.name != p.name) continue;
      if (a != nullptr) return c.Error(absl::StrCat("argument '", p.name, "' given twice"));
      a = &k.value;
    }
    if (a != nullptr) {
      FXDP_ASSIGN_OR_RETURN(out.ints, IntsOf(c, p, *a));
    } else if (p.has_default) {
      out.ints = std::vector<int64_t>{p.value};
    } else {
      return c.Error(absl::StrCat("missing argument '", p.name, "'"));
    }
  }
  if (next_positional < args.size()) {
    return c.Error(
        absl::StrCat("takes ", next_positional, " positional arguments, got ", args.size()));
  }
  for (const ir::KeywordArgument& k : kwargs) {
    const bool known =
        std::any_of(std::begin(row.params), std::end(row.params), [&](const Param& p) {
          return p.name == k.name && (p.positional() || p.kind == Param::Kind::kIgnored);
        });
    if (!known) return c.Error(absl::StrCat("unexpected keyword argument '", k.name, "'"));
  }
  return c;
}

}  // namespace

bool IsViewOp(const ir::Target& target) { return FindRow(target) != nullptr; }

absl::StatusOr<DimMap> ComputeViewDimMap(const ir::Target& target,
                                         absl::Span<const int64_t> input_shape,
                                         const std::vector<ir::Argument>& args,
                                         const std::vector<ir::KeywordArgument>& kwargs) {
  const Row* row = FindRow(target);
  if (row == nullptr) {
    return absl::NotFoundError(absl::StrCat(target.ToString(), ": no view rule"));
  }
  FXDP_ASSIGN_OR_RETURN(const RuleCall call, Bind(*row, input_shape, args, kwargs));
  return row->rule(call);
}

std::optional<ViewOpFacts> FindViewOpFacts(const ir::Target& target) {
  const Row* row = FindRow(target);
  if (row == nullptr) return std::nullopt;
  ViewOpFacts f;
  f.packing = row->packing;
  f.shard_view = row->shard_view;
  int positional = 1;  // args[0] is self.
  for (const Param& p : row->params) {
    if (p.kind == Param::Kind::kSizes || p.kind == Param::Kind::kExpandSizes) {
      f.sizes_arg = positional;
      f.expands = p.kind == Param::Kind::kExpandSizes;
    }
    if (p.positional()) ++positional;
  }
  return f;
}

namespace {

std::string RowText(const Row* row) {
  std::string s = absl::StrCat(row->name, row->overload.empty() ? "" : ".", row->overload);
  int positional = 1;
  for (const Param& p : row->params) {
    switch (p.kind) {
      case Param::Kind::kUnused: continue;
      case Param::Kind::kInt: absl::StrAppend(&s, " int=", positional++, ":", p.name); break;
      case Param::Kind::kIntList: absl::StrAppend(&s, " ints=", positional++, ":", p.name); break;
      case Param::Kind::kSizes: absl::StrAppend(&s, " sizes=", positional++, ":", p.name); break;
      case Param::Kind::kExpandSizes:
        absl::StrAppend(&s, " expand_sizes=", positional++, ":", p.name);
        break;
      case Param::Kind::kFixedInt: absl::StrAppend(&s, " ", p.name, "=", p.value); break;
      case Param::Kind::kNone: absl::StrAppend(&s, " ", p.name, "=all"); break;
      case Param::Kind::kIgnored: absl::StrAppend(&s, " ignores=", p.name); break;
    }
    if (p.has_default && p.kind == Param::Kind::kInt)
      absl::StrAppend(&s, "(default ", p.value, ")");
  }
  if (row->packing) absl::StrAppend(&s, " [packing]");
  if (row->shard_view == ShardView::kFlat) absl::StrAppend(&s, " shard_view=flat");
  if (row->shard_view == ShardView::kPermuted) absl::StrAppend(&s, " shard_view=permuted");
  return s;
}

}  // namespace

std::string ViewRulesText() {
  std::string out;
  for (const Row& row : kRows) absl::StrAppend(&out, RowText(&row), "\n");
  return out;
}

std::vector<std::string> ViewOpNames() {
  std::vector<std::string> names;
  for (const Row& row : kRows) {
    names.push_back(absl::StrCat(row.name, row.overload.empty() ? "" : ".", row.overload));
  }
  return names;
}

}  // namespace fxdp
