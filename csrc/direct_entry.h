/* The op library's second way in, for the Python package's decode fast path (docs/architecture.md,
 * "The direct entry"): an op's CPU kernel called with Python tensors, without the dispatcher's
 * argument boxing. A plain C interface between libposenc_ops.so (which has no Python in it: tensors
 * arrive as opaque PyObject pointers and torch's stable shims convert them) and the small CPython
 * extension csrc/python/direct.c (which knows Python but not torch). */
#ifndef POSENC_DIRECT_ENTRY_H
#define POSENC_DIRECT_ENTRY_H
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One argument of an op's schema, in schema order. */
enum PosencArgTag { POSENC_ARG_NONE, POSENC_ARG_TENSOR, POSENC_ARG_INT, POSENC_ARG_FLOAT, POSENC_ARG_BOOL, POSENC_ARG_STR,
                    POSENC_ARG_DTYPE };
/* A dtype argument's value (the entry's own numbering, so the extension needs none of torch's). */
enum PosencDtype { POSENC_DTYPE_FLOAT16, POSENC_DTYPE_BFLOAT16, POSENC_DTYPE_FLOAT32, POSENC_DTYPE_FLOAT64, POSENC_N_DTYPES };
typedef struct {
  int32_t tag;
  union {
    void* tensor;    /* a torch.Tensor (PyObject*), borrowed */
    int64_t i;       /* int, bool (0 or 1) and dtype (a PosencDtype) */
    double f;
    const char* s;   /* UTF-8, alive for the call */
  } v;
} PosencArg;

/* Releases the GIL around the kernel (PyEval_SaveThread / PyEval_RestoreThread). */
typedef struct {
  void* (*release)(void);
  void (*reacquire)(void*);
} PosencGil;

/* Runs the op's CPU kernel; called with the GIL held. lead_last_dim > 0 also requires the op's first
 * tensor argument to have that last dimension (a config's head_dim, which the op cannot know).
 * Returns the number of outputs written to `outputs` (new references to torch.Tensor objects), or -1
 * when it did nothing: an argument of another kind or device than the kernel takes, a lead_last_dim
 * not met, or an argument that the op's checks refuse (they all run before any write). The caller
 * then takes its general path, which raises the error. */
typedef int (*PosencDirectKernel)(const PosencArg* args, int64_t nargs, int64_t lead_last_dim, void** outputs,
                                  const PosencGil* gil);

/* The op's direct kernel, or NULL: an unknown op, or a torch without the Python interop shims
 * (torch_tensor_from_pyobject, torch >= 2.14). The name carries this interface's version: an
 * extension and an op library from different builds find no common entry (and use the redispatch)
 * instead of calling through a changed signature. */
#define POSENC_DIRECT_KERNEL_SYMBOL "posenc_direct_kernel_v1"
PosencDirectKernel posenc_direct_kernel_v1(const char* op_name);

#ifdef __cplusplus
}
#endif
#endif
