// CUDA helpers shared by the kernels: grid sizing and the grid-stride kernel (vector access is in csrc/core/rope_chunks.h).
#pragma once
#include <algorithm>
#include <cstdint>

#include "cuda/stream.h"

namespace posenc::cuda {

constexpr int kThreads = 256;

// Enough blocks to cover `work` items once, capped (kernels loop grid-stride over the rest).
inline unsigned int blocks_for(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min<int64_t>(blocks, int64_t{1} << 20)));
}

// The one kernel shape: a grid-stride loop calling work(w) for every item w < total. Each op supplies
// its work as a small functor over a csrc/core work item, so the thread mapping is written once.
template <typename Work>
__global__ void grid_stride_kernel(const Work work, int64_t total) {
  for (int64_t w = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; w < total; w += int64_t{gridDim.x} * blockDim.x) {
    work(w);
  }
}

// Launches grid_stride_kernel on the current stream and checks the launch.
template <typename Work>
void launch_grid_stride(const Work& work, int64_t total) {
  grid_stride_kernel<<<blocks_for(total), kThreads, 0, current_stream()>>>(work, total);
  STD_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace posenc::cuda
