// The GPU's division of RoPE work, as plain host/device code so the CPU tests can run it too
// (tests/cpp/cuda_work_on_host_test.cpp, run by tests/test_cuda_mapping_on_cpu.py, runs every work item
// on the host and checks it bit for bit against a plain per-pair loop).
//
// Work item w = (token, chunk). A rotary chunk covers kPairs pairs, whose cos/sin are formed once and
// reused for every q and k head; a pass-through chunk copies V dims of every head (out of place,
// partial rotary). Memory moves in V-element (16-byte) vectors when every row allows it (see
// rope_vector_ok), else element by element (V = 1).
#pragma once
#include <cstdint>

#include "core/rope.h"

namespace posenc {

// V elements of T moved as one access (16 bytes for V = 16 / sizeof(T)).
template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

template <typename T, int V>
POSENC_HD Vec<T, V> load_vec(const T* p) {
  return *reinterpret_cast<const Vec<T, V>*>(p);
}

template <typename T, int V>
POSENC_HD void store_vec(T* p, const Vec<T, V>& x) {
#ifdef __CUDA_ARCH__
  if constexpr (sizeof(Vec<T, V>) == sizeof(uint4)) {  // (assigned as a struct, nvcc stored it element by element)
    uint4 bits;
    memcpy(&bits, &x, sizeof bits);
    __stwb(reinterpret_cast<uint4*>(p), bits);
    return;
  }
#endif
  *reinterpret_cast<Vec<T, V>*>(p) = x;
}

// How a chunk's pairs sit in memory. Half-split: a = row[i0 .. i0+V), b = row[i0+R/2 ..] (V pairs);
// interleaved: one vector of V elements holds V/2 (a, b) pairs; V = 1: one pair, element-wise.
template <typename T, int V, bool kInterleaved>
struct PairIO {
  static constexpr int kPairs = (V == 1) ? 1 : (kInterleaved ? V / 2 : V);
  using M = math_t<T>;

  POSENC_HD static void load(const T* row, const RopeProblem& p, int64_t i0, M (&a)[kPairs], M (&b)[kPairs]) {
    if constexpr (V == 1) {
      a[0] = to_math<M>(row[p.first(i0)]);
      b[0] = to_math<M>(row[p.second(i0)]);
    } else if constexpr (kInterleaved) {
      const Vec<T, V> x = load_vec<T, V>(row + 2 * i0);
      for (int j = 0; j < kPairs; ++j) {
        a[j] = to_math<M>(x.v[2 * j]);
        b[j] = to_math<M>(x.v[2 * j + 1]);
      }
    } else {
      const Vec<T, V> xa = load_vec<T, V>(row + i0);
      const Vec<T, V> xb = load_vec<T, V>(row + i0 + p.rot_dim / 2);
      for (int j = 0; j < kPairs; ++j) {
        a[j] = to_math<M>(xa.v[j]);
        b[j] = to_math<M>(xb.v[j]);
      }
    }
  }

