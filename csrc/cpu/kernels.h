// The CPU backend: its runners (sinusoidal_cpu.cpp, rope_cpu.cpp, relative_bias_cpu.cpp), registered in
// register_cpu.cpp.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstring>
#include <type_traits>

#include "cpu/isa.h"
#include "host/backend.h"

// The hot loops are compiled twice, for baseline x86-64 and for AVX2, and
// the CPU picks at load time; elsewhere they are compiled once. `flatten` inlines the helpers into
// each clone, so they are compiled for its instruction set too (an arch= clone could not inline them).
// Rarely run helpers are marked [[gnu::noinline]] (the angle stream's step rows,
// cpu/sincos_stream.h): flattened into every clone they made rope_cpu.cpp take 3.5 min to compile.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define POSENC_CPU_CLONES __attribute__((target_clones("default", "avx2"), flatten))
#else
#define POSENC_CPU_CLONES
#endif

namespace posenc::cpu {
POSENC_DECLARE_RUNNERS

// The row kernels' index of element type T (cpu/isa.h, RowDtype), -1 for types they do not take.
template <typename T>
constexpr int kRowDtype = std::is_same_v<T, float>            ? kRowFloat
                          : std::is_same_v<T, c10::BFloat16> ? kRowBFloat16
                          : std::is_same_v<T, c10::Half>     ? kRowHalf
                                                              : -1;

// Units [0, n) in parallel, run(begin, end) on each range, for a call of `unit_bytes` bytes a unit.
// parallel_for splits the range evenly up front, so the slowest thread sets the time; a call of four
// 1 MiB blocks a thread and more instead hands out its range in blocks of ~1 MiB as threads finish
// them, so a thread whose core gives it less (another process on a shared host, or its memory) leaves
// the rest of its share to the others. float32 RoPE in place over 84 MB on two AMD Zen 3 vCPUs measured
// ~4% faster so, in-cache calls of 10 MiB as fast (benchmarks/RESULTS.md, "Forty-ninth session").
// Smaller calls keep parallel_for's ranges, of `grain` units at least. Every unit's result depends on
// the unit alone, never on the range it ran in (tests/test_determinism.py), so the bits are the same.
template <class Run>
void parallel_balanced(int64_t n, int64_t grain, int64_t unit_bytes, const Run& run) {
  constexpr int64_t kBlockBytes = int64_t{1} << 20;
  const int64_t threads = static_cast<int64_t>(torch::stable::get_num_threads());
  const int64_t blocks = std::min(n, n * unit_bytes / kBlockBytes);
  if (threads < 2 || blocks < 4 * threads) {
    torch::stable::parallel_for(0, n, grain, run);
    return;
  }
  const int64_t per_block = n / blocks, longer = n % blocks;  // the first `longer` blocks take one more
  const auto start = [&](int64_t b) { return b * per_block + std::min(b, longer); };
  std::atomic<int64_t> next{0};
  torch::stable::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t b; (b = next.fetch_add(1, std::memory_order_relaxed)) < blocks;) run(start(b), start(b + 1));
  });
}

// src's n elements as float32 in dst: the whole vectors by the path's kernel where there is one
// (`widen`, cpu/isa.h, WidenRowFn), the rest by the compiled conversion (to_math); the same values.
template <typename T>
inline void widen_row(const T* src, float* dst, int64_t n, WidenRowFn widen) {
  int64_t k = widen ? widen(src, dst, n) : 0;
  for (; k < n; ++k) dst[k] = to_math<float>(src[k]);
}

// n bytes from src to dst in 16-byte vectors (SSE2, which every x86-64 CPU has; memcpy elsewhere).
// With `stream`, non-temporal stores where dst is 16-byte aligned and plain copies at the ends: a row
// formed in L1 streamed out, where cpu_streaming().for_output and rows_aligned allow it (cpu/isa.h;
// each thread then calls end_streaming_stores). Without, plain vector stores, not memcpy: glibc runs
// it as `rep movsb` for rows of a few KiB, slower where source and destination alignments differ
// (relative_bias_cpu.cpp's rows). A 64-byte line a step, then 16 bytes: with one 16-byte vector a
// step the loop was four instructions, and a build that moved it across a 64-byte code line took the
// streamed float32 table [32768, 1024] from ~8 to ~11 ms on AMD Zen 3 (benchmarks/RESULTS.md, "Forty-ninth
// session"). Here, not in cpu/isa.h: rows_*.cpp include that with other -m flags.
inline void copy_row(void* dst, const void* src, int64_t n, bool stream) {
#if defined(__x86_64__) || defined(_M_X64)
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  const int64_t head = stream ? std::min<int64_t>(n, (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16) : 0;
  std::memcpy(d, s, static_cast<size_t>(head));
  int64_t i = head;
  const auto copy = [&](auto store) {
    const auto vector = [&](int64_t at) {
      store(reinterpret_cast<__m128i*>(d + at), _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + at)));
    };
    for (; i + 64 <= n; i += 64) vector(i), vector(i + 16), vector(i + 32), vector(i + 48);
    for (; i + 16 <= n; i += 16) vector(i);
  };
  if (stream) {
    copy([](__m128i* p, __m128i v) { _mm_stream_si128(p, v); });
  } else {
    copy([](__m128i* p, __m128i v) { _mm_storeu_si128(p, v); });
  }
  std::memcpy(d + i, s + i, static_cast<size_t>(n - i));
#else
  (void)stream;
  std::memcpy(dst, src, static_cast<size_t>(n));
#endif
}
}  // namespace posenc::cpu
