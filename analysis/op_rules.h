// Per-op knowledge of the non-view aten ops, as data: one sorted table
// (op_rules.cc), one line per op, read by the BatchDimAnalyzer (batch_dim.h),
// the expansion (which size lists to make local; FULLY_SHARD: which ops are
// random, alias self, take norms, work across lists), its shape check and the
// overlap schedule (packing ops), sync BatchNorm (batch norm's argument
// positions) and the interpreter (kInplace: its in-place candidates). The
// table is its own torch-free library, fxdp_op_facts (op_rules.cc,
// op_rules_text.cc, matmul_spec.cc), which the executor links; the queries
// that also consult the view rules are op_queries.h (fxdp_analysis).
//
// A row names the op (schema name and overload; "*" matches any overload),
// its family (how the batch dim moves through it), the arguments it is
// linear in (partial or mean-scaled values may flow through those without an
// all-reduce: an additive op is linear in them jointly, like add; a
// multilinear op in each one alone, like mul or mm), then its named
// parameters: which argument is the dim it works along, which spells a size,
// which operands must be replicated, ... (OpParam), and its traits.
//
//   {"aten::sum", "dim_IntList", F::kReduce, Additive(0),
//    {Dims(1, "dim"), KeepDim(2), Reduces(ReduceKind::kSum)}},
//   {"aten::mm", "*", F::kMatmul, Multilinear(0, 1), {}, kNoTraits, Spec("ik,kj->ij"),
//    {ShapeCheck::kProduct}},
//
// tests/testdata/op_rules.txt holds every row in its text form (OpRuleText);
// tests/analysis/op_rules_test.cc compares it byte for byte.
#ifndef FXDP_ANALYSIS_OP_RULES_H_
#define FXDP_ANALYSIS_OP_RULES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "analysis/ir/graph.h"
#include "analysis/matmul_spec.h"

