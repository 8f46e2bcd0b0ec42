// Compiled by the host compiler: the runners launch on the current stream of the guarded device.
#include <c10/cuda/CUDAGuard.h>

#include "cuda/kernels.h"

TORCH_LIBRARY_IMPL(posenc, CUDA, m) {
  posenc::register_kernels<posenc::cuda::run_sinusoidal, posenc::cuda::run_rope, c10::cuda::CUDAGuard>(m);
}
