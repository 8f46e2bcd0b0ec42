// CUDA helpers shared by the kernels: grid sizing (vector access is in csrc/core/rope_chunks.h).
#pragma once
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

namespace posenc::cuda {

constexpr int kThreads = 256;

// Enough blocks to cover `work` items once, capped (kernels loop grid-stride over the rest).
inline unsigned int blocks_for(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min<int64_t>(blocks, int64_t{1} << 20)));
}

}  // namespace posenc::cuda
