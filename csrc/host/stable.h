// The torch API of the host code and the backends: LibTorch's stable ABI only (torch/csrc/stable,
// torch/headeronly), so one build of the library loads into every torch from its target version on
// (CMakeLists.txt, POSENC_TORCH_TARGET). No c10/ATen header is included anywhere in csrc.
#pragma once
#include <torch/csrc/stable/macros.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <algorithm>
#include <array>
#include <optional>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace posenc {

using Tensor = torch::stable::Tensor;
using OptTensor = std::optional<Tensor>;
using ScalarType = torch::headeronly::ScalarType;
using Device = torch::stable::Device;

// A failed argument check: the message alone (torch reports it as a RuntimeError), without the
// file/line prefix that STD_TORCH_CHECK adds, as TORCH_CHECK's messages read.
template <typename... A>
[[noreturn]] void fail(const A&... parts) {
  std::ostringstream s;
  (s << ... << parts);
  throw std::runtime_error(s.str());
}

}  // namespace posenc

// The message parts are evaluated only when the check fails.
#define POSENC_CHECK(cond, ...)                          \
  do {                                                   \
    if (__builtin_expect(!(cond), 0)) ::posenc::fail(__VA_ARGS__); \
  } while (0)

namespace posenc {

// Printing sizes/strides ("[2, 3]") and devices ("cpu", "cuda:0") in messages, as ATen prints them.
struct Dims {
  torch::headeronly::IntHeaderOnlyArrayRef v;
};
inline std::ostream& operator<<(std::ostream& o, const Dims& d) {
  o << '[';
  for (size_t i = 0; i < d.v.size(); ++i) o << (i ? ", " : "") << d.v[i];
  return o << ']';
}
inline Dims sizes_of(const Tensor& t) { return {t.sizes()}; }
inline Dims strides_of(const Tensor& t) { return {t.strides()}; }

struct DeviceText {
  Device d;
};
inline std::ostream& operator<<(std::ostream& o, const DeviceText& t) {
  if (t.d.is_cpu()) return o << "cpu";
  o << (t.d.is_cuda() ? "cuda" : "device") ;
  if (t.d.has_index()) o << ':' << static_cast<int>(t.d.index());
  return o;
}
inline DeviceText device_of(const Tensor& t) { return {t.device()}; }

// The dtypes these ops take, with the shim's code of each, read once (most frequent first):
// dtype_of and dtype_code look them up here.
struct DtypeCode {
  ScalarType type;
  int32_t code;
};
inline const std::array<DtypeCode, 6>& dtype_codes() {
  static const std::array<DtypeCode, 6> codes{{{ScalarType::Float, aoti_torch_dtype_float32()},
                                               {ScalarType::BFloat16, aoti_torch_dtype_bfloat16()},
                                               {ScalarType::Half, aoti_torch_dtype_float16()},
                                               {ScalarType::Long, aoti_torch_dtype_int64()},
                                               {ScalarType::Int, aoti_torch_dtype_int32()},
                                               {ScalarType::Double, aoti_torch_dtype_float64()}}};
  return codes;
}

// t.scalar_type(), without torch::stable's general conversion (a chain of a dozen shim calls per
// lookup, ~5% of a decode call's host work).
inline ScalarType dtype_of(const Tensor& t) {
  int32_t code = 0;
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_dtype(t.get(), &code));
  for (const DtypeCode& d : dtype_codes()) {
    if (d.code == code) return d.type;
  }
  return t.scalar_type();  // another dtype: an argument about to be refused
}

inline bool is_float_dtype(ScalarType t) {
  return t == ScalarType::Float || t == ScalarType::Half || t == ScalarType::BFloat16 || t == ScalarType::Double;
}
inline bool is_floating(ScalarType t) { return is_float_dtype(t) || t == ScalarType::Float8_e4m3fn ||
                                               t == ScalarType::Float8_e5m2 || t == ScalarType::Float8_e4m3fnuz ||
                                               t == ScalarType::Float8_e5m2fnuz; }
inline bool is_integral(ScalarType t) {
  return t == ScalarType::Byte || t == ScalarType::Char || t == ScalarType::Short || t == ScalarType::Int ||
         t == ScalarType::Long || t == ScalarType::UInt16 || t == ScalarType::UInt32 || t == ScalarType::UInt64;
}

inline bool same_device(const Tensor& a, const Tensor& b) { return a.device() == b.device(); }

// Tensor ops through the stable ABI (torch::stable, the dispatcher).
inline Tensor to_dtype(const Tensor& t, ScalarType dtype) {
  return torch::stable::to(t, std::optional<ScalarType>(dtype));
}
inline Tensor to_cpu(const Tensor& t, ScalarType dtype) {
  return torch::stable::to(t, std::optional<ScalarType>(dtype), std::nullopt,
                           Device(torch::headeronly::DeviceType::CPU));
}
inline Tensor as_contiguous(const Tensor& t) { return t.is_contiguous() ? t : torch::stable::contiguous(t); }

// A new tensor of these sizes and strides, dtype (the shim's code) and like's device, through the
// direct allocation shim: torch::stable's ops are boxed dispatcher calls that look the op up by name
// (aten::empty: ~1 us, a fifth of a decode-size bias call; benchmarks/RESULTS.md).
inline Tensor empty_strided_like(torch::headeronly::IntHeaderOnlyArrayRef size, const int64_t* stride, int32_t dtype,
                                 const Tensor& like) {
  int32_t device_type = 0, device_index = 0;
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_type(like.get(), &device_type));
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_index(like.get(), &device_index));
  AtenTensorHandle out = nullptr;
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(static_cast<int64_t>(size.size()), size.data(), stride,
                                                         dtype, device_type, device_index, &out));
  return Tensor(out);
}

