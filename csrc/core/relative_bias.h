// Relative position biases, shared by the CPU and CUDA backends: T5's bucketed bias and ALiBi.
//
// Both depend on a (query i, key j) pair only through the relative position
//   r = j - (i + query_offset)
// so per head the [Lq, Lk] bias is constant along diagonals: value(h, r) for the Lq + Lk - 1
// diagonals t = j - i + Lq - 1 (r = t - (Lq - 1) - query_offset). The forward writes value(h, r);
// the backward sums the gradient along each diagonal (in float64, in a fixed order) and then per
// bucket (T5) or weighted by r (ALiBi).
#pragma once
#include <cmath>

#include "core/common.h"

namespace posenc {

// transformers' T5Attention._relative_position_bucket. With n the distance (|r| when bidirectional,
// max(-r, 0) otherwise), buckets = num_buckets (halved when bidirectional) and max_exact = buckets / 2:
//   n < max_exact:  bucket n
//   otherwise:      max_exact + floor((buckets - max_exact) * ln(n / max_exact) / ln(max_distance / max_exact)),
//                   at most buckets - 1
// plus buckets for keys after the query when bidirectional. transformers evaluates the log-spaced
// part in float32; here it is float64, so the result is the exact one: the two agree except where
// the exact value is an integer k, (n / max_exact)^(buckets - max_exact) = (max_distance / max_exact)^k
// (e.g. n = 18 for num_buckets 34, max_distance 27, bidirectional), where transformers' float32 log rounds either
// way depending on the machine's log implementation (tests/test_relative_bias.py checks both facts
// on every distance of many configurations). A value within float64's error below an integer counts
// as that integer (bucket's margin: about 1e-13 for T5's defaults, below 6e-11 for the 1024 buckets
// the ops allow), so that such an exact k gives k;
// a value that close below k without being k would give k as well (the closest seen, searching
// max_distance up to 2^20, is 2.7e-10 below: thousands of times the margin).
struct T5Bucketing {
  int64_t buckets = 16;     // per direction: num_buckets / 2 when bidirectional, else num_buckets
  int64_t max_exact = 8;    // buckets / 2: distances below it have a bucket of their own
  int64_t max_distance = 128;
  double log_ratio = 0;     // ln(max_distance / max_exact), > 0
  bool bidirectional = true;

  POSENC_HD int64_t bucket(int64_t relative_position) const {
    int64_t base = 0;
    uint64_t n;  // the distance; unsigned so that |INT64_MIN| does not overflow
    const uint64_t magnitude = relative_position < 0 ? uint64_t{0} - static_cast<uint64_t>(relative_position)
                                                     : static_cast<uint64_t>(relative_position);
    if (bidirectional) {
      if (relative_position > 0) base = buckets;  // keys after the query: the upper half
      n = magnitude;
    } else {
      n = relative_position < 0 ? magnitude : 0;  // keys after the query share bucket 0
    }
    if (n < static_cast<uint64_t>(max_exact)) return base + static_cast<int64_t>(n);
    if (n >= static_cast<uint64_t>(max_distance)) return base + buckets - 1;  // the formula gives >= buckets - 1
    const double v = static_cast<double>(buckets - max_exact) *
                     (log(static_cast<double>(n) / static_cast<double>(max_exact)) / log_ratio);
    // v's error: the roundings of n / max_exact (absolute 2^-53 in its log, amplified by 1 / log_ratio
    // <= max_exact + 1), of the logs (1 ulp each) and of the quotient: below
    // (buckets - max_exact) (max_exact + 7) 2^-53; twice the margin of that
    const double margin = static_cast<double>(buckets - max_exact) * static_cast<double>(max_exact + 7) * 0x1p-52;
    const int64_t large = max_exact + static_cast<int64_t>(v + margin);
    return base + (large < buckets - 1 ? large : buckets - 1);
  }
};

// One function per relative position r for every head: T5 gathers weight[bucket(r), h], ALiBi
// computes slopes[h] * r (in float64, rounded once to the math type: float32 for float32 and half
// types, which round once more on store, as BLOOM's and MPT's float32 bias cast to half does).
enum class BiasKind : int { T5 = 0, Alibi = 1 };

struct RelativeBiasProblem {
  BiasKind kind = BiasKind::T5;
  int64_t heads = 0, query_length = 0, key_length = 0, query_offset = 0;
  T5Bucketing t5;
  const void* weight = nullptr;  // T5: [num_buckets, heads] in the output dtype
  int64_t weight_stride_b = 0, weight_stride_h = 1;
  const double* slopes = nullptr;  // ALiBi: [heads], contiguous float64
  void* out = nullptr;             // [heads, Lq, Lk], contiguous

