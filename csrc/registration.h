// Every schema of the posenc library, written once. Each op's argument list below generates
//   - its schema string (registration.cpp defines the ops with it),
//   - the argument struct the host code and backends take (host/plan.h, host/bias_plan.h), and
//   - the unboxing of that struct from the dispatcher's stack (host/backend.h registers the kernels).
// Adding an argument to an op is one line here and its use in csrc/host; the Python fake kernels and
// autograd read the arguments by name from the registered schema (posenc_native/_op_args.py).
#pragma once
#include <torch/csrc/stable/stableivalue_conversions.h>

#include <initializer_list>
#include <string>
#include <string_view>

#include "host/stable.h"

namespace posenc::arg {

// Argument kinds: the C++ type a kernel sees and the schema type.
struct Tensor {
  using type = posenc::Tensor;
  static constexpr const char* schema = "Tensor";
};
struct OptTensor {
  using type = posenc::OptTensor;
  static constexpr const char* schema = "Tensor?";
};
struct Int {
  using type = int64_t;
  static constexpr const char* schema = "int";
};
// An int that torch.compile may keep symbolic (no recompile per value); a concrete int64 here.
struct SymInt {
  using type = int64_t;
  static constexpr const char* schema = "SymInt";
};
// An int added to positions that defaults to 0: appended to an op that had none, so calls written
// before it (TorchScript, C++, positional Python) still bind.
struct OffsetSymInt {
  using type = int64_t;
  static constexpr const char* schema = "SymInt";
  static constexpr const char* default_value = "0";
};
struct Float {
  using type = double;
  static constexpr const char* schema = "float";
};
struct Bool {
  using type = bool;
  static constexpr const char* schema = "bool";
};
struct Str {
  using type = std::string;
  static constexpr const char* schema = "str";
};
struct Dtype {
  using type = ScalarType;
  static constexpr const char* schema = "ScalarType";
};
struct OptDtype {
  using type = std::optional<ScalarType>;
  static constexpr const char* schema = "ScalarType?";
};

// A kind's default ("=0"), or none.
template <typename Kind>
constexpr const char* default_of() {
  if constexpr (requires { Kind::default_value; }) {
    return Kind::default_value;
  } else {
    return nullptr;
  }
}

// "Tensor q, Tensor k, ...": the mutated tensors (in-place ops) get alias sets a!, b!, ...
inline void append(std::string& s, const char* type, const char* name, std::initializer_list<std::string_view> mutated,
                   const char* default_value = nullptr) {
  if (!s.empty()) s += ", ";
  s += type;
  char alias = 'a';
  for (std::string_view m : mutated) {
    if (m == name) (s += '(') += alias, s += "!)";
    ++alias;
  }
  (s += ' ') += name;
  if (default_value) (s += '=') += default_value;
}

}  // namespace posenc::arg