// The shim's code of a dtype these ops make (dtype_of's inverse), or -1 for another.
inline int32_t dtype_code(ScalarType t) {
  for (const DtypeCode& d : dtype_codes()) {
    if (d.type == t) return d.code;
  }
  return -1;
}

// A tensor without data (a ZeroTensor, torch._efficientzerotensor) reaches a kernel only past the
// dispatcher's fallback (the Python fast path, a redispatch): refused before any read or write.
inline void check_has_data(const char* op, const Tensor& t, const char* name) {
  POSENC_CHECK(t.data_ptr() != nullptr || t.numel() == 0, op, ": ", name,
               " has no data (a ZeroTensor?); materialize it (e.g. .clone()) first");
}

// Refuses an output whose size in bytes int64 does not count (aten's allocator would say only
// "Storage size calculation overflowed"): `shape` names its dimensions for the message, as
// "[1, heads, query_length, key_length]".
inline void check_output_size(const char* op, const char* shape, std::initializer_list<int64_t> sizes,
                              ScalarType dtype) {
  int64_t bytes = dtype == ScalarType::Double ? 8 : dtype == ScalarType::Float ? 4 : 2;  // the float dtypes
  for (const int64_t n : sizes) {
    POSENC_CHECK(!__builtin_mul_overflow(bytes, std::max<int64_t>(n, 0), &bytes), op, ": the output ", shape, " = ",
                 Dims{sizes}, " of ", dtype, " has more than 2^63 bytes");
  }
}

// torch.empty(sizes, dtype=dtype, device=like.device()): row-major, strides as ATen computes them
// (a dim of size 0 counts as 1). Sizes that are negative or overflow, and other dtypes, go to
// aten::empty itself, which explains them.
inline Tensor empty(torch::headeronly::IntHeaderOnlyArrayRef sizes, ScalarType dtype, const Tensor& like) {
  constexpr size_t kMaxDims = 16;
  int64_t strides[kMaxDims];
  int64_t step = 1;
  const int32_t code = dtype_code(dtype);
  bool direct = sizes.size() <= kMaxDims && code >= 0;
  for (size_t d = sizes.size(); direct && d-- > 0;) {
    strides[d] = step;
    direct = sizes[d] >= 0 && !__builtin_mul_overflow(step, std::max<int64_t>(sizes[d], 1), &step);
  }
  if (!direct) return torch::stable::empty(sizes, dtype, std::nullopt, like.device());
  return empty_strided_like(sizes, strides, code, like);
}
inline Tensor empty(std::initializer_list<int64_t> sizes, ScalarType dtype, const Tensor& like) {
  return empty(torch::headeronly::IntHeaderOnlyArrayRef(sizes.begin(), sizes.size()), dtype, like);
}

// Every element at its own address with no gaps between them (some permutation of the dims is
// row-major): ATen's is_non_overlapping_and_dense.
inline bool non_overlapping_and_dense(const Tensor& t) {
  const auto size = t.sizes();
  const auto stride = t.strides();
  std::pair<int64_t, int64_t> dims[16];  // (stride, size) of the dims with size != 1
  size_t n = 0;
  for (size_t d = 0; d < size.size(); ++d) {
    if (size[d] == 1) continue;
    if (n == 16) return false;  // never for the tensors of these ops; answer "no" rather than guess
    dims[n++] = {stride[d], size[d]};
  }
  std::sort(dims, dims + n);
  int64_t expected = 1;
  for (size_t i = 0; i < n; ++i) {
    if (dims[i].first != expected) return false;
    expected *= dims[i].second;
  }
  return true;
}

// torch.empty_like(t). For a non-overlapping dense t, ATen's empty_like is empty_strided with t's
// sizes and strides: made here through the direct allocation shim, which skips a boxed dispatcher
// call (a decode step's outputs are small, so that call is a visible part of its cost). Any other
// t goes to aten::empty_like itself.
inline Tensor new_empty_like(const Tensor& t) {
  if (!non_overlapping_and_dense(t)) return torch::stable::empty_like(t);
  int32_t dtype = 0;
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_dtype(t.get(), &dtype));
  return empty_strided_like(t.sizes(), t.strides().data(), dtype, t);
}

// An output like t for kernels that write rows with a contiguous last dim: t's layout when its last
// dim is contiguous (dense t keeps its strides), else row-major. ops.py's fake kernels mirror this.
inline Tensor new_rows_like(const Tensor& t) {
  return t.stride(-1) == 1 ? new_empty_like(t) : empty(t.sizes(), dtype_of(t), t);
}

// The dtype of element type T (float, double, c10::Half, c10::BFloat16).
template <typename F>
void dispatch_float_types(ScalarType t, const char* op, F&& f) {
  switch (t) {
    case ScalarType::Float: f(float{}); break;
    case ScalarType::Double: f(double{}); break;
    case ScalarType::Half: f(c10::Half{}); break;
    case ScalarType::BFloat16: f(c10::BFloat16{}); break;
    default: fail(op, ": unsupported dtype ", t);
  }
}

}  // namespace posenc
