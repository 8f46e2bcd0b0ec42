// Sinusoidal position encodings: frequencies and column layout, shared by CPU and CUDA.
//   PE[p, sin_col(i)] = sin(p * w_i * angle_scale),  PE[p, cos_col(i)] = cos(...)
//   w_i = base^(-i / (half - freq_shift)),  i = 0 .. half-1,  half = dim / 2
// Layouts: interleaved (sin, cos per pair; the paper's), or concatenated [sin | cos];
// cos_first swaps the two. An odd dim leaves its last column zero.
#pragma once
#include "core/angles.h"

namespace posenc {

struct SinusoidalParams {
  int64_t dim = 0;        // output columns
  int64_t half = 0;       // pairs = dim / 2
  double log_base = 0;    // ln(base)
  double freq_denom = 1;  // half - freq_shift (> 0)
  double angle_scale = 1;
  bool interleaved = true;
  bool cos_first = false;

  // w_i * angle_scale, in float64.
  POSENC_HD double frequency(int64_t i) const {
    return ::exp(-log_base * static_cast<double>(i) / freq_denom) * angle_scale;
  }
  POSENC_HD int64_t sin_col(int64_t i) const {
    return interleaved ? 2 * i + (cos_first ? 1 : 0) : i + (cos_first ? half : 0);
  }
  POSENC_HD int64_t cos_col(int64_t i) const {
    return interleaved ? 2 * i + (cos_first ? 0 : 1) : i + (cos_first ? 0 : half);
  }
};

}  // namespace posenc

namespace posenc {

// out[b, s, :] = x[b, s, :] * x_scale + PE[position(b, s)]   (x == nullptr: the table alone)
struct SinusoidalProblem {
  SinusoidalParams params;
  int64_t batch = 1, seq = 0;
  const void* positions = nullptr;
  IndexKind positions_kind = IndexKind::Int64;
  int64_t pos_stride_b = 0, pos_stride_s = 0;
  double position_offset = 0;
  const void* x = nullptr;
  int64_t x_stride_b = 0, x_stride_s = 0, x_stride_d = 1;
  double x_scale = 1.0;
  void* out = nullptr;
  int64_t out_stride_b = 0, out_stride_s = 0;  // out's last dim is contiguous

  POSENC_HD double position(int64_t b, int64_t s) const {
    return load_as_double(positions, positions_kind, b * pos_stride_b + s * pos_stride_s) + position_offset;
  }
};

}  // namespace posenc
