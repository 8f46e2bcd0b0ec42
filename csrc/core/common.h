// Shared by the CPU and CUDA backends: host/device qualifiers and the math type of each dtype.
#pragma once
#include <torch/headeronly/util/BFloat16.h>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__CUDACC__)
#define POSENC_HD __host__ __device__ __forceinline__
#else
#define POSENC_HD inline
#endif

namespace posenc {

// fp16/bf16/fp32 compute in float32 (one rounding on store); float64 stays float64 (for gradcheck
// and for users who want double results).
template <typename T>
using math_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

}  // namespace posenc

namespace posenc {

// Element type of a position/index tensor, read as float64 (integers below 2^53 are exact).
enum class IndexKind : int { Int32 = 0, Int64 = 1, Float32 = 2, Float64 = 3 };

POSENC_HD double load_as_double(const void* p, IndexKind kind, int64_t at) {
  switch (kind) {
    case IndexKind::Int32: return static_cast<double>(static_cast<const int32_t*>(p)[at]);
    case IndexKind::Int64: return static_cast<double>(static_cast<const int64_t*>(p)[at]);
    case IndexKind::Float32: return static_cast<double>(static_cast<const float*>(p)[at]);
    default: return static_cast<const double*>(p)[at];
  }
}

POSENC_HD int64_t load_as_int64(const void* p, IndexKind kind, int64_t at) {
  return kind == IndexKind::Int32 ? static_cast<int64_t>(static_cast<const int32_t*>(p)[at])
                                  : static_cast<const int64_t*>(p)[at];
}

}  // namespace posenc

namespace posenc {

// Element <-> math-type conversions. The bfloat16 ones are written with plain integer operations
// (round to nearest even, NaN kept) so that CPU loops using them vectorize; on the GPU the
// hardware conversion is used.
template <typename M, typename T>
POSENC_HD M to_math(T v) {
#if !defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    const uint32_t bits = static_cast<uint32_t>(v.x) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return static_cast<M>(f);
  }
#endif
  return static_cast<M>(v);
}

template <typename T, typename M>
POSENC_HD T from_math(M v) {
#if !defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    const float f = static_cast<float>(v);
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof(bits));
    const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    T out;
    out.x = static_cast<uint16_t>(f != f ? 0x7fc0u : rounded);
    return out;
  }
#endif
  return static_cast<T>(v);
}

}  // namespace posenc
