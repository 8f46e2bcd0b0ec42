// sin/cos rows for a stream of positions, as the CPU loops visit tokens or rows in order.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <new>
#include <type_traits>
#include <vector>

#include "core/rope.h"

namespace posenc::cpu {

// Rows on 64-byte boundaries: the row kernels read them with full-width vector loads, and a load
// that straddles two cache lines costs about twice one that does not.
template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{64})); }
  void deallocate(T* ptr, size_t) { ::operator delete(ptr, std::align_val_t{64}); }
  bool operator==(const CacheLineAllocator&) const { return true; }
  bool operator!=(const CacheLineAllocator&) const { return false; }
};
template <typename T>
using RowVector = std::vector<T, CacheLineAllocator<T>>;

// At least n elements of per-thread memory, kept from call to call: one buffer per element type and
// slot. A decode step builds its rows on every call, and their aligned allocations (glibc memalign)
// took ~0.2 us of a ~3.4 us call. Each slot has one user at a time: a thread runs one CPU loop at a
// time, and no loop nests another. The contents are whatever the last user left.
template <typename T, int kSlot>
T* thread_rows(int64_t n) {
  static thread_local RowVector<T> rows;
  if (static_cast<int64_t>(rows.size()) < n) rows = RowVector<T>(n);
  return rows.data();
}
enum RowSlot { kStreamMath, kStreamF64, kStreamSteps, kStreamFineSteps, kFactorRows, kOneAxisFreq };

// sin/cos(position * freq[i]) * amplitude for i < n, in the math type M, for row r of a problem
// (a token or an encoding row) at position_of(r), the local-th row of its sequence (a batch row of
// tokens, a packed sequence of cu_seqlens). Row r is computed directly with sincos_row when local
// is a multiple of kDirectEvery (the sequence's first row included) or its position is neither row
// r-1's nor row r-1's plus one; one past row r-1 it is advanced from it by a rotation in float64;
// at row r-1's position (a decode batch, every row at one position) it repeats it (also at a
// sequence's first row when row r-1 was direct: the same bits). Which rows are direct thus depends
// only on the sequence's own positions and the row's index in it: not on where a parallel chunk
// begins (a chunk's first row replays from the last direct row at or before it), so any thread
// count gives the same bits, nor on the other sequences of the batch, so a sequence gets the same
// bits in any batch (torch.func.vmap folds its dimension into the batch: python/posenc_native/_functorch.py).
//
// Fine rows (a consumer that asks for them with fine_every > 1, one axis): the float64 state then
// moves only at anchor rows, the multiples of fine_every and the direct rows, by one rotation of
// the d positions moved since the previous anchor (d <= fine_every). A row between two anchors, j
// positions past its anchor, is the anchor's row in M rotated by j steps in M (rotate_sincos_row):
// half the float64 work and no conversion per row, within a few ulp of M of the anchor's values
// (docs/architecture.md). The rule is still one of row indices and positions only.
//
// Multi-axis positions (n_axes rows of frequencies, freq[a * n + i]; core/rope.h, axis_angles): a
// row's position is one value per axis, given by position_of(r, a), and its angles are the sum over
// axes. The rule above holds axis by axis: a row whose every axis position is row r-1's or one past
// it is advanced by one rotation per axis that moved (image patches along a row move on one axis),
// or, when every axis moved (MRoPE text tokens), by one rotation by the sum of the axes' steps; any
// other row is direct. Every row is an anchor.
//
// Each row's values (sin and cos times the amplitude, in M) go where the consumer wants them: to
// sin() and cos() by default, or to an output of the consumer's, a type with three row loops:
//   advance(sin_state, cos_state, step_sin, step_cos, n, amplitude): advance the float64 state a
//     step (advance_sincos) and write the row, in one pass where it can;
//   from_state(sin_state, cos_state, n, amplitude): write the row from the state as it stands;
//   rotated(sin, cos, step_sin, step_cos, n): write a row between anchors (rotate_sincos_row).
// The RoPE loop passes its interleaved factor rows (cpu/rope_cpu.cpp), and the sinusoidal loop its
// encoding rows (cpu/sinusoidal_cpu.cpp): each saves a pass over every row (benchmarks/RESULTS.md).
template <typename M>
class SinCosStream {
 public:
  static constexpr int kDirectEvery = 64;
  // Rows from one float64 anchor to the next with fine rows (RoPE, sinusoidal): a divisor of kDirectEvery, so
  // every row direct by its index is an anchor; its steps' table (8 rows of M, 4 KiB for 128-dim
  // heads) stays in L1. 16 and 32 measured no faster (benchmarks/RESULTS.md, "Fourteenth session").
  static constexpr int kFineEvery = 8;
  static_assert(kDirectEvery % kFineEvery == 0);

