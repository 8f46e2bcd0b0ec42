// CPU helpers: run a functor templated on the element type of a tensor dtype.
#pragma once
#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

namespace posenc::cpu {

template <typename F>
void dispatch_float_types(at::ScalarType t, const char* op, F&& f) {
  switch (t) {
    case at::kFloat: f(float{}); break;
    case at::kDouble: f(double{}); break;
    case at::kHalf: f(c10::Half{}); break;
    case at::kBFloat16: f(c10::BFloat16{}); break;
    default: TORCH_CHECK(false, op, ": unsupported dtype ", t);
  }
}

}  // namespace posenc::cpu
