#include "server/jobs/raw_tensors.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "analysis/ir/type_text.h"

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
  auto error = [&](const std::string& msg) {
    return absl::InvalidArgumentError(absl::StrCat(what_, ": tensor '", c.name(), "': ", msg));
  };
  const std::vector<int64_t> shape(c.shape().begin(), c.shape().end());
  if (active_) {
    if (c.name() != cur_.name) {
      return absl::InvalidArgumentError(
          absl::StrCat(what_, ": a chunk of tensor '", c.name(), "' came before tensor '",
                       cur_.name, "' was complete (", next_, " of ", total_, " bytes)"));
    }
    if (c.dtype() != ir::DTypeToWire(cur_.dtype) || shape != cur_.shape) {
      return error(absl::StrCat("a chunk says ", TypeString(c.dtype(), shape), ", the first said ",
                                TypeString(cur_.dtype, cur_.shape)));
    }
  } else {
    if (c.name().empty())
      return absl::InvalidArgumentError(absl::StrCat(what_, ": a tensor without a name"));
    if (names_.count(c.name())) return error("sent twice");
    if (declared_ != nullptr) {
      if (absl::Status s = declared_->CheckFirstChunk(c, what_); !s.ok()) return s;
    }
    absl::StatusOr<int> item = ItemSize(c.dtype());
    if (!item.ok()) return error(std::string(item.status().message()));
    uint64_t bytes = static_cast<uint64_t>(*item);
    for (int64_t d : shape) {
      if (d < 0) return error(absl::StrCat("negative dim in shape ", ir::ShapeText(shape)));
      if (d > 0 && bytes > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d)) {
        return error(absl::StrCat("shape ", ir::ShapeText(shape), " is too large"));
      }
      bytes *= static_cast<uint64_t>(d);
    }
    cur_ = RawTensor{c.name(), *ir::DTypeFromWire(c.dtype()), shape, {}};  // ItemSize checked it
    total_ = bytes;
    next_ = 0;
    active_ = true;
    names_.insert(c.name());
  }
  if (c.offset() != next_)
    return error(absl::StrCat("chunk at offset ", c.offset(), ", expected ", next_));
  if (c.data().size() > total_ - next_) {
    return error(absl::StrCat("chunk of ", c.data().size(), " bytes at offset ", c.offset(),
                              " runs past the tensor's ", total_, " bytes (",
                              TypeString(cur_.dtype, cur_.shape), ")"));
  }
  if (keep_) cur_.data.append(c.data());
  next_ += c.data().size();
  if (next_ == total_) {
    active_ = false;
    ++complete_;
    if (keep_) done_.push_back(std::move(cur_));
    cur_ = RawTensor{};
  }
  return absl::OkStatus();
}

std::vector<RawTensor> ChunkStream::Take() { return std::exchange(done_, {}); }

absl::StatusOr<std::string> SliceDim(const RawTensor& t, int dim, int64_t start, int64_t size) {
  const int rank = static_cast<int>(t.shape.size());
  if (dim < 0 || dim >= rank || start < 0 || size < 0 || start + size > t.shape[dim]) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' ",
                                                   TypeString(t.dtype, t.shape), ": no slice [",
                                                   start, ", ", start + size, ") along dim ", dim));
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
  const uint64_t piece = static_cast<uint64_t>(size) * inner;
  std::string out;
  out.reserve(outer * piece);
  for (uint64_t o = 0; o < outer; ++o) {
    out.append(t.data, o * row + static_cast<uint64_t>(start) * inner, piece);
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
  for (size_t off = 0; off < data.size(); off += max_bytes) {
    v1::TensorChunk c;
    c.set_name(in.name());
    c.set_dtype(in.dtype());
    *c.mutable_shape() = in.shape();
    c.set_offset(in.offset() + off);
    c.set_data(data.substr(off, std::min(max_bytes, data.size() - off)));
    out->push_back(std::move(c));
  }
}

}  // namespace fxdp::server
