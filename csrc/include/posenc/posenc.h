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

// Rotates q and k ([B,S,H,D] for "bshd") by position * inv_freq, times attention_factor.
std::tuple<at::Tensor, at::Tensor> apply_rope(const at::Tensor& q, const at::Tensor& k, const at::Tensor& positions,
                                              const at::Tensor& inv_freq, double attention_factor = 1.0,
                                              bool interleaved = false, const std::string& layout = "bshd");

}  // namespace posenc
