#include "cpu/kernels.h"

namespace posenc::cpu {
namespace {
bool always() { return true; }
constexpr Backend kCpuBackend{run_sinusoidal, run_rope, always, run_bucket, run_relative_bias, run_relative_bias_grad};
}  // namespace
}  // namespace posenc::cpu

STABLE_TORCH_LIBRARY_IMPL(posenc, CPU, m) {
  posenc::register_kernels<posenc::cpu::kCpuBackend, posenc::NoDeviceGuard>(m);
}
