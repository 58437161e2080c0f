#include "bench/synthetic_graph.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "analysis/ir/proto_codec.h"
#include "bench/graph_builder.h"
#include "util/status_macros.h"

namespace fxdp::bench {
namespace {

using internal::Builder;
using internal::Contiguous;
using internal::IntList;
using internal::Shape;
using ir::Argument;
using ir::DType;
using ir::TensorType;
using ir::ValueRef;

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

// Parameter indices of one block, into TransformerStepBuilder::params_.
struct BlockParams {
  size_t ln1w, ln1b, qkv, projw, projb, ln2w, ln2b, fc1w, fc1b, fc2w, fc2b;
};

// BuildTransformerStep's parts, in the order their nodes are appended
// (names count up in that order, so it is the order the frontend traces).
class TransformerStepBuilder {
 public:
  TransformerStepBuilder(const TransformerShape& s, int32_t layers)
      : s_(s),
        layers_(layers),
        B(s.batch),
        T(s.seq),
        D(s.d_model),
        H(s.heads),
        Dh(D / H),
        F(s.ff),
        V(s.vocab),
        BT(B * T),
        BH(B * H),
        scale_(1.0 / std::sqrt(static_cast<double>(Dh))) {}

  absl::StatusOr<ir::Graph> Build() {
    b_.Reserve(static_cast<size_t>(TransformerStepNodeCount(layers_)));
    DeclareParams();
    AddPlaceholders();
    ValueRef x = Embeddings();
    saved_.resize(layers_);
    for (int32_t i = 0; i < layers_; ++i) x = ForwardBlock(i, x);
    ValueRef dx = HeadAndLoss(x);
    for (int32_t i = layers_ - 1; i >= 0; --i) dx = BackwardBlock(i, dx);
    EmbeddingsBackward(dx);
    SgdAndOutput();
    return ir::Graph::Create(Header(), b_.Finish());
  }

 private:
  static constexpr double kMomentum = 0.9, kLr = 0.05;

  size_t AddParam(std::string state, Shape shape) {
    params_.push_back({std::move(state), {}, {}, {}});
    shapes_.push_back(std::move(shape));
    return params_.size() - 1;
  }
  ValueRef P(size_t k) const { return params_[k].value; }
  void SetGrad(ValueRef g, size_t k) {
    b_.MarkGrad(g, params_[k].state);
    params_[k].grad = g;
  }

  // Parameters in module order.
  void DeclareParams() {
    tok_ = AddParam("tok.weight", {V, D});
    pos_ = AddParam("pos.weight", {s_.max_seq, D});
    bp_.resize(layers_);
    for (int32_t i = 0; i < layers_; ++i) {
      const std::string p = absl::StrCat("blocks.", i, ".");
      bp_[i] = {AddParam(p + "ln1.weight", {D}),
                AddParam(p + "ln1.bias", {D}),
                AddParam(p + "attn.qkv.weight", {3 * D, D}),
                AddParam(p + "attn.proj.weight", {D, D}),
                AddParam(p + "attn.proj.bias", {D}),
                AddParam(p + "ln2.weight", {D}),
                AddParam(p + "ln2.bias", {D}),
                AddParam(p + "fc1.weight", {F, D}),
                AddParam(p + "fc1.bias", {F}),
                AddParam(p + "fc2.weight", {D, F}),
                AddParam(p + "fc2.bias", {D})};
    }
    lnfw_ = AddParam("ln_f.weight", {D});
    lnfb_ = AddParam("ln_f.bias", {D});
    headw_ = AddParam("head.weight", {V, D});
    headb_ = AddParam("head.bias", {V});
  }

  // The parameters, then their momentum buffers, then the inputs.
  void AddPlaceholders() {
    for (size_t k = 0; k < params_.size(); ++k) {
      TensorType t = Contiguous(shapes_[k]);
      t.requires_grad = true;
      params_[k].value = b_.Placeholder(PlaceholderName("p_", params_[k].state), std::move(t),
                                        ir::PlaceholderRole::kParameter, params_[k].state);
    }
    for (size_t k = 0; k < params_.size(); ++k) {
      const std::string state = absl::StrCat("optim.", params_[k].state, ".momentum_buffer");
      params_[k].buffer = b_.Placeholder(PlaceholderName("s_", state), Contiguous(shapes_[k]),
                                         ir::PlaceholderRole::kOptimizerState, state);
    }
    tokens_ = b_.Placeholder("x_tokens", Contiguous({B, T}, DType::kInt64),
                             ir::PlaceholderRole::kInput, "tokens", 0);
    target_ = b_.Placeholder("x_target", Contiguous({B, T}, DType::kInt64),
                             ir::PlaceholderRole::kInput, "target", 0);
  }

