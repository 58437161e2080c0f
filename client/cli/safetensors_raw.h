// A torch-free safetensors reader/writer for the CLI: tensors as raw bytes.
//   8 bytes      little-endian u64 N
//   N bytes      JSON: {"name": {"dtype": "F32", "shape": [2, 3],
//                "data_offsets": [begin, end]}, ..., "__metadata__": {...}}
//   rest         the tensors' bytes (offsets relative to the end of the header)
// The dtype names are safetensors' (F64 F32 F16 BF16 F8_E4M3 F8_E5M2 I64 I32
// I16 I8 U64 U32 U16 U8 BOOL C64); DTypeToProto/DTypeFromProto map them to
// fxdp.v1.DType.
#ifndef FXDP_CLIENT_CLI_SAFETENSORS_RAW_H_
#define FXDP_CLIENT_CLI_SAFETENSORS_RAW_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/fxdp/v1/graph.pb.h"

namespace fxdp::cli {

struct RawTensor {
  std::string name;
  std::string dtype;  // safetensors name, e.g. "F32"
  std::vector<int64_t> shape;
  std::string data;   // row-major little-endian bytes
};

// Tensors in the file's data order.
absl::StatusOr<std::vector<RawTensor>> ReadSafetensors(const std::string& path);
// Tensors sorted by name; checks each tensor's byte size against dtype x shape.
absl::Status WriteSafetensors(const std::string& path, const std::vector<RawTensor>& tensors);

// DTYPE_UNSPECIFIED for an unknown name; "" for an unknown DType.
v1::DType DTypeToProto(const std::string& name);
std::string DTypeFromProto(v1::DType d);
// Bytes per element (0: unknown).
int64_t DTypeItemSize(const std::string& name);

}  // namespace fxdp::cli

#endif  // FXDP_CLIENT_CLI_SAFETENSORS_RAW_H_
