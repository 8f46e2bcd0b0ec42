#include "host/plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "host/overlap.h"

namespace posenc {
namespace {

// Argument values are read on the host only where they live: a CUDA tensor's values are checked by
// the kernel (POSENC_DEVICE_REQUIRE in csrc/core), so that no call waits for the device.
bool host_readable(const Tensor& t) { return t.is_cpu(); }

// Smallest and largest value of an index/position tensor on the host (host_readable; numel > 0), any
// strides. Integer tensors give exact int64 bounds; floating ones give float64 bounds (NaN if any
// value is NaN).
struct ValueRange {
  bool integral = true;
  int64_t imin = 0, imax = 0;
  double fmin = 0, fmax = 0;
};

template <typename T>
void scan_cpu(const Tensor& t, ValueRange& r) {
  // 1-D to 3-D (axis positions), any strides: a plain loop costs far less than reductions for the
  // short index tensors of a decode step.
  const T* data = static_cast<const T*>(t.data_ptr());
  const int64_t d = t.dim();
  const int64_t planes = d == 3 ? t.size(0) : 1, rows = d >= 2 ? t.size(d - 2) : 1, cols = d == 0 ? 1 : t.size(-1);
  const int64_t ps = d == 3 ? t.stride(0) : 0, rs = d >= 2 ? t.stride(d - 2) : 0, cs = d == 0 ? 0 : t.stride(-1);
  T lo = data[0], hi = data[0];
  bool nan = false;
  for (int64_t a = 0; a < planes; ++a) {
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        const T v = data[a * ps + i * rs + j * cs];
        nan |= v != v;
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
      }
    }
  }
  if constexpr (std::is_integral_v<T>) {
    r.imin = lo;
    r.imax = hi;
  } else {
    r.fmin = nan ? NAN : static_cast<double>(lo);
    r.fmax = nan ? NAN : static_cast<double>(hi);
  }
}

ValueRange value_range(const Tensor& t_in) {
  ValueRange r;
  const ScalarType dt = dtype_of(t_in);
  r.integral = !is_floating(dt);
  Tensor t = t_in;
  const bool scannable = dt == ScalarType::Int || dt == ScalarType::Long || dt == ScalarType::Float ||
                         dt == ScalarType::Double;
  if (t.dim() > 3 || !scannable) {
    // Another dtype or rank: one copy to an int64/float64 vector, scanned below.
    t = torch::stable::reshape(to_cpu(t, r.integral ? ScalarType::Long : ScalarType::Double), {-1});
  }
  switch (dtype_of(t)) {
    case ScalarType::Int: scan_cpu<int32_t>(t, r); break;
    case ScalarType::Long: scan_cpu<int64_t>(t, r); break;
    case ScalarType::Float: scan_cpu<float>(t, r); break;
    default: scan_cpu<double>(t, r); break;
  }
  return r;
}

// Positions in [lo, hi] plus the op's offset (none: an op without one) must lie in the position
// domain, the kernels' test on the GPU (core/common.h); one message for integer and floating-point
// positions. Returns the larger of |lo + offset| and |hi + offset|.
template <typename V>
[[noreturn]] void fail_position_domain(const char* op, const char* what, V lo, V hi, std::optional<int64_t> offset) {
  const std::string plus = offset ? " + offset" : "", and_offset = offset ? " and offset " + std::to_string(*offset) : "";
  const char* must = std::is_floating_point_v<V> ? " must be finite and lie in" : " must lie in";
  fail(op, ": ", what, plus, must, " [-2^48, 2^48] (the supported position domain), got positions in [", lo, ", ", hi,
       "]", and_offset);
}

double checked_position_bound(const char* op, int64_t lo, int64_t hi, std::optional<int64_t> offset, const char* what) {
  const int64_t off = offset.value_or(0);
  const PositionDomain domain = position_domain(off);
  if (!domain.contains(lo) || !domain.contains(hi)) fail_position_domain(op, what, lo, hi, offset);
  return static_cast<double>(std::max(std::abs(lo + off), std::abs(hi + off)));  // no wrap: both sums lie in the domain
}

double checked_position_bound(const char* op, double lo, double hi, std::optional<int64_t> offset, const char* what) {
  const double off = static_cast<double>(offset.value_or(0));  // (exact for offsets within the domain)
  const double bound = std::max(std::abs(lo + off), std::abs(hi + off));
  if (!(bound <= static_cast<double>(kMaxPosition))) fail_position_domain(op, what, lo, hi, offset);  // (NaN, inf too)
  return bound;
}

IndexKind index_kind(const Tensor& t) {
  switch (dtype_of(t)) {
    case ScalarType::Int: return IndexKind::Int32;
    case ScalarType::Long: return IndexKind::Int64;
    case ScalarType::Float: return IndexKind::Float32;
    default: return IndexKind::Float64;
  }
}

// The data of t, refused when it has none (data_ptr where the plan takes it anyway: no second call).
void* data_of(const char* op, const Tensor& t, const char* name) {
  void* data = t.data_ptr();
  if (data == nullptr) check_has_data(op, t, name);
  return data;
}

