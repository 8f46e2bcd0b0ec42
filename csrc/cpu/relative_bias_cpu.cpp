// CPU kernels of the relative-position-bias ops (csrc/core/relative_bias.h). The bias is constant
// along diagonals, so the forward builds the Lq + Lk - 1 diagonal values per head once (T5: as fills
// of runs of relative positions that share a bucket, found once for all heads) and writes every
// output row as a copy of a window of that table: one pass over the output, as fast as filling it. The backward sums the gradient
// along diagonals in fixed row blocks (the same sums for any thread count), then per bucket.

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/isa.h"
#include "cpu/kernels.h"

namespace posenc::cpu {
namespace {

// One bucket per run of diagonals [start[k], start[k + 1]) of the chunk t0 .. t0 + n (T5). On
// either side of r = 0 the bucket grows with |r| (exact, then log-spaced, then clamped at
// max_distance), and the two sides' buckets differ (bidirectional: the lower and the upper half;
// decoder: every r >= 0 has bucket 0, which no r < 0 has), so a stretch whose ends share a bucket is
// one run: most of a long row past max_distance is found with two bucket() calls.
struct BucketRuns {
  static constexpr int64_t kChunk = 256;
  int64_t start[kChunk + 1], bucket[kChunk];
  int64_t count = 0;

  BucketRuns(const RelativeBiasProblem& p, int64_t t0, int64_t n) {
    add(p, t0, 0, n, p.t5.bucket(p.relative(t0)), p.t5.bucket(p.relative(t0 + n - 1)));
    start[count] = n;
  }

