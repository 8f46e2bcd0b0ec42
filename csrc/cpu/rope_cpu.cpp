// CPU kernels of the RoPE ops: tokens in parallel; per token the cos/sin of every pair is formed
// once (from inv_freq, or read from the given table), as one cos/sin row or as factor rows C/S
// (core/rope.h), and reused for all q and k heads, each head row rotated by the SIMD kernel of the
// CPU path (isa.h) and finished by the portable loop.
#include <cstring>
#include <type_traits>

#include "cpu/isa.h"
#include "cpu/kernels.h"
#include "cpu/sincos_stream.h"

namespace posenc::cpu {
namespace {

template <bool kInterleaved, typename T, typename M>
void rotate_heads(const RopeProblem& p, const RopeOperand& o, int64_t b, int64_t s, const M* C, const M* S,
                  RotateRowFn simd) {
  const T* src = static_cast<const T*>(o.src) + b * o.src_stride_b + s * o.src_stride_s;
  T* dst = static_cast<T*>(o.dst) + b * o.dst_stride_b + s * o.dst_stride_s;
  const int64_t pairs = p.pairs();
  int64_t done = 0;
  if constexpr (std::is_same_v<M, float>) {
    if (simd) done = simd(src, dst, o.heads, o.src_stride_h, o.dst_stride_h, pairs, C, S);
  }
  const int64_t pass = p.copy_passthrough ? p.head_dim - p.rot_dim : 0;
  if (done == pairs && pass == 0) return;  // the usual case: the SIMD kernel did every row
  for (int64_t h = 0; h < o.heads; ++h) {
    const T* src_row = src + h * o.src_stride_h;
    T* dst_row = dst + h * o.dst_stride_h;
    rotate_row<kInterleaved>(src_row, dst_row, pairs, C, S, done);
    if (pass > 0) std::memcpy(dst_row + p.rot_dim, src_row + p.rot_dim, pass * sizeof(T));
  }
}

// rotate_heads with one cos/sin row indexed by pair (angles from frequencies): first the SIMD kernel
// `simd` where the path has one (isa.h, RotateUniformFn; simd_rows.h, kUniform), then
// rotate_row_uniform for the rest.
template <bool kInterleaved, bool kInverse, typename T, typename M>
inline void rotate_heads_uniform(const RopeProblem& p, const RopeOperand& o, int64_t b, int64_t s, const M* c,
                                 const M* sn, RotateUniformFn simd = nullptr) {
  const T* src = static_cast<const T*>(o.src) + b * o.src_stride_b + s * o.src_stride_s;
  T* dst = static_cast<T*>(o.dst) + b * o.dst_stride_b + s * o.dst_stride_s;
  const int64_t pass = p.copy_passthrough ? p.head_dim - p.rot_dim : 0;
  int64_t done = 0;
  if constexpr (std::is_same_v<M, float>) {
    if (simd) done = simd(src, dst, o.heads, o.src_stride_h, o.dst_stride_h, p.pairs(), c, sn);
  }
  if (done == p.pairs() && pass == 0) return;
  const auto rows_from = [&](auto first_pair) {
    for (int64_t h = 0; h < o.heads; ++h) {
      const T* src_row = src + h * o.src_stride_h;
      T* dst_row = dst + h * o.dst_stride_h;
      rotate_row_uniform<kInterleaved, kInverse>(src_row, dst_row, p.pairs(), c, sn, first_pair);
      if (pass > 0) std::memcpy(dst_row + p.rot_dim, src_row + p.rot_dim, pass * sizeof(T));
    }
  };
  // Where no SIMD kernel ran (float32 on the portable path) the loop starts at a constant: float32's
  // compiled loop measured ~10% slower per row with a start known only at run time.
  if (done == 0) {
    rows_from(std::integral_constant<int64_t, 0>{});
  } else {
    rows_from(done);
  }
}

// The factor rows as an angle stream's output (sincos_stream.h): written in the pass that forms the
// angles (core/rope.h), or from the stream's math rows.
template <bool kInterleaved, bool kInverse, typename M>
struct FactorRows {
  M* C;
  M* S;
  void rotated(const M* s, const M* c, const M* step_s, const M* step_c, int64_t pairs) const {
    rotated_factor_rows<kInterleaved, kInverse>(s, c, step_s, step_c, pairs, C, S);
  }
  void from_math(const M* s, const M* c, int64_t pairs) const {
    factor_rows_from_math<kInterleaved, kInverse>(s, c, pairs, C, S);
  }
};

// The frequencies (n_axes rows of `pairs`) with each row's pairs in the order `order` puts a row
// in: the angle stream's rows, elementwise in the pairs, then come out in the order a uniform
// kernel reads its cos and sin (RowKernels::uniform_order), with the same values. Reordering the
// rows per token instead took ~8 ns a token, 14% of a one-head bf16 prefill on the AVX2 path. The
// order as a permutation: `order` applied to the indices 0, 1, ... (exact in float). Kept per thread
// (row_for_last_key): formed on every call, it took ~0.1 us of a 2.6 us decode step.
const double* frequencies_in_order(OrderRowFn order, const double* freq, int64_t pairs, int64_t n_axes) {
  struct Key {
    OrderRowFn order;
    int64_t pairs;
  };
  struct Caller;
  const int64_t n = n_axes * pairs;
  return row_for_last_key<Caller>(Key{order, pairs}, freq, n, n, [&](double* ordered) {
    float* index = thread_rows<float, kOrderIndex>(pairs);  // (kept: dynamic NTK past its length misses every call)
    for (int64_t j = 0; j < pairs; ++j) index[j] = static_cast<float>(j);
    order(index, pairs);
    for (int64_t a = 0; a < n_axes; ++a) {
      for (int64_t j = 0; j < pairs; ++j) ordered[a * pairs + j] = freq[a * pairs + static_cast<int64_t>(index[j])];
    }
  });
}

// Tokens [begin, end): per token the factor rows of every pair, then every q and k head rotated with them.
template <typename T, bool kInterleaved, bool kInverse>
POSENC_CPU_CLONES void rope_tokens(const RopeProblem& p, RotateRowFn simd, OrderRowFn order,
                                   RotateUniformFn uniform, OrderRowFn uniform_order, WidenRowFn widen,
                                   int64_t begin, int64_t end) {
  using M = math_t<T>;
  const int64_t pairs = p.pairs();
  // Factor rows on 64-byte boundaries, so no vector load of them straddles two cache lines (none
  // where rows are rotated with one cos/sin per pair), in this thread's buffer (sincos_stream.h).
  constexpr int64_t kAlign = 64 / sizeof(M);
  const int64_t row_len = (p.rot_dim + kAlign - 1) / kAlign * kAlign;
  // Only bf16 rows have an even/odd policy whose factor rows are reordered per token (AVX2's;
  // simd_rows.h, order_row): the other dtypes' loops are compiled without that reordering (its code
  // in the fp16 loop measured ~2-5% slower). Interleaved uniform kernels: bf16's even/odd one and
  // float32's with prefetch (Avx2Pairs).
  constexpr bool kMayBeEvenOdd = std::is_same_v<T, c10::BFloat16>;
  constexpr bool kMayBeUniformInterleaved = kMayBeEvenOdd || std::is_same_v<T, float>;
  // One cos/sin row per token, no factor rows: half-split float32 (SIMD kernel or, on the portable
  // path, the compiled loop) and the dtypes whose path has a uniform kernel, interleaved as well.
  // The other interleaved rows use the factor rows (cpu/isa.h).
  const bool uniform_rows =
      p.inv_freq && (kInterleaved ? kMayBeUniformInterleaved && uniform : std::is_same_v<T, float> || uniform);
  M* C = uniform_rows ? nullptr : thread_rows<M, kFactorRows>(2 * row_len);
  M* S = uniform_rows ? nullptr : C + row_len;
  const auto rotate_token = [&](int64_t b, int64_t s) {
    if constexpr (kMayBeEvenOdd) {
      if (order && kInterleaved) order(C, 2 * pairs), order(S, 2 * pairs);
      if (order && !kInterleaved) {  // each half of each row
        for (M* half : {C, C + pairs, S, S + pairs}) order(half, pairs);
      }
    }
    rotate_heads<kInterleaved, T>(p, p.q, b, s, C, S, simd);
    rotate_heads<kInterleaved, T>(p, p.k, b, s, C, S, simd);
  };
  // Token t = b * seq + s, its (b, s) stepped along with t: the two 64-bit divisions per token
  // were ~2% of a B=64 decode call (benchmarks/RESULTS.md, "Fifth session").
  int64_t tb = begin / p.seq, ts = begin % p.seq;
  const auto next_token = [&] {
    if (++ts == p.seq) ts = 0, ++tb;
  };
  if (p.inv_freq) {  // angles from frequencies, once per token, advanced along consecutive positions
    const double* freq = p.inv_freq;
    if (uniform_order && uniform_rows) freq = frequencies_in_order(uniform_order, freq, pairs, p.n_axes);
    // Positions without an axis dim (stride 0) give every axis the same id (text tokens).
    SinCosStream<M> angles(freq, pairs, static_cast<M>(p.attention_factor), p.n_axes, p.pos_stride_a == 0);
    const auto position_of = [&](int64_t a) { return p.position(tb, ts, a); };  // token (tb, ts) on axis a
    const FactorRows<kInterleaved, kInverse, M> factor_rows{C, S};
    // Interleaved factor rows are written in the stream's own pass. Half-split rows keep the
    // stream's math rows (the uniform kernels read them): a second stream output in this function
    // cost the half-split loop registers, ~12 ns a token (benchmarks/RESULTS.md).
    const auto rotate_token_uniform = [&] {
      rotate_heads_uniform<kInterleaved, kInverse, T>(p, p.q, tb, ts, angles.cos(), angles.sin(), uniform);
      rotate_heads_uniform<kInterleaved, kInverse, T>(p, p.k, tb, ts, angles.cos(), angles.sin(), uniform);
    };
    // (One call of the stream per branch: with a call shared by both, the float32 and fp16
    // half-split loops measured 3-10% slower on one head.)
    for (int64_t t = begin; t < end; ++t, next_token()) {
      if constexpr (kInterleaved) {
        if (uniform_rows) {  // (bf16 and float32 only: a constant false in the other loops)
          angles.at(position_of);
          rotate_token_uniform();
          continue;
        }
        angles.at(position_of, factor_rows);
      } else {
        angles.at(position_of);
        if (uniform_rows) {
          rotate_token_uniform();
          continue;
        }
        factor_rows.from_math(angles.sin(), angles.cos(), pairs);
      }
      rotate_token(tb, ts);
    }
    return;
  }
  // A given cos/sin table: c1/s1 at first(i), c2/s2 at second(i) (the two halves may differ).
  // fp16 rows are widened to float32 by the SIMD kernel first (`widen`, run_typed; cpu/isa.h).
  float* wide = widen ? thread_rows<float, kTableRows>(2 * row_len) : nullptr;
  for (int64_t t = begin; t < end; ++t, next_token()) {
    const int64_t row = p.cos_sin_row(tb, ts);
    const T* cos_row = static_cast<const T*>(p.cos) + row;
    const T* sin_row = static_cast<const T*>(p.sin) + row;
    if constexpr (std::is_same_v<T, c10::Half>) {
      if (wide) {
        widen_row(cos_row, wide, 2 * pairs, widen);
        widen_row(sin_row, wide + row_len, 2 * pairs, widen);
        factor_rows_from_table<kInterleaved, kInverse>(wide, wide + row_len, pairs, C, S);
        rotate_token(tb, ts);
        continue;
      }
    }
    factor_rows_from_table<kInterleaved, kInverse>(cos_row, sin_row, pairs, C, S);
    rotate_token(tb, ts);
  }
}

// Whether an out-of-place call may write its rows with non-temporal stores (cpu/isa.h, Streaming):
// big enough, into pages in memory already, and every vector store of the SIMD kernels on its own
// size's boundary (up to 64 bytes: each row, and half-split's second half, on a 64-byte boundary).
// In place, the rows are in cache already: plain stores.
bool streams_output(const RopeProblem& p, int64_t bytes, int64_t element) {
  const auto aligned = [&](const RopeOperand& o) {
    return o.dst != o.src &&
           rows_aligned(o.dst, {o.dst_stride_b, o.dst_stride_s, o.dst_stride_h, p.pairs()}, element, 64);
  };
  if (!aligned(p.q) || (p.k.heads > 0 && !aligned(p.k))) return false;
  // q's output holds most of the bytes: its pages stand for the call's
  const int64_t q_extent = output_extent(
      {{p.batch, p.q.dst_stride_b}, {p.seq, p.q.dst_stride_s}, {p.q.heads, p.q.dst_stride_h}}, p.head_dim, element);
  return cpu_streaming().for_output(bytes, p.q.dst, q_extent);
}

template <typename T, bool kInterleaved, bool kInverse>
void run_typed(const RopeProblem& p) {
  RotateRowFn simd = nullptr;
  OrderRowFn order = nullptr;
  RotateUniformFn uniform = nullptr;  // from frequencies only
  OrderRowFn uniform_order = nullptr;
  WidenRowFn widen = nullptr;         // a given fp16 cos/sin table only (cpu/isa.h, RowKernels)
  const int64_t tokens = p.batch * p.seq;
  const int64_t per_token = std::max<int64_t>((p.q.heads + p.k.heads) * p.head_dim, 1);  // elements
  bool stream = false;
  if constexpr (kRowDtype<T> >= 0) {
    const int64_t bytes = tokens * per_token * static_cast<int64_t>(sizeof(T));
    const bool prefetch = cpu_prefetch().for_rows(bytes);
    stream = streams_output(p, bytes, sizeof(T));
    const bool wide = cpu_vector_width().wide(kRowDtype<T>, bytes);
    if (const RowKernels* k = row_kernels(cpu_isa(), prefetch, stream, wide)) {
      simd = k->rotate[kRowDtype<T>][kInterleaved ? 1 : 0];
      order = k->order[kRowDtype<T>];
      if (p.inv_freq) uniform = k->uniform[kRowDtype<T>][kInterleaved ? 1 : 0][kInverse ? 1 : 0];
      uniform_order = k->uniform_order[kRowDtype<T>][kInterleaved ? 1 : 0];
      if (!p.inv_freq) widen = k->widen[kRowDtype<T>];
    }
  }
  const int64_t grain = std::max<int64_t>(1, 32768 / per_token);
  const auto run = [&](int64_t begin, int64_t end) {
    rope_tokens<T, kInterleaved, kInverse>(p, simd, order, uniform, uniform_order, widen, begin, end);
    if (stream) end_streaming_stores();
  };
  if (tokens <= grain) {  // one chunk (a decode step): as parallel_for would run it, without its ~50 ns
    run(0, tokens);
    return;
  }
  parallel_balanced(tokens, grain, per_token * static_cast<int64_t>(sizeof(T)), run);
}

}  // namespace

void run_rope(const RopeProblem& p, ScalarType dtype) {
  dispatch_float_types(dtype, "posenc.rope", [&](auto tag) {
    using T = decltype(tag);
    if (p.interleaved) {
      p.inverse ? run_typed<T, true, true>(p) : run_typed<T, true, false>(p);
    } else {
      p.inverse ? run_typed<T, false, true>(p) : run_typed<T, false, false>(p);
    }
  });
}

}  // namespace posenc::cpu
