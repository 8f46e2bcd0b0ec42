// Every schema of the posenc library, in one place. Kernels register in csrc/cpu and csrc/cuda;
// fake (meta) kernels and autograd are registered from Python (posenc_native/ops.py).
#include <torch/library.h>

#include <string>

namespace posenc {
std::string library_build_info_json();  // csrc/build_info.cpp
}

TORCH_LIBRARY(posenc, m) {
  // Lets torch import the Python module that holds the fake kernels when they are needed.
  m.set_python_module("posenc_native.ops");
  const std::vector<at::Tag> tags{at::Tag::pt2_compliant_tag};

  m.def("build_info() -> str", &posenc::library_build_info_json);

  // Sinusoidal tables: positions [N] (integer or float) -> [N, dim].
  m.def("sinusoidal_table(Tensor positions, int dim, float base, bool interleaved, float freq_shift, "
        "float angle_scale, bool cos_first, ScalarType dtype) -> Tensor", tags);
  // x * x_scale + PE[positions]; x [B, S, D] or [S, D], positions [S] or [B, S].
  m.def("add_sinusoidal(Tensor x, Tensor positions, float x_scale, float base, bool interleaved, "
        "float freq_shift, float angle_scale, bool cos_first) -> Tensor", tags);

  // RoPE with angles from inv_freq (rotary_dim = 2 * len(inv_freq)); k may have zero heads.
  // layout: 'bshd', 'bhsd' or 'thd'. inverse applies the transposed rotation (the backward).
  // offset is a SymInt so a compiled decode loop does not recompile for every new position.
  m.def("rope(Tensor q, Tensor k, Tensor? positions, Tensor? cu_seqlens, Tensor inv_freq, "
        "float attention_factor, bool interleaved, str layout, SymInt offset, bool inverse) -> (Tensor, Tensor)", tags);
  m.def("rope_(Tensor(a!) q, Tensor(b!) k, Tensor? positions, Tensor? cu_seqlens, Tensor inv_freq, "
        "float attention_factor, bool interleaved, str layout, SymInt offset, bool inverse) -> ()", tags);

  // RoPE with a given cos/sin table (transformers' convention; half-split pairs).
  m.def("rope_cos_sin(Tensor q, Tensor k, Tensor cos, Tensor sin, Tensor? positions, str layout, "
        "bool inverse) -> (Tensor, Tensor)", tags);
  m.def("rope_cos_sin_(Tensor(a!) q, Tensor(b!) k, Tensor cos, Tensor sin, Tensor? positions, str layout, "
        "bool inverse) -> ()", tags);
}

// Relative position biases: their fake kernels and autograd live in posenc_native/bias.py (torch
// requires the Python module of a C++-defined op's fake kernel to be declared with its schema).
// T5: transformers' _relative_position_bucket of int relative positions (memory - context), and the
// bias weight[bucket(j - i - query_offset), h] from weight [num_buckets, heads]. ALiBi: slopes[h] *
// (j - i - query_offset). Biases are [1, heads, query_length, key_length]; the backward ops take its
// gradient (any strides) to the weight's / slopes' gradient.
TORCH_LIBRARY_FRAGMENT(posenc, m) {
  m.set_python_module("posenc_native.bias");
  const std::vector<at::Tag> tags{at::Tag::pt2_compliant_tag};
  m.def("t5_relative_position_bucket(Tensor relative_position, bool bidirectional, int num_buckets, "
        "int max_distance) -> Tensor", tags);
  m.def("relative_position_bias(Tensor weight, SymInt query_length, SymInt key_length, bool bidirectional, "
        "int num_buckets, int max_distance, SymInt query_offset) -> Tensor", tags);
  m.def("relative_position_bias_backward(Tensor grad, bool bidirectional, int num_buckets, int max_distance, "
        "SymInt query_offset) -> Tensor", tags);
  m.def("alibi_bias(Tensor slopes, SymInt query_length, SymInt key_length, SymInt query_offset, "
        "ScalarType? dtype) -> Tensor", tags);
  m.def("alibi_bias_backward(Tensor grad, SymInt query_offset) -> Tensor", tags);
}
