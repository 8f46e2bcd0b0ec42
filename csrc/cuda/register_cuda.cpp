// Compiled by the host compiler: the CUDA kernels' registration (libposenc_ops_cuda.so). The runners
// launch on the current stream of the device the guard sets: the device of the op's first tensor.
#include <torch/csrc/stable/accelerator.h>

#include "build_info.h"
#include "cuda/kernels.h"

namespace posenc::cuda {
namespace {
constexpr Backend kCudaBackend{run_sinusoidal, run_rope, run_bucket, run_relative_bias, run_relative_bias_grad};

struct CudaGuard {
  torch::stable::accelerator::DeviceGuard guard;
  explicit CudaGuard(const Tensor& t) : guard(t.get_device_index()) {}
};

// build_info reports the CUDA facts of this library once it is loaded.
const bool kFactsReported = (posenc_set_cuda_build_facts(POSENC_CUDA_VERSION, POSENC_CUDA_ARCHS_STR,
                                                         POSENC_CUDA_COMPILER),
                             true);
}  // namespace
}  // namespace posenc::cuda

STABLE_TORCH_LIBRARY_IMPL(posenc, CUDA, m) {
  posenc::register_kernels<posenc::cuda::kCudaBackend, posenc::cuda::CudaGuard>(m);
}