  ValueRef Embeddings() {
    arange_ = b_.Call("arange", "aten::arange", "", {T}, {Contiguous({T}, DType::kInt64)},
                      {{"device", cpu_}, {"pin_memory", false}});
    const ValueRef emb =
        b_.Call("embedding", "aten::embedding", "", {P(tok_), tokens_}, {Contiguous({B, T, D})});
    const ValueRef emb_pos =
        b_.Call("embedding", "aten::embedding", "", {P(pos_), arange_}, {Contiguous({T, D})});
    return b_.Add(emb, emb_pos);
  }

  // Causal self-attention on the block's first layer norm; its output projection's input.
  ValueRef Attention(BlockSaved& sv, const BlockParams& q, ValueRef x) {
    std::vector<ValueRef> ln1 = b_.LayerNorm(x, P(q.ln1w), P(q.ln1b));
    sv.ln1_mean = ln1[1];
    sv.ln1_rstd = ln1[2];
    sv.qkv_t = b_.T(P(q.qkv));
    sv.ln1_out_2d = b_.View(ln1[0], {BT, D});
    const ValueRef qkv = b_.UnsafeView(b_.Mm(sv.ln1_out_2d, sv.qkv_t), {B, T, 3 * D});
    const ValueRef perm = b_.Permute(b_.View(qkv, {B, T, 3, H, Dh}), {2, 0, 3, 1, 4});
    const ValueRef sel_q = b_.Select(perm, 0, 0);
    const ValueRef sel_k = b_.Select(perm, 0, 1);
    const ValueRef sel_v = b_.Select(perm, 0, 2);
    const ValueRef kt = b_.Transpose(sel_k, -2, -1);
    sv.q_3d = b_.UnsafeView(b_.Clone(b_.Expand(sel_q, {B, H, T, Dh})), {BH, T, Dh});
    sv.k_3d = b_.UnsafeView(b_.Clone(b_.Expand(kt, {B, H, Dh, T})), {BH, Dh, T});
    const ValueRef scores = b_.UnsafeView(b_.Bmm(sv.q_3d, sv.k_3d), {B, H, T, T});
    const ValueRef scaled = b_.MulScalar(scores, scale_);
    const ValueRef ones =
        b_.Call("ones", "aten::ones", "", {IntList({T, T})}, {Contiguous({T, T}, DType::kBool)},
                {{"dtype", DType::kBool}, {"device", cpu_}, {"pin_memory", false}});
    sv.mask =
        b_.Call("triu", "aten::triu", "", {ones, int64_t{1}}, {Contiguous({T, T}, DType::kBool)});
    const ValueRef masked = b_.Call("masked_fill", "aten::masked_fill", "Scalar",
                                    {scaled, sv.mask, -std::numeric_limits<double>::infinity()},
                                    {Contiguous({B, H, T, T})});
    sv.softmax = b_.Call("_softmax", "aten::_softmax", "", {masked, int64_t{-1}, false},
                         {Contiguous({B, H, T, T})});
    sv.att_3d = b_.View(b_.Expand(sv.softmax, {B, H, T, T}), {BH, T, T});
    sv.v_3d = b_.UnsafeView(b_.Clone(b_.Expand(sel_v, {B, H, T, Dh})), {BH, T, Dh});
    const ValueRef y = b_.UnsafeView(b_.Bmm(sv.att_3d, sv.v_3d), {B, H, T, Dh});
    const ValueRef y_t = b_.UnsafeView(b_.Clone(b_.Transpose(y, 1, 2)), {B, T, D});
    return b_.View(y_t, {BT, D});
  }

