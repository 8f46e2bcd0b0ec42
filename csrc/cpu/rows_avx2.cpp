// The avx2 row kernels (simd_rows.h), compiled with this path's -m flags (CMakeLists.txt).
#include "cpu/simd_rows.h"

namespace posenc::cpu {

const RowKernels* row_kernels_avx2(bool prefetch, bool stream) {
#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
  return kRowKernelsFor<Avx2>[prefetch][stream];
#else
  return nullptr;  // a build without this instruction set
#endif
}

}  // namespace posenc::cpu
