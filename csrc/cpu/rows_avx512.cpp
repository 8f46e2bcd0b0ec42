// The avx512 row kernels (simd_rows.h), compiled with this path's -m flags (CMakeLists.txt).
#include "cpu/simd_rows.h"

namespace posenc::cpu {

const RowKernels* row_kernels_avx512(bool prefetch, bool stream, bool wide) {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
  // every dtype in this path's 512-bit vectors, or float32 and fp16 in 256-bit ones (simd_rows.h, RowIsa)
  return wide ? kRowKernelsFor<Avx512, Avx512, Avx512>[prefetch][stream] : kRowKernelsFor<Avx512>[prefetch][stream];
#else
  return nullptr;  // a build without this instruction set
#endif
}

}  // namespace posenc::cpu
