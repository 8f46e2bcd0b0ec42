// Rotary position embedding: the problem description and the per-pair math, shared by CPU and CUDA.
//
// A rotation pairs element a = x[first(i)] with b = x[second(i)], i = 0 .. rot_dim/2 - 1:
//   half-split (GPT-NeoX, Llama): first = i,  second = i + rot_dim/2
//   interleaved (GPT-J, RoFormer): first = 2i, second = 2i + 1
// and maps (a, b) -> (a*c1 - b*s1, b*c2 + a*s2). From frequencies c1 = c2 = f*cos(t), s1 = s2 =
// f*sin(t) (t = position * inv_freq[i], f the attention factor); from a given cos/sin table (the
// transformers convention) c1/s1 are read at first(i) and c2/s2 at second(i). The inverse (the
// backward) is the transposed matrix: (a*c1 + b*s2, b*c2 - a*s1). Dims past rot_dim pass through.
#pragma once
#include "core/angles.h"

namespace posenc {

// One of q or k: where it is read and where it is written, as [batch, seq, heads, head_dim]
// strides in elements (the last dim is contiguous). In place: src == dst with equal strides.
struct RopeOperand {
  const void* src = nullptr;
  void* dst = nullptr;
  int64_t heads = 0;
  int64_t src_stride_b = 0, src_stride_s = 0, src_stride_h = 0;
  int64_t dst_stride_b = 0, dst_stride_s = 0, dst_stride_h = 0;
};

struct RopeProblem {
  RopeOperand q, k;
  int64_t batch = 1, seq = 0;   // tokens are (b, s); the packed layout is batch 1, seq T
  int64_t head_dim = 0, rot_dim = 0;
  bool interleaved = false;
  bool inverse = false;
  bool copy_passthrough = false;  // out of place: copy dims past rot_dim

  // Positions: explicit ([S], [B,S] or [T]; stride 0 broadcasts), or from cu_seqlens, or s. With an
  // axis layout (n_axes > 1: multi-axis RoPE, e.g. MRoPE's time/height/width) they have one row per
  // axis ([A, B, S] or [A, T]) at pos_stride_a; stride 0 gives every axis the same id (text tokens).
  const void* positions = nullptr;
  IndexKind positions_kind = IndexKind::Int64;
  int64_t pos_stride_b = 0, pos_stride_s = 0, pos_stride_a = 0;
  int64_t n_axes = 1;
  const void* cu_seqlens = nullptr;  // [n_seqs + 1]
  IndexKind cu_seqlens_kind = IndexKind::Int64;
  int64_t n_seqs = 0;
  int64_t offset = 0;
  PositionDomain domain;  // of given positions: position_domain(offset)

  // Angle source: frequencies (float64, n_axes rows of rot_dim/2, row-major; see axis_angle) ...
  const double* inv_freq = nullptr;
  double attention_factor = 1.0;
  // ... or a cos/sin table in the operand dtype, [rows, rot_dim] with row strides; rows are
  // (b, s) through cs_stride_b/cs_stride_s, or gathered by position when cs_by_position.
  const void* cos = nullptr;
  const void* sin = nullptr;
  int64_t cs_stride_b = 0, cs_stride_s = 0;
  bool cs_by_position = false;
  int64_t cs_rows = 0;  // rows of the table, when gathered by position

  // cu_seqlens[j] as a valid table has it: [0] = 0, non-decreasing, [n_seqs] = the tokens (seq).
  POSENC_HD bool cu_seqlens_entry_ok(int64_t j) const {
    const int64_t v = load_as_int64(cu_seqlens, cu_seqlens_kind, j);
    return (j > 0 ? load_as_int64(cu_seqlens, cu_seqlens_kind, j - 1) <= v : v == 0) && (j < n_seqs || v == seq);
  }

  POSENC_HD int64_t pairs() const { return rot_dim / 2; }
  POSENC_HD int64_t first(int64_t i) const { return pair_first(interleaved, i); }
  POSENC_HD int64_t second(int64_t i) const { return pair_second(interleaved, i, pairs()); }

  // Position of token (b, s) on axis a.
  POSENC_HD int64_t position(int64_t b, int64_t s, int64_t a = 0) const {
    if (positions) {
      const int64_t p = load_as_int64(positions, positions_kind, b * pos_stride_b + s * pos_stride_s + a * pos_stride_a);
      POSENC_DEVICE_REQUIRE(domain.contains(p), "posenc: positions + offset must lie in [-2^48, 2^48]");
      return p + offset;
    }
    return sequence_index(s) + offset;  // packed: the position within its sequence
  }

  // Index of token s within its sequence: packed (cu_seqlens), s minus the last start <= s (a binary
  // search); else s (a batch row, or the packed tokens as one sequence).
  POSENC_HD int64_t sequence_index(int64_t s) const {
    if (!cu_seqlens) return s;
    int64_t lo = 0, hi = n_seqs - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (load_as_int64(cu_seqlens, cu_seqlens_kind, mid) <= s) lo = mid; else hi = mid - 1;
    }
    return s - load_as_int64(cu_seqlens, cu_seqlens_kind, lo);
  }