namespace fxdp {

enum class OpFamily : int8_t {
  kPointwise,   // elementwise over all tensor args with broadcasting.
  kLike,        // *_like(self), fill, zero: self's shape, no data read.
  kNewFactory,  // new_zeros(self, size), ...: a fresh tensor of `size`.
  kFactory,     // zeros(size), arange(n), ...: no tensor inputs.
  kMatmul,      // einsum-like: the row's MatmulSpec.
  kReduce,      // reduction over Dims (all when absent), KeepDim, Reduces.
  kAlongDim,    // shape-preserving, works along the Dim (softmax, cumsum, sort).
  kLastDims,    // shape-preserving, works on the LastDims (triu, tril).
  kDimsList,    // shape-preserving, works on the Dims listed (flip, roll).
  kPad,         // constant_pad_nd(self, Pad): pads the last len(pad)/2 dims.
  kLayerNorm,   // native_layer_norm(input, NormalizedShape, weight, bias, eps).
  kLayerNormBackward,
  kBatchNorm,  // batch norm: Training flag (absent: never training).
  kBatchNormBackward,
  kSpatial,       // conv/pool/group-norm/attention kernels: the batch on dim 0 of every
                  // operand that is not Replicated, and of the batch-major outputs.
  kConvBackward,  // convolution/group-norm backward: (grad_input, grad_weight, grad_bias).
  kEmbedding,     // embedding(weight, indices, ...).
  kEmbeddingBackward,
  kEmbeddingBag,     // _embedding_bag(weight, indices, Offsets, ...): bags of a flat 1-D input.
  kHistogram,        // histc(self, ...): counts of self's values in bins that are not self's
                     // dims (a sum over every row: partial).
  kLoss,             // loss(self, target, ...) with a Reduction.
  kLossBackward,     // loss_backward(grad_output, self, target, ...) with a Reduction.
  kNllLoss,          // nll_loss_forward: (output, total_weight).
  kNllLossBackward,  // TotalWeight, Reduction.
  kCat,              // cat(tensors, Dim).
  kStack,            // stack(tensors, Dim).
  kSplit,            // split/chunk/unbind(self, ..., Dim); kDropsDim when the dim is removed.
  kSlice,            // slice(self, Dim, Start, End, Step) / narrow(self, Dim, Start, Length).
  kSelect,           // select(self, Dim, index).
  kIndexWithDim,     // index_select/gather/scatter(self, Dim, index...).
  kIndex,            // index.Tensor(self, Indices).
  kSliceBackward,    // select_backward/slice_backward(grad, Sizes, Dim, ...); kDropsDim for select.
  kScatterInto,      // slice_scatter/select_scatter(self, src, Dim, ...): self with a
                     // slice replaced by src; kDropsDim when src lacks the dim (select).
  kAsStrided,        // as_strided(self, Sizes, Stride, Offset): a view of self's storage; the
                     // batch stays on the dim whose stride steps over whole samples.
  kAsStridedScatter,  // as_strided_scatter(self, src, Sizes, Stride, Offset).
  kIndexPut,          // index_put(self, Indices, values, accumulate).
  kIndexAdd,          // index_add(self, Dim, index, source): source's slices added at index.
  kGroupedMm,         // _grouped_mm(a, b, offs): a's rows (grouped by offs) times b[group],
                      // or a^T b per group (the weight gradient).
  kForeach,           // _foreach_*: elementwise across the lists.
  kNoTensor,          // returns no tensor (e.g. _local_scalar_dense).
};

enum class ReduceKind : int8_t { kSum, kMean, kOther };
enum class Linearity : int8_t { kNone, kAdditive, kMultilinear };

// What one named parameter of a row means. Most name an argument of the op
// (its position and schema name); a few are fixed by the row (`value`).
enum class ParamRole : int8_t {
  kNone,
  kDim,                // int: the dim the op works along, splits, selects, concatenates.
  kDims,               // int or int[]: the dims it reduces or works on (absent or None: all).
  kKeepDim,            // bool: a reduction keeps the reduced dims.
  kReduces,            // fixed: the ReduceKind of a reduction (value).
  kReduction,          // int: a loss's reduction enum (0 none, 1 mean, 2 sum; default mean).
  kTraining,           // bool: batch norm normalises with batch statistics (default true).
  kReplicated,         // tensor: must be replicated (a weight, bias or running statistic).
  kBatchSize,          // int: spells the batch size (group norm's N); made local by the expansion.
  kTotalWeight,        // tensor: nll backward's total_weight (a count, exempt from linearity).
  kSizes,              // int[]: a size list that spells a shape; made local by the expansion.
  kStride,             // int[]: as_strided's strides.
  kStorageOffset,      // int: as_strided's storage offset.
  kStart,              // int: slice/narrow/arange start.
  kEnd,                // int: slice/arange end.
  kStep,               // int: slice/arange step.
  kLength,             // int: narrow's length.
  kSplitSize,          // int or int[]: the size of each piece of a split.
  kNormalizedShape,    // int[]: layer norm's normalized shape (the last dims it works on).
  kPad,                // int[]: pad widths, two per padded last dim.
  kLastDims,           // fixed: works on the last `value` dims.
  kIndices,            // Tensor?[]: index/index_put's indices.
  kZeroIsLinear,       // scalar: the op is linear in self when this argument is 0
                       // (value 1: an absent argument is 0).
  kScaleGradByFreq,    // bool: embedding backward scales by each rank's local token counts.
  kOrd,                // scalar: the order of the vector norms the op takes of whole tensors
                       // (absent: 2); FULLY_SHARD completes a 2-norm of shards with an all-reduce.
  kOffsets,            // tensor: embedding bag's offsets (where each bag starts in the flat input).
  kIncludeLastOffset,  // bool: the offsets end with the input's length (one more than the bags).
  kBinRange,           // scalar: histc's min; max is the next argument (equal: the data's range).
  kAccumulate,         // bool: index_put adds values into self instead of writing them.
  kMomentum,           // float: batch norm's running-statistics momentum.
  kEps,                // float: added to a norm's variance.
  kSaveMean,           // tensor: batch norm backward's saved batch mean.
  kSaveInvstd,         // tensor: batch norm backward's saved inverse standard deviation.
};

struct OpParam {
  ParamRole role = ParamRole::kNone;
  int8_t index = -1;       // positional argument, or -1 (fixed by the row).
  absl::string_view name;  // schema name of the argument (a keyword when not positional).
  int8_t value = 0;        // a fixed value (kReduces, kLastDims, kZeroIsLinear).
};

// Properties of an op that are not about one argument.
enum OpTrait : uint16_t {
  kNoTraits = 0,
  kZeros = 1 << 0,      // fills with zeros: a partial value added to it stays partial.
  kDropsDim = 1 << 1,   // the Dim is removed (unbind, select, select_scatter's src) or
                        // re-inserted (select_backward).
  kAligned = 1 << 2,    // every tensor operand has self's rank, the batch on the same dim
                        // (gather, scatter).
  kPacking = 1 << 3,    // cheap: may move up with the all_reduce it alone feeds (schedule.h).
  kInplace = 1 << 4,    // `name_` (same overload, same arguments) computes the op into self
                        // (the interpreter reuses a dying self's buffer).
  kRowsAgree = 1 << 5,  // shape check: every tensor operand that is not Replicated has
                        // arg 0's rows (or 1).
  kRandom = 1 << 6,     // draws random numbers: a second evaluation differs (FULLY_SHARD's
                        // backward never recomputes it).
  kSelfAlias = 1 << 7,  // returns self's data unchanged (alias, detach): FULLY_SHARD's
                        // optimizer reads a shard through it as the shard itself.
  kSortsRows = 1 << 8,  // sorts along its Dim: along the batch dim each rank sorts its own
                        // rows, exact only where the order is undone (row_order.cc).
  kDividesPositions = 1 << 9,      // positions // k: positions along a dim k times coarser.
  kNoSum = 1 << 10,                // kMatmul: the letters missing from the output are not summed
                                   // products (cdist's feature dim): the batch there is refused.
  kReturnsRunningStats = 1 << 11,  // batch norm: outputs 3 and 4 are the updated running
                                   // statistics (the functional form; others update in place).
};

// Shape checks of the expansion (expansion/shape_check.h) beyond broadcasting.
enum class ShapeCheck : int8_t {
  kDefault,            // pointwise: operands broadcast to the output; others: none.
  kNone,               // pointwise whose output is not the broadcast of its operands.
  kSameAsArg,          // output 0 has the shape of tensor arg `arg`.
  kSizes,              // output 0's shape is the Sizes argument.
  kView,               // kSizes (-1: inferred), and the input has as many elements (view rules).
  kExpand,             // kSizes (-1: the input's), and each input dim is 1 or equal (view rules).
  kAsStrided,          // kSizes, and the view stays inside a dense input.
  kProduct,            // operands and output agree with the row's MatmulSpec.
  kEmbedding,          // embedding(weight, indices): indices.shape + [weight.shape[1]].
  kEmbeddingBackward,  // grad_output is indices.shape + [embedding_dim].
  kBatchAgrees,        // nll: self (arg `arg`) and target (next arg) agree on dim 0.
};

// The arguments an op is linear in.
struct LinearIn {
  Linearity kind = Linearity::kNone;
  uint8_t args = 0;  // bit i: linear in positional arg i.
};

struct ShapeRule {
  ShapeCheck kind = ShapeCheck::kDefault;
  int8_t arg = -1;  // kSameAsArg, kBatchAgrees.
};

struct OpRule {
  static constexpr int kMaxParams = 8;

