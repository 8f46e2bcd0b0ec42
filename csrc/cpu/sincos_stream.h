// sin/cos rows for a stream of positions, as the CPU loops visit tokens or rows in order.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
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
enum RowSlot { kStreamMath, kStreamF64, kStreamAxes, kFactorRows, kTableRows, kEncodingRows, kStreamedRow, kOrderIndex };

// The calling thread's row of n doubles that fill(row) forms for a key (a Header of 8-byte fields,
// then n_values doubles), kept for the thread's last key, compared bit for bit as the stream's
// tables are: a decode step calls with the same key every time, and forming the row per call cost
// it microseconds. One row per Caller. Whole cache lines of its own: the call's other threads read
// it while this one writes whatever the allocator puts after it.
template <typename Caller, typename Header, typename Fill>
const double* row_for_last_key(const Header& header, const double* values, int64_t n_values, int64_t n,
                               Fill&& fill) {
  // compared as bytes (doubles bit for bit): fields of 8 bytes, so no padding (which could only
  // make a key miss, never hit a wrong row)
  static_assert(std::is_trivially_copyable_v<Header> && alignof(Header) == 8 && sizeof(Header) % 8 == 0);
  static thread_local RowVector<double> row;
  static thread_local Header last_header;
  static thread_local std::vector<double> last_values;
  static thread_local bool formed = false;
  const bool same = formed && std::memcmp(&header, &last_header, sizeof(Header)) == 0 &&
                    static_cast<int64_t>(last_values.size()) == n_values &&
                    (n_values == 0 || std::memcmp(values, last_values.data(), n_values * sizeof(double)) == 0);
  if (!same) {
    formed = false;  // (until the row and its key are whole: a throw on the way leaves no hit)
    row.assign((n + 7) / 8 * 8, 0.0);
    fill(row.data());
    last_header = header;
    last_values.assign(values, values + n_values);
    formed = true;
  }
  return row.data();
}

// sin/cos(position * freq[i]) * amplitude for i < n, in the math type M, for rows of a problem (a
// token, an encoding row) as the CPU loops visit them. Each row's values are a function of its
// position alone: an integer position p is its anchor's row, evaluated directly (sincos_row) at
// a = p - (p mod kAnchorEvery), rotated in M by the j = p - a positions past it (rotate_sincos_row,
// with a table of j steps formed once per thread and frequencies); a non-integer position is
// direct, and so is every float64 row (M = double: the truth dtype, whose angles are rounded as the
// reference rounds them). So a token gets the same bits whatever else the call holds: any thread
// count or split into chunks, any batch (torch.func.vmap folds its dimension into the batch:
// python/posenc_native/_functorch.py), and any cut of its sequence (chunked prefill, a decode step,
// a prefix cache's earlier call). Consecutive positions cost one direct row per kAnchorEvery rows
// and a rotation (a few multiply-adds per pair) for the others, within a few ulp of M of the direct
// values (docs/architecture.md); the thread keeps its last anchor row with the steps' table, so
// consecutive decode steps (a call each) evaluate one row in kAnchorEvery too.
//
// Multi-axis positions (n_axes rows of frequencies, freq[a * n + i]; core/rope.h, axis_angles): a
// row's position is one value per axis, and its angles the sum over axes. In the axis layout every
// pair has one axis's frequency (zeros elsewhere): each axis then has its own anchor, the anchor row
// is evaluated at the anchors, and pair i is rotated by the steps of its own axis (image patches
// along a row move one axis, text tokens all). Frequencies that mix axes make every row direct.
// Where every axis has the same position (positions without an axis dim: text tokens), the stream
// is one axis whose frequencies are the column sums: exact for the axis layout (one non-zero per
// pair), so the rows and bits are plain RoPE's with those frequencies.
//
// Each row's values (sin and cos times the amplitude, in M) go where the consumer wants them: to
// sin() and cos() by default, or to an output of the consumer's, a type with two row writers:
//   from_math(sin, cos, n): write the row from an anchor's or a direct row (amplitude included);
//   rotated(sin, cos, step_sin, step_cos, n): write it from the anchor's row rotated by a step.
// The RoPE loop passes its interleaved factor rows (cpu/rope_cpu.cpp), and the sinusoidal loop its
// encoding rows (cpu/sinusoidal_cpu.cpp): each saves a pass over every row (benchmarks/RESULTS.md).
template <typename M>
class SinCosStream {
 public:
  // Positions from one anchor to the next. Each anchor costs a direct row (~5 ns a token at 16, for
  // 128-dim heads), each step a row of the table (16 rows of M, 8 KiB for 128-dim heads, in L1);
  // 8 cost a one-head fp32/bf16 prefill 12-20% against the earlier float64 anchors, 16 5-12%, 32
  // little less (benchmarks/RESULTS.md, "Thirtieth session").
  static constexpr int kAnchorEvery = 16;

