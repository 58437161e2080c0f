// Reading a node's int, bool and dims arguments by position or keyword.
#include "analysis/batch_dim/analyzer.h"

#include <cstdint>
#include <optional>
#include <vector>
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "util/status_macros.h"

namespace fxdp {

using ir::Argument;
using ir::Graph;
using ir::Node;
using ir::NodeId;
using ir::TensorType;
using ir::ValueRef;

int64_t BatchDimAnalyzer::NormDim(int64_t d, int64_t rank) {
  const int64_t r = std::max<int64_t>(rank, 1);
  return d < 0 ? d + r : d;
}

// Positional arg `i`, or keyword `name`, or nullptr.
const Argument* BatchDimAnalyzer::ArgAt(const Node& n, int i, absl::string_view name) {
  if (i >= 0 && i < static_cast<int>(n.args.size())) return &n.args[i];
  if (!name.empty()) return n.kwarg(name);
  return nullptr;
}

std::optional<int64_t> BatchDimAnalyzer::IntArg(const Node& n, int i, absl::string_view name) {
  const Argument* a = ArgAt(n, i, name);
  if (a == nullptr) return std::nullopt;
  if (const auto* v = a->get_if<int64_t>()) return *v;
  if (const auto* s = a->get_if<ir::Scalar>()) {
    if (const auto* v = std::get_if<int64_t>(&s->value)) return *v;
  }
  return std::nullopt;
}

std::optional<double> BatchDimAnalyzer::NumberArg(const Node& n, int i, absl::string_view name) {
  const Argument* a = ArgAt(n, i, name);
  if (a == nullptr) return std::nullopt;
  if (const auto* v = a->get_if<int64_t>()) return static_cast<double>(*v);
  if (const auto* v = a->get_if<double>()) return *v;
  if (const auto* s = a->get_if<ir::Scalar>()) {
    if (const auto* v = std::get_if<int64_t>(&s->value)) return static_cast<double>(*v);
    if (const auto* v = std::get_if<double>(&s->value)) return *v;
  }
  return std::nullopt;
}

std::optional<bool> BatchDimAnalyzer::BoolArg(const Node& n, int i, absl::string_view name) {
  const Argument* a = ArgAt(n, i, name);
  if (a == nullptr) return std::nullopt;
  if (const auto* v = a->get_if<bool>()) return *v;
  return std::nullopt;
}

// Dims listed by an int or int-list argument; nullopt when absent or None.
std::optional<std::vector<int64_t>> BatchDimAnalyzer::DimsArg(const Node& n, int i,
                                                              absl::string_view name) {
  const Argument* a = ArgAt(n, i, name);
  if (a == nullptr || a->is_none()) return std::nullopt;
  std::vector<int64_t> dims;
  if (const auto* v = a->get_if<int64_t>()) {
    dims.push_back(*v);
  } else if (const auto* l = a->get_if<Argument::List>()) {
    for (const Argument& e : *l) {
      if (const auto* v = e.get_if<int64_t>()) dims.push_back(*v);
    }
  }
  return dims;
}

// The argument a rule's parameter names (by position, else by keyword), or
// nullptr (no such parameter, a fixed one, or an absent argument).
const Argument* BatchDimAnalyzer::ArgOf(const Node& n, const OpParam* p) {
  return p == nullptr || p->index < 0 ? nullptr : ArgAt(n, p->index, p->name);
}

std::optional<int64_t> BatchDimAnalyzer::IntArg(const Node& n, const OpParam* p) {
  return p == nullptr || p->index < 0 ? std::nullopt : IntArg(n, p->index, p->name);
}

std::optional<bool> BatchDimAnalyzer::BoolArg(const Node& n, const OpParam* p) {
  return p == nullptr || p->index < 0 ? std::nullopt : BoolArg(n, p->index, p->name);
}

std::optional<std::vector<int64_t>> BatchDimAnalyzer::DimsArg(const Node& n, const OpParam* p) {
  return p == nullptr || p->index < 0 ? std::nullopt : DimsArg(n, p->index, p->name);
}

}  // namespace fxdp
