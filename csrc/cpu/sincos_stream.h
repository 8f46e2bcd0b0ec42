// sin/cos rows for a stream of positions, as the CPU loops visit tokens or rows in order.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/angles.h"

namespace posenc::cpu {

// sin/cos(position * freq[i]) * amplitude for i < n, in the math type M, for row r of a problem
// (a token or an encoding row) at position_of(r). Row r is computed directly with sincos_row when r
// is a multiple of kDirectEvery or its position is neither row r-1's nor row r-1's plus one; one
// past row r-1 it is advanced from it by a rotation in float64; at row r-1's position (a decode
// batch, every row at one position) it repeats it. Which rows are direct thus depends only on the
// row index and the positions, never on where a parallel chunk begins: a chunk's first row replays
// from the last direct row at or before it, so any thread count gives the same bits.
template <typename M>
class SinCosStream {
 public:
  static constexpr int kDirectEvery = 64;

  SinCosStream(const double* freq, int64_t n, M amplitude)
      : freq_(freq), n_(n), amplitude_(amplitude), sin_(n), cos_(n), sin_state_(n), cos_state_(n) {}

  // Fills sin() and cos() for row `row` (position_of(row) gives a row's position as a double). A
  // consumer that can read float64 rows passes math_rows = false: a row that was not computed
  // directly then stays in state_sin()/state_cos() (from_state() is true), which saves a pass.
  template <typename PositionOf>
  void at(int64_t row, const PositionOf& position_of, bool math_rows = true) {
    const double position = position_of(row);
    if (row != next_row_) {  // a chunk's first row: replay from the last direct row at or before it
      int64_t r = row;
      double p = position;
      while (r % kDirectEvery != 0) {
        const double before = position_of(r - 1);
        if (p != before + 1.0 && p != before) break;
        --r;
        p = before;
      }
      for (int64_t t = r; t < row; ++t) step(t, position_of(t), false);
    }
    step(row, position, math_rows);
  }

  bool from_state() const { return from_state_; }
  // The float64 rows (without the amplitude): valid after at(row, position_of, false) when from_state().
  const double* state_sin() const { return sin_state_.data(); }
  const double* state_cos() const { return cos_state_.data(); }
  const M* sin() const { return sin_.data(); }
  const M* cos() const { return cos_.data(); }

 private:
  // One row after the previous one (row - 1, at previous_), by the rule above.
  void step(int64_t row, double position, bool math_rows) {
    const bool follows = row == next_row_ && row % kDirectEvery != 0;
    if (follows && position == previous_ + 1.0) {
      advance(math_rows);
      from_state_ = !math_rows;
    } else if (follows && position == previous_) {  // the same angles again
      if (math_rows) {
        for (int64_t i = 0; i < n_; ++i) {  // what advance writes: the state in M, times the amplitude
          sin_[i] = static_cast<M>(sin_state_[i]) * amplitude_;
          cos_[i] = static_cast<M>(cos_state_[i]) * amplitude_;
        }
      }
      from_state_ = !math_rows;
    } else {
      direct(position);
      from_state_ = false;
    }
    previous_ = position;
    next_row_ = row + 1;
  }

  void direct(double position) {
    sincos_row<M>(position, freq_, n_, M(1), sin_.data(), cos_.data());
    for (int64_t i = 0; i < n_; ++i) {
      sin_state_[i] = sin_[i];
      cos_state_[i] = cos_[i];
      sin_[i] *= amplitude_;
      cos_[i] *= amplitude_;
    }
  }

  void advance(bool math_rows) {
    // The steps' sin/cos (two libm calls per frequency, about 2 us for 64 pairs) only once a row
    // is advanced: a decode step (one token, or every row at one position) never needs them.
    if (step_sin_.empty()) {
      step_sin_.resize(n_);
      step_cos_.resize(n_);
      for (int64_t i = 0; i < n_; ++i) {
        step_sin_[i] = std::sin(freq_[i]);
        step_cos_[i] = std::cos(freq_[i]);
      }
    }
    if (math_rows) {
      advance_sincos_row<true>(sin_state_.data(), cos_state_.data(), step_sin_.data(), step_cos_.data(), n_,
                               amplitude_, sin_.data(), cos_.data());
    } else {
      advance_sincos_row<false>(sin_state_.data(), cos_state_.data(), step_sin_.data(), step_cos_.data(), n_,
                                amplitude_, sin_.data(), cos_.data());
    }
  }

  const double* freq_;
  int64_t n_;
  M amplitude_;
  std::vector<M> sin_, cos_;
  std::vector<double> sin_state_, cos_state_, step_sin_, step_cos_;
  double previous_ = 0;
  int64_t next_row_ = -1;
  bool from_state_ = false;
};

}  // namespace posenc::cpu