void check_same_device(const char* op, const Tensor& ref, const char* ref_name, const Tensor& t, const char* name) {
  POSENC_CHECK(same_device(t, ref), op, ": ", name, " must be on the same device as ", ref_name, " (", device_of(ref),
               "), got ", device_of(t));
}

// t on ref's device, with data: index tensors, read on the host before the plan takes their data.
void check_operand(const char* op, const Tensor& ref, const char* ref_name, const Tensor& t, const char* name) {
  check_same_device(op, ref, ref_name, t, name);
  check_has_data(op, t, name);
}

// Positions for the sinusoidal ops: integer or floating point; other dtypes are read as float64.
Tensor sinusoidal_positions(const char* op, const Tensor& positions) {
  const ScalarType t = dtype_of(positions);
  if (t == ScalarType::Int || t == ScalarType::Long || t == ScalarType::Float || t == ScalarType::Double) return positions;
  POSENC_CHECK(is_integral(t) || is_floating(t), op, ": positions must be an integer or floating point tensor, got ", t);
  return to_dtype(positions, is_floating(t) ? ScalarType::Double : ScalarType::Long);
}

SinusoidalParams sinusoidal_params(const char* op, int64_t dim, double base, bool interleaved, double freq_shift,
                                   double angle_scale, bool cos_first) {
  POSENC_CHECK(dim >= 2, op, ": dim must be >= 2, got ", dim);
  POSENC_CHECK(std::isfinite(base) && base > 0.0 && base != 1.0, op,
               ": base must be a finite number > 0 and != 1, got ", base);
  const int64_t half = dim / 2;
  POSENC_CHECK(std::isfinite(freq_shift) && freq_shift < static_cast<double>(half), op,
               ": freq_shift must be smaller than dim // 2 = ", half, ", got ", freq_shift);
  POSENC_CHECK(std::isfinite(angle_scale), op, ": angle_scale must be finite, got ", angle_scale);
  SinusoidalParams p;
  p.dim = dim;
  p.half = half;
  p.log_base = std::log(base);
  p.freq_denom = static_cast<double>(half) - freq_shift;
  p.angle_scale = angle_scale;
  p.interleaved = interleaved;
  p.cos_first = cos_first;
  p.largest_frequency = std::max(std::abs(p.frequency(0)), std::abs(p.frequency(half - 1)));
  POSENC_CHECK(std::isfinite(p.largest_frequency), op, ": the frequencies must be finite; base ", base,
               " with freq_shift ", freq_shift, " and angle_scale ", angle_scale, " gives ", p.largest_frequency);
  p.angle_position_limit = p.largest_frequency > 0 ? kMaxAngle / p.largest_frequency : INFINITY;
  return p;
}

// Values of the sinusoidal positions plus offset: finite, |p| <= 2^48 and |p * w| <= 2^50 for every
// frequency w (on the host for CPU positions; the kernel checks positions on the GPU:
// core/sinusoidal.h). positions none: 0 .. seq-1.
void check_sinusoidal_domain(const char* op, const OptTensor& positions, int64_t seq, std::optional<int64_t> offset,
                             const SinusoidalParams& prm) {
  double bound = 0;
  if (!positions.has_value()) {
    if (seq == 0) return;
    bound = checked_position_bound(op, int64_t{0}, seq - 1, offset, "positions (0 .. seq-1)");
  } else {
    if (positions->numel() == 0 || !host_readable(*positions)) return;
    const ValueRange r = value_range(*positions);
    bound = r.integral ? checked_position_bound(op, r.imin, r.imax, offset, "positions")
                       : checked_position_bound(op, r.fmin, r.fmax, offset, "positions");
  }
  POSENC_CHECK(bound <= prm.angle_position_limit, op, ": position * frequency must stay within 2^50 rad (the",
               " supported angle domain); the largest |position| is ", bound, " and the largest frequency ",
               prm.largest_frequency);
}

}  // namespace

Tensor sinusoidal_table_op(const SinusoidalTableArgs& a, const Backend& backend) {
  constexpr const char* op = "posenc.sinusoidal_table";
  POSENC_CHECK(a.positions.dim() == 1, op, ": positions must be 1-D [N], got shape ", sizes_of(a.positions));
  POSENC_CHECK(is_float_dtype(a.dtype), op, ": dtype must be float32, float16, bfloat16 or float64, got ", a.dtype);
  SinusoidalProblem p;
  p.params = sinusoidal_params(op, a.dim, a.base, a.interleaved, a.freq_shift, a.angle_scale, a.cos_first);
  const Tensor positions = sinusoidal_positions(op, a.positions);
  check_sinusoidal_domain(op, positions, positions.size(0), std::nullopt, p.params);
  check_output_size(op, "[positions, dim]", {positions.size(0), a.dim}, a.dtype);
  Tensor out = empty({positions.size(0), a.dim}, a.dtype, positions);
  if (out.numel() == 0) return out;
  p.batch = 1;
  p.seq = positions.size(0);
  p.positions = positions.data_ptr();
  p.positions_kind = index_kind(positions);
  p.pos_stride_s = positions.stride(0);
  p.out = out.data_ptr();
  p.out_stride_s = out.stride(0);
  backend.sinusoidal(p, a.dtype);
  return out;
}

