// StableHLO builder: typed values, ops with shape inference, module text.
// Emits MLIR generic-form text ("stablehlo.add"(%1, %2) : (...) -> ...), which
// every PJRT plugin's StableHLO parser accepts.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace tt::hlo {

enum class DType { Pred, S8, S16, S32, S64, U8, U32, F16, BF16, F32, F64, C64, U16, U64, C128 };

const char* mlir_name(DType t);  // "f32", "i1", "ui32", "complex<f32>"
int64_t itemsize(DType t);
bool is_float(DType t);    // f16, bf16, f32, f64
bool is_complex(DType t);
// The part type of a complex type (C64 -> F32, C128 -> F64), and the complex type
// whose parts are a real type (F64 -> C128, any other -> C64).
DType real_part(DType t);
DType complex_of(DType t);
bool is_int(DType t);      // signed or unsigned integer, not pred
bool is_unsigned(DType t);

using Shape = std::vector<int64_t>;
int64_t numel(const Shape& s);

struct Type {
  DType dtype = DType::F32;
  Shape shape;
  // Bounded dynamism: the value may have dims whose run-time size is below `shape`
  // (set by set_dimension_size, carried to every op that uses such a value). XLA's
  // dynamic padder tracks the sizes itself, so types print as static; the flag only
  // tells rules and the engine where a size must be read at run time (dim_size, count)
  // and where a store must mask the padding. Not part of equality.
  bool dynamic = false;
  // Dims printed as bounded-dynamic (`tensor<2x?xf32, #stablehlo.bounds<?, 3>>`); only the
  // value dim_size reads a run-time size from has them (a static type folds to its size).
  uint64_t printed_dynamic = 0;
  std::string str() const;  // tensor<2x3xf32>
  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  bool operator==(const Type& o) const { return dtype == o.dtype && shape == o.shape; }
  bool operator!=(const Type& o) const { return !(*this == o); }
};

struct Value {
  int id = -1;
  Type type;
  const Shape& shape() const { return type.shape; }
  DType dtype() const { return type.dtype; }
  int64_t rank() const { return type.rank(); }
  bool valid() const { return id >= 0; }
};

// Thrown when an op is built with operands it cannot take (a bug in a lowering
// rule, never a user error: user errors are caught earlier by Meta kernels).
class BuildError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Cmp { EQ, NE, LT, LE, GT, GE };

// The StableHLO ops Builder::unary / binary take, and the binary ops that are the
// bodies of reductions, windows and scatters, each named as the StableHLO op. The
// set is closed on purpose, so a misspelt op fails at build time: add an op here to use it.
// (`and`, `or`, `xor` and `not` are C++ alternative tokens: those constants end in `_`.)
namespace op {
struct Unary {
  const char* name;
};
struct Binary {
  const char* name;
};
constexpr bool operator==(Unary a, Unary b) { return std::string_view(a.name) == b.name; }
constexpr bool operator!=(Unary a, Unary b) { return !(a == b); }
constexpr bool operator==(Binary a, Binary b) { return std::string_view(a.name) == b.name; }
constexpr bool operator!=(Binary a, Binary b) { return !(a == b); }

inline constexpr Unary abs{"abs"};
inline constexpr Unary ceil{"ceil"};
inline constexpr Unary cosine{"cosine"};
inline constexpr Unary count_leading_zeros{"count_leading_zeros"};
inline constexpr Unary exponential{"exponential"};
inline constexpr Unary exponential_minus_one{"exponential_minus_one"};
inline constexpr Unary floor{"floor"};
inline constexpr Unary log{"log"};
inline constexpr Unary log_plus_one{"log_plus_one"};
inline constexpr Unary logistic{"logistic"};
inline constexpr Unary negate{"negate"};
inline constexpr Unary not_{"not"};
inline constexpr Unary round_nearest_even{"round_nearest_even"};
inline constexpr Unary rsqrt{"rsqrt"};
inline constexpr Unary sign{"sign"};
inline constexpr Unary sine{"sine"};
inline constexpr Unary sqrt{"sqrt"};
inline constexpr Unary tan{"tan"};
inline constexpr Unary tanh{"tanh"};

inline constexpr Binary add{"add"};
inline constexpr Binary and_{"and"};
inline constexpr Binary atan2{"atan2"};
inline constexpr Binary divide{"divide"};
inline constexpr Binary maximum{"maximum"};
inline constexpr Binary minimum{"minimum"};
inline constexpr Binary multiply{"multiply"};
inline constexpr Binary or_{"or"};
inline constexpr Binary power{"power"};
inline constexpr Binary remainder{"remainder"};
inline constexpr Binary shift_left{"shift_left"};
inline constexpr Binary shift_right_arithmetic{"shift_right_arithmetic"};
inline constexpr Binary shift_right_logical{"shift_right_logical"};
inline constexpr Binary subtract{"subtract"};
inline constexpr Binary xor_{"xor"};
}  // namespace op

