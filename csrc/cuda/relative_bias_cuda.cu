// CUDA kernels of the relative-position-bias ops: grid-stride loops over the work items of
// csrc/core/relative_bias.h. Forward: one (query, key) element per thread, its bucket found once
// and written for every head (stores coalesced along the key). Backward: one diagonal sum per
// thread (reads coalesced across neighbouring diagonals), then one output element per thread;
// no atomics, so the gradient is the same on every run.
#include "cuda/kernels.h"
#include "cuda/launch.cuh"

namespace posenc::cuda {
namespace {

__global__ void bucket_kernel(const BucketProblem p) {
  for (int64_t w = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; w < p.numel; w += int64_t{gridDim.x} * blockDim.x) {
    p.item(w);
  }
}

template <typename T>
__global__ void bias_kernel(const RelativeBiasProblem p) {
  const int64_t total = p.query_length * p.key_length;
  for (int64_t w = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; w < total; w += int64_t{gridDim.x} * blockDim.x) {
    bias_work_item<T>(p, w);
  }
}

template <typename T>
__global__ void diagonal_kernel(const RelativeBiasGradProblem p) {
  const int64_t total = p.heads * p.diagonals();
  for (int64_t w = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; w < total; w += int64_t{gridDim.x} * blockDim.x) {
    diagonal_sum_item<T>(p, w);
  }
}

template <typename T>
__global__ void bias_grad_kernel(const RelativeBiasGradProblem p) {
  const int64_t total = bias_grad_items(p);
  for (int64_t w = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; w < total; w += int64_t{gridDim.x} * blockDim.x) {
    bias_grad_item<T>(p, w);
  }
}

}  // namespace

void run_bucket(const BucketProblem& p) {
  bucket_kernel<<<blocks_for(p.numel), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void run_relative_bias(const RelativeBiasProblem& p, at::ScalarType dtype) {
  const auto stream = c10::cuda::getCurrentCUDAStream();
  dispatch_float_types(dtype, "posenc.relative_bias", [&](auto tag) {
    using T = decltype(tag);
    bias_kernel<T><<<blocks_for(p.query_length * p.key_length), kThreads, 0, stream>>>(p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void run_relative_bias_grad(const RelativeBiasGradProblem& p, at::ScalarType dtype) {
  const auto stream = c10::cuda::getCurrentCUDAStream();
  dispatch_float_types(dtype, "posenc.relative_bias_backward", [&](auto tag) {
    using T = decltype(tag);
    diagonal_kernel<T><<<blocks_for(p.heads * p.diagonals()), kThreads, 0, stream>>>(p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    bias_grad_kernel<T><<<blocks_for(bias_grad_items(p)), kThreads, 0, stream>>>(p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace posenc::cuda
