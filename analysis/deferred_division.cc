// FindDeferredDivision (analysis/deferred_division.h): which loss divisor the backward need not
// wait for, proven by following the backward's seed through the op table's linearity.
#include "analysis/deferred_division.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "analysis/view_rules.h"

namespace fxdp {

using ir::Argument;
using ir::Node;
using ir::NodeId;
using ir::ValueRef;

namespace {

constexpr absl::string_view kDiv = "aten::div";

bool IsDivTensor(const Node& n) {
  return n.is_call() && n.target.name == kDiv && n.target.overload == "Tensor" &&
         n.args.size() == 2 && n.args[0].is_ref() && n.args[1].is_ref();
}

// A read of a value: the node and the argument (positional index; 64 + k for keyword k; a list
// element counts as its list's argument).
struct Reader {
  NodeId node;
  int arg;
};

std::vector<Reader> ReadersOf(const ir::Graph& g, ValueRef v) {
  std::vector<Reader> out;
  for (int32_t i = 0; i < g.size(); ++i) {
    const Node& n = g.nodes()[i];
    auto visit = [&](const Argument& a, int pos) {
      if (const ValueRef* r = a.get_if<ValueRef>()) {
        if (*r == v) out.push_back({NodeId{i}, pos});
      } else if (const auto* l = a.get_if<Argument::List>()) {
        for (const Argument& e : *l) {
          if (const ValueRef* r = e.get_if<ValueRef>(); r != nullptr && *r == v) {
            out.push_back({NodeId{i}, pos});
          }
        }
      }
    };
    for (size_t k = 0; k < n.args.size(); ++k) visit(n.args[k], static_cast<int>(k));
    for (size_t k = 0; k < n.kwargs.size(); ++k) visit(n.kwargs[k].value, 64 + static_cast<int>(k));
  }
  return out;
}

bool InMask(const LinearIn& linear, int arg) { return arg < 8 && ((linear.args >> arg) & 1); }

// A fresh zero tensor (an op with the kZeros trait): adding it adds nothing.
bool IsZeros(const ir::Graph& g, ValueRef r) {
  const Node& n = g.node(r.node);
  const OpRule* rule = n.is_call() ? FindOpRule(n.target) : nullptr;
  return rule != nullptr && rule->has(kZeros);
}

const Argument* ArgOf(const Node& n, const OpParam& p) {
  if (p.index >= 0 && p.index < static_cast<int>(n.args.size())) return &n.args[p.index];
  return p.name.empty() ? nullptr : n.kwarg(p.name);
}

// A loss backward's reduction argument (absent: 1, the mean).
int64_t ReductionOf(const Node& n) {
  const OpRule* rule = FindOpRule(n.target);
  const OpParam* p = rule != nullptr ? rule->param(ParamRole::kReduction) : nullptr;
  const Argument* a = p != nullptr ? ArgOf(n, *p) : nullptr;
  const int64_t* v = a != nullptr ? a->get_if<int64_t>() : nullptr;
  return v != nullptr ? *v : 1;
}

class DivisionFinder {
 public:
  DivisionFinder(const ir::Graph& g, const BatchDimAnalysis& a) : g_(g), a_(a) {}
  // "" when the division by `w` can be deferred (d filled), else why not.
  std::string DeferredReads(ValueRef w, DeferredDivision& d) const;

 private:
  bool OnlyTheLoss(const Node& out, ValueRef loss) const;
  std::string ScalesWithSeed(NodeId seed) const;
  std::string LinearInScaled(const Node& n, const std::vector<uint8_t>& scaled) const;

