// The node builder behind BuildTransformerStep (synthetic_graph.cc): appends
// nodes with FX-style names and computes each output type the way torch's meta
// functions do for the few ops the synthetic step uses. Internal to bench/.
#ifndef FXDP_BENCH_GRAPH_BUILDER_H_
#define FXDP_BENCH_GRAPH_BUILDER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "analysis/ir/graph.h"

namespace fxdp::bench::internal {

using ir::Argument;
using ir::DType;
using ir::KeywordArgument;
using ir::Node;
using ir::NodeId;
using ir::TensorType;
using ir::ValueRef;
using ir::ValueType;
using Shape = std::vector<int64_t>;

inline TensorType Contiguous(Shape shape, DType dtype = DType::kFloat32) {
  TensorType t;
  t.stride = ir::ContiguousStrides(shape);
  t.shape = std::move(shape);
  t.dtype = dtype;
  return t;
}

inline int64_t NormDim(int64_t d, int64_t rank) { return d < 0 ? d + rank : d; }

inline Argument IntList(const Shape& v) {
  Argument::List l;
  l.reserve(v.size());
  for (int64_t x : v) l.emplace_back(x);
  return Argument(std::move(l));
}

// Appends nodes with FX-style names ("view", "view_1", ...), computing each
// output type the way torch's meta functions do for the ops used here.
class Builder {
 public:
  const TensorType& type(ValueRef r) const { return nodes_[r.node.value].outputs[r.output].tensor; }

  ValueRef Placeholder(const std::string& name, TensorType t, ir::PlaceholderRole role,
                       const std::string& state, int32_t batch_dim = 0) {
    Node n;
    n.name = name;
    n.kind = ir::NodeKind::kPlaceholder;
    n.target.name = name;
    n.outputs.push_back(ValueType::Tensor(std::move(t)));
    n.placeholder.role = role;
    n.placeholder.state_name = state;
    n.placeholder.batch_dim = batch_dim;
    return Add(std::move(n));
  }

  // A call of `target` (name[.overload]) named after `base`.
  ValueRef Call(absl::string_view base, absl::string_view name, absl::string_view overload,
                std::vector<Argument> args, std::vector<TensorType> outputs,
                std::vector<KeywordArgument> kwargs = {}) {
    Node n;
    n.name = FreshName(base);
    n.kind = ir::NodeKind::kCallFunction;
    n.target.name = std::string(name);
    n.target.overload = std::string(overload);
    n.args = std::move(args);
    n.kwargs = std::move(kwargs);
    n.outputs.reserve(outputs.size());
    for (TensorType& t : outputs) {
      t.requires_grad = false;  // traced calls never carry requires_grad
      n.outputs.push_back(ValueType::Tensor(std::move(t)));
    }
    return Add(std::move(n));
  }

  void MarkGrad(ValueRef r, const std::string& param) { nodes_[r.node.value].grad_of = param; }

  // --- ops, in the argument layout the frontend emits.
  ValueRef View(ValueRef x, const Shape& sizes, absl::string_view op = "view") {
    const TensorType& in = type(x);
    Shape out = sizes;
    int64_t known = 1, infer = -1;
    for (size_t i = 0; i < out.size(); ++i) {
      if (out[i] == -1)
        infer = static_cast<int64_t>(i);
      else
        known *= out[i];
    }
    if (infer >= 0) out[infer] = in.numel() / known;
    return Call(op, absl::StrCat("aten::", op), "", {x, IntList(sizes)},
                {Contiguous(out, in.dtype)});
  }
  ValueRef UnsafeView(ValueRef x, const Shape& sizes) { return View(x, sizes, "_unsafe_view"); }

