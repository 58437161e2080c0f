#include "expansion/shape_check.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "analysis/ir/node_error.h"
#include "analysis/ir/type_text.h"
#include "analysis/op_queries.h"
#include "analysis/op_rules.h"

namespace fxdp {
namespace {

using ir::Argument;
using ir::Graph;
using ir::Node;
using ir::ShapeText;
using ir::TensorType;
using ir::ValueRef;
using Shape = std::vector<int64_t>;

int64_t Numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t x : s) n *= x;
  return n;
}

class Checker {
 public:
  Checker(const Graph& g, int32_t rank) : g_(g), rank_(rank) {}

  absl::Status Run() {
    for (const Node& n : g_.nodes()) {
      if (!n.is_call() || n.is_getitem()) continue;
      // The op's row (op_rules.h, view_rules.h) says how its shapes relate.
      const OpRule* op = FindOpRule(n.target);
      const ShapeRule r = ShapeRuleOf(n.target, op);
      if (r.kind == ShapeCheck::kDefault) {
        if (op != nullptr && op->has(kRowsAgree)) {
          auto s = CheckRowsAgree(n, *op);
          if (!s.ok()) return s;
        } else if (op != nullptr && op->family == OpFamily::kPointwise) {
          auto s = CheckBroadcast(n);
          if (!s.ok()) return s;
        }
        continue;
      }
      auto s = Check(n, r, op);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Fail(const Node& n, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrFormat(
        "rank %d's expanded graph: %s: %s; a size the expansion should have made "
        "local kept the global batch (this graph would fail on the worker at step 1)",
        rank_, ir::NodeLabel(n), what));
  }

  const TensorType* Tensor(const Argument* a) const {
    if (a == nullptr) return nullptr;
    const ValueRef* r = a->get_if<ValueRef>();
    if (r == nullptr || !g_.type(*r).is_tensor()) return nullptr;
    return &g_.type(*r).tensor;
  }
  const TensorType* Arg(const Node& n, int i) const {
    return i >= 0 && i < static_cast<int>(n.args.size()) ? Tensor(&n.args[i]) : nullptr;
  }
  static const TensorType* Out(const Node& n, int k = 0) {
    return k < static_cast<int>(n.outputs.size()) && n.outputs[k].is_tensor() ? &n.outputs[k].tensor
                                                                              : nullptr;
  }
  static std::optional<Shape> Ints(const Node& n, int i) {
    if (i < 0 || i >= static_cast<int>(n.args.size())) return std::nullopt;
    const auto* l = n.args[i].get_if<Argument::List>();
    if (l == nullptr) return std::nullopt;
    Shape s;
    for (const Argument& e : *l) {
      const auto* v = e.get_if<int64_t>();
      if (v == nullptr) return std::nullopt;  // a symbolic size: nothing to check.
      s.push_back(*v);
    }
    return s;
  }

  // kSizes, kView, kExpand, kAsStrided: the size argument (a view's -1 inferred from the input,
  // an expand's -1 the input's dim) is the recorded output shape; an as_strided view of a
  // contiguous input stays inside it.
  absl::Status CheckSizes(const Node& n, const ShapeRule& r, const OpRule* op,
                          const TensorType* out) {
    const int a = SizeArgIndex(n.target, op);
    if (a < 0) {
      return ir::NodeError(n, "shape check without a sizes parameter in its rule",
                           absl::StatusCode::kInternal);
    }
    auto size = Ints(n, a);
    if (!size || out == nullptr) return absl::OkStatus();
    const TensorType* in = Arg(n, 0);
    Shape want = *size;
    if (r.kind == ShapeCheck::kView && in != nullptr) {
      int64_t known = 1, unknown = -1;
      for (size_t i = 0; i < want.size(); ++i) {
        if (want[i] == -1)
          unknown = static_cast<int64_t>(i);
        else
          known *= want[i];
      }
      if (unknown >= 0 && known > 0) want[unknown] = in->numel() / known;
      if (Numel(want) != in->numel()) {
        return Fail(
            n, absl::StrFormat("size %s has %d elements, its input %s has %d", ShapeText(*size),
                               Numel(want), ShapeText(in->shape), in->numel()));
      }
    }
    if (r.kind == ShapeCheck::kExpand && in != nullptr) {
      const int64_t shift = static_cast<int64_t>(want.size()) - in->rank();
      if (shift < 0) return Fail(n, "expands to fewer dims than its input has");
      for (int64_t i = 0; i < in->rank(); ++i) {
        int64_t& w = want[i + shift];
        if (w == -1) w = in->shape[i];
        if (in->shape[i] != 1 && in->shape[i] != w) {
          return Fail(n,
                      absl::StrFormat("input %s cannot be expanded to %s (dim %d: %d "
                                      "vs %d)",
                                      ShapeText(in->shape), ShapeText(*size), i, in->shape[i], w));
        }
      }
    }
    if (want != out->shape) {
      return Fail(n, absl::StrFormat("size argument %s but the output is recorded as %s",
                                     ShapeText(*size), ShapeText(out->shape)));
    }
    if (r.kind == ShapeCheck::kAsStrided && in != nullptr && in->IsContiguous() &&
        in->storage_offset == 0) {
      auto stride = Ints(n, a + 1);
      int64_t offset = 0;
      if (a + 2 < static_cast<int>(n.args.size())) {
        if (const auto* v = n.args[a + 2].get_if<int64_t>()) offset = *v;
      }
      if (stride && stride->size() == want.size() && Numel(want) > 0) {
        int64_t last = offset;
        for (size_t i = 0; i < want.size(); ++i) last += (want[i] - 1) * (*stride)[i];
        if (last >= in->numel()) {
          return Fail(n, absl::StrFormat("size %s with stride %s reaches element %d of an "
                                         "input with %d elements %s",
                                         ShapeText(want), ShapeText(*stride), last, in->numel(),
                                         ShapeText(in->shape)));
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status Check(const Node& n, const ShapeRule& r, const OpRule* op) {
    const TensorType* out = Out(n);
    switch (r.kind) {
      case ShapeCheck::kDefault:
      case ShapeCheck::kNone: return absl::OkStatus();
      case ShapeCheck::kSizes:
      case ShapeCheck::kView:
      case ShapeCheck::kExpand:
      case ShapeCheck::kAsStrided: return CheckSizes(n, r, op, out);
      case ShapeCheck::kSameAsArg: {
        const TensorType* in = Arg(n, r.arg);
        if (in == nullptr || out == nullptr || in->shape == out->shape) return absl::OkStatus();
        return Fail(n, absl::StrFormat("output %s differs from arg %d %s", ShapeText(out->shape),
                                       r.arg, ShapeText(in->shape)));
      }
      case ShapeCheck::kEmbedding: {
        const TensorType* w = Arg(n, 0);
        const TensorType* idx = Arg(n, 1);
        if (w == nullptr || idx == nullptr || out == nullptr || w->rank() != 2) {
          return absl::OkStatus();
        }
        Shape want = idx->shape;
        want.push_back(w->shape[1]);
        if (want == out->shape) return absl::OkStatus();
        return Fail(n,
                    absl::StrFormat("indices %s give %s, the output is recorded as %s",
                                    ShapeText(idx->shape), ShapeText(want), ShapeText(out->shape)));
      }
      case ShapeCheck::kEmbeddingBackward: {
        const TensorType* grad = Arg(n, 0);
        const TensorType* idx = Arg(n, 1);
        if (grad == nullptr || idx == nullptr || grad->rank() != idx->rank() + 1) {
          return absl::OkStatus();
        }
        const Shape lead(grad->shape.begin(), grad->shape.end() - 1);
        if (lead == idx->shape) return absl::OkStatus();
        return Fail(n, absl::StrFormat("grad_output %s does not match indices %s (it must be "
                                       "indices' shape + [embedding_dim])",
                                       ShapeText(grad->shape), ShapeText(idx->shape)));
      }
      case ShapeCheck::kProduct: return op == nullptr ? absl::OkStatus() : CheckProduct(n, *op);
      case ShapeCheck::kBatchAgrees: {
        const TensorType* self = Arg(n, r.arg);
        const TensorType* target = Arg(n, r.arg + 1);
        if (self == nullptr || target == nullptr || self->rank() < 2 || target->rank() < 1) {
          return absl::OkStatus();
        }
        if (self->shape[0] != target->shape[0]) {
          return Fail(n, absl::StrFormat("input %s and target %s disagree on the batch",
                                         ShapeText(self->shape), ShapeText(target->shape)));
        }
        return absl::OkStatus();
      }
    }
    return absl::OkStatus();
  }

  // The operands and output of an einsum-like product agree with its spec:
  // one size per label (a bias operand may broadcast and is not checked).
  absl::Status CheckProduct(const Node& n, const OpRule& op) {
    std::vector<int64_t> ranks;
    for (size_t i = 0; i < n.args.size(); ++i) {
      const TensorType* t = Arg(n, static_cast<int>(i));
      ranks.push_back(t == nullptr ? -1 : t->rank());
    }
    auto labels = op.spec.Bind(ranks);
    if (!labels.ok()) return absl::OkStatus();
    absl::flat_hash_map<int, int64_t> size_of;
    std::vector<std::string> shapes;
    bool agree = true;
    for (size_t i = 0; i < labels->args.size(); ++i) {
      const int arg = labels->args[i];
      if (arg == labels->bias_arg) continue;
      const TensorType* t = Arg(n, arg);
      const std::vector<int>& l = labels->operands[i];
      if (t == nullptr || t->rank() != static_cast<int64_t>(l.size())) return absl::OkStatus();
      shapes.push_back(ShapeText(t->shape));
      for (size_t d = 0; d < l.size(); ++d) {
        auto [it, inserted] = size_of.emplace(l[d], t->shape[d]);
        if (!inserted && it->second != t->shape[d]) agree = false;
      }
    }
    if (!agree) {
      return Fail(n, absl::StrFormat("multiplies %s (%s)", absl::StrJoin(shapes, " by "),
                                     op.spec.ToString()));
    }
    const TensorType* out = Out(n);
    if (out == nullptr) return absl::OkStatus();
    Shape want;
    for (int l : labels->output) want.push_back(size_of[l]);
    if (out->shape != want) {
      return Fail(n, absl::StrFormat("%s is recorded as %s", absl::StrJoin(shapes, " x "),
                                     ShapeText(out->shape)));
    }
    return absl::OkStatus();
  }

  // Every tensor operand but the rule's Replicated ones (weights) has arg 0's
  // rows, or 1: attention, pooling and convolution kernels.
  absl::Status CheckRowsAgree(const Node& n, const OpRule& op) {
    const TensorType* first = Arg(n, 0);
    if (first == nullptr || first->rank() == 0) return absl::OkStatus();
    const int64_t b = first->shape[0];
    auto check = [&](const Argument& a, int arg) -> absl::Status {
      if (op.replicated(arg)) return absl::OkStatus();
      const TensorType* t = Tensor(&a);
      if (t == nullptr || t->rank() == 0 || t->shape[0] == b || t->shape[0] == 1) {
        return absl::OkStatus();
      }
      return Fail(n, absl::StrFormat("arg %d %s has %d rows, arg 0 %s has %d", arg,
                                     ShapeText(t->shape), t->shape[0], ShapeText(first->shape), b));
    };
    for (size_t i = 1; i < n.args.size(); ++i) {
      auto s = check(n.args[i], static_cast<int>(i));
      if (!s.ok()) return s;
    }
    for (size_t k = 0; k < n.kwargs.size(); ++k) {
      auto s = check(n.kwargs[k].value, 64 + static_cast<int>(k));
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // Output k of a pointwise op is the broadcast of its tensor operands.
  absl::Status CheckBroadcast(const Node& n) {
    Shape b;
    std::string seen;
    bool any = false;
    auto add = [&](const Argument& a) -> bool {
      const TensorType* t = Tensor(&a);
      if (t == nullptr) return true;
      any = true;
      const Shape& s = t->shape;
      if (s.size() > b.size()) b.insert(b.begin(), s.size() - b.size(), 1);
      const size_t shift = b.size() - s.size();
      for (size_t i = 0; i < s.size(); ++i) {
        int64_t& x = b[i + shift];
        if (s[i] == x || s[i] == 1) continue;
        if (x != 1) return false;
        x = s[i];
      }
      absl::StrAppend(&seen, seen.empty() ? "" : ", ", ShapeText(s));
      return true;
    };
    for (const Argument& a : n.args) {
      if (!add(a)) {
        return Fail(n, absl::StrFormat("operands %s%s%s do not broadcast", seen,
                                       seen.empty() ? "" : ", ", ShapeText(Tensor(&a)->shape)));
      }
    }
    for (const auto& kw : n.kwargs) {
      if (!add(kw.value)) {
        return Fail(n, absl::StrFormat("operands %s, %s do not broadcast", seen,
                                       ShapeText(Tensor(&kw.value)->shape)));
      }
    }
    if (!any) return absl::OkStatus();
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      const TensorType* out = Out(n, static_cast<int>(k));
      if (out != nullptr && out->shape != b) {
        return Fail(n, absl::StrFormat("operands %s broadcast to %s, output %d is recorded as %s",
                                       seen, ShapeText(b), k, ShapeText(out->shape)));
      }
    }
    return absl::OkStatus();
  }

  const Graph& g_;
  const int32_t rank_;
};

}  // namespace

absl::Status CheckRankShapes(const Graph& graph, int32_t rank) {
  return Checker(graph, rank).Run();
}

}  // namespace fxdp
