#include "analysis/ir/tensor_chunks.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "analysis/ir/type_text.h"
#include "util/status_macros.h"

namespace fxdp::ir {

std::string WireTypeText(int wire_dtype, const std::vector<int64_t>& shape) {
  absl::StatusOr<DType> d = DTypeFromWire(wire_dtype);
  if (d.ok() && wire_dtype != v1::DTYPE_UNSPECIFIED) return TypeText(*d, shape);
  return TypeText(absl::StrCat("dtype", wire_dtype), shape);
}

std::vector<std::pair<uint64_t, uint64_t>> ChunkSpans(uint64_t bytes, uint64_t chunk_bytes) {
  chunk_bytes = std::max<uint64_t>(chunk_bytes, 1);
  std::vector<std::pair<uint64_t, uint64_t>> out;
  uint64_t off = 0;
  do {
    const uint64_t n = std::min(chunk_bytes, bytes - off);
    out.emplace_back(off, n);
    off += n;
  } while (off < bytes);
  return out;
}

absl::Status TensorChunkChecker::Error(const std::string& tensor, const std::string& msg) const {
  return absl::InvalidArgumentError(
      absl::StrCat(what_.empty() ? "" : absl::StrCat(what_, ": "), "tensor '", tensor, "': ", msg));
}

absl::Status TensorChunkChecker::CheckFirst(const v1::TensorChunk& c, ChunkedTensor* t) const {
  if (c.name().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what_.empty() ? "" : absl::StrCat(what_, ": "),
                                                   "a tensor chunk without a name"));
  }
  if (names_.count(c.name()) > 0) return Error(c.name(), "sent twice");
  if (declared_ != nullptr) {
    if (absl::Status s = declared_->CheckFirstChunk(c, what_, world_size_); !s.ok()) return s;
  }
  t->name = c.name();
  t->shape.assign(c.shape().begin(), c.shape().end());
  absl::StatusOr<DType> dtype = DTypeFromWire(c.dtype());
  if (!dtype.ok() || c.dtype() == v1::DTYPE_UNSPECIFIED)
    return Error(c.name(), absl::StrCat("unknown dtype ", static_cast<int>(c.dtype())));
  t->dtype = *dtype;
  constexpr uint64_t kMax = std::numeric_limits<int64_t>::max();
  uint64_t bytes = static_cast<uint64_t>(DTypeItemSize(*dtype));
  for (int64_t d : t->shape) {
    if (d < 0) return Error(c.name(), absl::StrCat("negative dim in shape ", ShapeText(t->shape)));
    if (d > 0 && bytes > kMax / static_cast<uint64_t>(d))
      return Error(c.name(), absl::StrCat("shape ", ShapeText(t->shape), " is too large"));
    bytes *= static_cast<uint64_t>(d);
  }
  t->bytes = bytes;
  return absl::OkStatus();
}

absl::StatusOr<ChunkPlace> TensorChunkChecker::Add(const v1::TensorChunk& c) {
  ChunkPlace place;
  ChunkedTensor first;
  const ChunkedTensor* t = &cur_;
  uint64_t expected = next_;
  if (active_) {
    if (c.name() != cur_.name) {
      return absl::InvalidArgumentError(
          absl::StrCat(what_.empty() ? "" : absl::StrCat(what_, ": "), "tensor '", c.name(),
                       "' started before tensor '", cur_.name, "' was complete (", next_, " of ",
                       cur_.bytes, " bytes)"));
    }
    const std::vector<int64_t> shape(c.shape().begin(), c.shape().end());
    if (c.dtype() != DTypeToWire(cur_.dtype) || shape != cur_.shape) {
      return Error(c.name(), absl::StrCat("a chunk says ", WireTypeText(c.dtype(), shape),
                                          ", the first said ",
                                          WireTypeText(DTypeToWire(cur_.dtype), cur_.shape)));
    }
  } else {
    FXDP_RETURN_IF_ERROR(CheckFirst(c, &first));
    t = &first;
    expected = 0;
    place.starts = true;
  }
  if (c.offset() != expected)
    return Error(c.name(), absl::StrCat("chunk at offset ", c.offset(), ", expected ", expected));
  const uint64_t n = c.data().size();
  if (n > t->bytes - expected) {
    return Error(c.name(), absl::StrCat("chunk of ", n, " bytes at offset ", c.offset(),
                                        " runs past the tensor's ", t->bytes, " bytes (",
                                        WireTypeText(DTypeToWire(t->dtype), t->shape), ")"));
  }
  if (place.starts) {
    cur_ = std::move(first);
    names_.insert(cur_.name);
    active_ = true;
  }
  next_ = expected + n;
  if (next_ == cur_.bytes) {
    active_ = false;
    ++complete_;
    place.completes = true;
  }
  return place;
}

void TensorChunkChecker::Reset() {
  names_.clear();
  cur_ = ChunkedTensor();
  active_ = false;
  next_ = 0;
  complete_ = 0;
}

}  // namespace fxdp::ir
