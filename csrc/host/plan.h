// Host side of every op, shared by the CPU and CUDA backends: validate the arguments (before any
// memory is touched, with messages that name the argument), allocate outputs, and describe the work
// as a plain problem struct (csrc/core) that a backend's runner executes. Each op takes its argument
// struct (registration.h), built once from the dispatcher's stack.
#pragma once
#include <tuple>

#include "core/relative_bias.h"
#include "core/rope.h"
#include "core/sinusoidal.h"
#include "host/stable.h"
#include "registration.h"

namespace posenc {

using SinusoidalRunner = void (*)(const SinusoidalProblem&, ScalarType);
using RopeRunner = void (*)(const RopeProblem&, ScalarType);
using BucketRunner = void (*)(const BucketProblem&);
using RelativeBiasRunner = void (*)(const RelativeBiasProblem&, ScalarType);
using RelativeBiasGradRunner = void (*)(const RelativeBiasGradProblem&, ScalarType);

// What a device backend (csrc/cpu, csrc/cuda) supplies: its runners. The host checks argument values
// only where they live (positions, cu_seqlens, frequencies on the CPU); the CUDA kernels check their
// own (POSENC_DEVICE_REQUIRE, csrc/core/common.h), so no call waits for the device.
struct Backend {
  SinusoidalRunner sinusoidal;
  RopeRunner rope;
  // Relative position biases (host/bias_plan.h): T5 buckets, the T5/ALiBi bias and its backward.
  BucketRunner bucket = nullptr;
  RelativeBiasRunner relative_bias = nullptr;
  RelativeBiasGradRunner relative_bias_grad = nullptr;
};

Tensor sinusoidal_table_op(const SinusoidalTableArgs& a, const Backend& backend);
Tensor add_sinusoidal_op(const AddSinusoidalArgs& a, const Backend& backend);

// Rotation from frequencies. Out of place returns (q_out, k_out); in place rewrites q and k.
std::tuple<Tensor, Tensor> rope_op(const RopeArgs& a, const Backend& backend);
void rope__op(const RopeArgs& a, const Backend& backend);
Tensor rope_in_place_check_op(const RopeInPlaceCheckArgs& a, const Backend& backend);

// Rotation from a given cos/sin table (transformers' apply_rotary_pos_emb convention, half-split).
std::tuple<Tensor, Tensor> rope_cos_sin_op(const RopeCosSinArgs& a, const Backend& backend);
void rope_cos_sin__op(const RopeCosSinArgs& a, const Backend& backend);

}  // namespace posenc
