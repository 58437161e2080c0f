#include "analysis/ir/declared_tensors.h"

#include <limits>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "analysis/ir/batch_split.h"
#include "analysis/ir/type_text.h"

namespace fxdp::ir {
namespace {

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

uint64_t SaturatingAdd(uint64_t a, uint64_t b) { return a > kMax - b ? kMax : a + b; }

}  // namespace

uint64_t TensorByteSize(DType dtype, const std::vector<int64_t>& shape) {
  uint64_t bytes = static_cast<uint64_t>(DTypeItemSize(dtype));
  for (int64_t d : shape) {
    if (d <= 0) return 0;
    const uint64_t u = static_cast<uint64_t>(d);
    if (bytes > kMax / u) return kMax;
    bytes *= u;
  }
  return bytes;
}

// The INPUTs the graph's metadata kRaggedKey lists (a line that does not
// parse lists none: Program::Load reports it).
std::set<std::string> RaggedNames(const v1::GraphDef& g) {
  std::set<std::string> out;
  for (const v1::StringPair& kv : g.metadata()) {
    if (kv.key() != kRaggedKey) continue;
    absl::StatusOr<RaggedInputs> pairs = ParseRagged(kv.value());
    if (!pairs.ok()) continue;
    for (const auto& [input, offsets] : *pairs) out.insert(input);
  }
  return out;
}

DeclaredTensors DeclaredTensors::Of(const v1::GraphDef& g, Kind kind) {
  DeclaredTensors out;
  out.kind_ = kind;
  const std::set<std::string> ragged =
      kind == Kind::kBatch ? RaggedNames(g) : std::set<std::string>();
  for (const v1::Node& n : g.nodes()) {
    if (n.kind() != v1::PLACEHOLDER || n.outputs_size() == 0 || n.outputs(0).kind() != v1::TENSOR)
      continue;
    const bool input = n.placeholder().role() == v1::INPUT;
    if (input != (kind == Kind::kBatch)) continue;
    const std::string& name = n.placeholder().state_name();
    if (out.by_name_.count(name) > 0) continue;
    const v1::TensorMeta& t = n.outputs(0).tensor();
    absl::StatusOr<DType> dtype = DTypeFromWire(t.dtype());
    Tensor d;
    d.node = n.name();
    d.dtype = dtype.ok() ? *dtype : DType::kFloat32;  // a decoded graph has known dtypes
    d.shape.assign(t.shape().begin(), t.shape().end());
    d.batch_dim = input ? n.placeholder().batch_dim() : -1;
    d.ragged = ragged.count(name) > 0 && d.shape.size() == 1;
    d.bytes = TensorByteSize(d.dtype, d.shape);
    out.bytes_ = SaturatingAdd(out.bytes_, d.bytes);
    out.order_.push_back(name);
    out.by_name_.emplace(name, std::move(d));
  }
  return out;
}

const DeclaredTensors::Tensor* DeclaredTensors::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &it->second;
}

DeclaredTensors DeclaredTensors::Without(const std::set<std::string>& drop) const {
  DeclaredTensors out;
  out.kind_ = kind_;
  for (const std::string& name : order_) {
    if (drop.count(name) > 0) continue;
    const Tensor& t = by_name_.at(name);
    out.bytes_ = SaturatingAdd(out.bytes_, t.bytes);
    out.order_.push_back(name);
    out.by_name_.emplace(name, t);
  }
  return out;
}

std::string DeclaredTensors::Names(size_t max) const {
  if (order_.size() <= max) return absl::StrJoin(order_, ", ");
  return absl::StrCat(
      absl::StrJoin(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(max), ", "),
      " and ", order_.size() - max, " more");
}

absl::Status DeclaredTensors::CheckFirstChunk(const v1::TensorChunk& c, absl::string_view what,
                                              int world_size) const {
  const char* noun = kind_ == Kind::kState ? "state tensor" : "INPUT";
  const std::string prefix = what.empty() ? "" : absl::StrCat(what, ": ");
  const Tensor* want = Find(c.name());
  if (want == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "tensor '", c.name(), "' is not a ",
                                                   noun, " of the graph (its ", size(), ": ",
                                                   Names(), ")"));
  }
  const std::vector<int64_t> shape(c.shape().begin(), c.shape().end());
  absl::StatusOr<DType> dtype = DTypeFromWire(c.dtype());
  bool fits = dtype.ok() && c.dtype() != v1::DTYPE_UNSPECIFIED && *dtype == want->dtype &&
              shape.size() == want->shape.size();
  for (size_t d = 0; fits && d < shape.size(); ++d) {
    if (want->ragged) {
      fits = shape[d] >= 0 && shape[d] <= want->shape[d];
    } else if (static_cast<int>(d) == want->batch_dim && world_size > 1) {
      const int64_t n = want->shape[d];
      fits = shape[d] >= 0 && (n >= std::numeric_limits<int64_t>::max() / world_size - 1 ||
                               shape[d] <= static_cast<int64_t>(world_size) * (n + 1) - 1);
    } else {
      fits = shape[d] == want->shape[d];
    }
  }
  if (fits) return absl::OkStatus();
  const std::string got = dtype.ok() && c.dtype() != v1::DTYPE_UNSPECIFIED
                              ? TypeText(*dtype, shape)
                              : TypeText(absl::StrCat("dtype", static_cast<int>(c.dtype())), shape);
  return absl::InvalidArgumentError(
      absl::StrCat(prefix, "tensor '", c.name(), "' is ", got, ", the graph's placeholder '",
                   want->node, "' declares ",
                   want->ragged ? absl::StrCat(DTypeShortName(want->dtype), "[<= ", want->shape[0],
                                               "] (ragged: this rank's bags of it)")
                                : TypeText(want->dtype, want->shape),
                   world_size > 1 && want->batch_dim >= 0
                       ? absl::StrCat(" (this rank's shard of dim ", want->batch_dim,
                                      " of a global batch over ", world_size, " ranks)")
                       : ""));
}

}  // namespace fxdp::ir
