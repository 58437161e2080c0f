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
#include "analysis/op_rules.h"
#include "expansion/size_args.h"

namespace fxdp {
namespace {

using ir::Argument;
using ir::Graph;
using ir::Node;
using ir::TensorType;
using ir::ValueRef;
using Shape = std::vector<int64_t>;

// How an op's output shape follows from its inputs and size arguments.
enum class ShapeFn : int8_t {
  kSizeIsOutput,     // the op's size list (size_args.h) is output 0's shape (-1: the input's size).
  kView,             // kSizeIsOutput, and the input has as many elements.
  kExpand,           // kSizeIsOutput, and each input dim is 1 or equal (right-aligned).
  kAsStrided,        // kSizeIsOutput, and the view stays inside a dense input.
  kSameAsArg,        // output 0 has the shape of tensor arg `a`.
  kEmbedding,        // embedding(weight, indices): indices.shape + [weight.shape[1]].
  kEmbeddingBackward,  // grad_output is indices.shape + [embedding_dim].
  kMatmul2d,         // mm(a, b) / addmm(bias, a, b) with the matrices from arg `a`.
  kBmm,              // bmm(a, b).
  kNllLoss,          // nll_loss*(self, target, ...): batch dims agree (`a`: self's arg).
  kLeadingDimAgrees, // every tensor operand but the weights at `a`, a + 1 has dim 0 of
                     // arg 0 (or 1); attention, pooling and convolution kernels.
};

struct ShapeRule {
  absl::string_view name;
  ShapeFn fn;
  int8_t a = -1;
};

// One line per op, sorted by name.
constexpr ShapeRule kShapeRules[] = {
    {"aten::_log_softmax", ShapeFn::kSameAsArg, 0},
    {"aten::_log_softmax_backward_data", ShapeFn::kSameAsArg, 0},
    {"aten::_safe_softmax", ShapeFn::kSameAsArg, 0},
    {"aten::_scaled_dot_product_efficient_attention", ShapeFn::kLeadingDimAgrees, -1},
    {"aten::_scaled_dot_product_flash_attention_for_cpu", ShapeFn::kLeadingDimAgrees, -1},
    {"aten::_scaled_dot_product_flash_attention_for_cpu_backward", ShapeFn::kLeadingDimAgrees, -1},
    {"aten::_softmax", ShapeFn::kSameAsArg, 0},
    {"aten::_softmax_backward_data", ShapeFn::kSameAsArg, 0},
    {"aten::_unsafe_view", ShapeFn::kView},
    {"aten::addmm", ShapeFn::kMatmul2d, 1},
    {"aten::as_strided", ShapeFn::kAsStrided},
    {"aten::bmm", ShapeFn::kBmm, 0},
    {"aten::broadcast_to", ShapeFn::kExpand},
    {"aten::convolution", ShapeFn::kLeadingDimAgrees, 1},
    {"aten::convolution_backward", ShapeFn::kLeadingDimAgrees, 2},
    {"aten::embedding", ShapeFn::kEmbedding, -1},
    {"aten::embedding_dense_backward", ShapeFn::kEmbeddingBackward, -1},
    {"aten::empty", ShapeFn::kSizeIsOutput},
    {"aten::expand", ShapeFn::kExpand},
    {"aten::full", ShapeFn::kSizeIsOutput},
    {"aten::max_pool2d_with_indices_backward", ShapeFn::kLeadingDimAgrees, -1},
    {"aten::mm", ShapeFn::kMatmul2d, 0},
    {"aten::native_layer_norm", ShapeFn::kSameAsArg, 0},
    {"aten::native_layer_norm_backward", ShapeFn::kSameAsArg, 1},
    {"aten::new_empty", ShapeFn::kSizeIsOutput},
    {"aten::new_full", ShapeFn::kSizeIsOutput},
    {"aten::new_ones", ShapeFn::kSizeIsOutput},
    {"aten::new_zeros", ShapeFn::kSizeIsOutput},
    {"aten::nll_loss_backward", ShapeFn::kNllLoss, 1},
    {"aten::nll_loss_forward", ShapeFn::kNllLoss, 0},
    {"aten::ones", ShapeFn::kSizeIsOutput},
    {"aten::rand", ShapeFn::kSizeIsOutput},
    {"aten::randn", ShapeFn::kSizeIsOutput},
    {"aten::reshape", ShapeFn::kView},
    {"aten::select_backward", ShapeFn::kSizeIsOutput},
    {"aten::slice_backward", ShapeFn::kSizeIsOutput},
    {"aten::upsample_bicubic2d_backward", ShapeFn::kSizeIsOutput},
    {"aten::upsample_bilinear2d_backward", ShapeFn::kSizeIsOutput},
    {"aten::upsample_linear1d_backward", ShapeFn::kSizeIsOutput},
    {"aten::upsample_nearest1d_backward", ShapeFn::kSizeIsOutput},
    {"aten::upsample_nearest2d_backward", ShapeFn::kSizeIsOutput},
    {"aten::upsample_nearest3d_backward", ShapeFn::kSizeIsOutput},
    {"aten::upsample_trilinear3d_backward", ShapeFn::kSizeIsOutput},
    {"aten::view", ShapeFn::kView},
    {"aten::zeros", ShapeFn::kSizeIsOutput},
};

// Pointwise ops of the batch-dim table whose output is not the broadcast of
// their tensor operands.
constexpr absl::string_view kNotBroadcast[] = {"aten::glu", "aten::view_as"};

const ShapeRule* FindShapeRule(absl::string_view name) {
  static const auto* index = [] {
    auto* m = new absl::flat_hash_map<absl::string_view, const ShapeRule*>();
    for (const ShapeRule& r : kShapeRules) m->emplace(r.name, &r);
    return m;
  }();
  auto it = index->find(name);
  return it == index->end() ? nullptr : it->second;
}

std::string Str(const Shape& s) { return absl::StrCat("[", absl::StrJoin(s, ", "), "]"); }

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
      if (const ShapeRule* r = FindShapeRule(n.target.name)) {
        auto s = Check(n, *r);
        if (!s.ok()) return s;
        continue;
      }
      const OpRule* op = FindOpRule(n.target);
      if (op != nullptr && op->family == OpFamily::kPointwise &&
          std::find(std::begin(kNotBroadcast), std::end(kNotBroadcast), n.target.name) ==
              std::end(kNotBroadcast)) {
        auto s = CheckBroadcast(n);
        if (!s.ok()) return s;
      }
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Fail(const Node& n, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrFormat(
        "rank %d's expanded graph: node '%s' (%s): %s; a size the expansion should have made "
        "local kept the global batch (this graph would fail on the worker at step 1)",
        rank_, n.name, n.target.ToString(), what));
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
    return k < static_cast<int>(n.outputs.size()) && n.outputs[k].is_tensor()
               ? &n.outputs[k].tensor
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

