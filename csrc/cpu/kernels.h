// The CPU backend: its runners (sinusoidal_cpu.cpp, rope_cpu.cpp, relative_bias_cpu.cpp), registered in
// register_cpu.cpp.
#pragma once
#include <type_traits>

#include "cpu/isa.h"
#include "host/backend.h"

// The hot loops are compiled twice, for baseline x86-64 and for AVX2, and
// the CPU picks at load time; elsewhere they are compiled once. `flatten` inlines the helpers into
// each clone, so they are compiled for its instruction set too (an arch= clone could not inline them).
// Rarely run helpers are marked [[gnu::noinline]] (the angle stream's step rows,
// cpu/sincos_stream.h): flattened into every clone they made rope_cpu.cpp take 3.5 min to compile.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define POSENC_CPU_CLONES __attribute__((target_clones("default", "avx2"), flatten))
#else
#define POSENC_CPU_CLONES
#endif

namespace posenc::cpu {
POSENC_DECLARE_RUNNERS

// The row kernels' index of element type T (cpu/isa.h, RowDtype), -1 for types they do not take.
template <typename T>
constexpr int kRowDtype = std::is_same_v<T, float>            ? kRowFloat
                          : std::is_same_v<T, c10::BFloat16> ? kRowBFloat16
                          : std::is_same_v<T, c10::Half>     ? kRowHalf
                                                              : -1;
}  // namespace posenc::cpu