  absl::string_view name;      // "aten::add"
  absl::string_view overload;  // "Tensor", "" for default, "*" for any.
  OpFamily family;
  LinearIn linear;
  OpParam params[kMaxParams] = {};
  uint16_t traits = kNoTraits;
  MatmulSpec spec = {};  // kMatmul.
  ShapeRule shape = {};

  // The parameter with `role`, or nullptr.
  const OpParam* param(ParamRole role) const {
    for (const OpParam& p : params) {
      if (p.role == role) return &p;
    }
    return nullptr;
  }
  bool has(OpTrait t) const { return (traits & t) != 0; }
  // Whether positional arg `arg` is a kReplicated parameter.
  bool replicated(int arg) const {
    for (const OpParam& p : params) {
      if (p.role == ParamRole::kReplicated && p.index == arg) return true;
    }
    return false;
  }
};

// The rule for `target`, or nullptr. Ops with a view rule (view_rules.h) are
// not in this table.
const OpRule* FindOpRule(const ir::Target& target);
const OpRule& OpRuleAt(int index);
int OpRuleIndex(const OpRule* rule);
int NumOpRules();
absl::string_view OpFamilyName(OpFamily f);

// Every op with a rule, as "aten::add.Tensor" ("aten::abs.*" for wildcards).
std::vector<std::string> OpRuleNames();

// One row in its text form:
//   aten::sum.dim_IntList  reduction  additive(0)  dims=1:dim keepdim=2:keepdim reduces=sum
std::string OpRuleText(const OpRule& rule);
// Every row, one line each, in table order (tests/testdata/op_rules.txt).
std::string OpRulesText();

// ---- queries of the table alone (op_queries.h also consults the view rules)

// Whether `t` has an in-place variant `name_` that computes it into self.
bool HasInplaceVariant(const ir::Target& t);

}  // namespace fxdp

#endif  // FXDP_ANALYSIS_OP_RULES_H_
