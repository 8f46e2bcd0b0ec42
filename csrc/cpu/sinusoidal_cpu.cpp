// CPU kernels of the sinusoidal ops: rows in parallel; per row one vectorized pass computes the
// sin/cos of every pair, a second writes them in the requested layout (plus x * x_scale).
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <vector>

#include "cpu/kernels.h"

namespace posenc::cpu {
namespace {

// Writes one row: out[first_col(i)] = (x * x_scale) + first[i], out[second_col(i)] = ... + second[i].
template <bool kInterleaved, bool kAdd, typename T, typename M>
void emit_row(T* out, const T* x, int64_t x_stride, M x_scale, const M* first, const M* second, int64_t half,
              int64_t dim) {
  const int64_t step = kInterleaved ? 2 : 1;
  const int64_t other = kInterleaved ? 1 : half;
  for (int64_t i = 0; i < half; ++i) {
    M a = first[i], b = second[i];
    if constexpr (kAdd) {
      a += to_math<M>(x[(i * step) * x_stride]) * x_scale;
      b += to_math<M>(x[(i * step + other) * x_stride]) * x_scale;
    }
    out[i * step] = from_math<T>(a);
    out[i * step + other] = from_math<T>(b);
  }
  if (dim % 2 == 1) {  // odd dim: the last column carries no encoding
    out[dim - 1] = kAdd ? static_cast<T>(static_cast<M>(x[(dim - 1) * x_stride]) * x_scale) : static_cast<T>(0);
  }
}

// Rows [begin, end): per row, one vectorized pass forms sin/cos of every pair, a second writes them.
template <typename T>
POSENC_CPU_CLONES void sinusoidal_rows(const SinusoidalProblem& p, const double* freq, int64_t begin, int64_t end) {
  using M = math_t<T>;
  const SinusoidalParams& prm = p.params;
  const int64_t half = prm.half, dim = prm.dim;
  std::vector<M> sin_buf(half), cos_buf(half);
  const M* first = prm.cos_first ? cos_buf.data() : sin_buf.data();
  const M* second = prm.cos_first ? sin_buf.data() : cos_buf.data();
  const M xs = static_cast<M>(p.x_scale);
  for (int64_t r = begin; r < end; ++r) {
    const int64_t b = r / p.seq, s = r % p.seq;
    sincos_row<M>(p.position(b, s), freq, half, M(1), sin_buf.data(), cos_buf.data());
    T* out = static_cast<T*>(p.out) + b * p.out_stride_b + s * p.out_stride_s;
    const T* x = p.x ? static_cast<const T*>(p.x) + b * p.x_stride_b + s * p.x_stride_s : nullptr;
    if (prm.interleaved) {
      if (!x) emit_row<true, false>(out, x, 1, xs, first, second, half, dim);
      else if (p.x_stride_d == 1) emit_row<true, true>(out, x, 1, xs, first, second, half, dim);
      else emit_row<true, true>(out, x, p.x_stride_d, xs, first, second, half, dim);
    } else {
      if (!x) emit_row<false, false>(out, x, 1, xs, first, second, half, dim);
      else if (p.x_stride_d == 1) emit_row<false, true>(out, x, 1, xs, first, second, half, dim);
      else emit_row<false, true>(out, x, p.x_stride_d, xs, first, second, half, dim);
    }
  }
}

template <typename T>
void run_typed(const SinusoidalProblem& p) {
  std::vector<double> freq(p.params.half);
  for (int64_t i = 0; i < p.params.half; ++i) freq[i] = p.params.frequency(i);
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(p.params.dim, 1));
  at::parallel_for(0, p.batch * p.seq, grain,
                   [&](int64_t begin, int64_t end) { sinusoidal_rows<T>(p, freq.data(), begin, end); });
}

}  // namespace

void run_sinusoidal(const SinusoidalProblem& p, at::ScalarType dtype) {
  dispatch_float_types(dtype, "posenc.sinusoidal", [&](auto tag) { run_typed<decltype(tag)>(p); });
}

}  // namespace posenc::cpu
