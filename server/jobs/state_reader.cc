#include "server/jobs/state_reader.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "analysis/ir/safetensors.h"
#include "analysis/ir/types.h"

namespace fxdp::server {

StateReader::StateReader(std::shared_ptr<const StateStore::State> kept) : kept_(std::move(kept)) {}
StateReader::StateReader(std::unique_ptr<ir::SafetensorsReader> file) : file_(std::move(file)) {}
StateReader::StateReader(StateReader&&) noexcept = default;
StateReader& StateReader::operator=(StateReader&&) noexcept = default;
StateReader::~StateReader() = default;

absl::StatusOr<StateReader> StateReader::OpenFile(const std::string& path) {
  absl::StatusOr<ir::SafetensorsReader> file = ir::SafetensorsReader::Open(path);
  if (!file.ok()) return absl::DataLossError(std::string(file.status().message()));
  return StateReader(std::make_unique<ir::SafetensorsReader>(*std::move(file)));
}

size_t StateReader::pieces() const {
  return file_ ? file_->header().tensors.size() : kept_->size();
}

uint64_t StateReader::PieceBytes(size_t i) const {
  if (file_) {
    const ir::SafetensorsEntry& e = file_->header().tensors[i];
    return e.end - e.begin;
  }
  return (*kept_)[i].data().size();
}

bool StateReader::done() const { return piece_ >= pieces(); }

absl::StatusOr<bool> StateReader::Next(size_t max_bytes, v1::TensorChunk* out) {
  if (done()) return false;
  max_bytes = std::max<size_t>(max_bytes, 1);
  const uint64_t total = PieceBytes(piece_);
  const uint64_t n = std::min<uint64_t>(max_bytes, total - at_);
  out->Clear();
  if (file_) {
    const ir::SafetensorsEntry& e = file_->header().tensors[piece_];
    out->set_name(e.name);
    out->set_dtype(static_cast<v1::DType>(ir::DTypeToWire(e.dtype)));
    for (int64_t d : e.shape) out->add_shape(d);
    out->set_offset(at_);
    std::string* data = out->mutable_data();
    data->resize(n);
    if (absl::Status s = file_->Read(e.begin + at_, n, data->data()); !s.ok()) {
      return absl::DataLossError(
          absl::StrCat("reading tensor '", e.name, "' of the final state: ", s.message()));
    }
  } else {
    const v1::TensorChunk& c = (*kept_)[piece_];
    out->set_name(c.name());
    out->set_dtype(c.dtype());
    *out->mutable_shape() = c.shape();
    out->set_offset(c.offset() + at_);
    out->set_data(c.data().substr(at_, n));
  }
  at_ += n;
  if (at_ >= total) {
    ++piece_;
    at_ = 0;
  }
  return true;
}

}  // namespace fxdp::server
