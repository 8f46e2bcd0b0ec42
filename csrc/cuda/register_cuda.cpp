// Compiled by the host compiler: the runners launch on the current stream of the guarded device.
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>

#include "cuda/kernels.h"

namespace posenc::cuda {
namespace {
// Argument values on the GPU can be copied to the host to validate them, except while the current
// stream is being captured into a CUDA graph.
bool not_capturing() {
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None;
}
constexpr Backend kCudaBackend{run_sinusoidal, run_rope, not_capturing, run_bucket, run_relative_bias,
                                run_relative_bias_grad};
}  // namespace
}  // namespace posenc::cuda

TORCH_LIBRARY_IMPL(posenc, CUDA, m) {
  posenc::register_kernels<posenc::cuda::kCudaBackend, c10::cuda::CUDAGuard>(m);
}
