// CUDA kernel of the RoPE ops: a grid-stride loop over the work items of csrc/core/rope_chunks.h
// (one (token, chunk) per thread), with 16-byte vectors when every row is aligned.
#include "core/rope_chunks.h"
#include "cuda/kernels.h"
#include "cuda/launch.cuh"

namespace posenc::cuda {
namespace {

template <typename T, int V, bool kInterleaved>
__global__ void rope_kernel(const RopeProblem p, const RopeChunks chunks) {
  const int64_t total = p.batch * p.seq * chunks.per_token();
  for (int64_t w = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; w < total; w += int64_t{gridDim.x} * blockDim.x) {
    rope_work_item<T, V, kInterleaved>(p, chunks, w);
  }
}

template <typename T, int V>
void launch(const RopeProblem& p) {
  const RopeChunks chunks = rope_chunks<V>(p);
  const int64_t work = p.batch * p.seq * chunks.per_token();
  const auto stream = c10::cuda::getCurrentCUDAStream();
  if (p.interleaved) {
    rope_kernel<T, V, true><<<blocks_for(work), kThreads, 0, stream>>>(p, chunks);
  } else {
    rope_kernel<T, V, false><<<blocks_for(work), kThreads, 0, stream>>>(p, chunks);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

void run_rope(const RopeProblem& p, at::ScalarType dtype) {
  dispatch_float_types(dtype, "posenc.rope", [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVec = 16 / sizeof(T);
    if (rope_vector_ok<T, kVec>(p)) {
      launch<T, kVec>(p);
    } else {
      launch<T, 1>(p);
    }
  });
}

}  // namespace posenc::cuda