struct DotDims {
  std::vector<int64_t> lhs_batch, rhs_batch, lhs_contract, rhs_contract;
};

struct ConvDims {  // stablehlo.convolution dimension numbers, all 2-D-agnostic
  int64_t in_batch = 0, in_feature = 1;
  std::vector<int64_t> in_spatial;
  int64_t k_out = 0, k_in = 1;
  std::vector<int64_t> k_spatial;
  int64_t out_batch = 0, out_feature = 1;
  std::vector<int64_t> out_spatial;
  int64_t batch_groups = 1;  // batch_group_count (the weight gradient of a grouped convolution)
};

class Builder {
 public:
  Builder();

  // ---- checkpoints: drop everything emitted after a mark (a failed lowering)
  // Value numbers restart at the mark too: a graph replaying a recorded trace
  // (dry) must number the ops after a failed one as the recording did.
  struct Mark {
    size_t body = 0, params = 0, funcs = 0;
    int next = 0;
  };
  Mark mark() const { return Mark{body_.size(), params_.size(), funcs_.size(), next_}; }
  void rollback(const Mark& m) {
    next_ = m.next;
    body_.resize(m.body);
    params_.resize(m.params);
    param_ids_.resize(m.params);
    funcs_.resize(m.funcs);
  }

  // ---- dry mode: values, types and parameters as usual, but no text. A graph
  // that replays a recorded trace is built dry; `materialize` supplies the text
  // the same ops produced when they were recorded, and ends dry mode.
  void set_dry(bool d) { dry_ = d; }
  bool dry() const { return dry_; }
  void materialize(std::string body) {
    body_ = std::move(body);
    dry_ = false;
  }

  // ---- function signature
  Value param(const Type& t);
  int num_params() const { return static_cast<int>(params_.size()); }
  const std::vector<Type>& param_types() const { return params_; }
  // Marks parameter `param_index` as donated into result `result_index`.
  void alias(int param_index, int result_index);
  // The module text with `results` returned from @main, for `replicas` replicas (in-program
  // collectives run one replica per device).
  std::string module(const std::vector<Value>& results, int replicas = 1) const;
  const std::string& body_text() const { return body_; }

  // ---- private functions (custom kernels): `text` holds `func.func private @symbol`
  // and the helpers it calls; the module prints it after @main, once per symbol.
  // Recorded in dry mode too, so a graph that leaves a trace still has them.
  void add_function(const std::string& symbol, std::shared_ptr<const std::string> text);
  // func.call @symbol(operands) -> results
  std::vector<Value> call(const std::string& symbol, const std::vector<Value>& operands,
                          const std::vector<Type>& results);

  // ---- generic emission
  Value emit(const std::string& op, const std::vector<Value>& operands, const Type& result,
             const std::string& attrs = "");
  std::vector<Value> emit_multi(const std::string& op, const std::vector<Value>& operands,
                                const std::vector<Type>& results, const std::string& attrs = "",
                                const std::string& region = "");

  // ---- collectives across the replicas of a replicated program (module(results, replicas)).
  // `groups`: the replica ids of each group, every group of one size. Reductions: "sum", "avg"
  // (the sum divided by the group size), "product", "min", "max", "band", "bor", "bxor".
  using Groups = std::vector<std::vector<int64_t>>;
  Value all_reduce(Value x, const std::string& reduce, const Groups& groups);
  Value all_gather(Value x, int64_t dim, const Groups& groups);          // dim grows by the group size
  Value reduce_scatter(Value x, const std::string& reduce, int64_t dim, const Groups& groups);  // dim shrinks
  Value all_to_all(Value x, int64_t split_dim, int64_t concat_dim, const Groups& groups);

