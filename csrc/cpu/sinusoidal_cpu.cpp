// CPU kernels of the sinusoidal ops: rows in parallel; per row one vectorized pass moves the angles
// (sincos_stream.h) and writes them in the requested layout (EncodingRow); add_sinusoidal then adds
// x * x_scale.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "cpu/isa.h"
#include "cpu/kernels.h"
#include "cpu/sincos_stream.h"

namespace posenc::cpu {
namespace {

// Writes one encoding row in the requested layout from pair i's sin and cos (pair_at(i), in the
// math type or float64; never NaN, so from_math_finite): out[first_col(i)] = first,
// out[second_col(i)] = second, and a zero last column for odd dims.
template <bool kInterleaved, typename T, typename PairAt>
void write_encoding(T* __restrict__ out, int64_t half, int64_t dim, bool cos_first, const PairAt& pair_at) {
  using M = math_t<T>;
  const int64_t step = kInterleaved ? 2 : 1;
  const int64_t other = kInterleaved ? 1 : half;
  for (int64_t i = 0; i < half; ++i) {
    const auto [sin_i, cos_i] = pair_at(i);
    out[i * step] = from_math_finite<T>(static_cast<M>(cos_first ? cos_i : sin_i));
    out[i * step + other] = from_math_finite<T>(static_cast<M>(cos_first ? sin_i : cos_i));
  }
  if (dim % 2 == 1) out[dim - 1] = T(0);
}

// One encoding row (of T: the output, or the math type for add_sinusoidal's rows) as the angle
// stream's output (sincos_stream.h): a row past its anchor is rotated and written in one pass, in
// the math type; an anchor's (or a direct row) is written as it is.
template <typename T>
struct EncodingRow {
  using M = math_t<T>;
  const SinusoidalParams& params;
  T* out;
  template <typename PairAt>
  void write(const PairAt& pair_at) const {
    const int64_t half = params.half, dim = params.dim;
    if (params.interleaved) {
      write_encoding<true>(out, half, dim, params.cos_first, pair_at);
    } else {
      write_encoding<false>(out, half, dim, params.cos_first, pair_at);
    }
  }
  void from_math(const M* s, const M* c, int64_t) const {  // (the amplitude is 1)
    write([&](int64_t i) { return std::pair{s[i], c[i]}; });
  }
  void rotated(const M* s, const M* c, const M* step_s, const M* step_c, int64_t) const {
    write([&](int64_t i) {
      M sin_i = s[i], cos_i = c[i];
      advance_sincos(sin_i, cos_i, step_s[i], step_c[i]);
      return std::pair{sin_i, cos_i};
    });
  }
};

// out = x * x_scale + pe, one row.
template <typename T, typename M>
void add_encoding(T* __restrict__ out, const T* x, int64_t x_stride, M x_scale, const M* pe, int64_t dim) {
  for (int64_t d = 0; d < dim; ++d) out[d] = from_math<T>(to_math<M>(x[d * x_stride]) * x_scale + pe[d]);
}

// The same for a contiguous row of x, each cache line's worth with a software prefetch of x `ahead`
// bytes on (cpu/isa.h, Prefetch): a block's rows of one batch row are a run of 16 pages, and the
// hardware prefetchers start over at each page. On AMD Zen 5, [8,4096,1024] float32 went from 1.9x
// to 1.2x x.clone()'s time on one thread, 1.3x to 1.0x on two, 8 KiB ahead (2 KiB: 1.5x, 1.1x).
template <typename T, typename M>
void add_encoding_prefetched(T* __restrict__ out, const T* x, M x_scale, const M* pe, int64_t dim, int64_t ahead) {
  constexpr int64_t kLine = 64 / sizeof(T);
  const int64_t lines = dim / kLine * kLine;
  for (int64_t d0 = 0; d0 < lines; d0 += kLine) {
    prefetch_lines(x + d0, 64, ahead);
    for (int64_t d = d0; d < d0 + kLine; ++d) out[d] = from_math<T>(to_math<M>(x[d]) * x_scale + pe[d]);
  }
  add_encoding(out + lines, x + lines, 1, x_scale, pe + lines, dim - lines);
}

// The table's fp16 rows are formed in float32, then converted (by the SIMD kernel where the path
// has one): written as formed, their conversion kept the compiled loop scalar, and a [8192, 512]
// table took 8.4 ms (c10's conversion) or 11 ms (csrc/core/common.h's), against 2.4 ms formed
// first and converted by the compiled loop, 1.0 ms by the kernel. float32 and bf16 rows are written
// as formed: the compiler vectorizes bf16's conversion (from_math_finite). A [32768, 1024] bf16
// table on one thread of an Intel Xeon took 7.7 ms so on every path; formed in float32 first, as
// long with the AVX-512 kernels and 8% longer with the AVX2 one. Streamed rows (RowsPlan::direct)
// are the exception: there bf16 rows are formed in float32 too.
template <typename T>
constexpr bool kTableFormedInFloat = std::is_same_v<T, c10::Half>;

// How a call's rows are written, decided once per call (run_typed):
//   stream: the output written with non-temporal stores (cpu/isa.h, Streaming): each row formed
//     in L1 and streamed out, or with direct, streamed by the SIMD kernel itself (16-bit rows on
//     64-byte boundaries). Without the row's copy, on two AMD Zen 3 cores, a [32768, 1024] fp16
//     table went from 5.4-5.5 to 3.5-3.7 ms, add_sinusoidal of [8, 4096, 1024] from 5.9-6.2 to
//     4.5-4.8 ms (bf16) and 3.5-4.1 to 3.1-3.6 ms (fp16); the bf16 table, whose conversion is its
//     cost, stayed at 5.0-5.2 ms (benchmarks/RESULTS.md, "Forty-seventh session");
//   x_ahead: how far ahead add_sinusoidal prefetches x's rows (0: not at all);
//   simd: the SIMD kernel (isa.h, EncodingRowFn) for add_sinusoidal's contiguous rows and the
//     table's rows formed in float32, where the path has one.
struct RowsPlan {
  bool stream = false;
  bool direct = false;
  int64_t x_ahead = 0;
  EncodingRowFn simd = nullptr;
};

// Units [begin, end): unit u is (position row pb, s). The table op writes each unit's encoding
// row directly (or as kTableFormedInFloat says); add_sinusoidal lays a block of them out in
// pe_rows, then streams through x batch row by batch row (every batch row when positions are
// [S]), so memory moves in long runs.
template <typename T>
POSENC_CPU_CLONES void sinusoidal_rows(const SinusoidalProblem& p, const double* freq, const RowsPlan& plan,
                                       int64_t begin, int64_t end) {
  using M = math_t<T>;
  constexpr int64_t kBlock = 16;
  const SinusoidalParams& prm = p.params;
  const int64_t half = prm.half, dim = prm.dim;
  const bool stream = plan.stream;
  const EncodingRowFn simd = plan.simd;
  SinCosStream<M> angles(freq, half, M(1));
  // A block's encoding rows, and a row formed in L1 to be streamed out (run_typed), in this thread's
  // buffers (sincos_stream.h): as vectors they were allocated and zeroed per call, 64 KiB for a
  // 1024-dim decode step's one row (~1 us of ~5 us).
  // (direct is set only where M is float: the SIMD kernels are 16-bit rows')
  const bool table_in_float = kTableFormedInFloat<T> || plan.direct;
  M* pe_rows = p.x || table_in_float ? thread_rows<M, kEncodingRows>(std::min<int64_t>(kBlock, end - begin) * dim)
                                     : nullptr;
  T* row = stream && !plan.direct ? thread_rows<T, kStreamedRow>(dim) : nullptr;
  const auto add_row = [&](int64_t b, int64_t s, const M* pe) {
    T* out = static_cast<T*>(p.out) + b * p.out_stride_b + s * p.out_stride_s;
    const T* x = static_cast<const T*>(p.x) + b * p.x_stride_b + s * p.x_stride_s;
    T* sum = row ? row : out;
    int64_t done = 0;  // by the SIMD kernel
    if constexpr (std::is_same_v<M, float>) {
      if (simd) done = simd(sum, x, static_cast<M>(p.x_scale), pe, dim);
    }
    if (done > 0) {
      add_encoding(sum + done, x + done, 1, static_cast<M>(p.x_scale), pe + done, dim - done);
    } else if (plan.x_ahead > 0) {
      add_encoding_prefetched(sum, x, static_cast<M>(p.x_scale), pe, dim, plan.x_ahead);
    } else if (p.x_stride_d == 1) {
      add_encoding(sum, x, 1, static_cast<M>(p.x_scale), pe, dim);
    } else {
      add_encoding(sum, x, p.x_stride_d, static_cast<M>(p.x_scale), pe, dim);
    }
    if (row) copy_row(out, row, dim * sizeof(T), true);
  };
  for (int64_t block = begin; block < end; block += kBlock) {
    const int64_t n = std::min<int64_t>(kBlock, end - block);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t u = block + j;
      const auto position_of = [&](int64_t) { return p.position(u / p.seq, u % p.seq); };
      if (p.x) {
        angles.at(position_of, EncodingRow<M>{prm, pe_rows + j * dim});
        continue;
      }
      T* out = static_cast<T*>(p.out) + u % p.seq * p.out_stride_s;  // the table: batch 1
      T* dst = row ? row : out;
      if (table_in_float) {
        angles.at(position_of, EncodingRow<M>{prm, pe_rows});
        int64_t done = 0;
        if constexpr (std::is_same_v<M, float>) done = simd ? simd(dst, nullptr, 0.0f, pe_rows, dim) : 0;
        for (int64_t d = done; d < dim; ++d) dst[d] = from_math<T>(pe_rows[d]);
      } else {
        angles.at(position_of, EncodingRow<T>{prm, dst});
      }
      if (row) copy_row(out, row, dim * sizeof(T), true);
    }
    if (!p.x) continue;
    if (p.pos_stride_b == 0) {
      for (int64_t b = 0; b < p.batch; ++b) {
        for (int64_t j = 0; j < n; ++j) add_row(b, (block + j) % p.seq, pe_rows + j * dim);
      }
    } else {
      for (int64_t j = 0; j < n; ++j) add_row((block + j) / p.seq, (block + j) % p.seq, pe_rows + j * dim);
    }
  }
  if (stream) end_streaming_stores();
}

// The frequencies w_i * angle_scale of `prm`, kept per thread (row_for_last_key): formed on every
// call, their `half` float64 exps took 3 us of a 6 us decode step at dim 1024
// (benchmarks/RESULTS.md, "Forty-third session").
const double* frequencies_of(const SinusoidalParams& prm) {
  struct Key {
    int64_t half;
    double log_base, freq_denom, angle_scale;
  };
  struct Caller;
  const Key key{prm.half, prm.log_base, prm.freq_denom, prm.angle_scale};
  return row_for_last_key<Caller>(key, nullptr, 0, prm.half, [&](double* freq) {
    for (int64_t i = 0; i < prm.half; ++i) freq[i] = prm.frequency(i);
  });
}

template <typename T>
void run_typed(const SinusoidalProblem& p) {
  const double* freq = frequencies_of(p.params);
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(p.params.dim, 1));
  const int64_t units = (p.pos_stride_b == 0 ? 1 : p.batch) * p.seq;  // see sinusoidal_rows
  // The output (the table, or x plus the encoding), when it is too big to stay in cache and its rows
  // start on 16-byte boundaries: each row is formed in L1 and streamed out (cpu/isa.h, Streaming,
  // rows_aligned). Decided once, before any thread writes.
  const int64_t element = sizeof(T);
  const int64_t out_rows = p.x ? p.batch * p.seq : p.seq;
  const int64_t out_extent =
      output_extent({{p.x ? p.batch : 1, p.out_stride_b}, {p.seq, p.out_stride_s}}, p.params.dim, element);
  RowsPlan plan;
  plan.stream = out_extent > 0 && rows_aligned(p.out, {p.out_stride_b, p.out_stride_s}, element, 16) &&
                cpu_streaming().for_output(out_rows * p.params.dim * element, p.out, out_extent);
  // x's contiguous rows read with software prefetch where the RoPE kernels' rows would be (same size).
  const Prefetch& prefetch = cpu_prefetch();
  plan.x_ahead =
      p.x && p.x_stride_d == 1 && prefetch.for_rows(out_rows * p.params.dim * element) ? prefetch.distance : 0;
  if constexpr (kRowDtype<T> >= 0) {
    const int64_t bytes = out_rows * p.params.dim * element;
    const bool wide = cpu_vector_width().wide(kRowDtype<T>, bytes);
    // Streamed by the kernel itself where every row starts on a 64-byte boundary (the widest
    // kernel's non-temporal store needs its vector's alignment).
    const bool direct = plan.stream && rows_aligned(p.out, {p.out_stride_b, p.out_stride_s}, element, 64);
    const bool rows = p.x ? p.x_stride_d == 1 : kTableFormedInFloat<T> || direct;
    if (const RowKernels* k = rows ? row_kernels(cpu_isa(), plan.x_ahead > 0, direct, wide) : nullptr) {
      plan.simd = k->encoding[kRowDtype<T>];
      plan.direct = direct && plan.simd != nullptr;
    }
  }
  torch::stable::parallel_for(0, units, grain, [&](int64_t begin, int64_t end) {
    sinusoidal_rows<T>(p, freq, plan, begin, end);
  });
}

}  // namespace

void run_sinusoidal(const SinusoidalProblem& p, ScalarType dtype) {
  dispatch_float_types(dtype, "posenc.sinusoidal", [&](auto tag) { run_typed<decltype(tag)>(p); });
}

}  // namespace posenc::cpu