  // No allocation (a decode step builds one stream per call): the rows, the steps' table and the
  // per-axis state live in this thread's buffers (thread_rows). one_position: every row has the
  // same position on every axis (see above).
  SinCosStream(const double* freq, int64_t n, M amplitude, int64_t n_axes = 1, bool one_position = false)
      : freq_(freq), n_(n), n_axes_(one_position ? 1 : n_axes), row_(padded(n)), amplitude_(amplitude) {
    own_sin_ = thread_rows<M, kStreamMath>(6 * row_), own_cos_ = own_sin_ + row_;
    sin_ = own_sin_, cos_ = own_cos_;
    rotated_sin_ = own_cos_ + row_, rotated_cos_ = rotated_sin_ + row_;
    axis_steps_ = rotated_cos_ + row_;
    row_sin_ = sin_, row_cos_ = cos_;
    const int64_t axes = padded(n_axes_);
    double* f64 = thread_rows<double, kStreamF64>(2 * row_ + 4 * axes);
    angle_ = f64, pair_freq_ = angle_ + row_;
    position_ = pair_freq_ + row_, anchor_ = position_ + axes, own_at_ = anchor_ + axes, rotated_at_ = own_at_ + axes;
    std::fill(own_at_, own_at_ + 2 * axes, kNone);  // no row evaluated or rotated yet
    int64_t* ints = thread_rows<int64_t, kStreamAxes>(3 * n_ + 2 * axes);
    step_ = ints, axis_steps_at_ = step_ + axes, runs_ = axis_steps_at_ + axes;
    std::fill(axis_steps_at_, axis_steps_at_ + axes, -1);
    if (n_axes > 1 && one_position) {
      for (int64_t i = 0; i < n_; ++i) {
        double f = 0;
        for (int64_t a = 0; a < n_axes; ++a) f += freq[a * n_ + i];
        pair_freq_[i] = f;
      }
      freq_ = pair_freq_;
    }
    by_anchors_ = !std::is_same_v<M, double> && (n_axes_ == 1 || one_axis_per_pair());
  }
  SinCosStream(const SinCosStream&) = delete;
  SinCosStream& operator=(const SinCosStream&) = delete;

  // Fills sin() and cos() for the row whose position on axis a is position_of(a) (a double; a = 0
  // only, with one axis or one position).
  template <typename PositionOf>
  void at(const PositionOf& position_of) {
    at(position_of, MathRows{this});
  }

  // The same, with the row written to out (see above) instead: sin() and cos() are then not the row's.
  template <typename PositionOf, typename Out>
  void at(const PositionOf& position_of, const Out& out) {
    // Each axis' position split into its anchor and the j positions past it (p mod kAnchorEvery,
    // exact: division by a power of two and floor are exact in double).
    bool anchored = by_anchors_, past = false;
    for (int64_t a = 0; a < n_axes_; ++a) {
      const double p = position_[a] = static_cast<double>(position_of(a));
      if (!anchored) continue;
      const double j = p - kAnchorEvery * std::floor(p * (1.0 / kAnchorEvery));
      anchored = j == std::floor(j);  // (an integer position)
      if (!anchored) continue;
      anchor_[a] = p - j;
      step_[a] = static_cast<int64_t>(j);
      past |= j != 0;
    }
    if (anchored && n_axes_ == 1) {  // an anchor row, kept with the steps' table (Table::anchor)
      Table& t = table();
      M* rows = t.anchor.data();
      if (!(t.anchor_at == anchor_[0] && t.anchor_amplitude == amplitude_)) {
        sincos_row<M>(anchor_[0], freq_, n_, amplitude_, rows, rows + row_);
        t.anchor_at = anchor_[0], t.anchor_amplitude = amplitude_;
      }
      sin_ = rows, cos_ = rows + row_;
    } else {
      const double* row_at = anchored ? anchor_ : position_;
      if (!same(row_at, own_at_)) {
        evaluate(row_at);
        std::copy(row_at, row_at + n_axes_, own_at_);
      }
      sin_ = own_sin_, cos_ = own_cos_;
    }
    if (!anchored || !past) return out.from_math(sin_, cos_, n_);
    const M* steps = n_axes_ == 1 ? step_row(step_[0]) : axis_step_row();
    out.rotated(sin_, cos_, steps, steps + row_, n_);
  }

  const M* sin() const { return row_sin_; }
  const M* cos() const { return row_cos_; }