  // ---- constants
  Value constant(double v, DType t, const Shape& shape = {});
  Value constant_int(int64_t v, DType t, const Shape& shape = {});
  Value zeros(DType t, const Shape& s) { return constant(0.0, t, s); }
  Value iota(DType t, const Shape& s, int64_t dim);
  // A 1-D constant holding `v` (ints or floats of type t).
  Value constant_array(const std::vector<int64_t>& v, DType t);
  Value constant_array(const std::vector<double>& v, DType t);
  Value lowest(DType t);   // -inf, or the type's minimum (scalar)
  Value highest(DType t);  // +inf, or the type's maximum (scalar)

  // ---- elementwise (operands must already share shape; see broadcast_to)
  Value unary(op::Unary f, Value x);             // op::exponential, op::tanh, ...
  Value binary(op::Binary f, Value a, Value b);  // op::add, op::multiply, ...
  Value add(Value a, Value b) { return binary(op::add, a, b); }
  Value sub(Value a, Value b) { return binary(op::subtract, a, b); }
  Value mul(Value a, Value b) { return binary(op::multiply, a, b); }
  Value div(Value a, Value b) { return binary(op::divide, a, b); }
  // NaN-propagating for floats (the XLA CPU plugin's maximum/minimum drop a NaN second operand)
  Value max(Value a, Value b);
  Value min(Value a, Value b);
  Value neg(Value x) { return unary(op::negate, x); }
  // complex parts: real/imag of a complex value (its part type), a complex value from
  // two real ones of one type, and the conjugate (a real x unchanged)
  Value real(Value x);
  Value imag(Value x);
  Value complex(Value re, Value im);
  Value conj(Value x);
  Value compare(Value a, Value b, Cmp dir);
  Value select(Value pred, Value t, Value f);
  Value convert(Value x, DType t);
  Value bitcast(Value x, DType t);  // same itemsize only
  Value clamp(Value lo, Value x, Value hi);  // NaN-propagating; lo/hi broadcast to x's shape

  // ---- shape
  Value reshape(Value x, const Shape& s);
  Value transpose(Value x, const std::vector<int64_t>& perm);
  Value broadcast_in_dim(Value x, const Shape& s, const std::vector<int64_t>& dims);
  Value broadcast_to(Value x, const Shape& s);  // numpy rules, right-aligned
  Value scalar_like(double v, Value like) { return constant(v, like.dtype(), like.shape()); }
  Value slice(Value x, const Shape& start, const Shape& limit, const Shape& strides);
  Value dynamic_update_slice(Value x, Value update, const std::vector<Value>& starts);
  // x[starts : starts + sizes] with runtime start indices (clamped into range by the op).
  Value dynamic_slice(Value x, const std::vector<Value>& starts, const Shape& sizes);
  Value concatenate(const std::vector<Value>& xs, int64_t dim);
  Value pad(Value x, Value pad_value, const Shape& lo, const Shape& hi, const Shape& interior);
  Value reverse(Value x, const std::vector<int64_t>& dims);

  // ---- reductions: body is op::add, op::maximum, op::minimum, op::multiply, op::and_, op::or_
  Value reduce(Value x, Value init, const std::vector<int64_t>& dims, op::Binary body);
  // Variadic (value, index) reduction for argmax/argmin along `dim`.
  std::pair<Value, Value> reduce_arg(Value x, int64_t dim, bool is_max);
  Value reduce_window(Value x, Value init, const Shape& window, const Shape& strides,
                      const std::vector<std::pair<int64_t, int64_t>>& padding, op::Binary body);

  // ---- contraction
  // precision: "" (plugin default) or DEFAULT / HIGH / HIGHEST (precision_config)
  Value dot_general(Value a, Value b, const DotDims& d, DType result, const std::string& precision = "");
  Value convolution(Value lhs, Value rhs, const ConvDims& d, const Shape& strides,
                    const std::vector<std::pair<int64_t, int64_t>>& padding, const Shape& lhs_dilation,
                    const Shape& rhs_dilation, int64_t feature_groups, const Shape& out_shape, DType result,
                    const std::string& precision = "");

