// Shared by the CPU and CUDA backends: host/device qualifiers and the math type of each dtype.
#pragma once
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>
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

// The two elements of pair i in a row of `pairs` pairs: (2i, 2i + 1) interleaved (GPT-J, RoFormer),
// (i, i + pairs) half-split (GPT-NeoX, Llama). RoPE rotates them (core/rope.h); the sinusoidal
// encoding puts sin and cos there (core/sinusoidal.h).
POSENC_HD int64_t pair_first(bool interleaved, int64_t i) { return interleaved ? 2 * i : i; }
POSENC_HD int64_t pair_second(bool interleaved, int64_t i, int64_t pairs) { return interleaved ? 2 * i + 1 : i + pairs; }

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
// (round to nearest even, NaN kept) so that CPU loops using them vectorize; so are the fp16 ones on
// x86 (POSENC_HALF_BY_BITS), where c10::Half's, compiled without F16C, are a branchy scalar
// routine that kept every fp16 loop scalar (add_sinusoidal 20x the time of x * c). Elsewhere c10's
// (the hardware's on ARM), and on the GPU the hardware conversion.
#if !defined(__CUDA_ARCH__) && (defined(__x86_64__) || defined(_M_X64))
#define POSENC_HALF_BY_BITS 1
#else
#define POSENC_HALF_BY_BITS 0
#endif

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
#if POSENC_HALF_BY_BITS
  if constexpr (std::is_same_v<T, c10::Half>) {
    // The same value as c10::Half's conversion: normal numbers rebiased (15 -> 127), infinities and
    // NaNs with the exponent all ones, subnormals as their integer mantissa times 2^-24 (exact, and
    // no arithmetic on subnormal floats, which flush-to-zero modes would change). Every case is
    // formed and one picked by masks: as ?: the compiler branched on the case and did not vectorize.
    const uint32_t magnitude = v.x & 0x7fffu;
    const uint32_t sign = static_cast<uint32_t>(v.x & 0x8000u) << 16;
    const uint32_t is_subnormal = 0u - static_cast<uint32_t>(magnitude < 0x0400u);
    const uint32_t is_special = 0u - static_cast<uint32_t>(magnitude >= 0x7c00u);
    const float subnormal = static_cast<float>(static_cast<int32_t>(magnitude)) * 0x1p-24f;
    uint32_t subnormal_bits;
    std::memcpy(&subnormal_bits, &subnormal, sizeof(subnormal_bits));
    const uint32_t normal_bits = ((magnitude << 13) + (112u << 23)) | (is_special & 0x7f800000u);
    const uint32_t bits = sign | (normal_bits & ~is_subnormal) | (subnormal_bits & is_subnormal);
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return static_cast<M>(f);
  }
#endif
  return static_cast<M>(v);
}

// The bf16 of f, rounded to nearest even, as c10::BFloat16's conversion. The rounding carries a NaN
// into infinity or another NaN, so kTestNaN makes NaN the quiet 0x7fc0; a caller whose values are
// never NaN leaves the test out (from_math_finite).
template <bool kTestNaN>
POSENC_HD c10::BFloat16 bf16_of(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  c10::BFloat16 out;
  out.x = static_cast<uint16_t>(kTestNaN && f != f ? 0x7fc0u : rounded);
  return out;
}

template <typename T, typename M>
POSENC_HD T from_math(M v) {
#if !defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    return bf16_of<true>(static_cast<float>(v));
  }
#endif
#if POSENC_HALF_BY_BITS
  if constexpr (std::is_same_v<T, c10::Half>) {
    // Round to nearest even, as c10::Half's conversion, except NaN: quiet, with its sign and the top
    // ten bits of its payload, as F16C's vcvtps2ph (the SIMD rows' store) gives it, for the same bits
    // on every path (c10 gives 0x7e00 with the sign); from 2^16 up infinity; normal results
    // (|f| >= 2^-14) by rounding the float's bits (rebiased 127 -> 15) at bit 13; subnormal ones by
    // adding 0.5, whose float spacing (2^-24) is the fp16 subnormals', so the FPU rounds (no subnormal
    // float results, so flush-to-zero modes change nothing, and floats below 2^-126 round to 0 either
    // way). Picked by masks, to vectorize (as float -> fp16).
    const float f = static_cast<float>(v);
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof(bits));
    const uint32_t sign = bits & 0x80000000u;
    const uint32_t magnitude = bits ^ sign;
    float magnitude_f;
    std::memcpy(&magnitude_f, &magnitude, sizeof(magnitude_f));
    const float shifted = magnitude_f + 0.5f;
    uint32_t shifted_bits;
    std::memcpy(&shifted_bits, &shifted, sizeof(shifted_bits));
    const uint32_t subnormal = shifted_bits - 0x3f000000u;  // the bits of 0.5f
    const uint32_t normal = (magnitude - (112u << 23) + 0xfffu + ((magnitude >> 13) & 1u)) >> 13;
    const uint32_t is_nan = 0u - static_cast<uint32_t>(magnitude > 0x7f800000u);
    const uint32_t special = 0x7c00u | (is_nan & (0x0200u | ((magnitude >> 13) & 0x03ffu)));
    const uint32_t is_special = 0u - static_cast<uint32_t>(magnitude >= (143u << 23));
    const uint32_t is_subnormal = 0u - static_cast<uint32_t>(magnitude < (113u << 23));
    const uint32_t finite = (normal & ~is_subnormal) | (subnormal & is_subnormal);
    T out;
    out.x = static_cast<uint16_t>((sign >> 16) | (special & is_special) | (finite & ~is_special));
    return out;
  }
#endif
  return static_cast<T>(v);
}

// from_math for a value that is not NaN (sin and cos of angles within the domain: the sinusoidal
// tables' rows), with the same bits: bf16 without from_math's NaN test, which took 18% of a bf16
// table's time on the AVX2 path (one thread, [32768, 1024]: 9.5 -> 7.7 ms).
template <typename T, typename M>
POSENC_HD T from_math_finite(M v) {
#if !defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    return bf16_of<false>(static_cast<float>(v));
  }
#endif
  return from_math<T>(v);
}

}  // namespace posenc