  POSENC_HD static void store(T* row, const RopeProblem& p, int64_t i0, const M (&a)[kPairs], const M (&b)[kPairs]) {
    if constexpr (V == 1) {
      row[p.first(i0)] = from_math<T>(a[0]);
      row[p.second(i0)] = from_math<T>(b[0]);
    } else if constexpr (kInterleaved) {
      Vec<T, V> x;
      for (int j = 0; j < kPairs; ++j) {
        x.v[2 * j] = from_math<T>(a[j]);
        x.v[2 * j + 1] = from_math<T>(b[j]);
      }
      store_vec<T, V>(row + 2 * i0, x);
    } else {
      Vec<T, V> xa, xb;
      for (int j = 0; j < kPairs; ++j) {
        xa.v[j] = from_math<T>(a[j]);
        xb.v[j] = from_math<T>(b[j]);
      }
      store_vec<T, V>(row + i0, xa);
      store_vec<T, V>(row + i0 + p.rot_dim / 2, xb);
    }
  }
};

// Chunks per token: rotary chunks first, then pass-through chunks.
struct RopeChunks {
  int64_t rot = 0, pass = 0;
  POSENC_HD int64_t per_token() const { return rot + pass; }
};

template <int V>
POSENC_HD RopeChunks rope_chunks(const RopeProblem& p) {
  const int64_t pairs_per_chunk = V == 1 ? 1 : (p.interleaved ? V / 2 : V);
  return {(p.pairs() + pairs_per_chunk - 1) / pairs_per_chunk,
          p.copy_passthrough ? (p.head_dim - p.rot_dim + V - 1) / V : 0};
}

// Can every row be moved in V-element vectors (aligned to V * sizeof(T) = 16 bytes)?
template <typename T, int V>
inline bool rope_vector_ok(const RopeProblem& p) {
  const int64_t extent = p.interleaved ? p.rot_dim : p.rot_dim / 2;  // each run of a's (and b's) in elements
  if (extent % V != 0) return false;
  if (p.copy_passthrough && ((p.head_dim - p.rot_dim) % V != 0 || p.rot_dim % V != 0)) return false;
  for (const RopeOperand* o : {&p.q, &p.k}) {
    if (o->heads == 0) continue;
    for (const void* ptr : {o->src, static_cast<const void*>(o->dst)}) {
      if (reinterpret_cast<uintptr_t>(ptr) % (sizeof(T) * V) != 0) return false;
    }
    for (int64_t st : {o->src_stride_b, o->src_stride_s, o->src_stride_h, o->dst_stride_b, o->dst_stride_s,
                       o->dst_stride_h}) {
      if (st % V != 0) return false;
    }
  }
  return true;
}

// One work item: what one GPU thread does for (token, chunk) = divmod(w, chunks.per_token()).
template <typename T, int V, bool kInterleaved>
POSENC_HD void rope_work_item(const RopeProblem& p, const RopeChunks& chunks, int64_t w) {
  using IO = PairIO<T, V, kInterleaved>;
  using M = math_t<T>;
  constexpr int kPairs = IO::kPairs;
  const int64_t token = w / chunks.per_token(), chunk = w % chunks.per_token();
  const int64_t b = token / p.seq, s = token % p.seq;
  if (p.cu_seqlens) {  // on the GPU the table is checked here, each entry by one work item
    for (int64_t j = w, items = p.batch * p.seq * chunks.per_token(); j <= p.n_seqs; j += items) {
      POSENC_DEVICE_REQUIRE(p.cu_seqlens_entry_ok(j),
                            "posenc: cu_seqlens must start at 0, be non-decreasing and end at the number of tokens");
    }
  }

  if (chunk >= chunks.rot) {  // pass-through dims: copy
    const int64_t d0 = p.rot_dim + (chunk - chunks.rot) * V;
    const auto copy_heads = [&](const RopeOperand& op) {
      const T* src = static_cast<const T*>(op.src) + b * op.src_stride_b + s * op.src_stride_s + d0;
      T* dst = static_cast<T*>(op.dst) + b * op.dst_stride_b + s * op.dst_stride_s + d0;
      for (int64_t h = 0; h < op.heads; ++h) {
        store_vec<T, V>(dst + h * op.dst_stride_h, load_vec<T, V>(src + h * op.src_stride_h));
      }
    };
    copy_heads(p.q);
    copy_heads(p.k);
    return;
  }

  // cos/sin of this chunk's pairs, once for all heads.
  const int64_t i0 = chunk * kPairs;
  PairFactors<M> f[kPairs];
  if (p.inv_freq) {
    double angle[kPairs];
    pair_angles(p, b, s, i0, kPairs, angle);
    for (int j = 0; j < kPairs; ++j) {
      POSENC_DEVICE_REQUIRE(angle_in_domain(angle[j]), "posenc: position * inv_freq must stay within 2^50 rad");
      f[j] = factors_from_angle<M>(p, angle[j]);
    }
  } else {
    const int64_t row = p.cos_sin_row(b, s);
    for (int j = 0; j < kPairs; ++j) f[j] = factors_from_table<M, T>(p, row, i0 + j);
  }
  // Heads go in groups of kHeadGroup: all of a group's loads are issued before its stores, so each
  // thread keeps several memory requests in flight (in place, a store may alias a later load, so
  // the compiler could not reorder them itself).
  constexpr int kHeadGroup = 4;
  const auto rotate_heads = [&](const RopeOperand& op) {
    const T* src = static_cast<const T*>(op.src) + b * op.src_stride_b + s * op.src_stride_s;
    T* dst = static_cast<T*>(op.dst) + b * op.dst_stride_b + s * op.dst_stride_s;
    for (int64_t h0 = 0; h0 < op.heads; h0 += kHeadGroup) {
      const int n = op.heads - h0 < kHeadGroup ? static_cast<int>(op.heads - h0) : kHeadGroup;
      M a[kHeadGroup][kPairs], bb[kHeadGroup][kPairs];
      for (int g = 0; g < kHeadGroup; ++g) {
        if (g < n) IO::load(src + (h0 + g) * op.src_stride_h, p, i0, a[g], bb[g]);
      }
      for (int g = 0; g < kHeadGroup; ++g) {
        if (g >= n) continue;
        for (int j = 0; j < kPairs; ++j) rotate_pair<M>(a[g][j], bb[g][j], f[j], p.inverse);
        IO::store(dst + (h0 + g) * op.dst_stride_h, p, i0, a[g], bb[g]);
      }
    }
  };
  rotate_heads(p.q);
  rotate_heads(p.k);
}

}  // namespace posenc