  // ---- indexing
  // Gathers x[idx] along `dim` (idx: integer tensor of any shape, already in range);
  // result shape = x.shape[:dim] + idx.shape + x.shape[dim+1:].
  Value take(Value x, Value idx, int64_t dim);
  // torch.gather semantics: out[i...] = x[..., idx[i...], ...] at `dim`; idx has x's rank.
  Value take_along(Value x, Value idx, int64_t dim);
  // Scatter of `updates` into x at positions idx (shape [N, K]) over dims `dims`
  // of x; updates has shape [N] + remaining (window) dims of x. body op::add (or another
  // combining op) or std::nullopt (replace).
  Value scatter(Value x, Value idx, Value updates, const std::vector<int64_t>& dims, std::optional<op::Binary> body);
  // x[idx[i...]] = updates[i...] for a 1-D x: idx has updates' shape plus a trailing 1;
  // positions out of range are skipped. updates keeps its shape (a dynamic one masks its padding).
  Value scatter_nd(Value x, Value idx, Value updates);
  // Rows of a 1-D x: out[i..., j] = x[starts[i...] + j] for j < w (a start past len - w is
  // clamped to it), and the write of such rows (a row whose window leaves x is skipped).
  Value take_rows(Value x, Value starts, int64_t w);
  Value scatter_rows(Value x, Value starts, Value rows);
  Value sort_dim(Value x, int64_t dim, bool descending, Value* indices);

  // ---- bounded dynamic sizes (see Type::dynamic)
  // x with dim `dim` holding `size` (an s32 scalar) elements at run time; XLA masks
  // what the padding past it would change in every op that uses the result.
  Value set_dimension_size(Value x, Value size, int64_t dim);
  // x with no run-time sizes: each dim retyped bounded-dynamic, then set to its full size
  // (XLA then drops the dim's dynamic size; what lay past it stays, as padding). Gathers,
  // scatters and reshapes of the result treat it as the static array it is in memory.
  Value static_shape(Value x);
  // The run-time size of dim `dim` of x as a scalar of type t (a constant for a static value).
  Value dim_size(Value x, int64_t dim, DType t = DType::S32);
  // The number of elements of x over `dims` at run time, as a scalar of type t.
  Value count(Value x, const std::vector<int64_t>& dims, DType t);

  // ---- control flow
  // stablehlo.while over the loop-carried values `init`: `cond(vals)` returns
  // {i1 scalar}, `body(vals)` the next values (same types). Returns the final values.
  using LoopFn = std::function<std::vector<Value>(Builder&, const std::vector<Value>&)>;
  std::vector<Value> while_loop(const std::vector<Value>& init, const LoopFn& cond, const LoopFn& body);

 private:
  std::string name(Value v) const { return "%" + std::to_string(v.id); }
  // emit_multi with the result types as given (no dynamic flag carried from operands)
  std::vector<Value> emit_typed(const std::string& op, const std::vector<Value>& operands,
                                const std::vector<Type>& results, const std::string& attrs = "",
                                const std::string& region = "");
  std::string region(std::optional<op::Binary> body, DType t, int n);  // std::nullopt: keep the update
  static std::string replica_groups(const Groups& groups);
  static op::Binary combiner(const std::string& reduce);  // the region body of a reduction
  static int64_t group_split(const char* op, Value x, int64_t dim, const Groups& groups);
  Value fresh(const Type& t) { return Value{next_++, t}; }
  bool dry_ = false;
  int next_ = 0;
  std::vector<Type> params_;
  std::vector<int> param_ids_;
  std::vector<std::pair<int, int>> aliases_;
  std::vector<std::pair<std::string, std::shared_ptr<const std::string>>> funcs_;
  std::string body_;
};

std::string join(const std::vector<int64_t>& v, const char* sep = ", ");
std::string i64_array(const std::vector<int64_t>& v);  // array<i64: 1, 2>

}  // namespace tt::hlo
