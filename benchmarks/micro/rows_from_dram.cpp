// Microbenchmark of the library's own float32 AVX2 row kernels (csrc/cpu/simd_rows.h) streamed from
// DRAM over the bench's bytes (q [1,4096,32,128] and k [1,4096,8,128], in place, token by token, q
// rows then k rows), against a multiply loop over the same bytes with and without prefetch: how far
// each pairing's kernel is from the memory floor without the op's per-token work (benchmarks/RESULTS.md,
// "Eleventh session"). One thread, thread CPU time, 10th percentile of 60 alternated rounds.
//
//   g++ -O3 -std=c++20 -mavx2 -mfma -mf16c -ffp-contract=off -Icsrc benchmarks/micro/rows_from_dram.cpp -o /tmp/rows_from_dram
//   taskset -c 0 /tmp/rows_from_dram [prefetch distance in bytes, default 8192]
//
// -O3 as the library is built: at -O2 GCC keeps the half-split kernel's four-vector step as a loop.
// The factors are constants of unit norm (cos 0.6, sin 0.8), so the data stays bounded.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "cpu/simd_rows.h"
#include "micro_timing.h"

namespace posenc::cpu {
// isa.cpp's choice, fixed here: prefetch on, at the distance given on the command line.
static Prefetch g_prefetch{true, 0, 8192};
const Prefetch& cpu_prefetch() { return g_prefetch; }
}  // namespace posenc::cpu

namespace {
using namespace posenc::cpu;

constexpr int64_t kTokens = 4096, kQ = 32, kK = 8, kDim = 128, kPairs = 64;
volatile float one = 1.0f;  // read at run time: the compiler may not fold x * 1 away

volatile float zero = 0.0f;

// x * c; with kArithmetic the interleaved rotation's arithmetic as well (a pair swap, two multiplies
// and an add a vector: x * c + swap(x) * 0) but not its loads of factor rows: whether the kernels'
// distance from the floor comes with their instructions alone.
template <bool kPrefetch, bool kArithmetic = false>
__attribute__((noinline)) void floor_loop(float* x, int64_t n, int64_t distance) {
  const __m256 f = _mm256_set1_ps(one), z = _mm256_set1_ps(zero);
  const auto step = [&](float* p) {
    const __m256 a = _mm256_loadu_ps(p);
    __m256 r = _mm256_mul_ps(a, f);
    if constexpr (kArithmetic) r = _mm256_add_ps(r, _mm256_mul_ps(_mm256_permute_ps(a, 0xB1), z));
    _mm256_storeu_ps(p, r);
  };
  for (int64_t i = 0; i < n; i += 16) {
    if constexpr (kPrefetch) _mm_prefetch(reinterpret_cast<const char*>(x + i) + distance, _MM_HINT_T0);
    step(x + i);
    step(x + i + 8);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) g_prefetch.distance = std::atoll(argv[1]);
  const int64_t distance = g_prefetch.distance;
  std::vector<float> q(kTokens * kQ * kDim), k(kTokens * kK * kDim);
  for (auto& v : q) v = std::rand() / static_cast<float>(RAND_MAX);
  for (auto& v : k) v = std::rand() / static_cast<float>(RAND_MAX);
  // Factor rows as the op lays them out (core/rope.h set_factors) and one cos/sin row per pair.
  alignas(64) static float C_il[kDim], S_il[kDim], c[kPairs], s[kPairs];
  for (int64_t i = 0; i < kPairs; ++i) {
    c[i] = 0.6f, s[i] = 0.8f;
    C_il[2 * i] = C_il[2 * i + 1] = 0.6f, S_il[2 * i] = -0.8f, S_il[2 * i + 1] = 0.8f;
  }
  const RowKernels& kernels = *kRowKernelsFor<Avx2>[1][0];
  const RotateRowFn interleaved = kernels.rotate[kRowFloat][1];
  const RotateUniformFn half_split = kernels.uniform[kRowFloat][0][0];
  // interleaved from the cos/sin row (simd_rows.h, Avx2Pairs; its pair order does not matter here:
  // every pair has the same factors)
  const RotateUniformFn interleaved_row = kernels.uniform[kRowFloat][1][0];
  float* qp = q.data();
  float* kp = k.data();

  const std::vector<std::pair<const char*, std::function<void()>>> cases = {
      {"floor (x * c)", [&] { floor_loop<false>(qp, q.size(), 0), floor_loop<false>(kp, k.size(), 0); }},
      {"floor, prefetching", [&] { floor_loop<true>(qp, q.size(), distance), floor_loop<true>(kp, k.size(), distance); }},
      {"floor + rotation arithmetic", [&] {
         floor_loop<true, true>(qp, q.size(), distance), floor_loop<true, true>(kp, k.size(), distance);
       }},
      {"interleaved factor rows", [&] {
         for (int64_t t = 0; t < kTokens; ++t) {
           interleaved(qp + t * kQ * kDim, qp + t * kQ * kDim, kQ, kDim, kDim, kPairs, C_il, S_il);
           interleaved(kp + t * kK * kDim, kp + t * kK * kDim, kK, kDim, kDim, kPairs, C_il, S_il);
         }
       }},
      {"interleaved cos/sin row", [&] {
         for (int64_t t = 0; t < kTokens; ++t) {
           interleaved_row(qp + t * kQ * kDim, qp + t * kQ * kDim, kQ, kDim, kDim, kPairs, c, s);
           interleaved_row(kp + t * kK * kDim, kp + t * kK * kDim, kK, kDim, kDim, kPairs, c, s);
         }
       }},
      {"half-split cos/sin row", [&] {
         for (int64_t t = 0; t < kTokens; ++t) {
           half_split(qp + t * kQ * kDim, qp + t * kQ * kDim, kQ, kDim, kDim, kPairs, c, s);
           half_split(kp + t * kK * kDim, kp + t * kK * kDim, kK, kDim, kDim, kPairs, c, s);
         }
       }},
  };
  std::vector<std::function<void()>> fns;
  for (const auto& entry : cases) entry.second(), fns.push_back(entry.second);  // warm-up: first touch
  const std::vector<double> p10 = alternated_ms(fns, 60, 0.1);
  std::printf("float32 rows from DRAM, %lld bytes, prefetch %lld bytes ahead; 10th percentile of 60 rounds\n",
              static_cast<long long>((q.size() + k.size()) * sizeof(float)), static_cast<long long>(distance));
  for (size_t i = 0; i < cases.size(); ++i) {
    std::printf("  %-28s %7.2f ms  %.3fx the floor\n", cases[i].first, p10[i], p10[i] / p10[0]);
  }
  return 0;
}
