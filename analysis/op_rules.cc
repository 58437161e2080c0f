#include "analysis/op_rules.h"

#include <algorithm>
#include <iterator>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fxdp {
namespace {

using F = OpFamily;
using R = ParamRole;

// ---- the row vocabulary -----------------------------------------------------

constexpr LinearIn kNotLinear{Linearity::kNone, 0};
template <typename... I>
constexpr LinearIn Additive(I... args) {
  return {Linearity::kAdditive, static_cast<uint8_t>(((1u << args) | ...))};
}
template <typename... I>
constexpr LinearIn Multilinear(I... args) {
  return {Linearity::kMultilinear, static_cast<uint8_t>(((1u << args) | ...))};
}

constexpr OpParam Arg(R role, int i, absl::string_view name) {
  return {role, static_cast<int8_t>(i), name, 0};
}
constexpr OpParam Dim(int i, absl::string_view name) { return Arg(R::kDim, i, name); }
constexpr OpParam Dims(int i, absl::string_view name) { return Arg(R::kDims, i, name); }
constexpr OpParam KeepDim(int i) { return Arg(R::kKeepDim, i, "keepdim"); }
constexpr OpParam Reduces(ReduceKind k) { return {R::kReduces, -1, "", static_cast<int8_t>(k)}; }
constexpr OpParam Reduction(int i) { return Arg(R::kReduction, i, "reduction"); }
constexpr OpParam Training(int i, absl::string_view name = "training") {
  return Arg(R::kTraining, i, name);
}
constexpr OpParam Momentum(int i) { return Arg(R::kMomentum, i, "momentum"); }
constexpr OpParam Eps(int i) { return Arg(R::kEps, i, "eps"); }
constexpr OpParam SaveMean(int i) { return Arg(R::kSaveMean, i, "save_mean"); }
constexpr OpParam SaveInvstd(int i) { return Arg(R::kSaveInvstd, i, "save_invstd"); }
constexpr OpParam Replicated(int i, absl::string_view name) { return Arg(R::kReplicated, i, name); }
constexpr OpParam BatchSize(int i, absl::string_view name) { return Arg(R::kBatchSize, i, name); }
constexpr OpParam TotalWeight(int i) { return Arg(R::kTotalWeight, i, "total_weight"); }
constexpr OpParam Sizes(int i, absl::string_view name) { return Arg(R::kSizes, i, name); }
constexpr OpParam Stride(int i) { return Arg(R::kStride, i, "stride"); }
constexpr OpParam StorageOffset(int i) { return Arg(R::kStorageOffset, i, "storage_offset"); }
constexpr OpParam Start(int i) { return Arg(R::kStart, i, "start"); }
constexpr OpParam End(int i) { return Arg(R::kEnd, i, "end"); }
constexpr OpParam Step(int i) { return Arg(R::kStep, i, "step"); }
constexpr OpParam Length(int i) { return Arg(R::kLength, i, "length"); }
constexpr OpParam SplitSize(int i, absl::string_view name) { return Arg(R::kSplitSize, i, name); }
constexpr OpParam NormalizedShape(int i, absl::string_view name) {
  return Arg(R::kNormalizedShape, i, name);
}
constexpr OpParam Pad(int i, absl::string_view name) { return Arg(R::kPad, i, name); }
constexpr OpParam LastDims(int n) { return {R::kLastDims, -1, "", static_cast<int8_t>(n)}; }
constexpr OpParam Indices(int i) { return Arg(R::kIndices, i, "indices"); }
constexpr OpParam ZeroIsLinear(int i, absl::string_view name, bool absent_is_zero = false) {
  return {R::kZeroIsLinear, static_cast<int8_t>(i), name, static_cast<int8_t>(absent_is_zero)};
}
constexpr OpParam Ord(int i) { return Arg(R::kOrd, i, "ord"); }
constexpr OpParam Offsets(int i) { return Arg(R::kOffsets, i, "offsets"); }
constexpr OpParam IncludeLastOffset(int i) {
  return Arg(R::kIncludeLastOffset, i, "include_last_offset");
}
constexpr OpParam BinRange(int i) { return Arg(R::kBinRange, i, "min"); }
constexpr OpParam Accumulate(int i) { return Arg(R::kAccumulate, i, "accumulate"); }
constexpr OpParam ScaleGradByFreq(int i) {
  return Arg(R::kScaleGradByFreq, i, "scale_grad_by_freq");
}

constexpr MatmulSpec kNoSpec{};
constexpr MatmulSpec Spec(absl::string_view s) { return MatmulSpec::Parse(s); }
constexpr ShapeRule SameAs(int arg) { return {ShapeCheck::kSameAsArg, static_cast<int8_t>(arg)}; }
constexpr ShapeRule BatchAgrees(int self) {
  return {ShapeCheck::kBatchAgrees, static_cast<int8_t>(self)};
}

// One line per op, sorted by (name, overload): the op, its family, the
// arguments it is linear in, its named parameters, then (when any) its
// traits, its product spec and its shape check (op_rules.h). Keep it sorted
// (a static_assert checks); tests/testdata/op_rules.txt holds every row in
// text form (regenerate it as docs/DEVELOPMENT.md says).
// The table stays one line an op (its golden text is tests/testdata/op_rules.txt).
// clang-format off
constexpr OpRule kOpRules[] = {
    {"aten::_adaptive_avg_pool2d", "*", F::kSpatial, kNotLinear, {}},
    {"aten::_adaptive_avg_pool2d_backward", "*", F::kSpatial, Multilinear(0), {}},
    {"aten::_adaptive_avg_pool3d", "*", F::kSpatial, kNotLinear, {}},
    {"aten::_adaptive_avg_pool3d_backward", "*", F::kSpatial, Multilinear(0), {}},
    {"aten::_cdist_backward", "", F::kMatmul, Multilinear(0), {}, kNoTraits, Spec("ij,ik,jk,,ij->ik")},
    {"aten::_cdist_forward", "", F::kMatmul, kNotLinear, {}, kNoSum, Spec("ik,jk->ij")},
    {"aten::_convolution", "*", F::kSpatial, kNotLinear, {Replicated(1, "weight"), Replicated(2, "bias")}},
    {"aten::_embedding_bag", "", F::kEmbeddingBag, kNotLinear, {Replicated(0, "weight"), Offsets(2), IncludeLastOffset(7)}},
    {"aten::_embedding_bag_backward", "", F::kEmbeddingBackward, Multilinear(0), {Offsets(2), ScaleGradByFreq(7)}},
    {"aten::_euclidean_dist", "", F::kMatmul, kNotLinear, {}, kNoSum, Spec("ik,jk->ij")},
    {"aten::_foreach_*", "*", F::kForeach, kNotLinear, {}},
    {"aten::_foreach_norm", "*", F::kForeach, kNotLinear, {Ord(1)}},
    {"aten::_grouped_mm", "", F::kGroupedMm, Multilinear(0, 1), {}},
    {"aten::_local_scalar_dense", "*", F::kNoTensor, kNotLinear, {}},
    {"aten::_log_softmax", "*", F::kAlongDim, kNotLinear, {Dim(1, "dim")}, kNoTraits, kNoSpec, SameAs(0)},
    {"aten::_log_softmax_backward_data", "*", F::kAlongDim, Multilinear(0), {Dim(2, "dim")}, kNoTraits, kNoSpec, SameAs(0)},
    {"aten::_masked_scale", "*", F::kPointwise, Multilinear(0), {}},
    {"aten::_native_batch_norm_legit", "", F::kBatchNorm, kNotLinear, {Training(5), Replicated(1, "weight"), Replicated(2, "bias"), Replicated(3, "running_mean"), Replicated(4, "running_var"), Momentum(6), Eps(7)}},
    {"aten::_native_batch_norm_legit", "no_stats", F::kBatchNorm, kNotLinear, {Training(3), Replicated(1, "weight"), Replicated(2, "bias"), Momentum(4), Eps(5)}},
    {"aten::_native_batch_norm_legit_functional", "*", F::kBatchNorm, kNotLinear, {Training(5), Replicated(1, "weight"), Replicated(2, "bias"), Replicated(3, "running_mean"), Replicated(4, "running_var"), Momentum(6), Eps(7)}, kReturnsRunningStats},
    {"aten::_native_batch_norm_legit_no_training", "*", F::kBatchNorm, kNotLinear, {Replicated(1, "weight"), Replicated(2, "bias"), Replicated(3, "running_mean"), Replicated(4, "running_var"), Momentum(5), Eps(6)}},
    {"aten::_prelu_kernel", "*", F::kPointwise, kNotLinear, {}},
    {"aten::_prelu_kernel_backward", "*", F::kPointwise, Multilinear(0), {}},
    {"aten::_safe_softmax", "*", F::kAlongDim, kNotLinear, {Dim(1, "dim")}, kNoTraits, kNoSpec, SameAs(0)},
    {"aten::_scaled_dot_product_attention_math", "*", F::kSpatial, kNotLinear, {}},
    {"aten::_scaled_dot_product_cudnn_attention", "*", F::kSpatial, kNotLinear, {}},
    {"aten::_scaled_dot_product_cudnn_attention_backward", "*", F::kSpatial, Multilinear(0), {}},
    {"aten::_scaled_dot_product_efficient_attention", "*", F::kSpatial, kNotLinear, {}, kRowsAgree},
    {"aten::_scaled_dot_product_efficient_attention_backward", "*", F::kSpatial, Multilinear(0), {}},
    {"aten::_scaled_dot_product_flash_attention", "*", F::kSpatial, kNotLinear, {}},
    {"aten::_scaled_dot_product_flash_attention_backward", "*", F::kSpatial, Multilinear(0), {}},
    {"aten::_scaled_dot_product_flash_attention_for_cpu", "*", F::kSpatial, kNotLinear, {}, kRowsAgree},
    {"aten::_scaled_dot_product_flash_attention_for_cpu_backward", "*", F::kSpatial, Multilinear(0), {}, kRowsAgree},
    {"aten::_softmax", "*", F::kAlongDim, kNotLinear, {Dim(1, "dim")}, kNoTraits, kNoSpec, SameAs(0)},
    {"aten::_softmax_backward_data", "*", F::kAlongDim, Multilinear(0), {Dim(2, "dim")}, kNoTraits, kNoSpec, SameAs(0)},
    {"aten::_to_copy", "*", F::kPointwise, Additive(0), {}},
    {"aten::_unsafe_index", "Tensor", F::kIndex, Additive(0), {Indices(1)}},
    {"aten::abs", "*", F::kPointwise, kNotLinear, {}, kInplace},
    {"aten::acos", "*", F::kPointwise, kNotLinear, {}},
    {"aten::adaptive_avg_pool1d", "*", F::kSpatial, kNotLinear, {}},
    {"aten::adaptive_max_pool1d", "*", F::kSpatial, kNotLinear, {}},
    {"aten::adaptive_max_pool2d", "*", F::kSpatial, kNotLinear, {}},
    {"aten::adaptive_max_pool2d_backward", "*", F::kSpatial, Multilinear(0), {}},
    {"aten::add", "Scalar", F::kPointwise, kNotLinear, {}, kInplace},
    {"aten::add", "Tensor", F::kPointwise, Additive(0, 1), {}, kInplace},
    {"aten::addcdiv", "*", F::kPointwise, kNotLinear, {}, kInplace},
    {"aten::addcmul", "*", F::kPointwise, kNotLinear, {}, kInplace},
    {"aten::addmm", "*", F::kMatmul, kNotLinear, {}, kNoTraits, Spec("+ij,ik,kj->ij"), {ShapeCheck::kProduct}},
    {"aten::addmv", "*", F::kMatmul, kNotLinear, {}, kNoTraits, Spec("+i,ik,k->i")},
    {"aten::affine_grid_generator", "", F::kSpatial, Multilinear(0), {Sizes(1, "size")}},
    {"aten::alias", "*", F::kPointwise, Additive(0), {}, kSelfAlias},
    {"aten::all", "", F::kReduce, kNotLinear, {Reduces(ReduceKind::kOther)}},
    {"aten::all", "dim", F::kReduce, kNotLinear, {Dims(1, "dim"), KeepDim(2), Reduces(ReduceKind::kOther)}},
    {"aten::amax", "*", F::kReduce, kNotLinear, {Dims(1, "dim"), KeepDim(2), Reduces(ReduceKind::kOther)}},
    {"aten::amin", "*", F::kReduce, kNotLinear, {Dims(1, "dim"), KeepDim(2), Reduces(ReduceKind::kOther)}},
    {"aten::any", "", F::kReduce, kNotLinear, {Reduces(ReduceKind::kOther)}},
    {"aten::any", "dim", F::kReduce, kNotLinear, {Dims(1, "dim"), KeepDim(2), Reduces(ReduceKind::kOther)}},
    {"aten::arange", "", F::kFactory, kNotLinear, {End(0)}},
    {"aten::arange", "*", F::kFactory, kNotLinear, {}},
    {"aten::arange", "start", F::kFactory, kNotLinear, {Start(0), End(1)}},
    {"aten::arange", "start_step", F::kFactory, kNotLinear, {Start(0), End(1), Step(2)}},
    {"aten::argmax", "*", F::kReduce, kNotLinear, {Dims(1, "dim"), KeepDim(2), Reduces(ReduceKind::kOther)}},
    {"aten::argmin", "*", F::kReduce, kNotLinear, {Dims(1, "dim"), KeepDim(2), Reduces(ReduceKind::kOther)}},
    {"aten::as_strided", "", F::kAsStrided, Additive(0), {Sizes(1, "size"), Stride(2), StorageOffset(3)}, kNoTraits, kNoSpec, {ShapeCheck::kAsStrided}},
    {"aten::as_strided_scatter", "", F::kAsStridedScatter, Additive(0, 1), {Sizes(2, "size"), Stride(3), StorageOffset(4)}},
    {"aten::asin", "*", F::kPointwise, kNotLinear, {}},
    {"aten::atan", "*", F::kPointwise, kNotLinear, {}},
    {"aten::atan2", "*", F::kPointwise, kNotLinear, {}},
    {"aten::avg_pool1d", "*", F::kSpatial, kNotLinear, {}},
    {"aten::avg_pool2d", "*", F::kSpatial, kNotLinear, {}},
    {"aten::avg_pool2d_backward", "*", F::kSpatial, Multilinear(0), {}},
    {"aten::avg_pool3d", "*", F::kSpatial, kNotLinear, {}},
    {"aten::avg_pool3d_backward", "*", F::kSpatial, Multilinear(0), {}},
    {"aten::baddbmm", "*", F::kMatmul, kNotLinear, {}, kNoTraits, Spec("+bij,bik,bkj->bij")},
    {"aten::bernoulli", "*", F::kPointwise, kNotLinear, {}, kRandom},
    {"aten::binary_cross_entropy", "*", F::kLoss, kNotLinear, {Reduction(3)}},
    {"aten::binary_cross_entropy_backward", "*", F::kLossBackward, Multilinear(0), {Reduction(4)}},
    {"aten::binary_cross_entropy_with_logits", "*", F::kLoss, kNotLinear, {Reduction(4)}},
    {"aten::bitwise_and", "*", F::kPointwise, kNotLinear, {}},
    {"aten::bitwise_not", "*", F::kPointwise, kNotLinear, {}},
    {"aten::bitwise_or", "*", F::kPointwise, kNotLinear, {}},
    {"aten::bitwise_xor", "*", F::kPointwise, kNotLinear, {}},
    {"aten::bmm", "*", F::kMatmul, Multilinear(0, 1), {}, kNoTraits, Spec("bik,bkj->bij"), {ShapeCheck::kProduct}},
    {"aten::cat", "*", F::kCat, Additive(0), {Dim(1, "dim")}, kPacking},
    {"aten::ceil", "*", F::kPointwise, kNotLinear, {}},
    {"aten::chunk", "*", F::kSplit, Additive(0), {Dim(2, "dim")}},
    {"aten::clamp", "*", F::kPointwise, kNotLinear, {}, kInplace},
    {"aten::clamp_max", "*", F::kPointwise, kNotLinear, {}, kInplace},
    {"aten::clamp_min", "*", F::kPointwise, kNotLinear, {}, kInplace},
    {"aten::clone", "*", F::kPointwise, Additive(0), {}},
    {"aten::conj", "*", F::kPointwise, Additive(0), {}},
    {"aten::constant_pad_nd", "*", F::kPad, kNotLinear, {Pad(1, "pad"), ZeroIsLinear(2, "value", /*absent_is_zero=*/true)}, kPacking},
    {"aten::conv1d", "*", F::kSpatial, kNotLinear, {Replicated(1, "weight"), Replicated(2, "bias")}},
    {"aten::conv2d", "*", F::kSpatial, kNotLinear, {Replicated(1, "weight"), Replicated(2, "bias")}},
    {"aten::conv3d", "*", F::kSpatial, kNotLinear, {Replicated(1, "weight"), Replicated(2, "bias")}},
    {"aten::conv_transpose1d", "*", F::kSpatial, kNotLinear, {Replicated(1, "weight"), Replicated(2, "bias")}},
    {"aten::conv_transpose2d", "*", F::kSpatial, kNotLinear, {Replicated(1, "weight"), Replicated(2, "bias")}},
    {"aten::conv_transpose3d", "*", F::kSpatial, kNotLinear, {Replicated(1, "weight"), Replicated(2, "bias")}},
    {"aten::convolution", "*", F::kSpatial, kNotLinear, {Replicated(1, "weight"), Replicated(2, "bias")}, kRowsAgree},
    {"aten::convolution_backward", "*", F::kConvBackward, Multilinear(0), {Replicated(2, "weight")}, kRowsAgree},
    {"aten::copy", "", F::kPointwise, Additive(1), {}},
    {"aten::cos", "*", F::kPointwise, kNotLinear, {}, kInplace},
    {"aten::cosh", "*", F::kPointwise, kNotLinear, {}},
    {"aten::cudnn_convolution", "*", F::kSpatial, kNotLinear, {Replicated(1, "weight")}},
    {"aten::cumprod", "*", F::kAlongDim, kNotLinear, {Dim(1, "dim")}},
    {"aten::cumsum", "*", F::kAlongDim, Additive(0), {Dim(1, "dim")}},
    {"aten::detach", "*", F::kPointwise, Additive(0), {}, kSelfAlias},
    {"aten::div", "Scalar", F::kPointwise, Multilinear(0), {}, kPacking | kInplace},
    {"aten::div", "Scalar_mode", F::kPointwise, kNotLinear, {}, kPacking | kInplace},
    {"aten::div", "Tensor", F::kPointwise, Multilinear(0), {}, kPacking | kInplace},
    {"aten::div", "Tensor_mode", F::kPointwise, kNotLinear, {}, kPacking | kInplace},
    {"aten::dot", "*", F::kMatmul, Multilinear(0, 1), {}, kNoTraits, Spec("k,k->")},
    {"aten::elu", "*", F::kPointwise, kNotLinear, {}},
    {"aten::elu_backward", "*", F::kPointwise, Multilinear(0), {}},
    {"aten::embedding", "*", F::kEmbedding, kNotLinear, {Replicated(0, "weight")}, kNoTraits, kNoSpec, {ShapeCheck::kEmbedding}},
    {"aten::embedding_dense_backward", "*", F::kEmbeddingBackward, Multilinear(0), {ScaleGradByFreq(4)}, kNoTraits, kNoSpec, {ShapeCheck::kEmbeddingBackward}},
    {"aten::empty", "*", F::kFactory, kNotLinear, {Sizes(0, "size")}, kNoTraits, kNoSpec, {ShapeCheck::kSizes}},
    {"aten::empty_like", "*", F::kLike, kNotLinear, {}},
    {"aten::empty_strided", "*", F::kFactory, kNotLinear, {Sizes(0, "size")}},
    {"aten::eq", "*", F::kPointwise, kNotLinear, {}},
    {"aten::erf", "*", F::kPointwise, kNotLinear, {}},
    {"aten::erfinv", "*", F::kPointwise, kNotLinear, {}},
    {"aten::exp", "*", F::kPointwise, kNotLinear, {}, kInplace},
    {"aten::exp2", "*", F::kPointwise, kNotLinear, {}},
    {"aten::expm1", "*", F::kPointwise, kNotLinear, {}},
    {"aten::exponential", "", F::kLike, kNotLinear, {}, kRandom},
    {"aten::eye", "*", F::kFactory, kNotLinear, {}},
    {"aten::fill", "*", F::kLike, kNotLinear, {}},
    {"aten::flip", "*", F::kDimsList, Additive(0), {Dims(1, "dims")}},
    {"aten::floor", "*", F::kPointwise, kNotLinear, {}},
    {"aten::floor_divide", "*", F::kPointwise, kNotLinear, {}, kDividesPositions},
    {"aten::fmod", "*", F::kPointwise, kNotLinear, {}},
    {"aten::full", "*", F::kFactory, kNotLinear, {Sizes(0, "size")}, kNoTraits, kNoSpec, {ShapeCheck::kSizes}},
    {"aten::full_like", "*", F::kLike, kNotLinear, {}},
    {"aten::gather", "*", F::kIndexWithDim, Additive(0), {Dim(1, "dim")}, kAligned},
    {"aten::ge", "*", F::kPointwise, kNotLinear, {}},
    {"aten::gelu", "*", F::kPointwise, kNotLinear, {}, kInplace},
    {"aten::gelu_backward", "*", F::kPointwise, Multilinear(0), {}},
    {"aten::glu", "*", F::kPointwise, kNotLinear, {}, kNoTraits, kNoSpec, {ShapeCheck::kNone}},
    {"aten::grid_sampler_2d", "", F::kSpatial, Multilinear(0), {}},
    {"aten::grid_sampler_2d_backward", "", F::kSpatial, Multilinear(0), {}},
    {"aten::grid_sampler_3d", "", F::kSpatial, Multilinear(0), {}},
    {"aten::grid_sampler_3d_backward", "", F::kSpatial, Multilinear(0), {}},
    {"aten::gt", "*", F::kPointwise, kNotLinear, {}},
    {"aten::hardsigmoid", "*", F::kPointwise, kNotLinear, {}},
    {"aten::hardsigmoid_backward", "*", F::kPointwise, Multilinear(0), {}},
    {"aten::hardswish", "*", F::kPointwise, kNotLinear, {}},
    {"aten::hardswish_backward", "*", F::kPointwise, Multilinear(0), {}},
    {"aten::hardtanh", "*", F::kPointwise, kNotLinear, {}, kInplace},
    {"aten::hardtanh_backward", "*", F::kPointwise, Multilinear(0), {}},
    {"aten::histc", "", F::kHistogram, kNotLinear, {BinRange(2)}},
    {"aten::huber_loss", "*", F::kLoss, kNotLinear, {Reduction(2)}},
    {"aten::huber_loss_backward", "*", F::kLossBackward, Multilinear(0), {Reduction(3)}},
    {"aten::index", "Tensor", F::kIndex, Additive(0), {Indices(1)}},
    {"aten::index", "Tensor_hacked_twin", F::kIndex, Additive(0), {Indices(1)}},
    {"aten::index_add", "", F::kIndexAdd, kNotLinear, {Dim(1, "dim")}},
    {"aten::index_put", "", F::kIndexPut, Additive(0, 2), {Indices(1), Accumulate(3)}},
    {"aten::index_select", "*", F::kIndexWithDim, Additive(0), {Dim(1, "dim")}},
    {"aten::isinf", "*", F::kPointwise, kNotLinear, {}},
    {"aten::isnan", "*", F::kPointwise, kNotLinear, {}},
    {"aten::kl_div", "*", F::kLoss, kNotLinear, {Reduction(2)}},
    {"aten::l1_loss", "*", F::kLoss, kNotLinear, {Reduction(2)}},
    {"aten::le", "*", F::kPointwise, kNotLinear, {}},
    {"aten::leaky_relu", "*", F::kPointwise, kNotLinear, {}, kInplace},
    {"aten::leaky_relu_backward", "*", F::kPointwise, Multilinear(0), {}},
    {"aten::lerp", "*", F::kPointwise, kNotLinear, {}, kInplace},
    {"aten::lift_fresh_copy", "*", F::kPointwise, Additive(0), {}},
    {"aten::linalg_vector_norm", "*", F::kReduce, kNotLinear, {Ord(1), Dims(2, "dim"), KeepDim(3), Reduces(ReduceKind::kOther)}},
    {"aten::linear", "*", F::kMatmul, kNotLinear, {}, kNoTraits, Spec("linear")},
    {"aten::linspace", "*", F::kFactory, kNotLinear, {}},
    {"aten::log", "*", F::kPointwise, kNotLinear, {}, kInplace},
    {"aten::log10", "*", F::kPointwise, kNotLinear, {}},
    {"aten::log1p", "*", F::kPointwise, kNotLinear, {}},
    {"aten::log2", "*", F::kPointwise, kNotLinear, {}},
    {"aten::logical_and", "*", F::kPointwise, kNotLinear, {}},
    {"aten::logical_not", "*", F::kPointwise, kNotLinear, {}},
    {"aten::logical_or", "*", F::kPointwise, kNotLinear, {}},
    {"aten::logical_xor", "*", F::kPointwise, kNotLinear, {}},
    {"aten::logit", "*", F::kPointwise, kNotLinear, {}},
    {"aten::logsumexp", "*", F::kReduce, kNotLinear, {Dims(1, "dim"), KeepDim(2), Reduces(ReduceKind::kOther)}},
    {"aten::lt", "*", F::kPointwise, kNotLinear, {}},
    {"aten::masked_fill", "*", F::kPointwise, kNotLinear, {}, kInplace},
    {"aten::masked_fill", "Scalar", F::kPointwise, kNotLinear, {ZeroIsLinear(2, "value")}, kInplace},
    {"aten::matmul", "*", F::kMatmul, Multilinear(0, 1), {}, kNoTraits, Spec("matmul")},
    {"aten::max", "", F::kReduce, kNotLinear, {Reduces(ReduceKind::kOther)}},
    {"aten::max", "dim", F::kReduce, kNotLinear, {Dims(1, "dim"), KeepDim(2), Reduces(ReduceKind::kOther)}},
    {"aten::max", "other", F::kPointwise, kNotLinear, {}},
    {"aten::max_pool1d_with_indices", "*", F::kSpatial, kNotLinear, {}},
    {"aten::max_pool2d", "*", F::kSpatial, kNotLinear, {}},
    {"aten::max_pool2d_with_indices", "*", F::kSpatial, kNotLinear, {}},
    {"aten::max_pool2d_with_indices_backward", "*", F::kSpatial, Multilinear(0), {}, kRowsAgree},
    {"aten::max_pool3d_with_indices", "*", F::kSpatial, kNotLinear, {}},
    {"aten::max_pool3d_with_indices_backward", "*", F::kSpatial, Multilinear(0), {}},
    {"aten::maximum", "*", F::kPointwise, kNotLinear, {}},
    {"aten::mean", "", F::kReduce, Additive(0), {Reduces(ReduceKind::kMean)}},
    {"aten::mean", "dim", F::kReduce, Additive(0), {Dims(1, "dim"), KeepDim(2), Reduces(ReduceKind::kMean)}},
    {"aten::min", "", F::kReduce, kNotLinear, {Reduces(ReduceKind::kOther)}},
    {"aten::min", "dim", F::kReduce, kNotLinear, {Dims(1, "dim"), KeepDim(2), Reduces(ReduceKind::kOther)}},
    {"aten::min", "other", F::kPointwise, kNotLinear, {}},
    {"aten::minimum", "*", F::kPointwise, kNotLinear, {}},
    {"aten::mish", "*", F::kPointwise, kNotLinear, {}},
    {"aten::mish_backward", "*", F::kPointwise, Multilinear(0), {}},
    {"aten::mm", "*", F::kMatmul, Multilinear(0, 1), {}, kNoTraits, Spec("ik,kj->ij"), {ShapeCheck::kProduct}},
    {"aten::mse_loss", "*", F::kLoss, kNotLinear, {Reduction(2)}},
    {"aten::mse_loss_backward", "*", F::kLossBackward, Multilinear(0), {Reduction(3)}},
    {"aten::mul", "Scalar", F::kPointwise, Multilinear(0), {}, kPacking | kInplace},
    {"aten::mul", "Tensor", F::kPointwise, Multilinear(0, 1), {}, kPacking | kInplace},
    {"aten::mv", "*", F::kMatmul, Multilinear(0, 1), {}, kNoTraits, Spec("ik,k->i")},
    {"aten::nan_to_num", "*", F::kPointwise, kNotLinear, {}},
    {"aten::narrow", "", F::kSlice, Additive(0), {Dim(1, "dim"), Start(2), Length(3)}},
    {"aten::native_batch_norm", "*", F::kBatchNorm, kNotLinear, {Training(5), Replicated(1, "weight"), Replicated(2, "bias"), Replicated(3, "running_mean"), Replicated(4, "running_var"), Momentum(6), Eps(7)}},
    {"aten::native_batch_norm_backward", "*", F::kBatchNormBackward, Multilinear(0), {Replicated(2, "weight"), Replicated(3, "running_mean"), Replicated(4, "running_var"), SaveMean(5), SaveInvstd(6), Training(7, "train"), Eps(8)}},
    {"aten::native_dropout", "*", F::kPointwise, kNotLinear, {}, kRandom},
    {"aten::native_dropout_backward", "*", F::kPointwise, Multilinear(0), {}},
    {"aten::native_group_norm", "*", F::kSpatial, kNotLinear, {Replicated(1, "weight"), Replicated(2, "bias"), BatchSize(3, "N")}},
    {"aten::native_group_norm_backward", "*", F::kConvBackward, Multilinear(0), {Replicated(4, "weight"), BatchSize(5, "N")}},
    {"aten::native_layer_norm", "*", F::kLayerNorm, kNotLinear, {NormalizedShape(1, "normalized_shape"), Replicated(2, "weight"), Replicated(3, "bias")}, kNoTraits, kNoSpec, SameAs(0)},
    {"aten::native_layer_norm_backward", "*", F::kLayerNormBackward, Multilinear(0), {Replicated(5, "weight"), Replicated(6, "bias")}, kNoTraits, kNoSpec, SameAs(1)},
    {"aten::ne", "*", F::kPointwise, kNotLinear, {}},
    {"aten::neg", "*", F::kPointwise, Additive(0), {}, kInplace},
    {"aten::new_empty", "*", F::kNewFactory, kNotLinear, {Sizes(1, "size")}, kNoTraits, kNoSpec, {ShapeCheck::kSizes}},
    {"aten::new_empty_strided", "*", F::kNewFactory, kNotLinear, {Sizes(1, "size")}},
    {"aten::new_full", "*", F::kNewFactory, kNotLinear, {Sizes(1, "size")}, kNoTraits, kNoSpec, {ShapeCheck::kSizes}},
    {"aten::new_ones", "*", F::kNewFactory, kNotLinear, {Sizes(1, "size")}, kNoTraits, kNoSpec, {ShapeCheck::kSizes}},
    {"aten::new_zeros", "*", F::kNewFactory, kNotLinear, {Sizes(1, "size")}, kZeros, kNoSpec, {ShapeCheck::kSizes}},
    {"aten::nll_loss2d_backward", "*", F::kNllLossBackward, Multilinear(0), {Reduction(4), TotalWeight(6)}},
    {"aten::nll_loss2d_forward", "*", F::kNllLoss, kNotLinear, {Reduction(3)}},
    {"aten::nll_loss_backward", "*", F::kNllLossBackward, Multilinear(0), {Reduction(4), TotalWeight(6)}, kNoTraits, kNoSpec, BatchAgrees(1)},
    {"aten::nll_loss_forward", "*", F::kNllLoss, kNotLinear, {Reduction(3)}, kNoTraits, kNoSpec, BatchAgrees(0)},
    {"aten::normal", "float_float", F::kFactory, kNotLinear, {Sizes(2, "size")}, kRandom, kNoSpec, {ShapeCheck::kSizes}},
    {"aten::normal_functional", "", F::kLike, kNotLinear, {}, kRandom},
    {"aten::ones", "*", F::kFactory, kNotLinear, {Sizes(0, "size")}, kNoTraits, kNoSpec, {ShapeCheck::kSizes}},
    {"aten::ones_like", "*", F::kLike, kNotLinear, {}},
    {"aten::pixel_shuffle", "*", F::kSpatial, kNotLinear, {}},
    {"aten::pixel_unshuffle", "*", F::kSpatial, kNotLinear, {}},
    {"aten::positive", "*", F::kPointwise, Additive(0), {}},
    {"aten::pow", "*", F::kPointwise, kNotLinear, {}},
    {"aten::prod", "", F::kReduce, kNotLinear, {Reduces(ReduceKind::kOther)}},
    {"aten::prod", "dim_int", F::kReduce, kNotLinear, {Dims(1, "dim"), KeepDim(2), Reduces(ReduceKind::kOther)}},
    {"aten::rand", "*", F::kFactory, kNotLinear, {Sizes(0, "size")}, kRandom, kNoSpec, {ShapeCheck::kSizes}},
    {"aten::rand_like", "*", F::kLike, kNotLinear, {}, kRandom},
    {"aten::randint", "*", F::kFactory, kNotLinear, {}, kRandom},
    {"aten::randint_like", "*", F::kLike, kNotLinear, {}, kRandom},
    {"aten::randn", "*", F::kFactory, kNotLinear, {Sizes(0, "size")}, kRandom, kNoSpec, {ShapeCheck::kSizes}},
    {"aten::randn_like", "*", F::kLike, kNotLinear, {}, kRandom},
    {"aten::randperm", "*", F::kFactory, kNotLinear, {}, kRandom},
    {"aten::real", "*", F::kPointwise, Additive(0), {}},
    {"aten::reciprocal", "*", F::kPointwise, kNotLinear, {}, kInplace},
    {"aten::relu", "*", F::kPointwise, kNotLinear, {}, kInplace},
    {"aten::relu6", "*", F::kPointwise, kNotLinear, {}},
    {"aten::remainder", "*", F::kPointwise, kNotLinear, {}},
    {"aten::roll", "*", F::kDimsList, Additive(0), {Dims(2, "dims")}},
    {"aten::round", "*", F::kPointwise, kNotLinear, {}},
    {"aten::rsqrt", "*", F::kPointwise, kNotLinear, {}, kInplace},
    {"aten::rsub", "Scalar", F::kPointwise, kNotLinear, {}},
    {"aten::rsub", "Tensor", F::kPointwise, Additive(0, 1), {}},
    {"aten::scalar_tensor", "*", F::kFactory, kNotLinear, {}},
    {"aten::scatter", "*", F::kIndexWithDim, kNotLinear, {Dim(1, "dim")}, kAligned},
    {"aten::scatter", "src", F::kIndexWithDim, Additive(0, 3), {Dim(1, "dim")}, kAligned},
    {"aten::scatter_add", "*", F::kIndexWithDim, Additive(0, 3), {Dim(1, "dim")}, kAligned},
    {"aten::select", "int", F::kSelect, Additive(0), {Dim(1, "dim")}},
    {"aten::select_backward", "*", F::kSliceBackward, Additive(0), {Sizes(1, "input_sizes"), Dim(2, "dim")}, kDropsDim, kNoSpec, {ShapeCheck::kSizes}},
    {"aten::select_scatter", "*", F::kScatterInto, Additive(0, 1), {Dim(2, "dim")}, kDropsDim},
    {"aten::sigmoid", "*", F::kPointwise, kNotLinear, {}, kInplace},
    {"aten::sigmoid_backward", "*", F::kPointwise, Multilinear(0), {}},
    {"aten::sign", "*", F::kPointwise, kNotLinear, {}, kInplace},
    {"aten::silu", "*", F::kPointwise, kNotLinear, {}, kInplace},
    {"aten::silu_backward", "*", F::kPointwise, Multilinear(0), {}},
    {"aten::sin", "*", F::kPointwise, kNotLinear, {}, kInplace},
    {"aten::sinh", "*", F::kPointwise, kNotLinear, {}},
    {"aten::slice", "Tensor", F::kSlice, Additive(0), {Dim(1, "dim"), Start(2), End(3), Step(4)}},
    {"aten::slice_backward", "*", F::kSliceBackward, Additive(0), {Sizes(1, "input_sizes"), Dim(2, "dim")}, kNoTraits, kNoSpec, {ShapeCheck::kSizes}},
    {"aten::slice_scatter", "*", F::kScatterInto, Additive(0, 1), {Dim(2, "dim")}},
    {"aten::smooth_l1_loss", "*", F::kLoss, kNotLinear, {Reduction(2)}},
    {"aten::smooth_l1_loss_backward", "*", F::kLossBackward, Multilinear(0), {Reduction(3)}},
    {"aten::soft_margin_loss", "*", F::kLoss, kNotLinear, {Reduction(2)}},
    {"aten::soft_margin_loss_backward", "*", F::kLossBackward, Multilinear(0), {Reduction(3)}},
    {"aten::softplus", "*", F::kPointwise, kNotLinear, {}},
    {"aten::softplus_backward", "*", F::kPointwise, Multilinear(0), {}},
    {"aten::sort", "*", F::kAlongDim, kNotLinear, {Dim(1, "dim")}, kSortsRows},
    {"aten::split", "", F::kSplit, Additive(0), {Dim(2, "dim")}},
    {"aten::split", "Tensor", F::kSplit, Additive(0), {Dim(2, "dim"), SplitSize(1, "split_size")}},
    {"aten::split_with_sizes", "*", F::kSplit, Additive(0), {Dim(2, "dim"), SplitSize(1, "split_sizes")}},
    {"aten::sqrt", "*", F::kPointwise, kNotLinear, {}, kInplace},
    {"aten::square", "*", F::kPointwise, kNotLinear, {}},
    {"aten::stack", "*", F::kStack, Additive(0), {Dim(1, "dim")}},
    {"aten::std", "correction", F::kReduce, kNotLinear, {Dims(1, "dim"), KeepDim(3), Reduces(ReduceKind::kOther)}},
    {"aten::std", "dim", F::kReduce, kNotLinear, {Dims(1, "dim"), KeepDim(3), Reduces(ReduceKind::kOther)}},
    {"aten::sub", "Scalar", F::kPointwise, kNotLinear, {}, kInplace},
    {"aten::sub", "Tensor", F::kPointwise, Additive(0, 1), {}, kInplace},
    {"aten::sum", "", F::kReduce, Additive(0), {Reduces(ReduceKind::kSum)}},
    {"aten::sum", "dim_IntList", F::kReduce, Additive(0), {Dims(1, "dim"), KeepDim(2), Reduces(ReduceKind::kSum)}},
    {"aten::sym_numel", "*", F::kNoTensor, kNotLinear, {}},
    {"aten::sym_size", "*", F::kNoTensor, kNotLinear, {}},
    {"aten::tan", "*", F::kPointwise, kNotLinear, {}},
    {"aten::tanh", "*", F::kPointwise, kNotLinear, {}, kInplace},
    {"aten::tanh_backward", "*", F::kPointwise, Multilinear(0), {}},
    {"aten::threshold_backward", "*", F::kPointwise, Multilinear(0), {}},
    {"aten::topk", "*", F::kAlongDim, kNotLinear, {Dim(2, "dim")}},
    {"aten::tril", "*", F::kLastDims, Additive(0), {LastDims(2)}},
    {"aten::triu", "*", F::kLastDims, Additive(0), {LastDims(2)}},
    {"aten::trunc", "*", F::kPointwise, kNotLinear, {}},
    {"aten::unbind", "int", F::kSplit, Additive(0), {Dim(1, "dim")}, kDropsDim},
    {"aten::uniform", "", F::kLike, kNotLinear, {}, kRandom},
    {"aten::unsafe_split", "Tensor", F::kSplit, Additive(0), {Dim(2, "dim")}},
    {"aten::upsample_bicubic2d", "*", F::kSpatial, kNotLinear, {}},
    {"aten::upsample_bicubic2d_backward", "*", F::kSpatial, Multilinear(0), {Sizes(2, "input_size")}, kNoTraits, kNoSpec, {ShapeCheck::kSizes}},
    {"aten::upsample_bilinear2d", "*", F::kSpatial, kNotLinear, {}},
    {"aten::upsample_bilinear2d_backward", "*", F::kSpatial, Multilinear(0), {Sizes(2, "input_size")}, kNoTraits, kNoSpec, {ShapeCheck::kSizes}},
    {"aten::upsample_linear1d", "*", F::kSpatial, kNotLinear, {}},
    {"aten::upsample_linear1d_backward", "*", F::kSpatial, Multilinear(0), {Sizes(2, "input_size")}, kNoTraits, kNoSpec, {ShapeCheck::kSizes}},
    {"aten::upsample_nearest1d", "*", F::kSpatial, kNotLinear, {}},
    {"aten::upsample_nearest1d_backward", "*", F::kSpatial, Multilinear(0), {Sizes(2, "input_size")}, kNoTraits, kNoSpec, {ShapeCheck::kSizes}},
    {"aten::upsample_nearest2d", "*", F::kSpatial, kNotLinear, {}},
    {"aten::upsample_nearest2d_backward", "*", F::kSpatial, Multilinear(0), {Sizes(2, "input_size")}, kNoTraits, kNoSpec, {ShapeCheck::kSizes}},
    {"aten::upsample_nearest3d", "*", F::kSpatial, kNotLinear, {}},
    {"aten::upsample_nearest3d_backward", "*", F::kSpatial, Multilinear(0), {Sizes(2, "input_size")}, kNoTraits, kNoSpec, {ShapeCheck::kSizes}},
    {"aten::upsample_trilinear3d", "*", F::kSpatial, kNotLinear, {}},
    {"aten::upsample_trilinear3d_backward", "*", F::kSpatial, Multilinear(0), {Sizes(2, "input_size")}, kNoTraits, kNoSpec, {ShapeCheck::kSizes}},
    {"aten::var", "correction", F::kReduce, kNotLinear, {Dims(1, "dim"), KeepDim(3), Reduces(ReduceKind::kOther)}},
    {"aten::var", "dim", F::kReduce, kNotLinear, {Dims(1, "dim"), KeepDim(3), Reduces(ReduceKind::kOther)}},
    {"aten::view_as", "*", F::kPointwise, Additive(0), {}, kNoTraits, kNoSpec, {ShapeCheck::kNone}},
    {"aten::where", "Scalar", F::kPointwise, kNotLinear, {}},
    {"aten::where", "ScalarOther", F::kPointwise, kNotLinear, {}},
    {"aten::where", "ScalarSelf", F::kPointwise, kNotLinear, {}},
    {"aten::where", "self", F::kPointwise, Additive(1, 2), {}},
    {"aten::zero", "*", F::kLike, kNotLinear, {}},
    {"aten::zeros", "*", F::kFactory, kNotLinear, {Sizes(0, "size")}, kZeros, kNoSpec, {ShapeCheck::kSizes}},
    {"aten::zeros_like", "*", F::kLike, kNotLinear, {}, kZeros},
};
// clang-format on

constexpr int kNumOpRules = sizeof(kOpRules) / sizeof(kOpRules[0]);

constexpr bool RowsSorted() {
  for (int i = 1; i < kNumOpRules; ++i) {
    const OpRule& a = kOpRules[i - 1];
    const OpRule& b = kOpRules[i];
    if (a.name > b.name || (a.name == b.name && a.overload >= b.overload)) return false;
  }
  return true;
}
static_assert(RowsSorted(), "kOpRules must be sorted by (name, overload) without duplicates");

constexpr bool SpecsValid() {
  for (const OpRule& r : kOpRules) {
    if ((r.family == F::kMatmul) != (r.spec.kind() != MatmulSpec::Kind::kNone) || !r.spec.valid()) {
      return false;
    }
  }
  return true;
}
static_assert(SpecsValid(), "every matmul row, and only those, has a valid product spec");

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

int NumOpRules() { return kNumOpRules; }

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
    case F::kEmbeddingBag: return "embedding bag";
    case F::kHistogram: return "histogram";
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
    case F::kIndexAdd: return "index add";
    case F::kGroupedMm: return "grouped mm";
    case F::kForeach: return "foreach";
    case F::kNoTensor: return "no tensor";
  }
  return "?";
}

std::vector<std::string> OpRuleNames() {
  std::vector<std::string> out;
  out.reserve(kNumOpRules);
  for (const OpRule& r : kOpRules) {
    out.push_back(r.overload.empty() ? std::string(r.name) : absl::StrCat(r.name, ".", r.overload));
  }
  return out;
}

bool HasInplaceVariant(const ir::Target& t) {
  const OpRule* r = FindOpRule(t);
  return r != nullptr && r->has(kInplace);
}

}  // namespace fxdp
