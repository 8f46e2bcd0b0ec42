/* posenc_native._direct: the decode fast path of posenc_native's ops (docs/architecture.md, "The
 * decode fast path"). At decode a call rotates a few kilobytes, so the Python around the op and the
 * dispatcher's argument boxing cost more than the kernel. When nothing is to be recorded or
 * intercepted, rope(), rope_cos_sin() and add_sinusoidal() below run the op's CPU kernel straight away:
 *   - through the op library's direct entry (csrc/direct_entry.h: the tensors handed over as Python
 *     objects, no boxing) where the running torch has the interop shims (torch >= 2.14),
 *   - else through the op's redispatch to the CPU key (what the Autograd and ADInplaceOrView
 *     kernels would do for such a call).
 * They return None, having written nothing, for any call they do not take, and for any call whose
 * arguments the op refuses: the caller then takes the general path, which raises its own error.
 * CPython's stable ABI (abi3): one build serves every CPython >= 3.10. It knows nothing of torch
 * beyond the Python objects bind() hands it, and finds the op library's entry with dlsym. */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030A0000 /* CMake sets it (USE_SABI 3.10) */
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <string.h>

#include "direct_entry.h"

enum { ROPE, ROPE_, ROPE_COS_SIN, ADD_SINUSOIDAL, RELATIVE_POSITION_BIAS, ALIBI_BIAS, N_OPS };
static const char* const op_names[N_OPS] = {"rope", "rope_", "rope_cos_sin", "add_sinusoidal", "relative_position_bias",
                                            "alibi_bias"};

/* What bind() hands over. */
#define MAX_INTERCEPTING 8
static struct {
  PyObject* tensor_type;             /* torch.Tensor: q and k of exactly this type, */
  PyObject* parameter_type;          /* or torch.nn.Parameter (which disables __torch_function__: a plain tensor) */
  PyObject* config_type;             /* posenc_native.RopeConfig */
  PyObject* intercepting[MAX_INTERCEPTING]; /* no-argument callables, true while something intercepts calls */
  int n_intercepting;
  PyObject* inference_mode;          /* torch.is_inference_mode_enabled */
  PyObject* grad_enabled;            /* torch.is_grad_enabled */
  PyObject* dtypes;                  /* {torch.float16: POSENC_DTYPE_FLOAT16, ...}: the dtypes an op's argument may name */
  PyObject* increment_version;       /* torch._C._increment_version((q, k)) */
  PyObject* cpu_keys;                /* the CPU dispatch key set, for the redispatch */
  PyObject* redispatch[N_OPS];       /* each op's OpOverload._handle.redispatch_boxed */
  PyObject* general;                 /* ops._rope: the general path of a rope call */
  PyObject* empty_k;                 /* ops._empty_k(q, layout): the k of zero heads a q-only call passes the op */
  PyObject* nn_module;               /* torch.nn.Module, whose __call__ takes the calls module_call declines */
  PyObject* nn_module_call;          /* nn.Module.__call__ at bind: while another is in place (torch.fx's
                                        tracer patches it), that one takes every call */
  PyObject* strided;                 /* torch.strided: the only layout the redispatch takes (the kernels' own checks) */
  PyObject* embedding_type;          /* torch.nn.Embedding: T5RelativePositionBias's table, exactly of this class */
  PyObject* nn_module_globals;       /* torch.nn.modules.module's namespace: its global hook dicts */
  PyObject* forward_ad_globals;      /* torch.autograd.forward_ad's namespace: _current_level */
  PosencDirectKernel direct[N_OPS];  /* each op's direct kernel, or NULL (torch < 2.14) */
  Py_ssize_t taken[N_OPS];           /* kernel runs on the fast path, for the tests */
} fp;
static PyObject *s_requires_grad, *s_version, *s_is_cpu, *s_frequencies, *s_cpu_plain, *s_shape, *s_call, *s_is_neg, *s_current_level, *s_forward;
/* What nn.Module.__call__ consults before it calls forward (torch/nn/modules/module.py, _wrapped_call_impl
 * and _call_impl): the module's own hooks, the global ones, a compiled call. */
static const char* const hook_names[] = {"_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"};
static const char* const global_hook_names[] = {"_global_forward_hooks", "_global_forward_pre_hooks",
                                                "_global_backward_hooks", "_global_backward_pre_hooks"};
enum { N_HOOK_NAMES = 4 };
static PyObject *s_hooks[N_HOOK_NAMES], *s_global_hooks[N_HOOK_NAMES], *s_compiled_call, *s_config, *s_layout, *s_d_model;
/* What the bias modules' forwards read of self: nn.Module's member tables, and the members. */
static PyObject *s_modules, *s_parameters, *s_buffers, *s_relative_attention_bias, *s_weight, *s_bidirectional,
    *s_num_buckets, *s_max_distance, *s_slopes, *s_output_dtype;
static PyObject *c_zero, *c_one, *c_base; /* 0.0, 1.0 and 10000.0: add_sinusoidal's defaults */
static PyObject* c_offset; /* 0: the module forwards' default offset */

static void* release_gil(void) { return PyEval_SaveThread(); }
static void reacquire_gil(void* state) { PyEval_RestoreThread((PyThreadState*)state); }
static const PosencGil gil = {release_gil, reacquire_gil};

/* 1 for a tensor that nothing intercepts: exactly torch.Tensor or torch.nn.Parameter (a subclass may
 * intercept: the general path). */
static int is_plain_tensor(PyObject* o) {
  PyObject* type = (PyObject*)Py_TYPE(o);
  return type == fp.tensor_type || (type == fp.parameter_type && type != NULL);
}

/* 1 if the attribute is true, 0 if false, -1 on error. */
static int attr_true(PyObject* o, PyObject* name) {
  PyObject* v = PyObject_GetAttr(o, name);
  if (v == NULL) return -1;
  int r = PyObject_IsTrue(v);
  Py_DECREF(v);
  return r;
}
static int call_true(PyObject* f) {
  PyObject* v = PyObject_CallNoArgs(f);
  if (v == NULL) return -1;
  int r = PyObject_IsTrue(v);
  Py_DECREF(v);
  return r;
}
/* 1 for an inference tensor, 0 for another, -1 on error. Reading _version is the cheapest probe
 * (a getter; is_inference() is a method call costing twice as much): an inference tensor has no
 * version counter, so reading it raises. */
