// Runs the CUDA kernels' work items of csrc/core/relative_bias.h on the host, in a shuffled order
// (GPU threads run in no particular order), against plain loops written from the definitions:
//   forward   bias_work_item (one (i, j) for every head)      vs  bias[h][i][j] = value(h, j - i - offset)
//   backward  diagonal_sum_item + bias_grad_item               vs  sums over every (i, j) of the gradient
// Buffers sit inside guard bands that must stay untouched. Exit status 0 and "N passed, 0 failed".
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/relative_bias.h"

using namespace posenc;

namespace {

std::mt19937_64 rng(77);
int passed = 0, failed = 0;

void expect(bool ok, const std::string& what) {
  if (ok) {
    ++passed;
  } else {
    ++failed;
    std::printf("FAIL %s\n", what.c_str());
  }
}

std::vector<int64_t> shuffled(int64_t n) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  return order;
}

T5Bucketing bucketing(bool bidirectional, int64_t num_buckets, int64_t max_distance) {
  T5Bucketing t;
  t.bidirectional = bidirectional;
  t.buckets = bidirectional ? num_buckets / 2 : num_buckets;
  t.max_exact = t.buckets / 2;
  t.max_distance = max_distance;
  t.log_ratio = std::log(static_cast<double>(max_distance) / static_cast<double>(t.max_exact));
  return t;
}

constexpr int64_t kGuard = 64;
constexpr float kSentinel = -12345.f;

bool guards_ok(const std::vector<float>& buf, int64_t n) {
  for (int64_t g = 0; g < kGuard; ++g) {
    if (buf[g] != kSentinel || buf[kGuard + n + g] != kSentinel) return false;
  }
  return true;
}

void forward_case(BiasKind kind, int64_t heads, int64_t lq, int64_t lk, int64_t offset, bool bidirectional,
                  int64_t num_buckets, int64_t max_distance) {
  const std::string name = std::string(kind == BiasKind::T5 ? "t5" : "alibi") + " H=" + std::to_string(heads) +
                           " Lq=" + std::to_string(lq) + " Lk=" + std::to_string(lk) + " off=" + std::to_string(offset);
  std::normal_distribution<float> normal;
  // weight [num_buckets, heads] read through strides (1, num_buckets): a transposed view
  std::vector<float> weight(static_cast<size_t>(num_buckets * heads));
  for (auto& v : weight) v = normal(rng);
  std::vector<double> slopes(static_cast<size_t>(heads));
  for (int64_t h = 0; h < heads; ++h) slopes[h] = alibi_slope(h, heads);
  const int64_t n = heads * lq * lk;
  std::vector<float> out(static_cast<size_t>(n + 2 * kGuard), kSentinel);
  RelativeBiasProblem p;
  p.kind = kind;
  p.heads = heads;
  p.query_length = lq;
  p.key_length = lk;
  p.query_offset = offset;
  p.t5 = bucketing(bidirectional, num_buckets, max_distance);
  p.weight = weight.data();
  p.weight_stride_b = 1;
  p.weight_stride_h = num_buckets;
  p.slopes = slopes.data();
  p.out = out.data() + kGuard;
  for (int64_t w : shuffled(lq * lk)) bias_work_item<float>(p, w);
  bool ok = guards_ok(out, n);
  for (int64_t h = 0; h < heads && ok; ++h) {
    for (int64_t i = 0; i < lq && ok; ++i) {
      for (int64_t j = 0; j < lk && ok; ++j) {
        const int64_t r = j - (i + offset);
        const float want = kind == BiasKind::T5
                               ? weight[p.t5.bucket(r) + h * num_buckets]
                               : static_cast<float>(static_cast<float>(slopes[h]) * static_cast<float>(r));
        ok = out[kGuard + (h * lq + i) * lk + j] == want;
      }
    }
  }
  expect(ok, "forward " + name);
}