  ValueRef ForwardBlock(int32_t i, ValueRef x) {
    BlockSaved& sv = saved_[i];
    const BlockParams& q = bp_[i];
    sv.x_in = x;
    sv.attn_2d = Attention(sv, q, x);
    sv.proj_t = b_.T(P(q.projw));
    const ValueRef proj = b_.View(b_.Addmm(P(q.projb), sv.attn_2d, sv.proj_t), {B, T, D});
    sv.x_mid = b_.Add(x, proj);
    std::vector<ValueRef> ln2 = b_.LayerNorm(sv.x_mid, P(q.ln2w), P(q.ln2b));
    sv.ln2_mean = ln2[1];
    sv.ln2_rstd = ln2[2];
    sv.ln2_out_2d = b_.View(ln2[0], {BT, D});
    sv.fc1_t = b_.T(P(q.fc1w));
    sv.fc1_out = b_.View(b_.Addmm(P(q.fc1b), sv.ln2_out_2d, sv.fc1_t), {B, T, F});
    const ValueRef gelu = b_.Call("gelu", "aten::gelu", "", {sv.fc1_out}, {Contiguous({B, T, F})});
    sv.gelu_2d = b_.View(gelu, {BT, F});
    sv.fc2_t = b_.T(P(q.fc2w));
    const ValueRef fc2 = b_.View(b_.Addmm(P(q.fc2b), sv.gelu_2d, sv.fc2_t), {B, T, D});
    return sv.x_out = b_.Add(sv.x_mid, fc2);
  }

  // The final norm, head and loss, then their backward: the gradient of the
  // last block's output.
  ValueRef HeadAndLoss(ValueRef x) {
    std::vector<ValueRef> lnf = b_.LayerNorm(x, P(lnfw_), P(lnfb_));
    const ValueRef lnf_2d = b_.View(lnf[0], {BT, D});
    const ValueRef head_t = b_.T(P(headw_));
    const ValueRef logits = b_.View(b_.Addmm(P(headb_), lnf_2d, head_t), {B, T, V});
    const ValueRef logits_2d = b_.View(logits, {-1, V});
    const ValueRef target_1d = b_.View(target_, {-1});
    const ValueRef logp = b_.Call("_log_softmax", "aten::_log_softmax", "",
                                  {logits_2d, int64_t{1}, false}, {Contiguous({BT, V})});
    const ValueRef nll = b_.Call("nll_loss_forward", "aten::nll_loss_forward", "",
                                 {logp, target_1d, ir::NoneArg{}, int64_t{1}, int64_t{-100}},
                                 {Contiguous({}), Contiguous({})});
    const std::vector<ValueRef> nll_out = b_.GetItems(nll, 2);
    loss_ = nll_out[0];

    const ValueRef ones_like =
        b_.Call("ones_like", "aten::ones_like", "", {loss_}, {Contiguous({})},
                {{"pin_memory", false}, {"memory_format", ir::MemoryFormat::kPreserve}});
    const ValueRef nll_b =
        b_.Call("nll_loss_backward", "aten::nll_loss_backward", "",
                {ones_like, logp, target_1d, ir::NoneArg{}, int64_t{1}, int64_t{-100}, nll_out[1]},
                {Contiguous({BT, V})});
    const ValueRef logp_b =
        b_.Call("_log_softmax_backward_data", "aten::_log_softmax_backward_data", "",
                {nll_b, logp, int64_t{1}, DType::kFloat32}, {Contiguous({BT, V})});
    const ValueRef g_logits = b_.View(b_.View(logp_b, {B, T, V}), {BT, V});
    const ValueRef g_lnf =
        b_.View(LinearBackward(g_logits, lnf_2d, head_t, headw_, headb_), {B, T, D});
    std::vector<ValueRef> lnf_b =
        b_.LayerNormBackward(g_lnf, x, lnf[1], lnf[2], P(lnfw_), P(lnfb_));
    SetLayerNormGrads(lnf_b, lnfw_, lnfb_);
    return lnf_b[0];
  }

  // Linear backward as autograd emits it for addmm(bias, in_2d, w_t):
  // grad_in = mm(g, t(w_t)); grad_w = t(t(mm(t(g), in_2d))); grad_b = view(sum(g, [0], true)).
  ValueRef LinearBackward(ValueRef g2d, ValueRef in_2d, ValueRef w_t, size_t w, size_t bias) {
    const ValueRef grad_in = b_.Mm(g2d, b_.T(w_t));
    const ValueRef gw_t = b_.T(b_.Mm(b_.T(g2d), in_2d));
    SetGrad(b_.View(b_.SumDim0(g2d), {b_.type(g2d).shape[1]}), bias);
    SetGrad(b_.T(gw_t), w);
    return grad_in;
  }
  void SetLayerNormGrads(const std::vector<ValueRef>& lnb, size_t w, size_t bias) {
    SetGrad(lnb[1], w);
    SetGrad(lnb[2], bias);
  }