static int is_inference(PyObject* t) {
  PyObject* v = PyObject_GetAttr(t, s_version);
  if (v != NULL) return Py_DECREF(v), 0;
  if (!PyErr_ExceptionMatches(PyExc_RuntimeError)) return -1;
  PyErr_Clear();
  return 1;
}

/* 1 if autograd would record a call on t: grad mode on and t requires grad; 0 if not, -1 on error. */
static int grad_wanted(PyObject* t) {
  int r = attr_true(t, s_requires_grad);
  return r == 1 ? call_true(fp.grad_enabled) : r;
}

/* Whether a call on q and k (plain tensors: is_plain_tensor) may skip the dispatcher: no gradient wanted (grad
 * mode off, or neither requires grad), no inference tensor written in place outside inference mode,
 * no functorch transform, dispatch or function mode, profiler, jit tracer or forward-mode AD level
 * active. 1 yes, 0 no, -1 error. (The caller checked torch.compile.) */
static int nothing_intercepts(int in_place, PyObject* q, PyObject* k) {
  int r;
  if ((r = grad_wanted(q)) != 0 || (r = grad_wanted(k)) != 0) return r < 0 ? -1 : 0;
  if (in_place) {
    int inference = is_inference(q);
    if (inference == 0) inference = is_inference(k);
    if (inference < 0) return -1;
    if (inference && (r = call_true(fp.inference_mode)) != 1) return r < 0 ? -1 : 0;
  }
  for (int i = 0; i < fp.n_intercepting; ++i)
    if ((r = call_true(fp.intercepting[i])) != 0) return r < 0 ? -1 : 0;
  /* a forward-mode AD level: q or k may carry a tangent, which the general path carries through */
  PyObject* level = PyDict_GetItemWithError(fp.forward_ad_globals, s_current_level); /* borrowed */
  if (level == NULL) return PyErr_Occurred() ? -1 : 0;
  const long active = PyLong_AsLong(level);
  if (active == -1 && PyErr_Occurred()) return -1;
  return active < 0;
}

/* f(first, args[0..n)), or f(args[0..n)) when first is NULL (vectorcall is not in the limited API
 * before 3.12, so the arguments are packed into a tuple: only the redispatch and declined calls pay it). */
static PyObject* call_packed(PyObject* f, PyObject* first, PyObject* const* args, Py_ssize_t n) {
  const Py_ssize_t skip = first != NULL;
  PyObject* packed = PyTuple_New(n + skip);
  if (packed == NULL) return NULL;
  if (first != NULL) PyTuple_SetItem(packed, 0, Py_NewRef(first));
  for (Py_ssize_t i = 0; i < n; ++i) PyTuple_SetItem(packed, i + skip, Py_NewRef(args[i]));
  PyObject* result = PyObject_Call(f, packed, NULL);
  Py_DECREF(packed);
  return result;
}

/* 1 if tensor t is a negative view (its values are its storage's negated: x.conj().imag), whose
 * storage the kernel would read as stored (the dispatcher's fallback resolves it); 0 if not; -1 on error. */
static int is_negative_view(PyObject* t) {
  PyObject* negative = PyObject_CallMethodObjArgs(t, s_is_neg, NULL);
  const int r = negative == NULL ? -1 : PyObject_IsTrue(negative);
  Py_XDECREF(negative);
  return r;
}

/* One argument as the direct entry takes it; 0 when it has no direct form. */
static int to_arg(PyObject* o, PosencArg* a) {
  if (o == Py_None) {
    a->tag = POSENC_ARG_NONE;
  } else if (o == Py_True || o == Py_False) {
    a->tag = POSENC_ARG_BOOL, a->v.i = o == Py_True;
  } else if (PyLong_Check(o)) {
    int overflow = 0;
    a->tag = POSENC_ARG_INT, a->v.i = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (a->v.i == -1 && PyErr_Occurred())) return PyErr_Clear(), 0;
  } else if (PyFloat_Check(o)) {
    a->tag = POSENC_ARG_FLOAT, a->v.f = PyFloat_AsDouble(o);
  } else if (PyUnicode_Check(o)) {
    Py_ssize_t size = 0;
    a->tag = POSENC_ARG_STR, a->v.s = PyUnicode_AsUTF8AndSize(o, &size);
    if (a->v.s == NULL) return PyErr_Clear(), 0;
    if (strlen(a->v.s) != (size_t)size) return 0; /* an embedded NUL: the C string would end short of it */
  } else if (is_plain_tensor(o)) {
    a->tag = POSENC_ARG_TENSOR, a->v.tensor = o;
  } else {
    PyObject* code = fp.dtypes != NULL ? PyDict_GetItemWithError(fp.dtypes, o) : NULL; /* borrowed */
    if (code == NULL) return PyErr_Clear(), 0; /* (an unhashable object raises) */
    a->tag = POSENC_ARG_DTYPE, a->v.i = PyLong_AsLong(code);
  }
  return 1;
}

/* 1 if each argument is of the exact kind its letter in `kinds` names, else 0: what a fast path
 * takes as it is. Exact types only, so the fast path and the general one agree on every call (a
 * subclass may intercept, and what the general path converts or refuses goes there):
 *   T  a plain tensor          t  a plain tensor or None    0  None
 *   f  a float or an int       F  a float or None           i  an int
 *   b  True or False           B  True, False or None       s  a str    d  a dtype of bind's or None
 *   .  anything (checked apart) */
static int of_kinds(PyObject* const* a, const char* kinds) {
  for (; *kinds; ++a, ++kinds) {
    PyObject* o = *a;
    const int none = o == Py_None, tensor = fp.tensor_type != NULL && is_plain_tensor(o);
    const int boolean = o == Py_True || o == Py_False;
    int ok;
    switch (*kinds) {
      case 'T': ok = tensor; break;
      case 't': ok = tensor || none; break;
      case '0': ok = none; break;
      case 'f': ok = PyFloat_CheckExact(o) || PyLong_CheckExact(o); break;
      case 'F': ok = PyFloat_CheckExact(o) || none; break;
      case 'i': ok = PyLong_CheckExact(o); break;
      case 'b': ok = boolean; break;
      case 'B': ok = boolean || none; break;
      case 's': ok = PyUnicode_CheckExact(o); break;
      case 'd':
        ok = none || (fp.dtypes != NULL && PyDict_Contains(fp.dtypes, o) == 1);
        PyErr_Clear(); /* (an unhashable object raises: not a dtype) */
        break;
      default: ok = 1; break;
    }
    if (!ok) return 0;
  }
  return 1;
}

