// The random-op table and the random layout metadata (random_ops.h).
#include "analysis/ir/random_ops.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace fxdp::ir {
namespace {

using K = RandomKind;

constexpr RandomOp kRandomOps[] = {
    {"aten::bernoulli", "", K::kBernoulliProbs, "self"},
    {"aten::bernoulli", "p", K::kBernoulli, "p"},
    {"aten::exponential", "", K::kExponential, "lambd"},
    {"aten::native_dropout", "", K::kDropout, "input p train"},
    {"aten::normal", "float_float", K::kNormal, "mean std"},
    {"aten::normal_functional", "", K::kNormal, "mean std"},
    {"aten::rand", "", K::kUniform, ""},
    {"aten::rand", "generator", K::kUniform, ""},
    {"aten::rand_like", "", K::kUniform, ""},
    {"aten::rand_like", "generator", K::kUniform, ""},
    {"aten::randint", "", K::kRandint, "high"},
    {"aten::randint", "generator", K::kRandint, "high"},
    {"aten::randint", "low", K::kRandint, "low high"},
    {"aten::randint", "low_generator", K::kRandint, "low high"},
    {"aten::randint_like", "", K::kRandint, "high"},
    {"aten::randint_like", "generator", K::kRandint, "high"},
    {"aten::randint_like", "low_dtype", K::kRandint, "low high"},
    {"aten::randint_like", "low_generator_dtype", K::kRandint, "low high"},
    {"aten::randn", "", K::kNormal, ""},
    {"aten::randn", "generator", K::kNormal, ""},
    {"aten::randn_like", "", K::kNormal, ""},
    {"aten::randn_like", "generator", K::kNormal, ""},
    {"aten::uniform", "", K::kUniform, "from to"},
};

constexpr bool Sorted() {
  for (size_t i = 1; i < std::size(kRandomOps); ++i) {
    const RandomOp& a = kRandomOps[i - 1];
    const RandomOp& b = kRandomOps[i];
    if (!(a.name < b.name || (a.name == b.name && a.overload < b.overload))) return false;
  }
  return true;
}
static_assert(Sorted(), "kRandomOps must be sorted by (name, overload)");

}  // namespace

absl::Span<const RandomOp> RandomOps() { return kRandomOps; }

const RandomOp* FindRandomOp(const Target& target) {
  const auto key =
      std::make_tuple(absl::string_view(target.name), absl::string_view(target.overload));
  const RandomOp* it = std::lower_bound(
      std::begin(kRandomOps), std::end(kRandomOps), key,
      [](const RandomOp& r, const auto& k) { return std::make_tuple(r.name, r.overload) < k; });
  if (it == std::end(kRandomOps) || it->name != target.name || it->overload != target.overload)
    return nullptr;
  return it;
}

absl::string_view RandomKindName(RandomKind kind) {
  switch (kind) {
    case K::kBernoulli: return "bernoulli";
    case K::kBernoulliProbs: return "bernoulli_probs";
    case K::kDropout: return "dropout";
    case K::kUniform: return "uniform";
    case K::kNormal: return "normal";
    case K::kRandint: return "randint";
    case K::kExponential: return "exponential";
  }
  return "?";
}

int WordsPerElement(RandomKind kind, DType dtype) {
  if (kind == K::kNormal) return 2;
  if (kind == K::kUniform && dtype == DType::kFloat64) return 2;
  return 1;
}

std::string RandomOpsText() {
  std::string out;
  for (const RandomOp& r : kRandomOps) {
    absl::StrAppend(&out, r.name, r.overload.empty() ? "" : ".", r.overload, " ",
                    RandomKindName(r.kind), r.params.empty() ? "" : " ", r.params, "\n");
  }
  return out;
}

std::string FormatRandomLayouts(const std::vector<RandomLayout>& layouts) {
  std::string out;
  for (const RandomLayout& l : layouts) {
    absl::StrAppend(&out, out.empty() ? "" : "\n", l.node, " ", l.dim, " ", l.outer, " ",
                    l.global_extent);
  }
  return out;
}

absl::StatusOr<std::vector<RandomLayout>> ParseRandomLayouts(absl::string_view text) {
  std::vector<RandomLayout> out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    RandomLayout l;
    if (f.size() != 4 || !absl::SimpleAtoi(f[1], &l.dim) || !absl::SimpleAtoi(f[2], &l.outer) ||
        !absl::SimpleAtoi(f[3], &l.global_extent) || l.dim < 0 || l.outer < 1 ||
        l.global_extent < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "graph metadata '", kRandomLayoutKey, "': line '", line,
          "' is not 'NODE DIM OUTER GLOBAL_EXTENT' (DIM >= 0, OUTER >= 1, GLOBAL_EXTENT >= 1)"));
    }
    l.node = std::string(f[0]);
    out.push_back(std::move(l));
  }
  return out;
}

absl::StatusOr<uint64_t> MetadataNumber(const Graph& graph, absl::string_view key,
                                        uint64_t fallback) {
  for (const auto& [k, v] : graph.header().metadata) {
    if (k != key) continue;
    uint64_t n = 0;
    if (!absl::SimpleAtoi(v, &n))
      return absl::InvalidArgumentError(
          absl::StrCat("graph metadata '", key, "' is '", v, "', not an unsigned decimal number"));
    return n;
  }
  return fallback;
}

}  // namespace fxdp::ir