  // The attention's backward from the gradient of its output (before the
  // projection), to the gradient of the block's first layer norm's output.
  ValueRef AttentionBackward(const BlockSaved& sv, const BlockParams& q, ValueRef g_y) {
    const ValueRef g_y4 = b_.Transpose(b_.View(g_y, {B, T, H, Dh}), 1, 2);
    const ValueRef g_y3 = b_.UnsafeView(b_.Clone(g_y4), {BH, T, Dh});
    const ValueRef g_v3 = b_.Bmm(b_.Transpose(sv.att_3d, 1, 2), g_y3);
    const ValueRef g_att3 = b_.Bmm(g_y3, b_.Transpose(sv.v_3d, 1, 2));
    const ValueRef g_v = b_.View(g_v3, {B, H, T, Dh});
    const ValueRef g_att = b_.View(g_att3, {B, H, T, T});
    const ValueRef g_sm =
        b_.Call("_softmax_backward_data", "aten::_softmax_backward_data", "",
                {g_att, sv.softmax, int64_t{-1}, DType::kFloat32}, {Contiguous({B, H, T, T})});
    const ValueRef g_masked = b_.Call("masked_fill", "aten::masked_fill", "Scalar",
                                      {g_sm, sv.mask, int64_t{0}}, {Contiguous({B, H, T, T})});
    const ValueRef g_scores = b_.View(b_.MulScalar(g_masked, scale_), {BH, T, T});
    const ValueRef g_k3 = b_.Bmm(b_.Transpose(sv.q_3d, 1, 2), g_scores);
    const ValueRef g_q3 = b_.Bmm(g_scores, b_.Transpose(sv.k_3d, 1, 2));
    const ValueRef g_kt = b_.View(g_k3, {B, H, Dh, T});
    const ValueRef g_q = b_.View(g_q3, {B, H, T, Dh});
    const ValueRef g_k = b_.Transpose(g_kt, -2, -1);
    const Shape qkv5 = {3, B, H, T, Dh};
    auto select_backward = [&](ValueRef g, int64_t k) {
      return b_.Call("select_backward", "aten::select_backward", "",
                     {g, IntList(qkv5), int64_t{0}, k}, {Contiguous(qkv5)});
    };
    const ValueRef sb_v = select_backward(g_v, 2);
    const ValueRef sb_k = select_backward(g_k, 1);
    const ValueRef acc = b_.Add(sb_v, sb_k);
    const ValueRef sb_q = select_backward(g_q, 0);
    const ValueRef g_perm = b_.Add(acc, sb_q);
    const ValueRef g_qkv3 =
        b_.UnsafeView(b_.Clone(b_.Permute(g_perm, {1, 3, 0, 2, 4})), {B, T, 3 * D});
    const ValueRef g_qkv = b_.View(g_qkv3, {BT, 3 * D});
    // qkv has no bias; autograd orders this backward's nodes weight-first.
    const ValueRef gw_t = b_.T(b_.Mm(b_.T(g_qkv), sv.ln1_out_2d));
    const ValueRef g_ln1 = b_.View(b_.Mm(g_qkv, b_.T(sv.qkv_t)), {B, T, D});
    SetGrad(b_.T(gw_t), q.qkv);
    return g_ln1;
  }

