// sin/cos rows for a stream of positions, as the CPU loops visit tokens or rows in order.
#pragma once
#include <cmath>
#include <vector>

#include "core/angles.h"

namespace posenc::cpu {

// sin/cos(position * freq[i]) * amplitude for i < n, in the math type M. A position one past the
// previous one (the usual arange) is advanced from it by a rotation in float64; every
// kDirectEvery-th row, and any other position, is computed directly with sincos_row.
template <typename M>
class SinCosStream {
 public:
  static constexpr int kDirectEvery = 64;

  SinCosStream(const double* freq, int64_t n, M amplitude)
      : freq_(freq), n_(n), amplitude_(amplitude), sin_(n), cos_(n), sin_state_(n), cos_state_(n), step_sin_(n),
        step_cos_(n) {
    for (int64_t i = 0; i < n; ++i) {
      step_sin_[i] = std::sin(freq[i]);
      step_cos_[i] = std::cos(freq[i]);
    }
  }

  // Fills sin() and cos() for `position`. A consumer that can read float64 rows passes
  // math_rows = false: an advanced row then stays in state_sin()/state_cos() (from_state() is
  // true), which saves a pass over the row.
  void at(double position, bool math_rows = true) {
    from_state_ = false;
    if (since_direct_ < kDirectEvery && position == previous_ + 1.0) {
      if (math_rows) {
        advance_sincos_row<true>(sin_state_.data(), cos_state_.data(), step_sin_.data(), step_cos_.data(), n_,
                                 amplitude_, sin_.data(), cos_.data());
      } else {
        advance_sincos_row<false>(sin_state_.data(), cos_state_.data(), step_sin_.data(), step_cos_.data(), n_,
                                  amplitude_, sin_.data(), cos_.data());
        from_state_ = true;
      }
      ++since_direct_;
    } else {
      sincos_row<M>(position, freq_, n_, M(1), sin_.data(), cos_.data());
      for (int64_t i = 0; i < n_; ++i) {
        sin_state_[i] = sin_[i];
        cos_state_[i] = cos_[i];
        sin_[i] *= amplitude_;
        cos_[i] *= amplitude_;
      }
      since_direct_ = 0;
    }
    previous_ = position;
  }

  bool from_state() const { return from_state_; }
  // The float64 rows (without the amplitude): valid after at(position, false) when from_state().
  const double* state_sin() const { return sin_state_.data(); }
  const double* state_cos() const { return cos_state_.data(); }
  const M* sin() const { return sin_.data(); }
  const M* cos() const { return cos_.data(); }

 private:
  const double* freq_;
  int64_t n_;
  M amplitude_;
  std::vector<M> sin_, cos_;
  std::vector<double> sin_state_, cos_state_, step_sin_, step_cos_;
  double previous_ = 0;
  int since_direct_ = kDirectEvery;
  bool from_state_ = false;
};

}  // namespace posenc::cpu