  // Row offset (in elements) of the cos/sin table for token (b, s).
  POSENC_HD int64_t cos_sin_row(int64_t b, int64_t s) const {
    if (cs_by_position) {  // checked (on the host for CPU positions), and clamped all the same
      const int64_t row = position(b, s);
      POSENC_DEVICE_REQUIRE(row >= 0 && row < cs_rows, "posenc: positions must index a row of cos/sin");
      return (row < 0 ? 0 : (row >= cs_rows ? cs_rows - 1 : row)) * cs_stride_s;
    }
    return b * cs_stride_b + s * cs_stride_s;
  }
};

// cos/sin factors of pair i for one token (c1, s1 at first(i); c2, s2 at second(i)).
template <typename M>
struct PairFactors {
  M c1, s1, c2, s2;
};

// Angles of pairs [i0, i0 + n) for a token at position_of(a) on axis a: the sum over the n_axes rows
// of inv_freq of position_of(a) * inv_freq[a * pairs + i], in float64 (each position read once). One
// row is plain RoPE. An axis layout (MRoPE, axial RoPE) has one non-zero frequency per pair: every
// other term is an exact zero, so the angle is position[axis(i)] * frequency[i] exactly, however the
// sum is rounded or contracted into FMAs (docs/architecture.md, "Multi-axis positions").
template <typename PositionOf>
POSENC_HD void axis_angles(const double* __restrict__ inv_freq, int64_t pairs, int64_t n_axes, int64_t i0, int64_t n,
                           const PositionOf& position_of, double* __restrict__ angle) {
  const double p0 = position_of(0);
  for (int64_t j = 0; j < n; ++j) angle[j] = p0 * inv_freq[i0 + j];
  for (int64_t a = 1; a < n_axes; ++a) {
    const double pa = position_of(a);
    const double* freq = inv_freq + a * pairs + i0;
    for (int64_t j = 0; j < n; ++j) angle[j] += pa * freq[j];
  }
}

// Angles of pairs [i0, i0 + n) for token (b, s) of a problem with frequencies.
POSENC_HD void pair_angles(const RopeProblem& p, int64_t b, int64_t s, int64_t i0, int64_t n, double* angle) {
  const auto position_of = [&](int64_t a) { return static_cast<double>(p.position(b, s, a)); };
  axis_angles(p.inv_freq, p.pairs(), p.n_axes, i0, n, position_of, angle);
}

template <typename M>
POSENC_HD PairFactors<M> factors_from_angle(const RopeProblem& p, double angle) {
  M s, c;
  sincos_of<M>(angle, s, c);
  const M f = static_cast<M>(p.attention_factor);
  return {c * f, s * f, c * f, s * f};
}

template <typename M, typename T>
POSENC_HD PairFactors<M> factors_from_table(const RopeProblem& p, int64_t row, int64_t i) {
  const T* cos = static_cast<const T*>(p.cos) + row;
  const T* sin = static_cast<const T*>(p.sin) + row;
  const int64_t a = p.first(i), b = p.second(i);
  return {to_math<M>(cos[a]), to_math<M>(sin[a]), to_math<M>(cos[b]), to_math<M>(sin[b])};
}

// Rotate one pair (a, b) in math precision.
template <typename M>
POSENC_HD void rotate_pair(M& a, M& b, const PairFactors<M>& f, bool inverse) {
  const M a0 = a, b0 = b;
  if (!inverse) {
    a = a0 * f.c1 - b0 * f.s1;
    b = b0 * f.c2 + a0 * f.s2;
  } else {
    a = a0 * f.c1 + b0 * f.s2;
    b = b0 * f.c2 - a0 * f.s1;
  }
}

}  // namespace posenc