/* 1 if tensor t's last dimension is n, 0 if not (or t is 0-d), -1 on error. */
static int last_dim_is(PyObject* t, int64_t n) {
  PyObject* shape = PyObject_GetAttr(t, s_shape);
  if (shape == NULL) return -1;
  Py_ssize_t rank = PySequence_Size(shape);
  PyObject* last = rank > 0 ? PySequence_GetItem(shape, rank - 1) : NULL;
  Py_DECREF(shape);
  if (rank <= 0) return rank < 0 ? -1 : 0;
  if (last == NULL) return -1;
  long long v = PyLong_AsLongLong(last);
  Py_DECREF(last);
  return v == -1 && PyErr_Occurred() ? -1 : v == n;
}

/* Runs op's CPU kernel on its schema arguments args[0..n) (q first). Returns its result (None for
 * an in-place op), or None with nothing written when the op refuses the arguments; NULL on an
 * error that is not the op's refusal. *ran says whether the kernel ran. Bit i of checked says
 * args[i] is a tensor that may be a negative view, whose stored values the kernel would read (the
 * config's cached frequencies are the package's own): those are checked, and past q and k (checked
 * by nothing_intercepts) declined when autograd would record them (frequencies, cos/sin that require
 * grad under grad mode: the general path refuses them, rather than drop their gradient). */
#define MAX_ARGS 12
static PyObject* run(int op, PyObject* const* args, Py_ssize_t n, unsigned checked, int64_t q_last_dim, int* ran) {
  *ran = 0;
  /* Every argument of a kind the kernel takes, tensors plain (a subclass may intercept): on either way */
  PosencArg a[MAX_ARGS];
  if (n > MAX_ARGS) Py_RETURN_NONE;
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!to_arg(args[i], &a[i])) Py_RETURN_NONE;
    if (checked & (1u << i) && a[i].tag == POSENC_ARG_TENSOR) {
      const int negative = is_negative_view(args[i]);
      if (negative != 0) return negative < 0 ? NULL : Py_NewRef(Py_None);
      const int wants_grad = i >= 2 ? grad_wanted(args[i]) : 0;
      if (wants_grad != 0) return wants_grad < 0 ? NULL : Py_NewRef(Py_None);
    }
  }
  if (fp.direct[op] != NULL) {
    void* out[2] = {NULL, NULL};
    int got = fp.direct[op](a, n, q_last_dim, out, &gil);
    if (got < 0) Py_RETURN_NONE;
    *ran = 1;
    if (got == 0) Py_RETURN_NONE;
    PyObject* result = got == 1 ? Py_NewRef((PyObject*)out[0]) : PyTuple_Pack(2, (PyObject*)out[0], (PyObject*)out[1]);
    for (int i = 0; i < got; ++i) Py_DECREF((PyObject*)out[i]);
    return result;
  }
  /* The redispatch runs the CPU kernel whatever the tensors' device and layout: only CPU tensors go
   * there, all of them strided (an MKLDNN or sparse one, which the dispatcher refuses, would be read as
   * if it were). */
  int cpu = attr_true(args[0], s_is_cpu);
  if (cpu != 1) return cpu < 0 ? NULL : Py_NewRef(Py_None);
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (a[i].tag != POSENC_ARG_TENSOR) continue;
    PyObject* layout = PyObject_GetAttr(args[i], s_layout);
    if (layout == NULL) return NULL;
    Py_DECREF(layout); /* (identity only) */
    if (layout != fp.strided) Py_RETURN_NONE;
  }
  if (q_last_dim > 0) {
    int same = last_dim_is(args[0], q_last_dim);
    if (same != 1) return same < 0 ? NULL : Py_NewRef(Py_None);
  }
  PyObject* result = call_packed(fp.redispatch[op], fp.cpu_keys, args, n);
  if (result == NULL && PyErr_ExceptionMatches(PyExc_RuntimeError)) { /* the op's refusal, before any write */
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  *ran = result != NULL;
  return result;
}

/* rope_fast(in_place, q, k, positions, config, inv_freq, attention_factor, interleaved, layout, offset,
 *           cu_seqlens, rotary_dim, mrope_section, mrope_interleaved)
 * ops._rope's arguments. Takes plain CPU tensors q and k (or q alone: k None, as the general path
 * passes the op a k of zero heads and returns None for it), config= (a RopeConfig whose CPU frequencies
 * are cached: not its first call, not a scheme that needs the sequence length) or inv_freq=, the
 * other arguments at their defaults or of their exact types, nothing to record or intercept.
 * Returns (q, k) rotated in place (their version counters bumped after the write, as
 * ADInplaceOrView does) or the new (q_out, k_out); None for a call it does not take. */
