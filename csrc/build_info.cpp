// What the op posenc::build_info reports: the build facts compiled into the library (CMakeLists.txt)
// and the CPU path this process takes.
#include <sstream>
#include <string>

#include "cpu/isa.h"

namespace posenc {

namespace {
// The CPU path the kernels take in this process (csrc/cpu/isa.h): a run-time fact, reported here
// so benchmarks and bug reports can say which path ran.
std::string cpu_path() {
  try {
    return cpu::isa_name(cpu::cpu_isa());
  } catch (const std::exception&) {
    return "invalid POSENC_CPU_ISA";
  }
}
}  // namespace

std::string library_build_info_json() {
  std::ostringstream s;
  s << "{\"version\": \"" << POSENC_VERSION << "\", \"torch\": \"" << POSENC_TORCH_VERSION << "\", \"cuda\": "
#ifdef POSENC_WITH_CUDA
    << "true"
#else
    << "false"
#endif
    << ", \"cuda_version\": \"" << POSENC_CUDA_VERSION << "\", \"cuda_archs\": \"" << POSENC_CUDA_ARCHS_STR
    << "\", \"cxx_compiler\": \"" << POSENC_CXX_COMPILER << "\", \"cuda_compiler\": \""
#ifdef POSENC_WITH_CUDA
    << POSENC_CUDA_COMPILER
#endif
    << "\", \"cxx11_abi\": " << _GLIBCXX_USE_CXX11_ABI << ", \"cplusplus\": " << __cplusplus
    << ", \"cpu_isa\": \"" << cpu_path() << "\"}";
  return s.str();
}

}  // namespace posenc