Tensor add_sinusoidal_op(const AddSinusoidalArgs& a, const Backend& backend) {
  constexpr const char* op = "posenc.add_sinusoidal";
  const Tensor& x = a.x;
  POSENC_CHECK(x.dim() == 2 || x.dim() == 3, op, ": x must be [batch, seq, dim] or [seq, dim], got shape ", sizes_of(x));
  POSENC_CHECK(is_float_dtype(dtype_of(x)), op, ": x must be float32, float16, bfloat16 or float64, got ",
               dtype_of(x));
  const int64_t batch = x.dim() == 3 ? x.size(0) : 1;
  const int64_t seq = x.size(-2);
  const int64_t dim = x.size(-1);
  OptTensor positions;  // as the kernels read them (int32/int64/float32/float64)
  if (a.positions.has_value()) {
    const Tensor& given = *a.positions;
    check_operand(op, x, "x", given, "positions");
    POSENC_CHECK(given.dim() == 1 || (given.dim() == 2 && x.dim() == 3), op, ": positions must be [seq]",
                 x.dim() == 3 ? " or [batch, seq]" : "", ", got shape ", sizes_of(given));
    POSENC_CHECK(given.size(-1) == seq, op, ": positions must have seq = ", seq,
                 " entries in its last dim, got shape ", sizes_of(given));
    POSENC_CHECK(given.dim() == 1 || given.size(0) == batch || given.size(0) == 1, op,
                 ": positions [batch, seq] must have batch ", batch, " or 1, got shape ", sizes_of(given));
    positions = sinusoidal_positions(op, given);
  }
  POSENC_CHECK(std::isfinite(a.x_scale), op, ": x_scale must be finite, got ", a.x_scale);
  // (rows of 32-bit and 16-bit x are computed in float32, where a larger x_scale is infinite: x * x_scale
  // would be NaN or infinite where the exact result is finite)
  POSENC_CHECK(dtype_of(x) == ScalarType::Double || std::abs(a.x_scale) <= std::numeric_limits<float>::max(), op,
               ": x_scale must be within float32's range (|x_scale| <= ", std::numeric_limits<float>::max(),
               ") for x of dtype ", dtype_of(x), ", whose rows are computed in float32; got ", a.x_scale);
  SinusoidalProblem p;
  p.params = sinusoidal_params(op, dim, a.base, a.interleaved, a.freq_shift, a.angle_scale, a.cos_first);
  check_sinusoidal_domain(op, positions, seq, a.offset, p.params);
  // (so that positions + offset inside the domain are exact in float64, as the kernels add them:
  // a position past 2^53 brought back by an offset would round first)
  POSENC_CHECK(a.offset >= -kMaxPosition && a.offset <= kMaxPosition, op,
               ": offset must lie in [-2^48, 2^48] (the position domain), got ", a.offset);
  Tensor out = new_rows_like(x);
  if (out.numel() == 0) return out;
  p.batch = batch;
  p.seq = seq;
  p.offset = a.offset;
  if (positions.has_value()) {
    p.positions = positions->data_ptr();
    p.positions_kind = index_kind(*positions);
    p.pos_stride_s = positions->stride(-1);
    p.pos_stride_b = (positions->dim() == 2 && positions->size(0) == batch) ? positions->stride(0) : 0;
  }
  p.x = data_of(op, x, "x");
  p.x_stride_b = x.dim() == 3 ? x.stride(0) : 0;
  p.x_stride_s = x.stride(-2);
  p.x_stride_d = x.stride(-1);
  p.x_scale = a.x_scale;
  p.out = out.data_ptr();
  p.out_stride_b = out.dim() == 3 ? out.stride(0) : 0;
  p.out_stride_s = out.stride(-2);
  backend.sinusoidal(p, dtype_of(x));
  return out;
}

// ------------------------------------------------------------------------------------------------
// RoPE

