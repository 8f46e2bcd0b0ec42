#include "host/bias_plan.h"

#include <cmath>
#include <vector>

namespace posenc {
namespace {

// Offsets this large would overflow j - i - query_offset; no sequence comes near.
constexpr int64_t kMaxOffset = int64_t{1} << 60;
constexpr int64_t kMaxBuckets = 1024;  // (t5_bucketing says why)
constexpr int64_t kMaxDistance = int64_t{1} << 40;  // (likewise)

void check_lengths(const char* op, int64_t query_length, int64_t key_length, int64_t query_offset) {
  POSENC_CHECK(query_length >= 0, op, ": query_length must be >= 0, got ", query_length);
  POSENC_CHECK(key_length >= 0, op, ": key_length must be >= 0, got ", key_length);
  POSENC_CHECK(query_length < kMaxOffset && key_length < kMaxOffset, op, ": query_length and key_length must be < 2^60");
  POSENC_CHECK(query_offset > -kMaxOffset && query_offset < kMaxOffset, op,
              ": query_offset must be in (-2^60, 2^60), got ", query_offset);
}

// T5's bucketing parameters. Each direction needs >= 1 exact bucket (num_buckets >= 2, >= 4 when
// bidirectional) and max_distance past the exact buckets (else the log-spaced formula divides by
// log(max_distance / max_exact) <= 0). At most 1024 buckets: T5Bucketing::bucket's margin (float64's
// error bound, which grows with the square of the count) stays below 6e-11, well under the distances
// below an integer tests/test_relative_bias.py pins (3e-10, 8e-10); at 2^27 buckets it reached a
// whole bucket (distance 2^26 got the bucket above). max_distance at most 2^40: the backward finds a
// bucket's diagonals by bisection (csrc/core/relative_bias.h, BucketDiagonals) and the CPU forward
// its runs of one bucket (relative_bias_cpu.cpp, BucketRuns), which need bucket() to be monotone in
// the distance n, and neither CUDA's nor the host's log promises that between adjacent arguments.
// Below 2^40, ln(n + 1) - ln(n) > 2^-40 outweighs many times over a log's error (1 ulp: at most
// 2^-48, the logs being below 32) and the roundings of n / max_exact, and every later step
// (quotient, product, floor) rounds monotonically; at or past max_distance every n has the last
// bucket.
T5Bucketing t5_bucketing(const char* op, bool bidirectional, int64_t num_buckets, int64_t max_distance) {
  POSENC_CHECK(!bidirectional || num_buckets % 2 == 0, op,
              ": num_buckets must be even when bidirectional (half the buckets for each direction), got ", num_buckets);
  const int64_t least = bidirectional ? 4 : 2;
  POSENC_CHECK(num_buckets >= least, op, ": num_buckets must be >= ", least, bidirectional ? " when bidirectional" : "",
              ", got ", num_buckets);
  POSENC_CHECK(num_buckets <= kMaxBuckets, op, ": num_buckets must be <= ", kMaxBuckets, " (T5 uses 32), got ",
               num_buckets);
  T5Bucketing t;
  t.bidirectional = bidirectional;
  t.buckets = bidirectional ? num_buckets / 2 : num_buckets;
  t.max_exact = t.buckets / 2;
  POSENC_CHECK(max_distance > t.max_exact, op, ": max_distance must be > ", t.max_exact,
              " (the exact distances: num_buckets / ", bidirectional ? 4 : 2, "), got ", max_distance);
  POSENC_CHECK(max_distance <= kMaxDistance, op, ": max_distance must be <= 2^40 (T5 uses 128), got ", max_distance);
  t.max_distance = max_distance;
  t.log_ratio = std::log(static_cast<double>(max_distance) / static_cast<double>(t.max_exact));
  return t;
}

// grad [1, heads, Lq, Lk] of a bias: fills the shared part of the backward problem.
RelativeBiasGradProblem grad_problem(const char* op, const Tensor& grad, int64_t query_offset) {
  POSENC_CHECK(grad.dim() == 4 && grad.size(0) == 1, op,
              ": grad must be [1, heads, query_length, key_length], got shape ", sizes_of(grad));
  POSENC_CHECK(is_float_dtype(dtype_of(grad)), op, ": grad must be float32, float16, bfloat16 or float64, got ",
              dtype_of(grad));
  check_lengths(op, grad.size(2), grad.size(3), query_offset);
  RelativeBiasGradProblem p;
  p.heads = grad.size(1);
  p.query_length = grad.size(2);
  p.key_length = grad.size(3);
  p.query_offset = query_offset;
  p.grad = grad.data_ptr();
  p.grad_stride_h = grad.stride(1);
  p.grad_stride_i = grad.stride(2);
  p.grad_stride_j = grad.stride(3);
  return p;
}

}  // namespace

Tensor t5_relative_position_bucket_op(const T5BucketArgs& a, const Backend& backend) {
  constexpr const char* op = "posenc.t5_relative_position_bucket";
  const Tensor& relative_position = a.relative_position;
  const auto t = dtype_of(relative_position);
  POSENC_CHECK(t == ScalarType::Int || t == ScalarType::Long, op, ": relative_position must be int32 or int64, got ", t);
  BucketProblem p;
  p.t5 = t5_bucketing(op, a.bidirectional, a.num_buckets, a.max_distance);
  const Tensor in = as_contiguous(relative_position);
  Tensor out = empty(relative_position.sizes(), ScalarType::Long, relative_position);
  if (out.numel() == 0) return out;
  p.numel = in.numel();
  p.in = in.data_ptr();
  p.in_kind = t == ScalarType::Int ? IndexKind::Int32 : IndexKind::Int64;
  p.out = static_cast<int64_t*>(out.data_ptr());
  backend.bucket(p);
  return out;
}

Tensor relative_position_bias_op(const RelativeBiasArgs& a, const Backend& backend) {
  constexpr const char* op = "posenc.relative_position_bias";
  const Tensor& weight = a.weight;
  const int64_t num_buckets = a.num_buckets, query_length = a.query_length, key_length = a.key_length,
                query_offset = a.query_offset;
  POSENC_CHECK(weight.dim() == 2 && weight.size(0) == num_buckets, op, ": weight must be [num_buckets = ", num_buckets,
              ", heads] (T5's relative_attention_bias.weight), got shape ", sizes_of(weight));
  POSENC_CHECK(is_float_dtype(dtype_of(weight)), op, ": weight must be float32, float16, bfloat16 or float64, got ",
              dtype_of(weight));
  check_has_data(op, weight, "weight");
  check_lengths(op, query_length, key_length, query_offset);
  RelativeBiasProblem p;
  p.kind = BiasKind::T5;
  p.t5 = t5_bucketing(op, a.bidirectional, num_buckets, a.max_distance);
  check_output_size(op, "[1, heads, query_length, key_length]", {1, weight.size(1), query_length, key_length},
                    dtype_of(weight));
  Tensor out = empty({1, weight.size(1), query_length, key_length}, dtype_of(weight), weight);
  if (out.numel() == 0) return out;
  p.heads = weight.size(1);
  p.query_length = query_length;
  p.key_length = key_length;
  p.query_offset = query_offset;
  p.weight = weight.data_ptr();
  p.weight_stride_b = weight.stride(0);
  p.weight_stride_h = weight.stride(1);
  p.out = out.data_ptr();
  backend.relative_bias(p, dtype_of(weight));
  return out;
}

namespace {

// Both backwards: sum the gradient along each diagonal (float64 scratch), then per bucket or slope.
Tensor run_grad(RelativeBiasGradProblem& p, const Tensor& grad, Tensor& out, const Backend& backend) {
  if (out.numel() == 0) return out;
  if (p.query_length == 0 || p.key_length == 0) return torch::stable::zero_(out);
  Tensor diagonal = empty({p.heads, p.diagonals()}, ScalarType::Double, grad);
  p.diagonal = static_cast<double*>(diagonal.data_ptr());
  p.out = out.data_ptr();
  backend.relative_bias_grad(p, dtype_of(grad));
  return out;
}

}  // namespace

Tensor relative_position_bias_backward_op(const RelativeBiasBackwardArgs& a, const Backend& backend) {
  constexpr const char* op = "posenc.relative_position_bias_backward";
  const Tensor& grad = a.grad;
  const int64_t num_buckets = a.num_buckets;
  RelativeBiasGradProblem p = grad_problem(op, grad, a.query_offset);
  p.kind = BiasKind::T5;
  p.t5 = t5_bucketing(op, a.bidirectional, num_buckets, a.max_distance);
  p.num_buckets = num_buckets;
  Tensor out = empty({num_buckets, p.heads}, dtype_of(grad), grad);
  return run_grad(p, grad, out, backend);
}

Tensor alibi_bias_op(const AlibiArgs& a, const Backend& backend) {
  constexpr const char* op = "posenc.alibi_bias";
  const Tensor& slopes = a.slopes;
  const int64_t query_length = a.query_length, key_length = a.key_length, query_offset = a.query_offset;
  POSENC_CHECK(slopes.dim() == 1, op, ": slopes must be 1-D [heads], got shape ", sizes_of(slopes));
  POSENC_CHECK(is_float_dtype(dtype_of(slopes)), op, ": slopes must be float32, float16, bfloat16 or float64, got ",
              dtype_of(slopes));
  check_has_data(op, slopes, "slopes");
  const ScalarType out_dtype = a.dtype.value_or(dtype_of(slopes));
  POSENC_CHECK(is_float_dtype(out_dtype), op, ": dtype must be float32, float16, bfloat16 or float64, got ", out_dtype);
  check_lengths(op, query_length, key_length, query_offset);
  check_output_size(op, "[1, heads, query_length, key_length]", {1, slopes.size(0), query_length, key_length},
                    out_dtype);
  Tensor out = empty({1, slopes.size(0), query_length, key_length}, out_dtype, slopes);
  if (out.numel() == 0) return out;
  // The kernel reads float64 slopes: CPU slopes converted here (a few heads; torch's `to`, a
  // dispatcher call, was a fifth of a decode-size bias), a device's by torch.
  std::vector<double> host_slopes;
  Tensor slopes64;
  if (slopes.device().is_cpu()) {
    host_slopes.resize(slopes.size(0));
    dispatch_float_types(dtype_of(slopes), op, [&](auto zero) {
      using T = decltype(zero);
      const T* data = static_cast<const T*>(slopes.data_ptr());
      for (int64_t h = 0; h < slopes.size(0); ++h) host_slopes[h] = static_cast<double>(data[h * slopes.stride(0)]);
    });
  } else {
    slopes64 = as_contiguous(to_dtype(slopes, ScalarType::Double));  // [heads]: a no-op for float64 input
  }
  RelativeBiasProblem p;
  p.kind = BiasKind::Alibi;
  p.heads = slopes.size(0);
  p.query_length = query_length;
  p.key_length = key_length;
  p.query_offset = query_offset;
  p.slopes = host_slopes.empty() ? static_cast<const double*>(slopes64.data_ptr()) : host_slopes.data();
  p.out = out.data_ptr();
  backend.relative_bias(p, out_dtype);
  return out;
}

Tensor alibi_bias_backward_op(const AlibiBackwardArgs& a, const Backend& backend) {
  constexpr const char* op = "posenc.alibi_bias_backward";
  const Tensor& grad = a.grad;
  RelativeBiasGradProblem p = grad_problem(op, grad, a.query_offset);
  p.kind = BiasKind::Alibi;
  // The float64 sums (core/relative_bias.h, bias_grad_item): autograd rounds them once to the slopes' dtype.
  Tensor out = empty({p.heads}, ScalarType::Double, grad);
  return run_grad(p, grad, out, backend);
}

}  // namespace posenc
