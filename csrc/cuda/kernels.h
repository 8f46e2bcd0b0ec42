// The CUDA backend: its two runners (sinusoidal_cuda.cu, rope_cuda.cu), registered in register_cuda.cpp.
#pragma once
#include "host/backend.h"

namespace posenc::cuda {
void run_sinusoidal(const SinusoidalProblem& p, at::ScalarType dtype);
void run_rope(const RopeProblem& p, at::ScalarType dtype);
// Relative position biases (relative_bias_cuda.cu).
void run_bucket(const BucketProblem& p);
void run_relative_bias(const RelativeBiasProblem& p, at::ScalarType dtype);
void run_relative_bias_grad(const RelativeBiasGradProblem& p, at::ScalarType dtype);
}  // namespace posenc::cuda