namespace {

// The kernels read and write rows with a contiguous last dim. The out-of-place ops take q and k
// with any strides (as transformers' own rotation does: ZAYA's q is a transposed conv output)
// by rotating a row-major copy; the in-place ops refuse such a q or k (as_bshd names it).
bool rows_contiguous(const Tensor& t) { return t.dim() == 0 || t.stride(-1) == 1; }

// A row-major copy of t. Not contiguous() alone: torch counts a tensor with no elements as contiguous
// whatever its strides and returns it as is, which would leave its rows "not contiguous" forever.
Tensor row_major(const Tensor& t) {
  return t.numel() == 0 ? empty(t.sizes(), dtype_of(t), t) : torch::stable::contiguous(t);
}

template <typename Args>
Args with_contiguous_rows(const Args& a) {
  Args b = a;
  if (!rows_contiguous(b.q)) b.q = row_major(b.q);
  if (!rows_contiguous(b.k)) b.k = row_major(b.k);
  return b;
}

struct BSHD {
  int64_t batch, seq, heads, head_dim;
  int64_t stride_b, stride_s, stride_h;
};

// Sizes and strides of q or k seen as [batch, seq, heads, head_dim] for the given layout.
BSHD as_bshd(const char* op, const Tensor& t, const char* name, std::string_view layout) {
  const int64_t dims = t.dim();
  const auto expect_dims = [&](int64_t n, const char* shape) {
    POSENC_CHECK(dims == n, op, ": ", name, " must be ", shape, " for layout '", layout, "', got shape ", sizes_of(t));
  };
  BSHD v{};
  if (layout == "bshd" || layout == "bhsd") {
    expect_dims(4, layout == "bshd" ? "[batch, seq, heads, head_dim]" : "[batch, heads, seq, head_dim]");
  } else if (layout == "thd") {
    expect_dims(3, "[tokens, heads, head_dim]");
  } else {
    fail(op, ": layout must be 'bshd', 'bhsd' or 'thd', got '", layout, "'");
  }
  // One shim call each for the sizes and the strides (borrowed arrays), not one per dimension.
  const auto size = t.sizes();
  const auto stride = t.strides();
  if (layout == "bshd") {
    v = {size[0], size[1], size[2], size[3], stride[0], stride[1], stride[2]};
  } else if (layout == "bhsd") {
    v = {size[0], size[2], size[1], size[3], stride[0], stride[2], stride[1]};
  } else {
    v = {1, size[0], size[1], size[2], 0, stride[0], stride[1]};
  }
  // (with no elements there is no row to read or write: any strides will do, as for torch's own ops)
  POSENC_CHECK(stride[dims - 1] == 1 || size[dims - 1] <= 1 || t.numel() == 0, op, ": ", name,
               " must have a contiguous last dimension (stride 1), got strides ", Dims{stride});
  return v;
}

void fill_operand(RopeOperand& o, const BSHD& src, const Tensor& src_t, const Tensor& dst_t, std::string_view layout,
                  const char* op, const char* name) {
  void* src_data = data_of(op, src_t, name);
  o.src = src_data;
  o.dst = &src_t == &dst_t ? src_data : dst_t.data_ptr();  // in place: one data_ptr call
  o.heads = src.heads;
  o.src_stride_b = src.stride_b;
  o.src_stride_s = src.stride_s;
  o.src_stride_h = src.stride_h;
  const BSHD dst = &src_t == &dst_t ? src : as_bshd(op, dst_t, "output", layout);
  o.dst_stride_b = dst.stride_b;
  o.dst_stride_s = dst.stride_s;
  o.dst_stride_h = dst.stride_h;
}

// Everything but the angle source and the destination: q/k shapes, positions, cu_seqlens.
struct RopeInputs {
  BSHD q, k;
};

RopeInputs check_qk(const char* op, const Tensor& q, const Tensor& k, std::string_view layout) {
  const ScalarType dt = dtype_of(q);
  POSENC_CHECK(is_float_dtype(dt), op, ": q must be float32, float16, bfloat16 or float64, got ", dt);
  POSENC_CHECK(dtype_of(k) == dt, op, ": k must have q's dtype (", dt, "), got ", dtype_of(k));
  check_same_device(op, q, "q", k, "k");
  RopeInputs in{as_bshd(op, q, "q", layout), as_bshd(op, k, "k", layout)};
  POSENC_CHECK(in.k.batch == in.q.batch && in.k.seq == in.q.seq && in.k.head_dim == in.q.head_dim, op,
               ": k must match q in batch, seq and head_dim (it may differ in heads); q ", sizes_of(q), ", k ",
               sizes_of(k));
  return in;
}

// What check_positions learnt: the index tensors as the kernel reads them (kept alive until it has
// run), and the range of the positions it will compute, when known.
struct PositionInfo {
  OptTensor positions, cu_seqlens;
  bool known = false;        // lo/hi below are valid
  int64_t lo = 0, hi = 0;    // of position + offset over all tokens
};

// axes: the rows of an axis layout (inv_freq [axes, rotary_dim / 2]; 0 without one). Positions may
// then carry a leading axis dim of that size ([axes, batch, seq], [axes, tokens]); without it every
// axis gets the same id (text tokens).
void check_positions(const char* op, RopeProblem& p, PositionInfo& info, const Tensor& q, const OptTensor& positions,
                     const OptTensor& cu_seqlens, std::string_view layout, int64_t offset, int64_t axes = 0) {
  p.offset = offset;
  p.domain = position_domain(offset);
  const auto note_range = [&](int64_t lo, int64_t hi, const char* what) {
    checked_position_bound(op, lo, hi, offset, what);  // offset is added without wrapping
    info.known = true;
    info.lo = lo + offset;
    info.hi = hi + offset;
  };
  if (positions.has_value()) {
    const Tensor& pos = *positions;
    check_operand(op, q, "q", pos, "positions");
    const ScalarType dt = dtype_of(pos);
    POSENC_CHECK(dt == ScalarType::Int || dt == ScalarType::Long, op, ": positions must be int32 or int64, got ", dt);
    const bool thd = layout == "thd";
    const bool axis_dim = pos.dim() == (thd ? 2 : 3);  // a leading axis dim
    if (axis_dim) {
      POSENC_CHECK(axes > 0, op, ": positions ", sizes_of(pos), " have an axis dim, but the rotation has no axis ",
                   "layout (inv_freq is 1-D); axis positions need inv_freq [axes, rotary_dim / 2] (an MRoPE or axial ",
                   "config)");
      POSENC_CHECK(pos.size(0) == axes, op, ": positions must have one row per axis of the layout (", axes,
                   " axes: inv_freq has ", axes, " rows), got ", pos.size(0), " rows in shape ", sizes_of(pos));
    }
    const int64_t dims = pos.dim() - (axis_dim ? 1 : 0);  // dims past the axis dim
    std::string axis_text = "[";  // appended, not built with +: GCC 12 warns (-Wrestrict) on the latter
    if (axes > 0) axis_text.append(std::to_string(axes)).append(", ");
    if (thd) {
      POSENC_CHECK(dims == 1 && pos.size(-1) == p.seq, op, ": positions must be [tokens] = [", p.seq, "]",
                   axes > 0 ? " or " + axis_text + "tokens]" : std::string(), " for layout 'thd', got shape ",
                   sizes_of(pos));
    } else {
      const bool ok = (dims == 1 && !axis_dim && pos.size(-1) == p.seq) ||
                      (dims == 2 && (pos.size(-2) == p.batch || pos.size(-2) == 1) && pos.size(-1) == p.seq);
      POSENC_CHECK(ok, op, ": positions must be [seq] = [", p.seq, "] or [batch, seq] = [", p.batch, ", ", p.seq, "]",
                   axes > 0 ? " or " + axis_text + "batch or 1, seq]" : std::string(), ", got shape ",
                   sizes_of(pos));
    }
    // Any strides (the kernels index with them); values checked here when on the host, else by the kernel.
    if (pos.numel() > 0 && host_readable(pos)) {
      const ValueRange r = value_range(pos);
      note_range(r.imin, r.imax, "positions");
    }
    info.positions = pos;
    p.positions = pos.data_ptr();
    p.positions_kind = index_kind(pos);
    p.pos_stride_s = pos.stride(-1);
    p.pos_stride_b = (pos.dim() >= 2 && !(thd && axis_dim) && pos.size(-2) == p.batch) ? pos.stride(-2) : 0;
    p.pos_stride_a = axis_dim ? pos.stride(0) : 0;
  } else {
    POSENC_CHECK(axes <= 1 || layout != "thd", op, ": positions are required for layout 'thd' with an axis layout",
                 " (inv_freq has ", axes, " rows): pass [", axes, ", tokens] positions, or [tokens] for text tokens",
                 " (cu_seqlens alone gives no per-axis positions)");
  }
  if (cu_seqlens.has_value()) {
    const Tensor& cu = *cu_seqlens;
    POSENC_CHECK(layout == "thd", op, ": cu_seqlens is only for layout 'thd', got layout '", layout, "'");
    check_operand(op, q, "q", cu, "cu_seqlens");
    const ScalarType dt = dtype_of(cu);
    POSENC_CHECK(dt == ScalarType::Int || dt == ScalarType::Long, op, ": cu_seqlens must be int32 or int64, got ", dt);
    POSENC_CHECK(cu.dim() == 1 && cu.size(0) >= 2, op, ": cu_seqlens must be 1-D with at least 2 entries, got shape ",
                 sizes_of(cu));
    // A bad table would silently give wrong positions: checked here when on the host, by the kernel
    // on the GPU (RopeProblem::cu_seqlens_entry_ok), whose search in it stays in bounds whatever its
    // values. Within a valid table every sequence is at most the tokens long.
    int64_t longest = p.seq;
    if (host_readable(cu)) {
      const Tensor host = as_contiguous(to_cpu(cu, ScalarType::Long));
      const int64_t* v = static_cast<const int64_t*>(host.data_ptr());
      const int64_t n = host.size(0);
      POSENC_CHECK(v[0] == 0, op, ": cu_seqlens must start at 0, got ", v[0]);
      longest = 0;
      for (int64_t i = 1; i < n; ++i) {
        POSENC_CHECK(v[i] >= v[i - 1], op, ": cu_seqlens must be non-decreasing, got ", v[i - 1], " then ", v[i],
                     " at index ", i);
        longest = std::max(longest, v[i] - v[i - 1]);
      }
      POSENC_CHECK(v[n - 1] == p.seq, op, ": cu_seqlens must end at the number of tokens ", p.seq, ", got ", v[n - 1]);
    }
    // The kernels index cu_seqlens as a dense array: a strided one is copied (it is tiny). They
    // read it for the positions within each sequence when no positions are given, and on the GPU
    // check it in any case.
    info.cu_seqlens = cu.stride(0) == 1 ? cu : torch::stable::contiguous(cu);
    p.cu_seqlens = info.cu_seqlens->data_ptr();
    p.cu_seqlens_kind = index_kind(*info.cu_seqlens);
    p.n_seqs = cu.size(0) - 1;
    if (!positions.has_value() && longest > 0) note_range(0, longest - 1, "positions within each sequence");
  } else if (!positions.has_value() && p.seq > 0) {
    note_range(0, p.seq - 1, "positions 0 .. seq-1");
  }
}

// The angle domain for frequencies: |position * inv_freq[i]| <= 2^50, checked here for frequencies on
// the host; on the GPU the kernel checks every angle it forms (core/rope_chunks.h).
void check_angle_domain(const char* op, const Tensor& inv64, const PositionInfo& info) {
  if (!host_readable(inv64)) return;
  const double bound = info.known ? std::max(std::abs(static_cast<double>(info.lo)), std::abs(static_cast<double>(info.hi)))
                                  : 0.0;
  // w: the largest sum over axes of |inv_freq[a][i]| (one axis: the largest |inv_freq[i]|).
  const double* v = static_cast<const double*>(data_of(op, inv64, "inv_freq"));
  const int64_t pairs = inv64.size(-1), axes = inv64.numel() / pairs;
  double w = -1;
  if (axes == 1) {
    // One axis, every decode call: four partial maxima and the finite test folded in (no branch
    // per entry), a quarter of the loop below's dependency chain, ~60 ns less per call. A
    // non-finite entry falls through to the loop below, which names it.
    double part[4] = {0, 0, 0, 0};
    bool finite = true;
    for (int64_t i = 0; i < pairs; ++i) {
      const double f = std::abs(v[i]);
      finite &= f <= std::numeric_limits<double>::max();  // false for inf and NaN
      part[i & 3] = std::max(part[i & 3], f);
    }
    if (finite) w = std::max(std::max(part[0], part[1]), std::max(part[2], part[3]));
  }
  if (w < 0) {
    w = 0;
    for (int64_t i = 0; i < pairs; ++i) {
      double sum = 0;
      for (int64_t a = 0; a < axes; ++a) {
        const double f = v[a * pairs + i];
        POSENC_CHECK(std::isfinite(f), op, ": inv_freq must be finite, got ", f, " at index ", a * pairs + i);
        sum += std::abs(f);
      }
      w = std::max(w, sum);
    }
  }
  POSENC_CHECK(bound * w <= kMaxAngle, op, ": position * inv_freq must stay within 2^50 rad (the supported angle ",
               "domain); the largest |position + offset| is ", bound, " and the largest frequency ", w);
}

// In place: q and k are written while being read, so neither may hold an element twice, they may
// not share memory with each other, and nothing the kernel reads may live in them. Views of one
// fused qkv buffer (q and k rows interleaved, no element shared) are fine. The overlap tests are
// exact (host/overlap.h); a layout too irregular to decide counts as overlapping. (Inference
// tensors outside inference mode are refused before this, in Python: posenc_native/ops.py.)
void check_inplace_outputs(const char* op, const Tensor& q, const Tensor& k) {
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{q, "q"}, {k, "k"}}) {
    const overlap::Answer a = overlap::internal(t);
    POSENC_CHECK(a == overlap::Answer::No, op, ": ", name, " must not have elements that share memory (an expanded or",
                 " self-overlapping view, strides ", strides_of(t), ") when rotated in place",
                 a == overlap::Answer::Unknown ? " (its layout is too irregular to prove it has none)" : "",
                 "; rotate a contiguous copy");
  }
  const overlap::Answer a = overlap::tensors(q, k);
  POSENC_CHECK(a == overlap::Answer::No, op, ": q and k must not share memory when rotated in place",
               a == overlap::Answer::Unknown ? " (their layouts are too irregular to prove they do not)" : "");
}

