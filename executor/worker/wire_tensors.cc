#include "executor/worker/wire_tensors.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "executor/torch_types.h"
#include "util/status_macros.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the wire's tensor bytes are little-endian; this host is not");

namespace fxdp::executor {

absl::Status TensorAssembler::Add(const v1::TensorChunk& c) {
  FXDP_ASSIGN_OR_RETURN(const ir::ChunkPlace place, check_.Add(c));
  const ir::ChunkedTensor& t = check_.current();
  if (place.starts) {
    try {
      c10::InferenceMode guard(false);  // a normal tensor: the program may update it in place
      cur_ = at::empty(t.shape, at::TensorOptions().dtype(ToTorch(t.dtype)).device(at::kCPU));
    } catch (const std::exception& e) {
      cur_ = at::Tensor();
      return absl::ResourceExhaustedError(absl::StrCat("tensor '", t.name, "': cannot allocate ",
                                                       ir::WireTypeText(c.dtype(), t.shape), ": ",
                                                       ExceptionMessage(e)));
    }
  }
  if (!cur_.defined()) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor '", t.name, "': a chunk after its memory could not be allocated"));
  }
  if (!c.data().empty()) {
    std::memcpy(static_cast<char*>(cur_.data_ptr()) + c.offset(), c.data().data(), c.data().size());
  }
  if (place.completes) done_.emplace(t.name, std::exchange(cur_, at::Tensor()));
  return absl::OkStatus();
}

TensorMap TensorAssembler::Take() {
  TensorMap out = std::move(done_);
  done_.clear();
  check_.Reset();
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
  for (const auto& [off, n] : ir::ChunkSpans(cpu.nbytes(), chunk_bytes)) {
    v1::TensorChunk c;
    c.set_name(name);
    c.set_dtype(static_cast<v1::DType>(ir::DTypeToWire(*dt)));
    for (int64_t d : cpu.sizes()) c.add_shape(d);
    c.set_offset(off);
    if (n > 0) c.set_data(data + off, n);
    if (!emit(c)) return absl::CancelledError("stopped");
  }
  return absl::OkStatus();
}

}  // namespace fxdp::executor
