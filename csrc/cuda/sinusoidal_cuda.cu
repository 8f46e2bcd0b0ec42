// CUDA kernel of the sinusoidal ops: a grid-stride loop over the work items of csrc/core/sinusoidal.h
// (one (row, pair) per thread).
#include "cuda/kernels.h"
#include "cuda/launch.cuh"

namespace posenc::cuda {
namespace {

template <typename T>
__global__ void sinusoidal_kernel(const SinusoidalProblem p) {
  const int64_t total = sinusoidal_work_items(p);
  for (int64_t w = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; w < total; w += int64_t{gridDim.x} * blockDim.x) {
    sinusoidal_work_item<T>(p, w);
  }
}

}  // namespace

void run_sinusoidal(const SinusoidalProblem& p, at::ScalarType dtype) {
  const auto stream = c10::cuda::getCurrentCUDAStream();
  dispatch_float_types(dtype, "posenc.sinusoidal", [&](auto tag) {
    using T = decltype(tag);
    sinusoidal_kernel<T><<<blocks_for(sinusoidal_work_items(p)), kThreads, 0, stream>>>(p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace posenc::cuda
