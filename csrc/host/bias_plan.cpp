#include "host/bias_plan.h"

#include <cmath>

namespace posenc {
namespace {

bool is_float_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16 || t == at::kDouble;
}

// Offsets this large would overflow j - i - query_offset; no sequence comes near.
constexpr int64_t kMaxOffset = int64_t{1} << 60;

void check_lengths(const char* op, int64_t query_length, int64_t key_length, int64_t query_offset) {
  TORCH_CHECK(query_length >= 0, op, ": query_length must be >= 0, got ", query_length);
  TORCH_CHECK(key_length >= 0, op, ": key_length must be >= 0, got ", key_length);
  TORCH_CHECK(query_length < kMaxOffset && key_length < kMaxOffset, op, ": query_length and key_length must be < 2^60");
  TORCH_CHECK(query_offset > -kMaxOffset && query_offset < kMaxOffset, op,
              ": query_offset must be in (-2^60, 2^60), got ", query_offset);
}

// T5's bucketing parameters. Each direction needs >= 1 exact bucket (num_buckets >= 2, >= 4 when
// bidirectional) and max_distance past the exact buckets (else the log-spaced formula divides by
// log(max_distance / max_exact) <= 0).
T5Bucketing t5_bucketing(const char* op, bool bidirectional, int64_t num_buckets, int64_t max_distance) {
  TORCH_CHECK(!bidirectional || num_buckets % 2 == 0, op,
              ": num_buckets must be even when bidirectional (half the buckets for each direction), got ", num_buckets);
  const int64_t least = bidirectional ? 4 : 2;
  TORCH_CHECK(num_buckets >= least, op, ": num_buckets must be >= ", least, bidirectional ? " when bidirectional" : "",
              ", got ", num_buckets);
  T5Bucketing t;
  t.bidirectional = bidirectional;
  t.buckets = bidirectional ? num_buckets / 2 : num_buckets;
  t.max_exact = t.buckets / 2;
  TORCH_CHECK(max_distance > t.max_exact, op, ": max_distance must be > ", t.max_exact,
              " (the exact distances: num_buckets / ", bidirectional ? 4 : 2, "), got ", max_distance);
  t.max_distance = max_distance;
  t.log_ratio = std::log(static_cast<double>(max_distance) / static_cast<double>(t.max_exact));
  return t;
}

// grad [1, heads, Lq, Lk] of a bias: fills the shared part of the backward problem.
RelativeBiasGradProblem grad_problem(const char* op, const at::Tensor& grad, int64_t query_offset) {
  TORCH_CHECK(grad.dim() == 4 && grad.size(0) == 1, op,
              ": grad must be [1, heads, query_length, key_length], got shape ", grad.sizes());
  TORCH_CHECK(is_float_dtype(grad.scalar_type()), op, ": grad must be float32, float16, bfloat16 or float64, got ",
              grad.scalar_type());
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

at::Tensor t5_relative_position_bucket_op(const at::Tensor& relative_position, bool bidirectional,
                                          int64_t num_buckets, int64_t max_distance, const Backend& backend) {
  constexpr const char* op = "posenc.t5_relative_position_bucket";
  const auto t = relative_position.scalar_type();
  TORCH_CHECK(t == at::kInt || t == at::kLong, op, ": relative_position must be int32 or int64, got ", t);
  BucketProblem p;
  p.t5 = t5_bucketing(op, bidirectional, num_buckets, max_distance);
  const at::Tensor in = relative_position.contiguous();
  at::Tensor out = at::empty(relative_position.sizes(), relative_position.options().dtype(at::kLong));
  if (out.numel() == 0) return out;
  p.numel = in.numel();
  p.in = in.data_ptr();
  p.in_kind = t == at::kInt ? IndexKind::Int32 : IndexKind::Int64;
  p.out = out.data_ptr<int64_t>();
  backend.bucket(p);
  return out;
}

at::Tensor relative_position_bias_op(const at::Tensor& weight, int64_t query_length, int64_t key_length,
                                     bool bidirectional, int64_t num_buckets, int64_t max_distance,
                                     int64_t query_offset, const Backend& backend) {
  constexpr const char* op = "posenc.relative_position_bias";
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) == num_buckets, op, ": weight must be [num_buckets = ", num_buckets,
              ", heads] (T5's relative_attention_bias.weight), got shape ", weight.sizes());
  TORCH_CHECK(is_float_dtype(weight.scalar_type()), op, ": weight must be float32, float16, bfloat16 or float64, got ",
              weight.scalar_type());
  check_lengths(op, query_length, key_length, query_offset);
  RelativeBiasProblem p;
  p.kind = BiasKind::T5;
  p.t5 = t5_bucketing(op, bidirectional, num_buckets, max_distance);
  at::Tensor out = at::empty({1, weight.size(1), query_length, key_length}, weight.options());
  if (out.numel() == 0) return out;
  p.heads = weight.size(1);
  p.query_length = query_length;
  p.key_length = key_length;
  p.query_offset = query_offset;
  p.weight = weight.data_ptr();
  p.weight_stride_b = weight.stride(0);
  p.weight_stride_h = weight.stride(1);
  p.out = out.data_ptr();
  backend.relative_bias(p, weight.scalar_type());
  return out;
}