void check_inputs_apart(const char* op, const Tensor& q, const Tensor& k,
                        std::initializer_list<std::pair<const OptTensor*, const char*>> inputs) {
  for (const auto& [t, name] : inputs) {
    if (!t->has_value()) continue;
    for (const auto& [out, out_name] : {std::pair<const Tensor&, const char*>{q, "q"}, {k, "k"}}) {
      const overlap::Answer a = overlap::tensors(**t, out);
      POSENC_CHECK(a == overlap::Answer::No, op, ": ", name, " must not share memory with ", out_name,
                   ", which is rotated in place; pass a copy");
    }
  }
}

Tensor check_inv_freq(const char* op, const Tensor& q, const Tensor& inv_freq, int64_t head_dim,
                      double attention_factor) {
  check_same_device(op, q, "q", inv_freq, "inv_freq");
  POSENC_CHECK((inv_freq.dim() == 1 || inv_freq.dim() == 2) && inv_freq.numel() >= 1, op,
               ": inv_freq must be [rotary_dim / 2] or, for an axis layout, [axes, rotary_dim / 2], with at least one ",
               "entry, got shape ", sizes_of(inv_freq));
  const ScalarType dt = dtype_of(inv_freq);
  POSENC_CHECK(dt == ScalarType::Float || dt == ScalarType::Double, op, ": inv_freq must be float32 or float64, got ", dt);
  POSENC_CHECK(2 * inv_freq.size(-1) <= head_dim, op, ": inv_freq has ", inv_freq.size(-1),
               " frequencies (rotary_dim ", 2 * inv_freq.size(-1), ") but head_dim is ", head_dim);
  POSENC_CHECK(std::isfinite(attention_factor), op, ": attention_factor must be finite, got ", attention_factor);
  if (dt == ScalarType::Double && inv_freq.is_contiguous()) return inv_freq;
  return as_contiguous(to_dtype(inv_freq, ScalarType::Double));
}

