// The public C++ API of include/posenc/posenc.h: build facts and thin calls through the dispatcher.
#include <ATen/core/dispatch/Dispatcher.h>
#include <sstream>

#include "cpu/isa.h"
#include "posenc/posenc.h"

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

std::string build_info_json() {
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

void ensure_loaded() {}

namespace {
c10::OperatorHandle find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
}
}  // namespace

at::Tensor sinusoidal_table(const at::Tensor& positions, int64_t dim, double base, bool interleaved, double freq_shift,
                            double angle_scale, bool cos_first, at::ScalarType dtype) {
  static const auto op = find_op("posenc::sinusoidal_table")
                             .typed<at::Tensor(const at::Tensor&, int64_t, double, bool, double, double, bool,
                                               at::ScalarType)>();
  return op.call(positions, dim, base, interleaved, freq_shift, angle_scale, cos_first, dtype);
}

at::Tensor add_sinusoidal(const at::Tensor& x, const at::Tensor& positions, double x_scale, double base,
                          bool interleaved, double freq_shift, double angle_scale, bool cos_first) {
  static const auto op = find_op("posenc::add_sinusoidal")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, double, double, bool, double,
                                               double, bool)>();
  return op.call(x, positions, x_scale, base, interleaved, freq_shift, angle_scale, cos_first);
}

std::tuple<at::Tensor, at::Tensor> apply_rope(const at::Tensor& q, const at::Tensor& k, const at::Tensor& positions,
                                              const at::Tensor& inv_freq, double attention_factor, bool interleaved,
                                              const std::string& layout) {
  static const auto op =
      find_op("posenc::rope")
          .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                    const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                                                    const at::Tensor&, double, bool, c10::string_view, c10::SymInt, bool)>();
  return op.call(q, k, positions, std::nullopt, inv_freq, attention_factor, interleaved, layout, c10::SymInt(0), false);
}

}  // namespace posenc
