// Elementwise family: arithmetic, math, comparisons, logical, activations and
// their backward kernels, where/masked_fill, fill. In-place (`add_`) and out=
// (`add.out`) variants reuse the functional rule (the engine stores the result).
#include <cmath>

#include "lowering/lowering.h"

namespace tt::lower {
namespace {

using V = std::vector<Value>;
using hlo::Cmp;

// PyTorch's result_type over the given arguments: dimensioned tensors, then
// zero-dim tensors, then Python numbers, each tier only raising the category.
DType result_type(const Ctx& c, std::initializer_list<size_t> idx) {
  auto cat = [](DType t) { return t == DType::Pred ? 0 : hlo::is_int(t) ? 1 : hlo::is_float(t) ? 2 : 3; };
  bool have[3] = {false, false, false};
  DType tier[3] = {DType::Pred, DType::Pred, DType::Pred};
  for (size_t i : idx) {
    if (!c.has(i)) continue;
    const Arg& a = c.arg(i);
    int k;
    DType t;
    if (a.kind == Arg::Tensor) {
      t = a.tensor.dtype();
      k = a.wrapped_number ? 2 : (a.tensor.rank() == 0 ? 1 : 0);
    } else if (a.kind == Arg::Scalar || a.kind == Arg::Int || a.kind == Arg::Bool) {
      t = a.kind == Arg::Bool || a.scalar_is_bool ? DType::Pred
          : (a.kind == Arg::Int || a.scalar_is_int) ? DType::S64
          : a.is_complex_number()                  ? DType::C64
                                                   : DType::F32;
      k = 2;
    } else {
      continue;
    }
    if (k == 2 && a.kind == Arg::Tensor && hlo::is_float(t)) t = DType::F32;  // wrapped float -> default dtype
    tier[k] = have[k] ? promote(tier[k], t) : t;
    have[k] = true;
  }
  DType r = have[0] ? tier[0] : DType::Pred;
  bool any = have[0];
  for (int k = 1; k < 3; ++k) {
    if (!have[k]) continue;
    if (!any) { r = tier[k]; any = true; continue; }
    if (cat(tier[k]) <= cat(r)) continue;
    if (k == 2) r = cat(tier[k]) == 1 ? DType::S64 : cat(tier[k]) == 2 ? DType::F32 : r == DType::F64 ? DType::C128 : DType::C64;
    else r = tier[k];
  }
  return r;
}

// ---- generic family rules
// ops that round to an integer: the identity on integer (and bool) tensors
bool rounds(op::Unary f) { return f == op::floor || f == op::ceil || f == op::round_nearest_even; }

Rule unary(op::Unary f) {
  return [f](Ctx& c) -> V {
    Value x = c.in(0);
    // bool -> bool: CPU implements only sign and bitwise_not (the Meta kernels accept the rest)
    if (x.dtype() == DType::Pred && c.odt() == DType::Pred && f != op::sign && f != op::not_)
      throw UserError(std::string(f.name) + " is not implemented for 'Bool'");
    if (rounds(f) && !hlo::is_float(x.dtype()) && !hlo::is_complex(x.dtype())) return {c.in_out(0, c.odt())};
    if (f == op::sign && x.dtype() == DType::Pred) return {c.in_out(0, c.odt())};  // sign(bool) = itself
    if (f == op::sign && hlo::is_float(x.dtype())) {  // sign(x) = (x > 0) - (x < 0): 0 for NaN, as on CPU
      DType t = c.odt();
      Value u = c.in_out(0, t), z = c.b.zeros(t, u.shape());
      return {c.b.sub(c.b.convert(c.b.compare(u, z, hlo::Cmp::GT), t), c.b.convert(c.b.compare(u, z, hlo::Cmp::LT), t))};
    }
    if (hlo::is_unsigned(x.dtype())) {  // StableHLO's abs/sign take signed types: |x| = x, sign(x) = x != 0
      Value u = c.in_out(0, c.odt());
      if (f == op::abs) return {u};
      if (f == op::sign) return {c.b.convert(c.b.compare(u, c.b.zeros(u.dtype(), u.shape()), hlo::Cmp::NE), c.odt())};
    }
    if (hlo::is_complex(x.dtype()) && !hlo::is_complex(c.odt()))  // abs of complex: a real result
      return {c.b.emit(f.name, {c.b.broadcast_to(x, c.oshape())}, Type{c.odt(), c.oshape()})};
    return {c.b.unary(f, c.in_out(0, c.odt()))};
  };
}
// Computes in the accumulation type (f32 for f16/bf16), as CUDA does.
Rule unary_fn(std::function<Value(Builder&, Value)> f) {
  return [f](Ctx& c) -> V {
    DType t = compute_type(c.odt());
    return {c.b.convert(f(c.b, c.in_out(0, t)), c.odt())};
  };
}
Rule binary(op::Binary f) {
  return [f](Ctx& c) -> V {
    DType t = c.odt();
    return {c.b.binary(f, c.in_out(0, t), c.in_out(1, t))};
  };
}
Rule binary_fn(std::function<Value(Builder&, Value, Value)> f) {
  return [f](Ctx& c) -> V {
    DType t = compute_type(c.odt());
    return {c.b.convert(f(c.b, c.in_out(0, t), c.in_out(1, t)), c.odt())};
  };
}
Rule compare(hlo::Cmp dir) {
  return [dir](Ctx& c) -> V {
    DType t = result_type(c, {0, 1});
    return {c.b.compare(c.in_out(0, t), c.in_out(1, t), dir)};
  };
}
Rule logical(op::Binary f) {
  return [f](Ctx& c) -> V {
    auto as_bool = [&](size_t i) {
      Value x = c.in_out(i, result_type(c, {i}));
      return x.dtype() == DType::Pred ? x : c.b.compare(x, c.b.zeros(x.dtype(), x.shape()), hlo::Cmp::NE);
    };
    return {c.b.binary(f, as_bool(0), as_bool(1))};
  };
}

Value k(Builder& b, double v, Value like) { return b.scalar_like(v, like); }

// The signed integer type as wide as float type t (for bit manipulation).
DType int_like(DType t) {
  int64_t sz = hlo::itemsize(t);
  return sz == 8 ? DType::S64 : sz == 4 ? DType::S32 : DType::S16;
}
// Above this magnitude 1 / x^2 is below the type's rounding (asinh, acosh: log(2x))
double large_arg(DType t) { return t == DType::F64 ? 268435456.0 : 4096.0; }

// v wrapped to the width of signed integer type it (bit masks such as 0x807fffff).
int64_t wrap_int(int64_t v, DType it) {
  int bits = static_cast<int>(8 * hlo::itemsize(it));
  if (bits == 64) return v;
  uint64_t m = (uint64_t{1} << bits) - 1, u = static_cast<uint64_t>(v) & m;
  return u >> (bits - 1) ? static_cast<int64_t>(u) - static_cast<int64_t>(m) - 1 : static_cast<int64_t>(u);
}

// erf(x) for f32 (f64 too, at f32 accuracy): rational approximation on [-4, 4]
// erf(x) = x * P(x^2) / Q(x^2) (the minimax coefficients used by Eigen and XLA).
Value erf(Builder& b, Value x) {
  static const double alpha[] = {-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
                                 -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
                                 -1.60960333262415e-02};
  static const double beta[] = {-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
                                -7.37332916720468e-03, -1.42647390514189e-02};
  Value xc = b.clamp(k(b, -4.0, x), x, k(b, 4.0, x));
  Value x2 = b.mul(xc, xc);
  Value p = k(b, alpha[0], x);
  for (int i = 1; i < 7; ++i) p = b.add(b.mul(p, x2), k(b, alpha[i], x));
  p = b.mul(p, xc);
  Value q = k(b, beta[0], x);
  for (int i = 1; i < 5; ++i) q = b.add(b.mul(q, x2), k(b, beta[i], x));
  return b.div(p, q);
}

// gelu(x) = x * Phi(x); tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
Value gelu(Builder& b, Value x, bool tanh_form) {
  if (tanh_form) {
    Value inner = b.mul(k(b, 0.7978845608028654, x), b.add(x, b.mul(k(b, 0.044715, x), b.mul(x, b.mul(x, x)))));
    return b.mul(b.mul(k(b, 0.5, x), x), b.add(k(b, 1.0, x), b.unary(op::tanh, inner)));
  }
  Value cdf = b.mul(k(b, 0.5, x), b.add(k(b, 1.0, x), erf(b, b.mul(x, k(b, M_SQRT1_2, x)))));
  return b.mul(x, cdf);
}

// d gelu / dx
Value gelu_grad(Builder& b, Value x, bool tanh_form) {
  if (tanh_form) {
    const double kb = 0.7978845608028654, kk = 0.044715;
    Value x2 = b.mul(x, x);
    Value inner = b.mul(k(b, kb, x), b.add(x, b.mul(k(b, kk, x), b.mul(x2, x))));
    Value t = b.unary(op::tanh, inner);
    Value dinner = b.mul(k(b, kb, x), b.add(k(b, 1.0, x), b.mul(k(b, 3 * kk, x), x2)));
    Value left = b.mul(k(b, 0.5, x), b.add(k(b, 1.0, x), t));
    Value right = b.mul(b.mul(k(b, 0.5, x), x), b.mul(b.sub(k(b, 1.0, x), b.mul(t, t)), dinner));
    return b.add(left, right);
  }
  Value cdf = b.mul(k(b, 0.5, x), b.add(k(b, 1.0, x), erf(b, b.mul(x, k(b, M_SQRT1_2, x)))));
  Value pdf = b.mul(k(b, 0.3989422804014327, x), b.unary(op::exponential, b.mul(k(b, -0.5, x), b.mul(x, x))));
  return b.add(cdf, b.mul(x, pdf));
}

Value sigmoid(Builder& b, Value x) { return b.unary(op::logistic, x); }

Value trunc(Builder& b, Value x) {
  return b.select(b.compare(x, k(b, 0, x), hlo::Cmp::LT), b.unary(op::ceil, x), b.unary(op::floor, x));
}

// Python-style remainder: a - floor(a / b) * b (ints: sign follows b).
Value remainder(Builder& b, Value x, Value y) {
  Value r = b.binary(op::remainder, x, y);
  Value zero = k(b, 0, r);
  Value fix = b.binary(op::and_, b.compare(r, zero, hlo::Cmp::NE),
                       b.compare(b.compare(r, zero, hlo::Cmp::LT), b.compare(y, k(b, 0, y), hlo::Cmp::LT),
                                 hlo::Cmp::NE));
  return b.select(fix, b.add(r, y), r);
}

// floor(a / b) for floats as Python (and CPU) compute it, exact even where a / b
// rounds up to an integer: m = fmod(a, b), q = (a - m) / b, minus 1 when m and b
// differ in sign, then rounded to the nearest integer; a / b for b = 0, and a signed
// zero for a zero quotient.
Value floor_div(Builder& b, Value x, Value y) {
  Value zero = k(b, 0, x), m = b.binary(op::remainder, x, y);
  Value q = b.div(b.sub(x, m), y);
  Value fix = b.binary(op::and_, b.compare(m, zero, hlo::Cmp::NE),
                       b.compare(b.compare(y, zero, hlo::Cmp::LT), b.compare(m, zero, hlo::Cmp::LT), hlo::Cmp::NE));
  q = b.select(fix, b.sub(q, k(b, 1, q)), q);
  Value f = b.unary(op::floor, q);
  f = b.select(b.compare(b.sub(q, f), k(b, 0.5, q), hlo::Cmp::GT), b.add(f, k(b, 1, f)), f);
  Value plain = b.div(x, y);
  Value signed_zero = b.mul(zero, plain);  // +-0 with the sign of a / b
  f = b.select(b.compare(q, zero, hlo::Cmp::EQ), signed_zero, f);
  return b.select(b.compare(y, zero, hlo::Cmp::EQ), plain, f);
}

// Integer division by zero raises CPU's "ZeroDivisionError": for a Python number at
// once, for a zero inside a divisor tensor as a device-side check (raised at the next
// host synchronisation, like the index checks).
void check_int_divisor(Ctx& c, size_t i) {
  if (!hlo::is_int(c.odt()) || !c.has(i)) return;
  const Arg& a = c.arg(i);
  if (a.kind == Arg::Scalar && c.num_is(i, 0)) throw UserError("ZeroDivisionError");
  if (a.kind != Arg::Tensor) return;
  if (c.env.scalar_value(a.tensor) == 0.0)  // a CPU scalar: `x // 0`
    throw UserError("ZeroDivisionError");
  Builder& b = c.b;
  Value d = c.in(i);
  int64_t n = hlo::numel(d.shape());
  if (n == 0) return;
  Value flat = b.reshape(d, {n});
  Value zero = b.reduce(b.compare(flat, k(b, 0, flat), hlo::Cmp::EQ), b.constant_int(0, DType::Pred), {0}, op::or_);
  c.env.check(zero, b.constant_int(0, DType::S64), false, "ZeroDivisionError");
}

// div with rounding_mode None | "trunc" | "floor"
V div_mode(Ctx& c, size_t mode_arg, const char* forced = nullptr) {
  DType t = c.odt();
  std::string mode = forced ? forced : c.has(mode_arg) ? c.str(mode_arg) : "";
  if (!mode.empty()) check_int_divisor(c, 1);
  if (mode.empty()) {
    DType ct = compute_type(t);
    return {c.b.convert(c.b.div(c.in_out(0, ct), c.in_out(1, ct)), t)};
  }
  Value a = c.in_out(0, t), d = c.in_out(1, t);
  Builder& b = c.b;
  if (hlo::is_int(t)) {
    Value q = b.div(a, d);  // truncates
    if (mode == "trunc") return {q};
    Value r = b.binary(op::remainder, a, d);
    Value adjust = b.binary(op::and_, b.compare(r, k(b, 0, r), hlo::Cmp::NE),
                            b.compare(b.compare(r, k(b, 0, r), hlo::Cmp::LT),
                                      b.compare(d, k(b, 0, d), hlo::Cmp::LT), hlo::Cmp::NE));
    return {b.select(adjust, b.sub(q, k(b, 1, q)), q)};
  }
  // floats, as CPU: trunc rounds the quotient to the tensor's type first; floor
  // computes in the accumulation type (f16/bf16 in f32) and rounds once
  if (mode == "trunc") return {trunc(b, b.div(a, d))};
  DType ct = compute_type(t);
  return {b.convert(floor_div(b, b.convert(a, ct), b.convert(d, ct)), t)};
}

// pow(x, e) with the common exponents spelled out (structural on the exponent).
V pow_scalar(Ctx& c) {
  DType t = c.odt();
  // CPU's check (the Meta kernel has none): an integer tensor to a negative integer power
  if ((hlo::is_int(t) || t == DType::Pred) && c.check_number(1) < 0)
    throw UserError("Integers to negative integer powers are not allowed.");
  Value x = c.in_out(0, t);
  double e = c.num(1);
  Builder& b = c.b;
  if (e == 1.0) return {x};
  if (e == 2.0) return {b.mul(x, x)};
  if (e == 3.0) return {b.mul(x, b.mul(x, x))};
  if (e == 0.5 && hlo::is_float(t)) return {b.unary(op::sqrt, x)};
  if (e == -0.5 && hlo::is_float(t)) return {b.unary(op::rsqrt, x)};
  if (e == -1.0 && hlo::is_float(t)) return {b.div(k(b, 1, x), x)};
  return {b.binary(op::power, x, c.in_out(1, t))};
}

// clamp(x, min?, max?) with scalar or tensor bounds; NaN in x propagates.
V clamp(Ctx& c) {
  DType t = c.odt();
  Value x = c.in_out(0, t);
  if (c.has(1)) x = c.b.max(x, c.in_out(1, t));
  if (c.has(2)) x = c.b.min(x, c.in_out(2, t));
  return {x};
}

// ---- arithmetic rules
// CPU's kernel (not the Meta one) rejects a bool alpha for a non-bool result
void check_alpha(Ctx& c) {
  if (!c.has(2)) return;
  const Arg& alpha = c.arg(2);
  if ((alpha.kind == Arg::Bool || alpha.scalar_is_bool) && c.odt() != DType::Pred)
    throw UserError("Boolean alpha only supported for Boolean results.");
}
// CPU's kernels reject bool operands of a subtraction (the Meta kernels of the
// Scalar and in-place forms do not); the replay gives CPU's message
void check_bool_sub(Ctx& c) {
  for (size_t i : {size_t(0), size_t(1)}) {
    if (!c.has(i)) continue;
    const Arg& a = c.arg(i);
    bool is_bool = a.kind == Arg::Tensor ? a.tensor.dtype() == DType::Pred : (a.kind == Arg::Bool || a.scalar_is_bool);
    if (is_bool) throw UserError("Subtraction, the `-` operator, with a bool tensor is not supported.");
  }
}
// complex a + alpha * b multiplies by alpha (1, or -1 for a subtraction) as a complex
// number even where it is 1, as CPU's kernels do: (1+1j) + (inf+infj) is nan+nanj there
Value complex_axpy(Ctx& c, Value a, Value b, bool negate, DType ct) {
  Value alpha = c.has(2) ? c.in_out(2, ct) : c.b.scalar_like(1.0, b);
  if (negate) alpha = c.b.unary(op::negate, alpha);
  return c.b.add(a, c.b.mul(alpha, b));
}
// add(a, b, alpha) = a + alpha * b, f16/bf16 computed in f32 and rounded
// once (as CPU and CUDA: 60000 + 2 * -60000 in half is -60000, not -inf; a Python
// number out of half's range, x + -70000, is not rounded to -inf first)
Rule add_like(bool subtract) {
  return [subtract](Ctx& c) -> V {
    check_alpha(c);
    if (subtract) check_bool_sub(c);
    DType t = c.odt(), ct = compute_type(t);
    Value a = c.in_out(0, ct), b = c.in_out(1, ct);
    if (hlo::is_complex(t)) return {complex_axpy(c, a, b, subtract, ct)};
    if (c.has(2) && !c.num_is(2, 1.0)) b = c.b.mul(b, c.in_out(2, ct));
    return {c.b.convert(subtract ? c.b.sub(a, b) : c.b.add(a, b), t)};
  };
}
// rsub(a, b, alpha) = b - alpha * a (f16/bf16 in f32, as add)
V lower_rsub(Ctx& c) {
  check_alpha(c);
  check_bool_sub(c);
  DType t = c.odt(), ct = compute_type(t);
  Value a = c.in_out(0, ct), b = c.in_out(1, ct);
  if (hlo::is_complex(t)) return {complex_axpy(c, b, a, true, ct)};
  if (c.has(2) && !c.num_is(2, 1.0)) a = c.b.mul(a, c.in_out(2, ct));
  return {c.b.convert(c.b.sub(b, a), t)};
}
V lower_remainder(Ctx& c) {
  check_int_divisor(c, 1);
  return binary_fn(remainder)(c);
}
V lower_fmod(Ctx& c) {
  check_int_divisor(c, 1);
  return binary(op::remainder)(c);
}
// lerp(a, b, w) = a + w * (b - a); these fused formulas compute in the accumulation
// type (f16/bf16 in f32) and round once, as CPU does
V lower_lerp(Ctx& c) {
  DType t = compute_type(c.odt());
  Value a = c.in_out(0, t), b = c.in_out(1, t), w = c.in_out(2, t);
  return {c.b.convert(c.b.add(a, c.b.mul(w, c.b.sub(b, a))), c.odt())};
}
// addcmul(s, t1, t2, value) = s + value * t1 * t2 ; addcdiv: s + value * t1 / t2
V lower_addcmul_addcdiv(Ctx& c, bool is_div) {
  DType t = compute_type(c.odt());
  Value s = c.in_out(0, t), a = c.in_out(1, t), b = c.in_out(2, t);
  Value p = is_div ? c.b.div(a, b) : c.b.mul(a, b);
  if (!c.has(3) || !c.num_is(3, 1.0)) p = c.b.mul(c.in_out(3, t), p);
  return {c.b.convert(c.b.add(s, p), c.odt())};
}

// ---- unary math rules
V lower_trunc(Ctx& c) {
  if (c.in(0).dtype() == DType::Pred) throw UserError("trunc is not implemented for 'Bool'");  // as on CPU
  if (!hlo::is_float(c.in(0).dtype())) return {c.in_out(0, c.odt())};  // integers: unchanged
  return unary_fn(trunc)(c);
}
// sinh(x) = sign(x) (e^a - e^-a) / 2, a = |x|: by expm1 below 1 (no cancellation);
// cosh(x) = (e^a + e^-a) / 2; above a = 20 both (e^(a/2) / 2) e^(a/2), finite as long as the result is
Value sinh_fn(Builder& b, Value x) {
  if (hlo::is_complex(x.dtype())) throw Unsupported("sinh of a complex tensor (real formula)");
  Value a = b.unary(op::abs, x), h = b.unary(op::exponential, b.mul(a, k(b, 0.5, x)));
  Value tiny = b.mul(k(b, 0.5, x), b.sub(b.unary(op::exponential_minus_one, a), b.unary(op::exponential_minus_one, b.neg(a))));
  Value mid = b.mul(k(b, 0.5, x), b.sub(b.unary(op::exponential, a), b.unary(op::exponential, b.neg(a))));
  Value r = b.select(b.compare(a, k(b, 1, x), Cmp::LT), tiny,
                     b.select(b.compare(a, k(b, 20, x), Cmp::GT), b.mul(b.mul(k(b, 0.5, x), h), h), mid));
  return b.select(b.compare(x, k(b, 0, x), Cmp::LT), b.neg(r), r);
}
Value cosh_fn(Builder& b, Value x) {
  if (hlo::is_complex(x.dtype())) throw Unsupported("cosh of a complex tensor (real formula)");
  Value a = b.unary(op::abs, x), h = b.unary(op::exponential, b.mul(a, k(b, 0.5, x)));
  Value mid = b.mul(k(b, 0.5, x), b.add(b.unary(op::exponential, a), b.unary(op::exponential, b.neg(a))));
  return b.select(b.compare(a, k(b, 20, x), Cmp::GT), b.mul(b.mul(k(b, 0.5, x), h), h), mid);
}
// atan(x) = atan2(x, 1), with the 1 as a runtime parameter: the XLA CPU
// compiler returns wrong values for atan2(x, constant 1) (and chlo.atan) on
// vectors of a few hundred elements.
V lower_atan(Ctx& c) {
  DType t = compute_type(c.odt());
  Value x = c.in_out(0, t);
  Value one = c.b.broadcast_to(c.env.scalar_param(1.0, false, t), x.shape());
  return {c.b.convert(c.b.binary(op::atan2, x, one), c.odt())};
}
// asin(x) = atan2(x, sqrt(1 - x^2)); acos(x) = atan2(sqrt(1 - x^2), x)
Value asin_fn(Builder& b, Value x) {
  return b.binary(op::atan2, x, b.unary(op::sqrt, b.sub(k(b, 1, x), b.mul(x, x))));
}
Value acos_fn(Builder& b, Value x) {
  return b.binary(op::atan2, b.unary(op::sqrt, b.sub(k(b, 1, x), b.mul(x, x))), x);
}
// inverse hyperbolics, a = |x|: asinh = sign(x) log1p(a + a^2 / (1 + sqrt(1 + a^2))),
// acosh = log1p((x - 1) + sqrt((x - 1)(x + 1))), both log(a) + log 2 for large a
// (where a^2 would overflow); atanh = 0.5 * log1p(2x / (1 - x))
Value asinh_fn(Builder& b, Value x) {
  if (hlo::is_complex(x.dtype())) throw Unsupported("asinh of a complex tensor (real formula)");
  Value a = b.unary(op::abs, x);
  Value big = b.compare(a, k(b, large_arg(x.dtype()), x), Cmp::GT);
  Value as = b.select(big, k(b, 1, x), a);
  Value small = b.unary(op::log_plus_one, b.add(as, b.div(b.mul(as, as), b.add(k(b, 1, x), b.unary(op::sqrt, b.add(k(b, 1, x), b.mul(as, as)))))));
  Value r = b.select(big, b.add(b.unary(op::log, a), k(b, M_LN2, x)), small);
  return b.select(b.compare(x, k(b, 0, x), Cmp::LT), b.neg(r), r);
}
Value acosh_fn(Builder& b, Value x) {
  Value big = b.compare(x, k(b, large_arg(x.dtype()), x), Cmp::GT);
  Value xs = b.select(big, k(b, 1, x), x), d = b.sub(xs, k(b, 1, x));
  Value small = b.unary(op::log_plus_one, b.add(d, b.unary(op::sqrt, b.mul(d, b.add(xs, k(b, 1, x))))));
  return b.select(big, b.add(b.unary(op::log, x), k(b, M_LN2, x)), small);
}
Value atanh_fn(Builder& b, Value x) {
  return b.mul(k(b, 0.5, x), b.unary(op::log_plus_one, b.div(b.mul(k(b, 2, x), x), b.sub(k(b, 1, x), x))));
}
// logaddexp(a, b) = max + log1p(exp(-|a - b|)); logaddexp2 in base 2
Value logaddexp_fn(Builder& b, Value x, Value y) {
  if (hlo::is_complex(x.dtype())) {
    // complex, as CPU: (lo, hi) ordered by real part; NaN in lo -> NaN; lo.re = hi.re = -inf -> lo;
    // +inf -> log(exp(lo) + exp(hi)); else hi + log1p(exp(lo - hi))
    DType part = hlo::real_part(x.dtype());
    Value xr = b.real(x), yr = b.real(y);
    Value x_lo = b.compare(xr, yr, Cmp::LT);
    Value lo = b.select(x_lo, x, y), hi = b.select(x_lo, y, x);
    Value lr = b.real(lo), li = b.imag(lo), hr = b.real(hi);
    Value nan_lo = b.binary(op::or_, b.compare(lr, lr, Cmp::NE), b.compare(li, li, Cmp::NE));
    Value inf_eq = b.binary(op::and_, b.compare(lr, hr, Cmp::EQ), b.compare(b.unary(op::abs, lr), b.constant(INFINITY, part, x.shape()), Cmp::EQ));
    Value neg = b.compare(lr, b.zeros(part, x.shape()), Cmp::LT);
    Value general = b.add(hi, b.unary(op::log_plus_one, b.unary(op::exponential, b.sub(lo, hi))));
    Value pinf = b.unary(op::log, b.add(b.unary(op::exponential, lo), b.unary(op::exponential, hi)));
    Value r = b.select(inf_eq, b.select(neg, lo, pinf), general);
    Value qnan = b.constant(NAN, part, x.shape());
    return b.select(nan_lo, b.complex(qnan, qnan), r);
  }
  Value m = b.max(x, y);
  Value d = b.unary(op::abs, b.sub(x, y));
  Value r = b.add(m, b.unary(op::log_plus_one, b.unary(op::exponential, b.neg(d))));
  return b.select(b.compare(x, y, Cmp::EQ), b.add(x, k(b, M_LN2, x)), r);  // also inf == inf
}
Value logaddexp2_fn(Builder& b, Value x, Value y) {
  Value m = b.max(x, y);
  Value d = b.mul(b.unary(op::abs, b.sub(x, y)), k(b, M_LN2, x));
  Value r = b.add(m, b.mul(b.unary(op::log_plus_one, b.unary(op::exponential, b.neg(d))), k(b, M_LOG2E, x)));
  return b.select(b.compare(x, y, Cmp::EQ), b.add(x, k(b, 1, x)), r);
}
// copysign(a, b) = |a| with b's sign bit
Value copysign_fn(Builder& b, Value x, Value y) {
  DType it = int_like(y.dtype());
  Value neg = b.compare(b.bitcast(y, it), b.constant_int(0, it, y.shape()), Cmp::LT);
  Value ax = b.unary(op::abs, x);
  return b.select(neg, b.neg(ax), ax);
}
// fmax/fmin ignore NaN: NaN only when both are NaN
Rule fmax_fmin(bool is_max) {
  return binary_fn([is_max](Builder& b, Value x, Value y) {
    Value m = is_max ? b.max(x, y) : b.min(x, y);
    Value xn = b.compare(x, x, Cmp::NE), yn = b.compare(y, y, Cmp::NE);
    return b.select(xn, y, b.select(yn, x, m));
  });
}
// hypot(a, b) = m sqrt(1 + (s / m)^2), m = max(|a|, |b|), s = min: no overflow of a^2;
// inf if either is inf (even with a NaN), as IEEE's hypot
Value hypot_fn(Builder& b, Value x, Value y) {
  Value ax = b.unary(op::abs, x), ay = b.unary(op::abs, y);
  Value m = b.max(ax, ay), s = b.min(ax, ay);
  Value q = b.div(s, b.select(b.compare(m, k(b, 0, m), Cmp::EQ), k(b, 1, m), m));
  Value r = b.mul(m, b.unary(op::sqrt, b.add(k(b, 1, q), b.mul(q, q))));
  Value inf = k(b, INFINITY, x);
  return b.select(b.binary(op::or_, b.compare(ax, inf, Cmp::EQ), b.compare(ay, inf, Cmp::EQ)), inf, r);
}
// xlogy(x, y) = x == 0 ? 0 : x * log(y) (NaN y propagates)
Value xlogy_fn(Builder& b, Value x, Value y) {
  Value r = b.mul(x, b.unary(op::log, y));
  Value zero = b.select(b.compare(y, y, Cmp::NE), y, k(b, 0, x));
  return b.select(b.compare(x, k(b, 0, x), Cmp::EQ), zero, r);
}
// heaviside(x, v) = x == 0 ? v : x > 0
V lower_heaviside(Ctx& c) {
  if (c.in(0).dtype() != c.in(1).dtype())
    throw UserError("heaviside is not yet implemented for tensors with different dtypes.");
  DType t = c.odt();
  Builder& b = c.b;
  Value x = c.in_out(0, t), v = c.in_out(1, t);
  Value step = b.convert(b.compare(x, k(b, 0, x), Cmp::GT), t);
  return {b.select(b.compare(x, k(b, 0, x), Cmp::EQ), v, step)};
}
// signbit(x) = sign bit of x (floats: also -0.0 and -NaN)
V lower_signbit(Ctx& c) {
  Builder& b = c.b;
  Value x = c.in(0);
  if (x.dtype() == DType::Pred || hlo::is_unsigned(x.dtype())) return {b.constant_int(0, DType::Pred, x.shape())};
  if (hlo::is_float(x.dtype())) x = b.bitcast(x, int_like(x.dtype()));
  return {b.compare(x, k(b, 0, x), Cmp::LT)};
}
// sinc(x) = x == 0 ? 1 : sin(pi x) / (pi x)
Value sinc_fn(Builder& b, Value x) {
  Value px = b.mul(x, k(b, M_PI, x));
  return b.select(b.compare(x, k(b, 0, x), Cmp::EQ), k(b, 1, x), b.div(b.unary(op::sine, px), px));
}
// angle(x): atan2(im, re) for complex x; for real x isnan(x) ? x : x < 0 ? pi : 0
V lower_angle(Ctx& c) {
  Value x = c.in(0);
  if (hlo::is_complex(x.dtype())) return {c.b.convert(c.b.binary(op::atan2, c.b.imag(x), c.b.real(x)), c.odt())};
  static const Rule real = unary_fn([](Builder& b, Value v) {
    Value a = b.select(b.compare(v, k(b, 0, v), Cmp::LT), k(b, M_PI, v), k(b, 0, v));
    return b.select(b.compare(v, v, Cmp::NE), v, a);
  });
  return real(c);
}
// nextafter(x, y): the bits of x stepped by one towards y (NaN if either is
// NaN, y if x == y, the smallest subnormal with y's sign if x == 0)
V lower_nextafter(Ctx& c) {
  DType t = c.odt();
  Builder& b = c.b;
  Value x = c.in_out(0, t), y = c.in_out(1, t);
  DType it = int_like(t);
  Value ix = b.bitcast(x, it), one = k(b, 1, ix);
  Value up = b.compare(b.compare(x, y, Cmp::LT), b.compare(x, k(b, 0, x), Cmp::GT), Cmp::EQ);
  Value step = b.bitcast(b.select(up, b.add(ix, one), b.sub(ix, one)), t);
  Value tiny = b.bitcast(one, t);
  Value from0 = b.select(b.compare(y, k(b, 0, y), Cmp::GT), tiny, b.neg(tiny));
  Value r = b.select(b.compare(x, k(b, 0, x), Cmp::EQ), from0, step);
  r = b.select(b.compare(x, y, Cmp::EQ), y, r);
  return {b.select(b.binary(op::or_, b.compare(x, x, Cmp::NE), b.compare(y, y, Cmp::NE)), b.add(x, y), r)};
}
// frexp(x) = (m, e) with x = m * 2^e, 0.5 <= |m| < 1, from the bits alone (the
// CPU plugin flushes subnormal arithmetic to zero): m keeps x's sign and fraction
// under the exponent field bias - 1; a subnormal's fraction is first shifted
// up to its leading one. (x, 0) for 0, inf, NaN.
V lower_frexp(Ctx& c) {
  Builder& b = c.b;
  DType t = c.odt();
  if (!hlo::is_float(t)) throw Unsupported("frexp of a non-float tensor");
  Value x = c.in_out(0, t);
  int64_t mant = t == DType::F64 ? 52 : t == DType::F32 ? 23 : t == DType::F16 ? 10 : 7;
  int64_t bias = t == DType::F64 ? 1023 : t == DType::F16 ? 15 : 127, emask = 2 * bias + 1;
  int64_t width = 8 * hlo::itemsize(t);
  DType it = int_like(t);
  Value bits = b.bitcast(x, it);
  auto ik = [&](int64_t v) { return b.constant_int(wrap_int(v, it), it, x.shape()); };
  auto band = [&](Value u, int64_t m) { return b.binary(op::and_, u, ik(m)); };
  Value e = band(b.binary(op::shift_right_logical, bits, ik(mant)), emask);
  Value f = band(bits, (int64_t{1} << mant) - 1);
  Value lead = b.sub(ik(width - 1), b.unary(op::count_leading_zeros, f));  // bit of f's leading one
  Value sub = b.compare(e, ik(0), Cmp::EQ);
  Value fs = band(b.binary(op::shift_left, f, b.sub(ik(mant), lead)), (int64_t{1} << mant) - 1);
  Value ex = b.select(sub, b.add(lead, ik(2 - bias - mant)), b.sub(e, ik(bias - 1)));
  Value mbits = b.binary(op::or_, band(bits, static_cast<int64_t>(uint64_t{1} << (width - 1))), ik((bias - 1) << mant));
  Value m = b.bitcast(b.binary(op::or_, mbits, b.select(sub, fs, f)), t);
  Value special = b.binary(op::or_, b.compare(e, ik(emask), Cmp::EQ),
                           b.binary(op::and_, sub, b.compare(f, ik(0), Cmp::EQ)));
  return {b.select(special, x, m), b.convert(b.select(special, ik(0), ex), c.odt(1))};
}
// round(x, decimals) = round(x * 10^d) / 10^d
V lower_round_decimals(Ctx& c) {
  DType t = compute_type(c.odt());
  Value x = c.in_out(0, t);
  double scale = std::pow(10.0, static_cast<double>(c.int_(1)));
  Value sc = k(c.b, scale, x);
  return {c.b.convert(c.b.div(c.b.unary(op::round_nearest_even, c.b.mul(x, sc)), sc), c.odt())};
}
// log_sigmoid_forward(x) -> (y, buffer): y = min(x, 0) - log1p(exp(-|x|))
V lower_log_sigmoid_forward(Ctx& c) {
  DType t = compute_type(c.odt());
  Builder& b = c.b;
  Value x = c.in_out(0, t);
  Value y = b.sub(b.min(x, k(b, 0, x)), b.unary(op::log_plus_one, b.unary(op::exponential, b.neg(b.unary(op::abs, x)))));
  return {b.convert(y, c.odt()), b.zeros(c.odt(1), c.oshape(1))};
}
// log_sigmoid_backward(g, x, buffer) = g * sigmoid(-x)
V lower_log_sigmoid_backward(Ctx& c) {
  DType t = compute_type(c.odt());
  Builder& b = c.b;
  Value g = c.in_out(0, t), x = c.in_out(1, t);
  return {b.convert(b.mul(g, sigmoid(b, b.neg(x))), c.odt())};
}
// nan_to_num(x, nan, posinf, neginf)
V lower_nan_to_num(Ctx& c) {
  Builder& b = c.b;
  DType t = c.odt();
  Value x = c.in_out(0, t);
  if (!hlo::is_float(t)) return {x};
  double big = t == DType::F64 ? 1.7976931348623157e308 : t == DType::F16 ? 65504.0 : t == DType::BF16 ? 3.3895313892515355e38 : 3.4028234663852886e38;
  Value nanv = b.broadcast_to(c.scalar_or(1, 0.0, t), x.shape());
  Value pinf = c.has(2) ? b.broadcast_to(c.scalar(2, t), x.shape()) : k(b, big, x);
  Value ninf = c.has(3) ? b.broadcast_to(c.scalar(3, t), x.shape()) : k(b, -big, x);
  Value r = b.select(b.compare(x, x, Cmp::NE), nanv, x);
  r = b.select(b.compare(x, k(b, INFINITY, x), Cmp::EQ), pinf, r);
  return {b.select(b.compare(x, k(b, -INFINITY, x), Cmp::EQ), ninf, r)};
}
V lower_isnan(Ctx& c) {
  Value x = c.in(0);
  return {c.b.compare(x, x, Cmp::NE)};
}
V lower_isinf(Ctx& c) {
  Value x = c.in(0);
  if (!hlo::is_float(x.dtype())) return {c.b.constant_int(0, DType::Pred, x.shape())};
  return {c.b.compare(c.b.unary(op::abs, x), c.b.constant(INFINITY, x.dtype(), x.shape()), Cmp::EQ)};
}
// isneginf (neg) / isposinf
V lower_isneginf_isposinf(Ctx& c, bool neg) {
  Value x = c.in(0);
  if (!hlo::is_float(x.dtype())) return {c.b.constant_int(0, DType::Pred, x.shape())};
  return {c.b.compare(x, c.b.constant(neg ? -INFINITY : INFINITY, x.dtype(), x.shape()), Cmp::EQ)};
}
V lower_logical_not(Ctx& c) {
  Value x = c.in(0);
  Value r = x.dtype() == DType::Pred ? c.b.unary(op::not_, x) : c.b.compare(x, c.b.zeros(x.dtype(), x.shape()), Cmp::EQ);
  return {r};
}

// ---- comparisons and logical ops
// Shifts of integers. StableHLO's out-of-range amounts (< 0 or >= the bit width)
// give what CPU gives: 0 for a left shift, the sign fill for a right shift
// (arithmetic for signed types, logical, i.e. 0, for unsigned ones). CPU has no
// float or bool shifts: those run the fallback, which raises CPU's error.
Rule shift(bool left) {
  return [left](Ctx& c) -> V {
    DType t = c.odt();
    if (!hlo::is_int(t)) throw Unsupported("shift of a non-integer tensor");
    op::Binary f = left ? op::shift_left : hlo::is_unsigned(t) ? op::shift_right_logical : op::shift_right_arithmetic;
    return {c.b.binary(f, c.in_out(0, t), c.in_out(1, t))};
  };
}

// ---- where / masked_fill
V lower_where(Ctx& c) {
  Value p = c.in_as(0, DType::Pred, c.oshape());
  return {c.b.select(p, c.in_out(1, c.odt()), c.in_out(2, c.odt()))};
}
V lower_masked_fill(Ctx& c) {
  Value p = c.in_as(1, DType::Pred, c.oshape());
  return {c.b.select(p, c.in_out(2, c.odt()), c.in_out(0, c.odt()))};
}

// ---- activations
V lower_gelu(Ctx& c) {
  DType t = compute_type(c.odt());
  bool tanh_form = c.has(1) && c.str(1) == "tanh";
  return {c.b.convert(gelu(c.b, c.in_out(0, t), tanh_form), c.odt())};
}
Value mish_fn(Builder& b, Value x) {
  Value sp = b.unary(op::log_plus_one, b.unary(op::exponential, x));
  return b.mul(x, b.unary(op::tanh, sp));
}
V lower_hardtanh(Ctx& c) {
  DType t = c.odt();
  return {c.b.clamp(c.in_out(1, t), c.in_out(0, t), c.in_out(2, t))};
}
V lower_leaky_relu(Ctx& c) {
  DType t = c.odt();
  Value x = c.in_out(0, t);
  Value neg = c.b.mul(x, c.b.broadcast_to(c.scalar_or(1, 0.01, t), x.shape()));
  return {c.b.select(c.b.compare(x, k(c.b, 0, x), Cmp::GT), x, neg)};
}
// elu(x) = x > 0 ? scale * x : scale * alpha * (exp(x * input_scale) - 1)
V lower_elu(Ctx& c) {
  DType t = compute_type(c.odt());
  Builder& b = c.b;
  Value x = c.in_out(0, t);
  Value alpha = c.in_out(1, t), scale = c.in_out(2, t), iscale = c.in_out(3, t);
  Value neg = b.mul(alpha, b.unary(op::exponential_minus_one, b.mul(x, iscale)));
  return {b.convert(b.mul(scale, b.select(b.compare(x, k(b, 0, x), Cmp::GT), x, neg)), c.odt())};
}
// softplus(x) = x * beta > threshold ? x : log1p(exp(beta x)) / beta
V lower_softplus(Ctx& c) {
  DType t = compute_type(c.odt());
  Builder& b = c.b;
  Value x = c.in_out(0, t), beta = c.in_out(1, t), th = c.in_out(2, t);
  Value bx = b.mul(x, beta);
  Value soft = b.div(b.unary(op::log_plus_one, b.unary(op::exponential, bx)), beta);
  return {b.convert(b.select(b.compare(bx, th, Cmp::GT), x, soft), c.odt())};
}
Value hardsigmoid_fn(Builder& b, Value x) {
  return b.div(b.clamp(k(b, 0, x), b.add(x, k(b, 3, x)), k(b, 6, x)), k(b, 6, x));
}
Value hardswish_fn(Builder& b, Value x) {
  return b.mul(x, b.div(b.clamp(k(b, 0, x), b.add(x, k(b, 3, x)), k(b, 6, x)), k(b, 6, x)));
}
// threshold(x, th, v) = x <= th ? v : x
V lower_threshold(Ctx& c) {
  DType t = c.odt();
  Value x = c.in_out(0, t);
  return {c.b.select(c.b.compare(x, c.in_out(1, t), Cmp::LE), c.in_out(2, t), x)};
}
// softshrink(x, l) = x > l ? x - l : x < -l ? x + l : 0 * x (NaN stays NaN)
V lower_softshrink(Ctx& c) {
  DType t = c.odt();
  Builder& b = c.b;
  Value x = c.in_out(0, t), l = c.in_out(1, t);
  Value mid = b.select(b.compare(x, b.neg(l), Cmp::LT), b.add(x, l), b.mul(x, k(b, 0, x)));
  return {b.select(b.compare(x, l, Cmp::GT), b.sub(x, l), mid)};
}
// hardshrink(x, l) = -l <= x <= l ? 0 : x; both backward kernels: -l <= x <= l ? 0 : g
Value in_band(Ctx& c, Value x, size_t l_arg) {
  Value l = c.in_out(l_arg, x.dtype());
  return c.b.binary(op::and_, c.b.compare(x, c.b.neg(l), Cmp::GE), c.b.compare(x, l, Cmp::LE));
}
V lower_hardshrink(Ctx& c) {
  Value x = c.in_out(0, c.odt());
  return {c.b.select(in_band(c, x, 1), k(c.b, 0, x), x)};
}
V lower_shrink_backward(Ctx& c) {
  Value g = c.in_out(0, c.odt()), x = c.in_out(1, c.odt());
  return {c.b.select(in_band(c, x, 2), k(c.b, 0, g), g)};
}

// ---- activation backward kernels (grad first)
// threshold_backward(g, x, th) = x <= th ? 0 : g
V lower_threshold_backward(Ctx& c) {
  DType t = c.odt();
  Value g = c.in_out(0, t), x = c.in_out(1, t);
  return {c.b.select(c.b.compare(x, c.in_out(2, t), Cmp::LE), k(c.b, 0, g), g)};
}
V lower_gelu_backward(Ctx& c) {
  DType t = compute_type(c.odt());
  bool tanh_form = c.has(2) && c.str(2) == "tanh";
  Value g = c.in_out(0, t), x = c.in_out(1, t);
  return {c.b.convert(c.b.mul(g, gelu_grad(c.b, x, tanh_form)), c.odt())};
}
// silu'(x) = s (1 + x (1 - s)), s = sigmoid(x)
V lower_silu_backward(Ctx& c) {
  DType t = compute_type(c.odt());
  Builder& b = c.b;
  Value g = c.in_out(0, t), x = c.in_out(1, t);
  Value s = sigmoid(b, x);
  Value d = b.mul(s, b.add(k(b, 1, x), b.mul(x, b.sub(k(b, 1, x), s))));
  return {b.convert(b.mul(g, d), c.odt())};
}
// sigmoid_backward(g, y) = g y (1 - y); tanh_backward(g, y) = g (1 - y^2)
V lower_sigmoid_backward(Ctx& c) {
  DType t = c.odt();
  Value g = c.in_out(0, t), y = c.in_out(1, t);
  return {c.b.mul(g, c.b.mul(y, c.b.sub(k(c.b, 1, y), y)))};
}
V lower_tanh_backward(Ctx& c) {
  DType t = c.odt();
  Value g = c.in_out(0, t), y = c.in_out(1, t);
  return {c.b.mul(g, c.b.sub(k(c.b, 1, y), c.b.mul(y, y)))};
}
// hardtanh_backward(g, x, lo, hi) = lo < x < hi ? g : 0
V lower_hardtanh_backward(Ctx& c) {
  DType t = c.odt();
  Builder& b = c.b;
  Value g = c.in_out(0, t), x = c.in_out(1, t);
  Value inside = b.binary(op::and_, b.compare(x, c.in_out(2, t), Cmp::GT), b.compare(x, c.in_out(3, t), Cmp::LT));
  return {b.select(inside, g, k(b, 0, g))};
}
// leaky_relu_backward(g, x, slope, self_is_result) = x > 0 ? g : g * slope
V lower_leaky_relu_backward(Ctx& c) {
  DType t = c.odt();
  Value g = c.in_out(0, t), x = c.in_out(1, t);
  return {c.b.select(c.b.compare(x, k(c.b, 0, x), Cmp::GT), g, c.b.mul(g, c.in_out(2, t)))};
}
// elu_backward(g, alpha, scale, input_scale, is_result, x_or_y):
//   x > 0 ? g * scale : g * input_scale * (is_result ? y + alpha * scale : alpha * scale * exp(x * input_scale))
V lower_elu_backward(Ctx& c) {
  DType t = compute_type(c.odt());
  Builder& b = c.b;
  Value g = c.in_out(0, t), alpha = c.in_out(1, t), scale = c.in_out(2, t), is = c.in_out(3, t);
  Value v = c.in_out(5, t);
  Value neg = c.flag(4) ? b.mul(is, b.add(v, b.mul(alpha, scale)))
                        : b.mul(b.mul(is, b.mul(alpha, scale)), b.unary(op::exponential, b.mul(v, is)));
  Value d = b.select(b.compare(v, k(b, 0, v), Cmp::GT), scale, neg);
  return {b.convert(b.mul(g, d), c.odt())};
}
// logit(x, eps?) = log(z / (1 - z)), z = clamp(x, eps, 1 - eps) when eps is given
V lower_logit(Ctx& c) {
  DType t = compute_type(c.odt());
  Builder& b = c.b;
  Value x = c.in_out(0, t);
  if (c.has(1)) {
    double e = c.num(1);
    x = b.clamp(k(b, e, x), x, k(b, 1 - e, x));
  }
  return {b.convert(b.unary(op::log, b.div(x, b.sub(k(b, 1, x), x))), c.odt())};
}
// logit'(x) = 1 / (x (1 - x)); with eps: 0 outside [eps, 1 - eps]
V lower_logit_backward(Ctx& c) {
  DType t = compute_type(c.odt());
  Builder& b = c.b;
  Value g = c.in_out(0, t), x = c.in_out(1, t);
  Value d = b.div(g, b.mul(x, b.sub(k(b, 1, x), x)));
  if (c.has(2)) {
    double e = c.num(2);
    Value out = b.binary(op::or_, b.compare(x, k(b, e, x), Cmp::LT), b.compare(x, k(b, 1 - e, x), Cmp::GT));
    d = b.select(out, k(b, 0, x), d);
  } else {
    Value out = b.binary(op::or_, b.compare(x, k(b, 0, x), Cmp::LT), b.compare(x, k(b, 1, x), Cmp::GT));
    d = b.select(out, k(b, NAN, x), d);
  }
  return {b.convert(d, c.odt())};
}
// hardsigmoid'(x) = -3 < x < 3 ? 1/6 : 0
V lower_hardsigmoid_backward(Ctx& c) {
  DType t = compute_type(c.odt());
  Builder& b = c.b;
  Value g = c.in_out(0, t), x = c.in_out(1, t);
  Value in = b.binary(op::and_, b.compare(x, k(b, -3, x), Cmp::GT), b.compare(x, k(b, 3, x), Cmp::LT));
  return {b.convert(b.select(in, b.div(g, k(b, 6, x)), k(b, 0, x)), c.odt())};
}
// hardswish'(x) = x < -3 ? 0 : x <= 3 ? (2x + 3) / 6 : 1
V lower_hardswish_backward(Ctx& c) {
  DType t = compute_type(c.odt());
  Builder& b = c.b;
  Value g = c.in_out(0, t), x = c.in_out(1, t);
  Value mid = b.div(b.add(b.mul(k(b, 2, x), x), k(b, 3, x)), k(b, 6, x));
  Value d = b.select(b.compare(x, k(b, -3, x), Cmp::LT), k(b, 0, x),
                     b.select(b.compare(x, k(b, 3, x), Cmp::LE), mid, k(b, 1, x)));
  return {b.convert(b.mul(g, d), c.odt())};
}
// softplus_backward(g, x, beta, th) = bx > th ? g : g * sigmoid(bx)
V lower_softplus_backward(Ctx& c) {
  DType t = compute_type(c.odt());
  Builder& b = c.b;
  Value g = c.in_out(0, t), x = c.in_out(1, t);
  Value bx = b.mul(x, c.in_out(2, t));
  return {b.convert(b.select(b.compare(bx, c.in_out(3, t), Cmp::GT), g, b.mul(g, sigmoid(b, bx))), c.odt())};
}

}  // namespace

void register_elementwise() {
  const std::pair<const char*, Rule> rules[] = {
      // ---- arithmetic: add(a, b, alpha) = a + alpha * b (add_like), rsub(a, b, alpha) = b - alpha * a
      {"aten::add.Tensor", add_like(false)}, {"aten::add.Scalar", add_like(false)},
      {"aten::sub.Tensor", add_like(true)}, {"aten::sub.Scalar", add_like(true)},
      {"aten::rsub.Tensor", lower_rsub}, {"aten::rsub.Scalar", lower_rsub},
      // f16/bf16 multiply in f32 and round once, as CPU: a Python number out of half's range
      // (x * 1e5 for x = 1e-5) is not rounded to inf first; for two half operands the f32
      // product is exact, so the result is the same
      {"aten::mul.Tensor", binary_fn([](Builder& b, Value x, Value y) { return b.mul(x, y); })},
      {"aten::mul.Scalar", binary_fn([](Builder& b, Value x, Value y) { return b.mul(x, y); })},
      {"aten::div.Tensor", [](Ctx& c) { return div_mode(c, kNoArg); }},
      {"aten::div.Scalar", [](Ctx& c) { return div_mode(c, kNoArg); }},
      {"aten::div.Tensor_mode", [](Ctx& c) { return div_mode(c, 2); }},
      {"aten::div.Scalar_mode", [](Ctx& c) { return div_mode(c, 2); }},
      {"aten::floor_divide", [](Ctx& c) -> V { return div_mode(c, kNoArg, "floor"); }},
      {"aten::floor_divide.Scalar", [](Ctx& c) -> V { return div_mode(c, kNoArg, "floor"); }},
      // maximum / minimum: NaN if either is NaN (Builder::max / min)
      {"aten::maximum", [](Ctx& c) -> V { return {c.b.max(c.in_out(0, c.odt()), c.in_out(1, c.odt()))}; }},
      {"aten::minimum", [](Ctx& c) -> V { return {c.b.min(c.in_out(0, c.odt()), c.in_out(1, c.odt()))}; }},
      {"aten::remainder.Tensor", lower_remainder}, {"aten::remainder.Scalar", lower_remainder},
      {"aten::fmod.Tensor", lower_fmod}, {"aten::fmod.Scalar", lower_fmod},
      {"aten::atan2", binary_fn([](Builder& b, Value y, Value x) { return b.binary(op::atan2, y, x); })},
      {"aten::pow.Tensor_Scalar", pow_scalar},
      {"aten::pow.Tensor_Tensor", binary(op::power)}, {"aten::pow.Scalar", binary(op::power)},
      {"aten::clamp", clamp}, {"aten::clamp.Tensor", clamp},
      {"aten::clamp_min", [](Ctx& c) -> V { return {c.b.max(c.in_out(0, c.odt()), c.in_out(1, c.odt()))}; }},
      {"aten::clamp_min.Tensor", [](Ctx& c) -> V { return {c.b.max(c.in_out(0, c.odt()), c.in_out(1, c.odt()))}; }},
      {"aten::clamp_max", [](Ctx& c) -> V { return {c.b.min(c.in_out(0, c.odt()), c.in_out(1, c.odt()))}; }},
      {"aten::clamp_max.Tensor", [](Ctx& c) -> V { return {c.b.min(c.in_out(0, c.odt()), c.in_out(1, c.odt()))}; }},
      {"aten::lerp.Scalar", lower_lerp}, {"aten::lerp.Tensor", lower_lerp},
      {"aten::addcmul", [](Ctx& c) { return lower_addcmul_addcdiv(c, false); }},
      {"aten::addcdiv", [](Ctx& c) { return lower_addcmul_addcdiv(c, true); }},

      // ---- unary math (table rows over the generic unary rules)
      {"aten::neg", unary(op::negate)}, {"aten::abs", unary(op::abs)}, {"aten::exp", unary(op::exponential)},
      {"aten::log", unary(op::log)}, {"aten::log1p", unary(op::log_plus_one)},
      {"aten::expm1", unary(op::exponential_minus_one)}, {"aten::sqrt", unary(op::sqrt)},
      {"aten::rsqrt", unary(op::rsqrt)}, {"aten::sin", unary(op::sine)}, {"aten::cos", unary(op::cosine)},
      {"aten::tan", unary(op::tan)}, {"aten::tanh", unary(op::tanh)}, {"aten::sigmoid", unary(op::logistic)},
      {"aten::floor", unary(op::floor)}, {"aten::ceil", unary(op::ceil)}, {"aten::round", unary(op::round_nearest_even)},
      {"aten::sign", unary(op::sign)}, {"aten::sgn", unary(op::sign)}, {"aten::bitwise_not", unary(op::not_)},
      {"aten::trunc", lower_trunc},
      {"aten::frac", unary_fn([](Builder& b, Value x) { return b.sub(x, trunc(b, x)); })},
      {"aten::reciprocal", unary_fn([](Builder& b, Value x) { return b.div(k(b, 1, x), x); })},
      {"aten::log2", unary_fn([](Builder& b, Value x) { return b.mul(b.unary(op::log, x), k(b, M_LOG2E, x)); })},
      {"aten::log10", unary_fn([](Builder& b, Value x) { return b.mul(b.unary(op::log, x), k(b, M_LOG10E, x)); })},
      {"aten::exp2", unary_fn([](Builder& b, Value x) { return b.unary(op::exponential, b.mul(x, k(b, M_LN2, x))); })},
      {"aten::erf", unary_fn(erf)},
      {"aten::erfc", unary_fn([](Builder& b, Value x) { return b.emit("chlo.erfc", {x}, x.type); })},
      {"aten::sinh", unary_fn(sinh_fn)}, {"aten::cosh", unary_fn(cosh_fn)},
      {"aten::atan", lower_atan}, {"aten::asin", unary_fn(asin_fn)}, {"aten::acos", unary_fn(acos_fn)},
      {"aten::asinh", unary_fn(asinh_fn)}, {"aten::acosh", unary_fn(acosh_fn)}, {"aten::atanh", unary_fn(atanh_fn)},
      {"aten::logaddexp", binary_fn(logaddexp_fn)}, {"aten::logaddexp2", binary_fn(logaddexp2_fn)},
      {"aten::copysign.Tensor", binary_fn(copysign_fn)},
      {"aten::fmax", fmax_fmin(true)}, {"aten::fmin", fmax_fmin(false)},
      {"aten::hypot", binary_fn(hypot_fn)}, {"aten::xlogy.Tensor", binary_fn(xlogy_fn)},
      {"aten::heaviside", lower_heaviside}, {"aten::signbit", lower_signbit},
      {"aten::sinc", unary_fn(sinc_fn)}, {"aten::angle", lower_angle},
      {"aten::nextafter", lower_nextafter}, {"aten::frexp.Tensor", lower_frexp},
      {"aten::round.decimals", lower_round_decimals},
      {"aten::log_sigmoid_forward", lower_log_sigmoid_forward},
      {"aten::log_sigmoid_backward", lower_log_sigmoid_backward},
      {"aten::nan_to_num", lower_nan_to_num}, {"aten::isnan", lower_isnan}, {"aten::isinf", lower_isinf},
      {"aten::isneginf", [](Ctx& c) { return lower_isneginf_isposinf(c, true); }},
      {"aten::isposinf", [](Ctx& c) { return lower_isneginf_isposinf(c, false); }},
      {"aten::logical_not", lower_logical_not},

      // ---- comparisons and logical ops
      {"aten::eq.Tensor", compare(Cmp::EQ)}, {"aten::eq.Scalar", compare(Cmp::EQ)},
      {"aten::ne.Tensor", compare(Cmp::NE)}, {"aten::ne.Scalar", compare(Cmp::NE)},
      {"aten::lt.Tensor", compare(Cmp::LT)}, {"aten::lt.Scalar", compare(Cmp::LT)},
      {"aten::le.Tensor", compare(Cmp::LE)}, {"aten::le.Scalar", compare(Cmp::LE)},
      {"aten::gt.Tensor", compare(Cmp::GT)}, {"aten::gt.Scalar", compare(Cmp::GT)},
      {"aten::ge.Tensor", compare(Cmp::GE)}, {"aten::ge.Scalar", compare(Cmp::GE)},
      {"aten::logical_and", logical(op::and_)}, {"aten::logical_or", logical(op::or_)}, {"aten::logical_xor", logical(op::xor_)},
      {"aten::bitwise_and.Tensor", binary(op::and_)}, {"aten::bitwise_and.Scalar", binary(op::and_)},
      {"aten::bitwise_or.Tensor", binary(op::or_)}, {"aten::bitwise_or.Scalar", binary(op::or_)},
      {"aten::bitwise_xor.Tensor", binary(op::xor_)}, {"aten::bitwise_xor.Scalar", binary(op::xor_)},
      // shifts; __ilshift__ / __irshift__ are in place (x <<= n)
      {"aten::__lshift__.Tensor", shift(true)}, {"aten::__lshift__.Scalar", shift(true)},
      {"aten::__ilshift__.Tensor", shift(true)}, {"aten::__ilshift__.Scalar", shift(true)},
      {"aten::bitwise_left_shift.Tensor", shift(true)}, {"aten::bitwise_left_shift.Tensor_Scalar", shift(true)},
      {"aten::__rshift__.Tensor", shift(false)}, {"aten::__rshift__.Scalar", shift(false)},
      {"aten::__irshift__.Tensor", shift(false)}, {"aten::__irshift__.Scalar", shift(false)},
      {"aten::bitwise_right_shift.Tensor", shift(false)}, {"aten::bitwise_right_shift.Tensor_Scalar", shift(false)},

      // ---- where / masked_fill / fill
      {"aten::where.self", lower_where},
      {"aten::masked_fill.Scalar", lower_masked_fill}, {"aten::masked_fill.Tensor", lower_masked_fill},
      {"aten::fill.Scalar", [](Ctx& c) -> V { return {c.in_out(1, c.odt())}; }},
      {"aten::fill.Tensor", [](Ctx& c) -> V { return {c.in_out(1, c.odt())}; }},
      {"aten::zero", [](Ctx& c) -> V { return {c.b.zeros(c.odt(), c.oshape())}; }},

      // ---- activations
      {"aten::relu", unary_fn([](Builder& b, Value x) { return b.max(x, k(b, 0, x)); })},
      {"aten::gelu", lower_gelu},
      {"aten::silu", unary_fn([](Builder& b, Value x) { return b.mul(x, sigmoid(b, x)); })},
      {"aten::mish", unary_fn(mish_fn)}, {"aten::hardtanh", lower_hardtanh},
      {"aten::leaky_relu", lower_leaky_relu}, {"aten::elu", lower_elu}, {"aten::softplus", lower_softplus},
      {"aten::hardsigmoid", unary_fn(hardsigmoid_fn)}, {"aten::hardswish", unary_fn(hardswish_fn)},
      {"aten::threshold", lower_threshold}, {"aten::softshrink", lower_softshrink},
      {"aten::hardshrink", lower_hardshrink},
      {"aten::hardshrink_backward", lower_shrink_backward}, {"aten::softshrink_backward", lower_shrink_backward},

      // ---- activation backward kernels (grad first)
      {"aten::threshold_backward", lower_threshold_backward}, {"aten::gelu_backward", lower_gelu_backward},
      {"aten::silu_backward", lower_silu_backward}, {"aten::sigmoid_backward", lower_sigmoid_backward},
      {"aten::tanh_backward", lower_tanh_backward}, {"aten::hardtanh_backward", lower_hardtanh_backward},
      {"aten::leaky_relu_backward", lower_leaky_relu_backward}, {"aten::elu_backward", lower_elu_backward},
      {"aten::logit", lower_logit}, {"aten::logit_backward", lower_logit_backward},
      {"aten::hardsigmoid_backward", lower_hardsigmoid_backward},
      {"aten::hardswish_backward", lower_hardswish_backward},
      {"aten::softplus_backward", lower_softplus_backward},
  };
  for (auto& [name, rule] : rules) add_rule(name, rule);
}

}  // namespace tt::lower