static PyObject* rope_fast(PyObject* const* a) {
  PyObject *q = a[1], *k = a[2], *positions = a[3], *config = a[4], *inv_freq = a[5], *factor = a[6];
  PyObject *interleaved = a[7], *layout = a[8], *offset = a[9];
  int in_place = PyObject_IsTrue(a[0]);
  int mrope_interleaved = PyObject_IsTrue(a[13]);
  if (in_place < 0 || mrope_interleaved < 0) return NULL;
  /* in_place q k positions config inv_freq factor interleaved layout offset cu_seqlens rotary_dim mrope_section */
  if (mrope_interleaved || !of_kinds(a, ".Ttt....si000")) Py_RETURN_NONE;

  PyObject* plain = NULL; /* the config's (inv_freq, attention_factor, interleaved, head_dim), owned */
  PyObject *freq, *attention, *pairing;
  long long head_dim = 0; /* > 0: q's last dimension must be this (config=) */
  if (config == Py_None) {
    if (!of_kinds(a + 5, "TFB")) Py_RETURN_NONE; /* inv_freq, attention_factor, interleaved */
    freq = inv_freq, attention = factor, pairing = interleaved == Py_True ? Py_True : Py_False;
  } else {
    if ((PyObject*)Py_TYPE(config) != fp.config_type || !of_kinds(a + 5, "000")) Py_RETURN_NONE;
    PyObject* frequencies = PyObject_GetAttr(config, s_frequencies);
    if (frequencies == NULL) return NULL;
    plain = PyObject_GetAttr(frequencies, s_cpu_plain);
    Py_DECREF(frequencies);
    if (plain == NULL) return NULL;
    if (!PyTuple_Check(plain) || PyTuple_Size(plain) != 4) { /* None: not cached (yet) */
      Py_DECREF(plain);
      Py_RETURN_NONE;
    }
    /* q's head_dim must be the config's (the kernel would take any head_dim >= rotary_dim) */
    head_dim = PyLong_AsLongLong(PyTuple_GetItem(plain, 3));
    if (head_dim <= 0) {
      Py_DECREF(plain);
      if (PyErr_Occurred()) return NULL;
      Py_RETURN_NONE;
    }
    freq = PyTuple_GetItem(plain, 0), attention = PyTuple_GetItem(plain, 1), pairing = PyTuple_GetItem(plain, 2);
  }

  PyObject* result = NULL;
  PyObject* k_arg = k; /* what the op gets; owned when made here */
  /* Checked before q alone's k is made: ops._empty_k_reused keeps it, and one made from a tensor of a
   * transform (a vmapped q) would be handed to later plain calls. (That k has no elements and is made
   * outside inference mode: nothing to check on it.) */
  int ok = nothing_intercepts(in_place, q, k == Py_None ? q : k);
  if (ok > 0 && k == Py_None && (k_arg = PyObject_CallFunctionObjArgs(fp.empty_k, q, layout, NULL)) == NULL) {
    PyErr_Clear(); /* a layout or shape the general path explains */
    k_arg = k;
    result = Py_NewRef(Py_None);
    goto done;
  }
  if (ok <= 0) {
    result = ok < 0 ? NULL : Py_NewRef(Py_None);
  } else {
    PyObject* one = NULL;
    if (attention == Py_None && (attention = one = PyFloat_FromDouble(1.0)) == NULL) goto done;
    /* the op's schema: q, k, positions, cu_seqlens, inv_freq, attention_factor, interleaved, layout, offset, inverse */
    PyObject* args[10] = {q, k_arg, positions, Py_None, freq, attention, pairing, layout, offset, Py_False};
    const int op = in_place ? ROPE_ : ROPE;
    int ran;
    /* Negative views: positions and inv_freq= (angles would change sign), and q and k of an out-of-place
     * call (the output would be the negated result). In place the stored values rotate as they are:
     * the rotation is linear, so the view reads R(-x) = -R(x), the correct result. */
    const unsigned checked = (in_place ? 0u : 0x3u) | 0x4u | (config == Py_None ? 0x10u : 0u);
    result = run(op, args, 10, checked, head_dim, &ran);
    Py_XDECREF(one);
    if (ran) {
      fp.taken[op] += 1;
      if (in_place) { /* after the write, as ADInplaceOrView does; returns (q, k) */
        Py_DECREF(result);
        PyObject* written = PyTuple_Pack(2, q, k_arg);
        PyObject* bumped = written ? PyObject_CallFunctionObjArgs(fp.increment_version, written, NULL) : NULL;
        result = bumped == NULL ? NULL : k_arg == k ? Py_NewRef(written) : PyTuple_Pack(2, q, k);
        Py_XDECREF(written);
        Py_XDECREF(bumped);
      } else if (k == Py_None && result != NULL && PyTuple_Check(result)) { /* (q_out, None) */
        PyObject* both = result;
        result = PyTuple_Pack(2, PyTuple_GetItem(both, 0), Py_None);
        Py_DECREF(both);
      }
    }
  }
done:
  if (k_arg != k) Py_DECREF(k_arg);
  Py_XDECREF(plain);
  return result;
}

/* rope(...): rope_fast, and ops._rope (the general path) for the calls it declines. */
static PyObject* rope(PyObject* module, PyObject* const* a, Py_ssize_t nargs) {
  if (nargs != 14 || fp.general == NULL) {
    PyErr_SetString(PyExc_TypeError, "posenc_native._direct.rope takes ops._rope's 14 arguments, after bind()");
    return NULL;
  }
  PyObject* result = rope_fast(a);
  if (result != Py_None) return result;
  Py_DECREF(result);
  return call_packed(fp.general, NULL, a, nargs);
}

/* f(first, args[0..nargs), **{kwnames[i]: args[nargs + i]}): a vectorcall's arguments passed on. */
static PyObject* call_with_keywords(PyObject* f, PyObject* first, PyObject* const* args, Py_ssize_t nargs,
                                    PyObject* kwnames) {
  const Py_ssize_t skip = first != NULL;
  PyObject* packed = PyTuple_New(nargs + skip);
  PyObject* kwargs = kwnames != NULL && PyTuple_Size(kwnames) > 0 ? PyDict_New() : NULL;
  if (packed == NULL || (kwnames != NULL && PyTuple_Size(kwnames) > 0 && kwargs == NULL)) goto fail;
  if (first != NULL) PyTuple_SetItem(packed, 0, Py_NewRef(first));
  for (Py_ssize_t i = 0; i < nargs; ++i) PyTuple_SetItem(packed, i + skip, Py_NewRef(args[i]));
  for (Py_ssize_t i = 0; kwargs != NULL && i < PyTuple_Size(kwnames); ++i)
    if (PyDict_SetItem(kwargs, PyTuple_GetItem(kwnames, i), args[nargs + i]) < 0) goto fail;
  PyObject* result = PyObject_Call(f, packed, kwargs);
  Py_DECREF(packed);
  Py_XDECREF(kwargs);
  return result;
fail:
  Py_XDECREF(packed);
  Py_XDECREF(kwargs);
  return NULL;
}

/* 1 if d[name] is an empty dict, 0 if it is not (or is missing), -1 on error. */
static int empty_dict_at(PyObject* d, PyObject* name) {
  PyObject* v = PyDict_GetItemWithError(d, name); /* borrowed */
  if (v == NULL) return PyErr_Occurred() ? -1 : 0;
  return PyDict_Check(v) && PyDict_Size(v) == 0;
}

