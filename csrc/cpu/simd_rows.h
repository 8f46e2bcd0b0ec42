// The SIMD row kernels, RoPE's (rotate_row_simd, rotate_row_simd_uniform) and the sinusoidal ops'
// (encoding_row_simd), each one body over small policies: an instruction set (float vector ops)
// and, per element type, a load/store pair that converts to and from float32.
// Only the rows_*.cpp files include this header, each compiled with its own -m flags; everything
// here is in an anonymous namespace, so each file keeps its own copy, compiled for its instruction
// set (shared inline code could otherwise be merged by the linker into one copy that needs the
// widest of them). For the same reason it includes no torch header.
//
// Results equal rotate_row's (core/rope.h) bit for bit: the same multiply, multiply, add per element
// (no FMA: the library is built with -ffp-contract=off) and the same roundings on store: F16C and
// the integer round-to-nearest-even below are those of c10::Half and from_math<c10::BFloat16>.
#pragma once
#include <cstdint>
#include <type_traits>
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

#include "cpu/isa.h"

namespace posenc::cpu {
namespace {

struct Float {
  using T = float;
  static constexpr int kIndex = kRowFloat;
};
struct BFloat16 {
  using T = uint16_t;
  static constexpr int kIndex = kRowBFloat16;
};
struct Half {
  using T = uint16_t;
  static constexpr int kIndex = kRowHalf;
};

// Load/store of W floats as element type D, for instruction set I (specialized below). store<true>
// writes with non-temporal stores (cpu/isa.h, Streaming), which need the address aligned to the
// vector's size: the caller streams only rows so aligned (rope_cpu.cpp).
template <class I, class D>
struct Io;

#if defined(__AVX2__)
template <bool kStream>
inline void put(float* p, __m256 v) {
  if constexpr (kStream) _mm256_stream_ps(p, v); else _mm256_storeu_ps(p, v);
}
template <bool kStream>
inline void put(uint16_t* p, __m128i v) {
  if constexpr (kStream) _mm_stream_si128(reinterpret_cast<__m128i*>(p), v); else _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v);
}
template <bool kStream>
inline void put(uint16_t* p, __m256i v) {
  if constexpr (kStream) _mm256_stream_si256(reinterpret_cast<__m256i*>(p), v); else _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
}
#endif
#if defined(__AVX512F__)
template <bool kStream>
inline void put(float* p, __m512 v) {
  if constexpr (kStream) _mm512_stream_ps(p, v); else _mm512_storeu_ps(p, v);
}
template <bool kStream>
inline void put(uint16_t* p, __m512i v) {
  if constexpr (kStream) _mm512_stream_si512(reinterpret_cast<__m512i*>(p), v); else _mm512_storeu_si512(p, v);
}
#endif

#if defined(__AVX2__) && defined(__F16C__)
struct Avx2 {
  using F = __m256;
  static constexpr int kLanes = 8;
  static F loadf(const float* p) { return _mm256_loadu_ps(p); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F set1(float v) { return _mm256_set1_ps(v); }
  static F swap_pairs(F x) { return _mm256_permute_ps(x, 0xB1); }  // (x0,x1,x2,x3) -> (x1,x0,x3,x2)
  // 16 floats at p as (even elements, odd elements), in place, for even_odd_row.
  static void split_even_odd(float* p) {
    const __m256 v0 = _mm256_loadu_ps(p), v1 = _mm256_loadu_ps(p + 8);
    // shuffle_ps works per 128-bit lane: (0,2,8,10 | 4,6,12,14), then the middle quadwords swap.
    const __m256 even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(v0, v1, 0x88)), 0xD8));
    const __m256 odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(v0, v1, 0xDD)), 0xD8));
    _mm256_storeu_ps(p, even);
    _mm256_storeu_ps(p + 8, odd);
  }
};

// fp16 rows on the AVX2 path: the adds as fused multiply-adds by one, x * 1 + y, which rounds once,
// as x + y does, so the bits are the same. F16C's conversions share AMD Zen's two floating-point add
// pipes, where the multiplies and FMAs have two of their own; moved there, the interleaved rows in L1
// took 1.64x the fp16 floor's time instead of 1.79x (benchmarks/micro/rope_rows.cpp). The AVX-512
// paths' fp16 rows swap pairs with a rotate instead, which measured as fast with plain adds.
#if defined(__FMA__)
struct Avx2Fma : Avx2 {
  static F add(F a, F b) { return _mm256_fmadd_ps(a, _mm256_set1_ps(1.0f), b); }
  static F sub(F a, F b) { return _mm256_fmsub_ps(a, _mm256_set1_ps(1.0f), b); }
};

template <class D>
struct Io<Avx2Fma, D> : Io<Avx2, D> {};
#endif

