// The CUDA backend: its runners (sinusoidal_cuda.cu, rope_cuda.cu, relative_bias_cuda.cu), registered in
// register_cuda.cpp.
#pragma once
#include "host/backend.h"

namespace posenc::cuda {
POSENC_DECLARE_RUNNERS
}  // namespace posenc::cuda
