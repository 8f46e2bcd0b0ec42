// Runs the CUDA kernels' work items on the host: every work item of many problems, in a shuffled
// order (GPU threads run in no particular order).
//  - RoPE (csrc/core/rope_chunks.h): checked bit for bit against a plain per-pair loop over the
//    same core math; buffers sit inside guard bands that must stay untouched.
//  - Sinusoidal (csrc/core/sinusoidal.h): checked against the float64 formula.
// Exit status 0 and "N passed, 0 failed" when all pass.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/rope_chunks.h"
#include "core/sinusoidal.h"

using namespace posenc;

namespace {

std::mt19937_64 rng(1234);

template <typename T>
T from_double(double v) { return static_cast<T>(static_cast<float>(v)); }
template <>
double from_double<double>(double v) { return v; }

template <typename T>
bool same_bits(const T& a, const T& b) { return std::memcmp(&a, &b, sizeof(T)) == 0; }

struct Case {
  std::string name;
  int64_t batch, seq, hq, hk, head_dim, rot_dim;
  bool interleaved, inverse, in_place, table, packed, fused, misalign;
  int64_t axes = 1;  // > 1: an axis layout (MRoPE), positions [axes, B, S], one-hot inv_freq [axes, pairs]
};

// Element-wise reference: for every token, head and pair, the core factors and rotation.
template <typename T>
void reference(const RopeProblem& p) {
  using M = math_t<T>;
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t s = 0; s < p.seq; ++s) {
      for (const RopeOperand* op : {&p.q, &p.k}) {
        for (int64_t h = 0; h < op->heads; ++h) {
          const T* src = static_cast<const T*>(op->src) + b * op->src_stride_b + s * op->src_stride_s + h * op->src_stride_h;
          T* dst = static_cast<T*>(op->dst) + b * op->dst_stride_b + s * op->dst_stride_s + h * op->dst_stride_h;
          for (int64_t i = 0; i < p.pairs(); ++i) {
            double angle = 0;
            if (p.inv_freq) pair_angles(p, b, s, i, 1, &angle);
            const PairFactors<M> f = p.inv_freq ? factors_from_angle<M>(p, angle)
                                                : factors_from_table<M, T>(p, p.cos_sin_row(b, s), i);
            M a = to_math<M>(src[p.first(i)]), c = to_math<M>(src[p.second(i)]);
            rotate_pair<M>(a, c, f, p.inverse);
            dst[p.first(i)] = from_math<T>(a);
            dst[p.second(i)] = from_math<T>(c);
          }
          if (p.copy_passthrough) {
            for (int64_t d = p.rot_dim; d < p.head_dim; ++d) dst[d] = src[d];
          }
        }
      }
    }
  }
}

template <typename T, int V>
void run_chunks(const RopeProblem& p) {
  const RopeChunks chunks = rope_chunks<V>(p);
  std::vector<int64_t> order(p.batch * p.seq * chunks.per_token());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  std::shuffle(order.begin(), order.end(), rng);
  for (int64_t w : order) {
    if (p.interleaved) rope_work_item<T, V, true>(p, chunks, w);
    else rope_work_item<T, V, false>(p, chunks, w);
  }
}

constexpr int64_t kGuard = 64;  // elements of guard band before and after every buffer

// Buffers of one operand: [guard | batch x seq x heads_total x head_dim | guard], heads_total > heads
// when the operand is a view into a fused projection.
template <typename T>
struct Buffer {
  std::vector<T> data;
  int64_t offset;  // of element 0 of the view
  void fill_random() {
    std::normal_distribution<double> dist;
    for (auto& v : data) v = from_double<T>(dist(rng));
  }
};

