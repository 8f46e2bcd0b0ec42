// Public C++ API of posenc-native for LibTorch programs: header-only.
//
// Every function here is an inline call of a "posenc::<op>" op through torch's dispatcher, compiled
// with your torch; the op library itself (libposenc_ops.so) exports no C++ API, so it keeps to
// LibTorch's stable ABI and one build serves every supported torch. Link the library so that its
// op registrations run: find_package(PosencNative) and link PosencNative::ops (the CMake package
// keeps the link even under --as-needed), or pass -Wl,--no-as-needed before -lposenc_ops. For CUDA
// tensors also link PosencNative::ops_cuda (libposenc_ops_cuda.so, the CUDA kernels).
// Any op can also be called through the dispatcher or TorchScript by its name "posenc::<op>".
#pragma once
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cmath>
#include <optional>
#include <string>
#include <tuple>

namespace posenc {

namespace detail {
inline c10::OperatorHandle find_op(const char* name) {
  auto op = c10::Dispatcher::singleton().findOp({name, ""});
  TORCH_CHECK(op.has_value(), "posenc: the op ", name, " is not registered: libposenc_ops.so is not loaded into "
              "this process (link PosencNative::ops, or -Wl,--no-as-needed -lposenc_ops, or load it with dlopen)");
  return *op;
}
}  // namespace detail

// Throws a c10::Error saying how to fix it unless the op library is loaded (its ops registered).
inline void ensure_loaded() { detail::find_op("posenc::build_info"); }

// JSON with the versions and options the library was built with (the op posenc::build_info).
inline std::string build_info_json() {
  static const auto op = detail::find_op("posenc::build_info").typed<std::string()>();
  return op.call();
}

// PE[positions] as [N, dim] in dtype (see the Python docs of sinusoidal_table for the options).
inline at::Tensor sinusoidal_table(const at::Tensor& positions, int64_t dim, double base = 10000.0,
                                   bool interleaved = true, double freq_shift = 0.0, double angle_scale = 1.0,
                                   bool cos_first = false, at::ScalarType dtype = at::kFloat) {
  static const auto op =
      detail::find_op("posenc::sinusoidal_table")
          .typed<at::Tensor(const at::Tensor&, int64_t, double, bool, double, double, bool, at::ScalarType)>();
  return op.call(positions, dim, base, interleaved, freq_shift, angle_scale, cos_first, dtype);
}

// x * x_scale + PE[positions + offset] in one pass; an undefined positions tensor (at::Tensor())
// means positions 0 .. S-1 of every row.
inline at::Tensor add_sinusoidal(const at::Tensor& x, const at::Tensor& positions, double x_scale = 1.0,
                                 double base = 10000.0, bool interleaved = true, double freq_shift = 0.0,
                                 double angle_scale = 1.0, bool cos_first = false, int64_t offset = 0) {
  static const auto op = detail::find_op("posenc::add_sinusoidal")
                             .typed<at::Tensor(const at::Tensor&, const std::optional<at::Tensor>&, double, double,
                                               bool, double, double, bool, c10::SymInt)>();
  const std::optional<at::Tensor> given = positions.defined() ? std::optional<at::Tensor>(positions) : std::nullopt;
  return op.call(x, given, x_scale, base, interleaved, freq_shift, angle_scale, cos_first, c10::SymInt(offset));
}

// Rotates q and k ([B,S,H,D] for "bshd") by position * inv_freq, times attention_factor; an
// undefined positions tensor (at::Tensor()) means positions 0 .. S-1 of every row. Multi-axis
// RoPE (MRoPE, axial): inv_freq [A, rotary_dim/2] with pair i's frequency in row axis(i) (zeros
// elsewhere) and positions [A, B, S]; see docs/architecture.md, "Multi-axis positions".
inline std::tuple<at::Tensor, at::Tensor> apply_rope(const at::Tensor& q, const at::Tensor& k,
                                                     const at::Tensor& positions, const at::Tensor& inv_freq,
                                                     double attention_factor = 1.0, bool interleaved = false,
                                                     const std::string& layout = "bshd") {
  static const auto op =
      detail::find_op("posenc::rope")
          .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                    const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                                                    const at::Tensor&, double, bool, c10::string_view, c10::SymInt,
                                                    bool)>();
  const std::optional<at::Tensor> given = positions.defined() ? std::optional<at::Tensor>(positions) : std::nullopt;
  return op.call(q, k, given, std::nullopt, inv_freq, attention_factor, interleaved, layout, c10::SymInt(0), false);
}

