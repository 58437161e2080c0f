#include "analysis/op_rules.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace fxdp {
namespace {

using F = OpFamily;
using L = Linearity;

// One line per op, sorted by (name, overload). Columns: schema name,
// overload ("*": any), family, linearity, linear args (bit i = positional
// arg i), then the family's parameters a, b, c (see OpFamily) and, for
// matmuls, the einsum-like spec ("+" marks a leading broadcast bias operand).
// Keep it sorted: tests/analysis/op_rules_test.cc checks.
constexpr OpRule kOpRules[] = {
    {"aten::_adaptive_avg_pool2d", "*", F::kSpatial, L::kNone, 0b000, -1, -1, -1},
    {"aten::_adaptive_avg_pool2d_backward", "*", F::kSpatial, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::_adaptive_avg_pool3d", "*", F::kSpatial, L::kNone, 0b000, -1, -1, -1},
    {"aten::_adaptive_avg_pool3d_backward", "*", F::kSpatial, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::_convolution", "*", F::kSpatial, L::kNone, 0b000, -1, 1, -1},
    {"aten::_foreach_*", "*", F::kForeach, L::kNone, 0b000, -1, -1, -1},
    {"aten::_local_scalar_dense", "*", F::kNoTensor, L::kNone, 0b000, -1, -1, -1},
    {"aten::_log_softmax", "*", F::kAlongDim, L::kNone, 0b000, 1, -1, -1},
    {"aten::_log_softmax_backward_data", "*", F::kAlongDim, L::kMultilinear, 0b001, 2, -1, -1},
    {"aten::_masked_scale", "*", F::kPointwise, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::_native_batch_norm_legit", "", F::kBatchNorm, L::kNone, 0b000, 5, -1, -1},
    {"aten::_native_batch_norm_legit", "no_stats", F::kBatchNorm, L::kNone, 0b000, 3, -1, -1},
    {"aten::_native_batch_norm_legit_functional", "*", F::kBatchNorm, L::kNone, 0b000, 5, -1, -1},
    {"aten::_native_batch_norm_legit_no_training", "*", F::kBatchNorm, L::kNone, 0b000, -2, -1, -1},
    {"aten::_safe_softmax", "*", F::kAlongDim, L::kNone, 0b000, 1, -1, -1},
    {"aten::_scaled_dot_product_attention_math", "*", F::kSpatial, L::kNone, 0b000, -1, -1, -1},
    {"aten::_scaled_dot_product_cudnn_attention", "*", F::kSpatial, L::kNone, 0b000, -1, -1, -1},
    {"aten::_scaled_dot_product_cudnn_attention_backward", "*", F::kSpatial, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::_scaled_dot_product_efficient_attention", "*", F::kSpatial, L::kNone, 0b000, -1, -1, -1},
    {"aten::_scaled_dot_product_efficient_attention_backward", "*", F::kSpatial, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::_scaled_dot_product_flash_attention", "*", F::kSpatial, L::kNone, 0b000, -1, -1, -1},
    {"aten::_scaled_dot_product_flash_attention_backward", "*", F::kSpatial, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::_scaled_dot_product_flash_attention_for_cpu", "*", F::kSpatial, L::kNone, 0b000, -1, -1, -1},
    {"aten::_scaled_dot_product_flash_attention_for_cpu_backward", "*", F::kSpatial, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::_softmax", "*", F::kAlongDim, L::kNone, 0b000, 1, -1, -1},
    {"aten::_softmax_backward_data", "*", F::kAlongDim, L::kMultilinear, 0b001, 2, -1, -1},
    {"aten::_to_copy", "*", F::kPointwise, L::kAdditive, 0b001, -1, -1, -1},
    {"aten::_unsafe_index", "Tensor", F::kIndex, L::kAdditive, 0b001, -1, -1, -1},
    {"aten::abs", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::acos", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::adaptive_avg_pool1d", "*", F::kSpatial, L::kNone, 0b000, -1, -1, -1},
    {"aten::adaptive_max_pool1d", "*", F::kSpatial, L::kNone, 0b000, -1, -1, -1},
    {"aten::adaptive_max_pool2d", "*", F::kSpatial, L::kNone, 0b000, -1, -1, -1},
    {"aten::adaptive_max_pool2d_backward", "*", F::kSpatial, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::add", "Scalar", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::add", "Tensor", F::kPointwise, L::kAdditive, 0b011, -1, -1, -1},
    {"aten::addcdiv", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::addcmul", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::addmm", "*", F::kMatmul, L::kNone, 0b000, -1, -1, -1, "+ij,ik,kj->ij"},
    {"aten::addmv", "*", F::kMatmul, L::kNone, 0b000, -1, -1, -1, "+i,ik,k->i"},
    {"aten::alias", "*", F::kPointwise, L::kAdditive, 0b001, -1, -1, -1},
    {"aten::all", "", F::kReduce, L::kNone, 0b000, -1, -1, 2},
    {"aten::all", "dim", F::kReduce, L::kNone, 0b000, 1, 2, 2},
    {"aten::amax", "*", F::kReduce, L::kNone, 0b000, 1, 2, 2},
    {"aten::amin", "*", F::kReduce, L::kNone, 0b000, 1, 2, 2},
    {"aten::any", "", F::kReduce, L::kNone, 0b000, -1, -1, 2},
    {"aten::any", "dim", F::kReduce, L::kNone, 0b000, 1, 2, 2},
    {"aten::arange", "*", F::kFactory, L::kNone, 0b000, -1, -1, -1},
    {"aten::argmax", "*", F::kReduce, L::kNone, 0b000, 1, 2, 2},
    {"aten::argmin", "*", F::kReduce, L::kNone, 0b000, 1, 2, 2},
    {"aten::as_strided", "", F::kAsStrided, L::kAdditive, 0b001, -1, -1, -1},
    {"aten::as_strided_scatter", "", F::kAsStridedScatter, L::kAdditive, 0b011, -1, -1, -1},
    {"aten::asin", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::atan", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::atan2", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::avg_pool1d", "*", F::kSpatial, L::kNone, 0b000, -1, -1, -1},
    {"aten::avg_pool2d", "*", F::kSpatial, L::kNone, 0b000, -1, -1, -1},
    {"aten::avg_pool2d_backward", "*", F::kSpatial, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::avg_pool3d", "*", F::kSpatial, L::kNone, 0b000, -1, -1, -1},
    {"aten::avg_pool3d_backward", "*", F::kSpatial, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::baddbmm", "*", F::kMatmul, L::kNone, 0b000, -1, -1, -1, "+bij,bik,bkj->bij"},
    {"aten::bernoulli", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::binary_cross_entropy", "*", F::kLoss, L::kNone, 0b000, 3, -1, -1},
    {"aten::binary_cross_entropy_backward", "*", F::kLossBackward, L::kMultilinear, 0b001, 4, -1, -1},
    {"aten::binary_cross_entropy_with_logits", "*", F::kLoss, L::kNone, 0b000, 4, -1, -1},
    {"aten::bitwise_and", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::bitwise_not", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::bitwise_or", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::bitwise_xor", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::bmm", "*", F::kMatmul, L::kMultilinear, 0b011, -1, -1, -1, "bik,bkj->bij"},
    {"aten::cat", "*", F::kCat, L::kAdditive, 0b001, 1, -1, -1},
    {"aten::ceil", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::chunk", "*", F::kSplit, L::kAdditive, 0b001, 2, 0, -1},
    {"aten::clamp", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::clamp_max", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::clamp_min", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::clone", "*", F::kPointwise, L::kAdditive, 0b001, -1, -1, -1},
    {"aten::conj", "*", F::kPointwise, L::kAdditive, 0b001, -1, -1, -1},
    {"aten::constant_pad_nd", "*", F::kPad, L::kNone, 0b000, -1, -1, -1},
    {"aten::conv1d", "*", F::kSpatial, L::kNone, 0b000, -1, 1, -1},
    {"aten::conv2d", "*", F::kSpatial, L::kNone, 0b000, -1, 1, -1},
    {"aten::conv3d", "*", F::kSpatial, L::kNone, 0b000, -1, 1, -1},
    {"aten::conv_transpose1d", "*", F::kSpatial, L::kNone, 0b000, -1, 1, -1},
    {"aten::conv_transpose2d", "*", F::kSpatial, L::kNone, 0b000, -1, 1, -1},
    {"aten::conv_transpose3d", "*", F::kSpatial, L::kNone, 0b000, -1, 1, -1},
    {"aten::convolution", "*", F::kSpatial, L::kNone, 0b000, -1, 1, -1},
    {"aten::convolution_backward", "*", F::kConvBackward, L::kMultilinear, 0b001, -1, 2, -1},
    {"aten::copy", "", F::kPointwise, L::kAdditive, 0b010, -1, -1, -1},
    {"aten::cos", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::cosh", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::cudnn_convolution", "*", F::kSpatial, L::kNone, 0b000, -1, 1, -1},
    {"aten::cumprod", "*", F::kAlongDim, L::kNone, 0b000, 1, -1, -1},
    {"aten::cumsum", "*", F::kAlongDim, L::kAdditive, 0b001, 1, -1, -1},
    {"aten::detach", "*", F::kPointwise, L::kAdditive, 0b001, -1, -1, -1},
    {"aten::div", "Scalar", F::kPointwise, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::div", "Scalar_mode", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::div", "Tensor", F::kPointwise, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::div", "Tensor_mode", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::dot", "*", F::kMatmul, L::kMultilinear, 0b011, -1, -1, -1, "k,k->"},
    {"aten::elu", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::elu_backward", "*", F::kPointwise, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::embedding", "*", F::kEmbedding, L::kNone, 0b000, -1, -1, -1},
    {"aten::embedding_dense_backward", "*", F::kEmbeddingBackward, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::empty", "*", F::kFactory, L::kNone, 0b000, -1, -1, -1},
    {"aten::empty_like", "*", F::kLike, L::kNone, 0b000, -1, -1, -1},
    {"aten::empty_strided", "*", F::kFactory, L::kNone, 0b000, -1, -1, -1},
    {"aten::eq", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::erf", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::erfinv", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::exp", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::exp2", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::expm1", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::eye", "*", F::kFactory, L::kNone, 0b000, -1, -1, -1},
    {"aten::fill", "*", F::kLike, L::kNone, 0b000, -1, -1, -1},
    {"aten::flip", "*", F::kDimsList, L::kAdditive, 0b001, 1, -1, -1},
    {"aten::floor", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::fmod", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::full", "*", F::kFactory, L::kNone, 0b000, -1, -1, -1},
    {"aten::full_like", "*", F::kLike, L::kNone, 0b000, -1, -1, -1},
    {"aten::gather", "*", F::kIndexWithDim, L::kAdditive, 0b001, 1, -1, -1},
    {"aten::ge", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::gelu", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::gelu_backward", "*", F::kPointwise, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::glu", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::gt", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::hardsigmoid", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::hardsigmoid_backward", "*", F::kPointwise, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::hardswish", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::hardswish_backward", "*", F::kPointwise, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::hardtanh", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::hardtanh_backward", "*", F::kPointwise, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::huber_loss", "*", F::kLoss, L::kNone, 0b000, 2, -1, -1},
    {"aten::huber_loss_backward", "*", F::kLossBackward, L::kMultilinear, 0b001, 3, -1, -1},
    {"aten::index", "Tensor", F::kIndex, L::kAdditive, 0b001, -1, -1, -1},
    {"aten::index", "Tensor_hacked_twin", F::kIndex, L::kAdditive, 0b001, -1, -1, -1},
    {"aten::index_put", "", F::kIndexPut, L::kAdditive, 0b101, -1, -1, -1},
    {"aten::index_select", "*", F::kIndexWithDim, L::kAdditive, 0b001, 1, -1, -1},
    {"aten::isinf", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::isnan", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::kl_div", "*", F::kLoss, L::kNone, 0b000, 2, -1, -1},
    {"aten::l1_loss", "*", F::kLoss, L::kNone, 0b000, 2, -1, -1},
    {"aten::le", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::leaky_relu", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::leaky_relu_backward", "*", F::kPointwise, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::lerp", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::lift_fresh_copy", "*", F::kPointwise, L::kAdditive, 0b001, -1, -1, -1},
    {"aten::linalg_vector_norm", "*", F::kReduce, L::kNone, 0b000, 2, 3, 2},
    {"aten::linear", "*", F::kMatmul, L::kNone, 0b000, -1, -1, -1, "linear"},
    {"aten::linspace", "*", F::kFactory, L::kNone, 0b000, -1, -1, -1},
    {"aten::log", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::log10", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::log1p", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::log2", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::logical_and", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::logical_not", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::logical_or", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::logical_xor", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::logit", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::logsumexp", "*", F::kReduce, L::kNone, 0b000, 1, 2, 2},
    {"aten::lt", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::masked_fill", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::matmul", "*", F::kMatmul, L::kMultilinear, 0b011, -1, -1, -1, "matmul"},
    {"aten::max", "", F::kReduce, L::kNone, 0b000, -1, -1, 2},
    {"aten::max", "dim", F::kReduce, L::kNone, 0b000, 1, 2, 2},
    {"aten::max", "other", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::max_pool1d_with_indices", "*", F::kSpatial, L::kNone, 0b000, -1, -1, -1},
    {"aten::max_pool2d", "*", F::kSpatial, L::kNone, 0b000, -1, -1, -1},
    {"aten::max_pool2d_with_indices", "*", F::kSpatial, L::kNone, 0b000, -1, -1, -1},
    {"aten::max_pool2d_with_indices_backward", "*", F::kSpatial, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::max_pool3d_with_indices", "*", F::kSpatial, L::kNone, 0b000, -1, -1, -1},
    {"aten::max_pool3d_with_indices_backward", "*", F::kSpatial, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::maximum", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::mean", "", F::kReduce, L::kAdditive, 0b001, -1, -1, 1},
    {"aten::mean", "dim", F::kReduce, L::kAdditive, 0b001, 1, 2, 1},
    {"aten::min", "", F::kReduce, L::kNone, 0b000, -1, -1, 2},
    {"aten::min", "dim", F::kReduce, L::kNone, 0b000, 1, 2, 2},
    {"aten::min", "other", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::minimum", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::mish", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::mish_backward", "*", F::kPointwise, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::mm", "*", F::kMatmul, L::kMultilinear, 0b011, -1, -1, -1, "ik,kj->ij"},
    {"aten::mse_loss", "*", F::kLoss, L::kNone, 0b000, 2, -1, -1},
    {"aten::mse_loss_backward", "*", F::kLossBackward, L::kMultilinear, 0b001, 3, -1, -1},
    {"aten::mul", "Scalar", F::kPointwise, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::mul", "Tensor", F::kPointwise, L::kMultilinear, 0b011, -1, -1, -1},
    {"aten::mv", "*", F::kMatmul, L::kMultilinear, 0b011, -1, -1, -1, "ik,k->i"},
    {"aten::nan_to_num", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::narrow", "", F::kSlice, L::kAdditive, 0b001, 1, -1, 1},
    {"aten::native_batch_norm", "*", F::kBatchNorm, L::kNone, 0b000, 5, -1, -1},
    {"aten::native_batch_norm_backward", "*", F::kBatchNormBackward, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::native_dropout", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::native_dropout_backward", "*", F::kPointwise, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::native_group_norm", "*", F::kSpatial, L::kNone, 0b000, -1, 1, 3},
    {"aten::native_group_norm_backward", "*", F::kConvBackward, L::kMultilinear, 0b001, -1, 4, 5},
    {"aten::native_layer_norm", "*", F::kLayerNorm, L::kNone, 0b000, -1, -1, -1},
    {"aten::native_layer_norm_backward", "*", F::kLayerNormBackward, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::ne", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::neg", "*", F::kPointwise, L::kAdditive, 0b001, -1, -1, -1},
    {"aten::new_empty", "*", F::kNewFactory, L::kNone, 0b000, -1, -1, -1},
    {"aten::new_empty_strided", "*", F::kNewFactory, L::kNone, 0b000, -1, -1, -1},
    {"aten::new_full", "*", F::kNewFactory, L::kNone, 0b000, -1, -1, -1},
    {"aten::new_ones", "*", F::kNewFactory, L::kNone, 0b000, -1, -1, -1},
    {"aten::new_zeros", "*", F::kNewFactory, L::kNone, 0b000, -1, -1, -1},
    {"aten::nll_loss2d_backward", "*", F::kNllLossBackward, L::kMultilinear, 0b001, 4, 6, -1},
    {"aten::nll_loss2d_forward", "*", F::kNllLoss, L::kNone, 0b000, 3, -1, -1},
    {"aten::nll_loss_backward", "*", F::kNllLossBackward, L::kMultilinear, 0b001, 4, 6, -1},
    {"aten::nll_loss_forward", "*", F::kNllLoss, L::kNone, 0b000, 3, -1, -1},
    {"aten::ones", "*", F::kFactory, L::kNone, 0b000, -1, -1, -1},
    {"aten::ones_like", "*", F::kLike, L::kNone, 0b000, -1, -1, -1},
    {"aten::pixel_shuffle", "*", F::kSpatial, L::kNone, 0b000, -1, -1, -1},
    {"aten::pixel_unshuffle", "*", F::kSpatial, L::kNone, 0b000, -1, -1, -1},
    {"aten::positive", "*", F::kPointwise, L::kAdditive, 0b001, -1, -1, -1},
    {"aten::pow", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::prod", "", F::kReduce, L::kNone, 0b000, -1, -1, 2},
    {"aten::prod", "dim_int", F::kReduce, L::kNone, 0b000, 1, 2, 2},
    {"aten::rand", "*", F::kFactory, L::kNone, 0b000, -1, -1, -1},
    {"aten::rand_like", "*", F::kLike, L::kNone, 0b000, -1, -1, -1},
    {"aten::randint", "*", F::kFactory, L::kNone, 0b000, -1, -1, -1},
    {"aten::randint_like", "*", F::kLike, L::kNone, 0b000, -1, -1, -1},
    {"aten::randn", "*", F::kFactory, L::kNone, 0b000, -1, -1, -1},
    {"aten::randn_like", "*", F::kLike, L::kNone, 0b000, -1, -1, -1},
    {"aten::randperm", "*", F::kFactory, L::kNone, 0b000, -1, -1, -1},
    {"aten::real", "*", F::kPointwise, L::kAdditive, 0b001, -1, -1, -1},
    {"aten::reciprocal", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::relu", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::relu6", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::remainder", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::roll", "*", F::kDimsList, L::kAdditive, 0b001, 2, -1, -1},
    {"aten::round", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::rsqrt", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::rsub", "Scalar", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::rsub", "Tensor", F::kPointwise, L::kAdditive, 0b011, -1, -1, -1},
    {"aten::scalar_tensor", "*", F::kFactory, L::kNone, 0b000, -1, -1, -1},
    {"aten::scatter", "*", F::kIndexWithDim, L::kNone, 0b000, 1, -1, -1},
    {"aten::scatter_add", "*", F::kIndexWithDim, L::kNone, 0b000, 1, -1, -1},
    {"aten::select", "int", F::kSelect, L::kAdditive, 0b001, 1, -1, -1},
    {"aten::select_backward", "*", F::kSliceBackward, L::kAdditive, 0b001, 2, -1, 1},
    {"aten::select_scatter", "*", F::kScatterInto, L::kAdditive, 0b011, 2, -1, 1},
    {"aten::sigmoid", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::sigmoid_backward", "*", F::kPointwise, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::sign", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::silu", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::silu_backward", "*", F::kPointwise, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::sin", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::sinh", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::slice", "Tensor", F::kSlice, L::kAdditive, 0b001, 1, -1, 0},
    {"aten::slice_backward", "*", F::kSliceBackward, L::kAdditive, 0b001, 2, -1, 0},
    {"aten::slice_scatter", "*", F::kScatterInto, L::kAdditive, 0b011, 2, -1, 0},
    {"aten::smooth_l1_loss", "*", F::kLoss, L::kNone, 0b000, 2, -1, -1},
    {"aten::smooth_l1_loss_backward", "*", F::kLossBackward, L::kMultilinear, 0b001, 3, -1, -1},
    {"aten::soft_margin_loss", "*", F::kLoss, L::kNone, 0b000, 2, -1, -1},
    {"aten::soft_margin_loss_backward", "*", F::kLossBackward, L::kMultilinear, 0b001, 3, -1, -1},
    {"aten::softplus", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::softplus_backward", "*", F::kPointwise, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::sort", "*", F::kAlongDim, L::kNone, 0b000, 1, -1, -1},
    {"aten::split", "", F::kSplit, L::kAdditive, 0b001, 2, 0, -1},
    {"aten::split", "Tensor", F::kSplit, L::kAdditive, 0b001, 2, 0, -1},
    {"aten::split_with_sizes", "*", F::kSplit, L::kAdditive, 0b001, 2, 0, -1},
    {"aten::sqrt", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::square", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::stack", "*", F::kStack, L::kAdditive, 0b001, 1, -1, -1},
    {"aten::std", "correction", F::kReduce, L::kNone, 0b000, 1, 3, 2},
    {"aten::std", "dim", F::kReduce, L::kNone, 0b000, 1, 3, 2},
    {"aten::sub", "Scalar", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::sub", "Tensor", F::kPointwise, L::kAdditive, 0b011, -1, -1, -1},
    {"aten::sum", "", F::kReduce, L::kAdditive, 0b001, -1, -1, 0},
    {"aten::sum", "dim_IntList", F::kReduce, L::kAdditive, 0b001, 1, 2, 0},
    {"aten::sym_numel", "*", F::kNoTensor, L::kNone, 0b000, -1, -1, -1},
    {"aten::sym_size", "*", F::kNoTensor, L::kNone, 0b000, -1, -1, -1},
    {"aten::tan", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::tanh", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::tanh_backward", "*", F::kPointwise, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::threshold_backward", "*", F::kPointwise, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::topk", "*", F::kAlongDim, L::kNone, 0b000, 2, -1, -1},
    {"aten::tril", "*", F::kLastDims, L::kAdditive, 0b001, 2, -1, -1},
    {"aten::triu", "*", F::kLastDims, L::kAdditive, 0b001, 2, -1, -1},
    {"aten::trunc", "*", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::unbind", "int", F::kSplit, L::kAdditive, 0b001, 1, 1, -1},
    {"aten::unsafe_split", "Tensor", F::kSplit, L::kAdditive, 0b001, 2, 0, -1},
    {"aten::upsample_bicubic2d", "*", F::kSpatial, L::kNone, 0b000, -1, -1, -1},
    {"aten::upsample_bicubic2d_backward", "*", F::kSpatial, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::upsample_bilinear2d", "*", F::kSpatial, L::kNone, 0b000, -1, -1, -1},
    {"aten::upsample_bilinear2d_backward", "*", F::kSpatial, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::upsample_linear1d", "*", F::kSpatial, L::kNone, 0b000, -1, -1, -1},
    {"aten::upsample_linear1d_backward", "*", F::kSpatial, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::upsample_nearest1d", "*", F::kSpatial, L::kNone, 0b000, -1, -1, -1},
    {"aten::upsample_nearest1d_backward", "*", F::kSpatial, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::upsample_nearest2d", "*", F::kSpatial, L::kNone, 0b000, -1, -1, -1},
    {"aten::upsample_nearest2d_backward", "*", F::kSpatial, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::upsample_nearest3d", "*", F::kSpatial, L::kNone, 0b000, -1, -1, -1},
    {"aten::upsample_nearest3d_backward", "*", F::kSpatial, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::upsample_trilinear3d", "*", F::kSpatial, L::kNone, 0b000, -1, -1, -1},
    {"aten::upsample_trilinear3d_backward", "*", F::kSpatial, L::kMultilinear, 0b001, -1, -1, -1},
    {"aten::var", "correction", F::kReduce, L::kNone, 0b000, 1, 3, 2},
    {"aten::var", "dim", F::kReduce, L::kNone, 0b000, 1, 3, 2},
    {"aten::view_as", "*", F::kPointwise, L::kAdditive, 0b001, -1, -1, -1},
    {"aten::where", "Scalar", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::where", "ScalarOther", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::where", "ScalarSelf", F::kPointwise, L::kNone, 0b000, -1, -1, -1},
    {"aten::where", "self", F::kPointwise, L::kAdditive, 0b110, -1, -1, -1},
    {"aten::zero", "*", F::kLike, L::kNone, 0b000, -1, -1, -1},
    {"aten::zeros", "*", F::kFactory, L::kNone, 0b000, -1, -1, -1},
    {"aten::zeros_like", "*", F::kLike, L::kNone, 0b000, -1, -1, -1},
};

constexpr int kNumOpRules = sizeof(kOpRules) / sizeof(kOpRules[0]);

using Key = std::pair<absl::string_view, absl::string_view>;

const absl::flat_hash_map<Key, int>& RuleIndex() {
  static const auto* index = [] {
    auto* m = new absl::flat_hash_map<Key, int>();
    m->reserve(kNumOpRules);
    for (int i = 0; i < kNumOpRules; ++i) {
      m->emplace(Key(kOpRules[i].name, kOpRules[i].overload), i);
    }
    return m;
  }();
  return *index;
}

}  // namespace

const OpRule* FindOpRule(const ir::Target& target) {
  const auto& index = RuleIndex();
  auto it = index.find(Key(target.name, target.overload));
  if (it == index.end()) it = index.find(Key(target.name, "*"));
  if (it == index.end() && absl::StartsWith(target.name, "aten::_foreach_")) {
    it = index.find(Key("aten::_foreach_*", "*"));
  }
  return it == index.end() ? nullptr : &kOpRules[it->second];
}

const OpRule& OpRuleAt(int index) { return kOpRules[index]; }

int OpRuleIndex(const OpRule* rule) {
  return rule == nullptr ? -1 : static_cast<int>(rule - kOpRules);
}

absl::string_view OpFamilyName(OpFamily f) {
  switch (f) {
    case F::kPointwise: return "pointwise";
    case F::kLike: return "like";
    case F::kNewFactory: return "new factory";
    case F::kFactory: return "factory";
    case F::kMatmul: return "matmul";
    case F::kReduce: return "reduction";
    case F::kAlongDim: return "along dim";
    case F::kLastDims: return "last dims";
    case F::kDimsList: return "dims list";
    case F::kPad: return "pad";
    case F::kLayerNorm: return "layer norm";
    case F::kLayerNormBackward: return "layer norm backward";
    case F::kBatchNorm: return "batch norm";
    case F::kBatchNormBackward: return "batch norm backward";
    case F::kSpatial: return "spatial";
    case F::kConvBackward: return "convolution backward";
    case F::kEmbedding: return "embedding";
    case F::kEmbeddingBackward: return "embedding backward";
    case F::kLoss: return "loss";
    case F::kLossBackward: return "loss backward";
    case F::kNllLoss: return "nll loss";
    case F::kNllLossBackward: return "nll loss backward";
    case F::kCat: return "cat";
    case F::kStack: return "stack";
    case F::kSplit: return "split";
    case F::kSlice: return "slice";
    case F::kSelect: return "select";
    case F::kIndexWithDim: return "index along dim";
    case F::kIndex: return "index";
    case F::kSliceBackward: return "slice backward";
    case F::kScatterInto: return "scatter into";
    case F::kAsStrided: return "as strided";
    case F::kAsStridedScatter: return "as strided scatter";
    case F::kIndexPut: return "index put";
    case F::kForeach: return "foreach";
    case F::kNoTensor: return "no tensor";
  }
  return "?";
}

std::vector<std::string> OpRuleNames() {
  std::vector<std::string> out;
  out.reserve(kNumOpRules);
  for (const OpRule& r : kOpRules) {
    out.push_back(r.overload.empty() ? std::string(r.name)
                                     : absl::StrCat(r.name, ".", r.overload));
  }
  return out;
}

}  // namespace fxdp
