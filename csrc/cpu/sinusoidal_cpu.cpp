// CPU kernels of the sinusoidal ops: rows in parallel; per row one vectorized pass computes the
// sin/cos of every pair, a second writes them in the requested layout (plus x * x_scale).
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <cmath>
#include <vector>

#include "cpu/kernels.h"

namespace posenc::cpu {
namespace {

// Writes one encoding row in the requested layout: out[first_col(i)] = first[i], out[second_col(i)] =
// second[i], and a zero last column for odd dims. first/second are float64 (the recurrence state)
// or the math type (a directly computed row).
template <bool kInterleaved, typename T, typename S>
void write_encoding(T* __restrict__ out, const S* first, const S* second, int64_t half, int64_t dim) {
  using M = math_t<T>;
  const int64_t step = kInterleaved ? 2 : 1;
  const int64_t other = kInterleaved ? 1 : half;
  for (int64_t i = 0; i < half; ++i) {
    out[i * step] = from_math<T>(static_cast<M>(first[i]));
    out[i * step + other] = from_math<T>(static_cast<M>(second[i]));
  }
  if (dim % 2 == 1) out[dim - 1] = T(0);
}

// out = x * x_scale + pe, one row.
template <typename T, typename M>
void add_encoding(T* __restrict__ out, const T* x, int64_t x_stride, M x_scale, const M* pe, int64_t dim) {
  for (int64_t d = 0; d < dim; ++d) out[d] = from_math<T>(to_math<M>(x[d * x_stride]) * x_scale + pe[d]);
}

// Units [begin, end): unit u is (position row pb, s). Per unit one vectorized pass forms the sin/cos
// of every pair; the table op writes them out, add_sinusoidal lays them out once in a row buffer and
// adds it to every x row with these positions (all batch rows when positions are [S]).
// A position equal to the previous unit's + 1 (the usual arange) is advanced from the previous one
// by a rotation (advance_sincos_row); every kDirectEvery-th unit is computed directly.
template <typename T>
POSENC_CPU_CLONES void sinusoidal_rows(const SinusoidalProblem& p, const double* freq, int64_t begin, int64_t end) {
  using M = math_t<T>;
  constexpr int kDirectEvery = 64;
  constexpr int64_t kBlock = 16;
  const SinusoidalParams& prm = p.params;
  const int64_t half = prm.half, dim = prm.dim;
  std::vector<M> sin_buf(half), cos_buf(half), pe_rows(p.x ? kBlock * dim : 0);
  std::vector<double> sin_state(half), cos_state(half), step_sin(half), step_cos(half);
  for (int64_t i = 0; i < half; ++i) {
    step_sin[i] = std::sin(freq[i]);
    step_cos[i] = std::cos(freq[i]);
  }
  const auto write = [&](auto* out, const auto* sin_v, const auto* cos_v) {
    const auto* first = prm.cos_first ? cos_v : sin_v;
    const auto* second = prm.cos_first ? sin_v : cos_v;
    if (prm.interleaved) {
      write_encoding<true>(out, first, second, half, dim);
    } else {
      write_encoding<false>(out, first, second, half, dim);
    }
  };
  const auto add_row = [&](int64_t b, int64_t s, const M* pe) {
    T* out = static_cast<T*>(p.out) + b * p.out_stride_b + s * p.out_stride_s;
    const T* x = static_cast<const T*>(p.x) + b * p.x_stride_b + s * p.x_stride_s;
    if (p.x_stride_d == 1) {
      add_encoding(out, x, 1, static_cast<M>(p.x_scale), pe, dim);
    } else {
      add_encoding(out, x, p.x_stride_d, static_cast<M>(p.x_scale), pe, dim);
    }
  };
  const bool shared = p.pos_stride_b == 0;
  double previous = 0;
  int since_direct = kDirectEvery;
  // Blocks of kBlock units: encode them, then (add_sinusoidal) stream through x batch row by batch
  // row, so memory is read and written in long runs.
  for (int64_t block = begin; block < end; block += kBlock) {
    const int64_t n = std::min<int64_t>(kBlock, end - block);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t pb = (block + j) / p.seq, s = (block + j) % p.seq;
      const double position = p.position(pb, s);
      const bool from_state = since_direct < kDirectEvery && position == previous + 1.0;
      if (from_state) {
        advance_sincos_row(sin_state.data(), cos_state.data(), step_sin.data(), step_cos.data(), half);
        ++since_direct;
      } else {
        sincos_row<M>(position, freq, half, M(1), sin_buf.data(), cos_buf.data());
        for (int64_t i = 0; i < half; ++i) {
          sin_state[i] = sin_buf[i];
          cos_state[i] = cos_buf[i];
        }
        since_direct = 0;
      }
      previous = position;
      // The table (batch 1) is written directly; add_sinusoidal lays the row out in pe_rows.
      const auto encode = [&](auto* dst) {
        from_state ? write(dst, sin_state.data(), cos_state.data()) : write(dst, sin_buf.data(), cos_buf.data());
      };
      if (p.x) {
        encode(pe_rows.data() + j * dim);
      } else {
        encode(static_cast<T*>(p.out) + s * p.out_stride_s);
      }
    }
    if (!p.x) continue;
    if (shared) {
      for (int64_t b = 0; b < p.batch; ++b) {
        for (int64_t j = 0; j < n; ++j) add_row(b, (block + j) % p.seq, pe_rows.data() + j * dim);
      }
    } else {
      for (int64_t j = 0; j < n; ++j) add_row((block + j) / p.seq, (block + j) % p.seq, pe_rows.data() + j * dim);
    }
  }
}

template <typename T>
void run_typed(const SinusoidalProblem& p) {
  std::vector<double> freq(p.params.half);
  for (int64_t i = 0; i < p.params.half; ++i) freq[i] = p.params.frequency(i);
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(p.params.dim, 1));
  const int64_t units = (p.pos_stride_b == 0 ? 1 : p.batch) * p.seq;  // see sinusoidal_rows
  at::parallel_for(0, units, grain,
                   [&](int64_t begin, int64_t end) { sinusoidal_rows<T>(p, freq.data(), begin, end); });
}

}  // namespace

void run_sinusoidal(const SinusoidalProblem& p, at::ScalarType dtype) {
  dispatch_float_types(dtype, "posenc.sinusoidal", [&](auto tag) { run_typed<decltype(tag)>(p); });
}

}  // namespace posenc::cpu