/* The module classes whose __call__ module_call stands in for, each with its forward's parameters
 * (after self; the first required, the others default to None, and offset, at offset_at, to 0) and its fast call:
 * what forward would run, from the module's __dict__ and forward's arguments; a result, None to
 * decline (nn.Module.__call__ then runs forward), or NULL on error. */
typedef PyObject* (*ModuleFastCall)(PyObject* dict, PyObject* const* args);
static PyObject* rotary_fast_call(PyObject* dict, PyObject* const* args);
static PyObject* sinusoidal_fast_call(PyObject* dict, PyObject* const* args);
static PyObject* add_sinusoidal_fast(PyObject* const* a, int64_t x_last_dim);
static PyObject* t5_bias_fast_call(PyObject* dict, PyObject* const* args);
static PyObject* alibi_fast_call(PyObject* dict, PyObject* const* args);
static PyObject* bias_fast(int op, PyObject* const* a, Py_ssize_t nargs, Py_ssize_t n, const char* kinds);
enum { MAX_FORWARD = 5 };
static struct {
  const char* name;                     /* module_call's name for it */
  const char* params[MAX_FORWARD];
  Py_ssize_t n_params, offset_at;
  ModuleFastCall fast;
  PyObject *cls, *forward;              /* the class and its forward, once module_call() made its __call__ */
} module_kinds[] = {
    {"RotaryEmbedding", {"q", "k", "positions", "offset", "cu_seqlens"}, 5, 3, rotary_fast_call, NULL, NULL},
    {"SinusoidalPositionalEncoding", {"x", "offset"}, 2, 1, sinusoidal_fast_call, NULL, NULL},
    {"T5RelativePositionBias", {"query_length", "key_length", "query_offset"}, 3, 2, t5_bias_fast_call, NULL, NULL},
    {"ALiBi", {"query_length", "key_length", "query_offset", "dtype"}, 4, 2, alibi_fast_call, NULL, NULL},
};
enum { N_MODULE_KINDS = sizeof(module_kinds) / sizeof(module_kinds[0]) };

/* 1 if nn.Module.__call__ would call the class's forward straight away (no hook of the module's or
 * global, no compiled call, no forward set on the instance or the class: still `forward`), with
 * self's __dict__ in *dict (owned); 0 if not; -1 on error. */
static int plain_module_call(PyObject* self, PyObject* forward, PyObject** dict) {
  if ((*dict = PyObject_GenericGetDict(self, NULL)) == NULL) return -1;
  int r;
  for (int i = 0; i < N_HOOK_NAMES; ++i) {
    if ((r = empty_dict_at(*dict, s_hooks[i])) != 1) return r;
    if ((r = empty_dict_at(fp.nn_module_globals, s_global_hooks[i])) != 1) return r;
  }
  PyObject* compiled = PyDict_GetItemWithError(*dict, s_compiled_call);
  if (compiled != NULL && compiled != Py_None) return 0;
  /* a forward set on the instance (module.forward = f) or on the class is what nn.Module.__call__ calls */
  if ((r = PyDict_Contains(*dict, s_forward)) != 0) return r < 0 ? -1 : 0;
  PyObject* now = PyObject_GetAttr((PyObject*)Py_TYPE(self), s_forward);
  if (now == NULL) return -1;
  Py_DECREF(now); /* (identity only) */
  return now == forward;
}

/* A module kind's __call__(self, *args, **kwargs): what nn.Module.__call__ does, without its two
 * Python frames (a fifth of a decode call): an instance of the class itself (not a subclass) with no
 * hooks runs its fast call on forward's arguments; every other call, and every call the fast call
 * declines, goes to nn.Module.__call__, looked up per call: while it is not the one bind saw (torch.fx's
 * tracer patches it to record module calls), every call goes to it. */
static PyObject* module_call(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  int kind = 0;
  while (kind < N_MODULE_KINDS && (PyObject*)Py_TYPE(self) != module_kinds[kind].cls) ++kind;
  PyObject* forward_args[MAX_FORWARD] = {NULL, NULL, NULL, NULL, NULL};
  PyObject *dict = NULL, *result = NULL;
  int plain = kind < N_MODULE_KINDS && nargs <= module_kinds[kind].n_params;
  const char* const* params = plain ? module_kinds[kind].params : NULL;
  const Py_ssize_t n_params = plain ? module_kinds[kind].n_params : 0;
  for (Py_ssize_t i = 0; plain && i < nargs; ++i) forward_args[i] = args[i];
  const Py_ssize_t nkw = kwnames != NULL ? PyTuple_Size(kwnames) : 0;
  for (Py_ssize_t i = 0; plain && i < nkw; ++i) {
    int found = 0;
    for (Py_ssize_t j = nargs; !found && j < n_params; ++j)
      if (PyUnicode_CompareWithASCIIString(PyTuple_GetItem(kwnames, i), params[j]) == 0)
        found = 1, forward_args[j] = args[nargs + i]; /* (Python passes no name twice) */
    plain = plain && found;
  }
  for (Py_ssize_t j = 0; plain && j < n_params; ++j) { /* the defaults: none for the first, offset 0, else None */
    if (forward_args[j] == NULL) forward_args[j] = j == module_kinds[kind].offset_at ? c_offset : j > 0 ? Py_None : NULL;
    plain = forward_args[j] != NULL;
  }
  PyObject* call = PyObject_GetAttr(fp.nn_module, s_call);
  if (call == NULL) return NULL;
  /* (a patched one not seeing a call would leave a traced graph this call's result as a constant) */
  if (plain && call == fp.nn_module_call) {
    int r = plain_module_call(self, module_kinds[kind].forward, &dict);
    if (r < 0) goto done;
    if (r == 1) {
      if ((result = module_kinds[kind].fast(dict, forward_args)) != Py_None) goto done;
      Py_CLEAR(result);
    }
  }
  result = call_with_keywords(call, self, args, nargs, kwnames);
done:
  Py_DECREF(call);
  Py_XDECREF(dict);
  return result;
}

/* RotaryEmbedding.forward(q, k=None, positions=None, offset=0, cu_seqlens=None): rope_fast with the
 * module's config and layout, held for the call (rope_fast may run Python, a q-only call's empty k,
 * and another thread could then rebind module.config or module.layout, freeing borrowed objects). */