 private:
  // The stream's own output: the anchor's (or a direct) row as it is, or rotated into
  // rotated_sin_/rotated_cos_ (once per position: a decode batch at one position rotates it once).
  struct MathRows {
    SinCosStream* stream;
    void from_math(const M* s, const M* c, int64_t) const {
      stream->row_sin_ = s, stream->row_cos_ = c;
    }
    void rotated(const M* s, const M* c, const M* step_s, const M* step_c, int64_t n) const {
      SinCosStream& st = *stream;
      if (!st.same(st.position_, st.rotated_at_)) {
        rotate_sincos_row(s, c, step_s, step_c, n, st.rotated_sin_, st.rotated_cos_);
        std::copy(st.position_, st.position_ + st.n_axes_, st.rotated_at_);
      }
      st.row_sin_ = st.rotated_sin_, st.row_cos_ = st.rotated_cos_;
    }
  };

  // Rows of whole cache lines (16 elements: 64 bytes of float), so every row starts on one.
  static int64_t padded(int64_t count) { return (count + 15) / 16 * 16; }

  template <typename V>
  bool same(const V* a, const V* b) const { return std::equal(a, a + n_axes_, b); }

  // sin_ and cos_: the row at `position` (one per axis), times the amplitude, in this stream's own
  // rows. (at() points sin_ and cos_ there as well; without the assignment here GCC inlined the
  // stream differently into the RoPE loops, ~0.5 KB more code per loop for no measured gain.)
  void evaluate(const double* position) {
    sin_ = own_sin_, cos_ = own_cos_;
    if (n_axes_ == 1) {
      sincos_row<M>(position[0], freq_, n_, amplitude_, own_sin_, own_cos_);
      return;
    }
    axis_angles(freq_, n_, n_axes_, 0, n_, [&](int64_t a) { return position[a]; }, angle_);
    for (int64_t i = 0; i < n_; ++i) {
      sincos_of<M>(angle_[i], own_sin_[i], own_cos_[i]);
      own_sin_[i] *= amplitude_;
      own_cos_[i] *= amplitude_;
    }
  }

  // Several axes: whether each pair has one axis's frequency (zeros on the others); then pair_freq_
  // holds it (the frequencies the steps' table is formed from), and runs_ the runs of pairs on one
  // axis (start, end, axis; MRoPE's sections: three runs, interleaved: runs of one pair).
  bool one_axis_per_pair() {
    for (int64_t i = 0; i < n_; ++i) {
      int64_t axis = 0, nonzero = 0;
      for (int64_t a = 0; a < n_axes_; ++a) {
        if (freq_[a * n_ + i] != 0.0) axis = a, ++nonzero;
      }
      if (nonzero > 1) return false;
      pair_freq_[i] = freq_[axis * n_ + i];
      if (nonzero == 0 && n_runs_ > 0) axis = runs_[3 * n_runs_ - 1];  // (no frequency: any axis; the run goes on)
      if (n_runs_ > 0 && runs_[3 * n_runs_ - 1] == axis) {
        runs_[3 * n_runs_ - 2] = i + 1;
      } else {
        runs_[3 * n_runs_] = i, runs_[3 * n_runs_ + 1] = i + 1, runs_[3 * n_runs_ + 2] = axis;
        ++n_runs_;
      }
    }
    return true;
  }

  // Several axes: pair i's step is its own axis's, j positions of it (row j of the steps' table;
  // j = 0: sin 0, cos 1, exactly). Every axis at the same j (text tokens): that table row itself;
  // else formed run by run, again only when the steps change.
  const M* axis_step_row() {
    const int64_t j0 = step_[0];
    if (std::all_of(step_ + 1, step_ + n_axes_, [&](int64_t j) { return j == j0; })) return step_row(j0);
    if (!same(step_, axis_steps_at_)) {
      for (int64_t r = 0; r < n_runs_; ++r) {
        const int64_t begin = runs_[3 * r], end = runs_[3 * r + 1], j = step_[runs_[3 * r + 2]];
        if (j == 0) {
          std::fill(axis_steps_ + begin, axis_steps_ + end, M(0));
          std::fill(axis_steps_ + row_ + begin, axis_steps_ + row_ + end, M(1));
        } else {
          const M* table = step_row(j);
          std::copy(table + begin, table + end, axis_steps_ + begin);
          std::copy(table + row_ + begin, table + row_ + end, axis_steps_ + row_ + begin);
        }
      }
      std::copy(step_, step_ + n_axes_, axis_steps_at_);
    }
    return axis_steps_;
  }