#define POSENC_ARG_FIELD(kind, name) ::posenc::arg::kind::type name{};
#define POSENC_ARG_COUNT(kind, name) +1
#define POSENC_ARG_MAKE(kind, name) next.template operator()<::posenc::arg::kind::type>(),
#define POSENC_ARG_SCHEMA(kind, name) \
  ::posenc::arg::append(s, ::posenc::arg::kind::schema, #name, mutated, ::posenc::arg::default_of<::posenc::arg::kind>());
#define POSENC_ARG_VISIT(kind, name) f(name);

// struct Name { fields...; count; make(next); unbox(stack); schema(mutated); visit(f) }
#define POSENC_ARGS_STRUCT(Name, LIST)                                                    \
  struct Name {                                                                          \
    LIST(POSENC_ARG_FIELD)                                                               \
    static constexpr uint64_t count = 0 LIST(POSENC_ARG_COUNT);                          \
    /* The fields in order from next.operator()<T>() (a braced list: evaluated in order), each */ \
    /* built once: a default-built tensor field would allocate a handle only to drop it. */ \
    template <typename Next>                                                             \
    static Name make(Next&& next) {                                                      \
      return Name{LIST(POSENC_ARG_MAKE)};                                                \
    }                                                                                    \
    /* Takes ownership of the count inputs on the stack (the stable ABI's calling convention). */ \
    static Name unbox(StableIValue* stack) {                                             \
      int i = 0;                                                                         \
      return make([&]<typename T>() { return torch::stable::detail::to<T>(stack[i++]); }); \
    }                                                                                    \
    static std::string schema(std::initializer_list<std::string_view> mutated = {}) {    \
      std::string s;                                                                     \
      LIST(POSENC_ARG_SCHEMA)                                                            \
      return "(" + s + ")";                                                              \
    }                                                                                    \
    template <typename F>                                                                \
    void visit(F&& f) const {                                                            \
      LIST(POSENC_ARG_VISIT)                                                             \
    }                                                                                    \
  };

namespace posenc {

// ---- Sinusoidal tables: positions [N] (integer or float) -> [N, dim].
#define POSENC_SINUSOIDAL_TABLE_ARGS(X) \
  X(Tensor, positions) X(Int, dim) X(Float, base) X(Bool, interleaved) X(Float, freq_shift) \
  X(Float, angle_scale) X(Bool, cos_first) X(Dtype, dtype)
POSENC_ARGS_STRUCT(SinusoidalTableArgs, POSENC_SINUSOIDAL_TABLE_ARGS)

// x * x_scale + PE[positions + offset]; x [B, S, D] or [S, D], positions [S] or [B, S] (none: 0 .. S-1).
#define POSENC_ADD_SINUSOIDAL_ARGS(X) \
  X(Tensor, x) X(OptTensor, positions) X(Float, x_scale) X(Float, base) X(Bool, interleaved) X(Float, freq_shift) \
  X(Float, angle_scale) X(Bool, cos_first) X(OffsetSymInt, offset)
POSENC_ARGS_STRUCT(AddSinusoidalArgs, POSENC_ADD_SINUSOIDAL_ARGS)

// ---- RoPE with angles from inv_freq (rotary_dim = 2 * len(inv_freq)); k may have zero heads.
// layout: 'bshd', 'bhsd' or 'thd'. inverse applies the transposed rotation (the backward).
// offset is a SymInt so a compiled decode loop does not recompile for every new position.
// rope returns (q_out, k_out); rope_ rotates q and k in place.
#define POSENC_ROPE_ARGS(X) \
  X(Tensor, q) X(Tensor, k) X(OptTensor, positions) X(OptTensor, cu_seqlens) X(Tensor, inv_freq) \
  X(Float, attention_factor) X(Bool, interleaved) X(Str, layout) X(SymInt, offset) X(Bool, inverse)
POSENC_ARGS_STRUCT(RopeArgs, POSENC_ROPE_ARGS)

// RoPE with a given cos/sin table (transformers' convention; half-split pairs).
#define POSENC_ROPE_COS_SIN_ARGS(X) \
  X(Tensor, q) X(Tensor, k) X(Tensor, cos) X(Tensor, sin) X(OptTensor, positions) X(Str, layout) X(Bool, inverse)
POSENC_ARGS_STRUCT(RopeCosSinArgs, POSENC_ROPE_COS_SIN_ARGS)

// The in-place rotation's checks of q and k's memory alone (no element held twice, q and k apart;
// any shapes), for code that rotates out of place and copies the result back (compiled or
// torch.func apply_rope_, posenc_native/ops.py). Returns a copy of inv_freq for that rotation to
// read: the data dependency orders the check before every write of a compiled graph.
#define POSENC_ROPE_IN_PLACE_CHECK_ARGS(X) X(Tensor, q) X(Tensor, k) X(Tensor, inv_freq)
POSENC_ARGS_STRUCT(RopeInPlaceCheckArgs, POSENC_ROPE_IN_PLACE_CHECK_ARGS)

// ---- Relative position biases. T5: transformers' _relative_position_bucket of int relative positions
// (memory - context), and the bias weight[bucket(j - i - query_offset), h] from weight [num_buckets,
// heads]. ALiBi: slopes[h] * (j - i - query_offset). Biases are [1, heads, query_length, key_length];
// the backward ops take its gradient (any strides) to the weight's / slopes' gradient.
#define POSENC_T5_BUCKET_ARGS(X) \
  X(Tensor, relative_position) X(Bool, bidirectional) X(Int, num_buckets) X(Int, max_distance)
POSENC_ARGS_STRUCT(T5BucketArgs, POSENC_T5_BUCKET_ARGS)

#define POSENC_RELATIVE_BIAS_ARGS(X) \
  X(Tensor, weight) X(SymInt, query_length) X(SymInt, key_length) X(Bool, bidirectional) X(Int, num_buckets) \
  X(Int, max_distance) X(SymInt, query_offset)
POSENC_ARGS_STRUCT(RelativeBiasArgs, POSENC_RELATIVE_BIAS_ARGS)

#define POSENC_RELATIVE_BIAS_BACKWARD_ARGS(X) \
  X(Tensor, grad) X(Bool, bidirectional) X(Int, num_buckets) X(Int, max_distance) X(SymInt, query_offset)
POSENC_ARGS_STRUCT(RelativeBiasBackwardArgs, POSENC_RELATIVE_BIAS_BACKWARD_ARGS)

#define POSENC_ALIBI_ARGS(X) \
  X(Tensor, slopes) X(SymInt, query_length) X(SymInt, key_length) X(SymInt, query_offset) X(OptDtype, dtype)
POSENC_ARGS_STRUCT(AlibiArgs, POSENC_ALIBI_ARGS)

#define POSENC_ALIBI_BACKWARD_ARGS(X) X(Tensor, grad) X(SymInt, query_offset)
POSENC_ARGS_STRUCT(AlibiBackwardArgs, POSENC_ALIBI_BACKWARD_ARGS)

// Every op: its name, argument struct, returns, the Python module holding its fake kernel and
// autograd (torch imports it when it needs them), and its mutated arguments. registration.cpp
// defines them; host/backend.h registers each backend's kernel for every entry.
// X(name, Args, returns, python_module, mutated...)
#define POSENC_OPS(X)                                                                            \
  X(sinusoidal_table, SinusoidalTableArgs, "Tensor", "posenc_native.ops")                        \
  X(add_sinusoidal, AddSinusoidalArgs, "Tensor", "posenc_native.ops")                            \
  X(rope, RopeArgs, "(Tensor, Tensor)", "posenc_native.ops")                                     \
  X(rope_, RopeArgs, "()", "posenc_native.ops", "q", "k")                                        \
  X(rope_cos_sin, RopeCosSinArgs, "(Tensor, Tensor)", "posenc_native.ops")                       \
  X(rope_cos_sin_, RopeCosSinArgs, "()", "posenc_native.ops", "q", "k")                          \
  X(rope_in_place_check, RopeInPlaceCheckArgs, "Tensor", "posenc_native.ops")                    \
  X(t5_relative_position_bucket, T5BucketArgs, "Tensor", "posenc_native.bias")                   \
  X(relative_position_bias, RelativeBiasArgs, "Tensor", "posenc_native.bias")                    \
  X(relative_position_bias_backward, RelativeBiasBackwardArgs, "Tensor", "posenc_native.bias")   \
  X(alibi_bias, AlibiArgs, "Tensor", "posenc_native.bias")                                       \
  X(alibi_bias_backward, AlibiBackwardArgs, "Tensor", "posenc_native.bias")

}  // namespace posenc