  const ir::Graph& g_;
  const BatchDimAnalysis& a_;
};

// "" when node `n`, reading values of `scaled` (outputs that are linear in the seed), is linear
// in them (so its outputs are too); else why not.
std::string DivisionFinder::LinearInScaled(const Node& n,
                                           const std::vector<uint8_t>& scaled) const {
  auto is_scaled = [&](const Argument& a) {
    const ValueRef* r = a.get_if<ValueRef>();
    return r != nullptr && scaled[r->node.value] != 0;
  };
  auto holds_scaled = [&](const Argument& a) {
    if (is_scaled(a)) return 1;
    int k = 0;
    if (const auto* l = a.get_if<Argument::List>()) {
      for (const Argument& e : *l) k += is_scaled(e) ? 1 : 0;
    }
    return k;
  };
  if (n.is_getitem()) return "";
  for (const ir::KeywordArgument& kw : n.kwargs) {
    if (holds_scaled(kw.value)) return absl::StrCat("keyword argument '", kw.name, "'");
  }
  if (IsViewOp(n.target)) {
    for (size_t i = 1; i < n.args.size(); ++i) {
      if (holds_scaled(n.args[i])) return absl::StrCat("argument ", i);
    }
    return "";
  }
  const OpRule* rule = FindOpRule(n.target);
  if (rule == nullptr) return "no rule";
  const LinearIn linear = LinearOf(n, *rule);
  int in_mask = 0;
  for (size_t i = 0; i < n.args.size(); ++i) {
    const int k = holds_scaled(n.args[i]);
    if (k == 0) continue;
    if (linear.kind == Linearity::kNone || !InMask(linear, static_cast<int>(i))) {
      return absl::StrCat("not linear in argument ", i);
    }
    in_mask += k;
  }
  if (linear.kind == Linearity::kMultilinear && in_mask > 1) {
    return "a product of two values computed from it";
  }
  if (linear.kind != Linearity::kAdditive) return "";
  // An additive op: every term it adds must scale with the seed.
  for (size_t i = 0; i < n.args.size() && i < 8; ++i) {
    if (!InMask(linear, static_cast<int>(i))) continue;
    auto term_ok = [&](const Argument& a) {
      if (const ValueRef* r = a.get_if<ValueRef>()) {
        return scaled[r->node.value] != 0 || IsZeros(g_, *r) ||
               (g_.type(*r).is_tensor() && g_.type(*r).tensor.numel() == 0);
      }
      return a.is_none() || IsZeroNumber(a);
    };
    if (const auto* l = n.args[i].get_if<Argument::List>()) {
      for (const Argument& e : *l) {
        if (!term_ok(e)) return absl::StrCat("adds a term of argument ", i, " that does not");
      }
    } else if (!term_ok(n.args[i])) {
      return absl::StrCat("adds argument ", i, ", which does not");
    }
  }
  return "";
}

// "" when every value computed from the seed's output is linear in it, every gradient is, each
// is all-reduced (a bucket divides it), and no other reduction, output or dtype without the
// precision of f32 reads one; else why not.
std::string DivisionFinder::ScalesWithSeed(NodeId seed) const {
  absl::flat_hash_set<ValueRef> grads;
  for (const Reduction& r : a_.reductions()) {
    if (!r.grad_of.empty()) grads.insert(r.value);
  }
  // scaled: the node's outputs are linear in the seed and read as they are; reached: also the
  // gradients, which their readers read all-reduced and divided.
  std::vector<uint8_t> scaled(g_.size(), 0), reached(g_.size(), 0);
  scaled[seed.value] = reached[seed.value] = 1;
  for (int32_t i = seed.value + 1; i < g_.size(); ++i) {
    const Node& n = g_.nodes()[i];
    bool reads = false;
    n.ForEachInput([&](ValueRef r) { reads |= scaled[r.node.value] != 0; });
    if (!reads) continue;
    if (n.is_output()) return "the step returns a value computed from the backward's seed";
    const std::string why = LinearInScaled(n, scaled);
    if (!why.empty()) {
      return absl::StrFormat("%s (%s) reads a value computed from the backward's seed: %s", n.name,
                             n.target.ToString(), why);
    }
    bool grad = false;
    for (int32_t k = 0; k < static_cast<int32_t>(n.outputs.size()); ++k) {
      const ir::ValueType& t = n.outputs[k];
      if (t.is_tensor() && t.tensor.dtype != ir::DType::kFloat32 &&
          t.tensor.dtype != ir::DType::kFloat64) {
        return absl::StrFormat(
            "%s is %s (f32 and f64 only: scaled by the divisor it could "
            "overflow)",
            n.name, ir::DTypeShortName(t.tensor.dtype));
      }
      const ValueRef v{NodeId{i}, k};
      grad |= grads.contains(v);
      if (a_.IsReduced(v) && !grads.contains(v)) {
        return absl::StrFormat("%s, computed from the backward's seed, is all-reduced", n.name);
      }
    }
    if (!n.grad_of.empty() && !grad) {
      return absl::StrFormat("the gradient of '%s' is not all-reduced", n.grad_of);
    }
    reached[i] = 1;
    scaled[i] = grad ? 0 : 1;
  }
  for (const ValueRef& r : grads) {
    if (!reached[r.node.value]) {
      return absl::StrFormat("the gradient of '%s' is not computed from the backward's seed",
                             g_.node(r.node).grad_of);
    }
  }
  return "";
}

// Fills DeferredDivision from the readers of `w` (a partial scalar all-reduced before its uses):
// "" when the division can be deferred, else why not.
std::string DivisionFinder::DeferredReads(ValueRef w, DeferredDivision& d) const {
  d.divisor = w;
  for (const Reader& r : ReadersOf(g_, w)) {
    const Node& n = g_.node(r.node);
    if (IsDivTensor(n) && r.arg == 1) {
      const ValueRef x = n.args[0].as<ValueRef>();
      const Node& xn = g_.node(x.node);
      if (xn.is_call() && xn.target.name == "aten::ones_like") {
        if (d.seed.valid()) return absl::StrCat("two seeds divide by it: ", n.name);
        d.seed = r.node;
        d.ones = x;
        continue;
      }
      if (d.loss.valid()) return absl::StrCat("two values divide by it: ", n.name);
      d.loss = r.node;
      d.total = x;
      continue;
    }
    const OpRule* rule = n.is_call() ? FindOpRule(n.target) : nullptr;
    const OpParam* tw = rule != nullptr ? rule->param(ParamRole::kTotalWeight) : nullptr;
    if (tw != nullptr && tw->index == r.arg && ReductionOf(n) == 2) {
      d.local_reads.emplace_back(r.node, r.arg);  // nll's sum reduction reads no total weight
      continue;
    }
    return absl::StrFormat("%s (%s) reads it", n.name, n.target.ToString());
  }
  if (!d.seed.valid()) return "no backward seed divides by it";
  if (!d.loss.valid()) return "no loss divides by it";
  const Node& ones_like = g_.node(d.ones.node);
  const ValueRef* of = ones_like.args.empty() ? nullptr : ones_like.args[0].get_if<ValueRef>();
  if (of == nullptr || of->node != d.loss) {
    return absl::StrFormat("the seed %s is not ones_like of the loss %s", g_.node(d.seed).name,
                           g_.node(d.loss).name);
  }
  d.ones_like = d.ones.node;
  for (const Reader& r : ReadersOf(g_, ValueRef{d.loss, 0})) {
    const Node& n = g_.node(r.node);
    if (r.node == d.ones_like) continue;
    if (n.is_output() && OnlyTheLoss(n, ValueRef{d.loss, 0})) continue;
    return absl::StrFormat("the loss %s is read by %s (%s), not only returned",
                           g_.node(d.loss).name, n.name, n.target.ToString());
  }
  const ValueInfo& total = a_.value(d.total);
  const ir::ValueType& tt = g_.type(d.total);
  const ir::ValueType& lt = g_.type(ValueRef{d.loss, 0});
  if (!total.placement.is_partial() || total.mean_scaled || a_.IsReduced(d.total) ||
      !tt.is_tensor() || !lt.is_tensor() || tt.tensor.dtype != lt.tensor.dtype ||
      tt.tensor.shape != lt.tensor.shape) {
    return absl::StrFormat("the loss's dividend %s is not a per-rank sum of the loss's type",
                           g_.node(d.total.node).name);
  }
  return ScalesWithSeed(d.seed);
}

// Whether the output node reads `loss` only as its LOSS output.
bool DivisionFinder::OnlyTheLoss(const Node& out, ValueRef loss) const {
  if (out.args.empty() || !out.args[0].is_list()) return false;
  const auto& list = out.args[0].as<Argument::List>();
  for (size_t k = 0; k < list.size(); ++k) {
    const ValueRef* r = list[k].get_if<ValueRef>();
    if (r == nullptr || *r != loss) continue;
    if (k >= out.output_specs.size() || out.output_specs[k].role != ir::OutputRole::kLoss) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::optional<DeferredDivision> FindDeferredDivision(const ir::Graph& g, const BatchDimAnalysis& a,
                                                     std::string* note) {
  if (a.micro_batches() > 1) return std::nullopt;  // one seed per micro-batch, each its divisor
  std::vector<std::pair<DeferredDivision, std::string>> found;
  for (const Reduction& r : a.reductions()) {
    const ir::ValueType& t = g.type(r.value);
    if (!r.grad_of.empty() || r.op != ReduceOp::kSum || !t.is_tensor() || t.tensor.numel() != 1) {
      continue;
    }
    DeferredDivision d;
    std::string why = DivisionFinder(g, a).DeferredReads(r.value, d);
    if (d.seed.valid()) found.emplace_back(std::move(d), std::move(why));  // a loss's divisor
  }
  if (found.empty()) return std::nullopt;
  const std::string why =
      found.size() > 1 ? "the backward has a seed per divisor" : found[0].second;
  const std::string name = g.node(found[0].first.divisor.node).name;
  if (!why.empty()) {
    if (note != nullptr) {
      *note = absl::StrFormat(
          "the backward waits for the all-reduce of %s (the loss's divisor, a sum over the "
          "batch): %s",
          name, why);
    }
    return std::nullopt;
  }
  if (note != nullptr) {
    *note = absl::StrFormat(
        "the loss's divisor %s (a sum over the batch) is all-reduced while the backward runs: the "
        "backward starts from 1 instead of 1/%s, and each gradient bucket is divided by the "
        "all-reduced %s after its own all-reduce (every gradient is linear in the seed)",
        name, name, name);
  }
  return std::move(found[0].first);
}

LinearIn LinearOf(const Node& n, const OpRule& rule) {
  const OpParam* z = rule.param(ParamRole::kZeroIsLinear);
  if (z == nullptr) return rule.linear;
  const Argument* v = ArgOf(n, *z);
  const bool zero = v == nullptr ? z->value != 0 : IsZeroNumber(*v);
  return zero ? LinearIn{Linearity::kMultilinear, 1} : rule.linear;
}

bool IsZeroNumber(const Argument& a) {
  if (const auto* i = a.get_if<int64_t>()) return *i == 0;
  if (const auto* f = a.get_if<double>()) return *f == 0.0;
  if (const auto* s = a.get_if<ir::Scalar>()) {
    if (const auto* i = std::get_if<int64_t>(&s->value)) return *i == 0;
    if (const auto* f = std::get_if<double>(&s->value)) return *f == 0.0;
  }
  return false;
}

bool AddsNumber(const Node& n, const LinearIn& linear) {
  if (linear.kind != Linearity::kAdditive) return false;
  for (size_t i = 0; i < n.args.size() && i < 8; ++i) {
    const Argument& a = n.args[i];
    const bool number = a.get_if<int64_t>() || a.get_if<double>() || a.get_if<ir::Scalar>();
    if (InMask(linear, static_cast<int>(i)) && number && !IsZeroNumber(a)) return true;
  }
  return false;
}

}  // namespace fxdp
