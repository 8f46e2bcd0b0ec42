// The CPU instruction-set paths of the RoPE row kernels, and which one runs.
//
// Portable: the compiler-vectorized loop of core/rope.h (rotate_row). Avx2 (AVX2 + FMA + F16C),
// Avx512 (F/BW/VL/DQ) and Avx512Bf16 (plus AVX512-BF16): one SIMD body (simd_rows.h) compiled once
// per path in its own file (rows_*.cpp, built with that path's flags), picked at run time. Every
// path gives the same bits as the portable one (no FMA contraction anywhere: CMakeLists.txt builds
// with -ffp-contract=off); the exceptions, for NaN payloads and for bf16 results below 2^-126 on the
// Avx512Bf16 path, are listed in tests/test_cpu_paths.py.
//
// The environment variable POSENC_CPU_ISA=portable|avx2|avx512|avx512bf16 caps the path (read
// once per process), so every path can be run and compared on a CPU that has it;
// POSENC_CPU_PORTABLE=1 is the older spelling of POSENC_CPU_ISA=portable.
//
// Each SIMD path has its kernels four times: with and without software prefetch of the rows ahead
// (prefetch_lines, below), and with and without non-temporal stores (Streaming, below).
// Prefetch is on by default, where it measured faster (Intel, AMD Zen 3 and Zen 5), except on AMD
// Zen 4 (measured slower with it); POSENC_CPU_PREFETCH=0|1 overrides. Neither changes bits.
//
// float32 and fp16 rows on the AVX-512 paths use 256-bit vectors (simd_rows.h, RowIsa), which
// measured faster than 512-bit ones on AMD Zen 4 (it executes 512-bit operations as two halves),
// except on CPUs that execute them at full width: there fp16 rows take 512-bit vectors, and float32
// rows too where they stay in cache (cpu_vector_width; POSENC_CPU_VECTOR_BITS=256|512 overrides).
// Neither changes bits.
//
// Interleaved rows with angles from frequencies use the factor-row kernels: for float32 they
// measured 9-17% faster than the compiler-vectorized rotate_row_uniform (core/rope.h) on
// cache-resident rows and as fast from DRAM (benchmarks/RESULTS.md). The exceptions read the
// token's cos/sin row itself (RotateUniformFn): bf16's even/odd kernels, and float32 rows in 256-bit
// vectors where the call prefetches (simd_rows.h, PairsIsa).
//
// This header includes nothing from torch: the rows_*.cpp files include it with other -m flags.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <utility>
#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#endif