namespace posenc {

// The CPU loops rotate a head row with two factor rows C and S laid out like the row itself:
//   out[j] = x[j] * C[j] + x[partner(j)] * S[j],  partner = the other element of j's pair,
// so one multiply-add shape serves both pairings and both directions (the SIMD kernels in
// csrc/cpu/simd_rows.h swap neighbours for interleaved pairs). Same bits as rotate_pair: adding
// b * (-s) is subtracting b * s. set_factors fills pair i's entries.
template <bool kInterleaved, bool kInverse, typename M>
POSENC_HD void set_factors(M* C, M* S, int64_t pairs, int64_t i, M c1, M s1, M c2, M s2) {
  const int64_t a = pair_first(kInterleaved, i), b = pair_second(kInterleaved, i, pairs);
  C[a] = c1;
  C[b] = c2;
  S[a] = kInverse ? s2 : -s1;
  S[b] = kInverse ? -s1 : s2;
}

// Every pair's factors on the CPU, once per token, from the angle stream (cpu/sincos_stream.h;
// c1 = c2, s1 = s2: angles from frequencies): from its math rows, or from an anchor's row rotated
// by a step, written in the same pass. restrict: the compiler can then vectorize these loops and
// keep them in registers (a cost paid per token that shows against the memory floor).
template <bool kInterleaved, bool kInverse, typename M>
inline void rotated_factor_rows(const M* __restrict__ sin_in, const M* __restrict__ cos_in,
                                const M* __restrict__ step_sin, const M* __restrict__ step_cos, int64_t pairs,
                                M* __restrict__ C, M* __restrict__ S) {
  for (int64_t i = 0; i < pairs; ++i) {
    M s = sin_in[i], c = cos_in[i];
    advance_sincos(s, c, step_sin[i], step_cos[i]);
    set_factors<kInterleaved, kInverse>(C, S, pairs, i, c, s, c, s);
  }
}

template <bool kInterleaved, bool kInverse, typename M>
inline void factor_rows_from_math(const M* __restrict__ s, const M* __restrict__ c, int64_t pairs, M* __restrict__ C,
                                  M* __restrict__ S) {
  for (int64_t i = 0; i < pairs; ++i) set_factors<kInterleaved, kInverse>(C, S, pairs, i, c[i], s[i], c[i], s[i]);
}

// Every pair's factors on the CPU, once per token, from one row of a cos/sin table (c1, s1 at
// first(i), c2, s2 at second(i), as factors_from_table reads them). restrict and the pairing known
// at compile time: the compiler can then vectorize the loop (read through the problem pair by pair,
// it took 30-55 ns more a token on one-head float32 and bf16 prefills, 1.3-2x their time).
template <bool kInterleaved, bool kInverse, typename M, typename T>
inline void factor_rows_from_table(const T* __restrict__ cos, const T* __restrict__ sin, int64_t pairs,
                                   M* __restrict__ C, M* __restrict__ S) {
  for (int64_t i = 0; i < pairs; ++i) {
    const int64_t a = pair_first(kInterleaved, i), b = pair_second(kInterleaved, i, pairs);
    set_factors<kInterleaved, kInverse>(C, S, pairs, i, to_math<M>(cos[a]), to_math<M>(sin[a]), to_math<M>(cos[b]),
                                        to_math<M>(sin[b]));
  }
}

// Rotate pairs [first_pair, pairs) of one head row (src may equal dst) with factor rows C, S (see
// set_factors): the portable CPU loop, which also finishes rows after the SIMD kernels.
template <bool kInterleaved, typename T, typename M>
inline void rotate_row(const T* src, T* dst, int64_t pairs, const M* __restrict__ C, const M* __restrict__ S,
                       int64_t first_pair = 0) {
  // In place src == dst: each iteration reads its own pair before writing it and touches no other
  // iteration's elements, so vectorizing is safe (the compiler cannot prove it; it would fall back
  // to a scalar loop whenever src and dst overlap).
#pragma GCC ivdep
  for (int64_t i = first_pair; i < pairs; ++i) {
    const int64_t ia = pair_first(kInterleaved, i), ib = pair_second(kInterleaved, i, pairs);
    const M a = to_math<M>(src[ia]);
    const M b = to_math<M>(src[ib]);
    dst[ia] = from_math<T>(a * C[ia] + b * S[ia]);
    dst[ib] = from_math<T>(b * C[ib] + a * S[ib]);
  }
}


// rotate_row with factors from one cos/sin row (c1 = c2 = c[i], s1 = s2 = s[i], indexed by pair:
// angles from frequencies), with the same bits: adding b * (-s) is subtracting b * s. It reads c
// and s as the angle stream leaves them (no per-token set_factors pass), two factor loads per pair
// instead of four. The CPU runs it for what the SIMD uniform kernels (cpu/simd_rows.h) leave: the
// tail of a row, and half-split float32 rows on the portable path.
template <bool kInterleaved, bool kInverse, typename T, typename M>
inline void rotate_row_uniform(const T* src, T* dst, int64_t pairs, const M* __restrict__ c,
                               const M* __restrict__ s, int64_t first_pair = 0) {
#pragma GCC ivdep
  for (int64_t i = first_pair; i < pairs; ++i) {  // in place: as in rotate_row
    const int64_t ia = pair_first(kInterleaved, i), ib = pair_second(kInterleaved, i, pairs);
    const M a = to_math<M>(src[ia]);
    const M b = to_math<M>(src[ib]);
    if constexpr (!kInverse) {
      dst[ia] = from_math<T>(a * c[i] - b * s[i]);
      dst[ib] = from_math<T>(b * c[i] + a * s[i]);
    } else {
      dst[ia] = from_math<T>(a * c[i] + b * s[i]);
      dst[ib] = from_math<T>(b * c[i] - a * s[i]);
    }
  }
}

}  // namespace posenc