void backward_case(BiasKind kind, int64_t heads, int64_t lq, int64_t lk, int64_t offset, bool bidirectional,
                   int64_t num_buckets, int64_t max_distance) {
  const std::string name = std::string(kind == BiasKind::T5 ? "t5" : "alibi") + " H=" + std::to_string(heads) +
                           " Lq=" + std::to_string(lq) + " Lk=" + std::to_string(lk) + " off=" + std::to_string(offset);
  std::normal_distribution<double> normal;
  // grad [heads, Lq, Lk] stored as [Lq, heads, Lk] (strided, like a transposed gradient)
  std::vector<double> grad(static_cast<size_t>(heads * lq * lk));
  for (auto& v : grad) v = normal(rng);
  const auto g_at = [&](int64_t h, int64_t i, int64_t j) { return grad[(i * heads + h) * lk + j]; };
  RelativeBiasGradProblem p;
  p.kind = kind;
  p.heads = heads;
  p.query_length = lq;
  p.key_length = lk;
  p.query_offset = offset;
  p.t5 = bucketing(bidirectional, num_buckets, max_distance);
  p.num_buckets = num_buckets;
  p.grad = grad.data();
  p.grad_stride_h = lk;
  p.grad_stride_i = heads * lk;
  p.grad_stride_j = 1;
  std::vector<double> diagonal(static_cast<size_t>(heads * p.diagonals()), -1.0);
  p.diagonal = diagonal.data();
  const int64_t n_out = bias_grad_items(p);
  std::vector<double> out(static_cast<size_t>(n_out + 2 * kGuard), kSentinel);
  p.out = out.data() + kGuard;
  for (int64_t w : shuffled(heads * p.diagonals())) diagonal_sum_item<double>(p, w);
  for (int64_t w : shuffled(n_out)) bias_grad_item<double>(p, w);

  std::vector<double> want(static_cast<size_t>(n_out), 0.0);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < lq; ++i) {
      for (int64_t j = 0; j < lk; ++j) {
        const int64_t r = j - (i + offset);
        if (kind == BiasKind::T5) {
          want[p.t5.bucket(r) * heads + h] += g_at(h, i, j);
        } else {
          want[h] += g_at(h, i, j) * static_cast<double>(r);
        }
      }
    }
  }
  bool ok = true;
  for (int64_t g = 0; g < kGuard; ++g) ok = ok && out[g] == kSentinel && out[kGuard + n_out + g] == kSentinel;
  for (int64_t w = 0; w < n_out && ok; ++w) {
    ok = std::abs(out[kGuard + w] - want[w]) <= 1e-9 * (1.0 + std::abs(want[w]));
  }
  expect(ok, "backward " + name);
}

}  // namespace

int main() {
  struct Shape {
    int64_t heads, lq, lk, offset;
  };
  const Shape shapes[] = {{1, 1, 1, 0}, {3, 7, 11, 0}, {4, 1, 300, 299}, {2, 40, 33, 5}, {5, 17, 200, -7},
                          {1, 130, 2, 0}, {6, 64, 64, 1000}, {2, 17, 25, int64_t{1} << 40},
                          {2, 5, 40, -(int64_t{1} << 40)}};
  const struct {
    bool bidirectional;
    int64_t num_buckets, max_distance;
  } configs[] = {{true, 32, 128}, {false, 32, 128}, {true, 34, 27}, {false, 7, 20},
                 {true, 4, 2}, {false, 2, 2}, {false, 3, 3}};  // the fewest buckets, max_distance just past the exact ones
  for (const auto& s : shapes) {
    for (const auto& c : configs) {
      forward_case(BiasKind::T5, s.heads, s.lq, s.lk, s.offset, c.bidirectional, c.num_buckets, c.max_distance);
      backward_case(BiasKind::T5, s.heads, s.lq, s.lk, s.offset, c.bidirectional, c.num_buckets, c.max_distance);
    }
    forward_case(BiasKind::Alibi, s.heads, s.lq, s.lk, s.offset, true, 32, 128);
    backward_case(BiasKind::Alibi, s.heads, s.lq, s.lk, s.offset, true, 32, 128);
  }
  // The slope rule against its closed form for a power of two and the interleaved rest.
  expect(alibi_slope(0, 8) == 0.5 && alibi_slope(7, 8) == std::exp2(-8.0), "alibi_slope powers of two");
  expect(alibi_slope(8, 12) == std::exp2(-0.5) && alibi_slope(9, 12) == std::exp2(-1.5), "alibi_slope remainder");
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
