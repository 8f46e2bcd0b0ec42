// Shared by the CPU and CUDA backends: host/device qualifiers and the math type of each dtype.
#pragma once
#include <torch/headeronly/util/BFloat16.h>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__CUDACC__)
#define POSENC_HD __host__ __device__ __forceinline__
#include <torch/headeronly/macros/Macros.h>  // CUDA_KERNEL_ASSERT_MSG
#else
#define POSENC_HD inline
#endif

// A value on the GPU that breaks an op's contract. The host would have to wait for the device to
// read it, so the kernel checks it and stops with a device-side assertion (torch's own kernels do
// the same for an index out of range): `msg` is printed and the next synchronization raises
// "device-side assert triggered". Values on the host are checked before the launch (csrc/host/plan.cpp),
// so in host code this is nothing.
#if defined(__CUDA_ARCH__)
#define POSENC_DEVICE_REQUIRE(cond, msg) CUDA_KERNEL_ASSERT_MSG(cond, msg)
#else
#define POSENC_DEVICE_REQUIRE(cond, msg) ((void)sizeof(cond))  // not evaluated
#endif

namespace posenc {

// fp16/bf16/fp32 compute in float32 (one rounding on store); float64 stays float64 (for gradcheck
// and for users who want double results).
template <typename T>
using math_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

}  // namespace posenc

namespace posenc {

// The position domain (README "Guarantees"). Angles are reduced modulo pi/2 in float64 before the
// float32 sin/cos (core/angles.h); that reduction stays a reduction (the result a rotation) for
// |angle| < 2^51, and is accurate to ~2e-7 below 2^24. Positions (plus offset) are limited to 2^48
// and angles (position * frequency) to 2^50, with margin; anything outside is an error, never a
// wrong value: refused on the host, or stopped on the GPU (POSENC_DEVICE_REQUIRE).
constexpr int64_t kMaxPosition = int64_t{1} << 48;
constexpr double kMaxAngle = 1125899906842624.0;  // 2^50

// |x| <= bound, false for NaN.
POSENC_HD bool within(double x, double bound) { return x <= bound && x >= -bound; }

POSENC_HD bool angle_in_domain(double angle) { return within(angle, kMaxAngle); }

// Integer positions p with p + offset in [-2^48, 2^48]: min <= p <= max, the domain moved by the
// offset and saturated to int64, so that neither the bounds nor p + offset can wrap. One definition
// for the host's checks and the kernels'.
struct PositionDomain {
  int64_t min = -kMaxPosition, max = kMaxPosition;
  POSENC_HD bool contains(int64_t p) const { return p >= min && p <= max; }
};

inline PositionDomain position_domain(int64_t offset) {  // host code
  PositionDomain d;
  if (__builtin_sub_overflow(-kMaxPosition, offset, &d.min)) d.min = INT64_MIN;  // offset > 2^63 - 2^48
  if (__builtin_sub_overflow(kMaxPosition, offset, &d.max)) d.max = INT64_MAX;   // offset < 2^48 - 2^63
  return d;
}

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
