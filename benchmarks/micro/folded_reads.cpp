// Microbenchmark of rotate_uniform's folded factor reads (kFold, csrc/cpu/simd_rows.h): the library's
// float32 half-split kernel built with and without them, with the AVX2 path's flags and with the
// AVX-512 paths' (which run float32 rows in 256-bit vectors, RowIsa), all four in one program and
// timed in alternation against a multiply loop over the same bytes (q [1,4096,32,128] and
// k [1,4096,8,128], in place, token by token, q rows then k rows). One process, so the host's load
// drifts into all of them alike where separate builds of the op measured run-to-run noise instead
// (benchmarks/RESULTS.md, "Fifty-first session"). One thread, thread CPU time.
//
// Each kernel build is this file compiled with KERNELS_AS=<name> against a copy of csrc with the fold
// forced on or off (simd_rows.h, kFoldFloatReads); each object's kernels sit in its own anonymous
// namespace:
//
//   M=benchmarks/micro; D=/tmp/folded_reads; for f in on off; do mkdir -p $D/$f && cp -r csrc/cpu csrc/core $D/$f/; done
//   sed -i 's/constexpr bool kFoldFloatReads = .*;/constexpr bool kFoldFloatReads = true;/' $D/on/cpu/simd_rows.h
//   sed -i 's/constexpr bool kFoldFloatReads = .*;/constexpr bool kFoldFloatReads = false;/' $D/off/cpu/simd_rows.h
//   O="-O3 -std=c++20 -ffp-contract=off -falign-functions=64 -Wno-maybe-uninitialized"
//   A2="-mavx2 -mfma -mf16c"; A5="$A2 -mavx512f -mavx512bw -mavx512vl -mavx512dq"
//   g++ $O $A2 -I$D/on -DKERNELS_AS=avx2_folded -c $M/folded_reads.cpp -o $D/1.o
//   g++ $O $A2 -I$D/off -DKERNELS_AS=avx2_unfolded -c $M/folded_reads.cpp -o $D/2.o
//   g++ $O $A5 -I$D/on -DKERNELS_AS=avx512_folded -c $M/folded_reads.cpp -o $D/3.o
//   g++ $O $A5 -I$D/off -DKERNELS_AS=avx512_unfolded -c $M/folded_reads.cpp -o $D/4.o
//   g++ $O $A2 -Icsrc -c $M/folded_reads.cpp -o $D/main.o && g++ $D/*.o -o $D/folded_reads
//   taskset -c 0 $D/folded_reads [prefetch: 1 as isa.cpp picks on AMD Zen 3, 0 (default) Zen 4] [tokens]
//
// tokens (default 4096, the rows from DRAM): fewer keep the rows in cache, 64 as a B=64 decode step's
// (each call then goes over its tokens 262144 / tokens times).
//
// (The AVX-512 objects need a CPU with AVX-512 to run; on an AVX2-only CPU drop 3.o and 4.o and
// build main.o with -DAVX2_ONLY.) The factors are constants of unit norm (cos 0.6, sin 0.8).
#include "cpu/isa.h"

#ifdef KERNELS_AS
#include "cpu/simd_rows.h"

namespace posenc::cpu {
RotateUniformFn KERNELS_AS(bool prefetch) {
  return kRowKernelsFor<Avx2>[prefetch][0]->uniform[kRowFloat][0][0];
}
}  // namespace posenc::cpu

#else
#include <immintrin.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "micro_timing.h"

namespace posenc::cpu {
static Prefetch g_prefetch{true, 0, 8192};
const Prefetch& cpu_prefetch() { return g_prefetch; }
RotateUniformFn avx2_folded(bool prefetch);
RotateUniformFn avx2_unfolded(bool prefetch);
#ifndef AVX2_ONLY
RotateUniformFn avx512_folded(bool prefetch);
RotateUniformFn avx512_unfolded(bool prefetch);
#endif
}  // namespace posenc::cpu

namespace {
using namespace posenc::cpu;
constexpr int64_t kQ = 32, kK = 8, kDim = 128, kPairs = 64;
volatile float one = 1.0f;  // read at run time: the compiler may not fold x * 1 away

__attribute__((noinline)) void floor_loop(float* x, int64_t n) {
  const __m256 f = _mm256_set1_ps(one);
  for (int64_t i = 0; i < n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), f));
}
}  // namespace

int main(int argc, char** argv) {
  const bool prefetch = argc > 1 && argv[1][0] == '1';
  const int64_t tokens = argc > 2 ? std::atoll(argv[2]) : 4096, passes = 262144 / tokens;
  if (tokens < 1 || tokens > 262144) return std::fprintf(stderr, "tokens: expected 1 to 262144\n"), 1;
  std::vector<float> q(tokens * kQ * kDim), k(tokens * kK * kDim);
  for (auto& v : q) v = std::rand() / static_cast<float>(RAND_MAX);
  for (auto& v : k) v = std::rand() / static_cast<float>(RAND_MAX);
  alignas(64) static float c[kPairs], s[kPairs];
  for (int64_t i = 0; i < kPairs; ++i) c[i] = 0.6f, s[i] = 0.8f;
  float* qp = q.data();
  float* kp = k.data();
  const auto op_order = [&](RotateUniformFn rows) {
    return [=] {
      for (int64_t pass = 0; pass < passes; ++pass) {
        for (int64_t t = 0; t < tokens; ++t) {
          rows(qp + t * kQ * kDim, qp + t * kQ * kDim, kQ, kDim, kDim, kPairs, c, s);
          rows(kp + t * kK * kDim, kp + t * kK * kDim, kK, kDim, kDim, kPairs, c, s);
        }
      }
    };
  };
  const std::vector<std::pair<const char*, std::function<void()>>> cases = {
      {"floor (x * c)", [&] {
         for (int64_t pass = 0; pass < passes; ++pass) floor_loop(qp, q.size()), floor_loop(kp, k.size());
       }},
      {"AVX2 flags, folded", op_order(avx2_folded(prefetch))},
      {"AVX2 flags, unfolded", op_order(avx2_unfolded(prefetch))},
#ifndef AVX2_ONLY
      {"AVX-512 flags, folded", op_order(avx512_folded(prefetch))},
      {"AVX-512 flags, unfolded", op_order(avx512_unfolded(prefetch))},
#endif
  };
  std::vector<std::function<void()>> fns;
  for (const auto& entry : cases) entry.second(), fns.push_back(entry.second);  // warm-up: first touch
  const std::vector<double> p10 = alternated_ms(fns, 60, 0.1), median = alternated_ms(fns, 60, 0.5);
  std::printf("float32 half-split rows, %lld tokens, prefetch %s; 60 alternated rounds, 10th percentile | median\n",
              static_cast<long long>(tokens), prefetch ? "on" : "off");
  for (size_t i = 0; i < cases.size(); ++i) {
    std::printf("  %-24s %6.2f ms %.3fx | %6.2f ms %.3fx the floor\n", cases[i].first, p10[i], p10[i] / p10[0],
                median[i], median[i] / median[0]);
  }
  return 0;
}
#endif