  // No allocation (a decode step builds one stream per call): the math rows, every float64 row and
  // axis position, and the steps' rows live in this thread's buffers (thread_rows).
  SinCosStream(const double* freq, int64_t n, M amplitude, int64_t n_axes = 1, int64_t fine_every = 1)
      : freq_(freq), n_(n), n_axes_(n_axes), row_(padded(n)), fine_(n_axes == 1 ? fine_every : 1),
        amplitude_(amplitude) {
    sin_ = thread_rows<M, kStreamMath>(4 * row_), cos_ = sin_ + row_;
    fine_sin_ = cos_ + row_, fine_cos_ = fine_sin_ + row_;
    row_sin_ = sin_, row_cos_ = cos_;
    double* f64 = thread_rows<double, kStreamF64>((n_axes > 1 ? 3 : 2) * row_ + 4 * padded(n_axes));
    sin_state_ = f64, cos_state_ = sin_state_ + row_;
    angle_ = n_axes > 1 ? cos_state_ + row_ : nullptr;
    double* axes = f64 + (n_axes > 1 ? 3 : 2) * row_;
    previous_ = axes, current_ = axes + padded(n_axes), replay_ = current_ + padded(n_axes);
    before_ = replay_ + padded(n_axes);
  }
  SinCosStream(const SinCosStream&) = delete;
  SinCosStream& operator=(const SinCosStream&) = delete;

  // Fills sin() and cos() for row `row`, the local-th row of its sequence: position_of(row) gives
  // a row's position as a double, or, with several axes, position_of(row, out) writes its n_axes
  // positions to out.
  template <typename PositionOf>
  void at(int64_t row, int64_t local, const PositionOf& position_of) {
    at(row, local, position_of, MathRows{sin_, cos_, fine_sin_, fine_cos_});
  }

  // The same, with the row written to out (see above) instead: sin() and cos() are then not the row's.
  template <typename PositionOf, typename Out>
  void at(int64_t row, int64_t local, const PositionOf& position_of, const Out& out) {
    positions_of(position_of, row, current_);
    if (row != next_row_) replay_to(row, local, position_of);
    step(row, local, current_, out);
  }

  const M* sin() const { return row_sin_; }
  const M* cos() const { return row_cos_; }

 private:
  // The stream's own outputs (see above): none past the float64 state (the replayed rows, where
  // rows between anchors are skipped, and the axes moved before the last); sin_ and cos_ (the
  // anchor's row), or fine_sin_ and fine_cos_ (a row between anchors), the rows sin() and cos() hand out.
  struct StateOnly {
    void advance(double* ss, double* cs, const double* step_s, const double* step_c, int64_t n, M amplitude) const {
      advance_sincos_row<false>(ss, cs, step_s, step_c, n, amplitude, static_cast<M*>(nullptr), static_cast<M*>(nullptr));
    }
  };
  struct MathRows {
    M* sin;
    M* cos;
    M* fine_sin;
    M* fine_cos;
    void advance(double* ss, double* cs, const double* step_s, const double* step_c, int64_t n, M amplitude) const {
      advance_sincos_row<true>(ss, cs, step_s, step_c, n, amplitude, sin, cos);
    }
    void from_state(const double* ss, const double* cs, int64_t n, M amplitude) const {
      math_rows_from_state(ss, cs, n, amplitude, sin, cos);
    }
    void rotated(const M* s, const M* c, const M* step_s, const M* step_c, int64_t n) const {
      rotate_sincos_row(s, c, step_s, step_c, n, fine_sin, fine_cos);
    }
  };
  static void math_rows_from_state(const double* __restrict__ ss, const double* __restrict__ cs, int64_t n,
                                   M amplitude, M* __restrict__ sin, M* __restrict__ cos) {
    for (int64_t i = 0; i < n; ++i) {
      sin[i] = static_cast<M>(ss[i]) * amplitude;
      cos[i] = static_cast<M>(cs[i]) * amplitude;
    }
  }
  template <typename Out>
  static constexpr bool kStateOnly = std::is_same_v<Out, StateOnly>;
  template <typename Out>
  static constexpr bool kMathRows = std::is_same_v<Out, MathRows>;

  // Rows of whole cache lines (16 elements: 64 bytes of float), so every row starts on one.
  static int64_t padded(int64_t count) { return (count + 15) / 16 * 16; }

  template <typename PositionOf>
  void positions_of(const PositionOf& position_of, int64_t row, double* out) const {
    if constexpr (std::is_invocable_v<PositionOf, int64_t, double*>) {
      position_of(row, out);
    } else {
      out[0] = static_cast<double>(position_of(row));
    }
  }