static PyObject* rotary_fast_call(PyObject* dict, PyObject* const* args) {
  PyObject* config = PyDict_GetItemWithError(dict, s_config);
  PyObject* layout = config ? PyDict_GetItemWithError(dict, s_layout) : NULL;
  if (layout == NULL) return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
  Py_INCREF(config);
  Py_INCREF(layout);
  PyObject* a[14] = {Py_False, args[0], args[1], args[2], config, Py_None, Py_None,
                     Py_None, layout, args[3], args[4], Py_None, Py_None, Py_False};
  PyObject* result = rope_fast(a);
  Py_DECREF(config);
  Py_DECREF(layout);
  return result;
}

/* SinusoidalPositionalEncoding.forward(x, offset=0): add_sinusoidal(x, offset=offset) with the
 * defaults, x's last dimension the module's d_model (else forward raises its error). */
static PyObject* sinusoidal_fast_call(PyObject* dict, PyObject* const* args) {
  PyObject* d_model = PyDict_GetItemWithError(dict, s_d_model);
  if (d_model == NULL || !PyLong_CheckExact(d_model)) return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
  const long long dim = PyLong_AsLongLong(d_model);
  if (dim <= 0) return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
  /* x, positions, x_scale, base, interleaved, freq_shift, angle_scale, cos_first, offset */
  PyObject* a[9] = {args[0], Py_None, c_one, c_base, Py_True, c_zero, c_one, Py_False, args[1]};
  return add_sinusoidal_fast(a, dim);
}

/* The member `name` of the nn.Module whose __dict__ is dict, where nn.Module.__getattr__ finds it:
 * in dict[table] (_parameters, _buffers or _modules), nothing of that name in dict itself. Borrowed;
 * NULL without an error where it is not there. */
static PyObject* module_member(PyObject* dict, PyObject* table, PyObject* name) {
  PyObject* members = PyDict_GetItemWithError(dict, table);
  if (members == NULL || !PyDict_Check(members)) return NULL;
  int shadowed = PyDict_Contains(dict, name);
  return shadowed == 0 ? PyDict_GetItemWithError(members, name) : NULL;
}

/* T5RelativePositionBias.forward(query_length, key_length, query_offset=0): relative_position_bias
 * with the module's settings and the weight of its relative_attention_bias (exactly an nn.Embedding,
 * whose forward the op does not call), all held for the call (bias_fast may run Python). */
static PyObject* t5_bias_fast_call(PyObject* dict, PyObject* const* args) {
  PyObject* embedding = module_member(dict, s_modules, s_relative_attention_bias);
  if (embedding == NULL || (PyObject*)Py_TYPE(embedding) != fp.embedding_type)
    return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
  PyObject* embedding_dict = PyObject_GenericGetDict(embedding, NULL);
  if (embedding_dict == NULL) return NULL;
  /* weight, query_length, key_length, bidirectional, num_buckets, max_distance, query_offset */
  PyObject* a[7] = {module_member(embedding_dict, s_parameters, s_weight), args[0], args[1], NULL, NULL, NULL, args[2]};
  if (a[0] != NULL) a[3] = PyDict_GetItemWithError(dict, s_bidirectional);
  if (a[3] != NULL) a[4] = PyDict_GetItemWithError(dict, s_num_buckets);
  if (a[4] != NULL) a[5] = PyDict_GetItemWithError(dict, s_max_distance);
  PyObject* result = NULL;
  if (a[5] != NULL) {
    const int held[] = {0, 3, 4, 5};
    for (int i = 0; i < 4; ++i) Py_INCREF(a[held[i]]);
    result = bias_fast(RELATIVE_POSITION_BIAS, a, 7, 7, "Tiibiii");
    for (int i = 0; i < 4; ++i) Py_DECREF(a[held[i]]);
  } else if (!PyErr_Occurred()) {
    result = Py_NewRef(Py_None);
  }
  Py_DECREF(embedding_dict);
  return result;
}

/* ALiBi.forward(query_length, key_length, query_offset=0, dtype=None): alibi_bias with the module's
 * slopes buffer, dtype by default its output_dtype, both held for the call. */
static PyObject* alibi_fast_call(PyObject* dict, PyObject* const* args) {
  PyObject* slopes = module_member(dict, s_buffers, s_slopes);
  PyObject* dtype = slopes == NULL ? NULL : args[3] != Py_None ? args[3] : PyDict_GetItemWithError(dict, s_output_dtype);
  if (dtype == NULL) return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
  PyObject* a[5] = {Py_NewRef(slopes), args[0], args[1], args[2], Py_NewRef(dtype)};
  PyObject* result = bias_fast(ALIBI_BIAS, a, 5, 5, "Tiiid");
  Py_DECREF(a[0]);
  Py_DECREF(a[4]);
  return result;
}

static PyMethodDef module_call_def = {"__call__", (PyCFunction)(void (*)(void))module_call,
                                      METH_FASTCALL | METH_KEYWORDS, "nn.Module.__call__, without its Python frames"};

/* module_call(cls) -> cls.__call__ (a method descriptor of cls, after bind()), for the module kinds
 * above, named by cls.__name__. */
static PyObject* make_module_call(PyObject* module, PyObject* cls) {
  int kind = 0;
  PyObject* name = PyType_Check(cls) ? PyObject_GetAttrString(cls, "__name__") : NULL;
  while (name != NULL && kind < N_MODULE_KINDS && PyUnicode_CompareWithASCIIString(name, module_kinds[kind].name) != 0)
    ++kind;
  Py_XDECREF(name);
  PyErr_Clear();
  if (name == NULL || kind == N_MODULE_KINDS || fp.nn_module == NULL) {
    PyErr_SetString(PyExc_TypeError,
                    "posenc_native._direct.module_call takes RotaryEmbedding, SinusoidalPositionalEncoding, "
                    "T5RelativePositionBias or ALiBi, after bind()");
    return NULL;
  }
  PyObject* forward = PyObject_GetAttr(cls, s_forward);
  if (forward == NULL) return NULL;
  Py_XDECREF(module_kinds[kind].forward);
  Py_XDECREF(module_kinds[kind].cls);
  module_kinds[kind].forward = forward, module_kinds[kind].cls = Py_NewRef(cls);
  return PyDescr_NewMethod((PyTypeObject*)cls, &module_call_def);
}

