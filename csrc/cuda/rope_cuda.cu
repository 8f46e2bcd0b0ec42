// CUDA kernel of the RoPE ops. One kernel template; the per-pair math (angles, table factors,
// rotation) is csrc/core's. This file only maps threads to work and moves memory:
//   work item = (token, chunk); a rotary chunk covers kPairs pairs, whose cos/sin are formed once
//   and reused for every q and k head; a pass-through chunk copies V dims of every head (out of
//   place, partial rotary). Memory moves in 16-byte vectors when every row is aligned, else per
//   element (V = 1).
#include "cuda/kernels.h"
#include "cuda/launch.cuh"

namespace posenc::cuda {
namespace {

// How a chunk's pairs sit in memory. Half-split: a = row[i..i+V), b = row[i+R/2 ..] (V pairs);
// interleaved: one vector of V elements holds V/2 (a, b) pairs; V = 1: one pair, element-wise.
template <typename T, int V, bool kInterleaved>
struct PairIO {
  static constexpr int kPairs = (V == 1) ? 1 : (kInterleaved ? V / 2 : V);
  using M = math_t<T>;

  __device__ static void load(const T* row, const RopeProblem& p, int64_t i0, M (&a)[kPairs], M (&b)[kPairs]) {
    if constexpr (V == 1) {
      a[0] = static_cast<M>(row[p.first(i0)]);
      b[0] = static_cast<M>(row[p.second(i0)]);
    } else if constexpr (kInterleaved) {
      const Vec<T, V> x = load_vec<T, V>(row + 2 * i0);
#pragma unroll
      for (int j = 0; j < kPairs; ++j) {
        a[j] = static_cast<M>(x.v[2 * j]);
        b[j] = static_cast<M>(x.v[2 * j + 1]);
      }
    } else {
      const Vec<T, V> xa = load_vec<T, V>(row + i0);
      const Vec<T, V> xb = load_vec<T, V>(row + i0 + p.rot_dim / 2);
#pragma unroll
      for (int j = 0; j < kPairs; ++j) {
        a[j] = static_cast<M>(xa.v[j]);
        b[j] = static_cast<M>(xb.v[j]);
      }
    }
  }

