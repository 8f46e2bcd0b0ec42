// The build facts that posenc::build_info reports (build_info.cpp).
#pragma once

// Called by the CUDA kernels' library (libposenc_ops_cuda.so, cuda/register_cuda.cpp) when it loads:
// build_info then reports CUDA as present, with these facts (string literals). The one symbol the
// two libraries share, with C linkage.
extern "C" __attribute__((visibility("default"))) void posenc_set_cuda_build_facts(const char* cuda_version,
                                                                                   const char* cuda_archs,
                                                                                   const char* cuda_compiler);