template <>
struct Io<Avx2, Float> {
  static __m256 load(const float* p) { return _mm256_loadu_ps(p); }
  template <bool kStream = false>
  static void store(float* p, __m256 v) { put<kStream>(p, v); }
};

// float32 interleaved rows for the uniform kernels (one cos/sin row per token instead of factor
// rows): two vectors of 8 pairs as a vector of their first elements and one of their second, by a
// shuffle within each 128-bit lane on load and an unpack on store (no lane-crossing permute). Each
// lane then holds two pairs of the first vector and two of the second, so the kernel reads cos and
// sin in that order (pair_order_row; frequencies in that order: rope_cpu.cpp). A policy of its own:
// the factor-row kernels keep Io<Avx2, Float>'s row order.
struct Avx2Pairs : Avx2 {};

template <>
struct Io<Avx2Pairs, Float> : Io<Avx2, Float> {
  static constexpr bool kEvenOdd = true;
  static void load2(const float* p, __m256& a, __m256& b) {
    const __m256 v0 = _mm256_loadu_ps(p), v1 = _mm256_loadu_ps(p + 8);
    a = _mm256_shuffle_ps(v0, v1, 0x88);  // per lane: elements 0, 2 of v0, then 0, 2 of v1
    b = _mm256_shuffle_ps(v0, v1, 0xDD);  // 1, 3 of v0, then 1, 3 of v1
  }
  template <bool kStream = false>
  static void store2(float* p, __m256 a, __m256 b) {
    put<kStream>(p, _mm256_unpacklo_ps(a, b));
    put<kStream>(p + 8, _mm256_unpackhi_ps(a, b));
  }
};

template <>
struct Io<Avx2, Half> {
  static __m256 load(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static __m128i round(__m256 v) { return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  template <bool kStream = false>
  static void store(uint16_t* p, __m256 v) { put<kStream>(p, round(v)); }
  template <bool kStream = false>
  static void store_pair(uint16_t* p, __m256 lo, __m256 hi) { put<kStream>(p, _mm256_set_m128i(round(hi), round(lo))); }
};

template <>
struct Io<Avx2, BFloat16> {
  static __m256 load(const uint16_t* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  // Round to nearest even on the integer bits, NaN -> 0x7fc0: from_math<c10::BFloat16>, 8 lanes of
  // 32 bits (the bf16 in the low half).
  static __m256i round(__m256 v) {
    const __m256i r = _mm256_srli_epi32(round_high(v), 16);
    return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  }
  template <bool kStream = false>
  static void store(uint16_t* p, __m256 v) {
    const __m256i r = round(v);  // packus works per 128-bit lane: keep quadwords 0 and 2
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    put<kStream>(p, _mm256_castsi256_si128(packed));
  }
  template <bool kStream = false>
  static void store_pair(uint16_t* p, __m256 lo, __m256 hi) {
    const __m256i packed = _mm256_packus_epi32(round(lo), round(hi));  // lo 0-3, hi 0-3 | lo 4-7, hi 4-7
    put<kStream>(p, _mm256_permute4x64_epi64(packed, 0xD8));
  }
  // 16 values as two vectors of the even and of the odd elements (kEvenOdd: the rows the kernels
  // read are reordered to match, even_odd_row): a bf16 is the high half of a float32, so this is a shift
  // and a mask on load, and on store the rounded odd values keep their high halves in place while
  // the even ones shift down (no widening, packing or cross-lane permute).
  static constexpr bool kEvenOdd = true;
  static void load2(const uint16_t* p, __m256& even, __m256& odd) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    even = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
    odd = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  }
  // round() before its final shift and NaN test: the bf16 in the high half (NaN handled by the caller).
  static __m256i round_high(__m256 v) {
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    return _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), lsb);
  }
  template <bool kStream = false>
  static void store2(uint16_t* p, __m256 even, __m256 odd) {
    __m256i e = round_high(even), o = round_high(odd);
    const __m256 any_nan = _mm256_cmp_ps(even, odd, _CMP_UNORD_Q);
    if (!_mm256_testz_ps(any_nan, any_nan)) [[unlikely]] {
      const __m256i nan = _mm256_set1_epi32(0x7fc00000);
      e = _mm256_blendv_epi8(e, nan, _mm256_castps_si256(_mm256_cmp_ps(even, even, _CMP_UNORD_Q)));
      o = _mm256_blendv_epi8(o, nan, _mm256_castps_si256(_mm256_cmp_ps(odd, odd, _CMP_UNORD_Q)));
    }
    put<kStream>(p, _mm256_blend_epi16(_mm256_srli_epi32(e, 16), o, 0xAA));
  }
};
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
struct Avx512 {
  using F = __m512;
  static constexpr int kLanes = 16;
  static F loadf(const float* p) { return _mm512_loadu_ps(p); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F set1(float v) { return _mm512_set1_ps(v); }
  static F swap_pairs(F x) { return _mm512_permute_ps(x, 0xB1); }
};

template <>
struct Io<Avx512, Float> {
  static __m512 load(const float* p) { return _mm512_loadu_ps(p); }
  template <bool kStream = false>
  static void store(float* p, __m512 v) { put<kStream>(p, v); }
};

template <>
struct Io<Avx512, Half> {
  static __m512 load(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  template <bool kStream = false>
  static void store(uint16_t* p, __m512 v) {
    put<kStream>(p, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
};

template <>
struct Io<Avx512, BFloat16> {
  static __m512 load(const uint16_t* p) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
  template <bool kStream = false>
  static void store(uint16_t* p, __m512 v) {  // as Io<Avx2, BFloat16>::store, 16 lanes
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), lsb), 16);
    r = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), r, _mm512_set1_epi32(0x7fc0));
    put<kStream>(p, _mm512_cvtepi32_epi16(r));
  }
};

