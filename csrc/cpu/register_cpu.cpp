#include "cpu/kernels.h"

TORCH_LIBRARY_IMPL(posenc, CPU, m) {
  posenc::register_kernels<posenc::cpu::run_sinusoidal, posenc::cpu::run_rope, posenc::NoDeviceGuard>(m);
}
