// A tensor as bytes, without LibTorch: what the CLI reads from safetensors
// files and the server receives, slices and forwards in chunks.
#ifndef FXDP_ANALYSIS_IR_RAW_TENSOR_H_
#define FXDP_ANALYSIS_IR_RAW_TENSOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "analysis/ir/types.h"

namespace fxdp::ir {

struct RawTensor {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::string data;  // row-major little-endian, numel * item size bytes
};

}  // namespace fxdp::ir

#endif  // FXDP_ANALYSIS_IR_RAW_TENSOR_H_
