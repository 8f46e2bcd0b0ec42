// CPU kernels of the RoPE ops: tokens in parallel; per token the cos/sin of every pair is formed
// once (from inv_freq, or read from the given table) and reused for all q and k heads.
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <cstring>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/sincos_stream.h"

namespace posenc::cpu {
namespace {

template <bool kInterleaved, bool kInverse, typename T, typename M>
void rotate_heads(const RopeProblem& p, const RopeOperand& o, int64_t b, int64_t s, const M* c1, const M* s1,
                  const M* c2, const M* s2) {
  const T* src = static_cast<const T*>(o.src) + b * o.src_stride_b + s * o.src_stride_s;
  T* dst = static_cast<T*>(o.dst) + b * o.dst_stride_b + s * o.dst_stride_s;
  const int64_t pass = p.head_dim - p.rot_dim;
  for (int64_t h = 0; h < o.heads; ++h) {
    const T* src_row = src + h * o.src_stride_h;
    T* dst_row = dst + h * o.dst_stride_h;
    int64_t done = 0;
    if constexpr (std::is_same_v<T, c10::BFloat16> && !kInterleaved) {
      done = rotate_row_bf16_avx512(reinterpret_cast<const uint16_t*>(src_row), reinterpret_cast<uint16_t*>(dst_row),
                                    p.pairs(), c1, s1, c2, s2, kInverse);
    }
    rotate_row<kInterleaved, kInverse>(src_row, dst_row, p.pairs(), c1, s1, c2, s2, done);
    if (p.copy_passthrough && pass > 0) std::memcpy(dst_row + p.rot_dim, src_row + p.rot_dim, pass * sizeof(T));
  }
}

// Tokens [begin, end): per token the cos/sin of every pair, then every q and k head rotated with them.
template <typename T, bool kInterleaved, bool kInverse>
POSENC_CPU_CLONES void rope_tokens(const RopeProblem& p, int64_t begin, int64_t end) {
  using M = math_t<T>;
  const int64_t pairs = p.pairs();
  if (p.inv_freq) {  // angles from frequencies, once per token, advanced along consecutive positions
    SinCosStream<M> angles(p.inv_freq, pairs, static_cast<M>(p.attention_factor));
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t / p.seq, s = t % p.seq;
      angles.at(static_cast<double>(p.position(b, s)));
      const M* c = angles.cos();
      const M* sn = angles.sin();
      rotate_heads<kInterleaved, kInverse, T>(p, p.q, b, s, c, sn, c, sn);
      rotate_heads<kInterleaved, kInverse, T>(p, p.k, b, s, c, sn, c, sn);
    }
    return;
  }
  // A given cos/sin table: c1/s1 at first(i), c2/s2 at second(i) (the two halves may differ).
  std::vector<M> buf(4 * pairs);
  M* c1 = buf.data();
  M* s1 = c1 + pairs;
  M* c2 = s1 + pairs;
  M* s2 = c2 + pairs;
  for (int64_t t = begin; t < end; ++t) {
    const int64_t b = t / p.seq, s = t % p.seq;
    const int64_t row = p.cos_sin_row(b, s);
    for (int64_t i = 0; i < pairs; ++i) {
      const PairFactors<M> f = factors_from_table<M, T>(p, row, i);
      c1[i] = f.c1;
      s1[i] = f.s1;
      c2[i] = f.c2;
      s2[i] = f.s2;
    }
    rotate_heads<kInterleaved, kInverse, T>(p, p.q, b, s, c1, s1, c2, s2);
    rotate_heads<kInterleaved, kInverse, T>(p, p.k, b, s, c1, s1, c2, s2);
  }
}

template <typename T, bool kInterleaved, bool kInverse>
void run_typed(const RopeProblem& p) {
  const int64_t per_token = std::max<int64_t>((p.q.heads + p.k.heads) * p.head_dim, 1);
  const int64_t grain = std::max<int64_t>(1, 32768 / per_token);
  at::parallel_for(0, p.batch * p.seq, grain,
                   [&](int64_t begin, int64_t end) { rope_tokens<T, kInterleaved, kInverse>(p, begin, end); });
}

}  // namespace

void run_rope(const RopeProblem& p, at::ScalarType dtype) {
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
