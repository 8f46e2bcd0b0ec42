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
  // The largest |w_i * angle_scale| (w_i is monotonic in i: at i = 0 or half - 1), and the largest
  // |position| that keeps every angle within 2^50 rad (kMaxAngle / it): set with the above, on the host.
  double largest_frequency = 0;
  double angle_position_limit = 0;

  // w_i * angle_scale, in float64.
  POSENC_HD double frequency(int64_t i) const {
    return ::exp(-log_base * static_cast<double>(i) / freq_denom) * angle_scale;
  }
  // Pair i's columns (core/common.h, pair_first): sin in the first, cos in the second, or the reverse.
  POSENC_HD int64_t sin_col(int64_t i) const {
    return cos_first ? pair_second(interleaved, i, half) : pair_first(interleaved, i);
  }
  POSENC_HD int64_t cos_col(int64_t i) const {
    return cos_first ? pair_first(interleaved, i) : pair_second(interleaved, i, half);
  }
};

}  // namespace posenc

namespace posenc {

// out[b, s, :] = x[b, s, :] * x_scale + PE[position(b, s)]   (x == nullptr: the table alone)
struct SinusoidalProblem {
  SinusoidalParams params;
  int64_t batch = 1, seq = 0;
  const void* positions = nullptr;  // none: 0 .. seq-1 in every batch row
  IndexKind positions_kind = IndexKind::Int64;
  int64_t pos_stride_b = 0, pos_stride_s = 0;
  int64_t offset = 0;  // added to every position (|offset| <= 2^48: the sum is exact in float64)
  const void* x = nullptr;
  int64_t x_stride_b = 0, x_stride_s = 0, x_stride_d = 1;
  double x_scale = 1.0;
  void* out = nullptr;
  int64_t out_stride_b = 0, out_stride_s = 0;  // out's last dim is contiguous

  POSENC_HD double position(int64_t b, int64_t s) const {
    const double given = positions ? load_as_double(positions, positions_kind, b * pos_stride_b + s * pos_stride_s)
                                   : static_cast<double>(s);
    return given + static_cast<double>(offset);
  }
};

}  // namespace posenc

namespace posenc {

// One GPU work item of the sinusoidal ops: w = (row block, i), kRowsPerItem rows of one column pair:
// i < half writes that sin/cos pair (plus x * x_scale) in each row, i == half the last column of an
// odd dim. Consecutive items are consecutive pairs of the same rows, so a warp's stores are
// contiguous; the pair's frequency (a float64 exp) and the index divisions are paid once per block of
// rows rather than per element, which left the kernel bound by float64 and int64 arithmetic.
// Host/device so the CPU tests run it.
constexpr int64_t kSinusoidalRowsPerItem = 8;

template <typename T>
POSENC_HD void sinusoidal_work_item(const SinusoidalProblem& p, int64_t w) {
  using M = math_t<T>;
  const SinusoidalParams& prm = p.params;
  const int64_t per_row = prm.half + (prm.dim & 1);
  const int64_t first = (w / per_row) * kSinusoidalRowsPerItem, i = w % per_row;
  const int64_t rows = p.batch * p.seq;
  const int64_t last = first + kSinusoidalRowsPerItem < rows ? first + kSinusoidalRowsPerItem : rows;
  const M x_scale = static_cast<M>(p.x_scale);
  const bool odd_col = i == prm.half;
  const double freq = odd_col ? 0.0 : prm.frequency(i);
  const int64_t sc = odd_col ? prm.dim - 1 : prm.sin_col(i), cc = odd_col ? prm.dim - 1 : prm.cos_col(i);
  // The positions' checks (on the GPU; core/common.h): each row by its first pair's item alone (one
  // row's pairs share its position, and the host turned the angle domain into a position bound), and
  // gathered for one assertion after the loop: an assertion between the rows would hold each row's
  // position load back until the previous row was written (a failed assertion loses the CUDA
  // context, so what the rows before it wrote is moot).
  const bool checks_rows = i == 0;
  bool positions_ok = true, angles_ok = true;
  int64_t b = first / p.seq, s = first % p.seq;
  for (int64_t row = first; row < last; ++row) {
    T* out = static_cast<T*>(p.out) + b * p.out_stride_b + s * p.out_stride_s;
    const T* x = p.x ? static_cast<const T*>(p.x) + b * p.x_stride_b + s * p.x_stride_s : nullptr;
    const auto x_at = [&](int64_t col) { return x ? to_math<M>(x[col * p.x_stride_d]) * x_scale : M(0); };
    if (odd_col) {
      out[sc] = from_math<T>(x_at(sc));
    } else {
      const double position = p.position(b, s);
      if (checks_rows) {
        positions_ok &= within(position, static_cast<double>(kMaxPosition));
        angles_ok &= within(position, prm.angle_position_limit);
      }
      M sn, cs;
      sincos_of<M>(position * freq, sn, cs);
      out[sc] = from_math<T>(x_at(sc) + sn);
      out[cc] = from_math<T>(x_at(cc) + cs);
    }
    if (++s == p.seq) s = 0, ++b;
  }
  POSENC_DEVICE_REQUIRE(positions_ok, "posenc: positions must be finite and lie in [-2^48, 2^48]");
  POSENC_DEVICE_REQUIRE(angles_ok, "posenc: position * frequency must stay within 2^50 rad");
}

POSENC_HD int64_t sinusoidal_work_items(const SinusoidalProblem& p) {
  const int64_t row_blocks = (p.batch * p.seq + kSinusoidalRowsPerItem - 1) / kSinusoidalRowsPerItem;
  return row_blocks * (p.params.half + (p.params.dim & 1));
}

}  // namespace posenc