  // Can a row at `now` be reached from one at `before` (every axis the same or one past)?
  bool follows(const double* now, const double* before) const {
    for (int64_t a = 0; a < n_axes_; ++a) {
      if (now[a] != before[a] + 1.0 && now[a] != before[a]) return false;
    }
    return true;
  }
  bool same(const double* now, const double* before) const { return std::equal(now, now + n_axes_, before); }

  // A chunk's first row: replay from the last direct row at or before it. Out of line (it runs once
  // per chunk): flattened into every CPU loop's clones, it and step_row tripled their compile time
  // (cpu/kernels.h).
  template <typename PositionOf>
  [[gnu::noinline]] void replay_to(int64_t row, int64_t local, const PositionOf& position_of) {
    int64_t r = row, l = local;
    std::copy(current_, current_ + n_axes_, replay_);
    while (l % kDirectEvery != 0) {
      positions_of(position_of, r - 1, before_);
      if (!follows(replay_, before_)) break;
      --r, --l;
      std::swap(replay_, before_);
    }
    for (int64_t t = r; t < row; ++t) {
      positions_of(position_of, t, replay_);
      step(t, l + (t - r), replay_, StateOnly{});
    }
  }

  // One row after the previous one (row - 1, at previous_), by the rule above.
  template <typename Out>
  void step(int64_t row, int64_t local, const double* position, const Out& out) {
    row_sin_ = sin_, row_cos_ = cos_;
    const bool anchor = local % fine_ == 0;
    if (row == next_row_ && local % kDirectEvery != 0 && follows(position, previous_)) {
      if (!same(position, previous_)) direct_state_ = false;
      if (n_axes_ == 1) moved_ += position[0] != previous_[0];
      if (!anchor) {
        between_anchors(out);
      } else if (n_axes_ == 1) {
        moved_ == 0 ? repeat(out) : advance(moved_ - 1, out);
      } else {
        int64_t last = -1, moved = 0;  // the last axis that moved: its rotation writes the math rows
        for (int64_t a = 0; a < n_axes_; ++a) {
          if (position[a] != previous_[a]) last = a, ++moved;
        }
        if (moved == n_axes_) {
          advance(n_axes_, out);  // every axis: one rotation by the summed steps
        } else if (last >= 0) {
          for (int64_t a = 0; a < last; ++a) {
            if (position[a] != previous_[a]) advance(a, StateOnly{});
          }
          advance(last, out);
        } else {
          repeat(out);
        }
      }
      if (anchor) moved_ = 0;
    } else if (row == next_row_ && direct_state_ && same(position, previous_)) {
      repeat(out);  // a direct row's start at the direct state's position: what direct would write
    } else {
      direct(position, out);  // an anchor too
      moved_ = 0;
      direct_state_ = true;
    }
    std::copy(position, position + n_axes_, previous_);
    next_row_ = row + 1;
  }

  // The same angles again: what advance writes, the state in M times the amplitude. Nothing to do
  // when the math rows already hold it (a decode batch at one position: every row after the first).
  template <typename Out>
  void repeat(const Out& out) {
    if constexpr (!kStateOnly<Out>) {
      if (kMathRows<Out> && math_current_) return;
      out.from_state(sin_state_, cos_state_, n_, amplitude_);
      if (kMathRows<Out>) math_current_ = true;  // another output leaves sin_ and cos_ as they were
    }
  }

  // A row between anchors, moved_ positions past its anchor: the anchor's row in M (formed from the
  // state once per anchor where its consumer took factor rows instead) rotated by moved_ steps.
  // Replay skips these rows: they leave the state as it is.
  template <typename Out>
  void between_anchors(const Out& out) {
    if constexpr (!kStateOnly<Out>) {
      if (moved_ == 0) return repeat(out);
      if (!math_current_) {
        math_rows_from_state(sin_state_, cos_state_, n_, amplitude_, sin_, cos_);
        math_current_ = true;
      }
      step_row(moved_ - 1);  // forms the step's row in M too
      const M* ss = fine_steps_ + 2 * moved_ * row_;
      out.rotated(sin_, cos_, ss, ss + row_, n_);
      if constexpr (kMathRows<Out>) row_sin_ = fine_sin_, row_cos_ = fine_cos_;
    }
  }

