// posenc-native from a LibTorch C++ program, no Python involved:
//   1. the op library is linked (the CMake package keeps it under --as-needed), so torch.ops.posenc.*
//      exist (posenc::ensure_loaded checks);
//   2. a TorchScript module saved by make_inputs.py runs on inputs Python saved with torch.save;
//   3. ops are called directly through the C++ API (posenc/posenc.h), relative position biases included;
//   4. optionally, an AOTInductor package (model.pt2) made by `make_inputs.py --aoti` runs.
// Results go to DIR/outputs.pt (torch::jit::pickle_save: torch.load reads it in Python).
//
//   posenc_example DIR        (DIR holds model.pt, inputs.pt and optionally model.pt2)
#include <torch/script.h>

#include <posenc/posenc.h>

#ifdef POSENC_EXAMPLE_AOTI
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#endif

#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

std::vector<char> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const fs::path& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

at::Tensor get(const c10::Dict<c10::IValue, c10::IValue>& d, const std::string& key) {
  if (!d.contains(key)) throw std::runtime_error("inputs.pt has no tensor '" + key + "'");
  return d.at(key).toTensor();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: " << argv[0] << " DIR   (DIR from examples/cpp/make_inputs.py)\n";
    return 2;
  }
  const fs::path dir = argv[1];
  try {
    // Throws with a hint if libposenc_ops.so is not loaded (e.g. dropped from the link by --as-needed).
    posenc::ensure_loaded();
    std::cout << "posenc build: " << posenc::build_info_json() << "\n";

    // Inputs written by Python's torch.save (a dict of tensors).
    const auto inputs = torch::jit::pickle_load(read_file(dir / "inputs.pt")).toGenericDict();
    const at::Tensor x = get(inputs, "x"), q = get(inputs, "q"), k = get(inputs, "k");
    const at::Tensor positions = get(inputs, "positions"), cos = get(inputs, "cos"), sin = get(inputs, "sin");

    c10::Dict<std::string, at::Tensor> out;
    torch::NoGradGuard no_grad;

    // 1) The TorchScript module: it calls posenc::add_sinusoidal, rope, rope_, rope_cos_sin, ...
    torch::jit::Module module = torch::jit::load((dir / "model.pt").string());
    module.eval();
    const auto result = module.forward(std::vector<c10::IValue>{x, q, k, positions, cos, sin}).toGenericDict();
    for (const auto& item : result) {
      out.insert("script." + item.key().toStringRef(), item.value().toTensor());
    }

    // 2) The C++ API of posenc.h directly.
    const at::Tensor inv_freq =
        1.0 / at::pow(10000.0, at::arange(0, q.size(-1), 2, at::kDouble) / static_cast<double>(q.size(-1)));
    auto [rq, rk] = posenc::apply_rope(q, k, positions, inv_freq);
    out.insert("api.rope_q", rq);
    out.insert("api.rope_k", rk);
    out.insert("api.rope_q_default_positions", std::get<0>(posenc::apply_rope(q, k, at::Tensor(), inv_freq)));
    out.insert("api.table", posenc::sinusoidal_table(positions, x.size(-1)));
    // x * 2 + PE at positions 11 .. 11 + S - 1 (the default positions, offset as while decoding)
    out.insert("api.embedded_offset", posenc::add_sinusoidal(x, at::Tensor(), 2.0, 10000.0, true, 0.0, 1.0, false, 11));
    // Relative position biases: T5 (decoder-style, a query after 20 cached tokens) and ALiBi.
    const at::Tensor t5_weight = get(inputs, "t5_weight");  // [32 buckets, heads]
    out.insert("api.t5_bias", posenc::relative_position_bias(t5_weight, 3, 24, false, 32, 128, 21));
    out.insert("api.t5_bias_default_buckets", posenc::relative_position_bias(t5_weight, 3, 24, false, {}, 64, 21));
    const at::Tensor slopes = posenc::alibi_slopes(q.size(2));
    out.insert("api.alibi_slopes", slopes);
    out.insert("api.alibi_bias", posenc::alibi_bias(slopes, 3, 24, 21));

    // 3) An AOTInductor package, when make_inputs.py --aoti wrote one.
    const fs::path pt2 = dir / "model.pt2";
    if (fs::exists(pt2)) {
#ifdef POSENC_EXAMPLE_AOTI
      torch::inductor::AOTIModelPackageLoader loader(pt2.string());
      auto ys = loader.run(std::vector<at::Tensor>{get(inputs, "block_x")});
      out.insert("aoti.out", ys.at(0));
#else
      std::cerr << "note: model.pt2 ignored (built without POSENC_EXAMPLE_AOTI)\n";
#endif
    }

    write_file(dir / "outputs.pt", torch::jit::pickle_save(c10::IValue(out)));
    std::cout << "wrote " << out.size() << " tensors to " << (dir / "outputs.pt").string() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "posenc_example: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
