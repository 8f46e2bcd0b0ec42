// The torch API of the host code and the backends: LibTorch's stable ABI only (torch/csrc/stable,
// torch/headeronly), so one build of the library loads into every torch from its target version on
// (CMakeLists.txt, POSENC_TORCH_TARGET). No c10/ATen header is included anywhere in csrc.
#pragma once
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <optional>
#include <ostream>
#include <sstream>
#include <stdexcept>

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
inline Tensor empty(std::initializer_list<int64_t> sizes, ScalarType dtype, const Tensor& like) {
  return torch::stable::empty(torch::headeronly::IntHeaderOnlyArrayRef(sizes.begin(), sizes.size()), dtype,
                              std::nullopt, like.device());
}
inline Tensor empty(torch::headeronly::IntHeaderOnlyArrayRef sizes, ScalarType dtype, const Tensor& like) {
  return torch::stable::empty(sizes, dtype, std::nullopt, like.device());
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