  // Row j (1 <= j < kAnchorEvery) of the steps' table: sin and cos of j * freq[i] rounded to M (sin,
  // then cos; with several axes, of j times pair i's own axis frequency). A table is formed whole
  // the first time a row is asked for: one step by std::sin/cos in float64, the others by rotating
  // it again in float64 (~1e-16 a step), each rounded once to M, so the rotated rows add only M's
  // rounding to the anchor's error. This thread keeps the tables of the last kTables frequency
  // sets from call to call (a decode step then forms nothing: n std::sin/cos cost ~2 us for 64
  // pairs; models alternate rope_theta per layer, Gemma 3 two, so one table would thrash).
  // Out of line: flattened into every CPU loop's clones, the stream's rarely run helpers tripled
  // their compile time (cpu/kernels.h).
  //
  // The table also keeps the last anchor row evaluated with its frequencies (one axis), so the
  // thread's next call at the same anchor finds it: consecutive decode steps share an anchor 15
  // times in 16 (the row's sin/cos were ~3% of a RoPE decode step, ~0.3 us of a 1024-dim
  // add_sinusoidal one).
  static constexpr int kTables = 4;
  struct Table {
    std::vector<double> freq;  // the frequencies it was formed from (compared bit for bit)
    RowVector<M> rows;         // the steps
    RowVector<M> anchor;       // the anchor row: sin, then cos (times anchor_amplitude)
    double anchor_at = kNone;  // its position (kNone: none)
    M anchor_amplitude = M(0);
  };
  const M* step_row(int64_t j) { return table().rows.data() + 2 * j * row_; }
  Table& table() { return table_ ? *table_ : find_table(); }

  // This stream's frequencies' table, found among the thread's last kTables or formed.
  [[gnu::noinline]] Table& find_table() {
    static thread_local Table tables[kTables];
    static thread_local int oldest = 0;
    const double* freq = n_axes_ == 1 ? freq_ : pair_freq_;
    const auto formed_for = [&](const Table& t) {
      return t.freq.size() == static_cast<size_t>(n_) && std::memcmp(freq, t.freq.data(), n_ * sizeof(double)) == 0;
    };
    Table* table = std::find_if(tables, tables + kTables, formed_for);
    if (table == tables + kTables) {
      table = &tables[oldest];
      oldest = (oldest + 1) % kTables;
      table->freq.assign(freq, freq + n_);
      if (static_cast<int64_t>(table->rows.size()) < 2 * kAnchorEvery * row_) {
        table->rows = RowVector<M>(2 * kAnchorEvery * row_);
        table->anchor = RowVector<M>(2 * row_);
      }
      table->anchor_at = kNone;
      M* rows = table->rows.data();
      for (int64_t i = 0; i < n_; ++i) {
        const double one_s = std::sin(freq[i]), one_c = std::cos(freq[i]);
        double s = one_s, c = one_c;
        for (int k = 1; k < kAnchorEvery; ++k) {
          if (k > 1) advance_sincos(s, c, one_s, one_c);
          rows[2 * k * row_ + i] = static_cast<M>(s);
          rows[(2 * k + 1) * row_ + i] = static_cast<M>(c);
        }
      }
    }
    table_ = table;
    return *table_;
  }

  static constexpr double kNone = std::numeric_limits<double>::quiet_NaN();  // (equal to no position)

  const double* freq_;
  int64_t n_, n_axes_, row_;
  M amplitude_;
  bool by_anchors_;                // anchors and steps (else every row direct)
  M *own_sin_, *own_cos_;          // this stream's rows (evaluate): direct rows, several axes' anchors
  const M *sin_, *cos_;            // the row being rotated or used (own rows or the table's anchor row)
  M *rotated_sin_, *rotated_cos_;  // a row past its anchor (the default output)
  M* axis_steps_;                  // several axes: each pair's step (axis_step_row)
  const M *row_sin_, *row_cos_;    // the row sin() and cos() hand out: one of the above
  double* angle_;                  // several axes: the angles (direct rows)
  double* pair_freq_;              // each pair's one frequency: its axis's, or the column sum
  int64_t* runs_;                  // several axes: runs of pairs on one axis (one_axis_per_pair)
  int64_t n_runs_ = 0;
  // One value per axis: the row's position, its anchor and the steps past it; the positions whose
  // rows own_sin_/own_cos_ and rotated_sin_/rotated_cos_ hold (kNone: none), and the steps
  // axis_steps_ holds (-1: none). (The table records its own anchor row's position.)
  double *position_, *anchor_, *own_at_, *rotated_at_;
  int64_t *step_, *axis_steps_at_;
  Table* table_ = nullptr;         // the steps' table (table())
};

}  // namespace posenc::cpu