  // Block i's backward from the gradient of its output: its input's.
  ValueRef BackwardBlock(int32_t i, ValueRef dx) {
    const BlockSaved& sv = saved_[i];
    const BlockParams& q = bp_[i];
    // MLP.
    const ValueRef g_fc2 = b_.View(dx, {BT, D});
    const ValueRef g_gelu =
        b_.View(LinearBackward(g_fc2, sv.gelu_2d, sv.fc2_t, q.fc2w, q.fc2b), {B, T, F});
    const ValueRef g_fc1_out = b_.Call("gelu_backward", "aten::gelu_backward", "",
                                       {g_gelu, sv.fc1_out}, {Contiguous({B, T, F})});
    const ValueRef g_fc1 = b_.View(g_fc1_out, {BT, F});
    const ValueRef g_ln2 =
        b_.View(LinearBackward(g_fc1, sv.ln2_out_2d, sv.fc1_t, q.fc1w, q.fc1b), {B, T, D});
    std::vector<ValueRef> ln2_b =
        b_.LayerNormBackward(g_ln2, sv.x_mid, sv.ln2_mean, sv.ln2_rstd, P(q.ln2w), P(q.ln2b));
    SetLayerNormGrads(ln2_b, q.ln2w, q.ln2b);
    const ValueRef g_mid = b_.Add(dx, ln2_b[0]);
    // Attention output projection, then the attention.
    const ValueRef g_proj = b_.View(g_mid, {BT, D});
    const ValueRef g_y =
        b_.View(LinearBackward(g_proj, sv.attn_2d, sv.proj_t, q.projw, q.projb), {B, T, D});
    const ValueRef g_ln1 = AttentionBackward(sv, q, g_y);
    std::vector<ValueRef> ln1_b =
        b_.LayerNormBackward(g_ln1, sv.x_in, sv.ln1_mean, sv.ln1_rstd, P(q.ln1w), P(q.ln1b));
    SetLayerNormGrads(ln1_b, q.ln1w, q.ln1b);
    return b_.Add(g_mid, ln1_b[0]);
  }

  void EmbeddingsBackward(ValueRef dx) {
    const ValueRef g_pos_rows = b_.View(b_.SumDim0(dx), {T, D});
    SetGrad(b_.Call("embedding_dense_backward", "aten::embedding_dense_backward", "",
                    {g_pos_rows, arange_, s_.max_seq, int64_t{-1}, false},
                    {Contiguous({s_.max_seq, D})}),
            pos_);
    SetGrad(b_.Call("embedding_dense_backward", "aten::embedding_dense_backward", "",
                    {dx, tokens_, V, int64_t{-1}, false}, {Contiguous({V, D})}),
            tok_);
  }

  // SGD with momentum (dampening 0, no nesterov), single-tensor:
  // buf = buf * momentum + grad; param = param + buf * -lr. Then the output:
  // the parameters, the buffers, the loss.
  void SgdAndOutput() {
    std::vector<ValueRef> new_params, new_bufs;
    for (Param& p : params_) {
      const ValueRef buf = b_.Add(b_.MulScalar(p.buffer, kMomentum), p.grad);
      new_bufs.push_back(buf);
      new_params.push_back(b_.Add(p.value, buf, {{"alpha", -kLr}}));
    }
    std::vector<ValueRef> returned;
    std::vector<ir::OutputSpec> specs;
    for (size_t k = 0; k < params_.size(); ++k) {
      returned.push_back(new_params[k]);
      specs.push_back({ir::OutputRole::kUpdatedParameter, params_[k].state});
    }
    for (size_t k = 0; k < params_.size(); ++k) {
      returned.push_back(new_bufs[k]);
      specs.push_back({ir::OutputRole::kUpdatedOptimizerState,
                       absl::StrCat("optim.", params_[k].state, ".momentum_buffer")});
    }
    returned.push_back(loss_);
    specs.push_back({ir::OutputRole::kLoss, ""});
    b_.Output(std::move(returned), std::move(specs));
  }

  ir::GraphHeader Header() const {
    ir::GraphHeader header;
    header.producer = "fxdp-bench synthetic_graph";
    header.torch_version = "2.13.0+cpu";
    header.metadata = {
        {"model", absl::StrCat("TransformerLM(layers=", layers_, ", d_model=", D, ", heads=", H,
                               ", ff=", F, ", vocab=", V, ")")},
        {"optimizer", "SGD"},
        {"optimizer.foreach", "false"},
        {"loss_reduction", "mean"},
        {"batch_size", absl::StrCat(B)},
        {"decompositions", "fxdp-default-v1:native_batch_norm"},
        {"device", "cpu"},
    };
    return header;
  }

  const TransformerShape s_;
  const int32_t layers_;
  const int64_t B, T, D, H, Dh, F, V, BT, BH;  // batch, seq, d_model, heads, head dim, ff, vocab
  const double scale_;
  const Argument cpu_ = ir::Device{};
  Builder b_;
  std::vector<Param> params_;
  std::vector<Shape> shapes_;
  size_t tok_ = 0, pos_ = 0, lnfw_ = 0, lnfb_ = 0, headw_ = 0, headb_ = 0;
  std::vector<BlockParams> bp_;
  std::vector<BlockSaved> saved_;
  ValueRef tokens_, target_, arange_, loss_;
};

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
  return TransformerStepBuilder(s, layers).Build();
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
