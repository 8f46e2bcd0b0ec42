// bf16 half-split RoPE rows with AVX512-BF16. The portable loop spends most of its time rounding
// float32 results to bf16 (round to nearest even, NaN kept); AVX512-BF16 does that in one
// instruction (vcvtneps2bf16). rope_cpu.cpp calls this first and finishes any remaining pairs with
// the portable loop. Set POSENC_CPU_PORTABLE=1 to force the portable path (the tests compare both:
// identical bits, except that this instruction flushes float32 results below 2^-126 to zero where
// the portable rounding keeps bf16 denormals).
//
// This file is compiled with -mavx512*: it includes no header with inline functions the rest of
// the library also uses (a linker could otherwise keep this file's AVX-512 copy of one).
#include <cstdint>
#include <cstdlib>

#if defined(POSENC_WITH_AVX512BF16)
#include <immintrin.h>
#endif

namespace posenc::cpu {

#if defined(POSENC_WITH_AVX512BF16)
namespace {

bool usable() {
  static const bool ok = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vl") &&
                         __builtin_cpu_supports("avx512bw") && !(std::getenv("POSENC_CPU_PORTABLE") &&
                                                                 std::getenv("POSENC_CPU_PORTABLE")[0] == '1');
  return ok;
}

inline __m512 load_bf16(const uint16_t* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

inline void store_bf16(uint16_t* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
}

}  // namespace

int64_t rotate_row_bf16_avx512(const uint16_t* src, uint16_t* dst, int64_t pairs, const float* c1, const float* s1,
                               const float* c2, const float* s2, bool inverse) {
  if (!usable()) return 0;
  int64_t i = 0;
  for (; i + 16 <= pairs; i += 16) {
    const __m512 a = load_bf16(src + i), b = load_bf16(src + pairs + i);
    const __m512 vc1 = _mm512_loadu_ps(c1 + i), vs1 = _mm512_loadu_ps(s1 + i);
    const __m512 vc2 = _mm512_loadu_ps(c2 + i), vs2 = _mm512_loadu_ps(s2 + i);
    __m512 ra, rb;
    if (!inverse) {  // (a*c1 - b*s1, b*c2 + a*s2), the same operations as rotate_pair
      ra = _mm512_sub_ps(_mm512_mul_ps(a, vc1), _mm512_mul_ps(b, vs1));
      rb = _mm512_add_ps(_mm512_mul_ps(b, vc2), _mm512_mul_ps(a, vs2));
    } else {  // the transpose: (a*c1 + b*s2, b*c2 - a*s1)
      ra = _mm512_add_ps(_mm512_mul_ps(a, vc1), _mm512_mul_ps(b, vs2));
      rb = _mm512_sub_ps(_mm512_mul_ps(b, vc2), _mm512_mul_ps(a, vs1));
    }
    store_bf16(dst + i, ra);
    store_bf16(dst + pairs + i, rb);
  }
  return i;
}

#else

int64_t rotate_row_bf16_avx512(const uint16_t*, uint16_t*, int64_t, const float*, const float*, const float*,
                               const float*, bool) {
  return 0;
}

#endif

}  // namespace posenc::cpu