// What both angle sources do first: q/k checks, the in-place output rules, the problem's sizes.
struct RopeStart {
  RopeInputs in;
  bool in_place;
  RopeProblem p;
};

RopeStart start_rope(const char* op, const Tensor& q, const Tensor& k, const Tensor* dst_q, std::string_view layout) {
  RopeStart s{check_qk(op, q, k, layout), dst_q == nullptr, RopeProblem{}};
  if (s.in_place) check_inplace_outputs(op, q, k);
  s.p.batch = s.in.q.batch;
  s.p.seq = s.in.q.seq;
  s.p.head_dim = s.in.q.head_dim;
  return s;
}

// ... and last: the operands (fresh outputs, or q and k in place), then the backend's runner.
void finish_rope(const char* op, RopeStart& s, const Tensor& q, const Tensor& k, const Tensor* dst_q,
                 const Tensor* dst_k, std::string_view layout, const Backend& backend) {
  RopeProblem& p = s.p;
  p.copy_passthrough = !s.in_place && p.rot_dim < p.head_dim;
  fill_operand(p.q, s.in.q, q, s.in_place ? q : *dst_q, layout, op, "q");
  fill_operand(p.k, s.in.k, k, s.in_place ? k : *dst_k, layout, op, "k");
  // (no head in q or k: nothing to rotate, so no angle is formed; CPU positions were checked above)
  if (p.batch * p.seq > 0 && p.head_dim > 0 && p.q.heads + p.k.heads > 0) backend.rope(p, dtype_of(q));
}

