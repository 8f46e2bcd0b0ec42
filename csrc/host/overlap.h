// Exact memory-overlap tests for strided tensors, used by the host checks of the in-place ops.
//
// ATen's own overlap check (get_overlap_status) answers "TooHard" for any two non-dense views of one
// buffer, which covers both the legitimate case (q and k head slices of one fused qkv projection: interleaved rows, no
// shared element) and real overlaps (b[:, :, 0:4] and b[:, :, 2:6]). These functions decide exactly.
//
// A tensor is seen as a set of byte intervals: base + sum_d i_d * stride_d, each `width` bytes long
// (the contiguous innermost dims fold into the width). Two such sets are compared by splitting the
// dimension with the largest stride; when both sets share that stride, only the few relative shifts
// whose byte ranges meet are visited (translation invariance), so the fused-qkv case costs a few
// steps per dimension instead of one per row. A work budget bounds pathological layouts; past it
// the answer is "may overlap", which callers report as an error, never as "no overlap".
#pragma once
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "host/stable.h"

namespace posenc::overlap {

struct Dim {
  int64_t size, stride;  // stride in bytes, > 0
};

struct Layout {
  int64_t base = 0;   // first byte (relative to a common origin)
  int64_t width = 0;  // bytes of one innermost contiguous run
  std::vector<Dim> dims;  // outermost (largest stride) first
  int64_t span() const {  // bytes from base to one past the last byte
    int64_t s = width;
    for (const Dim& d : dims) s += (d.size - 1) * d.stride;
    return s;
  }
};

enum class Answer { No, Yes, Unknown };

// The byte intervals of t (numel > 0). Size-1 and stride-0 dims are dropped (a stride-0 dim repeats
// the same bytes, which matters for internal overlap only: see has_internal_overlap).
inline Layout layout_of(const Tensor& t) {
  Layout l;
  const int64_t item = static_cast<int64_t>(t.element_size());
  l.base = static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data_ptr()));
  l.width = item;
  const auto size = t.sizes();
  const auto stride = t.strides();
  for (size_t d = 0; d < size.size(); ++d) {
    if (size[d] > 1 && stride[d] != 0) l.dims.push_back({size[d], stride[d] * item});
  }
  // torch strides are never negative; sort outermost first, then fold contiguous inner dims.
  std::stable_sort(l.dims.begin(), l.dims.end(), [](const Dim& a, const Dim& b) { return a.stride > b.stride; });
  while (!l.dims.empty() && l.dims.back().stride == l.width) {
    l.width *= l.dims.back().size;
    l.dims.pop_back();
  }
  // Merge dims that tile exactly (outer stride == inner size * inner stride).
  for (size_t i = l.dims.size(); i-- > 1;) {
    Dim& outer = l.dims[i - 1];
    const Dim& inner = l.dims[i];
    if (outer.stride == inner.size * inner.stride) {
      outer = {outer.size * inner.size, inner.stride};
      l.dims.erase(l.dims.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  return l;
}

// [first byte, one past the last byte] of t (numel > 0; torch strides are never negative).
inline std::pair<uintptr_t, uintptr_t> byte_range(const Tensor& t) {
  const int64_t item = static_cast<int64_t>(t.element_size());
  const auto size = t.sizes();
  const auto stride = t.strides();
  int64_t last = 0;
  for (size_t d = 0; d < size.size(); ++d) last += (size[d] - 1) * stride[d];
  const uintptr_t lo = reinterpret_cast<uintptr_t>(t.data_ptr());
  return {lo, lo + static_cast<uintptr_t>((last + 1) * item)};
}

class Checker {
 public:
  explicit Checker(int64_t budget = 1 << 20) : budget_(budget) {}

  // Do the byte sets of a and b (each shifted by its base) share a byte?
  Answer sets(const Layout& a, const Layout& b) {
    return rec(a, 0, a.base, b, 0, b.base);
  }

  // Does some byte belong to two different elements of a?
  Answer self(const Layout& a) {
    // Split the outermost dim: a = U_i (a' + i*s). a overlaps itself iff a' does, or a' meets
    // a' + d*s for some d in [1, n-1] (only d with d*s < span(a') can meet).
    for (size_t k = 0; k < a.dims.size(); ++k) {
      const Dim& d = a.dims[k];
      const int64_t inner_span = span_from(a, k + 1);
      for (int64_t shift = 1; shift < d.size && shift * d.stride < inner_span; ++shift) {
        const Answer r = rec(a, k + 1, a.base, a, k + 1, a.base + shift * d.stride);
        if (r != Answer::No) return r;
      }
    }
    return Answer::No;
  }

 private:
  int64_t budget_;

  static int64_t span_from(const Layout& l, size_t k) {
    int64_t s = l.width;
    for (size_t i = k; i < l.dims.size(); ++i) s += (l.dims[i].size - 1) * l.dims[i].stride;
    return s;
  }

  // Sets: dims [ka..) of a at base_a, dims [kb..) of b at base_b.
  Answer rec(const Layout& a, size_t ka, int64_t base_a, const Layout& b, size_t kb, int64_t base_b) {
    if (--budget_ < 0) return Answer::Unknown;
    const int64_t span_a = span_from(a, ka), span_b = span_from(b, kb);
    if (base_a + span_a <= base_b || base_b + span_b <= base_a) return Answer::No;
    const bool a_left = ka < a.dims.size(), b_left = kb < b.dims.size();
    if (!a_left && !b_left) return Answer::Yes;  // two byte intervals whose ranges meet
    const int64_t sa = a_left ? a.dims[ka].stride : 0, sb = b_left ? b.dims[kb].stride : 0;
    if (a_left && b_left && sa == sb) {
      // a = U_i (a' + i*s), b = U_j (b' + j*s): they meet iff a' + (i-j)*s meets b' for some
      // shift d = i - j in [-(nb-1), na-1], and only shifts whose ranges meet are worth a look.
      const int64_t s = sa;
      const int64_t inner_a = span_from(a, ka + 1), inner_b = span_from(b, kb + 1);
      // ranges meet: base_a + d*s < base_b + inner_b and base_b < base_a + d*s + inner_a
      int64_t lo = floor_div(base_b - base_a - inner_a, s) + 1;
      int64_t hi = ceil_div(base_b + inner_b - base_a, s) - 1;
      lo = std::max(lo, -(b.dims[kb].size - 1));
      hi = std::min(hi, a.dims[ka].size - 1);
      Answer out = Answer::No;
      for (int64_t d = lo; d <= hi; ++d) {
        const Answer r = rec(a, ka + 1, base_a + d * s, b, kb + 1, base_b);
        if (r == Answer::Yes) return r;
        if (r == Answer::Unknown) out = r;
      }
      return out;
    }
    // Split whichever has the larger outermost stride, visiting only slices whose range meets the other.
    const bool split_a = a_left && (!b_left || sa > sb);
    const Layout& x = split_a ? a : b;
    const size_t kx = split_a ? ka : kb;
    const int64_t base_x = split_a ? base_a : base_b;
    const int64_t base_y = split_a ? base_b : base_a;
    const int64_t span_y = split_a ? span_b : span_a;
    const int64_t s = x.dims[kx].stride, inner = span_from(x, kx + 1);
    int64_t lo = floor_div(base_y - base_x - inner, s) + 1;
    int64_t hi = ceil_div(base_y + span_y - base_x, s) - 1;
    lo = std::max<int64_t>(lo, 0);
    hi = std::min(hi, x.dims[kx].size - 1);
    Answer out = Answer::No;
    for (int64_t i = lo; i <= hi; ++i) {
      const Answer r = split_a ? rec(a, ka + 1, base_a + i * s, b, kb, base_b)
                               : rec(a, ka, base_a, b, kb + 1, base_b + i * s);
      if (r == Answer::Yes) return r;
      if (r == Answer::Unknown) out = r;
    }
    return out;
  }

  static int64_t floor_div(int64_t a, int64_t b) {  // b > 0
    return a >= 0 ? a / b : -((-a + b - 1) / b);
  }
  static int64_t ceil_div(int64_t a, int64_t b) {  // b > 0
    return -floor_div(-a, b);
  }
};

// Do a and b share any byte? Decided on addresses alone (tensors in different storages occupy
// different bytes, and the stable ABI has no storage identity to short-cut with): byte ranges that
// do not meet are the first test.
inline Answer tensors(const Tensor& a, const Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return Answer::No;
  // The usual case, separate allocations, costs one comparison of the two byte ranges.
  const auto [a_lo, a_hi] = byte_range(a);
  const auto [b_lo, b_hi] = byte_range(b);
  if (a_hi <= b_lo || b_hi <= a_lo) return Answer::No;
  return Checker().sets(layout_of(a), layout_of(b));
}

// Does some memory location hold two elements of t (an expanded or as_strided tensor)?
inline Answer internal(const Tensor& t) {
  if (t.numel() <= 1) return Answer::No;
  const auto size = t.sizes();
  const auto stride = t.strides();
  for (size_t d = 0; d < size.size(); ++d) {
    if (size[d] > 1 && stride[d] == 0) return Answer::Yes;
  }
  if (t.is_contiguous() || non_overlapping_and_dense(t)) return Answer::No;
  return Checker().self(layout_of(t));
}

}  // namespace posenc::overlap