/* rope_cos_sin(q, k, cos, sin, positions, layout): ops.apply_rotary_pos_emb's call, after its
 * checks. Returns (q_out, k_out), or None for a call it does not take. */
static PyObject* rope_cos_sin(PyObject* module, PyObject* const* a, Py_ssize_t nargs) {
  if (nargs != 6) {
    PyErr_SetString(PyExc_TypeError, "posenc_native._direct.rope_cos_sin takes 6 arguments");
    return NULL;
  }
  if (!of_kinds(a, "TT")) Py_RETURN_NONE;
  int ok = nothing_intercepts(0, a[0], a[1]);
  if (ok <= 0) return ok < 0 ? NULL : Py_NewRef(Py_None);
  PyObject* args[7] = {a[0], a[1], a[2], a[3], a[4], a[5], Py_False}; /* ..., layout, inverse */
  int ran;
  PyObject* result = run(ROPE_COS_SIN, args, 7, 0xFu /* q, k, cos, sin */, 0, &ran);
  fp.taken[ROPE_COS_SIN] += ran;
  return result;
}

/* add_sinusoidal's fast path on the op's arguments a[0..9) (x, positions, x_scale, base, interleaved,
 * freq_shift, angle_scale, cos_first, offset), as ops.add_sinusoidal was given them, before its checks
 * (an argument of another type is declined, and the general path explains it); x_last_dim > 0: x's
 * last dimension must be this. Returns x * x_scale + PE, or None for a call it does not take. */
static PyObject* add_sinusoidal_fast(PyObject* const* a, int64_t x_last_dim) {
  PyObject *x = a[0], *positions = a[1];
  if (!of_kinds(a, "Ttffbffbi")) Py_RETURN_NONE;
  /* x, and positions (float ones that want a gradient are the general path's to refuse) */
  int ok = nothing_intercepts(0, x, positions == Py_None ? x : positions);
  if (ok <= 0) return ok < 0 ? NULL : Py_NewRef(Py_None);
  int ran;
  PyObject* result = run(ADD_SINUSOIDAL, a, 9, 0x3u /* x, positions: negative views */, x_last_dim, &ran);
  fp.taken[ADD_SINUSOIDAL] += ran;
  return result;
}

static PyObject* add_sinusoidal(PyObject* module, PyObject* const* a, Py_ssize_t nargs) {
  if (nargs != 9) {
    PyErr_SetString(PyExc_TypeError, "posenc_native._direct.add_sinusoidal takes the op's 9 arguments");
    return NULL;
  }
  return add_sinusoidal_fast(a, 0);
}

/* A bias op's fast path on its arguments a[0..n), as bias.py's function passes them after its defaults
 * (`kinds`: their types, of_kinds; the first the weight or slopes table). Returns the bias, or None
 * for a call it does not take. */
static PyObject* bias_fast(int op, PyObject* const* a, Py_ssize_t nargs, Py_ssize_t n, const char* kinds) {
  if (nargs != n) {
    PyErr_Format(PyExc_TypeError, "posenc_native._direct.%s takes the op's %zd arguments", op_names[op], n);
    return NULL;
  }
  if (!of_kinds(a, kinds)) Py_RETURN_NONE;
  int ok = nothing_intercepts(0, a[0], a[0]);
  if (ok <= 0) return ok < 0 ? NULL : Py_NewRef(Py_None);
  int ran;
  PyObject* result = run(op, a, n, 0x1u /* the table: a negative view */, 0, &ran);
  fp.taken[op] += ran;
  return result;
}

/* relative_position_bias(weight, query_length, key_length, bidirectional, num_buckets, max_distance,
 * query_offset) and alibi_bias(slopes, query_length, key_length, query_offset, dtype): the ops' fast
 * paths. */
static PyObject* relative_position_bias(PyObject* module, PyObject* const* a, Py_ssize_t nargs) {
  return bias_fast(RELATIVE_POSITION_BIAS, a, nargs, 7, "Tiibiii");
}
static PyObject* alibi_bias(PyObject* module, PyObject* const* a, Py_ssize_t nargs) {
  return bias_fast(ALIBI_BIAS, a, nargs, 5, "Tiiid");
}

static int take(PyObject* dict, const char* key, PyObject** slot) {
  PyObject* v = PyDict_GetItemString(dict, key); /* borrowed */
  if (v == NULL) {
    PyErr_Format(PyExc_KeyError, "posenc_native._direct.bind: %s missing", key);
    return 0;
  }
  Py_XDECREF(*slot);
  *slot = Py_NewRef(v);
  return 1;
}

/* bind(library_path, objects: dict) -> bool: whether the kernels run through the direct entry
 * (else through the redispatch). objects: tensor, config, intercepting (a tuple of callables),
 * inference_mode, grad_enabled, dtypes, increment_version, cpu_keys, general (ops._rope), empty_k, nn_module,
 * strided, nn_module_globals, embedding, forward_ad_globals, and each op's redispatch under its name. */