  ValueRef T(ValueRef x) {
    TensorType t = type(x);
    std::swap(t.shape[0], t.shape[1]);
    std::swap(t.stride[0], t.stride[1]);
    return Call("t", "aten::t", "", {x}, {std::move(t)});
  }
  ValueRef Transpose(ValueRef x, int64_t d0, int64_t d1) {
    TensorType t = type(x);
    const int64_t a = NormDim(d0, t.rank()), b = NormDim(d1, t.rank());
    std::swap(t.shape[a], t.shape[b]);
    std::swap(t.stride[a], t.stride[b]);
    return Call("transpose", "aten::transpose", "int", {x, d0, d1}, {std::move(t)});
  }
  ValueRef Permute(ValueRef x, const Shape& dims) {
    const TensorType& in = type(x);
    TensorType t = in;
    for (size_t i = 0; i < dims.size(); ++i) {
      t.shape[i] = in.shape[dims[i]];
      t.stride[i] = in.stride[dims[i]];
    }
    return Call("permute", "aten::permute", "", {x, IntList(dims)}, {std::move(t)});
  }
  ValueRef Select(ValueRef x, int64_t dim, int64_t index) {
    TensorType t = type(x);
    t.storage_offset += index * t.stride[dim];
    t.shape.erase(t.shape.begin() + dim);
    t.stride.erase(t.stride.begin() + dim);
    return Call("select", "aten::select", "int", {x, dim, index}, {std::move(t)});
  }
  ValueRef Expand(ValueRef x, const Shape& sizes) {
    const TensorType& in = type(x);
    TensorType t = in;
    t.shape = sizes;
    t.stride.assign(sizes.size(), 0);
    const size_t lead = sizes.size() - in.shape.size();
    for (size_t i = 0; i < in.shape.size(); ++i)
      t.stride[lead + i] = in.shape[i] == sizes[lead + i] ? in.stride[i] : 0;
    return Call("expand", "aten::expand", "", {x, IntList(sizes)}, {std::move(t)});
  }
  ValueRef Clone(ValueRef x) {
    return Call("clone", "aten::clone", "", {x}, {Contiguous(type(x).shape, type(x).dtype)},
                {{"memory_format", ir::MemoryFormat::kContiguous}});
  }
  ValueRef Mm(ValueRef a, ValueRef b) {
    return Call("mm", "aten::mm", "", {a, b}, {Contiguous({type(a).shape[0], type(b).shape[1]})});
  }
  ValueRef Addmm(ValueRef bias, ValueRef a, ValueRef b) {
    return Call("addmm", "aten::addmm", "", {bias, a, b},
                {Contiguous({type(a).shape[0], type(b).shape[1]})});
  }
  ValueRef Bmm(ValueRef a, ValueRef b) {
    const Shape& sa = type(a).shape;
    return Call("bmm", "aten::bmm", "", {a, b}, {Contiguous({sa[0], sa[1], type(b).shape[2]})});
  }
  // add.Tensor / mul.Tensor: same-shape operands or a trailing broadcast.
  ValueRef Add(ValueRef a, ValueRef b, std::vector<KeywordArgument> kwargs = {}) {
    const Shape& sa = type(a).shape;
    const Shape& sb = type(b).shape;
    return Call("add", "aten::add", "Tensor", {a, b},
                {Contiguous(sa.size() >= sb.size() ? sa : sb)}, std::move(kwargs));
  }
  ValueRef MulScalar(ValueRef a, double s) {
    return Call("mul", "aten::mul", "Tensor", {a, s}, {Contiguous(type(a).shape)});
  }
  ValueRef SumDim0(ValueRef x) {
    Shape s = type(x).shape;
    s[0] = 1;
    return Call("sum", "aten::sum", "dim_IntList", {x, IntList({0}), true}, {Contiguous(s)});
  }
  // native_layer_norm over the last dim and its three getitems.
  std::vector<ValueRef> LayerNorm(ValueRef x, ValueRef w, ValueRef b) {
    const Shape& s = type(x).shape;
    Shape stat = s;
    stat.back() = 1;
    const ValueRef ln = Call("native_layer_norm", "aten::native_layer_norm", "",
                             {x, IntList({s.back()}), w, b, 1e-05},
                             {Contiguous(s), Contiguous(stat), Contiguous(stat)});
    return GetItems(ln, 3);
  }
  std::vector<ValueRef> LayerNormBackward(ValueRef grad, ValueRef input, ValueRef mean,
                                          ValueRef rstd, ValueRef w, ValueRef b) {
    const Shape& s = type(input).shape;
    const ValueRef lnb = Call("native_layer_norm_backward", "aten::native_layer_norm_backward", "",
                              {grad, input, IntList({s.back()}), mean, rstd, w, b,
                               Argument(Argument::List{true, true, true})},
                              {Contiguous(s), Contiguous({s.back()}), Contiguous({s.back()})});
    return GetItems(lnb, 3);
  }
  std::vector<ValueRef> GetItems(ValueRef multi, int n) {
    std::vector<ValueRef> out;
    for (int k = 0; k < n; ++k) {
      const ValueRef src{multi.node, k};
      out.push_back(Call("getitem", ir::kGetItem, "", {src, int64_t{k}}, {type(src)}));
    }
    return out;
  }

  std::vector<Node> Finish() { return std::move(nodes_); }

  void Output(std::vector<ValueRef> values, std::vector<ir::OutputSpec> specs) {
    Node n;
    n.name = "output";
    n.kind = ir::NodeKind::kOutput;
    n.target.name = "output";
    Argument::List l(values.begin(), values.end());
    n.args.emplace_back(std::move(l));
    n.output_specs = std::move(specs);
    Add(std::move(n));
  }

  void Reserve(size_t n) {
    nodes_.reserve(n);
    counters_.reserve(64);
  }

 private:
  ValueRef Add(Node n) {
    nodes_.push_back(std::move(n));
    return ValueRef{NodeId{static_cast<int32_t>(nodes_.size() - 1)}, 0};
  }
  std::string FreshName(absl::string_view base) {
    int64_t& c = counters_[base];
    std::string name = c == 0 ? std::string(base) : absl::StrCat(base, "_", c);
    ++c;
    return name;
  }

  std::vector<Node> nodes_;
  absl::flat_hash_map<std::string, int64_t> counters_;
};

}  // namespace fxdp::bench::internal

#endif  // FXDP_BENCH_GRAPH_BUILDER_H_
