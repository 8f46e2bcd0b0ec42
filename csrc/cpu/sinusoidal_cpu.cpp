// CPU kernels of the sinusoidal ops: rows in parallel; per row one vectorized pass computes the
// sin/cos of every pair, a second writes them in the requested layout (plus x * x_scale).
#include <algorithm>
#include <cmath>
#include <cstring>
#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#endif
#include <vector>

#include "cpu/isa.h"
#include "cpu/kernels.h"
#include "cpu/sincos_stream.h"

namespace posenc::cpu {
namespace {

// Writes one encoding row in the requested layout: out[first_col(i)] = first[i], out[second_col(i)] =
// second[i], and a zero last column for odd dims. first/second are in the math type, or float64.
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

// n bytes from src to dst, with non-temporal stores (cpu/isa.h, Streaming) where dst is 16-byte aligned
// and plain copies at the ends. SSE2's, which every x86-64 CPU has.
inline void stream_copy(void* dst, const void* src, int64_t n) {
#if defined(__x86_64__) || defined(_M_X64)
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  const int64_t head = std::min<int64_t>(n, (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16);
  std::memcpy(d, s, head);
  int64_t i = head;
  for (; i + 16 <= n; i += 16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
  }
  std::memcpy(d + i, s + i, n - i);
#else
  std::memcpy(dst, src, n);
#endif
}

// out = x * x_scale + pe, one row.
template <typename T, typename M>
void add_encoding(T* __restrict__ out, const T* x, int64_t x_stride, M x_scale, const M* pe, int64_t dim) {
  for (int64_t d = 0; d < dim; ++d) out[d] = from_math<T>(to_math<M>(x[d * x_stride]) * x_scale + pe[d]);
}

// Units [begin, end): unit u is (position row pb, s). The table op writes each unit's encoding
// row directly; add_sinusoidal lays a block of them out in pe_rows, then streams through x batch
// row by batch row (every batch row when positions are [S]), so memory moves in long runs.
template <typename T>
POSENC_CPU_CLONES void sinusoidal_rows(const SinusoidalProblem& p, const double* freq, bool stream, int64_t begin,
                                       int64_t end) {
  using M = math_t<T>;
  constexpr int64_t kBlock = 16;
  const SinusoidalParams& prm = p.params;
  const int64_t half = prm.half, dim = prm.dim;
  SinCosStream<M> angles(freq, half, M(1));
  const auto position_of = [&](int64_t u) { return p.position(u / p.seq, u % p.seq); };
  std::vector<M> pe_rows(p.x ? kBlock * dim : 0);
  std::vector<T> row(stream ? dim : 0);  // a row formed in L1 to be streamed out (run_typed)
  const auto encode_from = [&](auto* out, const auto* sin_v, const auto* cos_v) {
    const auto* first = prm.cos_first ? cos_v : sin_v;
    const auto* second = prm.cos_first ? sin_v : cos_v;
    if (prm.interleaved) {
      write_encoding<true>(out, first, second, half, dim);
    } else {
      write_encoding<false>(out, first, second, half, dim);
    }
  };
  const auto encode = [&](auto* out) {
    if (angles.from_state()) {
      encode_from(out, angles.state_sin(), angles.state_cos());
    } else {
      encode_from(out, angles.sin(), angles.cos());
    }
  };
  const auto add_row = [&](int64_t b, int64_t s, const M* pe) {
    T* out = static_cast<T*>(p.out) + b * p.out_stride_b + s * p.out_stride_s;
    const T* x = static_cast<const T*>(p.x) + b * p.x_stride_b + s * p.x_stride_s;
    T* sum = stream ? row.data() : out;
    if (p.x_stride_d == 1) {
      add_encoding(sum, x, 1, static_cast<M>(p.x_scale), pe, dim);
    } else {
      add_encoding(sum, x, p.x_stride_d, static_cast<M>(p.x_scale), pe, dim);
    }
    if (stream) stream_copy(out, sum, dim * sizeof(T));
  };
  for (int64_t block = begin; block < end; block += kBlock) {
    const int64_t n = std::min<int64_t>(kBlock, end - block);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t s = (block + j) % p.seq;
      angles.at(block + j, position_of, /*math_rows=*/false);
      if (p.x) {
        encode(pe_rows.data() + j * dim);
      } else if (stream) {
        encode(row.data());
        stream_copy(static_cast<T*>(p.out) + s * p.out_stride_s, row.data(), dim * sizeof(T));
      } else {
        encode(static_cast<T*>(p.out) + s * p.out_stride_s);  // the table: batch 1
      }
    }
    if (!p.x) continue;
    if (p.pos_stride_b == 0) {
      for (int64_t b = 0; b < p.batch; ++b) {
        for (int64_t j = 0; j < n; ++j) add_row(b, (block + j) % p.seq, pe_rows.data() + j * dim);
      }
    } else {
      for (int64_t j = 0; j < n; ++j) add_row((block + j) / p.seq, (block + j) % p.seq, pe_rows.data() + j * dim);
    }
  }
  if (stream) end_streaming_stores();
}

template <typename T>
void run_typed(const SinusoidalProblem& p) {
  std::vector<double> freq(p.params.half);
  for (int64_t i = 0; i < p.params.half; ++i) freq[i] = p.params.frequency(i);
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(p.params.dim, 1));
  const int64_t units = (p.pos_stride_b == 0 ? 1 : p.batch) * p.seq;  // see sinusoidal_rows
  // The output (the table, or x plus the encoding), when it is too big to stay in cache: each row is
  // formed in L1 and streamed out (cpu/isa.h, Streaming). Decided once, before any thread writes.
  const int64_t element = sizeof(T);
  const int64_t out_rows = p.x ? p.batch * p.seq : p.seq;
  const int64_t out_extent =
      output_extent({{p.x ? p.batch : 1, p.out_stride_b}, {p.seq, p.out_stride_s}}, p.params.dim, element);
  const bool stream =
      out_extent > 0 && cpu_streaming().for_output(out_rows * p.params.dim * element, p.out, out_extent);
  torch::stable::parallel_for(0, units, grain,
                   [&](int64_t begin, int64_t end) { sinusoidal_rows<T>(p, freq.data(), stream, begin, end); });
}

}  // namespace

void run_sinusoidal(const SinusoidalProblem& p, ScalarType dtype) {
  dispatch_float_types(dtype, "posenc.sinusoidal", [&](auto tag) { run_typed<decltype(tag)>(p); });
}

}  // namespace posenc::cpu
