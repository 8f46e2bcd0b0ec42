// The direct entry (csrc/direct_entry.h; docs/architecture.md, "The direct entry"): an op's kernel
// called with Python tensors by the Python package's decode fast path, without the dispatcher's
// argument boxing. The op's arguments are its struct (registration.h) filled from a PosencArg array
// instead of the dispatcher's stack; everything after that (the host checks, the runners) is the
// dispatcher path's own code.
#pragma once
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "direct_entry.h"
#include "host/backend.h"  // lead_tensor, POSENC_OPS

// torch's Python interop shims (torch/csrc/stable/c/shim.h, torch >= 2.14), declared weak here: the
// library targets an older torch (CMakeLists.txt, POSENC_TORCH_TARGET), where they are absent (null)
// and posenc_direct_kernel_v1 answers NULL. They live in libtorch and need libtorch_python loaded, which
// a Python caller has; the library itself links no Python.
extern "C" {
__attribute__((weak)) AOTITorchError torch_tensor_from_pyobject(void* py_obj, AtenTensorHandle* ret);
__attribute__((weak)) AOTITorchError torch_tensor_to_pyobject(AtenTensorHandle ath, void* py_type, void** ret);
}

namespace posenc::direct {

// An argument the kernel does not take in this form: the call is declined (direct::kernel).
struct Declined {};

// The schema argument of type T from a PosencArg, or Declined.
template <typename T>
T get(const PosencArg& a) {
  if constexpr (std::is_same_v<T, Tensor>) {
    AtenTensorHandle h = nullptr;
    if (a.tag != POSENC_ARG_TENSOR || torch_tensor_from_pyobject(a.v.tensor, &h) != AOTI_TORCH_SUCCESS) throw Declined{};
    Tensor t(h);
    // the CPU backend's strided kernel; anything else (another device, an MKLDNN or sparse tensor, which
    // the dispatcher refuses) goes to the dispatcher
    int32_t layout = -1;
    if (!t.device().is_cpu() || aoti_torch_get_layout(h, &layout) != AOTI_TORCH_SUCCESS ||
        layout != aoti_torch_layout_strided()) {
      throw Declined{};
    }
    return t;
  } else if constexpr (std::is_same_v<T, OptTensor>) {
    return a.tag == POSENC_ARG_NONE ? OptTensor() : OptTensor(get<Tensor>(a));
  } else if constexpr (std::is_same_v<T, int64_t>) {
    if (a.tag != POSENC_ARG_INT) throw Declined{};
    return a.v.i;
  } else if constexpr (std::is_same_v<T, double>) {  // an int where the schema says float, as torch allows
    if (a.tag != POSENC_ARG_FLOAT && a.tag != POSENC_ARG_INT) throw Declined{};
    return a.tag == POSENC_ARG_INT ? static_cast<double>(a.v.i) : a.v.f;
  } else if constexpr (std::is_same_v<T, bool>) {
    if (a.tag != POSENC_ARG_BOOL) throw Declined{};
    return a.v.i != 0;
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (a.tag != POSENC_ARG_STR) throw Declined{};
    return std::string(a.v.s);
  } else if constexpr (std::is_same_v<T, ScalarType>) {
    if (a.tag != POSENC_ARG_DTYPE) throw Declined{};
    switch (a.v.i) {
      case POSENC_DTYPE_FLOAT16: return ScalarType::Half;
      case POSENC_DTYPE_BFLOAT16: return ScalarType::BFloat16;
      case POSENC_DTYPE_FLOAT32: return ScalarType::Float;
      case POSENC_DTYPE_FLOAT64: return ScalarType::Double;
      default: throw Declined{};
    }
  } else {
    static_assert(std::is_same_v<T, std::optional<ScalarType>>, "an argument kind the direct entry cannot take");
    return a.tag == POSENC_ARG_NONE ? std::optional<ScalarType>() : std::optional<ScalarType>(get<ScalarType>(a));
  }
}

inline int put(void** outputs, const Tensor& t) {
  return torch_tensor_to_pyobject(t.get(), nullptr, &outputs[0]) == AOTI_TORCH_SUCCESS ? 1 : -1;
}
inline int put(void** outputs, const std::tuple<Tensor, Tensor>& t) {
  if (put(outputs, std::get<0>(t)) < 0) return -1;
  return put(outputs + 1, std::get<1>(t)) < 0 ? -1 : 2;  // (the first output's reference leaks then)
}

// Holds the GIL released while a kernel with more than a few microseconds of work runs, as torch's
// own op calls from Python do (releasing it costs ~0.13 us, as much as a tenth of a decode step's call).
constexpr int64_t kReleaseGilFromElements = int64_t{1} << 16;

class GilReleased {
 public:
  GilReleased(const PosencGil* gil, bool worth_it)
      : gil_(worth_it ? gil : nullptr), state_(gil_ ? gil_->release() : nullptr) {}
  ~GilReleased() { reacquire(); }
  void reacquire() {
    if (gil_ != nullptr) gil_->reacquire(state_), gil_ = nullptr;
  }

