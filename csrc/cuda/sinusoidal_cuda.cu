// CUDA kernels of the sinusoidal ops: one thread per (row, pair); the math is csrc/core's.
#include "cuda/kernels.h"
#include "cuda/launch.cuh"

namespace posenc::cuda {
namespace {

// Work item (row, i): i < half writes one sin/cos pair; i == half is the zero column of an odd dim.
template <typename T>
__global__ void sinusoidal_kernel(const SinusoidalProblem p) {
  using M = math_t<T>;
  const SinusoidalParams& prm = p.params;
  const int64_t per_row = prm.half + (prm.dim & 1);
  const int64_t total = p.batch * p.seq * per_row;
  const M x_scale = static_cast<M>(p.x_scale);
  for (int64_t w = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; w < total; w += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = w / per_row, i = w % per_row;
    const int64_t b = row / p.seq, s = row % p.seq;
    T* out = static_cast<T*>(p.out) + b * p.out_stride_b + s * p.out_stride_s;
    const T* x = p.x ? static_cast<const T*>(p.x) + b * p.x_stride_b + s * p.x_stride_s : nullptr;
    const auto x_at = [&](int64_t col) { return x ? static_cast<M>(x[col * p.x_stride_d]) * x_scale : M(0); };
    if (i == prm.half) {
      out[prm.dim - 1] = static_cast<T>(x_at(prm.dim - 1));
      continue;
    }
    M sn, cs;
    sincos_of<M>(p.position(b, s) * prm.frequency(i), sn, cs);
    const int64_t sc = prm.sin_col(i), cc = prm.cos_col(i);
    out[sc] = static_cast<T>(x_at(sc) + sn);
    out[cc] = static_cast<T>(x_at(cc) + cs);
  }
}

}  // namespace

void run_sinusoidal(const SinusoidalProblem& p, at::ScalarType dtype) {
  const int64_t work = p.batch * p.seq * (p.params.half + (p.params.dim & 1));
  const auto stream = c10::cuda::getCurrentCUDAStream();
  dispatch_float_types(dtype, "posenc.sinusoidal", [&](auto tag) {
    using T = decltype(tag);
    sinusoidal_kernel<T><<<blocks_for(work), kThreads, 0, stream>>>(p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace posenc::cuda
