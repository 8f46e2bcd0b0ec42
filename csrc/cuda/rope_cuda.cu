// CUDA kernel of the RoPE ops: a grid-stride loop over the work items of csrc/core/rope_chunks.h
// (one (token, chunk) per thread), with 16-byte vectors when every row is aligned.
#include "core/rope_chunks.h"
#include "cuda/kernels.h"
#include "cuda/launch.cuh"

namespace posenc::cuda {
namespace {

template <typename T, int V, bool kInterleaved>
struct RopeWork {
  RopeProblem p;
  RopeChunks chunks;
  __device__ void operator()(int64_t w) const { rope_work_item<T, V, kInterleaved>(p, chunks, w); }
};

template <typename T, int V>
void launch(const RopeProblem& p) {
  const RopeChunks chunks = rope_chunks<V>(p);
  const int64_t work = p.batch * p.seq * chunks.per_token();
  if (p.interleaved) {
    launch_grid_stride(RopeWork<T, V, true>{p, chunks}, work);
  } else {
    launch_grid_stride(RopeWork<T, V, false>{p, chunks}, work);
  }
}

}  // namespace

void run_rope(const RopeProblem& p, ScalarType dtype) {
  dispatch_float_types(dtype, "posenc.rope", [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVec = 16 / sizeof(T);
    if (rope_vector_ok<T, kVec>(p)) {
      launch<T, kVec>(p);
    } else {
      launch<T, 1>(p);
    }
  });
}

}  // namespace posenc::cuda
