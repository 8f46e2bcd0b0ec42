// Defines every op of the posenc library (the schemas of registration.h) through LibTorch's stable
// ABI. Kernels register in csrc/cpu and csrc/cuda (host/backend.h); fake (meta) kernels and autograd
// are registered from Python (posenc_native/ops.py and bias.py).
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/macros.h>

#include <string>
#include <utility>
#include <vector>

#include "registration.h"

// Where the compiled library says which torch it was built with and the oldest torch it loads into
// (its stable-ABI target), readable without loading it: the Python loader
// (posenc_native/_library.py) searches the file for these markers.
extern "C" __attribute__((used, visibility("default"))) const char posenc_built_for_torch[] =
    "posenc-built-for-torch=" POSENC_TORCH_VERSION;
extern "C" __attribute__((used, visibility("default"))) const char posenc_torch_target[] =
    "posenc-torch-target=" POSENC_TORCH_TARGET;

namespace posenc {

std::string build_info_json();  // build_info.cpp

namespace {

// Two stable shims newer than the oldest torch this library targets (2.11): the pt2_compliant tag
// (torch >= 2.12: torch_library_def_with_tags, torch_tag_pt2_compliant_tag) and the Python module
// of the fake kernels (torch >= 2.13: torch_library_set_python_module). torch's
// TORCH_DYNAMIC_VERSION_CALL (stable/macros.h) calls them when the running torch has them and the
// fallbacks below otherwise. Without them an op works the same; it only lacks the tag (which
// matters only under torch._dynamo.config.only_allow_pt2_compliant_ops) and the import hint for its
// fake kernel (posenc_native imports ops.py and bias.py whenever it loads the library).
int32_t no_tag() { return -1; }
AOTITorchError def_without_tags(TorchLibraryHandle lib, const char* schema, const int32_t*, int32_t) {
  return aoti_torch_library_def(lib, schema);
}
AOTITorchError no_python_module(TorchLibraryHandle, const char*, const char*) { return AOTI_TORCH_SUCCESS; }

#if TORCH_FEATURE_VERSION < TORCH_VERSION_2_12_0
#define POSENC_CALL_2_12(shim, fallback, ...) TORCH_DYNAMIC_VERSION_CALL(TORCH_VERSION_2_12_0, shim, fallback, __VA_ARGS__)
#else
#define POSENC_CALL_2_12(shim, fallback, ...) shim(__VA_ARGS__)
#endif

// One library object per Python module: the first defines the namespace, the others are fragments.
class Definitions {
 public:
  Definitions() {
    const int32_t tag = POSENC_CALL_2_12(torch_tag_pt2_compliant_tag, no_tag);
    const auto def = [&](const char* module, const std::string& schema) {
      TorchLibraryHandle lib = library(module);
      if (tag >= 0) {
        STABLE_TORCH_ERROR_CODE_CHECK(
            POSENC_CALL_2_12(torch_library_def_with_tags, def_without_tags, lib, schema.c_str(), &tag, 1));
      } else {
        STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_library_def(lib, schema.c_str()));
      }
    };
    def("posenc_native.ops", "build_info() -> str");
#define POSENC_DEFINE(name, Args, returns, module, ...) \
  def(module, std::string(#name) + Args::schema({__VA_ARGS__}) + " -> " + returns);
    POSENC_OPS(POSENC_DEFINE)
#undef POSENC_DEFINE
  }
  ~Definitions() {
    for (auto& [module, lib] : libs_) aoti_torch_delete_library_object(lib);
  }

 private:
  std::vector<std::pair<std::string, TorchLibraryHandle>> libs_;

  TorchLibraryHandle library(const char* module) {
    for (auto& [m, lib] : libs_) {
      if (m == module) return lib;
    }
    TorchLibraryHandle lib = nullptr;
    if (libs_.empty()) {
      STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_library_init_def("posenc", __FILE__, __LINE__, &lib));
    } else {
      STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_library_init_fragment("posenc", __FILE__, __LINE__, &lib));
    }
    STABLE_TORCH_ERROR_CODE_CHECK(
        TORCH_DYNAMIC_VERSION_CALL_2_13_0(torch_library_set_python_module, no_python_module, lib, module, ""));
    libs_.emplace_back(module, lib);
    return lib;
  }
};

const Definitions kDefinitions;

}  // namespace
}  // namespace posenc

// build_info takes no tensor: one kernel for every device.
STABLE_TORCH_LIBRARY_IMPL(posenc, CompositeExplicitAutograd, m) {
  m.impl("build_info", TORCH_BOX(&posenc::build_info_json));
}
