// The avx512bf16 row kernels (simd_rows.h), compiled with this path's -m flags (CMakeLists.txt).
#include "cpu/simd_rows.h"

namespace posenc::cpu {

const RowKernels* row_kernels_avx512bf16(bool prefetch, bool stream, bool wide) {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && defined(__AVX512BF16__)
  // every dtype in this path's 512-bit vectors, or float32 and fp16 in 256-bit ones (simd_rows.h, RowIsa)
  return wide ? kRowKernelsFor<Avx512Bf16, Avx512Bf16, Avx512Bf16>[prefetch][stream] : kRowKernelsFor<Avx512Bf16>[prefetch][stream];
#else
  return nullptr;  // a build without this instruction set
#endif
}

}  // namespace posenc::cpu
