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
enum PosencArgTag { POSENC_ARG_NONE, POSENC_ARG_TENSOR, POSENC_ARG_INT, POSENC_ARG_FLOAT, POSENC_ARG_BOOL, POSENC_ARG_STR };
typedef struct {
  int32_t tag;
  union {
    void* tensor;    /* a torch.Tensor (PyObject*), borrowed */
    int64_t i;       /* int, and bool (0 or 1) */
    double f;
    const char* s;   /* UTF-8, alive for the call */
  } v;
} PosencArg;

/* Releases the GIL around the kernel (PyEval_SaveThread / PyEval_RestoreThread). */
typedef struct {
  void* (*release)(void);
  void (*reacquire)(void*);
} PosencGil;

/* Runs the op's CPU kernel; called with the GIL held. Returns the number of outputs written to
 * `outputs` (new references to torch.Tensor objects), or -1 when it did nothing: an argument of
 * another kind or device than the kernel takes, or one that the op's checks refuse (which all run
 * before any write). The caller then calls the op through the dispatcher, which raises the op's error. */
typedef int (*PosencDirectKernel)(const PosencArg* args, int64_t nargs, void** outputs, const PosencGil* gil);

/* The op's direct kernel, or NULL: an unknown op, or a torch without the Python interop shims
 * (torch_tensor_from_pyobject, torch >= 2.14). */
PosencDirectKernel posenc_direct_kernel(const char* op_name);

#ifdef __cplusplus
}
#endif
#endif