 private:
  const PosencGil* gil_;
  void* state_;
};

// The elements a call writes that its tensor arguments do not count: the biases' outputs, made from
// a small table (weight or slopes), so that a large one is written with the GIL released too.
inline int64_t made_elements(const auto&) { return 0; }
inline int64_t output_elements(const Tensor& table, int64_t heads_dim, int64_t query_length, int64_t key_length) {
  int64_t n = 0;
  if (table.dim() <= heads_dim || __builtin_mul_overflow(table.size(heads_dim), query_length, &n) ||
      __builtin_mul_overflow(n, key_length, &n)) {
    return 0;  // a table or sizes the op refuses
  }
  return std::min(n, kReleaseGilFromElements);  // (all that matters; no overflow when added to)
}
inline int64_t made_elements(const RelativeBiasArgs& a) {
  return output_elements(a.weight, 1, a.query_length, a.key_length);
}
inline int64_t made_elements(const AlibiArgs& a) { return output_elements(a.slopes, 0, a.query_length, a.key_length); }

// The direct kernel of one op on one backend (the counterpart of backend.h's boxed_kernel).
template <typename Args, auto Op, const Backend& kBackend>
int kernel(const PosencArg* args, int64_t nargs, int64_t lead_last_dim, void** outputs, const PosencGil* gil) noexcept {
  try {
    if (nargs != static_cast<int64_t>(Args::count)) return -1;
    int64_t i = 0;
    const Args a = Args::make([&]<typename T>() { return get<T>(args[i++]); });
    int64_t elements = made_elements(a);
    a.visit([&](const auto& field) {
      if constexpr (std::is_same_v<std::decay_t<decltype(field)>, Tensor>) elements += field.numel();
    });
    if (lead_last_dim > 0) {
      const Tensor& lead = ::posenc::detail::lead_tensor(a);
      if (lead.dim() == 0 || lead.size(-1) != lead_last_dim) return -1;
    }
    GilReleased released(gil, elements >= kReleaseGilFromElements);
    if constexpr (std::is_void_v<decltype(Op(a, kBackend))>) {
      Op(a, kBackend);
      return 0;
    } else {
      const auto out = Op(a, kBackend);
      released.reacquire();
      return put(outputs, out);
    }
  } catch (...) {  // Declined, or an argument the op refused: the general path raises the error
    return -1;
  }
}

// posenc_direct_kernel_v1 for a backend: the kernel of the op named op_name.
template <const Backend& kBackend>
PosencDirectKernel kernel_named(const char* op_name) {
  if (torch_tensor_from_pyobject == nullptr || torch_tensor_to_pyobject == nullptr) return nullptr;
#define POSENC_DIRECT(name, Args, ...) \
  if (std::strcmp(op_name, #name) == 0) return &kernel<Args, &name##_op, kBackend>;
  POSENC_OPS(POSENC_DIRECT)
#undef POSENC_DIRECT
  return nullptr;
}

}  // namespace posenc::direct