namespace {

// Both backwards: sum the gradient along each diagonal (float64 scratch), then per bucket or slope.
at::Tensor run_grad(RelativeBiasGradProblem& p, const at::Tensor& grad, at::Tensor& out, const Backend& backend) {
  if (out.numel() == 0) return out;
  if (p.query_length == 0 || p.key_length == 0) return out.zero_();
  at::Tensor diagonal = at::empty({p.heads, p.diagonals()}, grad.options().dtype(at::kDouble));
  p.diagonal = diagonal.data_ptr<double>();
  p.out = out.data_ptr();
  backend.relative_bias_grad(p, grad.scalar_type());
  return out;
}

}  // namespace

at::Tensor relative_position_bias_backward_op(const at::Tensor& grad, bool bidirectional, int64_t num_buckets,
                                              int64_t max_distance, int64_t query_offset, const Backend& backend) {
  constexpr const char* op = "posenc.relative_position_bias_backward";
  RelativeBiasGradProblem p = grad_problem(op, grad, query_offset);
  p.kind = BiasKind::T5;
  p.t5 = t5_bucketing(op, bidirectional, num_buckets, max_distance);
  p.num_buckets = num_buckets;
  at::Tensor out = at::empty({num_buckets, p.heads}, grad.options());
  return run_grad(p, grad, out, backend);
}

at::Tensor alibi_bias_op(const at::Tensor& slopes, int64_t query_length, int64_t key_length, int64_t query_offset,
                         std::optional<at::ScalarType> dtype, const Backend& backend) {
  constexpr const char* op = "posenc.alibi_bias";
  TORCH_CHECK(slopes.dim() == 1, op, ": slopes must be 1-D [heads], got shape ", slopes.sizes());
  TORCH_CHECK(is_float_dtype(slopes.scalar_type()), op, ": slopes must be float32, float16, bfloat16 or float64, got ",
              slopes.scalar_type());
  const at::ScalarType out_dtype = dtype.value_or(slopes.scalar_type());
  TORCH_CHECK(is_float_dtype(out_dtype), op, ": dtype must be float32, float16, bfloat16 or float64, got ", out_dtype);
  check_lengths(op, query_length, key_length, query_offset);
  at::Tensor out = at::empty({1, slopes.size(0), query_length, key_length}, slopes.options().dtype(out_dtype));
  if (out.numel() == 0) return out;
  const at::Tensor slopes64 = slopes.to(at::kDouble).contiguous();  // [heads]: a no-op for float64 input
  RelativeBiasProblem p;
  p.kind = BiasKind::Alibi;
  p.heads = slopes.size(0);
  p.query_length = query_length;
  p.key_length = key_length;
  p.query_offset = query_offset;
  p.slopes = slopes64.data_ptr<double>();
  p.out = out.data_ptr();
  backend.relative_bias(p, out_dtype);
  return out;
}

at::Tensor alibi_bias_backward_op(const at::Tensor& grad, int64_t query_offset, const Backend& backend) {
  constexpr const char* op = "posenc.alibi_bias_backward";
  RelativeBiasGradProblem p = grad_problem(op, grad, query_offset);
  p.kind = BiasKind::Alibi;
  at::Tensor out = at::empty({p.heads}, grad.options());
  return run_grad(p, grad, out, backend);
}

}  // namespace posenc
