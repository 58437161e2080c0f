#include "server/jobs/raw_tensors.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "analysis/ir/tensor_chunks.h"
#include "analysis/ir/type_text.h"
#include "util/status_macros.h"

namespace fxdp::server {

absl::StatusOr<int> ItemSize(v1::DType dtype) {
  absl::StatusOr<ir::DType> d = ir::DTypeFromWire(static_cast<int>(dtype));
  if (!d.ok())
    return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", static_cast<int>(dtype)));
  return ir::DTypeItemSize(*d);
}

std::string TypeString(v1::DType dtype, const std::vector<int64_t>& shape) {
  absl::StatusOr<ir::DType> d = ir::DTypeFromWire(static_cast<int>(dtype));
  if (d.ok()) return ir::TypeText(*d, shape);
  return ir::TypeText(absl::StrCat("dtype", static_cast<int>(dtype)), shape);
}

std::string TypeString(ir::DType dtype, const std::vector<int64_t>& shape) {
  return ir::TypeText(dtype, shape);
}

absl::Status ChunkStream::Add(const v1::TensorChunk& c) {
  FXDP_ASSIGN_OR_RETURN(const ir::ChunkPlace place, check_.Add(c));
  if (!keep_) return absl::OkStatus();
  if (place.starts) {
    const ir::ChunkedTensor& t = check_.current();
    cur_ = RawTensor{t.name, t.dtype, t.shape, {}};
  }
  cur_.data.append(c.data());
  if (place.completes) done_.push_back(std::exchange(cur_, RawTensor{}));
  return absl::OkStatus();
}

std::vector<RawTensor> ChunkStream::Take() { return std::exchange(done_, {}); }

absl::StatusOr<std::string> SliceDim(const RawTensor& t, int dim, int64_t start, int64_t size) {
  return SliceRows(t, dim, {ir::RankSlice{0, start, size}});
}

absl::StatusOr<std::string> SliceRows(const RawTensor& t, int dim,
                                      const std::vector<ir::RankSlice>& rows) {
  const int rank = static_cast<int>(t.shape.size());
  uint64_t rows_out = 0;
  for (const ir::RankSlice& r : rows) {
    if (dim < 0 || dim >= rank || r.start < 0 || r.size < 0 || r.start + r.size > t.shape[dim]) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name, "' ", TypeString(t.dtype, t.shape), ": no slice [",
                       r.start, ", ", r.start + r.size, ") along dim ", dim));
    }
    rows_out += static_cast<uint64_t>(r.size);
  }
  uint64_t outer = 1, inner = static_cast<uint64_t>(ir::DTypeItemSize(t.dtype));
  for (int d = 0; d < dim; ++d) outer *= static_cast<uint64_t>(t.shape[d]);
  for (int d = dim + 1; d < rank; ++d) inner *= static_cast<uint64_t>(t.shape[d]);
  const uint64_t row = static_cast<uint64_t>(t.shape[dim]) * inner;
  if (outer * row != t.data.size()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' has ", t.data.size(),
                                                   " bytes, ", TypeString(t.dtype, t.shape),
                                                   " needs ", outer * row));
  }
  std::string out;
  out.reserve(outer * rows_out * inner);
  for (uint64_t o = 0; o < outer; ++o) {
    for (const ir::RankSlice& r : rows) {
      out.append(t.data, o * row + static_cast<uint64_t>(r.start) * inner,
                 static_cast<uint64_t>(r.size) * inner);
    }
  }
  return out;
}

void RechunkTensor(const v1::TensorChunk& in, size_t max_bytes, std::vector<v1::TensorChunk>* out) {
  if (max_bytes == 0) max_bytes = 1;
  const std::string& data = in.data();
  if (data.size() <= max_bytes) {
    out->push_back(in);
    return;
  }
  for (const auto& [off, n] : ir::ChunkSpans(data.size(), max_bytes)) {
    v1::TensorChunk c;
    c.set_name(in.name());
    c.set_dtype(in.dtype());
    *c.mutable_shape() = in.shape();
    c.set_offset(in.offset() + off);
    c.set_data(data.substr(off, n));
    out->push_back(std::move(c));
  }
}

}  // namespace fxdp::server
