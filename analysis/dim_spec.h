// DimSpec: how one output dimension of a view-like op is made from the
// dimensions of its input (DTensor's view-op algebra; SPMD_REFERENCE §1.1).
//
// A DimMap holds one DimSpec per output dimension. Specs are small immutable
// values with structural equality. The named constructors normalise exactly
// like torch's `DimSpec.new` class methods (Flatten of one dim is that dim,
// Repeat by 1 is the input, ...); the Raw* constructors build a spec as given,
// as torch's dataclass constructors do (view_as_real uses a raw Split).
//
// Text form (printed identically by tests/python/test_view_rules_differential.py):
//   S  In0  Bc(S,2)  New(5)  Rep(In0,256)  Fl(In0,In1)  Sp(Fl(In0,In1),(2,12),0)
// and a DimMap is "(In0, Fl(In1,In2))", "()" when empty.
#ifndef FXDP_ANALYSIS_DIM_SPEC_H_
#define FXDP_ANALYSIS_DIM_SPEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fxdp {

class DimSpec {
 public:
  enum class Kind : int8_t {
    kSingleton,
    kInputDim,
    kBroadcast,
    kNewDim,
    kRepeat,
    kFlatten,
    kSplit
  };

  // A size-1 dim tied to no input dim.
  static DimSpec Singleton();
  // Input dim `dim`, unchanged.
  static DimSpec InputDim(int64_t dim);
  // `dim` (a size-1 input dim or a Singleton) broadcast to `size`. Never normalised.
  static DimSpec Broadcast(DimSpec dim, int64_t size);
  // A new dim of `size`: Singleton when size == 1.
  static DimSpec NewDim(int64_t size);
  // `dim` tiled `times` times: `dim` when times == 1, Broadcast(dim, times)
  // when dim is a Singleton.
  static DimSpec Repeat(DimSpec dim, int64_t times);
  // Row-major merge of `dims`: Singleton when empty, dims[0] when one.
  static DimSpec Flatten(std::vector<DimSpec> dims);
  // Factor `split_id` of `dim` reshaped to `group_shape`. Precondition:
  // group_shape is non-empty and split_id indexes it. One group: `dim`;
  // group_shape[split_id] == 1: Singleton; otherwise size-1 factors are
  // dropped from the group and split_id re-indexed.
  static DimSpec Split(DimSpec dim, std::vector<int64_t> group_shape, int64_t split_id);

  // Unnormalised forms (torch's plain dataclass constructors).
  static DimSpec RawNewDim(int64_t size);
  static DimSpec RawRepeat(DimSpec dim, int64_t times);
  static DimSpec RawFlatten(std::vector<DimSpec> dims);
  static DimSpec RawSplit(DimSpec dim, std::vector<int64_t> group_shape, int64_t split_id);

  Kind kind() const { return kind_; }
  bool is(Kind k) const { return kind_ == k; }
  // kInputDim only.
  int64_t input_dim() const { return value_; }
  // kBroadcast: the broadcast size; kNewDim: the size; kRepeat: the times.
  int64_t size() const { return value_; }
  // kSplit only.
  int64_t split_id() const { return value_; }
  const std::vector<int64_t>& group_shape() const { return group_shape_; }
  // The specs this one is built from (torch's `inputs()`): the broadcast,
  // repeated or split spec, or the flattened dims; empty for leaves.
  const std::vector<DimSpec>& inputs() const { return inputs_; }

  bool operator==(const DimSpec& o) const;
  bool operator!=(const DimSpec& o) const { return !(*this == o); }
  std::string ToString() const;

 private:
  DimSpec(Kind kind, int64_t value, std::vector<DimSpec> inputs = {},
          std::vector<int64_t> group_shape = {});

  Kind kind_;
  int64_t value_;
  std::vector<DimSpec> inputs_;
  std::vector<int64_t> group_shape_;
};

// One DimSpec per output dimension.
using DimMap = std::vector<DimSpec>;

std::string DimMapToString(const DimMap& map);

// How an input dimension reaches an output dimension.
enum class DimFlowRole : int8_t {
  kIdentity,        // output dim is exactly the input dim (InputDim).
  kFlattenLeading,  // the outermost member of a Flatten.
  kSplitLeading,    // split group 0 of the dim, or of a Flatten it leads.
  kFlattenInner,    // a non-leading member of a Flatten (split or not).
  kOther,           // repeated, broadcast, or a later split group.
};

struct DimFlow {
  int64_t output_dim;
  DimFlowRole role;
  bool operator==(const DimFlow& o) const { return output_dim == o.output_dim && role == o.role; }
};

// The first output dimension of `map` built from input dimension
// `input_dim`, and how; nullopt when the dim does not survive the op (it was
// squeezed away, or dropped from a view as a size-1 dim). This is how the
// batch-dim analysis follows the batch dim by provenance: the batch stays
// shardable through kIdentity, kFlattenLeading and kSplitLeading.
std::optional<DimFlow> TraceInputDim(const DimMap& map, int64_t input_dim);

}  // namespace fxdp

#endif  // FXDP_ANALYSIS_DIM_SPEC_H_
