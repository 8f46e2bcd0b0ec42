// The current CUDA stream of the current device, through the stable ABI (the device is set by the
// kernels' device guard, cuda/register_cuda.cpp). Host code; included by .cu and .cpp files.
#pragma once
#include <cuda_runtime_api.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/macros.h>

namespace posenc::cuda {

inline cudaStream_t current_stream() {
  int device = 0;
  STD_CUDA_CHECK(cudaGetDevice(&device));
  void* stream = nullptr;
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(device, &stream));
  return static_cast<cudaStream_t>(stream);
}

}  // namespace posenc::cuda