template <typename T>
int run_case(const Case& c, int* failures) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t heads_total = c.fused ? c.hq + 2 * c.hk : 0;
  // Layout [B, S, H, D] with the heads of q and k either in their own buffers or in one fused row.
  const auto make = [&](int64_t heads, int64_t head_offset, Buffer<T>& buf, RopeOperand& op, bool as_src) {
    const int64_t h_total = c.fused ? heads_total : heads;
    const int64_t extent = c.batch * c.seq * h_total * c.head_dim;
    if (buf.data.empty()) {
      buf.data.resize(extent + 2 * kGuard + 8);
      buf.offset = kGuard + (c.misalign ? 1 : 0);
      buf.fill_random();
    }
    T* base = buf.data.data() + buf.offset + head_offset * c.head_dim;
    const int64_t sh = c.head_dim, ss = h_total * c.head_dim, sb = c.seq * ss;
    if (as_src) {
      op.src = base;
      op.heads = heads;
      op.src_stride_b = sb, op.src_stride_s = ss, op.src_stride_h = sh;
    } else {
      op.dst = base;
      op.dst_stride_b = sb, op.dst_stride_s = ss, op.dst_stride_h = sh;
    }
  };

  RopeProblem p;
  p.batch = c.batch;
  p.seq = c.seq;
  p.head_dim = c.head_dim;
  p.rot_dim = c.rot_dim;
  p.interleaved = c.interleaved;
  p.inverse = c.inverse;
  p.copy_passthrough = !c.in_place && c.rot_dim < c.head_dim;
  Buffer<T> qsrc, ksrc, qdst, kdst;
  make(c.hq, 0, qsrc, p.q, true);
  make(c.hk, c.fused ? c.hq : 0, c.fused ? qsrc : ksrc, p.k, true);
  if (c.in_place) {
    p.q.dst = const_cast<void*>(p.q.src);
    p.q.dst_stride_b = p.q.src_stride_b, p.q.dst_stride_s = p.q.src_stride_s, p.q.dst_stride_h = p.q.src_stride_h;
    p.k.dst = const_cast<void*>(p.k.src);
    p.k.dst_stride_b = p.k.src_stride_b, p.k.dst_stride_s = p.k.src_stride_s, p.k.dst_stride_h = p.k.src_stride_h;
  } else {
    make(c.hq, 0, qdst, p.q, false);
    make(c.hk, 0, kdst, p.k, false);
  }

  std::vector<int64_t> positions(c.axes * c.batch * c.seq), cu{0};
  std::uniform_int_distribution<int64_t> pos_dist(0, 1 << 22);
  for (auto& v : positions) v = pos_dist(rng);
  if (c.packed) {
    for (int64_t t = 3; t < c.seq; t += 3) cu.push_back(t);
    cu.push_back(c.seq);
    p.cu_seqlens = cu.data();
    p.cu_seqlens_kind = IndexKind::Int64;
    p.n_seqs = static_cast<int64_t>(cu.size()) - 1;
    p.offset = 7;
  } else {
    p.positions = positions.data();
    p.positions_kind = IndexKind::Int64;
    p.pos_stride_b = c.seq, p.pos_stride_s = 1;
    p.pos_stride_a = c.batch * c.seq;
  }
  // With axes > 1, pair i reads axis i % axes (the rows of the other axes hold zeros).
  p.n_axes = c.axes;
  std::vector<double> inv_freq(c.axes * (c.rot_dim / 2), 0.0);
  for (int64_t i = 0; i < c.rot_dim / 2; ++i) {
    inv_freq[(i % c.axes) * (c.rot_dim / 2) + i] = std::pow(10000.0, -2.0 * i / c.rot_dim) * 0.9;
  }
  std::vector<T> cos_t(c.batch * c.seq * c.rot_dim), sin_t(cos_t.size());
  if (c.table) {
    std::normal_distribution<double> dist;
    for (size_t i = 0; i < cos_t.size(); ++i) cos_t[i] = from_double<T>(dist(rng)), sin_t[i] = from_double<T>(dist(rng));
    p.cos = cos_t.data();
    p.sin = sin_t.data();
    p.cs_stride_b = c.seq * c.rot_dim, p.cs_stride_s = c.rot_dim;
  } else {
    p.inv_freq = inv_freq.data();
    p.attention_factor = 1.25;
  }

  // The reference works on copies of the buffers, with pointers moved accordingly.
  const auto snapshot = [](const Buffer<T>& b) { return b.data; };
  std::vector<T> q0 = snapshot(qsrc), k0 = snapshot(ksrc), qd0 = snapshot(qdst), kd0 = snapshot(kdst);
  const bool vec = rope_vector_ok<T, kVec>(p);
  if (vec) run_chunks<T, kVec>(p); else run_chunks<T, 1>(p);
  std::vector<T> q1 = qsrc.data, k1 = ksrc.data, qd1 = qdst.data, kd1 = kdst.data;
  qsrc.data = q0, ksrc.data = k0, qdst.data = qd0, kdst.data = kd0;
  reference<T>(p);

  const auto compare = [&](const std::vector<T>& got, const std::vector<T>& want, const char* what) {
    for (size_t i = 0; i < got.size(); ++i) {
      if (!same_bits(got[i], want[i])) {
        std::printf("FAIL %s (%s, vector=%d): %s differs at %zu\n", c.name.c_str(), sizeof(T) == 2 ? "bf16" : sizeof(T) == 4 ? "f32" : "f64",
                    vec, what, i);
        ++*failures;
        return;
      }
    }
  };
  compare(q1, qsrc.data, "q buffer");
  compare(k1, ksrc.data, "k buffer");
  compare(qd1, qdst.data, "q output");
  compare(kd1, kdst.data, "k output");
  return vec ? 1 : 0;
}

