// CUDA kernel of the sinusoidal ops: a grid-stride loop over the work items of csrc/core/sinusoidal.h
// (one (row, pair) per thread).
#include "cuda/kernels.h"
#include "cuda/launch.cuh"

namespace posenc::cuda {
namespace {

template <typename T>
struct SinusoidalWork {
  SinusoidalProblem p;
  __device__ void operator()(int64_t w) const { sinusoidal_work_item<T>(p, w); }
};

}  // namespace

void run_sinusoidal(const SinusoidalProblem& p, ScalarType dtype) {
  dispatch_float_types(dtype, "posenc.sinusoidal", [&](auto tag) {
    launch_grid_stride(SinusoidalWork<decltype(tag)>{p}, sinusoidal_work_items(p));
  });
}

}  // namespace posenc::cuda
