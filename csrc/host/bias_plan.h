// Host side of the relative-position-bias ops (T5 buckets and bias, ALiBi): validation, outputs,
// and the problem structs of csrc/core/relative_bias.h that a backend's runners execute
// (bias_plan.cpp). Shared by the CPU and CUDA backends like host/plan.h.
#pragma once
#include "host/plan.h"

namespace posenc {

// relative_position [any shape] int32/int64 -> bucket int64 (transformers' _relative_position_bucket).
Tensor t5_relative_position_bucket_op(const T5BucketArgs& a, const Backend& backend);

// weight [num_buckets, heads] -> bias [1, heads, Lq, Lk] in weight's dtype.
Tensor relative_position_bias_op(const RelativeBiasArgs& a, const Backend& backend);

// grad [1, heads, Lq, Lk] -> grad_weight [num_buckets, heads] in grad's dtype.
Tensor relative_position_bias_backward_op(const RelativeBiasBackwardArgs& a, const Backend& backend);

// slopes [heads] -> bias [1, heads, Lq, Lk], bias[0, h, i, j] = slopes[h] * (j - i - query_offset),
// in dtype (default: slopes' dtype).
Tensor alibi_bias_op(const AlibiArgs& a, const Backend& backend);

// grad [1, heads, Lq, Lk] -> grad_slopes [heads] in grad's dtype.
Tensor alibi_bias_backward_op(const AlibiBackwardArgs& a, const Backend& backend);

}  // namespace posenc