// Validates, then rotates by frequencies into (dst_q, dst_k): fresh outputs, or q and k in place.
void rope_frequency(const char* op, const RopeArgs& a, const Tensor* dst_q, const Tensor* dst_k,
                    const Backend& backend) {
  RopeStart s = start_rope(op, a.q, a.k, dst_q, a.layout);
  RopeProblem& p = s.p;
  PositionInfo info;
  const OptTensor inv64 = check_inv_freq(op, a.q, a.inv_freq, s.in.q.head_dim, a.attention_factor);
  check_positions(op, p, info, a.q, a.positions, a.cu_seqlens, a.layout, a.offset,
                  inv64->dim() == 2 ? inv64->size(0) : 0);
  check_angle_domain(op, *inv64, info);
  if (s.in_place) {
    check_inputs_apart(op, a.q, a.k,
                       {{&info.positions, "positions"}, {&info.cu_seqlens, "cu_seqlens"}, {&inv64, "inv_freq"}});
  }
  p.rot_dim = 2 * inv64->size(-1);
  p.n_axes = inv64->dim() == 2 ? inv64->size(0) : 1;
  p.interleaved = a.interleaved;
  p.inverse = a.inverse;
  p.inv_freq = static_cast<const double*>(data_of(op, *inv64, "inv_freq"));
  p.attention_factor = a.attention_factor;
  finish_rope(op, s, a.q, a.k, dst_q, dst_k, a.layout, backend);
}

}  // namespace

std::tuple<Tensor, Tensor> rope_op(const RopeArgs& a, const Backend& backend) {
  if (!rows_contiguous(a.q) || !rows_contiguous(a.k)) return rope_op(with_contiguous_rows(a), backend);
  Tensor q_out = new_empty_like(a.q), k_out = new_empty_like(a.k);
  rope_frequency("posenc.rope", a, &q_out, &k_out, backend);
  return {q_out, k_out};
}

void rope__op(const RopeArgs& a, const Backend& backend) {
  rope_frequency("posenc.rope_", a, nullptr, nullptr, backend);
}

Tensor rope_in_place_check_op(const RopeInPlaceCheckArgs& a, const Backend&) {
  check_inplace_outputs("posenc.rope_", a.q, a.k);
  return torch::stable::clone(a.inv_freq);
}

