// Host side of the relative-position-bias ops (T5 buckets and bias, ALiBi): validation, outputs,
// and the problem structs of csrc/core/relative_bias.h that a backend's runners execute
// (bias_plan.cpp). Shared by the CPU and CUDA backends like host/plan.h.
#pragma once
#include <ATen/ATen.h>

#include "host/plan.h"

namespace posenc {

// relative_position [any shape] int32/int64 -> bucket int64 (transformers' _relative_position_bucket).
at::Tensor t5_relative_position_bucket_op(const at::Tensor& relative_position, bool bidirectional,
                                          int64_t num_buckets, int64_t max_distance, const Backend& backend);

// weight [num_buckets, heads] -> bias [1, heads, Lq, Lk] in weight's dtype.
at::Tensor relative_position_bias_op(const at::Tensor& weight, int64_t query_length, int64_t key_length,
                                     bool bidirectional, int64_t num_buckets, int64_t max_distance,
                                     int64_t query_offset, const Backend& backend);

// grad [1, heads, Lq, Lk] -> grad_weight [num_buckets, heads] in grad's dtype.
at::Tensor relative_position_bias_backward_op(const at::Tensor& grad, bool bidirectional, int64_t num_buckets,
                                              int64_t max_distance, int64_t query_offset, const Backend& backend);

// slopes [heads] -> bias [1, heads, Lq, Lk], bias[0, h, i, j] = slopes[h] * (j - i - query_offset),
// in dtype (default: slopes' dtype).
at::Tensor alibi_bias_op(const at::Tensor& slopes, int64_t query_length, int64_t key_length, int64_t query_offset,
                         std::optional<at::ScalarType> dtype, const Backend& backend);

// grad [1, heads, Lq, Lk] -> grad_slopes [heads] in grad's dtype.
at::Tensor alibi_bias_backward_op(const at::Tensor& grad, int64_t query_offset, const Backend& backend);

}  // namespace posenc
