// ATen op -> StableHLO lowering rules, looked up by schema name
// ("aten::add.Tensor"). One file per op family registers its rules; simple ops
// are table rows over a generic family rule.
//
// A rule sees each schema argument as an Arg: tensors are graph values with
// their logical shape (never strides), Python numbers are runtime scalars (the
// rule chooses to bind them as program parameters with `scalar`, or to read
// them structurally with `num`, which puts them into the program text), and
// ints / int lists / bools / strings are structural. A rule returns one value
// per schema return, shaped and typed as `out(k)` (the Meta kernel's result);
// the engine converts element types and reshapes equal-sized results.
#pragma once

#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "hlo/builder.h"

namespace tt::lower {

using hlo::Builder;
using hlo::DType;
using hlo::Shape;
using hlo::Type;
using hlo::Value;
namespace op = hlo::op;  // the StableHLO ops Builder::unary / binary and reduction bodies take

enum class Precision { DEFAULT = 0, HIGH = 1, HIGHEST = 2 };

struct Arg {
  enum Kind { None, Tensor, TensorList, Int, Scalar, Bool, IntList, Str } kind = None;
  Value tensor;
  std::vector<Value> tensors;  // invalid entries stand for None in Tensor?[]
  int64_t i = 0;
  bool scalar_is_int = false;  // Scalar came from a Python int (or bool)
  bool scalar_is_bool = false;
  bool b = false;
  std::vector<int64_t> ints;
  std::vector<double> reals;  // a float[] argument's values (ints holds them truncated)
  std::string s;
  // A 0-dim CPU tensor passed where a tensor goes (e.g. `x * 0.5`): `tensor`
  // is its runtime scalar parameter; wrapped numbers do not promote dtypes.
  bool wrapped_number = false;
  // The tensor's memory layout is row-major contiguous (in the trace key via its
  // strides). Only layout-dependent results use it: PyTorch's det/slogdet
  // factor A^T for contiguous A and return that factorization.
  bool contiguous = false;

  // A Scalar's value. Rules read it only through Ctx (num, int_, num_is record
  // the read for the trace key; scalar binds it as a parameter), so nothing a
  // rule puts into the program text can escape the key.
  void set_number(double v) { d_ = v; }
  // A complex Python number: only Ctx::scalar reads it, for a complex type
  // (any other read is Unsupported: the op takes the CPU fallback).
  void set_complex(double re, double im) {
    d_ = re;
    imag_ = im;
    complex_ = true;
  }
  bool is_complex_number() const { return complex_; }

 private:
  friend class Ctx;
  double d_ = 0, imag_ = 0;
  bool complex_ = false;
};

// A Python number a rule read structurally (it shaped the program text):
// argument `arg` (-1: the matmul precision mode) had `value` (test < 0), or
// compared equal to `value` (test = 1) or not (test = 0).
struct Read {
  int arg = 0;
  double value = 0;
  int test = -1;
  bool operator==(const Read& o) const {
    return arg == o.arg && test == o.test && std::memcmp(&value, &o.value, sizeof value) == 0;
  }
};
using Reads = std::vector<Read>;

// What a rule may ask of the engine that runs it.
class Env {
 public:
  virtual ~Env() = default;
  // A program parameter holding `v` as a scalar of type t.
  virtual Value scalar_param(double v, bool is_int, DType t) = 0;
  // Two ui32 scalar parameters (key, counter base) for `n` counter-based random
  // words; advances the device generator by n.
  virtual std::pair<Value, Value> rng(int64_t n) = 0;
  virtual Precision precision() const = 0;
  // True where the plugin implements precision_config itself (TPU): contractions
  // are then emitted once with the mode, instead of as bf16 splits.
  virtual bool native_precision() const { return false; }
  // A data-dependent error check computed in the program: if `bad` (an i1
  // scalar) is true when it runs, the next host synchronisation raises
  // `message` ("{}" replaced by `value`, an s64 scalar; "{f32,f32}" by the two float32
  // bit patterns packed in it, high word first) as an IndexError
  // (index_error) or a RuntimeError. Engines without checks ignore it.
  virtual void check(Value bad, Value value, bool index_error, const std::string& message) {}
  // The value behind a scalar parameter this Env made (a Python number that came
  // as a 0-dim CPU tensor, e.g. `x // 0`), for checks that do not shape the
  // program; nullopt where unknown.
  virtual std::optional<double> scalar_value(const Value&) const { return std::nullopt; }
};

// Thrown by a rule for an argument combination it does not lower; the op then
// takes the CPU fallback path (with its warning), exactly like an op without a rule.
class Unsupported : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Thrown by a rule for input that PyTorch's CPU kernel rejects but the Meta
// kernel let through; becomes a RuntimeError with this message.
// The kernel first replays the call on CPU, so the user sees CPU's own error
// whenever CPU rejects the input too.
class UserError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// A UserError that PyTorch raises as IndexError (e.g. a dim out of range).
class IndexError : public UserError {
 public:
  using UserError::UserError;
};

// An argument index no schema has: a rule parameterised by "which argument holds X" passes it
// where the overload has no such argument (Ctx::has is false for it).
inline constexpr size_t kNoArg = static_cast<size_t>(-1);

class Ctx {
 public:
  Ctx(Builder& b, Env& env, std::vector<Arg> args, std::vector<Type> outs)
      : b(b), env(env), args_(std::move(args)), outs_(std::move(outs)) {}
  Builder& b;
  Env& env;