// Relative position biases, [1, heads, query_length, key_length]; query i sits at i + query_offset,
// r = key - query. T5: weight [num_buckets, heads] (T5's relative_attention_bias.weight), bias =
// weight[bucket(r), h] with transformers' bucketing. The arguments are the op schema's, in its
// order; num_buckets defaults to weight.size(0) and must match it when given.
inline at::Tensor relative_position_bias(const at::Tensor& weight, int64_t query_length, int64_t key_length,
                                         bool bidirectional = true, std::optional<int64_t> num_buckets = std::nullopt,
                                         int64_t max_distance = 128, int64_t query_offset = 0) {
  static const auto op = detail::find_op("posenc::relative_position_bias")
                             .typed<at::Tensor(const at::Tensor&, c10::SymInt, c10::SymInt, bool, int64_t, int64_t,
                                               c10::SymInt)>();
  TORCH_CHECK(weight.dim() == 2, "posenc::relative_position_bias: weight must be [num_buckets, heads], got shape ",
              weight.sizes());
  return op.call(weight, c10::SymInt(query_length), c10::SymInt(key_length), bidirectional,
                 num_buckets.value_or(weight.size(0)), max_distance, c10::SymInt(query_offset));
}

// T5's bucket (int64) of each int32/int64 relative position.
inline at::Tensor t5_relative_position_bucket(const at::Tensor& relative_position, bool bidirectional = true,
                                              int64_t num_buckets = 32, int64_t max_distance = 128) {
  static const auto op = detail::find_op("posenc::t5_relative_position_bucket")
                             .typed<at::Tensor(const at::Tensor&, bool, int64_t, int64_t)>();
  return op.call(relative_position, bidirectional, num_buckets, max_distance);
}

// ALiBi slopes of num_heads heads: float32 [num_heads] on the CPU, computed in float64 and rounded
// once (the ALiBi paper's rule, as BLOOM and MPT compute it; posenc_native.alibi_slopes in Python):
// with c the largest power of two <= num_heads, heads h < c get 2^(-8 (h+1) / c), the remaining
// ones 2^(-4 k / c) for odd k = 1, 3, 5, ...
inline at::Tensor alibi_slopes(int64_t num_heads) {
  TORCH_CHECK(num_heads >= 1, "posenc::alibi_slopes: num_heads must be >= 1, got ", num_heads);
  int64_t c = 1;
  while (2 * c <= num_heads) c *= 2;
  at::Tensor slopes = at::empty({num_heads}, at::kFloat);
  float* s = slopes.data_ptr<float>();
  for (int64_t h = 0; h < num_heads; ++h) {
    const double e = h < c ? -8.0 * static_cast<double>(h + 1) : -4.0 * static_cast<double>(2 * (h - c) + 1);
    s[h] = static_cast<float>(std::exp2(e / static_cast<double>(c)));
  }
  return slopes;
}

// ALiBi bias slopes[h] * r, in dtype (default: the slopes' dtype).
inline at::Tensor alibi_bias(const at::Tensor& slopes, int64_t query_length, int64_t key_length,
                             int64_t query_offset = 0, std::optional<at::ScalarType> dtype = std::nullopt) {
  static const auto op =
      detail::find_op("posenc::alibi_bias")
          .typed<at::Tensor(const at::Tensor&, c10::SymInt, c10::SymInt, c10::SymInt,
                            std::optional<at::ScalarType>)>();
  return op.call(slopes, c10::SymInt(query_length), c10::SymInt(key_length), c10::SymInt(query_offset), dtype);
}

}  // namespace posenc
