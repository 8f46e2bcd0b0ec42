// CPU helpers: run a functor templated on the element type of a tensor dtype.
#pragma once
#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

// The hot loops are compiled twice, for baseline x86-64 and for AVX2+FMA (Haswell and newer), and
// the CPU picks at load time; elsewhere they are compiled once.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define POSENC_CPU_CLONES __attribute__((target_clones("default", "arch=haswell")))
#else
#define POSENC_CPU_CLONES
#endif

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
