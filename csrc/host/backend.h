// What a backend (csrc/cpu, csrc/cuda) shares: dtype dispatch and the registration of every op's
// kernel. A backend supplies only its Backend (runners) and its device guard; the argument handling
// is host/plan.cpp's, the same for every device.
#pragma once
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include "host/bias_plan.h"
#include "host/plan.h"

namespace posenc {

// The runners each backend defines in its own namespace (csrc/cpu/kernels.h, csrc/cuda/kernels.h)
// and lists in its Backend (host/plan.h): one list, so a new op's runner is declared once.
#define POSENC_DECLARE_RUNNERS                                                            \
  void run_sinusoidal(const SinusoidalProblem& p, at::ScalarType dtype);                  \
  void run_rope(const RopeProblem& p, at::ScalarType dtype);                              \
  void run_bucket(const BucketProblem& p);                                                \
  void run_relative_bias(const RelativeBiasProblem& p, at::ScalarType dtype);             \
  void run_relative_bias_grad(const RelativeBiasGradProblem& p, at::ScalarType dtype);

// Calls f(T{}) with T the element type of dtype t.
template <typename F>
void dispatch_float_types(at::ScalarType t, const char* op, F&& f) {
  switch (t) {
    case at::kFloat: f(float{}); break;
    case at::kDouble: f(double{}); break;
    case at::kHalf: f(c10::Half{}); break;
    case at::kBFloat16: f(c10::BFloat16{}); break;
    default: TORCH_CHECK(false, op, ": unsupported dtype ", t);
  }
}

struct NoDeviceGuard {
  explicit NoDeviceGuard(const at::Device&) {}
};

// m.impl of every op for one dispatch key: validate (plan.cpp), then run on this backend.
template <const Backend& kBackend, typename Guard>
void register_kernels(torch::Library& m) {
  using OptTensor = std::optional<at::Tensor>;
  m.impl("sinusoidal_table", [](const at::Tensor& positions, int64_t dim, double base, bool interleaved,
                                double freq_shift, double angle_scale, bool cos_first, at::ScalarType dtype) {
    const Guard guard(positions.device());
    return sinusoidal_table_op(positions, dim, base, interleaved, freq_shift, angle_scale, cos_first, dtype,
                               kBackend);
  });
  m.impl("add_sinusoidal", [](const at::Tensor& x, const at::Tensor& positions, double x_scale, double base,
                              bool interleaved, double freq_shift, double angle_scale, bool cos_first) {
    const Guard guard(x.device());
    return add_sinusoidal_op(x, positions, x_scale, base, interleaved, freq_shift, angle_scale, cos_first,
                             kBackend);
  });
  m.impl("rope", [](const at::Tensor& q, const at::Tensor& k, const OptTensor& positions, const OptTensor& cu_seqlens,
                    const at::Tensor& inv_freq, double attention_factor, bool interleaved, c10::string_view layout,
                    int64_t offset, bool inverse) {
    const Guard guard(q.device());
    return rope_op(q, k, positions, cu_seqlens, inv_freq, attention_factor, interleaved, layout, offset, inverse,
                   kBackend);
  });
  m.impl("rope_", [](const at::Tensor& q, const at::Tensor& k, const OptTensor& positions, const OptTensor& cu_seqlens,
                     const at::Tensor& inv_freq, double attention_factor, bool interleaved, c10::string_view layout,
                     int64_t offset, bool inverse) {
    const Guard guard(q.device());
    rope_inplace_op(q, k, positions, cu_seqlens, inv_freq, attention_factor, interleaved, layout, offset, inverse,
                    kBackend);
  });
  m.impl("rope_cos_sin", [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                            const OptTensor& positions, c10::string_view layout, bool inverse) {
    const Guard guard(q.device());
    return rope_cos_sin_op(q, k, cos, sin, positions, layout, inverse, kBackend);
  });
  m.impl("rope_cos_sin_", [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                             const OptTensor& positions, c10::string_view layout, bool inverse) {
    const Guard guard(q.device());
    rope_cos_sin_inplace_op(q, k, cos, sin, positions, layout, inverse, kBackend);
  });
  // Relative position biases (host/bias_plan.h).
  m.impl("t5_relative_position_bucket", [](const at::Tensor& relative_position, bool bidirectional, int64_t num_buckets,
                                           int64_t max_distance) {
    const Guard guard(relative_position.device());
    return t5_relative_position_bucket_op(relative_position, bidirectional, num_buckets, max_distance, kBackend);
  });
  m.impl("relative_position_bias", [](const at::Tensor& weight, int64_t query_length, int64_t key_length,
                                      bool bidirectional, int64_t num_buckets, int64_t max_distance,
                                      int64_t query_offset) {
    const Guard guard(weight.device());
    return relative_position_bias_op(weight, query_length, key_length, bidirectional, num_buckets, max_distance,
                                     query_offset, kBackend);
  });
  m.impl("relative_position_bias_backward", [](const at::Tensor& grad, bool bidirectional, int64_t num_buckets,
                                               int64_t max_distance, int64_t query_offset) {
    const Guard guard(grad.device());
    return relative_position_bias_backward_op(grad, bidirectional, num_buckets, max_distance, query_offset, kBackend);
  });
  m.impl("alibi_bias", [](const at::Tensor& slopes, int64_t query_length, int64_t key_length, int64_t query_offset,
                          std::optional<at::ScalarType> dtype) {
    const Guard guard(slopes.device());
    return alibi_bias_op(slopes, query_length, key_length, query_offset, dtype, kBackend);
  });
  m.impl("alibi_bias_backward", [](const at::Tensor& grad, int64_t query_offset) {
    const Guard guard(grad.device());
    return alibi_bias_backward_op(grad, query_offset, kBackend);
  });
}

}  // namespace posenc
