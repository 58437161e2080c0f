// StateReader: a job's final state read out chunk by chunk for FetchState,
// never whole: from the state kept in memory (shared, not copied) or from its
// safetensors file in --state-dir (ir::SafetensorsReader: the header at
// Open, then only the bytes of the chunk asked for). A call to FetchState
// holds one chunk of the state, whatever the state's size. No gRPC here.
#ifndef FXDP_SERVER_JOBS_STATE_READER_H_
#define FXDP_SERVER_JOBS_STATE_READER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/fxdp/v1/worker.pb.h"
#include "server/jobs/state_store.h"

namespace fxdp::ir {
class SafetensorsReader;  // analysis/ir/safetensors.h
}  // namespace fxdp::ir

namespace fxdp::server {

class StateReader {
 public:
  // The state kept in memory (StateStore::State: each tensor's chunks in order).
  explicit StateReader(std::shared_ptr<const StateStore::State> kept);
  // The state in a safetensors file (DATA_LOSS naming the file when it cannot
  // be opened or its header is corrupt).
  static absl::StatusOr<StateReader> OpenFile(const std::string& path);
  StateReader(StateReader&&) noexcept;
  StateReader& operator=(StateReader&&) noexcept;
  ~StateReader();

  // The next chunk, of at most `max_bytes` data bytes (a tensor of 0 bytes
  // is one empty chunk), into `out`; false once the state is done. DATA_LOSS
  // naming the file when it cannot be read.
  absl::StatusOr<bool> Next(size_t max_bytes, v1::TensorChunk* out);
  // Whether everything has been read (the last Next's chunk was the last).
  bool done() const;

 private:
  explicit StateReader(std::unique_ptr<ir::SafetensorsReader> file);
  // Pieces of the state: the kept chunks, or the file's tensors.
  size_t pieces() const;
  // Bytes of piece `i`.
  uint64_t PieceBytes(size_t i) const;

  std::shared_ptr<const StateStore::State> kept_;
  std::unique_ptr<ir::SafetensorsReader> file_;
  size_t piece_ = 0;  // the piece being read
  uint64_t at_ = 0;   // bytes of it already read
};

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_STATE_READER_H_