  // sin_ and cos_ always hold a direct row (times the amplitude), whatever the output.
  template <typename Out>
  void direct(const double* position, const Out& out) {
    if (n_axes_ == 1) {
      sincos_row<M>(position[0], freq_, n_, M(1), sin_, cos_);
    } else {
      axis_angles(freq_, n_, n_axes_, 0, n_, [&](int64_t a) { return position[a]; }, angle_);
      for (int64_t i = 0; i < n_; ++i) sincos_of<M>(angle_[i], sin_[i], cos_[i]);
    }
    for (int64_t i = 0; i < n_; ++i) {
      sin_state_[i] = sin_[i];
      cos_state_[i] = cos_[i];
      sin_[i] *= amplitude_;
      cos_[i] *= amplitude_;
    }
    math_current_ = true;
    if constexpr (!kStateOnly<Out> && !kMathRows<Out>) {
      out.from_state(sin_state_, cos_state_, n_, amplitude_);  // sin_[i] and cos_[i]'s bits (the state is theirs)
    }
  }

  // Rotates the state by step row `index` (step_row) and writes the row to out.
  template <typename Out>
  void advance(int64_t index, const Out& out) {
    const double* ss = step_row(index);
    out.advance(sin_state_, cos_state_, ss, ss + row_, n_, amplitude_);
    math_current_ = kMathRows<Out>;
  }

  // The steps' sin/cos rows (sin, then cos): with several axes, one position along axis index (index
  // = n_axes: along every axis, the step of the summed frequencies, exact for an axis layout whose
  // other terms are zeros); with one axis, index + 1 positions (the anchors' steps), each rounded
  // to M as well (fine_steps_, the rows between anchors). Formed the first time they are needed: a
  // decode step never needs them. More than one position is the one-position step applied again in
  // float64 (~1e-16 a step). Out of line, as replay_to (cpu/kernels.h): the loops run once per row
  // of steps and stream.
  [[gnu::noinline]] const double* step_row(int64_t index) {
    if (!steps_) {
      const int64_t rows = std::max<int64_t>(n_axes_ + 1, fine_);
      steps_ = thread_rows<double, kStreamSteps>(2 * rows * row_);
      if (fine_ > 1) fine_steps_ = thread_rows<M, kStreamFineSteps>(2 * fine_ * row_);
      step_ready_.assign(rows, 0);
    }
    double* ss = steps_ + 2 * index * row_;
    double* sc = ss + row_;
    if (step_ready_[index]) return ss;
    if (n_axes_ > 1 || index == 0) {
      for (int64_t i = 0; i < n_; ++i) {
        double f = 0;
        if (index < n_axes_) {
          f = freq_[index * n_ + i];
        } else {
          for (int64_t b = 0; b < n_axes_; ++b) f += freq_[b * n_ + i];
        }
        ss[i] = f == 0.0 ? 0.0 : std::sin(f);  // an axis layout's zeros: sin 0 = 0, cos 0 = 1 exactly, for free
        sc[i] = f == 0.0 ? 1.0 : std::cos(f);
      }
    } else {
      const double* one = steps_;
      const double* before = step_row(index - 1);
      for (int64_t i = 0; i < n_; ++i) {
        double s = before[i], c = before[row_ + i];
        advance_sincos(s, c, one[i], one[row_ + i]);
        ss[i] = s;
        sc[i] = c;
      }
    }
    if (fine_ > 1 && index + 1 < fine_) {
      M* ms = fine_steps_ + 2 * (index + 1) * row_;
      for (int64_t i = 0; i < n_; ++i) {
        ms[i] = static_cast<M>(ss[i]);
        ms[row_ + i] = static_cast<M>(sc[i]);
      }
    }
    step_ready_[index] = 1;
    return ss;
  }

  const double* freq_;
  int64_t n_, n_axes_, row_, fine_;
  M amplitude_;
  std::vector<char> step_ready_;
  M *sin_, *cos_;            // the anchor's row, times the amplitude
  M *fine_sin_, *fine_cos_;  // a row between anchors (the default output)
  const M *row_sin_, *row_cos_;  // the row sin() and cos() hand out: one of the two above
  double *sin_state_, *cos_state_, *angle_;  // the float64 state rows; the angles (several axes)
  double* steps_ = nullptr;  // the steps' sin and cos rows (step_row)
  M* fine_steps_ = nullptr;  // with fine rows: row j (1 <= j < fine_) is j positions' sin and cos in M
  double *previous_, *current_, *replay_, *before_;  // one position per axis
  int64_t next_row_ = -1;
  int64_t moved_ = 0;  // one axis: positions moved since the anchor
  bool direct_state_ = false;  // the float64 state is what direct() made at previous_ (no move since)
  bool math_current_ = false;  // sin_/cos_ hold the state times the amplitude (they may not, past an Out)
};

}  // namespace posenc::cpu