// Sinusoidal: out = x * x_scale + PE for a [batch, seq, dim] x (or the table alone), every option.
int run_sinusoidal_case(int64_t dim, bool interleaved, bool cos_first, double freq_shift, bool add, bool strided_x,
                        int* failures) {
  const int64_t batch = add ? 2 : 1, seq = 7;
  SinusoidalProblem p;
  p.params.dim = dim;
  p.params.half = dim / 2;
  p.params.log_base = std::log(10000.0);
  p.params.freq_denom = static_cast<double>(dim / 2) - freq_shift;
  p.params.angle_scale = 1.5;
  p.params.interleaved = interleaved;
  p.params.cos_first = cos_first;
  p.batch = batch;
  p.seq = seq;
  std::vector<double> positions(seq);
  std::uniform_real_distribution<double> pos_dist(0, 1 << 20);
  for (auto& v : positions) v = pos_dist(rng);
  p.positions = positions.data();
  p.positions_kind = IndexKind::Float64;
  p.pos_stride_s = 1;
  const int64_t xs = strided_x ? 2 : 1;
  std::vector<float> x(batch * seq * dim * xs);
  std::normal_distribution<double> dist;
  for (auto& v : x) v = static_cast<float>(dist(rng));
  if (add) {
    p.x = x.data();
    p.x_stride_b = seq * dim * xs, p.x_stride_s = dim * xs, p.x_stride_d = xs;
    p.x_scale = 0.5;
  }
  std::vector<float> out(batch * seq * dim + 2 * kGuard, -7.0f);
  p.out = out.data() + kGuard;
  p.out_stride_b = seq * dim, p.out_stride_s = dim;
  std::vector<int64_t> order(sinusoidal_work_items(p));
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  std::shuffle(order.begin(), order.end(), rng);
  for (int64_t w : order) sinusoidal_work_item<float>(p, w);

  double worst = 0;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t s = 0; s < seq; ++s) {
      for (int64_t d = 0; d < dim; ++d) {
        double pe = 0;
        if (d < 2 * (dim / 2)) {
          const int64_t i = interleaved ? d / 2 : d % (dim / 2);
          const bool first = interleaved ? d % 2 == 0 : d < dim / 2;
          const bool is_sin = first != cos_first;
          const double w = std::exp(-std::log(10000.0) * i / (dim / 2 - freq_shift)) * 1.5;
          pe = is_sin ? std::sin(positions[s] * w) : std::cos(positions[s] * w);
        }
        const double want = pe + (add ? 0.5 * x[(b * seq * dim + s * dim + d) * xs] : 0.0);
        worst = std::max(worst, std::abs(out[kGuard + b * seq * dim + s * dim + d] - want));
      }
    }
  }
  bool guards_ok = true;
  for (int64_t g = 0; g < kGuard; ++g) guards_ok &= out[g] == -7.0f && out[out.size() - 1 - g] == -7.0f;
  if (worst > 4e-6 || !guards_ok) {
    std::printf("FAIL sinusoidal dim=%lld interleaved=%d cos_first=%d add=%d: max error %.3g, guards %s\n",
                static_cast<long long>(dim), interleaved, cos_first, add, worst, guards_ok ? "ok" : "WRITTEN");
    ++*failures;
  }
  return 1;
}

}  // namespace

