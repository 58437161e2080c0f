# LibTorch from the torch wheel in .venv, plus include hygiene. Included from
# the top-level CMakeLists after Protobuf and gRPC are found (the wheel's
# Caffe2Config otherwise defines protobuf::libprotobuf as an empty target).
# Provides the INTERFACE target fxdp_torch; only executor/ and its tests use it.
execute_process(
  COMMAND ${FXDP_PYTHON} -c "import torch; print(torch.utils.cmake_prefix_path)"
  OUTPUT_VARIABLE FXDP_TORCH_PREFIX OUTPUT_STRIP_TRAILING_WHITESPACE
  RESULT_VARIABLE rc ERROR_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "fxdp: cannot import torch with ${FXDP_PYTHON}; run scripts/setup.sh "
                      "(or configure with -DFXDP_WITH_TORCH=OFF)")
endif()
list(APPEND CMAKE_PREFIX_PATH ${FXDP_TORCH_PREFIX})
find_package(Torch REQUIRED)  # after Protobuf/gRPC (top-level CMakeLists)
message(STATUS "fxdp: LibTorch ${Torch_VERSION} from ${FXDP_TORCH_PREFIX}")

# Include hygiene for TUs that see both torch and protobuf: the wheel ships
# protobuf 3.13 headers in torch/include/google/protobuf, and torch/include is
# an -isystem path searched before /usr/include. A symlink-only -I directory
# makes the system protobuf (the one gRPC and our .pb.h use) win.
set(FXDP_SYSPROTO ${CMAKE_BINARY_DIR}/sysproto-include)
file(MAKE_DIRECTORY ${FXDP_SYSPROTO}/google)
file(CREATE_LINK ${Protobuf_INCLUDE_DIR}/google/protobuf ${FXDP_SYSPROTO}/google/protobuf SYMBOLIC)
add_library(fxdp_torch INTERFACE)
target_include_directories(fxdp_torch BEFORE INTERFACE ${FXDP_SYSPROTO})
target_include_directories(fxdp_torch SYSTEM INTERFACE ${CMAKE_SOURCE_DIR}/third_party/gloo-shim)
target_link_libraries(fxdp_torch INTERFACE torch)