 private:
  // [a, b) of the chunk, whose first and last diagonals' buckets are first and last
  void add(const RelativeBiasProblem& p, int64_t t0, int64_t a, int64_t b, int64_t first, int64_t last) {
    if (first == last) {
      append(a, first);
      return;
    }
    if (b - a <= 8) {  // a short stretch of several buckets: bucket by bucket
      for (int64_t t = a; t < b - 1; ++t) append(t, t == a ? first : p.t5.bucket(p.relative(t0 + t)));
      append(b - 1, last);
      return;
    }
    const int64_t mid = a + (b - a) / 2;
    add(p, t0, a, mid, first, p.t5.bucket(p.relative(t0 + mid - 1)));
    add(p, t0, mid, b, p.t5.bucket(p.relative(t0 + mid)), last);
  }
  void append(int64_t t, int64_t b) {
    if (count == 0 || bucket[count - 1] != b) start[count] = t, bucket[count++] = b;
  }
};

// dst[h * dst_stride_h + t] = value(h, relative(t)) for t in [begin, end), head by head, so the writes
// run along rows (writing a column, every head of one t, straight to H rows far apart, often a power
// of two apart, thrashes the cache sets): T5 a fill per run of one bucket, ALiBi a product per element.
// narrow: the path's kernel (isa.h, EncodingRowFn without x) that rounds an ALiBi row formed in float32
// to bf16 or fp16 (F16C), with the bits of from_math (the compiled rounding took 3x the float32 row's time).
template <typename T>
POSENC_CPU_CLONES void table_range(const RelativeBiasProblem& p, T* dst, int64_t dst_stride_h, int64_t begin,
                                   int64_t end, EncodingRowFn narrow) {
  for (int64_t t0 = begin; t0 < end; t0 += BucketRuns::kChunk) {
    const int64_t n = std::min(BucketRuns::kChunk, end - t0);
    if (p.kind == BiasKind::T5) {
      const BucketRuns runs(p, t0, n);
      for (int64_t h = 0; h < p.heads; ++h) {
        T* row = dst + h * dst_stride_h + t0;
        for (int64_t k = 0; k < runs.count; ++k) {
          std::fill(row + runs.start[k], row + runs.start[k + 1], t5_value<T>(p, runs.bucket[k], h));
        }
      }
    } else {
      const double d0 = static_cast<double>(p.relative(t0));  // + k exactly: |r| < 2^53
      // Distances below 2^24 are float32 values: the float32 product of such a distance and a float32
      // slope is the float64 product (exact) rounded once, alibi_value's bits, in twice the lanes.
      // Normal slopes only: their products are normal, so no FTZ/DAZ setting can change them.
      const bool short_distances = std::abs(d0) < 0x1p24 && std::abs(d0 + static_cast<double>(n - 1)) < 0x1p24;
      for (int64_t h = 0; h < p.heads; ++h) {
        T* row = dst + h * dst_stride_h + t0;
        const float slope = static_cast<float>(p.slopes[h]);
        const bool in_float = short_distances && static_cast<double>(slope) == p.slopes[h] &&
                              (slope == 0.0f || std::abs(slope) >= std::numeric_limits<float>::min());
        int32_t done = 0;
        if constexpr (kRowDtype<T> >= 0) {  // float32 rows, and bf16 or fp16 ones formed in float32 and narrowed
          if (kRowDtype<T> == kRowFloat || narrow != nullptr) {
            float buffer[BucketRuns::kChunk];
            float* formed = kRowDtype<T> == kRowFloat ? reinterpret_cast<float*>(row) : buffer;
            if (in_float) {
              const float f0 = static_cast<float>(d0);
              for (int32_t k = 0; k < static_cast<int32_t>(n); ++k) formed[k] = slope * (f0 + static_cast<float>(k));
            } else {
              for (int32_t k = 0; k < static_cast<int32_t>(n); ++k) {
                formed[k] = alibi_value<float>(p, d0 + static_cast<double>(k), h);
              }
            }
            done = kRowDtype<T> == kRowFloat ? static_cast<int32_t>(n)
                                             : static_cast<int32_t>(narrow(row, nullptr, 1.0f, formed, n));
          }
        }
        for (int32_t k = done; k < static_cast<int32_t>(n); ++k) row[k] = alibi_value<T>(p, d0 + static_cast<double>(k), h);
      }
    }
  }
}

template <typename T>
void build_table(const RelativeBiasProblem& p, T* dst, int64_t dst_stride_h) {
  EncodingRowFn narrow = nullptr;
  if constexpr (kRowDtype<T> == kRowHalf || kRowDtype<T> == kRowBFloat16) {
    // (AVX512-BF16's conversion flushes subnormal values: AVX-512's integer rounding, from_math's bits)
    const Isa isa = std::min(cpu_isa(), Isa::Avx512);
    if (const RowKernels* k = p.kind == BiasKind::Alibi ? row_kernels(isa, false, false, false) : nullptr) {
      narrow = k->encoding[kRowDtype<T>];
    }
  }
  torch::stable::parallel_for(0, p.diagonals(), 4096, [&](int64_t begin, int64_t end) {
    table_range<T>(p, dst, dst_stride_h, begin, end, narrow);
  });
}

template <typename T>
void run_bias_typed(const RelativeBiasProblem& p) {
  const int64_t nd = p.diagonals(), lq = p.query_length, lk = p.key_length;
  T* out = static_cast<T*>(p.out);
  if (lq == 1) {  // one query row per head: the table is the output
    build_table<T>(p, out, nd);
    return;
  }
  std::vector<T> table(static_cast<size_t>(p.heads * nd));
  build_table<T>(p, table.data(), nd);
  // Row i of head h is the window t = Lq-1-i .. Lq-1-i+Lk-1 of the table (t = j - i + Lq - 1).
  // An output too big to stay in cache, into pages already in memory, with rows on 16-byte
  // boundaries, is streamed out (cpu/isa.h, Streaming): written so, a line is not first read into the
  // cache; into fresh pages, which the kernel zeroes into the cache on the first store, plain stores
  // are faster.
  const int64_t bytes = p.heads * lq * lk * static_cast<int64_t>(sizeof(T));
  const bool stream = rows_aligned(out, {lk}, sizeof(T), 16) && cpu_streaming().for_output(bytes, out, bytes);
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(lk, 1));
  torch::stable::parallel_for(0, p.heads * lq, grain, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t h = row / lq, i = row % lq;
      const T* window = table.data() + h * nd + (lq - 1 - i);
      copy_row(out + row * lk, window, lk * static_cast<int64_t>(sizeof(T)), stream);
    }
    if (stream) end_streaming_stores();
  });
}

