#include "bench/synthetic_graph.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "analysis/ir/proto_codec.h"
#include "util/status_macros.h"

namespace fxdp::bench {
namespace {

using ir::Argument;
using ir::DType;
using ir::KeywordArgument;
using ir::Node;
using ir::NodeId;
using ir::TensorType;
using ir::ValueRef;
using ir::ValueType;
using Shape = std::vector<int64_t>;

// Node counts, checked against the built graph by synthetic_graph_test.
// Per block: 11 parameters (qkv has no bias), 11 momentum buffers, 56
// forward nodes, 78 backward nodes, 3 SGD nodes per parameter.
constexpr int64_t kParamsPerLayer = 11;
constexpr int64_t kNodesPerLayer = 2 * kParamsPerLayer + 56 + 78 + 3 * kParamsPerLayer;  // 189
// tok/pos embeddings, ln_f, head: 6 parameters (x5 as above), 2 inputs,
// embeddings (4), final norm + head + loss (14), loss and head backward
// (18), embedding backward (4), output.
constexpr int64_t kFixedParams = 6;
constexpr int64_t kFixedNodes = 5 * kFixedParams + 2 + 4 + 14 + 18 + 4 + 1;  // 73

TensorType Contiguous(Shape shape, DType dtype = DType::kFloat32) {
  TensorType t;
  t.stride = ir::ContiguousStrides(shape);
  t.shape = std::move(shape);
  t.dtype = dtype;
  return t;
}

int64_t NormDim(int64_t d, int64_t rank) { return d < 0 ? d + rank : d; }

Argument IntList(const Shape& v) {
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

// What the backward of one block reads from its forward.
struct BlockSaved {
  ValueRef x_in, ln1_mean, ln1_rstd, ln1_out_2d;
  ValueRef qkv_t, q_3d, k_3d, v_3d, att_3d, softmax, mask;
  ValueRef attn_2d, proj_t, x_mid, ln2_mean, ln2_rstd, ln2_out_2d;
  ValueRef fc1_t, fc1_out, gelu_2d, fc2_t, x_out;
};

struct Param {
  std::string state;  // "blocks.3.attn.qkv.weight"
  ValueRef value, buffer, grad;
};

std::string PlaceholderName(absl::string_view prefix, absl::string_view state) {
  return absl::StrCat(prefix, absl::StrReplaceAll(state, {{".", "_"}}));
}

absl::Status CheckShape(const TransformerShape& s, int32_t layers) {
  if (layers < 1) return absl::InvalidArgumentError(absl::StrCat("layers = ", layers, " < 1"));
  if (s.batch < 1 || s.seq < 1 || s.d_model < 1 || s.heads < 1 || s.ff < 1 || s.vocab < 1 ||
      s.max_seq < s.seq || s.d_model % s.heads != 0)
    return absl::InvalidArgumentError(absl::StrCat(
        "inconsistent transformer shape: batch ", s.batch, ", seq ", s.seq, ", max_seq ", s.max_seq,
        ", d_model ", s.d_model, ", heads ", s.heads, ", ff ", s.ff, ", vocab ", s.vocab,
        " (all >= 1, max_seq >= seq, heads divides d_model)"));
  return absl::OkStatus();
}

}  // namespace

int64_t TransformerStepNodeCount(int32_t layers) {
  return kFixedNodes + int64_t{layers} * kNodesPerLayer;
}

int32_t LayersForNodeCount(int64_t target_nodes) {
  const int64_t l = (target_nodes - kFixedNodes + kNodesPerLayer / 2) / kNodesPerLayer;
  return static_cast<int32_t>(std::max<int64_t>(1, l));
}

absl::StatusOr<ir::Graph> BuildTransformerStep(const TransformerShape& s, int32_t layers) {
  FXDP_RETURN_IF_ERROR(CheckShape(s, layers));
  const int64_t B = s.batch, T = s.seq, D = s.d_model, H = s.heads, Dh = D / H, F = s.ff,
                V = s.vocab, BT = B * T, BH = B * H;
  const double scale = 1.0 / std::sqrt(static_cast<double>(Dh));
  constexpr double kMomentum = 0.9, kLr = 0.05;
  Builder b;
  b.Reserve(static_cast<size_t>(TransformerStepNodeCount(layers)));

  // Parameters in module order, then their momentum buffers, then inputs.
  std::vector<Param> params;
  std::vector<Shape> shapes;
  auto param = [&](std::string state, Shape shape) {
    params.push_back({std::move(state), {}, {}, {}});
    shapes.push_back(std::move(shape));
    return params.size() - 1;
  };
  const size_t tok = param("tok.weight", {V, D});
  const size_t pos = param("pos.weight", {s.max_seq, D});
  struct BlockParams {
    size_t ln1w, ln1b, qkv, projw, projb, ln2w, ln2b, fc1w, fc1b, fc2w, fc2b;
  };
  std::vector<BlockParams> bp(layers);
  for (int32_t i = 0; i < layers; ++i) {
    const std::string p = absl::StrCat("blocks.", i, ".");
    bp[i] = {param(p + "ln1.weight", {D}),
             param(p + "ln1.bias", {D}),
             param(p + "attn.qkv.weight", {3 * D, D}),
             param(p + "attn.proj.weight", {D, D}),
             param(p + "attn.proj.bias", {D}),
             param(p + "ln2.weight", {D}),
             param(p + "ln2.bias", {D}),
             param(p + "fc1.weight", {F, D}),
             param(p + "fc1.bias", {F}),
             param(p + "fc2.weight", {D, F}),
             param(p + "fc2.bias", {D})};
  }
  const size_t lnfw = param("ln_f.weight", {D}), lnfb = param("ln_f.bias", {D});
  const size_t headw = param("head.weight", {V, D}), headb = param("head.bias", {V});
  for (size_t k = 0; k < params.size(); ++k) {
    TensorType t = Contiguous(shapes[k]);
    t.requires_grad = true;
    params[k].value = b.Placeholder(PlaceholderName("p_", params[k].state), std::move(t),
                                    ir::PlaceholderRole::kParameter, params[k].state);
  }
  for (size_t k = 0; k < params.size(); ++k) {
    const std::string state = absl::StrCat("optim.", params[k].state, ".momentum_buffer");
    params[k].buffer = b.Placeholder(PlaceholderName("s_", state), Contiguous(shapes[k]),
                                     ir::PlaceholderRole::kOptimizerState, state);
  }
  const ValueRef tokens = b.Placeholder("x_tokens", Contiguous({B, T}, DType::kInt64),
                                        ir::PlaceholderRole::kInput, "tokens", 0);
  const ValueRef target = b.Placeholder("x_target", Contiguous({B, T}, DType::kInt64),
                                        ir::PlaceholderRole::kInput, "target", 0);
  auto P = [&](size_t k) { return params[k].value; };
  const Argument cpu = ir::Device{};

  // ---- forward
  const ValueRef arange =
      b.Call("arange", "aten::arange", "", {T}, {Contiguous({T}, DType::kInt64)},
             {{"device", cpu}, {"pin_memory", false}});
  const ValueRef emb =
      b.Call("embedding", "aten::embedding", "", {P(tok), tokens}, {Contiguous({B, T, D})});
  const ValueRef emb_pos =
      b.Call("embedding", "aten::embedding", "", {P(pos), arange}, {Contiguous({T, D})});
  ValueRef x = b.Add(emb, emb_pos);

  std::vector<BlockSaved> saved(layers);
  for (int32_t i = 0; i < layers; ++i) {
    BlockSaved& sv = saved[i];
    const BlockParams& q = bp[i];
    sv.x_in = x;
    std::vector<ValueRef> ln1 = b.LayerNorm(x, P(q.ln1w), P(q.ln1b));
    sv.ln1_mean = ln1[1];
    sv.ln1_rstd = ln1[2];
    sv.qkv_t = b.T(P(q.qkv));
    sv.ln1_out_2d = b.View(ln1[0], {BT, D});
    const ValueRef qkv = b.UnsafeView(b.Mm(sv.ln1_out_2d, sv.qkv_t), {B, T, 3 * D});
    const ValueRef perm = b.Permute(b.View(qkv, {B, T, 3, H, Dh}), {2, 0, 3, 1, 4});
    const ValueRef sel_q = b.Select(perm, 0, 0);
    const ValueRef sel_k = b.Select(perm, 0, 1);
    const ValueRef sel_v = b.Select(perm, 0, 2);
    const ValueRef kt = b.Transpose(sel_k, -2, -1);
    sv.q_3d = b.UnsafeView(b.Clone(b.Expand(sel_q, {B, H, T, Dh})), {BH, T, Dh});
    sv.k_3d = b.UnsafeView(b.Clone(b.Expand(kt, {B, H, Dh, T})), {BH, Dh, T});
    const ValueRef scores = b.UnsafeView(b.Bmm(sv.q_3d, sv.k_3d), {B, H, T, T});
    const ValueRef scaled = b.MulScalar(scores, scale);
    const ValueRef ones =
        b.Call("ones", "aten::ones", "", {IntList({T, T})}, {Contiguous({T, T}, DType::kBool)},
               {{"dtype", DType::kBool}, {"device", cpu}, {"pin_memory", false}});
    sv.mask =
        b.Call("triu", "aten::triu", "", {ones, int64_t{1}}, {Contiguous({T, T}, DType::kBool)});
    const ValueRef masked = b.Call("masked_fill", "aten::masked_fill", "Scalar",
                                   {scaled, sv.mask, -std::numeric_limits<double>::infinity()},
                                   {Contiguous({B, H, T, T})});
    sv.softmax = b.Call("_softmax", "aten::_softmax", "", {masked, int64_t{-1}, false},
                        {Contiguous({B, H, T, T})});
    sv.att_3d = b.View(b.Expand(sv.softmax, {B, H, T, T}), {BH, T, T});
    sv.v_3d = b.UnsafeView(b.Clone(b.Expand(sel_v, {B, H, T, Dh})), {BH, T, Dh});
    const ValueRef y = b.UnsafeView(b.Bmm(sv.att_3d, sv.v_3d), {B, H, T, Dh});
    const ValueRef y_t = b.UnsafeView(b.Clone(b.Transpose(y, 1, 2)), {B, T, D});
    sv.attn_2d = b.View(y_t, {BT, D});
    sv.proj_t = b.T(P(q.projw));
    const ValueRef proj = b.View(b.Addmm(P(q.projb), sv.attn_2d, sv.proj_t), {B, T, D});
    sv.x_mid = b.Add(x, proj);
    std::vector<ValueRef> ln2 = b.LayerNorm(sv.x_mid, P(q.ln2w), P(q.ln2b));
    sv.ln2_mean = ln2[1];
    sv.ln2_rstd = ln2[2];
    sv.ln2_out_2d = b.View(ln2[0], {BT, D});
    sv.fc1_t = b.T(P(q.fc1w));
    sv.fc1_out = b.View(b.Addmm(P(q.fc1b), sv.ln2_out_2d, sv.fc1_t), {B, T, F});
    const ValueRef gelu = b.Call("gelu", "aten::gelu", "", {sv.fc1_out}, {Contiguous({B, T, F})});
    sv.gelu_2d = b.View(gelu, {BT, F});
    sv.fc2_t = b.T(P(q.fc2w));
    const ValueRef fc2 = b.View(b.Addmm(P(q.fc2b), sv.gelu_2d, sv.fc2_t), {B, T, D});
    x = sv.x_out = b.Add(sv.x_mid, fc2);
  }

  std::vector<ValueRef> lnf = b.LayerNorm(x, P(lnfw), P(lnfb));
  const ValueRef lnf_2d = b.View(lnf[0], {BT, D});
  const ValueRef head_t = b.T(P(headw));
  const ValueRef logits = b.View(b.Addmm(P(headb), lnf_2d, head_t), {B, T, V});
  const ValueRef logits_2d = b.View(logits, {-1, V});
  const ValueRef target_1d = b.View(target, {-1});
  const ValueRef logp = b.Call("_log_softmax", "aten::_log_softmax", "",
                               {logits_2d, int64_t{1}, false}, {Contiguous({BT, V})});
  const ValueRef nll = b.Call("nll_loss_forward", "aten::nll_loss_forward", "",
                              {logp, target_1d, ir::NoneArg{}, int64_t{1}, int64_t{-100}},
                              {Contiguous({}), Contiguous({})});
  const std::vector<ValueRef> nll_out = b.GetItems(nll, 2);
  const ValueRef loss = nll_out[0];

  // ---- backward
  const ValueRef ones_like =
      b.Call("ones_like", "aten::ones_like", "", {loss}, {Contiguous({})},
             {{"pin_memory", false}, {"memory_format", ir::MemoryFormat::kPreserve}});
  const ValueRef nll_b =
      b.Call("nll_loss_backward", "aten::nll_loss_backward", "",
             {ones_like, logp, target_1d, ir::NoneArg{}, int64_t{1}, int64_t{-100}, nll_out[1]},
             {Contiguous({BT, V})});
  const ValueRef logp_b =
      b.Call("_log_softmax_backward_data", "aten::_log_softmax_backward_data", "",
             {nll_b, logp, int64_t{1}, DType::kFloat32}, {Contiguous({BT, V})});

  // Linear backward as autograd emits it for addmm(bias, in_2d, w_t):
  // grad_in = mm(g, t(w_t)); grad_w = t(t(mm(t(g), in_2d))); grad_b = view(sum(g, [0], true)).
  auto linear_backward = [&](ValueRef g2d, ValueRef in_2d, ValueRef w_t, size_t w,
                             std::optional<size_t> bias) {
    const ValueRef grad_in = b.Mm(g2d, b.T(w_t));
    const ValueRef gw_t = b.T(b.Mm(b.T(g2d), in_2d));
    if (bias) {
      const ValueRef gb = b.View(b.SumDim0(g2d), {b.type(g2d).shape[1]});
      b.MarkGrad(gb, params[*bias].state);
      params[*bias].grad = gb;
    }
    const ValueRef gw = b.T(gw_t);
    b.MarkGrad(gw, params[w].state);
    params[w].grad = gw;
    return grad_in;
  };
  auto mark_ln_grads = [&](const std::vector<ValueRef>& lnb, size_t w, size_t bias) {
    b.MarkGrad(lnb[1], params[w].state);
    b.MarkGrad(lnb[2], params[bias].state);
    params[w].grad = lnb[1];
    params[bias].grad = lnb[2];
  };

  const ValueRef g_logits = b.View(b.View(logp_b, {B, T, V}), {BT, V});
  const ValueRef g_lnf = b.View(linear_backward(g_logits, lnf_2d, head_t, headw, headb), {B, T, D});
  std::vector<ValueRef> lnf_b = b.LayerNormBackward(g_lnf, x, lnf[1], lnf[2], P(lnfw), P(lnfb));
  mark_ln_grads(lnf_b, lnfw, lnfb);
  ValueRef dx = lnf_b[0];

  for (int32_t i = layers - 1; i >= 0; --i) {
    const BlockSaved& sv = saved[i];
    const BlockParams& q = bp[i];
    // MLP.
    const ValueRef g_fc2 = b.View(dx, {BT, D});
    const ValueRef g_gelu =
        b.View(linear_backward(g_fc2, sv.gelu_2d, sv.fc2_t, q.fc2w, q.fc2b), {B, T, F});
    const ValueRef g_fc1_out = b.Call("gelu_backward", "aten::gelu_backward", "",
                                      {g_gelu, sv.fc1_out}, {Contiguous({B, T, F})});
    const ValueRef g_fc1 = b.View(g_fc1_out, {BT, F});
    const ValueRef g_ln2 =
        b.View(linear_backward(g_fc1, sv.ln2_out_2d, sv.fc1_t, q.fc1w, q.fc1b), {B, T, D});
    std::vector<ValueRef> ln2_b =
        b.LayerNormBackward(g_ln2, sv.x_mid, sv.ln2_mean, sv.ln2_rstd, P(q.ln2w), P(q.ln2b));
    mark_ln_grads(ln2_b, q.ln2w, q.ln2b);
    const ValueRef g_mid = b.Add(dx, ln2_b[0]);
    // Attention output projection.
    const ValueRef g_proj = b.View(g_mid, {BT, D});
    const ValueRef g_y =
        b.View(linear_backward(g_proj, sv.attn_2d, sv.proj_t, q.projw, q.projb), {B, T, D});
    const ValueRef g_y4 = b.Transpose(b.View(g_y, {B, T, H, Dh}), 1, 2);
    const ValueRef g_y3 = b.UnsafeView(b.Clone(g_y4), {BH, T, Dh});
    const ValueRef g_v3 = b.Bmm(b.Transpose(sv.att_3d, 1, 2), g_y3);
    const ValueRef g_att3 = b.Bmm(g_y3, b.Transpose(sv.v_3d, 1, 2));
    const ValueRef g_v = b.View(g_v3, {B, H, T, Dh});
    const ValueRef g_att = b.View(g_att3, {B, H, T, T});
    const ValueRef g_sm =
        b.Call("_softmax_backward_data", "aten::_softmax_backward_data", "",
               {g_att, sv.softmax, int64_t{-1}, DType::kFloat32}, {Contiguous({B, H, T, T})});
    const ValueRef g_masked = b.Call("masked_fill", "aten::masked_fill", "Scalar",
                                     {g_sm, sv.mask, int64_t{0}}, {Contiguous({B, H, T, T})});
    const ValueRef g_scores = b.View(b.MulScalar(g_masked, scale), {BH, T, T});
    const ValueRef g_k3 = b.Bmm(b.Transpose(sv.q_3d, 1, 2), g_scores);
    const ValueRef g_q3 = b.Bmm(g_scores, b.Transpose(sv.k_3d, 1, 2));
    const ValueRef g_kt = b.View(g_k3, {B, H, Dh, T});
    const ValueRef g_q = b.View(g_q3, {B, H, T, Dh});
    const ValueRef g_k = b.Transpose(g_kt, -2, -1);
    const Shape qkv5 = {3, B, H, T, Dh};
    auto select_backward = [&](ValueRef g, int64_t k) {
      return b.Call("select_backward", "aten::select_backward", "",
                    {g, IntList(qkv5), int64_t{0}, k}, {Contiguous(qkv5)});
    };
    const ValueRef sb_v = select_backward(g_v, 2);
    const ValueRef sb_k = select_backward(g_k, 1);
    const ValueRef acc = b.Add(sb_v, sb_k);
    const ValueRef sb_q = select_backward(g_q, 0);
    const ValueRef g_perm = b.Add(acc, sb_q);
    const ValueRef g_qkv3 =
        b.UnsafeView(b.Clone(b.Permute(g_perm, {1, 3, 0, 2, 4})), {B, T, 3 * D});
    const ValueRef g_qkv = b.View(g_qkv3, {BT, 3 * D});
    // qkv has no bias; autograd orders this backward's nodes weight-first.
    const ValueRef gw_t = b.T(b.Mm(b.T(g_qkv), sv.ln1_out_2d));
    const ValueRef g_ln1 = b.View(b.Mm(g_qkv, b.T(sv.qkv_t)), {B, T, D});
    const ValueRef gw = b.T(gw_t);
    b.MarkGrad(gw, params[q.qkv].state);
    params[q.qkv].grad = gw;
    std::vector<ValueRef> ln1_b =
        b.LayerNormBackward(g_ln1, sv.x_in, sv.ln1_mean, sv.ln1_rstd, P(q.ln1w), P(q.ln1b));
    mark_ln_grads(ln1_b, q.ln1w, q.ln1b);
    dx = b.Add(g_mid, ln1_b[0]);
  }

  // Embeddings.
  const ValueRef g_pos_rows = b.View(b.SumDim0(dx), {T, D});
  const ValueRef g_pos =
      b.Call("embedding_dense_backward", "aten::embedding_dense_backward", "",
             {g_pos_rows, arange, s.max_seq, int64_t{-1}, false}, {Contiguous({s.max_seq, D})});
  b.MarkGrad(g_pos, params[pos].state);
  params[pos].grad = g_pos;
  const ValueRef g_tok = b.Call("embedding_dense_backward", "aten::embedding_dense_backward", "",
                                {dx, tokens, V, int64_t{-1}, false}, {Contiguous({V, D})});
  b.MarkGrad(g_tok, params[tok].state);
  params[tok].grad = g_tok;

  // ---- SGD with momentum (dampening 0, no nesterov), single-tensor:
  // buf = buf * momentum + grad; param = param + buf * -lr.
  std::vector<ValueRef> new_params, new_bufs;
  for (Param& p : params) {
    const ValueRef buf = b.Add(b.MulScalar(p.buffer, kMomentum), p.grad);
    new_bufs.push_back(buf);
    new_params.push_back(b.Add(p.value, buf, {{"alpha", -kLr}}));
  }
  std::vector<ValueRef> returned;
  std::vector<ir::OutputSpec> specs;
  for (size_t k = 0; k < params.size(); ++k) {
    returned.push_back(new_params[k]);
    specs.push_back({ir::OutputRole::kUpdatedParameter, params[k].state});
  }
  for (size_t k = 0; k < params.size(); ++k) {
    returned.push_back(new_bufs[k]);
    specs.push_back({ir::OutputRole::kUpdatedOptimizerState,
                     absl::StrCat("optim.", params[k].state, ".momentum_buffer")});
  }
  returned.push_back(loss);
  specs.push_back({ir::OutputRole::kLoss, ""});
  b.Output(std::move(returned), std::move(specs));

  ir::GraphHeader header;
  header.producer = "fxdp-bench synthetic_graph";
  header.torch_version = "2.13.0+cpu";
  header.metadata = {
      {"model", absl::StrCat("TransformerLM(layers=", layers, ", d_model=", D, ", heads=", H,
                             ", ff=", F, ", vocab=", V, ")")},
      {"optimizer", "SGD"},
      {"optimizer.foreach", "false"},
      {"loss_reduction", "mean"},
      {"batch_size", absl::StrCat(B)},
      {"decompositions", "fxdp-default-v1:native_batch_norm"},
      {"device", "cpu"},
  };
  return ir::Graph::Create(std::move(header), b.Finish());
}

absl::StatusOr<ir::Graph> BuildSyntheticGraph(int64_t target_nodes, const TransformerShape& shape) {
  return BuildTransformerStep(shape, LayersForNodeCount(target_nodes));
}

absl::StatusOr<std::string> BuildSyntheticGraphBytes(int64_t target_nodes,
                                                     const TransformerShape& shape) {
  FXDP_ASSIGN_OR_RETURN(ir::Graph g, BuildSyntheticGraph(target_nodes, shape));
  return ir::EncodeGraphBytes(g);
}

}  // namespace fxdp::bench
