// Microbenchmark of the CPU RoPE row loop alone, against a multiply loop over the same bytes: what
// the rotation itself costs, without per-token work, dispatch or Python (benchmarks/RESULTS.md,
// "Decode fast path and fp16 rows"). One thread, thread CPU time, minimum of 40 passes.
//
//   g++ -O3 -mavx2 -mfma -mf16c -ffp-contract=off benchmarks/micro/rope_rows.cpp -o /tmp/rope_rows
//   /tmp/rope_rows            # fp16, 4096 tokens x 40 rows of 128 (DRAM), then 16 rows in L1 (compute),
//                             # then fp32 at 1 and 64 tokens (cache)
//
// The loops mirror csrc/cpu/simd_rows.h (fp16 rows: F16C conversions, factor rows C/S laid out
// like the row) and core/rope.h rotate_row_uniform (fp32, compiler-vectorized); the factors are
// constants here, so only the row loop is timed.
#include <immintrin.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "micro_timing.h"

namespace {

constexpr int64_t kRows = 40, kDim = 128, kPairs = 64;
volatile float one = 1.0f, zero = 0.0f;  // read at run time: the compiler may not fold x * 1 away

__m256 load_h(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
void store_h(uint16_t* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// fp16 floor: convert, multiply, convert (what torch's mul_ does per element).
__attribute__((noinline)) void h_floor(uint16_t* x, int64_t n) {
  const __m256 f = _mm256_set1_ps(one);
  for (int64_t i = 0; i < n; i += 8) store_h(x + i, _mm256_mul_ps(load_h(x + i), f));
}

// Conversions alone: convert in, convert out, no arithmetic.
__attribute__((noinline)) void h_convert(uint16_t* x, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) store_h(x + i, load_h(x + i));
}

// The floor with the rotation's arithmetic (2 multiplies and an add per element), no factor loads.
__attribute__((noinline)) void h_floor_arith(uint16_t* x, int64_t n) {
  const __m256 f = _mm256_set1_ps(one), g = _mm256_set1_ps(zero);
  for (int64_t i = 0; i < n; i += 16) {
    const __m256 a = load_h(x + i), b = load_h(x + i + 8);
    store_h(x + i, _mm256_add_ps(_mm256_mul_ps(a, f), _mm256_mul_ps(b, g)));
    store_h(x + i + 8, _mm256_add_ps(_mm256_mul_ps(b, f), _mm256_mul_ps(a, g)));
  }
}

// Half-split rows as simd_rows.h: out[j] = x[j] * C[j] + x[partner(j)] * S[j].
__attribute__((noinline)) void h_half(uint16_t* x, int64_t rows, const float* C, const float* S) {
  for (int64_t r = 0; r < rows; ++r) {
    uint16_t* row = x + r * kDim;
    for (int64_t j = 0; j < kPairs; j += 8) {
      const __m256 a = load_h(row + j), b = load_h(row + kPairs + j);
      store_h(row + j, _mm256_add_ps(_mm256_mul_ps(a, _mm256_loadu_ps(C + j)), _mm256_mul_ps(b, _mm256_loadu_ps(S + j))));
      store_h(row + kPairs + j, _mm256_add_ps(_mm256_mul_ps(b, _mm256_loadu_ps(C + kPairs + j)),
                                              _mm256_mul_ps(a, _mm256_loadu_ps(S + kPairs + j))));
    }
  }
}

// Half-split with per-pair factors c, s (two factor loads per 8 pairs instead of four).
__attribute__((noinline)) void h_half_pair(uint16_t* x, int64_t rows, const float* c, const float* s) {
  for (int64_t r = 0; r < rows; ++r) {
    uint16_t* row = x + r * kDim;
    for (int64_t j = 0; j < kPairs; j += 8) {
      const __m256 a = load_h(row + j), b = load_h(row + kPairs + j);
      const __m256 cv = _mm256_loadu_ps(c + j), sv = _mm256_loadu_ps(s + j);
      store_h(row + j, _mm256_sub_ps(_mm256_mul_ps(a, cv), _mm256_mul_ps(b, sv)));
      store_h(row + kPairs + j, _mm256_add_ps(_mm256_mul_ps(b, cv), _mm256_mul_ps(a, sv)));
    }
  }
}

// Interleaved rows as simd_rows.h: the partner vector is x with each pair swapped.
__attribute__((noinline)) void h_interleaved(uint16_t* x, int64_t rows, const float* C, const float* S) {
  for (int64_t r = 0; r < rows; ++r) {
    uint16_t* row = x + r * kDim;
    for (int64_t j = 0; j < kDim; j += 8) {
      const __m256 a = load_h(row + j);
      store_h(row + j, _mm256_add_ps(_mm256_mul_ps(a, _mm256_loadu_ps(C + j)),
                                     _mm256_mul_ps(_mm256_permute_ps(a, 0xB1), _mm256_loadu_ps(S + j))));
    }
  }
}

// The same with the add as a fused multiply-add by one (the AVX2 path's fp16 rows, simd_rows.h
// Avx2Fma: the same bits), which moves it off the add pipes that F16C's conversions use on AMD Zen.
__attribute__((noinline)) void h_interleaved_fma1(uint16_t* x, int64_t rows, const float* C, const float* S) {
  const __m256 unit = _mm256_set1_ps(1.0f);
  for (int64_t r = 0; r < rows; ++r) {
    uint16_t* row = x + r * kDim;
    for (int64_t j = 0; j < kDim; j += 8) {
      const __m256 a = load_h(row + j);
      const __m256 ac = _mm256_mul_ps(a, _mm256_loadu_ps(C + j));
      store_h(row + j, _mm256_fmadd_ps(ac, unit, _mm256_mul_ps(_mm256_permute_ps(a, 0xB1), _mm256_loadu_ps(S + j))));
    }
  }
}

// fp32: rotate_row_uniform's loop, per row, and a multiply loop.
__attribute__((noinline)) void f_row(float* x, int64_t pairs, const float* __restrict__ c, const float* __restrict__ s) {
#pragma GCC ivdep
  for (int64_t i = 0; i < pairs; ++i) {
    const float a = x[i], b = x[i + pairs];
    x[i] = a * c[i] - b * s[i];
    x[i + pairs] = b * c[i] + a * s[i];
  }
}

__attribute__((noinline)) void f_mul(float* x, int64_t n, float f) {
  for (int64_t i = 0; i < n; ++i) x[i] *= f;
}

}  // namespace

int main() {
  alignas(64) float C[kDim], S[kDim], c[kPairs], s[kPairs];
  for (int i = 0; i < kDim; ++i) {
    C[i] = 0.6f;
    S[i] = i < kPairs ? -0.8f : 0.8f;
  }
  for (int i = 0; i < kPairs; ++i) {
    c[i] = 0.6f;
    s[i] = 0.8f;
  }
  {
    const int64_t rows = 4096 * kRows;
    std::vector<uint16_t> x(rows * kDim);
    for (auto& v : x) v = static_cast<uint16_t>(0x3c00 + std::rand() % 512);  // 1.0 .. 1.5
    const std::vector<double> ms = alternated_ms({[&] { h_floor(x.data(), rows * kDim); },
                                                  [&] { h_floor_arith(x.data(), rows * kDim); },
                                                  [&] { h_half(x.data(), rows, C, S); },
                                                  [&] { h_half_pair(x.data(), rows, c, s); },
                                                  [&] { h_interleaved(x.data(), rows, C, S); }}, 40, 0.0);
    const char* names[] = {"floor (convert, multiply, convert)", "floor + rotation arithmetic",
                           "half-split, factor rows", "half-split, per-pair factors", "interleaved, factor rows"};
    std::printf("fp16, 4096 tokens x %ld rows x %ld (%.0f MiB), ms and ratio to the floor:\n", kRows, kDim,
                rows * kDim * 2 / 1048576.0);
    for (size_t i = 0; i < ms.size(); ++i) std::printf("  %-36s %.3f  %.2fx\n", names[i], ms[i], ms[i] / ms[0]);
  }
  {
    // The same loops on 16 rows (4 KiB) that stay in L1: no memory stalls, so this is what each
    // costs in instructions. The fp16 floor is bound by its two F16C conversions, and the rotation
    // adds arithmetic to the same vector pipes, so against this floor it cannot run at 1.0x; from
    // DRAM it comes closer the more the memory stalls hide it (benchmarks/RESULTS.md).
    constexpr int64_t rows = 16;
    alignas(64) uint16_t x[rows * kDim];
    for (auto& v : x) v = static_cast<uint16_t>(0x3c00 + std::rand() % 512);
    const auto passes = [&](const std::function<void()>& f) {
      return [f] {
        for (int k = 0; k < 2000; ++k) f();
      };
    };
    const std::vector<double> ms = alternated_ms({passes([&] { h_floor(x, rows * kDim); }),
                                                  passes([&] { h_convert(x, rows * kDim); }),
                                                  passes([&] { h_floor_arith(x, rows * kDim); }),
                                                  passes([&] { h_half_pair(x, rows, c, s); }),
                                                  passes([&] { h_interleaved(x, rows, C, S); }),
                                                  passes([&] { h_interleaved_fma1(x, rows, C, S); })}, 40, 0.0);
    const char* names[] = {"floor (convert, multiply, convert)", "conversions only", "floor + rotation arithmetic",
                           "half-split, per-pair factors", "interleaved, factor rows", "interleaved, add as FMA by 1"};
    std::printf("fp16, %ld rows x %ld in L1 (compute-bound), ratio to the floor:\n", rows, kDim);
    for (size_t i = 0; i < ms.size(); ++i) std::printf("  %-36s %.2fx\n", names[i], ms[i] / ms[0]);
  }
  for (int64_t tokens : {1, 64}) {
    std::vector<float> x(tokens * kRows * kDim);
    for (auto& v : x) v = (std::rand() % 1000) / 1000.0f;
    const std::vector<double> ms = alternated_ms(
        {[&] {
           for (int k = 0; k < 100; ++k) f_mul(x.data(), static_cast<int64_t>(x.size()), one);
         },
         [&] {
           for (int k = 0; k < 100; ++k)
             for (int64_t r = 0; r < tokens * kRows; ++r) f_row(x.data() + r * kDim, kPairs, c, s);
         }}, 40, 0.0);
    const double mul = ms[0] / 100, rot = ms[1] / 100;
    std::printf("fp32, %ld token(s) x %ld rows (%.0f KiB): multiply %.2f us, rotation %.2f us (%.2fx)\n", tokens,
                kRows, x.size() * 4 / 1024.0, mul * 1e3, rot * 1e3, rot / mul);
  }
}
