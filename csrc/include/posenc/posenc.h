// Public C++ API of posenc-native for LibTorch programs.
//
// Link PosencNative::ops (find_package(PosencNative)) and call these functions, or call the ops
// through the dispatcher (torch::Dispatcher / TorchScript) by their names "posenc::<op>".
// Loading the library registers the ops; calling any function here (or posenc::ensure_loaded())
// keeps a linker's --as-needed from dropping it.
#pragma once
#include <ATen/ATen.h>
#include <optional>
#include <string>
#include <tuple>

namespace posenc {

// JSON with the versions and options the library was built with.
std::string build_info_json();

// Does nothing; referencing it anchors the library so its op registrations run.
void ensure_loaded();

// PE[positions] as [N, dim] in dtype (see the Python docs of sinusoidal_table for the options).
at::Tensor sinusoidal_table(const at::Tensor& positions, int64_t dim, double base = 10000.0, bool interleaved = true,
                            double freq_shift = 0.0, double angle_scale = 1.0, bool cos_first = false,
                            at::ScalarType dtype = at::kFloat);

// x * x_scale + PE[positions] in one pass.
at::Tensor add_sinusoidal(const at::Tensor& x, const at::Tensor& positions, double x_scale = 1.0,
                          double base = 10000.0, bool interleaved = true, double freq_shift = 0.0,
                          double angle_scale = 1.0, bool cos_first = false);

// Rotates q and k ([B,S,H,D] for "bshd") by position * inv_freq, times attention_factor. Multi-axis
// RoPE (MRoPE, axial): inv_freq [A, rotary_dim/2] with pair i's frequency in row axis(i) (zeros
// elsewhere) and positions [A, B, S]; see docs/architecture.md, "Multi-axis positions".
std::tuple<at::Tensor, at::Tensor> apply_rope(const at::Tensor& q, const at::Tensor& k, const at::Tensor& positions,
                                              const at::Tensor& inv_freq, double attention_factor = 1.0,
                                              bool interleaved = false, const std::string& layout = "bshd");

// Relative position biases, [1, heads, query_length, key_length]; query i sits at i + query_offset,
// r = key - query. T5: weight [num_buckets, heads] (T5's relative_attention_bias.weight), bias =
// weight[bucket(r), h] with transformers' bucketing (num_buckets = weight.size(0)).
at::Tensor relative_position_bias(const at::Tensor& weight, int64_t query_length, int64_t key_length,
                                  bool bidirectional = true, int64_t max_distance = 128, int64_t query_offset = 0);

// T5's bucket (int64) of each int32/int64 relative position.
at::Tensor t5_relative_position_bucket(const at::Tensor& relative_position, bool bidirectional = true,
                                       int64_t num_buckets = 32, int64_t max_distance = 128);

// ALiBi slopes of num_heads heads: float32 [num_heads] on the CPU (the paper's rule, BLOOM's and MPT's).
at::Tensor alibi_slopes(int64_t num_heads);

// ALiBi bias slopes[h] * r, in dtype (default: the slopes' dtype).
at::Tensor alibi_bias(const at::Tensor& slopes, int64_t query_length, int64_t key_length, int64_t query_offset = 0,
                      std::optional<at::ScalarType> dtype = std::nullopt);

}  // namespace posenc
