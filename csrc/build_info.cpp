// The kernel of posenc::build_info: JSON with the versions and options the library was built with.
#include "build_info.h"

#include <atomic>
#include <exception>
#include <sstream>
#include <string>

#include "cpu/isa.h"

namespace posenc {

namespace {
struct CudaBuildFacts {
  const char* cuda_version;
  const char* cuda_archs;
  const char* cuda_compiler;
};
CudaBuildFacts g_cuda_facts;
std::atomic<const CudaBuildFacts*> g_cuda{nullptr};

// The CPU path the kernels take in this process (csrc/cpu/isa.h): a run-time fact, reported here
// so benchmarks and bug reports can say which path ran.
std::string cpu_path() {
  try {
    return cpu::isa_name(cpu::cpu_isa());
  } catch (const std::exception&) {
    return "invalid POSENC_CPU_ISA";
  }
}
// The SIMD kernels' prefetch (csrc/cpu/isa.h, Prefetch), the streaming threshold (Streaming) and the
// 512-bit rows (VectorWidth) as JSON fields, each null where POSENC_CPU_PREFETCH (POSENC_CPU_STREAM,
// POSENC_CPU_VECTOR_BITS) is invalid.
std::string cpu_memory_fields() {
  std::string on = "null", from_bytes = "null", distance = "null";
  try {
    const cpu::Prefetch& p = cpu::cpu_prefetch();
    on = p.on ? "true" : "false";
    from_bytes = std::to_string(p.from_bytes);
    distance = std::to_string(p.distance);
  } catch (const std::exception&) {
  }
  std::string stream_from = "null";
  try {
    stream_from = std::to_string(cpu::cpu_streaming().from_bytes);
  } catch (const std::exception&) {
  }
  std::string fp16_bits = "null", fp32_wide_below = "null";
  try {
    const cpu::VectorWidth& w = cpu::cpu_vector_width();
    fp16_bits = w.fp16_wide ? "512" : "256";
    fp32_wide_below = std::to_string(w.fp32_wide_below);
  } catch (const std::exception&) {
  }
  return ", \"cpu_prefetch\": " + on + ", \"cpu_prefetch_from_bytes\": " + from_bytes +
         ", \"cpu_prefetch_distance\": " + distance + ", \"cpu_stream_from_bytes\": " + stream_from +
         ", \"cpu_fp16_bits\": " + fp16_bits + ", \"cpu_fp32_512_below_bytes\": " + fp32_wide_below;
}
}  // namespace

std::string build_info_json() {
  const CudaBuildFacts* cuda = g_cuda.load();
  std::ostringstream s;
  // torch: the torch the library was compiled with; torch_target: the oldest torch whose stable
  // ABI it uses (it loads into that one and every later one).
  s << "{\"version\": \"" << POSENC_VERSION << "\", \"torch\": \"" << POSENC_TORCH_VERSION
    << "\", \"torch_target\": \"" << POSENC_TORCH_TARGET << "\", \"cuda\": " << (cuda ? "true" : "false")
    << ", \"cuda_version\": \"" << (cuda ? cuda->cuda_version : "") << "\", \"cuda_archs\": \""
    << (cuda ? cuda->cuda_archs : "") << "\", \"cxx_compiler\": \"" << POSENC_CXX_COMPILER
    << "\", \"cuda_compiler\": \"" << (cuda ? cuda->cuda_compiler : "") << "\", \"cxx11_abi\": "
    << _GLIBCXX_USE_CXX11_ABI << ", \"cplusplus\": " << __cplusplus << ", \"cpu_isa\": \"" << cpu_path()
    << "\"" << cpu_memory_fields() << "}";
  return s.str();
}

}  // namespace posenc

void posenc_set_cuda_build_facts(const char* cuda_version, const char* cuda_archs, const char* cuda_compiler) {
  posenc::g_cuda_facts = {cuda_version, cuda_archs, cuda_compiler};
  posenc::g_cuda.store(&posenc::g_cuda_facts);
}