  POSENC_HD int64_t diagonals() const { return query_length + key_length - 1; }
  // Relative position of diagonal t (t = j - i + Lq - 1).
  POSENC_HD int64_t relative(int64_t t) const { return t - (query_length - 1) - query_offset; }
};

// The forward's two values of head h: T5's weight at r's bucket, ALiBi's slope times r (the distance).
template <typename T>
POSENC_HD T t5_value(const RelativeBiasProblem& p, int64_t bucket, int64_t h) {
  return static_cast<const T*>(p.weight)[bucket * p.weight_stride_b + h * p.weight_stride_h];
}
// The product in float64, rounded once to the math type: exact for float32 slopes and |r| < 2^29.
// In float32, r itself would round past 2^24 and a float64 slope before the product.
template <typename T>
POSENC_HD T alibi_value(const RelativeBiasProblem& p, double distance, int64_t h) {
  return from_math<T>(static_cast<math_t<T>>(p.slopes[h] * distance));
}

// Writes value(h, r) for every head h to dst[h * dst_stride_h] (the GPU's work item).
template <typename T>
POSENC_HD void bias_column(const RelativeBiasProblem& p, int64_t r, T* dst, int64_t dst_stride_h) {
  if (p.kind == BiasKind::T5) {
    const int64_t bucket = p.t5.bucket(r);
    for (int64_t h = 0; h < p.heads; ++h) dst[h * dst_stride_h] = t5_value<T>(p, bucket, h);
  } else {
    const double distance = static_cast<double>(r);
    for (int64_t h = 0; h < p.heads; ++h) dst[h * dst_stride_h] = alibi_value<T>(p, distance, h);
  }
}

// One GPU work item of the forward: element (i, j) of every head (the bucket is found once).
template <typename T>
POSENC_HD void bias_work_item(const RelativeBiasProblem& p, int64_t w) {
  const int64_t i = w / p.key_length, j = w % p.key_length;
  bias_column<T>(p, j - i - p.query_offset, static_cast<T*>(p.out) + w, p.query_length * p.key_length);
}

// ALiBi slope of head h (0-based) of num_heads, in float64 (the ALiBi paper's rule, as BLOOM and
// MPT compute it): with c the largest power of two <= num_heads, heads h < c get 2^(-8 (h+1) / c),
// the remaining ones 2^(-4 k / c) for odd k = 1, 3, 5, ...
inline double alibi_slope(int64_t h, int64_t num_heads) {
  int64_t c = 1;
  while (2 * c <= num_heads) c *= 2;
  if (h < c) return std::exp2(-8.0 * static_cast<double>(h + 1) / static_cast<double>(c));
  return std::exp2(-4.0 * static_cast<double>(2 * (h - c) + 1) / static_cast<double>(c));
}

}  // namespace posenc

namespace posenc {

// The backward: grad [heads, Lq, Lk] (any strides) -> diagonal sums [heads, Lq + Lk - 1] (float64)
// -> T5: grad_weight [num_buckets, heads]; ALiBi: grad_slopes [heads]. Sums run in a fixed order
// (no atomics), so the result does not depend on thread scheduling.
struct RelativeBiasGradProblem {
  BiasKind kind = BiasKind::T5;
  int64_t heads = 0, query_length = 0, key_length = 0, query_offset = 0;
  T5Bucketing t5;
  int64_t num_buckets = 0;  // T5: rows of grad_weight
  const void* grad = nullptr;
  int64_t grad_stride_h = 0, grad_stride_i = 0, grad_stride_j = 1;
  double* diagonal = nullptr;  // [heads, diagonals()] scratch, contiguous
  void* out = nullptr;         // T5: [num_buckets, heads] in grad's dtype; ALiBi: [heads] float64; contiguous

