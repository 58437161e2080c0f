// safetensors files (https://github.com/huggingface/safetensors), torch-free:
//
//   8 bytes      little-endian u64 N, the header length
//   N bytes      JSON: {"name": {"dtype": "F32", "shape": [2, 3],
//                "data_offsets": [begin, end]}, ..., "__metadata__": {str: str}}
//                (may be padded with trailing spaces)
//   rest         the data buffer; offsets are relative to its start, tensors
//                are row-major little-endian, and together cover it exactly
//
// dtypes: F64 F32 F16 BF16 F8_E4M3 F8_E5M2 I64 I32 I16 I8 U64 U32 U16 U8 BOOL
// C64 (DTypeSafetensorsName: the one table of these names). Parsing checks everything
// a corrupt or truncated file could get wrong (header length, JSON, dtype
// names, shapes, offsets against sizes, overlap, gaps) and says which tensor
// and what; it never reads out of bounds. Serializing puts tensors in name
// order and pads the header to a multiple of 8 bytes (as the Python library
// does). The executor wraps this for LibTorch tensors (executor/safetensors.h);
// the CLI reads and writes raw bytes with it.
#ifndef FXDP_ANALYSIS_IR_SAFETENSORS_H_
#define FXDP_ANALYSIS_IR_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "analysis/ir/raw_tensor.h"
#include "analysis/ir/types.h"
#include "util/data_roots.h"
#include "util/files.h"

namespace fxdp::ir {

// safetensors' name of a dtype ("F32", "BF16", "F8_E4M3"); "" for one it
// cannot name (complex32, complex128).
absl::string_view DTypeSafetensorsName(DType d);
absl::StatusOr<DType> DTypeFromSafetensorsName(absl::string_view s);

// The header is limited like the reference implementation (100 MB).
inline constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

// One tensor of a parsed file: its bytes are data.substr(begin, end - begin)
// of SafetensorsView::data.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

// A checked header over the caller's bytes (not copied: `data` points into
// them).
struct SafetensorsView {
  std::vector<SafetensorsEntry> tensors;  // in data order
  std::map<std::string, std::string> metadata;
  absl::string_view data;  // empty from ParseSafetensorsHeader
  uint64_t data_size = 0;  // the data buffer's length
};

// INVALID_ARGUMENT "corrupt safetensors data: ..." (or "... not a safetensors
// file ...") naming the tensor and what is wrong; UNIMPLEMENTED for a dtype
// fxdp does not know.
absl::StatusOr<SafetensorsView> ParseSafetensors(absl::string_view bytes);
// The tensors, copied out, in data order.
absl::StatusOr<std::vector<RawTensor>> ParseSafetensorsTensors(absl::string_view bytes);

// The header alone, for reading a file piece by piece: `first8` holds the
// file's first 8 bytes; the header's length (checked against the limit and
// the file's size).
absl::StatusOr<uint64_t> SafetensorsHeaderLength(absl::string_view first8, uint64_t file_size);
// `prefix` holds at least the file's first 8 + header length bytes: the
// checks of ParseSafetensors, offsets against the file's data size; `data`
// stays empty (SafetensorsView::data_size says how long it is).
absl::StatusOr<SafetensorsView> ParseSafetensorsHeader(absl::string_view prefix,
                                                       uint64_t file_size);

// A tensor to serialize: its bytes are the caller's.
struct TensorBytes {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  absl::string_view data;  // row-major little-endian, numel * item size bytes
};

// INVALID_ARGUMENT naming the tensor for a dtype safetensors cannot name,
// data of the wrong size, a tensor named __metadata__ or a name twice.
absl::StatusOr<std::string> SerializeSafetensors(
    std::vector<TensorBytes> tensors, const std::map<std::string, std::string>& metadata = {});
absl::StatusOr<std::string> SerializeSafetensors(const std::vector<RawTensor>& tensors);
// What SerializeSafetensors writes before the tensors' bytes (the 8-byte
// length and the JSON header), for a writer that streams each tensor's
// bytes after it: `tensors` sorted by name (the order their bytes follow),
// their total in `data_bytes`. The same errors.
absl::StatusOr<std::string> SafetensorsHeader(std::vector<TensorBytes>* tensors,
                                              const std::map<std::string, std::string>& metadata,
                                              uint64_t* data_bytes);

// Files. The largest file read unless told otherwise (64 GiB).
inline constexpr uint64_t kMaxSafetensorsFile = uint64_t{64} << 30;

struct SafetensorsReadOptions {
  // Set: the file is opened beneath these roots (util::DataRoots::OpenFile:
  // no link followed, exclusions refused), e.g. a job's data_paths on a
  // worker. Not set: a file the operator named (fxdp-worker run's own).
  const util::DataRoots* roots = nullptr;
  uint64_t max_bytes = kMaxSafetensorsFile;
};

// The bytes of a safetensors file, unparsed: regular files only
// (util::ReadRegularFile: no directories, FIFOs or devices; the size checked
// before reading). Errors name `path` as given.
absl::StatusOr<std::string> ReadSafetensorsBytes(const std::string& path,
                                                 const SafetensorsReadOptions& options = {});
// Read and parsed (errors start with "'PATH': ").
absl::StatusOr<std::vector<RawTensor>> ReadSafetensorsFile(
    const std::string& path, const SafetensorsReadOptions& options = {});
// A safetensors file read piece by piece: Open reads and checks the header
// only (the open and size checks of ReadSafetensorsBytes; parse errors start
// with "'PATH': "), Read copies bytes of the data buffer where the caller
// wants them, so a reader that keeps part of each tensor (a FULLY_SHARD
// rank's slices) or builds its own tensors never holds the whole file.
class SafetensorsReader {
 public:
  static absl::StatusOr<SafetensorsReader> Open(const std::string& path,
                                                const SafetensorsReadOptions& options = {});
  const SafetensorsView& header() const { return header_; }
  // Bytes [begin, begin + n) of the data buffer (offsets as in
  // SafetensorsEntry) into `dest`; DATA_LOSS if the file shrank.
  absl::Status Read(uint64_t begin, uint64_t n, void* dest) const;

 private:
  SafetensorsReader(util::RegularFile file, SafetensorsView header, uint64_t data_begin)
      : file_(std::move(file)), header_(std::move(header)), data_begin_(data_begin) {}
  util::RegularFile file_;
  SafetensorsView header_;
  uint64_t data_begin_ = 0;
};

// Serialized and written through a temporary file (util::WriteFileAtomically).
absl::Status WriteSafetensorsFile(const std::string& path, const std::vector<RawTensor>& tensors);

}  // namespace fxdp::ir

#endif  // FXDP_ANALYSIS_IR_SAFETENSORS_H_