int main() {
  std::vector<Case> cases;
  for (bool interleaved : {false, true}) {
    for (bool in_place : {false, true}) {
      for (bool table : {false, true}) {
        if (table && interleaved) continue;  // tables follow transformers' half-split convention
        const std::string tag = std::string(interleaved ? "interleaved" : "half") + (in_place ? "/in-place" : "/out") +
                                (table ? "/table" : "/freq");
        cases.push_back({tag + " full", 2, 5, 4, 2, 128, 128, interleaved, false, in_place, table, false, false, false});
        cases.push_back({tag + " partial", 2, 3, 3, 1, 64, 32, interleaved, false, in_place, table, false, false, false});
        cases.push_back({tag + " partial odd pairs", 1, 4, 2, 2, 40, 20, interleaved, true, in_place, table, false, false, false});
        cases.push_back({tag + " tiny", 1, 2, 1, 1, 6, 2, interleaved, false, in_place, table, false, false, false});
        cases.push_back({tag + " fused qkv", 2, 3, 4, 2, 64, 64, interleaved, true, in_place, table, false, true, false});
        cases.push_back({tag + " misaligned", 1, 3, 2, 1, 64, 48, interleaved, false, in_place, table, false, false, true});
        cases.push_back({tag + " packed", 1, 10, 2, 2, 32, 32, interleaved, false, in_place, table, true, false, false});
        cases.push_back({tag + " no k", 2, 4, 3, 0, 96, 96, interleaved, false, in_place, table, false, false, false});
        if (!table) {
          cases.push_back({tag + " mrope", 2, 5, 4, 2, 128, 128, interleaved, false, in_place, false, false, false, false, 3});
          cases.push_back({tag + " mrope partial", 1, 3, 2, 1, 64, 48, interleaved, true, in_place, false, false, false, true, 3});
        }
      }
    }
  }
  int failures = 0, vector_cases = 0, total = 0;
  for (const Case& c : cases) {
    vector_cases += run_case<float>(c, &failures);
    vector_cases += run_case<c10::BFloat16>(c, &failures);
    vector_cases += run_case<double>(c, &failures);
    total += 3;
  }
  std::printf("rope: %d problems, %d of them on the 16-byte vector path\n", total, vector_cases);
  for (int64_t dim : {2, 7, 64, 129}) {
    for (bool interleaved : {false, true}) {
      for (bool cos_first : {false, true}) {
        for (bool add : {false, true}) {
          total += run_sinusoidal_case(dim, interleaved, cos_first, dim > 2 ? 1.0 : 0.0, add, add && dim == 64, &failures);
        }
      }
    }
  }
  std::printf("%d passed, %d failed\n", total - failures, failures);
  return failures == 0 && vector_cases > 0 && vector_cases < total ? 0 : 1;
}
