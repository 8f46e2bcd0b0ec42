// The public C++ API of include/posenc/posenc.h: build facts and thin calls through the dispatcher.
#include <ATen/core/dispatch/Dispatcher.h>
#include <sstream>

#include "core/relative_bias.h"
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

at::Tensor relative_position_bias(const at::Tensor& weight, int64_t query_length, int64_t key_length,
                                  bool bidirectional, int64_t max_distance, int64_t query_offset) {
  static const auto op = find_op("posenc::relative_position_bias")
                             .typed<at::Tensor(const at::Tensor&, c10::SymInt, c10::SymInt, bool, int64_t, int64_t,
                                               c10::SymInt)>();
  TORCH_CHECK(weight.dim() == 2, "posenc::relative_position_bias: weight must be [num_buckets, heads], got shape ",
              weight.sizes());
  return op.call(weight, c10::SymInt(query_length), c10::SymInt(key_length), bidirectional, weight.size(0),
                 max_distance, c10::SymInt(query_offset));
}

at::Tensor t5_relative_position_bucket(const at::Tensor& relative_position, bool bidirectional, int64_t num_buckets,
                                       int64_t max_distance) {
  static const auto op = find_op("posenc::t5_relative_position_bucket")
                             .typed<at::Tensor(const at::Tensor&, bool, int64_t, int64_t)>();
  return op.call(relative_position, bidirectional, num_buckets, max_distance);
}

at::Tensor alibi_slopes(int64_t num_heads) {
  TORCH_CHECK(num_heads >= 1, "posenc::alibi_slopes: num_heads must be >= 1, got ", num_heads);
  at::Tensor slopes = at::empty({num_heads}, at::kFloat);
  float* s = slopes.data_ptr<float>();
  for (int64_t h = 0; h < num_heads; ++h) s[h] = static_cast<float>(alibi_slope(h, num_heads));
  return slopes;
}

at::Tensor alibi_bias(const at::Tensor& slopes, int64_t query_length, int64_t key_length, int64_t query_offset,
                      std::optional<at::ScalarType> dtype) {
  static const auto op =
      find_op("posenc::alibi_bias")
          .typed<at::Tensor(const at::Tensor&, c10::SymInt, c10::SymInt, c10::SymInt, std::optional<at::ScalarType>)>();
  return op.call(slopes, c10::SymInt(query_length), c10::SymInt(key_length), c10::SymInt(query_offset), dtype);
}

}  // namespace posenc
