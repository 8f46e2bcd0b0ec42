# Locate torch's headers and libraries without torch's own CMake package: its CUDA part probes for
# libraries (nvrtc, cuBLAS) that a bare CUDA toolkit lacks, and we only need the stable ABI.
# Input: POSENC_TORCH_ROOT (optional), POSENC_TORCH_TARGET. Output: POSENC_TORCH_ROOT,
# POSENC_TORCH_VERSION, POSENC_TORCH_CUDA_VERSION (empty for a CPU build), targets posenc::stable
# (the stable-ABI headers, TORCH_TARGET_VERSION, libtorch_cpu) and posenc::stable_cuda (libtorch_cuda).
if(NOT POSENC_TORCH_ROOT)
  find_package(Python COMPONENTS Interpreter REQUIRED)
  execute_process(
    COMMAND ${Python_EXECUTABLE} -c
      "import os, torch; print(os.path.dirname(torch.__file__)); print(torch.version.cuda or ''); print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
    OUTPUT_VARIABLE _posenc_torch_out OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _posenc_torch_rc)
  if(NOT _posenc_torch_rc EQUAL 0)
    message(FATAL_ERROR "posenc: could not import torch with ${Python_EXECUTABLE}. Install torch first "
                        "(pip install --no-build-isolation needs it) or pass -DPOSENC_TORCH_ROOT=/path/to/libtorch.")
  endif()
  string(REPLACE "\n" ";" _posenc_torch_out "${_posenc_torch_out}")
  list(GET _posenc_torch_out 0 _root)
  list(GET _posenc_torch_out 1 _cuda)
  list(GET _posenc_torch_out 2 _abi)
  set(POSENC_TORCH_ROOT "${_root}" CACHE PATH "" FORCE)
  set(POSENC_TORCH_CUDA_VERSION "${_cuda}" CACHE INTERNAL "CUDA version torch was built with")
  set(POSENC_CXX11_ABI "${_abi}" CACHE INTERNAL "torch's _GLIBCXX_USE_CXX11_ABI")
endif()
if(NOT DEFINED POSENC_CXX11_ABI)
  set(POSENC_CXX11_ABI 1)   # every torch >= 2.7 is built with the C++11 ABI
endif()

set(_ver_h "${POSENC_TORCH_ROOT}/include/torch/headeronly/version.h")
if(NOT EXISTS "${_ver_h}")
  set(_ver_h "${POSENC_TORCH_ROOT}/include/torch/csrc/api/include/torch/version.h")
endif()
if(NOT EXISTS "${_ver_h}")
  message(FATAL_ERROR "posenc: ${POSENC_TORCH_ROOT} does not look like torch (no include/torch/.../version.h)")
endif()
file(STRINGS "${_ver_h}" _lines REGEX "define TORCH_VERSION_(MAJOR|MINOR|PATCH) ")
string(REGEX REPLACE ".*MAJOR ([0-9]+).*MINOR ([0-9]+).*PATCH ([0-9]+).*" "\\1.\\2.\\3" POSENC_TORCH_VERSION "${_lines}")

# The stable-ABI target: TORCH_TARGET_VERSION (torch/csrc/stable/version.h) hides every API newer
# than POSENC_TORCH_TARGET, so the libraries use only what that torch already has.
if(NOT POSENC_TORCH_TARGET MATCHES "^([0-9]+)\\.([0-9]+)$")
  message(FATAL_ERROR "posenc: POSENC_TORCH_TARGET must be major.minor (e.g. 2.11), got '${POSENC_TORCH_TARGET}'")
endif()
math(EXPR _major "${CMAKE_MATCH_1}")
math(EXPR _minor "${CMAKE_MATCH_2}")
math(EXPR POSENC_TORCH_TARGET_VERSION "(${_major} << 56) | (${_minor} << 48)" OUTPUT_FORMAT HEXADECIMAL)  # 2.11: 0x20b000000000000
if(POSENC_TORCH_VERSION VERSION_LESS POSENC_TORCH_TARGET)
  message(FATAL_ERROR "posenc: torch ${POSENC_TORCH_VERSION} is older than POSENC_TORCH_TARGET ${POSENC_TORCH_TARGET}")
endif()

set(_lib "${POSENC_TORCH_ROOT}/lib")
add_library(posenc::stable INTERFACE IMPORTED)
target_include_directories(posenc::stable INTERFACE "${POSENC_TORCH_ROOT}/include")
target_link_libraries(posenc::stable INTERFACE "${_lib}/libtorch_cpu.so")
target_compile_definitions(posenc::stable INTERFACE _GLIBCXX_USE_CXX11_ABI=${POSENC_CXX11_ABI}
  TORCH_TARGET_VERSION=${POSENC_TORCH_TARGET_VERSION})

set(POSENC_TORCH_HAS_CUDA OFF)
if(EXISTS "${_lib}/libtorch_cuda.so")
  set(POSENC_TORCH_HAS_CUDA ON)
  # The CUDA shims (current stream, aoti_torch_get_current_cuda_stream) are declared under USE_CUDA.
  add_library(posenc::stable_cuda INTERFACE IMPORTED)
  target_link_libraries(posenc::stable_cuda INTERFACE posenc::stable "${_lib}/libtorch_cuda.so")
  target_compile_definitions(posenc::stable_cuda INTERFACE USE_CUDA)
endif()
message(STATUS "posenc: torch ${POSENC_TORCH_VERSION} at ${POSENC_TORCH_ROOT} (CUDA build: ${POSENC_TORCH_HAS_CUDA}, "
               "stable-ABI target ${POSENC_TORCH_TARGET} = ${POSENC_TORCH_TARGET_VERSION})")
