// What a backend (csrc/cpu, csrc/cuda) shares: the registration of every op's kernel through the
// stable ABI. A backend supplies only its Backend (runners) and its device guard; the argument
// handling is csrc/host's, the same for every device, and the arguments arrive as the op's struct
// (registration.h), unboxed once from the dispatcher's stack.
#pragma once
#include <torch/csrc/stable/library.h>

#include <tuple>
#include <type_traits>

#include "host/bias_plan.h"
#include "host/plan.h"

namespace posenc {

// The runners each backend defines in its own namespace (csrc/cpu/kernels.h, csrc/cuda/kernels.h)
// and lists in its Backend (host/plan.h): one list, so a new op's runner is declared once.
#define POSENC_DECLARE_RUNNERS                                                         \
  void run_sinusoidal(const SinusoidalProblem& p, ScalarType dtype);                   \
  void run_rope(const RopeProblem& p, ScalarType dtype);                               \
  void run_bucket(const BucketProblem& p);                                             \
  void run_relative_bias(const RelativeBiasProblem& p, ScalarType dtype);              \
  void run_relative_bias_grad(const RelativeBiasGradProblem& p, ScalarType dtype);

struct NoDeviceGuard {
  explicit NoDeviceGuard(const Tensor&) {}
};

namespace detail {

// The first tensor argument: its device is the one the kernel runs on (every op has one).
template <typename Args>
const Tensor& lead_tensor(const Args& a) {
  const Tensor* lead = nullptr;
  a.visit([&](const auto& v) {
    if constexpr (std::is_same_v<std::decay_t<decltype(v)>, Tensor>) {
      if (lead == nullptr) lead = &v;
    }
  });
  return *lead;
}

inline void box(StableIValue* stack, Tensor t) { stack[0] = torch::stable::detail::from(std::move(t)); }
inline void box(StableIValue* stack, std::tuple<Tensor, Tensor> t) {
  stack[0] = torch::stable::detail::from(std::move(std::get<0>(t)));
  stack[1] = torch::stable::detail::from(std::move(std::get<1>(t)));
}

// The boxed kernel of one op on one backend: the stable ABI's calling convention (inputs on the
// stack, owned by the kernel; outputs written back in their place).
template <typename Args, auto Op, const Backend& kBackend, typename Guard>
void boxed_kernel(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  POSENC_CHECK(num_args == Args::count, "posenc: the registered schema has ", num_args, " arguments, the kernel ",
               Args::count);
  const Args a = Args::unbox(stack);
  const Guard guard(lead_tensor(a));
  if constexpr (std::is_void_v<decltype(Op(a, kBackend))>) {
    Op(a, kBackend);
  } else {
    box(stack, Op(a, kBackend));
  }
}

}  // namespace detail

// m.impl of every op (registration.h, POSENC_OPS) for one dispatch key: name_op of csrc/host, run
// on this backend.
template <const Backend& kBackend, typename Guard>
void register_kernels(torch::stable::detail::StableLibrary& m) {
#define POSENC_IMPL(name, Args, returns, module, ...) \
  m.impl(#name, &detail::boxed_kernel<Args, &name##_op, kBackend, Guard>);
  POSENC_OPS(POSENC_IMPL)
#undef POSENC_IMPL
}

}  // namespace posenc
