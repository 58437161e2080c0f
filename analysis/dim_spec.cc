#include "analysis/dim_spec.h"

#include <cassert>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fxdp {

DimSpec::DimSpec(Kind kind, int64_t value, std::vector<DimSpec> inputs,
                 std::vector<int64_t> group_shape)
    : kind_(kind),
      value_(value),
      inputs_(std::move(inputs)),
      group_shape_(std::move(group_shape)) {}

DimSpec DimSpec::Singleton() { return DimSpec(Kind::kSingleton, 0); }
DimSpec DimSpec::InputDim(int64_t dim) { return DimSpec(Kind::kInputDim, dim); }
DimSpec DimSpec::Broadcast(DimSpec dim, int64_t size) {
  return DimSpec(Kind::kBroadcast, size, {std::move(dim)});
}
DimSpec DimSpec::RawNewDim(int64_t size) { return DimSpec(Kind::kNewDim, size); }
DimSpec DimSpec::RawRepeat(DimSpec dim, int64_t times) {
  return DimSpec(Kind::kRepeat, times, {std::move(dim)});
}
DimSpec DimSpec::RawFlatten(std::vector<DimSpec> dims) {
  return DimSpec(Kind::kFlatten, 0, std::move(dims));
}
DimSpec DimSpec::RawSplit(DimSpec dim, std::vector<int64_t> group_shape, int64_t split_id) {
  return DimSpec(Kind::kSplit, split_id, {std::move(dim)}, std::move(group_shape));
}

DimSpec DimSpec::NewDim(int64_t size) { return size == 1 ? Singleton() : RawNewDim(size); }

DimSpec DimSpec::Repeat(DimSpec dim, int64_t times) {
  if (times == 1) return dim;
  if (dim.is(Kind::kSingleton)) return Broadcast(std::move(dim), times);
  return RawRepeat(std::move(dim), times);
}

DimSpec DimSpec::Flatten(std::vector<DimSpec> dims) {
  if (dims.empty()) return Singleton();
  if (dims.size() == 1) return std::move(dims[0]);
  return RawFlatten(std::move(dims));
}

DimSpec DimSpec::Split(DimSpec dim, std::vector<int64_t> group_shape, int64_t split_id) {
  assert(!group_shape.empty() && split_id >= 0 &&
         split_id < static_cast<int64_t>(group_shape.size()));
  if (group_shape.size() == 1) return dim;
  if (group_shape[split_id] == 1) return Singleton();
  std::vector<int64_t> kept;
  int64_t new_id = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(group_shape.size()); ++i) {
    if (group_shape[i] == 1) continue;
    if (i == split_id) new_id = static_cast<int64_t>(kept.size());
    kept.push_back(group_shape[i]);
  }
  return RawSplit(std::move(dim), std::move(kept), new_id);
}

bool DimSpec::operator==(const DimSpec& o) const {
  return kind_ == o.kind_ && value_ == o.value_ && inputs_ == o.inputs_ &&
         group_shape_ == o.group_shape_;
}

std::string DimSpec::ToString() const {
  auto join_inputs = [this] {
    return absl::StrJoin(inputs_, ",", [](std::string* out, const DimSpec& d) {
      absl::StrAppend(out, d.ToString());
    });
  };
  switch (kind_) {
    case Kind::kSingleton: return "S";
    case Kind::kInputDim: return absl::StrCat("In", value_);
    case Kind::kBroadcast: return absl::StrCat("Bc(", join_inputs(), ",", value_, ")");
    case Kind::kNewDim: return absl::StrCat("New(", value_, ")");
    case Kind::kRepeat: return absl::StrCat("Rep(", join_inputs(), ",", value_, ")");
    case Kind::kFlatten: return absl::StrCat("Fl(", join_inputs(), ")");
    case Kind::kSplit:
      return absl::StrCat("Sp(", join_inputs(), ",(", absl::StrJoin(group_shape_, ","), "),",
                          value_, ")");
  }
  return "?";
}

std::string DimMapToString(const DimMap& map) {
  return absl::StrCat(
      "(",
      absl::StrJoin(map, ", ",
                    [](std::string* out, const DimSpec& d) { absl::StrAppend(out, d.ToString()); }),
      ")");
}

namespace {

bool IsInput(const DimSpec& d, int64_t input_dim) {
  return d.is(DimSpec::Kind::kInputDim) && d.input_dim() == input_dim;
}

bool References(const DimSpec& d, int64_t input_dim) {
  if (IsInput(d, input_dim)) return true;
  for (const DimSpec& in : d.inputs()) {
    if (References(in, input_dim)) return true;
  }
  return false;
}

// The role of `input_dim` in `d`, which references it.
DimFlowRole RoleIn(const DimSpec& d, int64_t input_dim) {
  using Kind = DimSpec::Kind;
  if (IsInput(d, input_dim)) return DimFlowRole::kIdentity;
  if (d.is(Kind::kFlatten)) {
    return IsInput(d.inputs()[0], input_dim) ? DimFlowRole::kFlattenLeading
                                             : DimFlowRole::kFlattenInner;
  }
  if (d.is(Kind::kSplit)) {
    const DimFlowRole inner = RoleIn(d.inputs()[0], input_dim);
    if (inner == DimFlowRole::kFlattenInner) return inner;
    const bool leads = inner == DimFlowRole::kIdentity || inner == DimFlowRole::kFlattenLeading;
    return leads && d.split_id() == 0 ? DimFlowRole::kSplitLeading : DimFlowRole::kOther;
  }
  return DimFlowRole::kOther;
}

}  // namespace

std::optional<DimFlow> TraceInputDim(const DimMap& map, int64_t input_dim) {
  for (int64_t k = 0; k < static_cast<int64_t>(map.size()); ++k) {
    if (References(map[k], input_dim)) return DimFlow{k, RoleIn(map[k], input_dim)};
  }
  return std::nullopt;
}

}  // namespace fxdp
