// The CUDA backend: its two runners (sinusoidal_cuda.cu, rope_cuda.cu), registered in register_cuda.cpp.
#pragma once
#include "host/backend.h"

namespace posenc::cuda {
void run_sinusoidal(const SinusoidalProblem& p, at::ScalarType dtype);
void run_rope(const RopeProblem& p, at::ScalarType dtype);
}  // namespace posenc::cuda