// part[Lq - 1 - i + j] += grad[i, j] for the rows [i0, i1) of one head, each row's lines prefetched
// `ahead` bytes on (cpu/isa.h, Prefetch; without, 1.4-1.6x the time of grad.sum() on an Intel Xeon,
// 1.2-1.3x with it). 16-bit rows are widened to float32 a chunk at a time first, contiguous fp16
// ones by the path's SIMD kernel (`widen`, cpu/isa.h): with the conversion in the sum's loop the
// compiler kept fp16 rows scalar (4.7x grad.sum()) and bf16 rows took 1.8x. The same values added in
// the same order: the same sums.
template <typename T>
POSENC_CPU_CLONES void add_rows(const T* g, int64_t stride_i, int64_t stride_j, int64_t i0, int64_t i1, int64_t lq,
                                int64_t lk, double* part, WidenRowFn widen, int64_t ahead) {
  constexpr int64_t kChunk = 256;
  float values[kChunk];
  for (int64_t i = i0; i < i1; ++i) {
    const T* row = g + i * stride_i;
    double* __restrict d = part + (lq - 1 - i);
    for (int64_t j0 = 0; j0 < lk; j0 += kChunk) {
      const int64_t n = std::min(kChunk, lk - j0);
      if (ahead > 0) prefetch_lines(row + j0, n * static_cast<int64_t>(sizeof(T)), ahead);
      if constexpr (std::is_same_v<math_t<T>, T>) {  // float32, float64
        if (stride_j == 1) {
          for (int64_t k = 0; k < n; ++k) d[j0 + k] += static_cast<double>(row[j0 + k]);
        } else {
          for (int64_t k = 0; k < n; ++k) d[j0 + k] += static_cast<double>(row[(j0 + k) * stride_j]);
        }
      } else {
        if (stride_j == 1) {
          widen_row(row + j0, values, n, widen);
        } else {
          for (int64_t k = 0; k < n; ++k) values[k] = to_math<float>(row[(j0 + k) * stride_j]);
        }
        for (int64_t k = 0; k < n; ++k) d[j0 + k] += static_cast<double>(values[k]);
      }
    }
  }
}

template <typename T>
void run_grad_typed(const RelativeBiasGradProblem& p) {
  const int64_t nd = p.diagonals(), lq = p.query_length, lk = p.key_length, heads = p.heads;
  // A partition that depends only on the shape: at most 8 row blocks of >= 256 rows per head.
  const int64_t blocks = std::min<int64_t>(8, (lq + 255) / 256);
  const int64_t rows_per_block = (lq + blocks - 1) / blocks;
  std::vector<double> partial(static_cast<size_t>(heads * blocks * nd), 0.0);
  const T* grad = static_cast<const T*>(p.grad);
  WidenRowFn widen = nullptr;
  if constexpr (kRowDtype<T> >= 0) {
    if (const RowKernels* k = row_kernels(cpu_isa(), false, false, false)) widen = k->widen[kRowDtype<T>];
  }
  const int64_t grad_bytes = heads * lq * lk * static_cast<int64_t>(sizeof(T));
  const int64_t ahead = p.grad_stride_j == 1 && cpu_prefetch().for_rows(grad_bytes) ? cpu_prefetch().distance : 0;
  torch::stable::parallel_for(0, heads * blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const int64_t h = u / blocks, blk = u % blocks;
      const int64_t i0 = blk * rows_per_block, i1 = std::min(lq, i0 + rows_per_block);
      add_rows<T>(grad + h * p.grad_stride_h, p.grad_stride_i, p.grad_stride_j, i0, i1, lq, lk,
                  partial.data() + u * nd, widen, ahead);
    }
  });
  for (int64_t h = 0; h < heads; ++h) {  // diagonal[h] = blocks summed in order
    double* d = p.diagonal + h * nd;
    const double* first = partial.data() + h * blocks * nd;
    std::copy(first, first + nd, d);
    for (int64_t blk = 1; blk < blocks; ++blk) {
      const double* src = first + blk * nd;
      for (int64_t t = 0; t < nd; ++t) d[t] += src[t];
    }
  }
  if (p.kind == BiasKind::T5) {
    for (int64_t b = 0; b < p.num_buckets; ++b) {  // the GPU finds each bucket's runs per head
      const BucketDiagonals runs(p, b);
      for (int64_t h = 0; h < heads; ++h) t5_grad_element<T>(p, runs, b, h);
    }
  } else {
    for (int64_t h = 0; h < heads; ++h) bias_grad_item<T>(p, h);
  }
}

}  // namespace

void run_bucket(const BucketProblem& p) {
  torch::stable::parallel_for(0, p.numel, 16384, [&](int64_t begin, int64_t end) {
    for (int64_t w = begin; w < end; ++w) p.item(w);
  });
}

void run_relative_bias(const RelativeBiasProblem& p, ScalarType dtype) {
  dispatch_float_types(dtype, "posenc.relative_bias", [&](auto tag) { run_bias_typed<decltype(tag)>(p); });
}

void run_relative_bias_grad(const RelativeBiasGradProblem& p, ScalarType dtype) {
  dispatch_float_types(dtype, "posenc.relative_bias_backward", [&](auto tag) { run_grad_typed<decltype(tag)>(p); });
}

}  // namespace posenc::cpu
