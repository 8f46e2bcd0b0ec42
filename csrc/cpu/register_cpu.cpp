#include "cpu/kernels.h"
#include "host/direct.h"

namespace posenc::cpu {
namespace {
constexpr Backend kCpuBackend{run_sinusoidal, run_rope, run_bucket, run_relative_bias, run_relative_bias_grad};
}  // namespace
}  // namespace posenc::cpu

STABLE_TORCH_LIBRARY_IMPL(posenc, CPU, m) {
  posenc::register_kernels<posenc::cpu::kCpuBackend, posenc::NoDeviceGuard>(m);
}

// The direct entry (direct_entry.h): the same CPU kernels, for the Python package's fast path.
extern "C" __attribute__((visibility("default"))) PosencDirectKernel posenc_direct_kernel_v1(const char* op_name) {
  return posenc::direct::kernel_named<posenc::cpu::kCpuBackend>(op_name);
}