  absl::Status Check(const Node& n, const ShapeRule& r) {
    const TensorType* out = Out(n);
    switch (r.fn) {
      case ShapeFn::kSizeIsOutput:
      case ShapeFn::kView:
      case ShapeFn::kExpand:
      case ShapeFn::kAsStrided: {
        const int a = SizeArgIndex(n.target);
        if (a < 0) {
          return absl::InternalError(absl::StrCat("node ", n.name, " (", n.target.ToString(),
                                                  "): shape rule without a size argument in size_args.cc"));
        }
        auto size = Ints(n, a);
        if (!size || out == nullptr) return absl::OkStatus();
        const TensorType* in = Arg(n, 0);
        Shape want = *size;
        if (r.fn == ShapeFn::kView && in != nullptr) {
          int64_t known = 1, unknown = -1;
          for (size_t i = 0; i < want.size(); ++i) {
            if (want[i] == -1) unknown = static_cast<int64_t>(i);
            else known *= want[i];
          }
          if (unknown >= 0 && known > 0) want[unknown] = in->numel() / known;
          if (Numel(want) != in->numel()) {
            return Fail(n, absl::StrFormat("size %s has %d elements, its input %s has %d",
                                           Str(*size), Numel(want), Str(in->shape),
                                           in->numel()));
          }
        }
        if (r.fn == ShapeFn::kExpand && in != nullptr) {
          const int64_t shift = static_cast<int64_t>(want.size()) - in->rank();
          if (shift < 0) return Fail(n, "expands to fewer dims than its input has");
          for (int64_t i = 0; i < in->rank(); ++i) {
            int64_t& w = want[i + shift];
            if (w == -1) w = in->shape[i];
            if (in->shape[i] != 1 && in->shape[i] != w) {
              return Fail(n, absl::StrFormat("input %s cannot be expanded to %s (dim %d: %d "
                                             "vs %d)",
                                             Str(in->shape), Str(*size), i, in->shape[i], w));
            }
          }
        }
        if (want != out->shape) {
          return Fail(n, absl::StrFormat("size argument %s but the output is recorded as %s",
                                         Str(*size), Str(out->shape)));
        }
        if (r.fn == ShapeFn::kAsStrided && in != nullptr && in->IsContiguous() &&
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
                                             Str(want), Str(*stride), last, in->numel(),
                                             Str(in->shape)));
            }
          }
        }
        return absl::OkStatus();
      }
      case ShapeFn::kSameAsArg: {
        const TensorType* in = Arg(n, r.a);
        if (in == nullptr || out == nullptr || in->shape == out->shape) return absl::OkStatus();
        return Fail(n, absl::StrFormat("output %s differs from arg %d %s", Str(out->shape), r.a,
                                       Str(in->shape)));
      }
      case ShapeFn::kEmbedding: {
        const TensorType* w = Arg(n, 0);
        const TensorType* idx = Arg(n, 1);
        if (w == nullptr || idx == nullptr || out == nullptr || w->rank() != 2) {
          return absl::OkStatus();
        }
        Shape want = idx->shape;
        want.push_back(w->shape[1]);
        if (want == out->shape) return absl::OkStatus();
        return Fail(n, absl::StrFormat("indices %s give %s, the output is recorded as %s",
                                       Str(idx->shape), Str(want), Str(out->shape)));
      }
      case ShapeFn::kEmbeddingBackward: {
        const TensorType* grad = Arg(n, 0);
        const TensorType* idx = Arg(n, 1);
        if (grad == nullptr || idx == nullptr || grad->rank() != idx->rank() + 1) {
          return absl::OkStatus();
        }
        const Shape lead(grad->shape.begin(), grad->shape.end() - 1);
        if (lead == idx->shape) return absl::OkStatus();
        return Fail(n, absl::StrFormat("grad_output %s does not match indices %s (it must be "
                                       "indices' shape + [embedding_dim])",
                                       Str(grad->shape), Str(idx->shape)));
      }
      case ShapeFn::kMatmul2d: {
        const TensorType* a = Arg(n, r.a);
        const TensorType* b = Arg(n, r.a + 1);
        if (a == nullptr || b == nullptr || a->rank() != 2 || b->rank() != 2) {
          return absl::OkStatus();
        }
        if (a->shape[1] != b->shape[0]) {
          return Fail(n, absl::StrFormat("multiplies %s by %s", Str(a->shape), Str(b->shape)));
        }
        if (out != nullptr && out->shape != Shape{a->shape[0], b->shape[1]}) {
          return Fail(n, absl::StrFormat("%s x %s is recorded as %s", Str(a->shape),
                                         Str(b->shape), Str(out->shape)));
        }
        return absl::OkStatus();
      }
      case ShapeFn::kBmm: {
        const TensorType* a = Arg(n, 0);
        const TensorType* b = Arg(n, 1);
        if (a == nullptr || b == nullptr || a->rank() != 3 || b->rank() != 3) {
          return absl::OkStatus();
        }
        if (a->shape[0] != b->shape[0] || a->shape[2] != b->shape[1]) {
          return Fail(n, absl::StrFormat("multiplies %s by %s", Str(a->shape), Str(b->shape)));
        }
        return absl::OkStatus();
      }
      case ShapeFn::kNllLoss: {
        const TensorType* self = Arg(n, r.a);
        const TensorType* target = Arg(n, r.a + 1);
        if (self == nullptr || target == nullptr || self->rank() < 2 || target->rank() < 1) {
          return absl::OkStatus();
        }
        if (self->shape[0] != target->shape[0]) {
          return Fail(n, absl::StrFormat("input %s and target %s disagree on the batch",
                                         Str(self->shape), Str(target->shape)));
        }
        return absl::OkStatus();
      }
      case ShapeFn::kLeadingDimAgrees: {
        const TensorType* first = Arg(n, 0);
        if (first == nullptr || first->rank() == 0) return absl::OkStatus();
        const int64_t b = first->shape[0];
        auto check = [&](const Argument& a, int arg) -> absl::Status {
          if (r.a >= 0 && (arg == r.a || arg == r.a + 1)) return absl::OkStatus();
          const TensorType* t = Tensor(&a);
          if (t == nullptr || t->rank() == 0 || t->shape[0] == b || t->shape[0] == 1) {
            return absl::OkStatus();
          }
          return Fail(n, absl::StrFormat("arg %d %s has %d rows, arg 0 %s has %d",
                                         arg, Str(t->shape), t->shape[0], Str(first->shape), b));
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
      absl::StrAppend(&seen, seen.empty() ? "" : ", ", Str(s));
      return true;
    };
    for (const Argument& a : n.args) {
      if (!add(a)) {
        return Fail(n, absl::StrFormat("operands %s%s%s do not broadcast", seen,
                                       seen.empty() ? "" : ", ", Str(Tensor(&a)->shape)));
      }
    }
    for (const auto& kw : n.kwargs) {
      if (!add(kw.value)) {
        return Fail(n, absl::StrFormat("operands %s, %s do not broadcast", seen,
                                       Str(Tensor(&kw.value)->shape)));
      }
    }
    if (!any) return absl::OkStatus();
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      const TensorType* out = Out(n, static_cast<int>(k));
      if (out != nullptr && out->shape != b) {
        return Fail(n, absl::StrFormat("operands %s broadcast to %s, output %d is recorded as %s",
                                       seen, Str(b), k, Str(out->shape)));
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

std::vector<std::string> ShapeRuleNames() {
  std::vector<std::string> out;
  for (const ShapeRule& r : kShapeRules) out.emplace_back(r.name);
  return out;
}

}  // namespace fxdp
