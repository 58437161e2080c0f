# LibTorch, plus include hygiene. Included from the top-level CMakeLists after
# Protobuf (and gRPC) are found (the wheel's Caffe2Config otherwise defines
# protobuf::libprotobuf as an empty target). Provides the INTERFACE target
# fxdp_torch; only executor/ and its tests use it.
#
# Two ways to find it:
#  - default: the torch of FXDP_PYTHON (.venv), through its TorchConfig.cmake;
#  - FXDP_TORCH_DIR=<a torch package folder> (the one holding include/, lib/
#    and share/cmake; `python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))'`):
#    its headers and libraries directly, no Python and no TorchConfig. A CUDA
#    wheel's TorchConfig insists on a complete CUDA toolkit layout (nvrtc,
#    CUDA_TOOLKIT_ROOT_DIR) that a C++ program calling only LibTorch's API does
#    not need (seen with torch 2.11.0+cu130: "Your installed Caffe2 version
#    uses CUDA but I cannot find the CUDA libraries"). scripts/gpu_check.sh
#    builds this way (docs/gpu.md).
set(FXDP_TORCH_DIR "" CACHE PATH
    "A torch package folder (include/, lib/) to build against instead of FXDP_PYTHON's torch")
# OFF: CPU only, for a machine without the CUDA libraries libtorch_cuda needs
# (the dry run of scripts/gpu_check.sh).
set(FXDP_TORCH_CUDA "AUTO" CACHE STRING
    "With FXDP_TORCH_DIR: link libtorch_cuda (AUTO: when the folder has it; ON; OFF)")

if(FXDP_TORCH_DIR)
  set(_t ${FXDP_TORCH_DIR})
  foreach(f include/ATen/ATen.h lib/libc10.so lib/libtorch_cpu.so)
    if(NOT EXISTS ${_t}/${f})
      message(FATAL_ERROR "fxdp: FXDP_TORCH_DIR=${_t} is not a torch package folder: no ${f}")
    endif()
  endforeach()
  # TORCH_VERSION_* : torch/headeronly/version.h since 2.9, torch/version.h before.
  set(_vh ${_t}/include/torch/headeronly/version.h)
  if(NOT EXISTS ${_vh})
    set(_vh ${_t}/include/torch/csrc/api/include/torch/version.h)
  endif()
  file(STRINGS ${_vh} _v
       REGEX "#define TORCH_VERSION_(MAJOR|MINOR|PATCH) ")
  string(REGEX REPLACE ".*MAJOR ([0-9]+).*MINOR ([0-9]+).*PATCH ([0-9]+).*" "\\1.\\2.\\3"
         Torch_VERSION "${_v}")
  add_library(fxdp_torch_libs INTERFACE)
  target_include_directories(fxdp_torch_libs SYSTEM INTERFACE ${_t}/include
                             ${_t}/include/torch/csrc/api/include)
  # What the wheel's Caffe2Targets put on torch_cpu (ProcessGroupGloo.hpp is
  # guarded by USE_C10D_GLOO).
  target_compile_definitions(fxdp_torch_libs INTERFACE USE_DISTRIBUTED USE_C10D_GLOO)
  set(_libs ${_t}/lib/libtorch_cpu.so ${_t}/lib/libc10.so)
  if(EXISTS ${_t}/lib/libtorch_cuda.so AND NOT FXDP_TORCH_CUDA STREQUAL "OFF")
    # libtorch_cuda registers the CUDA kernels and hooks from static
    # initializers: linked even though no symbol of it is referenced.
    set(_libs "-Wl,--no-as-needed" ${_t}/lib/libtorch_cuda.so ${_t}/lib/libc10_cuda.so
              "-Wl,--as-needed" ${_libs})
    set(_cuda "with libtorch_cuda")
  elseif(FXDP_TORCH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "fxdp: FXDP_TORCH_CUDA=ON but ${_t}/lib has no libtorch_cuda.so")
  else()
    set(_cuda "CPU only")
  endif()
  target_link_libraries(fxdp_torch_libs INTERFACE ${_libs} Threads::Threads)
  # The wheel's libraries find their own dependencies (libgomp, the nvidia-*
  # wheels' CUDA libraries) through their RPATH ($ORIGIN/...); the linker
  # looks for them the same way, and the program finds torch through this.
  # --allow-shlib-undefined: a library those are not found for at link time
  # (cuDNN on a machine without it) leaves a warning, not an error; the
  # program still needs them where it runs.
  set_property(TARGET fxdp_torch_libs APPEND PROPERTY INTERFACE_LINK_OPTIONS
               "LINKER:-rpath,${_t}/lib" "LINKER:--allow-shlib-undefined")
  set(FXDP_TORCH_PREFIX ${_t})
  message(STATUS "fxdp: LibTorch ${Torch_VERSION} from FXDP_TORCH_DIR=${_t} (${_cuda})")
else()
  execute_process(
    COMMAND ${FXDP_PYTHON} -c "import torch; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE FXDP_TORCH_PREFIX OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE rc ERROR_QUIET)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "fxdp: cannot import torch with ${FXDP_PYTHON}; run scripts/setup.sh "
                        "(or configure with -DFXDP_WITH_TORCH=OFF or -DFXDP_TORCH_DIR=...)")
  endif()
  list(APPEND CMAKE_PREFIX_PATH ${FXDP_TORCH_PREFIX})
  find_package(Torch REQUIRED)  # after Protobuf/gRPC (top-level CMakeLists)
  message(STATUS "fxdp: LibTorch ${Torch_VERSION} from ${FXDP_TORCH_PREFIX}")
endif()

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
if(FXDP_TORCH_DIR)
  target_link_libraries(fxdp_torch INTERFACE fxdp_torch_libs)
else()
  target_link_libraries(fxdp_torch INTERFACE torch)
endif()
