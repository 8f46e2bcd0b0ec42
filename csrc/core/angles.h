// Accurate cos/sin of `position * frequency`: one formula for the CPU and the GPU. The results are
// not promised bit for bit across the two: nvcc contracts a*b+c into FMA by default and the host
// compiler need not, so they agree within the error bound below (each side is within it of the
// exact value); docs/architecture.md states what is bit-identical.
//
// Why not sinf(float(p) * w): at position 2^20 a float32 product is off by up to 6e-2 rad. Instead
// the angle is formed in float64, reduced to [-pi/4, pi/4] in float64 (Cody-Waite, two-part pi/2),
// and only then evaluated in float32 with minimax polynomials (about 1 ulp). The code has no
// branches and no table, so loops over frequencies auto-vectorize on the CPU and it runs as-is on
// the GPU (no fast intrinsics). cos/sin error <= ~2e-7 absolute for angles below 2^24.
#pragma once
#include <cmath>
#include "core/common.h"

namespace posenc {

// pi/2 = kPio2Hi + kPio2Lo; kPio2Hi has 33 significant bits, so k * kPio2Hi is exact for k < 2^20
// and rounds by at most ~1e-9 rad below 2^24 rad.
constexpr double kTwoOverPi = 6.36619772367581382433e-01;
constexpr double kPio2Hi = 1.57079632673412561417e+00;
constexpr double kPio2Lo = 6.07710050650619224932e-11;

// Round to the nearest integer (ties to even) for |x| < 2^51 with two additions: unlike nearbyint
// it needs no SSE4.1, so the loops that call it vectorize on baseline x86-64 too.
POSENC_HD double round_to_int(double x) {
  constexpr double kMagic = 6755399441055744.0;  // 1.5 * 2^52
  return (x + kMagic) - kMagic;
}

// sin and cos of x for |x| <= pi/4 (Cephes sinf/cosf coefficients).
POSENC_HD void sincos_kernel_f32(float x, float& s, float& c) {
  const float z = x * x;
  s = x + x * z * (-1.6666654611e-1f + z * (8.3321608736e-3f + z * -1.9515295891e-4f));
  c = 1.0f - 0.5f * z + z * z * (4.166664568298827e-2f + z * (-1.388731625493765e-3f + z * 2.443315711809948e-5f));
}

// sin/cos of a float64 angle: float32 result for M = float, float64 for M = double.
template <typename M>
POSENC_HD void sincos_of(double angle, M& s, M& c) {
  if constexpr (std::is_same_v<M, double>) {
#if defined(__CUDA_ARCH__)
    ::sincos(angle, &s, &c);
#else
    s = std::sin(angle);
    c = std::cos(angle);
#endif
  } else {
    const double k = round_to_int(angle * kTwoOverPi);
    const double r = (angle - k * kPio2Hi) - k * kPio2Lo;
    // Quadrant k mod 4 in double: exact for any k (k/4 is a multiple of 0.25, so rounding
    // k/4 - 0.375 to the nearest integer is its floor).
    const int quadrant = static_cast<int>(k - 4.0 * round_to_int(k * 0.25 - 0.375));
    float rs, rc;
    sincos_kernel_f32(static_cast<float>(r), rs, rc);
    const bool swap = quadrant & 1;
    const float sin_v = swap ? rc : rs;
    const float cos_v = swap ? rs : rc;
    s = (quadrant & 2) ? -sin_v : sin_v;
    c = ((quadrant + 1) & 2) ? -cos_v : cos_v;
  }
}

}  // namespace posenc

namespace posenc {

// sin/cos (times `amplitude`) of position * freq[i] for i in [0, n): one row of angles. A plain loop
// with no branches, so the compiler vectorizes it on the CPU.
template <typename M>
POSENC_HD void sincos_row(double position, const double* __restrict__ freq, int64_t n, M amplitude,
                          M* __restrict__ sin_out, M* __restrict__ cos_out) {
  for (int64_t i = 0; i < n; ++i) {
    M s, c;
    sincos_of<M>(position * freq[i], s, c);
    sin_out[i] = s * amplitude;
    cos_out[i] = c * amplitude;
  }
}

}  // namespace posenc

namespace posenc {

// One pair's (sin, cos) advanced from angle t to t + step: the angle-addition formulas (a rotation
// by step), in the math type: the rows past the CPU stream's anchors (rotate_sincos_row).
template <typename F>
POSENC_HD void advance_sincos(F& s, F& c, F step_sin, F step_cos) {
  const F s2 = s * step_cos + c * step_sin;
  const F c2 = c * step_cos - s * step_sin;
  s = s2;
  c = c2;
}

// A row at angles t_i + step_i from the row at t_i, in the math type: the rows past the stream's
// anchors (cpu/sincos_stream.h), from the anchor's row (amplitude included) and the step's sin/cos
// (sincos_row of the step). Each value is within a few ulp of M of the two rows' errors.
template <typename M>
POSENC_HD void rotate_sincos_row(const M* __restrict__ sin_in, const M* __restrict__ cos_in,
                                 const M* __restrict__ step_sin, const M* __restrict__ step_cos, int64_t n,
                                 M* __restrict__ sin_out, M* __restrict__ cos_out) {
  for (int64_t i = 0; i < n; ++i) {
    M s = sin_in[i], c = cos_in[i];
    advance_sincos(s, c, step_sin[i], step_cos[i]);
    sin_out[i] = s;
    cos_out[i] = c;
  }
}

}  // namespace posenc