namespace posenc::cpu {

enum class Isa : int { Portable = 0, Avx2 = 1, Avx512 = 2, Avx512Bf16 = 3 };

// A SIMD row kernel: rotates the leading pairs of `rows` head rows (row r at src + r * src_stride,
// written to dst + r * dst_stride, strides in elements; src may equal dst) with factor rows C and S
// (core/rope.h, set_factors) and returns how many pairs of each row it did; the caller finishes the
// rows with rotate_row. All heads of a token in one call: no call per row.
using RotateRowFn = int64_t (*)(const void* src, void* dst, int64_t rows, int64_t src_stride, int64_t dst_stride,
                                int64_t pairs, const float* C, const float* S);

// Reorders the n floats of a row the kernels read (a factor row, or each half of a half-split one;
// a cos or a sin row) in place into the order a kernel with an even/odd policy reads them
// (simd_rows.h): each block of two vectors from the start as (even elements, odd elements), the
// rest in row order, as rotate_row reads them. The factor rows are reordered once per token; cos and
// sin rows come in this order from frequencies in this order (rope_cpu.cpp, frequencies_in_order).
// nullptr: the kernels read rows in row order.
using OrderRowFn = void (*)(float* row, int64_t n);

// A SIMD row kernel for one cos/sin row indexed by pair (angles from frequencies, as core/rope.h
// rotate_row_uniform, same bits): two factor loads per block of pairs instead of four, and no
// per-token factor rows. Same contract as RotateRowFn otherwise, with cos and sin in the order of
// RowKernels::uniform_order (nullptr: pair order).
using RotateUniformFn = int64_t (*)(const void* src, void* dst, int64_t rows, int64_t src_stride,
                                    int64_t dst_stride, int64_t pairs, const float* cos, const float* sin);

// The sinusoidal ops' rows (cpu/sinusoidal_cpu.cpp): out[d] = x[d] * x_scale + pe[d] (add_sinusoidal,
// x's lines prefetched as the RoPE rows' are: Moves) or, where x is nullptr, out[d] = pe[d] (a
// table row formed in float32), over the whole vectors of n contiguous elements, written with
// non-temporal stores in the Streaming tables (out then on the vectors' alignment); returns the
// elements done, the rest left to the compiled loop.
using EncodingRowFn = int64_t (*)(void* out, const void* x, float x_scale, const float* pe, int64_t n);

// The whole vectors of a row of n contiguous 16-bit elements as float32, dst[d] = src[d] (exact);
// returns the elements done, the rest left to the compiled loop (to_math). Where a loop reads an
// fp16 row that is not q or k: a cos/sin table's rows (rope_cpu.cpp), a bias gradient's
// (relative_bias_cpu.cpp).
using WidenRowFn = int64_t (*)(const void* src, float* dst, int64_t n);

enum RowDtype : int { kRowFloat = 0, kRowBFloat16 = 1, kRowHalf = 2 };

struct RowKernels {
  RotateRowFn rotate[3][2];          // [RowDtype][interleaved]
  OrderRowFn order[3];               // [RowDtype]: the order the factor-row kernels read their rows in
  RotateUniformFn uniform[3][2][2];  // [RowDtype][interleaved][inverse]; interleaved: even/odd policies only
  OrderRowFn uniform_order[3][2];    // [RowDtype][interleaved]: the order uniform[][][] reads cos and sin in
  EncodingRowFn encoding[3];         // [RowDtype]
  WidenRowFn widen[3];               // [RowDtype]; fp16 only (bf16's compiled conversion, a shift, measured faster)
};

// The row kernels of each SIMD path, with or without prefetch, with or without non-temporal stores
// (Streaming, below), on the AVX-512 paths in 512-bit vectors for every dtype (wide) or with float32
// and fp16 rows in 256-bit ones (VectorWidth), or nullptr where this build has none (rows_*.cpp).
const RowKernels* row_kernels_avx2(bool prefetch, bool stream);
const RowKernels* row_kernels_avx512(bool prefetch, bool stream, bool wide);
const RowKernels* row_kernels_avx512bf16(bool prefetch, bool stream, bool wide);

// The path the kernels take: the best this CPU and build have, capped by POSENC_CPU_ISA (isa.cpp).
// Throws on a POSENC_CPU_ISA value that is not one of the names above.
Isa cpu_isa();
const char* isa_name(Isa isa);
// The SIMD kernels' software prefetch (above), chosen once per process (isa.cpp, cpu_prefetch); the
// add_sinusoidal loop reads x's rows with the same rule (cpu/sinusoidal_cpu.cpp):
//   on: whether they prefetch at all;
//   from_bytes: below this many bytes of rows a call prefetches nothing: 32 KiB, under which rows fit
//     in L1 (a decode step of one sequence, 20 KiB, measured ~60 ns slower with prefetch, where two or
//     more sequences gain on Intel: B=64 38-41 -> 29-34 us), or by default on AMD Zen 2/3 16 MiB and
//     on Zen 5 32 MiB, under which they stay in L3 from call to call. POSENC_CPU_PREFETCH=1 sets 32 KiB
//     everywhere;
//   distance: how many bytes ahead of a step's reads it prefetches (prefetch_lines, below).
struct Prefetch {
  bool on;
  int64_t from_bytes;
  int64_t distance;
  // Whether a call over `row_bytes` bytes of rows prefetches.
  bool for_rows(int64_t row_bytes) const { return on && row_bytes >= from_bytes; }
};
// Throws on a POSENC_CPU_PREFETCH value other than 0 or 1.
const Prefetch& cpu_prefetch();
// The software prefetch itself, for every loop that takes it: the 64-byte lines of the `bytes` bytes
// at p + ahead, into L1. A prefetch never faults, so lines past a tensor's end are harmless.
[[gnu::always_inline]] inline void prefetch_lines(const void* p, int64_t bytes, int64_t ahead) {
  const char* first = static_cast<const char*>(p) + ahead;
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(first + b);
}
// Whether a call's rows take 512-bit vectors on the AVX-512 paths (bf16 rows always do), chosen once
// per process (isa.cpp, cpu_vector_width): on CPUs that execute 512-bit operations at full width (AMD
// Zen 5 and later) fp16 rows always, and float32 rows in calls under fp32_wide_below bytes of rows,
// which stay in cache (from DRAM 512-bit float32 rows measured slower there); elsewhere neither.
// POSENC_CPU_VECTOR_BITS=512 takes 512-bit vectors for every call, =256 for none.
struct VectorWidth {
  bool fp16_wide;
  int64_t fp32_wide_below;
  bool wide(int row_dtype, int64_t row_bytes) const {
    return row_dtype == kRowHalf ? fp16_wide : row_dtype == kRowFloat ? row_bytes < fp32_wide_below : true;
  }
};
// Throws on a POSENC_CPU_VECTOR_BITS value other than 256 or 512.
const VectorWidth& cpu_vector_width();
// Non-temporal stores for outputs that cannot stay in cache (the sinusoidal ops' outputs,
// cpu/sinusoidal_cpu.cpp; the relative position biases, cpu/relative_bias_cpu.cpp; out-of-place RoPE
// outputs with rows on 64-byte boundaries, cpu/rope_cpu.cpp),
// chosen once per process (isa.cpp, cpu_streaming): written so, a line is not first read into the
// cache (read for ownership), so an output streamed to DRAM moves half the bytes of plain stores.
// from_bytes: the output size from which a call streams, 32 MiB (an output that fits in L3 stays
// there for its reader), and only where the output's pages are in memory already (pages_present);
// POSENC_CPU_STREAM=0 never streams, =1 streams every output that can be.
struct Streaming {
  int64_t from_bytes;
  bool always;
  // Whether a call writing `bytes` bytes, into [out, out + extent) or the largest of its outputs,
  // writes them with non-temporal stores.
  bool for_output(int64_t bytes, const void* out, int64_t extent) const {
    return bytes >= from_bytes && (always || pages_present(out, extent));
  }
  // Whether the pages at the middle and at the end of [out, out + bytes) are in memory (Linux
  // mincore; true elsewhere). glibc maps every allocation past 32 MiB afresh, and a fresh page is
  // zeroed by the kernel on its first store, into the cache, where plain stores then hit: outputs
  // streamed into fresh pages measured 7-18% slower than with plain stores, and 12-30% faster into
  // reused ones (a caching allocator: jemalloc, tcmalloc, raised glibc thresholds; benchmarks/RESULTS.md).
  static bool pages_present(const void* out, int64_t bytes);
};
// The bytes from an output's first element to just past its last: `rows` pairs of (count, stride in
// elements) place its rows, each `row` contiguous elements of `element` bytes. 0 when it is empty.
inline int64_t output_extent(std::initializer_list<std::pair<int64_t, int64_t>> rows, int64_t row, int64_t element) {
  int64_t last = 0;
  for (const auto& [count, stride] : rows) {
    if (count <= 0) return 0;
    last += (count - 1) * stride;
  }
  return row > 0 ? (last + row) * element : 0;
}
// Whether `out` and each of `strides` (in elements of `element` bytes) are multiples of `align` bytes,
// so every row they place starts on an `align`-byte boundary. A streamed output must have its rows
// so: a cache line written partly with plain stores and partly with non-temporal ones (cpu/kernels.h,
// copy_row: a row's ends) measured 2-5x slower than either (benchmarks/RESULTS.md, "Thirty-fifth session").
inline bool rows_aligned(const void* out, std::initializer_list<int64_t> strides, int64_t element, int64_t align) {
  if (reinterpret_cast<uintptr_t>(out) % static_cast<uintptr_t>(align) != 0) return false;
  for (const int64_t stride : strides) {
    if (stride * element % align != 0) return false;
  }
  return true;
}
// Throws on a POSENC_CPU_STREAM value other than 0 or 1.
const Streaming& cpu_streaming();
// Run by each thread after its non-temporal stores: they are weakly ordered, and must be visible
// before the thread reports its chunk done.
inline void end_streaming_stores() {
#if defined(__x86_64__) || defined(_M_X64)
  _mm_sfence();
#endif
}
// The kernels of `isa` (nullptr for Portable), with or without prefetch and non-temporal stores, and
// in 512-bit vectors for every dtype (wide) where `isa` has them.
const RowKernels* row_kernels(Isa isa, bool prefetch, bool stream, bool wide);

}  // namespace posenc::cpu
