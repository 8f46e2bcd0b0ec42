// CUDA kernels of the relative-position-bias ops: grid-stride loops over the work items of
// csrc/core/relative_bias.h. Forward: one (query, key) element per thread, its bucket found once
// and written for every head (stores coalesced along the key). Backward: one diagonal sum per
// thread (reads coalesced across neighbouring diagonals), then one output element per thread;
// no atomics, so the gradient is the same on every run.
#include "cuda/kernels.h"
#include "cuda/launch.cuh"

namespace posenc::cuda {
namespace {

struct BucketWork {
  BucketProblem p;
  __device__ void operator()(int64_t w) const { p.item(w); }
};

template <typename T>
struct BiasWork {
  RelativeBiasProblem p;
  __device__ void operator()(int64_t w) const { bias_work_item<T>(p, w); }
};

template <typename T>
struct DiagonalWork {
  RelativeBiasGradProblem p;
  __device__ void operator()(int64_t w) const { diagonal_sum_item<T>(p, w); }
};

template <typename T>
struct BiasGradWork {
  RelativeBiasGradProblem p;
  __device__ void operator()(int64_t w) const { bias_grad_item<T>(p, w); }
};

}  // namespace

void run_bucket(const BucketProblem& p) { launch_grid_stride(BucketWork{p}, p.numel); }

void run_relative_bias(const RelativeBiasProblem& p, ScalarType dtype) {
  dispatch_float_types(dtype, "posenc.relative_bias", [&](auto tag) {
    launch_grid_stride(BiasWork<decltype(tag)>{p}, p.query_length * p.key_length);
  });
}

// Two passes, in order on one stream: diagonal sums, then one output element per thread.
void run_relative_bias_grad(const RelativeBiasGradProblem& p, ScalarType dtype) {
  dispatch_float_types(dtype, "posenc.relative_bias_backward", [&](auto tag) {
    using T = decltype(tag);
    launch_grid_stride(DiagonalWork<T>{p}, p.heads * p.diagonals());
    launch_grid_stride(BiasGradWork<T>{p}, bias_grad_items(p));
  });
}

}  // namespace posenc::cuda