  __device__ static void store(T* row, const RopeProblem& p, int64_t i0, const M (&a)[kPairs], const M (&b)[kPairs]) {
    if constexpr (V == 1) {
      row[p.first(i0)] = static_cast<T>(a[0]);
      row[p.second(i0)] = static_cast<T>(b[0]);
    } else if constexpr (kInterleaved) {
      Vec<T, V> x;
#pragma unroll
      for (int j = 0; j < kPairs; ++j) {
        x.v[2 * j] = static_cast<T>(a[j]);
        x.v[2 * j + 1] = static_cast<T>(b[j]);
      }
      store_vec<T, V>(row + 2 * i0, x);
    } else {
      Vec<T, V> xa, xb;
#pragma unroll
      for (int j = 0; j < kPairs; ++j) {
        xa.v[j] = static_cast<T>(a[j]);
        xb.v[j] = static_cast<T>(b[j]);
      }
      store_vec<T, V>(row + i0, xa);
      store_vec<T, V>(row + i0 + p.rot_dim / 2, xb);
    }
  }
};

template <typename T, int V, bool kInterleaved>
__global__ void rope_kernel(const RopeProblem p, int64_t rot_chunks, int64_t pass_chunks) {
  using IO = PairIO<T, V, kInterleaved>;
  using M = math_t<T>;
  constexpr int kPairs = IO::kPairs;
  const int64_t chunks = rot_chunks + pass_chunks;
  const int64_t total = p.batch * p.seq * chunks;
  for (int64_t w = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; w < total; w += int64_t{gridDim.x} * blockDim.x) {
    const int64_t token = w / chunks, chunk = w % chunks;
    const int64_t b = token / p.seq, s = token % p.seq;

    if (chunk >= rot_chunks) {  // pass-through dims: copy (out of place only)
      const int64_t d0 = p.rot_dim + (chunk - rot_chunks) * V;
      const auto copy_heads = [&](const RopeOperand& op) {
        const T* src = static_cast<const T*>(op.src) + b * op.src_stride_b + s * op.src_stride_s + d0;
        T* dst = static_cast<T*>(op.dst) + b * op.dst_stride_b + s * op.dst_stride_s + d0;
        for (int64_t h = 0; h < op.heads; ++h) {
          store_vec<T, V>(dst + h * op.dst_stride_h, load_vec<T, V>(src + h * op.src_stride_h));
        }
      };
      copy_heads(p.q);
      copy_heads(p.k);
      continue;
    }

    // cos/sin of this chunk's pairs, once for all heads.
    const int64_t i0 = chunk * kPairs;
    PairFactors<M> f[kPairs];
    if (p.inv_freq) {
      const double position = static_cast<double>(p.position(b, s));
#pragma unroll
      for (int j = 0; j < kPairs; ++j) f[j] = factors_from_frequency<M>(p, position, i0 + j);
    } else {
      const int64_t row = p.cos_sin_row(b, s);
#pragma unroll
      for (int j = 0; j < kPairs; ++j) f[j] = factors_from_table<M, T>(p, row, i0 + j);
    }

    const auto rotate_heads = [&](const RopeOperand& op) {
      const T* src = static_cast<const T*>(op.src) + b * op.src_stride_b + s * op.src_stride_s;
      T* dst = static_cast<T*>(op.dst) + b * op.dst_stride_b + s * op.dst_stride_s;
#pragma unroll 2
      for (int64_t h = 0; h < op.heads; ++h) {
        M a[kPairs], bb[kPairs];
        IO::load(src + h * op.src_stride_h, p, i0, a, bb);
#pragma unroll
        for (int j = 0; j < kPairs; ++j) rotate_pair<M>(a[j], bb[j], f[j], p.inverse);
        IO::store(dst + h * op.dst_stride_h, p, i0, a, bb);
      }
    };
    rotate_heads(p.q);
    rotate_heads(p.k);
  }
}

// Can every row be moved in V-element (16-byte) vectors?
bool vector_ok(const RopeProblem& p, int v) {
  const int64_t pairs_step = p.interleaved ? p.rot_dim : p.rot_dim / 2;  // rotary extent in whole vectors
  if (pairs_step % v != 0) return false;
  if (p.copy_passthrough && ((p.head_dim - p.rot_dim) % v != 0 || p.rot_dim % v != 0)) return false;
  for (const RopeOperand* o : {&p.q, &p.k}) {
    if (o->heads == 0) continue;
    if (!aligned16(o->src) || !aligned16(o->dst)) return false;
    for (int64_t st : {o->src_stride_b, o->src_stride_s, o->src_stride_h, o->dst_stride_b, o->dst_stride_s,
                       o->dst_stride_h}) {
      if (st % v != 0) return false;
    }
  }
  return true;
}

template <typename T, int V>
void launch(const RopeProblem& p) {
  const int64_t pairs_per_chunk = V == 1 ? 1 : (p.interleaved ? V / 2 : V);
  const int64_t rot_chunks = (p.pairs() + pairs_per_chunk - 1) / pairs_per_chunk;
  const int64_t pass_chunks = p.copy_passthrough ? (p.head_dim - p.rot_dim + V - 1) / V : 0;
  const int64_t work = p.batch * p.seq * (rot_chunks + pass_chunks);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  if (p.interleaved) {
    rope_kernel<T, V, true><<<blocks_for(work), kThreads, 0, stream>>>(p, rot_chunks, pass_chunks);
  } else {
    rope_kernel<T, V, false><<<blocks_for(work), kThreads, 0, stream>>>(p, rot_chunks, pass_chunks);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

void run_rope(const RopeProblem& p, at::ScalarType dtype) {
  dispatch_float_types(dtype, "posenc.rope", [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVec = 16 / sizeof(T);
    if (vector_ok(p, kVec)) {
      launch<T, kVec>(p);
    } else {
      launch<T, 1>(p);
    }
  });
}

}  // namespace posenc::cuda