  size_t nargs() const { return args_.size(); }
  const Arg& arg(size_t i) const;
  bool has(size_t i) const { return i < args_.size() && args_[i].kind != Arg::None; }
  Value in(size_t i) const;                           // a tensor argument
  const std::vector<Value>& list(size_t i) const;     // a Tensor[] argument
  int64_t int_(size_t i) const;
  int64_t int_or(size_t i, int64_t dflt) const { return has(i) ? int_(i) : dflt; }
  bool flag(size_t i) const;
  bool flag_or(size_t i, bool dflt) const { return has(i) ? flag(i) : dflt; }
  const std::vector<int64_t>& ints(size_t i) const;
  const std::string& str(size_t i) const;
  double num(size_t i) const;                          // structural read of a scalar
  // A scalar's value for an input check that raises (UserError) and never shapes
  // the text: not recorded for the trace key (rules run even when built dry).
  double check_number(size_t i) const;
  double num_or(size_t i, double dflt) const { return has(i) ? num(i) : dflt; }
  // num(i) == v, where only the outcome shapes the text (e.g. skipping `* alpha` for 1).
  bool num_is(size_t i, double v) const;
  // A scalar argument bound as a runtime parameter of type t (no recompiles
  // when it changes).
  Value scalar(size_t i, DType t);
  Value scalar_or(size_t i, double dflt, DType t);

  size_t nouts() const { return outs_.size(); }
  const Type& out(size_t k = 0) const;
  DType odt(size_t k = 0) const { return out(k).dtype; }
  const Shape& oshape(size_t k = 0) const { return out(k).shape; }

  // Writes `v` into tensor argument i after the rule returns (ops that update
  // an argument without returning it, e.g. batch norm's running statistics).
  void write(size_t i, Value v) { writes_.emplace_back(i, v); }
  const std::vector<std::pair<size_t, Value>>& writes() const { return writes_; }
  // The Python numbers this rule read with num / int_ (they shape its text).
  const Reads& reads() const { return reads_; }

  // Tensor argument i converted to dtype t and broadcast to shape s.
  Value in_as(size_t i, DType t, const Shape& s);
  // Tensor argument i as dtype t, broadcast to the first output's shape.
  Value in_out(size_t i, DType t) { return in_as(i, t, oshape()); }