static PyObject* bind(PyObject* module, PyObject* args) {
  const char* path;
  PyObject* objects;
  if (!PyArg_ParseTuple(args, "sO!", &path, &PyDict_Type, &objects)) return NULL;
  PyObject* intercepting = NULL;
  if (!take(objects, "tensor", &fp.tensor_type) || !take(objects, "parameter", &fp.parameter_type) ||
      !take(objects, "config", &fp.config_type) ||
      !take(objects, "inference_mode", &fp.inference_mode) || !take(objects, "increment_version", &fp.increment_version) ||
      !take(objects, "grad_enabled", &fp.grad_enabled) || !take(objects, "dtypes", &fp.dtypes) ||
      !take(objects, "cpu_keys", &fp.cpu_keys) || !take(objects, "general", &fp.general) ||
      !take(objects, "empty_k", &fp.empty_k) ||
      !take(objects, "nn_module", &fp.nn_module) || !take(objects, "strided", &fp.strided) ||
      !take(objects, "nn_module_globals", &fp.nn_module_globals) ||
      !take(objects, "embedding", &fp.embedding_type) ||
      !take(objects, "forward_ad_globals", &fp.forward_ad_globals) ||
      !take(objects, "intercepting", &intercepting))
    return NULL;
  Py_XDECREF(fp.nn_module_call);
  if ((fp.nn_module_call = PyObject_GetAttr(fp.nn_module, s_call)) == NULL) return Py_XDECREF(intercepting), NULL;
  Py_ssize_t n = PyTuple_Check(intercepting) ? PyTuple_Size(intercepting) : -1;
  for (int i = 0; i < fp.n_intercepting; ++i) Py_CLEAR(fp.intercepting[i]);
  fp.n_intercepting = 0;
  for (; fp.n_intercepting < n && n <= MAX_INTERCEPTING; ++fp.n_intercepting)
    fp.intercepting[fp.n_intercepting] = Py_NewRef(PyTuple_GetItem(intercepting, fp.n_intercepting));
  Py_DECREF(intercepting);
  if (n < 0 || n > MAX_INTERCEPTING) {
    PyErr_SetString(PyExc_TypeError, "posenc_native._direct.bind: intercepting must be a tuple of at most 8 callables");
    return NULL;
  }
  for (int op = 0; op < N_OPS; ++op)
    if (!take(objects, op_names[op], &fp.redispatch[op])) return NULL;

  void* lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD); /* the library torch loaded, or nothing */
  PosencDirectKernel (*kernel_named)(const char*) =
      lib ? (PosencDirectKernel(*)(const char*))dlsym(lib, POSENC_DIRECT_KERNEL_SYMBOL) : NULL;
  int direct = kernel_named != NULL;
  for (int op = 0; op < N_OPS; ++op) direct = direct && (fp.direct[op] = kernel_named(op_names[op])) != NULL;
  if (!direct)
    for (int op = 0; op < N_OPS; ++op) fp.direct[op] = NULL;
  if (lib) dlclose(lib); /* drops the reference NOLOAD took; torch keeps the library loaded */
  return PyBool_FromLong(direct);
}

/* taken() -> {op name: kernel runs on the fast path so far} (for the tests). */
static PyObject* taken(PyObject* module, PyObject* unused) {
  PyObject* d = PyDict_New();
  for (int op = 0; d != NULL && op < N_OPS; ++op) {
    PyObject* n = PyLong_FromSsize_t(fp.taken[op]);
    if (n == NULL || PyDict_SetItemString(d, op_names[op], n) < 0) Py_CLEAR(d);
    Py_XDECREF(n);
  }
  return d;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, "bind(library_path, objects) -> bool (direct entry in use)"},
    {"rope", (PyCFunction)(void (*)(void))rope, METH_FASTCALL, "a rope call: the fast path, else ops._rope"},
    {"rope_cos_sin", (PyCFunction)(void (*)(void))rope_cos_sin, METH_FASTCALL, "apply_rotary_pos_emb's fast path"},
    {"add_sinusoidal", (PyCFunction)(void (*)(void))add_sinusoidal, METH_FASTCALL, "add_sinusoidal's fast path"},
    {"relative_position_bias", (PyCFunction)(void (*)(void))relative_position_bias, METH_FASTCALL,
     "relative_position_bias's fast path"},
    {"alibi_bias", (PyCFunction)(void (*)(void))alibi_bias, METH_FASTCALL, "alibi_bias's fast path"},
    {"taken", taken, METH_NOARGS, "kernel runs on the fast path, per op"},
    {"module_call", make_module_call, METH_O,
     "module_call(cls) -> its __call__ (RotaryEmbedding, SinusoidalPositionalEncoding, T5RelativePositionBias, ALiBi)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_direct", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__direct(void) {
  const char* names[] = {"requires_grad", "_version", "is_cpu", "_frequencies", "cpu_plain", "shape", "__call__",
                         "_compiled_call_impl", "config", "layout", "is_neg", "_current_level", "forward", "d_model",
                         "_modules", "_parameters", "_buffers", "relative_attention_bias", "weight", "bidirectional",
                         "num_buckets", "max_distance", "slopes", "output_dtype"};
  PyObject** slots[] = {&s_requires_grad, &s_version, &s_is_cpu, &s_frequencies, &s_cpu_plain, &s_shape, &s_call,
                        &s_compiled_call, &s_config, &s_layout, &s_is_neg, &s_current_level, &s_forward, &s_d_model,
                        &s_modules, &s_parameters, &s_buffers, &s_relative_attention_bias, &s_weight, &s_bidirectional,
                        &s_num_buckets, &s_max_distance, &s_slopes, &s_output_dtype};
  for (size_t i = 0; i < sizeof(slots) / sizeof(slots[0]); ++i)
    if ((*slots[i] = PyUnicode_InternFromString(names[i])) == NULL) return NULL;
  if ((c_zero = PyFloat_FromDouble(0.0)) == NULL || (c_one = PyFloat_FromDouble(1.0)) == NULL ||
      (c_base = PyFloat_FromDouble(10000.0)) == NULL || (c_offset = PyLong_FromLong(0)) == NULL)
    return NULL;
  for (int i = 0; i < N_HOOK_NAMES; ++i)
    if ((s_hooks[i] = PyUnicode_InternFromString(hook_names[i])) == NULL ||
        (s_global_hooks[i] = PyUnicode_InternFromString(global_hook_names[i])) == NULL)
      return NULL;
  PyObject* module = PyModule_Create(&module_def);
  /* DTYPES[d]: torch's name of PosencDtype d (bind's dtypes map those torch.dtype objects to d) */
  static const char* const dtype_names[] = {"float16", "bfloat16", "float32", "float64"};
  _Static_assert(sizeof(dtype_names) / sizeof(dtype_names[0]) == POSENC_N_DTYPES, "a name per PosencDtype");
  PyObject* dtypes = PyTuple_New(POSENC_N_DTYPES);
  for (int d = 0; dtypes != NULL && d < POSENC_N_DTYPES; ++d) {
    PyObject* name = PyUnicode_FromString(dtype_names[d]);
    if (name == NULL || PyTuple_SetItem(dtypes, d, name) < 0) Py_CLEAR(dtypes);
  }
  if (module == NULL || dtypes == NULL || PyModule_AddObjectRef(module, "DTYPES", dtypes) < 0) {
    Py_XDECREF(dtypes);
    Py_XDECREF(module);
    return NULL;
  }
  Py_DECREF(dtypes);
  return module;
}
