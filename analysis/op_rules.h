// Batch-dim rules of the non-view aten ops, as data: one sorted table
// (op_rules.cc), one line per op, read by the BatchDimAnalyzer (batch_dim.h).
//
// A row names the op (schema name and overload; "*" matches any overload),
// its family (how the batch dim moves through it), the argument positions the
// family reads (a dim, a reduction enum, keepdim, ...) and the arguments the
// op is linear in: partial or mean-scaled values may flow through those
// without an all-reduce (an additive op is linear in them jointly, like add;
// a multilinear op in each one alone, like mul or mm).
#ifndef FXDP_ANALYSIS_OP_RULES_H_
#define FXDP_ANALYSIS_OP_RULES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "analysis/ir/graph.h"

namespace fxdp {

enum class OpFamily : int8_t {
  kPointwise,      // elementwise over all tensor args with broadcasting.
  kLike,           // *_like(self), fill, zero: self's shape, no data read.
  kNewFactory,     // new_zeros(self, size), ...: a fresh tensor of `size`.
  kFactory,        // zeros(size), arange(n), ...: no tensor inputs.
  kMatmul,         // einsum-like: `spec` ("ik,kj->ij"); "linear"/"matmul" built per call.
  kReduce,         // reduction over dims `a` (arg index), keepdim at `b`; `c` = ReduceKind.
  kAlongDim,       // shape-preserving, works along the dim at arg `a` (softmax, cumsum, sort).
  kLastDims,       // shape-preserving, works on the last `a` dims (triu, tril).
  kDimsList,       // shape-preserving, works on the dims listed at arg `a` (flip, roll).
  kPad,            // constant_pad_nd(self, pad): pads the last len(pad)/2 dims.
  kLayerNorm,      // native_layer_norm(input, normalized_shape, ...).
  kLayerNormBackward,
  kBatchNorm,      // training flag at arg `a` (-1: always training), `b` outputs carry stats.
  kBatchNormBackward,
  kSpatial,        // conv/pool/group-norm/attention kernels: batch on dim 0 of every
                   // batched operand and batch-major output; `b`: the weight argument
                   // (weight and bias at b, b + 1, replicated), -1: every tensor
                   // operand is batched (attention masks, pooling indices).
  kConvBackward,   // convolution/group-norm backward: (grad_input, grad_weight, grad_bias);
                   // `b`: the weight argument (replicated).
  // kSpatial and kConvBackward: `c` is the int argument that spells the batch
  // size (native_group_norm's N), which the expansion rewrites to the local one.
  kEmbedding,      // embedding(weight, indices, ...).
  kEmbeddingBackward,
  kLoss,           // loss(self, target, ...), reduction enum at arg `a`.
  kLossBackward,   // loss_backward(grad_output, self, target, ...), reduction at `a`.
  kNllLoss,        // nll_loss_forward: (output, total_weight), reduction at `a`.
  kNllLossBackward,  // total_weight at `b`, reduction at `a`.
  kCat,            // cat(tensors, dim = arg `a`).
  kStack,          // stack(tensors, dim = arg `a`).
  kSplit,          // split/chunk/unbind(self, ..., dim = arg `a`); b = 1 when the dim is removed.
  kSlice,          // slice/narrow(self, dim = arg `a`, ...): kind at `c` (0 slice, 1 narrow).
  kSelect,         // select(self, dim = arg `a`, index).
  kIndexWithDim,   // index_select/gather/scatter(self, dim = arg `a`, index...).
  kIndex,          // index.Tensor(self, indices).
  kSliceBackward,  // select_backward/slice_backward(grad, input_sizes, dim = arg `a`, ...); c = 1 for select.
  kScatterInto,    // slice_scatter/select_scatter(self, src, dim = arg `a`, ...): self with a
                   // slice replaced by src; c = 1 when src lacks the dim (select).
  kAsStrided,      // as_strided(self, size, stride, offset): a view of self's storage; the
                   // batch stays on the dim whose stride steps over whole samples.
  kAsStridedScatter,  // as_strided_scatter(self, src, size, stride, offset).
  kIndexPut,       // index_put(self, indices, values, accumulate): no batch-sharded operand.
  kForeach,        // _foreach_*: elementwise across the lists.
  kNoTensor,       // returns no tensor (e.g. _local_scalar_dense).
};

enum class ReduceKind : int8_t { kSum, kMean, kOther };
enum class Linearity : int8_t { kNone, kAdditive, kMultilinear };

struct OpRule {
  absl::string_view name;      // "aten::add"
  absl::string_view overload;  // "Tensor", "" for default, "*" for any.
  OpFamily family;
  Linearity linearity = Linearity::kNone;
  uint8_t linear_args = 0;  // bit i: linear in positional arg i.
  int8_t a = -1, b = -1, c = -1;
  absl::string_view spec = {};  // kMatmul.
};

// The rule for `target`, or nullptr. Ops with a view rule (view_rules.h) are
// not in this table.
const OpRule* FindOpRule(const ir::Target& target);
const OpRule& OpRuleAt(int index);
int OpRuleIndex(const OpRule* rule);
absl::string_view OpFamilyName(OpFamily f);

// Every op with a rule, as "aten::add.Tensor" ("aten::abs.*" for wildcards).
std::vector<std::string> OpRuleNames();

}  // namespace fxdp

#endif  // FXDP_ANALYSIS_OP_RULES_H_