// fp16 rows on the AVX-512 paths in 256-bit vectors (isa.h, VectorWidth): the Avx2 policy, which
// measured faster than 512-bit ones on AMD Zen 4 (in place against the memory floor), with the
// interleaved pair swap as a 64-bit rotate (AVX512VL), which measured faster there than the float
// permute. In 512-bit vectors they take the path's own policy (rows_avx512*.cpp).
struct Avx512Ymm : Avx2 {
  static F swap_pairs(F x) { return _mm256_castsi256_ps(_mm256_ror_epi64(_mm256_castps_si256(x), 32)); }
};

template <class D>
struct Io<Avx512Ymm, D> : Io<Avx2, D> {};

#if defined(__AVX512BF16__)
// AVX-512 with vcvtneps2bf16 for the bf16 store (one instruction instead of six). It flushes
// float32 results below 2^-126 to zero and keeps NaN payloads, where from_math keeps bf16
// denormals and writes 0x7fc0; elsewhere the same bits.
struct Avx512Bf16 : Avx512 {};

template <class D>
struct Io<Avx512Bf16, D> : Io<Avx512, D> {};

template <>
struct Io<Avx512Bf16, BFloat16> : Io<Avx512, BFloat16> {
  template <bool kStream = false>
  static void store(uint16_t* p, __m512 v) {
    put<kStream>(p, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
  }
  template <bool kStream = false>
  static void store2(uint16_t* p, __m512 lo, __m512 hi) {  // 32 values in one instruction
    put<kStream>(p, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
  }
};
#endif
#endif

template <class IO>
constexpr bool kEvenOdd = requires { IO::kEvenOdd; };

// K vectors loaded from p into v[0..K) (stored from v): one load2/store2 (a policy's move of two
// vectors) when it has one.
template <class I, class IO, int K, typename T, typename F>
[[gnu::always_inline]] inline void load_n(const T* p, F (&v)[K]) {
  if constexpr (K == 2 && requires { IO::load2(p, v[0], v[1]); }) {
    IO::load2(p, v[0], v[1]);
  } else {
    for (int k = 0; k < K; ++k) v[k] = IO::load(p + k * I::kLanes);
  }
}

template <class I, class IO, bool kStream, int K, typename T, typename F>
[[gnu::always_inline]] inline void store_n(T* p, const F (&v)[K]) {
  if constexpr (K == 2 && requires { IO::store2(p, v[0], v[1]); }) {
    IO::template store2<kStream>(p, v[0], v[1]);
  } else {
    for (int k = 0; k < K; ++k) IO::template store<kStream>(p + k * I::kLanes, v[k]);
  }
}

// Software prefetch (isa.h, cpu_prefetch): the lines `distance` bytes past the `bytes` a step reads
// at p, a token's rows being read in address order (and the next token's after them). On Intel
// servers one core's bandwidth is bound by the misses it keeps in flight, and a rotation step has more
// instructions than the floor's multiply, so fewer of its loads are in flight: with this, float32 rows
// went from 1.10-1.45x to 0.8-0.9x the in-place floor (benchmarks/RESULTS.md); on AMD Zen 3, fp16 and
// bf16 from ~1.0x and ~0.94x to ~0.8x. AMD Zen 4 measured slower with it. prefetch_lines (isa.h)
// issues it.
template <bool kPrefetch, typename T>
[[gnu::always_inline]] inline void prefetch_ahead(const T* p, int bytes, int64_t distance) {
  if constexpr (kPrefetch) prefetch_lines(p, bytes, distance);
}

// How a kernel moves its rows: with software prefetch (above) or not, and writing with non-temporal
// stores (Io::store<true>) or not. One table of kernels per combination (kRowKernelsFor).
template <bool kPrefetchRows, bool kStreamStores>
struct Moves {
  static constexpr bool kPrefetch = kPrefetchRows;
  static constexpr bool kStream = kStreamStores;
};

// K vectors of one row from element j: out[j] = x[j] * C[j] + x[partner(j)] * S[j] (core/rope.h,
// rotate_row). Interleaved, j runs over the row and the partner vector is x with each pair swapped;
// half-split, j runs over the first half and the partner of a = row[j] is b = row[j + pairs].
// With an even/odd policy (K = 2) the two vectors hold the even and the odd elements of 2W, so the
// interleaved partner of one is the other, and the factor rows are in that order (even_odd_row).
// Always inlined: GCC otherwise keeps the two-vector step as a call per step (seen in a profile),
// about 10% of the fp32 time.
template <class I, class D, bool kInterleaved, class Mv, int K>
[[gnu::always_inline]] inline void rotate_block(const typename D::T* src, typename D::T* dst, int64_t j, int64_t pairs, const float* C,
                         const float* S, int64_t distance) {
  using IO = Io<I, D>;
  constexpr int W = I::kLanes;
  constexpr bool kEo = K == 2 && kEvenOdd<IO>;
  typename I::F a[K], b[K], out_a[K], out_b[K];
  constexpr int kBytes = K * W * sizeof(typename D::T);
  prefetch_ahead<Mv::kPrefetch>(src + j, kBytes, distance);
  if constexpr (!kInterleaved) prefetch_ahead<Mv::kPrefetch>(src + pairs + j, kBytes, distance);
  load_n<I, IO>(src + j, a);
  if constexpr (!kInterleaved) load_n<I, IO>(src + pairs + j, b);
  if constexpr (kInterleaved && !kEo && !Mv::kPrefetch) {
    // GCC otherwise loads a float32 vector twice, folded into the swap and into the multiply. One
    // load measured 12-17% faster on rows in cache (AMD Zen 3) but 2-6% slower from DRAM, where
    // the kernels with prefetch run: so only these take it (benchmarks/RESULTS.md, "Forty-third session")
    for (int k = 0; k < K; ++k) asm("" : "+v"(a[k]));
  }
  for (int k = 0; k < K; ++k) {
    const int64_t e = j + k * W;
    if constexpr (kInterleaved) {
      const auto partner = kEo ? a[1 - k] : I::swap_pairs(a[k]);
      out_a[k] = I::add(I::mul(a[k], I::loadf(C + e)), I::mul(partner, I::loadf(S + e)));
    } else {
      out_a[k] = I::add(I::mul(a[k], I::loadf(C + e)), I::mul(b[k], I::loadf(S + e)));
      out_b[k] = I::add(I::mul(b[k], I::loadf(C + pairs + e)), I::mul(a[k], I::loadf(S + pairs + e)));
    }
  }
  store_n<I, IO, Mv::kStream>(dst + j, out_a);
  if constexpr (!kInterleaved) store_n<I, IO, Mv::kStream>(dst + pairs + j, out_b);
}

// The row kernel (isa.h, RotateRowFn): two vectors per step (fewer loop instructions, and 16-bit
// types move two vectors per load and store), then single vectors; returns the pairs done per row.
template <class I, class D, bool kInterleaved, class Mv>
int64_t rotate_row_simd(const void* src_v, void* dst_v, int64_t rows, int64_t src_stride, int64_t dst_stride,
                        int64_t pairs, const float* C, const float* S) {
  using T = typename D::T;
  constexpr int W = I::kLanes;
  const int64_t n = kInterleaved ? 2 * pairs : pairs;  // elements of the row (interleaved) or of a half
  const int64_t twos = n / (2 * W) * (2 * W);
  const int64_t full = n / W * W;
  const int64_t distance = Mv::kPrefetch ? cpu_prefetch().distance : 0;
  for (int64_t r = 0; r < rows; ++r) {
    const T* src = static_cast<const T*>(src_v) + r * src_stride;
    T* dst = static_cast<T*>(dst_v) + r * dst_stride;
    for (int64_t j = 0; j < twos; j += 2 * W) rotate_block<I, D, kInterleaved, Mv, 2>(src, dst, j, pairs, C, S, distance);
    for (int64_t j = twos; j < full; j += W) rotate_block<I, D, kInterleaved, Mv, 1>(src, dst, j, pairs, C, S, distance);
  }
  return kInterleaved ? full / 2 : full;
}

// Whether this file's float32 rows fold their factor reads (rotate_uniform, below): on the AVX2 path
// (measured on AMD Zen 3), not on the AVX-512 paths, whose float32 rows take the same Avx2 policy
// (RowIsa) but are compiled in their own files with these flags: on AMD Zen 4 the kernel read as fast
// from DRAM without the fold and 5-7% faster on rows in cache, a B=64 decode step's 64 tokens
// (benchmarks/micro/folded_reads.cpp; benchmarks/RESULTS.md, "Fifty-first session").
#if defined(__AVX512F__)
constexpr bool kFoldFloatReads = false;
#else
constexpr bool kFoldFloatReads = true;
#endif

// One vector of pairs' first elements a and one of their second elements b, rotated by the pairs'
// cos at c and sin at s: a*c - b*s, b*c + a*s (core/rope.h, rotate_row_uniform), the inverse with the
// signs swapped. With kFold each factor is read once per multiply, a compiler barrier between the two
// reads, so GCC folds every read into its multiply instead of loading c and s into registers first:
// float32 half-split rows from DRAM on one AMD Zen 3 thread (the kernel alone, in the op's order) went
// from 1.12-1.18x to 1.04-1.05x the memory floor; 16-bit rows measured up to 5% slower with it, so
// only float32 rows take it (benchmarks/RESULTS.md, "Forty-fifth session"), and only on the AVX2 path
// (kFoldFloatReads). The barrier orders no memory access the result depends on (a and b are already
// in registers); the bits are the same.
template <class I, bool kInverse, bool kFold, class F>
[[gnu::always_inline]] inline void rotate_uniform(F a, F b, const float* c, const float* s, F& out_a, F& out_b) {
  const F ac = I::mul(a, I::loadf(c)), bs = I::mul(b, I::loadf(s));
  if constexpr (kFold) asm("" ::: "memory");
  const F bc = I::mul(b, I::loadf(c)), as = I::mul(a, I::loadf(s));
  out_a = kInverse ? I::add(ac, bs) : I::sub(ac, bs);
  out_b = kInverse ? I::sub(bc, as) : I::add(bc, as);
}

// isa.h, RotateUniformFn: K vectors of rows from element j with the pairs' cos c[i] and sin s[i]
// read directly (the same bits as rotate_row with set_factors, since adding b * (-s) is subtracting
// b * s). Half-split, j runs over the first half and c, s along with it: vectors move one at a
// time, or two at a time with an even/odd policy (c and s then in even_odd_row's order); storing
// the two vectors of AVX512-BF16 in one conversion measured no faster. Interleaved (even/odd
// policies only) the two vectors of 2W elements are the a and the b of W pairs, from pair j / 2.
template <class I, class D, bool kInterleaved, bool kInverse, class Mv, int K>
[[gnu::always_inline]] inline void rotate_block_uniform(const typename D::T* src, typename D::T* dst, int64_t j,
                                                        int64_t pairs, const float* c, const float* s,
                                                        int64_t distance) {
  using IO = Io<I, D>;
  constexpr int W = I::kLanes;
  constexpr int kBytes = K * W * sizeof(typename D::T);
  constexpr int kMove = K % 2 == 0 && kEvenOdd<IO> ? 2 : 1;
  static_assert(!kInterleaved || kMove == 2, "interleaved rows need an even/odd policy's pairs of vectors");
  constexpr bool kFold = std::is_same_v<D, Float> && kFoldFloatReads;  // (rotate_uniform)
  prefetch_ahead<Mv::kPrefetch>(src + j, kBytes, distance);
  if constexpr (!kInterleaved) prefetch_ahead<Mv::kPrefetch>(src + pairs + j, kBytes, distance);
  for (int k = 0; k < K; k += kMove) {
    const int64_t e = j + k * W;
    typename I::F a[kMove], out_a[kMove];
    load_n<I, IO>(src + e, a);
    if constexpr (kInterleaved) {
      rotate_uniform<I, kInverse, kFold>(a[0], a[1], c + e / 2, s + e / 2, out_a[0], out_a[1]);
      store_n<I, IO, Mv::kStream>(dst + e, out_a);
    } else {
      typename I::F b[kMove], out_b[kMove];
      load_n<I, IO>(src + pairs + e, b);
      for (int m = 0; m < kMove; ++m) {
        rotate_uniform<I, kInverse, kFold>(a[m], b[m], c + e + m * W, s + e + m * W, out_a[m], out_b[m]);
      }
      store_n<I, IO, Mv::kStream>(dst + e, out_a);
      store_n<I, IO, Mv::kStream>(dst + pairs + e, out_b);
    }
  }
}

// Four vectors per step, then two, then one (half-split only): float32 rows streamed from DRAM
// measured ~3-8% faster with four than with two on AMD Zen 3 (fewer loop instructions between the
// loads; eight measured no better than four, and four serve rows from 32 pairs up).
template <class I, class D, bool kInterleaved, bool kInverse, class Mv>
int64_t rotate_row_simd_uniform(const void* src_v, void* dst_v, int64_t rows, int64_t src_stride, int64_t dst_stride,
                                int64_t pairs, const float* c, const float* s) {
  using T = typename D::T;
  constexpr int W = I::kLanes;
  const int64_t n = kInterleaved ? 2 * pairs : pairs;  // elements of the row (interleaved) or of a half
  const int64_t fours = n / (4 * W) * (4 * W);
  const int64_t twos = n / (2 * W) * (2 * W);
  const int64_t full = kInterleaved ? twos : n / W * W;
  const int64_t distance = Mv::kPrefetch ? cpu_prefetch().distance : 0;
  for (int64_t r = 0; r < rows; ++r) {
    const T* src = static_cast<const T*>(src_v) + r * src_stride;
    T* dst = static_cast<T*>(dst_v) + r * dst_stride;
    for (int64_t j = 0; j < fours; j += 4 * W)
      rotate_block_uniform<I, D, kInterleaved, kInverse, Mv, 4>(src, dst, j, pairs, c, s, distance);
    for (int64_t j = fours; j < twos; j += 2 * W)
      rotate_block_uniform<I, D, kInterleaved, kInverse, Mv, 2>(src, dst, j, pairs, c, s, distance);
    if constexpr (!kInterleaved) {
      for (int64_t j = twos; j < full; j += W)
        rotate_block_uniform<I, D, kInterleaved, kInverse, Mv, 1>(src, dst, j, pairs, c, s, distance);
    }
  }
  return kInterleaved ? full / 2 : full;
}

// The policy whose interleaved uniform kernel serves element type D on path I, moving rows as Mv
// says: I itself (bf16's even/odd policy), or for float32 in 256-bit vectors with prefetch Avx2Pairs.
// Against the factor-row kernel through the op (AMD Zen 3, two threads, q [1,4096,32,128] and k
// [1,4096,8,128] in place) its rows from DRAM took ~4% less time, against the half-split rows as the
// control; rows in cache with prefetch (as Intel CPUs take it from 32 KiB: 512 tokens, a B=64 decode
// step, one thread) 0-7% less. Without prefetch, rows in cache took 10-40% more than the factor-row
// kernel's, which loads each vector once there: its shuffles cost more than the factor rows' loads
// and per-token work (benchmarks/RESULTS.md, "Forty-eighth session" and "Forty-ninth session").
template <class I, class D, class Mv>
struct PairsIsa {
  using type = I;
};
#if defined(__AVX2__) && defined(__F16C__)
template <class Mv>
  requires(Mv::kPrefetch)
struct PairsIsa<Avx2, Float, Mv> {
  using type = Avx2Pairs;
};
#endif

// The uniform kernel of a policy, or nullptr where it keeps its factor rows. Half-split rows take it
// with every policy: against the in-place memory floor it measured faster than the factor rows
// (fp16 ~5-10%, benchmarks/micro/rope_rows.cpp; float32 ~17% on cache-resident decode batches and
// as fast from DRAM; bf16 on the AVX-512 paths as fast with many heads and 15-20% faster with one,
// whose per-token factor rows were a fifth of its time; AVX2's even/odd bf16 ~30% faster with one:
// benchmarks/RESULTS.md). Interleaved rows only with a policy whose pairs of vectors are the pairs'
// a and b as they load (even/odd, PairsIsa); spreading c and s over the pairs with a lane-crossing
// shuffle per vector instead measured slower at decode than the factor rows, which pay once per token.
template <class I, class D, class Mv, bool kInterleaved, bool kInverse>
constexpr RotateUniformFn uniform_rows() {
  using P = typename PairsIsa<I, D, Mv>::type;
  if constexpr (!kInterleaved) {
    return rotate_row_simd_uniform<I, D, false, kInverse, Mv>;
  } else if constexpr (kEvenOdd<Io<P, D>>) {
    return rotate_row_simd_uniform<P, D, true, kInverse, Mv>;
  } else {
    return nullptr;
  }
}

template <class I, class D, class Mv>
constexpr RotateUniformFn kUniform[2][2] = {{uniform_rows<I, D, Mv, false, false>(), uniform_rows<I, D, Mv, false, true>()},
                                            {uniform_rows<I, D, Mv, true, false>(), uniform_rows<I, D, Mv, true, true>()}};

// isa.h, OrderRowFn, for an even/odd policy: the entries its two-vector steps read (blocks of 2W
// from the start of the row) as (even elements, odd elements) per block; the rest in row order for
// the single-vector steps and the portable loops.
template <class I>
void even_odd_row(float* row, int64_t n) {
  constexpr int W = I::kLanes;
  const int64_t twos = n / (2 * W) * (2 * W);
  for (int64_t j = 0; j < twos; j += 2 * W) I::split_even_odd(row + j);
}

// out[d, d + K * W) from value(d) (and value(d + W)): with K = 2, one store of both vectors, where
// the policy has one (store_pair: Avx2's 16-bit rows, a 32-byte store instead of two 16-byte ones).
template <class I, class IO, bool kStream, int K, typename T, typename Value>
[[gnu::always_inline]] inline void store_contiguous(T* out, int64_t d, const Value& value) {
  if constexpr (K == 2) {
    IO::template store_pair<kStream>(out + d, value(d), value(d + I::kLanes));
  } else {
    IO::template store<kStream>(out + d, value(d));
  }
}

// isa.h, EncodingRowFn: a 64-byte line of x per step (with its prefetch), then single vectors; the
// multiply and add of the compiled loop, so the same bits. Without x, the conversion alone. For
// 16-bit rows only: fp16 rows are where it counts (the compiled loop's conversion, without F16C,
// took add_sinusoidal from 1.25x to 5x the time of x * c), bf16's on the AVX-512 paths gained too
// (1.3x -> 0.9x), and float32's compiled loop measured as fast (benchmarks/RESULTS.md). With
// Mv::kStream it writes the output itself with non-temporal stores (cpu/sinusoidal_cpu.cpp, RowsPlan),
// two vectors a store where the policy can: on two AMD Zen 3 cores, a streamed [32768, 1024] bf16
// table went from 5.0-5.1 to 4.6 ms, add_sinusoidal of [8, 4096, 1024] bf16 from 4.5-4.7 to
// 3.9-4.2 ms, fp16's as fast either way (benchmarks/RESULTS.md, "Forty-seventh session").
template <class I, class D, class Mv>
int64_t encoding_row_simd(void* out_v, const void* x_v, float x_scale, const float* pe, int64_t n) {
  using T = typename D::T;
  using IO = Io<I, D>;
  constexpr int W = I::kLanes;
  constexpr int kPerLine = 64 / (W * sizeof(T)) > 0 ? 64 / (W * sizeof(T)) : 1;  // vectors
  constexpr int kPair =
      kPerLine % 2 == 0 && requires(T* p, typename I::F v) { IO::template store_pair<false>(p, v, v); } ? 2 : 1;
  const T* x = static_cast<const T*>(x_v);
  T* out = static_cast<T*>(out_v);
  const int64_t full = n / W * W;
  const int64_t lines = n / (kPerLine * W) * (kPerLine * W);
  if (!x) {
    const auto converted = [&](int64_t d) { return I::loadf(pe + d); };
    for (int64_t d = 0; d < lines; d += kPair * W) store_contiguous<I, IO, Mv::kStream, kPair>(out, d, converted);
    for (int64_t d = lines; d < full; d += W) store_contiguous<I, IO, Mv::kStream, 1>(out, d, converted);
    return full;
  }
  const typename I::F scale = I::set1(x_scale);
  const auto sum = [&](int64_t d) { return I::add(I::mul(IO::load(x + d), scale), I::loadf(pe + d)); };
  const int64_t distance = Mv::kPrefetch ? cpu_prefetch().distance : 0;
  for (int64_t d = 0; d < lines; d += kPerLine * W) {
    prefetch_ahead<Mv::kPrefetch>(x + d, 64, distance);
    for (int k = 0; k < kPerLine; k += kPair) store_contiguous<I, IO, Mv::kStream, kPair>(out, d + k * W, sum);
  }
  for (int64_t d = lines; d < full; d += W) store_contiguous<I, IO, Mv::kStream, 1>(out, d, sum);
  return full;
}

// WidenRowFn (cpu/isa.h): a 16-bit row's whole vectors widened to float32 by the path's load (F16C
// for fp16). fp16's compiled conversion (to_math, integer operations) is several instructions per
// element: the fp16 bias backward took 4.3x the time of grad.sum() with it, a one-head fp16 table
// prefill 1.7x its frequency path. bf16's is a shift, and its compiled loop measured faster
// (table prefill ~10%, bias backward ~15%): no bf16 kernel in the table.
template <class I, class D>
int64_t widen_row_simd(const void* src_v, float* dst, int64_t n) {
  using T = typename D::T;
  constexpr int W = I::kLanes;
  const T* src = static_cast<const T*>(src_v);
  const int64_t full = n / W * W;
  for (int64_t d = 0; d < full; d += W) Io<I, Float>::store(dst + d, Io<I, D>::load(src + d));
  return full;
}

template <class I, class D, class Mv>
constexpr RotateRowFn kRotate[2] = {rotate_row_simd<I, D, false, Mv>, rotate_row_simd<I, D, true, Mv>};

template <class I, class D>
constexpr OrderRowFn order_row() {
  static_assert(std::is_same_v<D, BFloat16> || !kEvenOdd<Io<I, D>>, "rope_cpu.cpp reorders only bf16 rows");
  if constexpr (kEvenOdd<Io<I, D>>) {
    return even_odd_row<I>;
  } else {
    return nullptr;  // rows read in row order
  }
}

// isa.h, OrderRowFn, for the interleaved uniform kernel of Avx2Pairs: the pairs of each block of W
// as its vectors hold them (lane L of 128 bits: pairs 2L, 2L + 1 of the first half of the block,
// then the same two of the second half), the rest in pair order.
template <class I>
void pair_order_row(float* row, int64_t n) {
  constexpr int W = I::kLanes;
  for (int64_t j = 0; j + W <= n; j += W) {
    float block[W];
    for (int l = 0; l < W; ++l) block[l] = row[j + (l % 4 < 2 ? 0 : W / 2) + 2 * (l / 4) + l % 2];
    for (int l = 0; l < W; ++l) row[j + l] = block[l];
  }
}

// RowKernels::uniform_order: half-split, the even/odd order of the policy's factor rows (order_row);
// interleaved, pair_order_row for Avx2Pairs, pair order (nullptr) for the even/odd policies, whose
// vectors hold the pairs as they come.
template <class I, class D, class Mv>
constexpr OrderRowFn kUniformOrder[2] = {
    order_row<I, D>(), std::is_same_v<typename PairsIsa<I, D, Mv>::type, I> ? nullptr : pair_order_row<I>};

// The vectors a path uses for element type D: its own, or narrower ones that measured faster.
template <class I, class D>
struct RowIsa {
  using type = I;
};
#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
template <>
struct RowIsa<Avx2, Half> {
  using type = Avx2Fma;
};
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
template <class I>
  requires std::is_base_of_v<Avx512, I>
struct RowIsa<I, Half> {
  using type = Avx512Ymm;
};
// float32 too: 512-bit rows measured ~15% slower than 256-bit ones against the in-place memory
// floor (DRAM-bound, AMD Zen 4), as fast on cache-resident decode batches (benchmarks/RESULTS.md);
// rows_avx512*.cpp take the path's own where isa.h's VectorWidth says so.
template <class I>
  requires std::is_base_of_v<Avx512, I>
struct RowIsa<I, Float> {
  using type = Avx2;
};
#endif

// The table of one instruction set, for one way of moving rows (Moves), with fp16 rows in vectors H
// and float32 rows in F, indexed as RowKernels::rotate and RowKernels::order.
template <class I, class Mv, class H = typename RowIsa<I, Half>::type, class F = typename RowIsa<I, Float>::type,
          class B = typename RowIsa<I, BFloat16>::type>
constexpr RowKernels kRowKernels = {{{kRotate<F, Float, Mv>[0], kRotate<F, Float, Mv>[1]},
                                     {kRotate<B, BFloat16, Mv>[0], kRotate<B, BFloat16, Mv>[1]},
                                     {kRotate<H, Half, Mv>[0], kRotate<H, Half, Mv>[1]}},
                                    {order_row<F, Float>(), order_row<B, BFloat16>(), order_row<H, Half>()},
                                    {{{kUniform<F, Float, Mv>[0][0], kUniform<F, Float, Mv>[0][1]},
                                      {kUniform<F, Float, Mv>[1][0], kUniform<F, Float, Mv>[1][1]}},
                                     {{kUniform<B, BFloat16, Mv>[0][0], kUniform<B, BFloat16, Mv>[0][1]},
                                      {kUniform<B, BFloat16, Mv>[1][0], kUniform<B, BFloat16, Mv>[1][1]}},
                                     {{kUniform<H, Half, Mv>[0][0], kUniform<H, Half, Mv>[0][1]},
                                      {kUniform<H, Half, Mv>[1][0], kUniform<H, Half, Mv>[1][1]}}},
                                    {{kUniformOrder<F, Float, Mv>[0], kUniformOrder<F, Float, Mv>[1]},
                                     {kUniformOrder<B, BFloat16, Mv>[0], kUniformOrder<B, BFloat16, Mv>[1]},
                                     {kUniformOrder<H, Half, Mv>[0], kUniformOrder<H, Half, Mv>[1]}},
                                    {nullptr, encoding_row_simd<B, BFloat16, Mv>, encoding_row_simd<H, Half, Mv>},
                                    {nullptr, nullptr, widen_row_simd<H, Half>}};

// The tables of one instruction set (rows_*.cpp): [prefetch][stream], fp16 rows in vectors H and
// float32 rows in F (the path's own on the AVX-512 paths where isa.h's VectorWidth says so).
template <class I, class H = typename RowIsa<I, Half>::type, class F = typename RowIsa<I, Float>::type>
constexpr const RowKernels* kRowKernelsFor[2][2] = {
    {&kRowKernels<I, Moves<false, false>, H, F>, &kRowKernels<I, Moves<false, true>, H, F>},
    {&kRowKernels<I, Moves<true, false>, H, F>, &kRowKernels<I, Moves<true, true>, H, F>}};

}  // namespace
}  // namespace posenc::cpu
