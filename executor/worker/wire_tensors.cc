#include "executor/worker/wire_tensors.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "analysis/ir/type_text.h"
#include "executor/torch_types.h"
#include "util/status_macros.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the wire's tensor bytes are little-endian; this host is not");

namespace fxdp::executor {

absl::Status TensorAssembler::Add(const v1::TensorChunk& c) {
  const std::string& name = c.name();
  auto bad = [&](auto&&... why) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': ", why...));
  };
  if (!active_) {
    if (name.empty()) return absl::InvalidArgumentError("a tensor chunk without a name");
    if (done_.count(name)) return bad("sent twice");
    if (c.offset() != 0) return bad("its first chunk has offset ", c.offset(), " (expected 0)");
    absl::StatusOr<ir::DType> dt = ir::DTypeFromWire(c.dtype());
    if (!dt.ok() || c.dtype() == v1::DTYPE_UNSPECIFIED)
      return bad("unknown dtype ", static_cast<int>(c.dtype()));
    uint64_t numel = 1;
    std::vector<int64_t> shape;
    for (int64_t d : c.shape()) {
      if (d < 0) return bad("negative dim in shape ", ir::ShapeText(c.shape()));
      if (d != 0 && numel > std::numeric_limits<int64_t>::max() / static_cast<uint64_t>(d))
        return bad("shape ", ir::ShapeText(c.shape()), " is too large");
      numel *= static_cast<uint64_t>(d);
      shape.push_back(d);
    }
    const uint64_t item = static_cast<uint64_t>(ir::DTypeItemSize(*dt));
    if (numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / item)
      return bad("shape ", ir::ShapeText(c.shape()), " is too large");
    if (declared_ != nullptr) FXDP_RETURN_IF_ERROR(declared_->CheckFirstChunk(c, "", world_size_));
    try {
      c10::InferenceMode guard(false);  // a normal tensor: the program may update it in place
      cur_ = at::empty(shape, at::TensorOptions().dtype(ToTorch(*dt)).device(at::kCPU));
    } catch (const std::exception& e) {
      return absl::ResourceExhaustedError(absl::StrCat("tensor '", name, "': cannot allocate ",
                                                       ir::ShapeText(c.shape()), ": ",
                                                       ExceptionMessage(e)));
    }
    active_ = true;
    name_ = name;
    next_ = 0;
    total_ = numel * item;
  } else {
    if (name != name_)
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' started before tensor '",
                                                     name_, "' was complete (", next_, " of ",
                                                     total_, " bytes)"));
    if (c.offset() != next_) return bad("chunk at offset ", c.offset(), ", expected ", next_);
  }
  const uint64_t n = c.data().size();
  if (n > total_ - next_)
    return bad("chunk [", next_, ", ", next_ + n, ") runs past the tensor's ", total_, " bytes (",
               ir::ShapeText(c.shape()), ")");
  if (n > 0) std::memcpy(static_cast<char*>(cur_.data_ptr()) + next_, c.data().data(), n);
  next_ += n;
  if (next_ == total_) {
    done_.emplace(name_, std::move(cur_));
    cur_ = at::Tensor();
    active_ = false;
    name_.clear();
  }
  return absl::OkStatus();
}

TensorMap TensorAssembler::Take() {
  TensorMap out = std::move(done_);
  done_.clear();
  active_ = false;
  name_.clear();
  cur_ = at::Tensor();
  return out;
}

absl::Status ChunkTensor(const std::string& name, const at::Tensor& t, size_t chunk_bytes,
                         const std::function<bool(v1::TensorChunk&)>& emit) {
  if (!t.defined())
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' is undefined"));
  absl::StatusOr<ir::DType> dt = FromTorch(t.scalar_type());
  if (!dt.ok())
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': ", dt.status().message()));
  if (chunk_bytes == 0) chunk_bytes = kDefaultChunkBytes;
  at::Tensor cpu;
  try {
    c10::InferenceMode guard;
    cpu = t.to(at::kCPU).contiguous();
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("tensor '", name, "': copying to the CPU: ", ExceptionMessage(e)));
  }
  const char* data = static_cast<const char*>(cpu.data_ptr());
  const size_t total = cpu.nbytes();
  size_t off = 0;
  do {
    const size_t n = std::min(chunk_bytes, total - off);
    v1::TensorChunk c;
    c.set_name(name);
    c.set_dtype(static_cast<v1::DType>(ir::DTypeToWire(*dt)));
    for (int64_t d : cpu.sizes()) c.add_shape(d);
    c.set_offset(off);
    if (n > 0) c.set_data(data + off, n);
    if (!emit(c)) return absl::CancelledError("stopped");
    off += n;
  } while (off < total);
  return absl::OkStatus();
}

}  // namespace fxdp::executor