 private:
  std::vector<Arg> args_;
  std::vector<Type> outs_;
  std::vector<std::pair<size_t, Value>> writes_;
  mutable Reads reads_;
};

using Rule = std::function<std::vector<Value>(Ctx&)>;

// The registry: the single list of natively supported ops.
void add_rule(const std::string& schema_name, Rule r);
const Rule* find_rule(const std::string& schema_name);
std::vector<std::string> rule_names();
// Rules of the elementwise families (PyTorch's TensorIterator ops): they compute in
// the result type of their inputs, and an in-place or out= variant whose target has
// another dtype computes that type and is cast into the target, as on CPU.
bool casts_to_output(const std::string& schema_name);
// Ops (ATen names) whose rules are correct on bucketed values (bounded dynamism, DESIGN.md "Shapes"): built
// at a dim's bound with its run-time size set, their results agree with the exact-shape
// program in every real element (checked by tests/ops/opinfo_parity.py --dynamic).
bool bucketed_rule(const std::string& schema_name);
// Testing rules on bucketed values: mode 1 treats every rule as bucketed
// (TORCH_TPU_BUCKET_ALL_RULES=1), mode 2 only the rules in `only` (to find the rule behind a
// mismatch), mode 0 the list above. bucket_rule_allowed(name, listed): the decision for a rule.
int bucket_rules_override();
bool bucket_rule_allowed(const std::string& schema_name, bool listed);
void set_bucket_rules_override(int mode, const std::vector<std::string>& only = {});

// ---- shared helpers (defined in common.cc)
// d wrapped into [0, rank) (a 0-dim tensor takes -1 and 0); IndexError with
// PyTorch's message when out of range.
int64_t wrap_dim(int64_t d, int64_t rank);
std::vector<int64_t> reduce_dims(const Ctx& c, size_t dim_arg, int64_t rank);  // None / [] -> all
const char* torch_dtype_name(DType t);  // PyTorch's spelling in messages: "Float", "Long"
DType promote(DType a, DType b);
DType compute_type(DType t);  // f16/bf16 -> f32 (accumulation type), else t
// The one place matmul-like ops contract: float32 operands follow the active
// precision mode; bf16/f16 multiply in their own type with f32 accumulation.
Value matmul(Ctx& c, Value a, Value b, const hlo::DotDims& d, DType out);
// The same for any bilinear contraction `op` (convolutions): op(x, y, precision)
// must accept bf16 operands and produce f32 (or x's type for f64/int);
// `precision` is "" or the precision_config name to emit.
using ContractFn = std::function<Value(Value, Value, const std::string&)>;
Value contract(Ctx& c, Value a, Value b, const ContractFn& op, DType out);
// Sum of x over dims in the accumulation type, converted back to x's type when keep_type.
Value sum(Builder& b, Value x, const std::vector<int64_t>& dims);
Value keep_dims(Builder& b, Value reduced, const Shape& full, const std::vector<int64_t>& dims);
// The element count of x over dims as a value of type t and shape `shape`: a constant, or for a
// bucketed x its run-time count (means and losses divide by it, never by the padded size).
Value elements(Builder& b, Value x, const std::vector<int64_t>& dims, DType t, const Shape& shape = {});
std::vector<int64_t> all_dims(int64_t rank);  // 0 .. rank-1
// Tap (i, j) of a 2-D window over the last two dims of an already padded input: the strided
// slice from (i * dil[0], j * dil[1]) with steps `stride`, out_h x out_w elements in those dims.
Value window_tap(Builder& b, Value xp, int64_t i, int64_t j, const Shape& dil, const Shape& stride, int64_t out_h,
                 int64_t out_w);
// A dim's size in index arithmetic: a number, or for a bucketed operand its run-time size
// (an s64 scalar; `n` is then the bound).
struct Extent {
  int64_t n = 0;
  Value v;
  Extent(int64_t n) : n(n) {}  // NOLINT: a static size
  Extent(Builder& b, Value x, int64_t dim);
  bool dynamic() const { return v.valid(); }
  Extent negated(Builder& b) const;
  Value as(Builder& b, const Shape& shape) const;  // s64, broadcast to shape
};
// Device-side bounds check: every element of idx lies in [lo, hi); otherwise the
// next host synchronisation raises `message` ("{}": an offending value; with a dynamic hi,
// "{lo32}" the offending value and "{hi32}" the size: index_oob builds such messages).
void check_range(Ctx& c, Value idx, Extent lo, Extent hi, bool index_error, const std::string& message);
// CPU's message for an index out of range along dim `dim` of size `size`.
std::string index_oob(int64_t dim, const Extent& size);
// max (is_max) or min of x over dims, NaN where the reduced slice holds a NaN (the
// XLA CPU plugin's max/min reductions skip NaNs; PyTorch's propagate them)
Value reduce_extreme(Builder& b, Value x, const std::vector<int64_t>& dims, bool is_max);
// Counter-based uniform [0,1) floats of shape s (f32).
Value uniform01(Ctx& c, const Shape& s);
Value normal01(Ctx& c, const Shape& s);

// Family registration (called once from register_all).
void register_elementwise();
void register_reduction();
void register_shape();
void register_indexing();
void register_linalg();
void register_nn();
void register_random();
void register_resample();
void register_fft();
void register_pooling();
void register_special();
void register_all();

}  // namespace tt::lower