namespace {

// cos/sin given as [S, R], [B or 1, S, R], or (with positions) [rows, R] gathered by position.
// Returns the tables in q's dtype (a no-op when they already are).
std::pair<OptTensor, OptTensor> cos_sin_problem(const char* op, RopeProblem& p, const RopeCosSinArgs& a,
                                                const RopeInputs& in, PositionInfo& info) {
  const Tensor& q = a.q;
  check_operand(op, q, "q", a.cos, "cos");
  check_operand(op, q, "q", a.sin, "sin");
  POSENC_CHECK(a.cos.dim() >= 2 && a.cos.dim() <= 3, op, ": cos must be [seq, rotary_dim] or [batch, seq, rotary_dim]",
               ", got shape ", sizes_of(a.cos));
  POSENC_CHECK(a.cos.sizes().equals(a.sin.sizes()), op, ": cos and sin must have the same shape, got ",
               sizes_of(a.cos), " and ", sizes_of(a.sin));
  POSENC_CHECK(is_float_dtype(dtype_of(a.cos)) && is_float_dtype(dtype_of(a.sin)), op,
               ": cos and sin must be floating point, got ", dtype_of(a.cos), " and ", dtype_of(a.sin));
  const int64_t rot = a.cos.size(-1);
  POSENC_CHECK(rot >= 2 && rot % 2 == 0 && rot <= in.q.head_dim, op,
               ": cos/sin last dim is the rotary dim; it must be even and in [2, head_dim = ", in.q.head_dim, "], got ",
               rot);
  const ScalarType dt = dtype_of(q);
  Tensor cos = dtype_of(a.cos) == dt ? a.cos : to_dtype(a.cos, dt);
  Tensor sin = dtype_of(a.sin) == dt ? a.sin : to_dtype(a.sin, dt);
  // The kernels read both tables with cos's row strides and a contiguous last dim: any other
  // layout is copied to a contiguous one (a table is small next to q and k).
  if (cos.stride(-1) != 1 || !sin.strides().equals(cos.strides())) {
    cos = torch::stable::contiguous(cos);
    sin = torch::stable::contiguous(sin);
  }
  p.rot_dim = rot;
  p.cos = cos.data_ptr();
  p.sin = sin.data_ptr();
  if (a.positions.has_value()) {
    POSENC_CHECK(cos.dim() == 2, op,
                 ": with positions, cos and sin must be tables [max_positions, rotary_dim], got shape ", sizes_of(cos));
    check_positions(op, p, info, q, a.positions, std::nullopt, a.layout, 0);
    // Gathered rows must exist: checked here for positions on the host, by the kernel on the GPU
    // (RopeProblem::cos_sin_row, which also clamps the row: a bad position never reads out of bounds).
    if (info.known) {
      POSENC_CHECK(info.lo >= 0 && info.hi < cos.size(0), op, ": positions must be in [0, ", cos.size(0),
                   ") to index cos/sin, got [", info.lo, ", ", info.hi, "]");
    }
    p.cs_by_position = true;
    p.cs_rows = cos.size(0);
    p.cs_stride_s = cos.stride(0);
  } else if (cos.dim() == 2) {
    POSENC_CHECK(cos.size(0) == in.q.seq, op, ": cos must have seq = ", in.q.seq, " rows, got shape ", sizes_of(cos));
    p.cs_stride_b = 0;
    p.cs_stride_s = cos.stride(0);
  } else {
    POSENC_CHECK((cos.size(0) == in.q.batch || cos.size(0) == 1) && cos.size(1) == in.q.seq, op,
                 ": cos must be [batch = ", in.q.batch, " or 1, seq = ", in.q.seq, ", rotary_dim], got shape ",
                 sizes_of(cos));
    p.cs_stride_b = cos.size(0) == 1 ? 0 : cos.stride(0);
    p.cs_stride_s = cos.stride(1);
  }
  return {cos, sin};
}

// Validates, then rotates by a cos/sin table into (dst_q, dst_k): fresh outputs, or q and k in place.
void rope_table(const char* op, const RopeCosSinArgs& a, const Tensor* dst_q, const Tensor* dst_k,
                const Backend& backend) {
  RopeStart s = start_rope(op, a.q, a.k, dst_q, a.layout);
  RopeProblem& p = s.p;
  PositionInfo info;
  const auto tables = cos_sin_problem(op, p, a, s.in, info);  // keeps converted tables alive
  if (s.in_place) {
    check_inputs_apart(op, a.q, a.k, {{&tables.first, "cos"}, {&tables.second, "sin"}, {&info.positions, "positions"}});
  }
  p.inverse = a.inverse;
  finish_rope(op, s, a.q, a.k, dst_q, dst_k, a.layout, backend);
}

}  // namespace

std::tuple<Tensor, Tensor> rope_cos_sin_op(const RopeCosSinArgs& a, const Backend& backend) {
  if (!rows_contiguous(a.q) || !rows_contiguous(a.k)) return rope_cos_sin_op(with_contiguous_rows(a), backend);
  Tensor q_out = new_empty_like(a.q), k_out = new_empty_like(a.k);
  rope_table("posenc.rope_cos_sin", a, &q_out, &k_out, backend);
  return {q_out, k_out};
}

void rope_cos_sin__op(const RopeCosSinArgs& a, const Backend& backend) {
  rope_table("posenc.rope_cos_sin_", a, nullptr, nullptr, backend);
}

}  // namespace posenc