  POSENC_HD int64_t diagonals() const { return query_length + key_length - 1; }
  POSENC_HD int64_t relative(int64_t t) const { return t - (query_length - 1) - query_offset; }
};

// Sum of grad[h] along diagonal t, rows ascending (a GPU work item: w = h * diagonals + t).
template <typename T>
POSENC_HD void diagonal_sum_item(const RelativeBiasGradProblem& p, int64_t w) {
  const int64_t nd = p.diagonals();
  const int64_t h = w / nd, t = w % nd;
  const int64_t shift = t - (p.query_length - 1);  // j = i + shift
  const int64_t i0 = -shift > 0 ? -shift : 0;
  const int64_t i1 = p.key_length - shift < p.query_length ? p.key_length - shift : p.query_length;
  const T* g = static_cast<const T*>(p.grad) + h * p.grad_stride_h;
  double acc = 0;
  for (int64_t i = i0; i < i1; ++i) {
    acc += static_cast<double>(to_math<math_t<T>>(g[i * p.grad_stride_i + (i + shift) * p.grad_stride_j]));
  }
  p.diagonal[w] = acc;
}

// First t in [lo, hi) where pred(t) holds, for a pred that is false and then true along [lo, hi)
// (hi if it never holds).
template <typename Pred>
POSENC_HD int64_t first_where(int64_t lo, int64_t hi, Pred pred) {
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (pred(mid)) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

// Bucket b's diagonals, found by bisection rather than by bucketing every diagonal (a log each): the
// bucket grows with the distance |r| on either side of r = 0, so it falls as t rises over the
// diagonals with r <= 0 and rises over those with r > 0, and b's diagonals are one run on each side,
// [lower, lower_end) and [upper, upper_end), one of them empty but for the decoder's bucket 0 (r >= 0).
// (bucket() is monotone in |r| as computed, not only in exact arithmetic, for max_distance <= 2^40:
// csrc/host/bias_plan.cpp, t5_bucketing.)
struct BucketDiagonals {
  int64_t lower = 0, lower_end = 0, upper = 0, upper_end = 0;

  POSENC_HD BucketDiagonals(const RelativeBiasGradProblem& p, int64_t b) {
    const int64_t nd = p.diagonals();
    const auto bucket = [&](int64_t t) { return p.t5.bucket(p.relative(t)); };
    const int64_t split = first_where(0, nd, [&](int64_t t) { return p.relative(t) > 0; });
    lower = first_where(0, split, [&](int64_t t) { return bucket(t) <= b; });
    lower_end = first_where(lower, split, [&](int64_t t) { return bucket(t) < b; });
    upper = first_where(split, nd, [&](int64_t t) { return bucket(t) >= b; });
    upper_end = first_where(upper, nd, [&](int64_t t) { return bucket(t) > b; });
  }
};

// T5's gradient of weight[b, h]: head h's sums of b's diagonals, ascending, rounded once to T (the weight's dtype).
template <typename T>
POSENC_HD void t5_grad_element(const RelativeBiasGradProblem& p, const BucketDiagonals& runs, int64_t b, int64_t h) {
  const double* d = p.diagonal + h * p.diagonals();
  double acc = 0;
  for (int64_t t = runs.lower; t < runs.lower_end; ++t) acc += d[t];
  for (int64_t t = runs.upper; t < runs.upper_end; ++t) acc += d[t];
  static_cast<T*>(p.out)[b * p.heads + h] = from_math<T>(static_cast<math_t<T>>(acc));
}

// The last stage, one output element per work item (the GPU's). T5: w = b * heads + h. ALiBi: w = h
// sums diagonal * r, kept in float64: the slopes' dtype is not the bias's (float32 slopes, an fp16
// bias), and rounded to T first a sum past 65504 became inf in fp16.
template <typename T>
POSENC_HD void bias_grad_item(const RelativeBiasGradProblem& p, int64_t w) {
  if (p.kind == BiasKind::T5) {
    const int64_t b = w / p.heads;
    t5_grad_element<T>(p, BucketDiagonals(p, b), b, w % p.heads);
    return;
  }
  const int64_t nd = p.diagonals();
  const double* d = p.diagonal + w * nd;
  double acc = 0;
  for (int64_t t = 0; t < nd; ++t) acc += d[t] * static_cast<double>(p.relative(t));
  static_cast<double*>(p.out)[w] = acc;
}

POSENC_HD int64_t bias_grad_items(const RelativeBiasGradProblem& p) {
  return p.kind == BiasKind::T5 ? p.num_buckets * p.heads : p.heads;
}

// t5_relative_position_bucket over a tensor: in (int32 or int64, contiguous) -> out int64.
struct BucketProblem {
  T5Bucketing t5;
  int64_t numel = 0;
  const void* in = nullptr;
  IndexKind in_kind = IndexKind::Int64;
  int64_t* out = nullptr;

  POSENC_HD void item(int64_t w) const { out[w] = t5.bucket(load_as_int64(in, in_kind, w)); }
};

}  // namespace posenc
