// Host side of every op, shared by the CPU and CUDA backends: validate the arguments (before any
// memory is touched, with messages that name the argument), allocate outputs, and describe the work
// as a plain problem struct (csrc/core) that a backend's runner executes.
#pragma once
#include <ATen/ATen.h>
#include <string_view>
#include "core/relative_bias.h"
#include "core/rope.h"
#include "core/sinusoidal.h"

namespace posenc {

using SinusoidalRunner = void (*)(const SinusoidalProblem&, at::ScalarType);
using RopeRunner = void (*)(const RopeProblem&, at::ScalarType);
using BucketRunner = void (*)(const BucketProblem&);
using RelativeBiasRunner = void (*)(const RelativeBiasProblem&, at::ScalarType);
using RelativeBiasGradRunner = void (*)(const RelativeBiasGradProblem&, at::ScalarType);

// What a device backend (csrc/cpu, csrc/cuda) supplies: its two runners, and whether argument values
// living on the device (cu_seqlens, gathered positions) may be read now to validate them. Reading
// them is a device-to-host copy, which a CUDA graph being captured does not allow: the checks are
// then skipped (the kernels stay in bounds whatever the values; see check_positions).
struct Backend {
  SinusoidalRunner sinusoidal;
  RopeRunner rope;
  bool (*may_read_device_values)();
  // Relative position biases (host/bias_plan.h): T5 buckets, the T5/ALiBi bias and its backward.
  BucketRunner bucket = nullptr;
  RelativeBiasRunner relative_bias = nullptr;
  RelativeBiasGradRunner relative_bias_grad = nullptr;
};

at::Tensor sinusoidal_table_op(const at::Tensor& positions, int64_t dim, double base, bool interleaved,
                               double freq_shift, double angle_scale, bool cos_first, at::ScalarType dtype,
                               const Backend& backend);

at::Tensor add_sinusoidal_op(const at::Tensor& x, const at::Tensor& positions, double x_scale, double base,
                             bool interleaved, double freq_shift, double angle_scale, bool cos_first,
                             const Backend& backend);

// Rotation from frequencies. Out of place returns (q_out, k_out); in place rewrites q and k.
std::tuple<at::Tensor, at::Tensor> rope_op(const at::Tensor& q, const at::Tensor& k,
                                           const std::optional<at::Tensor>& positions,
                                           const std::optional<at::Tensor>& cu_seqlens, const at::Tensor& inv_freq,
                                           double attention_factor, bool interleaved, std::string_view layout,
                                           int64_t offset, bool inverse, const Backend& backend);
void rope_inplace_op(const at::Tensor& q, const at::Tensor& k, const std::optional<at::Tensor>& positions,
                     const std::optional<at::Tensor>& cu_seqlens, const at::Tensor& inv_freq,
                     double attention_factor, bool interleaved, std::string_view layout, int64_t offset,
                     bool inverse, const Backend& backend);

// Rotation from a given cos/sin table (transformers' apply_rotary_pos_emb convention, half-split).
std::tuple<at::Tensor, at::Tensor> rope_cos_sin_op(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                                   const at::Tensor& sin, const std::optional<at::Tensor>& positions,
                                                   std::string_view layout, bool inverse, const Backend& backend);
void rope_cos_sin_inplace_op(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                             const std::optional<at::Tensor>& positions, std::string_view layout, bool inverse,
                             const Backend& backend);

}  // namespace posenc
