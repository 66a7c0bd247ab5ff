// Special-function family: entr, xlog1py, the gamma family (lgamma, digamma,
// polygamma, mvlgamma, zeta), erfinv / ndtri and the modified Bessel functions
// i0 / i1 (plain and exponentially scaled). Where CHLO has the function the rule
// emits it (the plugin's CHLO legalization expands it); f16/bf16 compute in f32.
#include <cmath>
#include <functional>

#include "lowering/lowering.h"

namespace tt::lower {
namespace {

using V = std::vector<Value>;
using hlo::Cmp;

Value k(Builder& b, double v, Value like) { return b.scalar_like(v, like); }
Value chlo(Builder& b, const char* op, std::vector<Value> xs) { return b.emit(op, xs, xs[0].type); }

// f(x) in the accumulation type, converted to the output type.
Rule unary_fn(std::function<Value(Builder&, Value)> f) {
  return [f](Ctx& c) -> V {
    DType t = compute_type(c.odt());
    return {c.b.convert(f(c.b, c.in_out(0, t)), c.odt())};
  };
}
Rule binary_fn(std::function<Value(Builder&, Value, Value)> f) {
  return [f](Ctx& c) -> V {
    DType t = compute_type(c.odt());
    return {c.b.convert(f(c.b, c.in_out(0, t), c.in_out(1, t)), c.odt())};
  };
}

// Modified Bessel I_nu(a) e^-a for a = |x| >= 0, nu = 0 or 1, both series in
// Horner form (a running product of terms overflows once a compiler reassociates it):
//   a < 12: e^-a (a/2)^nu sum_k (a^2/4)^k / (k! (k + nu)!)                  (30 terms)
//   else:   (2 pi a)^-1/2 sum_k prod_{j<=k} ((2j-1)^2 - 4 nu^2) / (8 j a)    (12 terms)
Value bessel_ie(Builder& b, Value a, int nu) {
  Value small = b.min(a, k(b, 12, a)), q = b.mul(k(b, 0.25, a), b.mul(small, small));
  Value s = k(b, 1, a);
  for (int i = 29; i >= 1; --i) s = b.add(k(b, 1, a), b.mul(s, b.mul(q, k(b, 1.0 / (double(i) * (i + nu)), a))));
  if (nu) s = b.mul(s, b.mul(k(b, 0.5, a), small));
  s = b.mul(s, b.unary(op::exponential, b.neg(small)));
  Value big = b.max(a, k(b, 12, a)), inv = b.div(k(b, 1, a), big), as = k(b, 1, a);
  for (int i = 12; i >= 1; --i) {
    double ratio = ((2.0 * i - 1) * (2.0 * i - 1) - 4.0 * nu * nu) / (8.0 * i);
    as = b.add(k(b, 1, a), b.mul(as, b.mul(inv, k(b, ratio, a))));
  }
  as = b.mul(as, b.unary(op::rsqrt, b.mul(big, k(b, 2 * M_PI, a))));
  return b.select(b.compare(a, k(b, 12, a), Cmp::LT), s, as);
}
// I_nu(x) (scaled: I_nu(x) e^-|x|); I_1 is odd.
Value bessel_i(Builder& b, Value x, int nu, bool scaled) {
  Value a = b.unary(op::abs, x);
  Value r = bessel_ie(b, a, nu);
  if (!scaled) r = b.mul(r, b.unary(op::exponential, a));
  if (nu == 1) r = b.select(b.compare(x, k(b, 0, x), Cmp::LT), b.neg(r), r);
  return b.select(b.compare(x, x, Cmp::NE), x, r);
}


// Orthogonal polynomials p_n(x), as PyTorch's CPU kernels define them: n < 0
// gives 0; each family's closed forms where CPU uses them (|x| = 1, and the
// trigonometric forms of Chebyshev polynomials for |x| < 1, n > 6); otherwise
// the three-term recurrence
//   p_{k+1} = a_k(x) p_k - b_k p_{k-1}
// in a device loop up to the largest such n, which stops early once every
// element still iterating is NaN (as CPU's loop does) and never runs more than
// kLoopCap steps. Above the cap Chebyshev polynomials take their hyperbolic
// closed forms (|x| > 1); Legendre and Laguerre have none and give NaN
// (docs/STATUS.md); Hermite is NaN above n = 128 (f32) / 512 (f64) on CPU too.
constexpr int64_t kLoopCap = 65536;

using Step = std::function<Value(Builder&, Value x, Value k, Value p, Value q)>;  // p = p_k, q = p_{k-1}
using Fn1 = std::function<Value(Builder&, Value)>;
struct Cases {  // elements CPU computes in closed form: where, and the value
  Value where, value;
};
struct Poly {
  Fn1 p1;                // p_1(x)
  Step next;             // p_{k+1}
  // CPU's closed forms, given the input x (before `prep`), n (as x's type) and n's parity (pred: n odd)
  std::function<Cases(Builder&, Value x, Value n, Value odd)> closed;
  // the value for n above the loop cap where no closed form applies (NaN if none)
  std::function<Value(Builder&, Value x, Value n, Value odd)> beyond = {};
  int64_t cap = kLoopCap;  // n above it: `beyond`
};

Value nan_like(Builder& b, Value x) { return k(b, NAN, x); }
Value is_nan(Builder& b, Value x) { return b.compare(x, x, Cmp::NE); }

// n as CPU's kernels read it: a float n truncated to int64, where NaN, inf and
// |n| >= 2^63 give INT64_MIN (x86's conversion), so a negative degree.
Value degree(Ctx& c, const Shape& s, DType t) {
  Builder& b = c.b;
  Value n = c.arg(1).kind == Arg::Tensor ? c.in(1) : c.scalar(1, t);
  n = b.broadcast_to(n, s);
  if (!hlo::is_float(n.dtype())) return b.convert(n, DType::S64);
  Value ok = b.compare(b.unary(op::abs, n), k(b, 9223372036854775808.0, n), Cmp::LT);  // false for NaN
  Value safe = b.select(ok, n, b.zeros(n.dtype(), s));
  return b.select(ok, b.convert(safe, DType::S64), b.constant_int(INT64_MIN, DType::S64, s));
}

Value polynomial(Ctx& c, const Poly& P, const Fn1& prep = {}) {
  Builder& b = c.b;
  DType t = compute_type(c.odt());
  const Shape& s = c.oshape();
  Value x0 = c.in_out(0, t), x = prep ? prep(b, x0) : x0;
  Value n = degree(c, s, t);
  if (hlo::numel(s) == 0) return b.zeros(c.odt(), s);
  auto ik = [&](int64_t v) { return b.constant_int(v, DType::S64, s); };
  Value nf = b.convert(n, t);
  Value odd = b.compare(b.binary(op::and_, n, ik(1)), ik(1), Cmp::EQ);
  Cases cf = P.closed ? P.closed(b, x0, nf, odd) : Cases{b.constant_int(0, DType::Pred, s), b.zeros(t, s)};
  Value big = b.compare(n, ik(P.cap), Cmp::GT);
  Value rec = b.binary(op::and_, b.binary(op::and_, b.compare(n, ik(2), Cmp::GE), b.unary(op::not_, big)),
                       b.unary(op::not_, cf.where));
  std::vector<int64_t> all;
  for (int64_t i = 0; i < static_cast<int64_t>(s.size()); ++i) all.push_back(i);
  Value kmax = b.reduce(b.select(rec, n, ik(1)), b.constant_int(1, DType::S64), all, op::maximum);
  Value one = k(b, 1, x), first = P.p1(b, x), nanv = nan_like(b, x);
  Value more0 = b.reduce(rec, b.constant_int(0, DType::Pred), all, op::or_);
  const Step& next = P.next;
  // carried: k, p_{k-1}, p_k, result, kmax, x, n, rec, more
  auto out = b.while_loop(
      {b.constant_int(1, DType::S64), one, first, nanv, kmax, x, n, rec, more0},
      [](Builder& bb, const std::vector<Value>& v) -> V {
        return {bb.binary(op::and_, bb.compare(v[0], v[4], Cmp::LT), v[8])};
      },
      [&next, s](Builder& bb, const std::vector<Value>& v) -> V {
        Value kv = v[0], xv = v[5], nv = v[6];
        Value p = next(bb, xv, bb.broadcast_to(bb.convert(kv, xv.dtype()), s), v[2], v[1]);
        Value k1 = bb.add(kv, bb.constant_int(1, DType::S64));
        Value k1s = bb.broadcast_to(k1, s);
        Value hit = bb.compare(nv, k1s, Cmp::EQ);
        Value going = bb.binary(op::and_, v[7], bb.binary(op::and_, bb.compare(k1s, nv, Cmp::LT),
                                                         bb.unary(op::not_, bb.compare(p, p, Cmp::NE))));
        std::vector<int64_t> dims;
        for (int64_t i = 0; i < static_cast<int64_t>(s.size()); ++i) dims.push_back(i);
        Value more = bb.reduce(going, bb.constant_int(0, DType::Pred), dims, op::or_);
        return {k1, v[2], p, bb.select(hit, p, v[3]), v[4], xv, nv, v[7], more};
      });
  Value r = out[3];  // elements that stopped early on a NaN keep NaN, as on CPU
  if (P.beyond) r = b.select(big, P.beyond(b, x, nf, odd), r);
  else r = b.select(big, nanv, r);
  r = b.select(b.compare(n, ik(1), Cmp::EQ), first, r);
  r = b.select(b.compare(n, ik(0), Cmp::EQ), one, r);
  r = b.select(cf.where, cf.value, r);
  r = b.select(b.compare(n, ik(0), Cmp::LT), b.zeros(t, s), r);
  return b.convert(r, c.odt());
}

// v where n is odd, else w
Value by_parity(Builder& b, Value odd, Value v, Value w) { return b.select(odd, v, w); }

// Chebyshev polynomials (first to fourth kind) for |y| > 1, t = acosh|y|:
//   T = cosh(n t), U = sinh((n+1) t) / sinh t, V = cosh((n+1/2) t) / cosh(t/2),
//   W = sinh((n+1/2) t) / sinh(t/2), with T(-y) = (-1)^n T(y), U likewise,
//   V(-y) = (-1)^n W(y), W(-y) = (-1)^n V(y). A value that overflows is NaN
//   unless it overflows only at the last step (CPU's recurrence: inf - inf).
Value chebyshev_beyond(Builder& b, char kind, Value y, Value n, Value odd) {
  Value t = b.emit("chlo.acosh", {b.unary(op::abs, y)}, y.type);
  Value neg = b.compare(y, k(b, 0, y), Cmp::LT);
  auto at = [&](Value m) {
    Value h = b.add(m, k(b, 0.5, y));
    Value cosh_v = b.div(b.emit("chlo.cosh", {b.mul(h, t)}, y.type), b.emit("chlo.cosh", {b.mul(k(b, 0.5, y), t)}, y.type));
    Value sinh_w = b.div(b.emit("chlo.sinh", {b.mul(h, t)}, y.type), b.emit("chlo.sinh", {b.mul(k(b, 0.5, y), t)}, y.type));
    Value v;
    if (kind == 't') v = b.emit("chlo.cosh", {b.mul(m, t)}, y.type);
    else if (kind == 'u') v = b.div(b.emit("chlo.sinh", {b.mul(b.add(m, k(b, 1, y)), t)}, y.type), b.emit("chlo.sinh", {t}, y.type));
    else if (kind == 'v') v = b.select(neg, sinh_w, cosh_v);
    else v = b.select(neg, cosh_v, sinh_w);
    return v;
  };
  Value sgn = b.select(b.binary(op::and_, neg, odd), k(b, -1, y), k(b, 1, y));
  Value vn = b.mul(sgn, at(n)), vp = at(b.sub(n, k(b, 1, y)));
  auto finite = [&](Value v) { return b.emit("is_finite", {v}, Type{DType::Pred, v.shape()}); };
  Value r = b.select(b.binary(op::or_, finite(vn), finite(vp)), vn, nan_like(b, y));
  return b.select(is_nan(b, y), y, r);
}

// CPU's closed forms of the Chebyshev polynomials: at the ends of [-1, 1]
// (x = +-1; shifted: x = 1 or 0) and, for n above a threshold, inside it
// (y = cos(theta)): T = cos(n theta), U = sin((n+1) theta) / sin(theta),
// V = cos((n+1/2) theta) / cos(theta/2), W = sin((n+1/2) theta) / sin(theta/2).
Cases chebyshev_closed(Builder& b, char kind, bool shifted, Value x, Value n, Value odd) {
  Value y = shifted ? b.sub(b.add(x, x), k(b, 1, x)) : x;
  Value one = k(b, 1, x), n1 = b.add(n, one), n2 = b.add(b.add(n, n), one);
  // values at the upper end (x = 1) and the lower end (x = -1; shifted x = 0)
  Value up, lo;
  switch (kind) {
    case 't': up = one; lo = by_parity(b, odd, k(b, -1, x), one); break;
    case 'u': up = n1; lo = by_parity(b, odd, b.neg(n1), n1); break;
    case 'v': up = one; lo = by_parity(b, odd, b.neg(n2), n2); break;
    default: up = n2; lo = by_parity(b, odd, k(b, -1, x), one); break;
  }
  Value at_up = b.compare(x, one, Cmp::EQ);
  Value at_lo = shifted ? b.compare(x, k(b, 0, x), Cmp::EQ) : b.compare(x, k(b, -1, x), Cmp::EQ);
  Value ends = b.binary(op::or_, at_up, at_lo);
  Value end_v = b.select(at_up, up, lo);
  int64_t from = shifted ? (kind == 'w' ? 4 : 6) : (kind == 't' ? 6 : 8);
  Value inside = b.binary(op::and_, b.compare(n, k(b, double(from), x), Cmp::GT),
                          b.compare(b.unary(op::abs, y), one, Cmp::LT));
  // theta = acos(y); near y = 1 as 2 atan2(sqrt(1 - y), sqrt(1 + y)), free of the
  // cancellation in 1 - y^2 (n theta amplifies any error in theta)
  Value yi = b.select(inside, y, k(b, 0, x));
  Value th_hi = b.mul(k(b, 2, x), b.emit("atan2", {b.unary(op::sqrt, b.sub(one, yi)), b.unary(op::sqrt, b.add(one, yi))}, x.type));
  Value th = b.select(b.compare(yi, k(b, 0.5, x), Cmp::GE), th_hi, b.emit("chlo.acos", {yi}, x.type));
  Value h = b.add(n, k(b, 0.5, x)), half = b.mul(th, k(b, 0.5, x));
  Value trig;
  switch (kind) {
    case 't': trig = b.unary(op::cosine, b.mul(n, th)); break;
    case 'u': {
      Value st = b.unary(op::sine, th);
      Value deg = b.div(b.mul(n1, b.unary(op::cosine, b.mul(n1, th))), y);
      trig = b.select(b.compare(st, k(b, 0, x), Cmp::NE), b.div(b.unary(op::sine, b.mul(n1, th)), st), deg);
      break;
    }
    case 'v': {
      Value deg = by_parity(b, odd, b.neg(n2), n2);
      trig = b.select(b.compare(b.unary(op::sine, half), one, Cmp::NE),
                      b.div(b.unary(op::cosine, b.mul(h, th)), b.unary(op::cosine, half)), deg);
      break;
    }
    default: {
      Value deg = shifted ? by_parity(b, odd, k(b, -1, x), one)
                          : b.select(b.compare(x, k(b, 0, x), Cmp::GT), n2, by_parity(b, odd, k(b, -1, x), one));
      trig = b.select(b.compare(b.unary(op::cosine, half), one, Cmp::NE),
                      b.div(b.unary(op::sine, b.mul(h, th)), b.unary(op::sine, half)), deg);
      break;
    }
  }
  return {b.binary(op::or_, ends, inside), b.select(ends, end_v, trig)};
}

// Hurwitz zeta(x, q) = sum_{k >= 0} (q + k)^-x as CPU's kernel defines it: inf at
// x = 1 and at integer q <= 0; NaN for x < 1, and for q <= 0 with non-integer x.
// The terms up to q + k >= 10 are summed directly (for negative q, in a device loop
// of at most kLoopCap terms; NaN beyond), the rest by chlo.zeta (accurate there).
Value hurwitz_zeta(Builder& b, Value x, Value q) {
  const Shape& s = x.shape();
  std::vector<int64_t> all;
  for (int64_t i = 0; i < static_cast<int64_t>(s.size()); ++i) all.push_back(i);
  // direct terms: m = max(10, ceil(10 - q)), as a float count
  Value m = b.max(k(b, 10, q), b.unary(op::ceil, b.sub(k(b, 10, q), q)));
  Value too_many = b.compare(m, k(b, double(kLoopCap), q), Cmp::GT);
  m = b.select(b.binary(op::or_, too_many, is_nan(b, m)), k(b, 10, q), m);
  Value mmax = b.reduce(m, b.zeros(q.dtype(), {}), all, op::maximum);
  Value nx = b.neg(x);
  auto out = b.while_loop(
      {b.zeros(q.dtype(), {}), b.zeros(q.dtype(), s), mmax, q, nx, m},
      [](Builder& bb, const std::vector<Value>& v) -> V { return {bb.compare(v[0], v[2], Cmp::LT)}; },
      [s](Builder& bb, const std::vector<Value>& v) -> V {
        Value j = bb.broadcast_to(v[0], s);
        Value term = bb.binary(op::power, bb.add(v[3], j), v[4]);
        Value sum = bb.add(v[1], bb.select(bb.compare(j, v[5], Cmp::LT), term, bb.zeros(term.dtype(), s)));
        return {bb.add(v[0], bb.constant(1, v[0].dtype())), sum, v[2], v[3], v[4], v[5]};
      });
  // the tail from q + m >= 10 is below the type's range once x exceeds ~log10 of it (chlo.zeta gives NaN there)
  Value tail = chlo(b, "chlo.zeta", {x, b.add(q, m)});
  tail = b.select(b.compare(x, k(b, x.dtype() == DType::F64 ? 330 : 50, x), Cmp::GT), k(b, 0, x), tail);
  Value r = b.add(out[1], tail);
  Value inf = k(b, INFINITY, x), nan = nan_like(b, x);
  r = b.select(too_many, nan, r);
  Value qneg = b.compare(q, k(b, 0, q), Cmp::LE);
  r = b.select(b.binary(op::and_, qneg, b.compare(x, b.unary(op::floor, x), Cmp::NE)), nan, r);
  r = b.select(b.binary(op::and_, qneg, b.compare(q, b.unary(op::floor, q), Cmp::EQ)), inf, r);
  r = b.select(b.compare(x, k(b, 1, x), Cmp::LT), nan, r);
  return b.select(b.compare(x, k(b, 1, x), Cmp::EQ), inf, r);
}

// digamma(x) by chlo.digamma, except digamma(+-0) = -+inf (CPU: copysign(inf, -x))
Value digamma(Builder& b, Value x) {
  DType it = x.dtype() == DType::F64 ? DType::S64 : DType::S32;  // f32 or f64 here (unary_fn)
  Value neg0 = b.compare(b.bitcast(x, it), b.zeros(it, x.shape()), Cmp::LT);
  Value at0 = b.select(neg0, k(b, INFINITY, x), k(b, -INFINITY, x));
  return b.select(b.compare(x, k(b, 0, x), Cmp::EQ), at0, chlo(b, "chlo.digamma", {x}));
}

// trigamma(x) = psi'(x), as CPU computes it: below 1/2 by reflection,
// psi'(x) = pi^2 / sin^2(pi x) - psi'(1 - x); then six steps of psi'(x) = 1/x^2 + psi'(x + 1)
// and the asymptotic series (1 + 1/(2x) + 1/(6x^2) - 1/(30x^4) + 1/(42x^6)) / x
Value trigamma(Builder& b, Value x) {
  Value refl = b.compare(x, k(b, 0.5, x), Cmp::LT);
  Value s = b.unary(op::sine, b.mul(k(b, M_PI, x), x));
  Value r = b.select(refl, b.neg(b.div(k(b, M_PI * M_PI, x), b.mul(s, s))), k(b, 0, x));
  Value y = b.select(refl, b.sub(k(b, 1, x), x), x);
  for (int i = 0; i < 6; ++i) {
    r = b.add(r, b.div(k(b, 1, x), b.mul(y, y)));
    y = b.add(y, k(b, 1, x));
  }
  Value iyy = b.div(k(b, 1, x), b.mul(y, y));
  Value series = b.sub(k(b, 1.0 / 30, x), b.mul(iyy, k(b, 1.0 / 42, x)));
  series = b.sub(k(b, 1.0 / 6, x), b.mul(iyy, series));
  series = b.add(b.add(k(b, 1, x), b.div(k(b, 0.5, x), y)), b.mul(iyy, series));
  r = b.add(r, b.div(series, y));
  return b.select(refl, b.neg(r), r);
}

// erfcx(x) = exp(x^2) erfc(x): directly below 2, else the continued fraction
// erfc(x) exp(x^2) sqrt(pi) = 1 / (x + (1/2) / (x + 1 / (x + (3/2) / (x + ...)))) (48 levels)
Value erfcx(Builder& b, Value x) {
  Value direct = b.mul(b.unary(op::exponential, b.mul(x, x)), b.emit("chlo.erfc", {x}, x.type));
  Value xs = b.max(x, k(b, 2, x));
  Value f = xs;
  for (int i = 48; i >= 1; --i) f = b.add(xs, b.div(k(b, 0.5 * i, x), f));
  Value cf = b.div(k(b, 1.0 / std::sqrt(M_PI), x), f);
  return b.select(b.compare(x, k(b, 2, x), Cmp::LT), direct, cf);
}

// log_ndtr(x) = log(Phi(x)): t = x / sqrt 2; x < -1: log(erfcx(-t) / 2) - t^2, else log1p(-erfc(t) / 2)
Value log_ndtr_fn(Builder& b, Value x) {
  Value t = b.mul(x, k(b, M_SQRT1_2, x));
  Value lo = b.sub(b.unary(op::log, b.mul(erfcx(b, b.neg(t)), k(b, 0.5, x))), b.mul(t, t));
  Value hi = b.unary(op::log_plus_one, b.neg(b.mul(b.emit("chlo.erfc", {t}, t.type), k(b, 0.5, x))));
  return b.select(b.compare(x, k(b, -1, x), Cmp::LT), lo, hi);
}

// spherical j0(x) = sin(x) / x; a series below |x| = 0.5; 0 at +-inf
Value spherical_bessel_j0_fn(Builder& b, Value x) {
  Value x2 = b.mul(x, x);
  double c[] = {-1.0 / 6, 1.0 / 120, -1.0 / 5040, 1.0 / 362880, -1.0 / 39916800, 1.0 / 6227020800.0};
  Value s = k(b, c[5], x);
  for (int i = 4; i >= 0; --i) s = b.add(k(b, c[i], x), b.mul(x2, s));
  Value series = b.add(k(b, 1, x), b.mul(x2, s));
  Value safe = b.select(b.compare(b.unary(op::abs, x), k(b, 0.5, x), Cmp::LT), k(b, 1, x), x);
  Value direct = b.div(b.unary(op::sine, safe), safe);
  Value r = b.select(b.compare(b.unary(op::abs, x), k(b, 0.5, x), Cmp::LT), series, direct);
  return b.select(b.compare(b.unary(op::abs, x), k(b, INFINITY, x), Cmp::EQ), k(b, 0, x), r);  // j0(+-inf) = 0
}

// T/U/V/W_{k+1} = 2y p_k - p_{k-1}; p_1 = y, 2y, 2y - 1, 2y + 1
Value two_x(Builder& b, Value x, Value, Value p, Value q) { return b.sub(b.mul(b.add(x, x), p), q); }
Value shift(Builder& b, Value x) { return b.sub(b.add(x, x), k(b, 1, x)); }
Value chebyshev_t_p1(Builder& b, Value x) { return x; }
Value chebyshev_u_p1(Builder& b, Value x) { return b.add(x, x); }
Value chebyshev_v_p1(Builder& b, Value x) { return b.sub(b.add(x, x), k(b, 1, x)); }
Value chebyshev_w_p1(Builder& b, Value x) { return b.add(b.add(x, x), k(b, 1, x)); }

// the closed forms test the input x (shifted, CPU tests x == 1, x == 0); the recurrence runs on y = 2x - 1
Rule chebyshev(char kind, Fn1 p1, bool shifted) {
  return [kind, p1, shifted](Ctx& c) -> V {
    Poly P{p1, two_x,
           [kind, shifted](Builder& b, Value x, Value nn, Value odd) {
             return chebyshev_closed(b, kind, shifted, x, nn, odd);
           },
           [kind](Builder& b, Value y, Value nn, Value odd) { return chebyshev_beyond(b, kind, y, nn, odd); }};
    return {polynomial(c, P, shifted ? Fn1(shift) : Fn1())};
  };
}

// Hermite: NaN above n = 128 (f32) / 512 (f64), as on CPU
Value hermite(Ctx& c, Fn1 p1, Step next) {
  Poly P{p1, next, {}, {}, compute_type(c.odt()) == DType::F64 ? 512 : 128};
  return polynomial(c, P);
}

// H_{k+1} = 2x H_k - 2k H_{k-1};  He_{k+1} = x He_k - k He_{k-1}
V lower_special_hermite_polynomial_h(Ctx& c) {
  return {hermite(c, [](Builder& b, Value x) { return b.add(x, x); },
                  [](Builder& b, Value x, Value kk, Value p, Value q) {
                    return b.sub(b.mul(b.add(x, x), p), b.mul(b.add(kk, kk), q));
                  })};
}

V lower_special_hermite_polynomial_he(Ctx& c) {
  return {hermite(c, [](Builder& b, Value x) { return x; },
                  [](Builder& b, Value x, Value kk, Value p, Value q) { return b.sub(b.mul(x, p), b.mul(kk, q)); })};
}

// L_{k+1} = ((2k + (1 - x)) L_k - k L_{k-1}) / (k + 1); L_n(0) = 1
V lower_special_laguerre_polynomial_l(Ctx& c) {
  Poly P{[](Builder& b, Value x) { return b.sub(k(b, 1, x), x); },
         [](Builder& b, Value x, Value kk, Value p, Value q) {
           Value a = b.add(b.add(kk, kk), b.sub(k(b, 1, x), x));
           return b.div(b.sub(b.mul(a, p), b.mul(kk, q)), b.add(kk, k(b, 1, x)));
         },
         [](Builder& b, Value x, Value, Value) {
           return Cases{b.compare(x, k(b, 0, x), Cmp::EQ), k(b, 1, x)};
         }};
  return {polynomial(c, P)};
}

// P_{k+1} = ((2k + 1) x P_k - k P_{k-1}) / (k + 1); P_n(1) = 1, P_n(-1) = (-1)^n
V lower_special_legendre_polynomial_p(Ctx& c) {
  Poly P{[](Builder& b, Value x) { return x; },
         [](Builder& b, Value x, Value kk, Value p, Value q) {
           Value a = b.mul(b.add(b.add(kk, kk), k(b, 1, x)), x);
           return b.div(b.sub(b.mul(a, p), b.mul(kk, q)), b.add(kk, k(b, 1, x)));
         },
         [](Builder& b, Value x, Value, Value odd) {
           Value end = b.compare(b.unary(op::abs, x), k(b, 1, x), Cmp::EQ);
           Value v = b.select(b.binary(op::or_, b.compare(x, k(b, 0, x), Cmp::GT), b.unary(op::not_, odd)), k(b, 1, x),
                              k(b, -1, x));
           return Cases{end, v};
         }};
  return {polynomial(c, P)};
}

// entr(x) = x > 0 ? -x log x : x == 0 ? 0 : -inf (NaN stays NaN)
Value entr_fn(Builder& b, Value x) {
  Value zero = k(b, 0, x);
  Value r = b.select(b.compare(x, zero, Cmp::EQ), zero, k(b, -INFINITY, x));
  r = b.select(b.compare(x, zero, Cmp::GT), b.neg(b.mul(x, b.unary(op::log, x))), r);
  return b.select(b.compare(x, x, Cmp::NE), x, r);
}

// xlog1py(x, y) = isnan(y) ? NaN : x == 0 ? 0 : x * log1p(y)
Value xlog1py_fn(Builder& b, Value x, Value y) {
  Value r = b.select(b.compare(x, k(b, 0, x), Cmp::EQ), k(b, 0, x), b.mul(x, b.unary(op::log_plus_one, y)));
  return b.select(b.compare(y, y, Cmp::NE), y, r);
}

// one CHLO op each
Rule chlo_unary(const char* op) {
  return unary_fn([op](Builder& b, Value x) { return chlo(b, op, {x}); });
}

// ndtri(p) = sqrt(2) erfinv(2p - 1)
Value ndtri_fn(Builder& b, Value p) {
  Value y = b.sub(b.mul(k(b, 2, p), p), k(b, 1, p));
  return b.mul(k(b, M_SQRT2, p), chlo(b, "chlo.erf_inv", {y}));
}

// polygamma(n, x) = (-1)^(n+1) n! zeta(n + 1, x), n >= 2; digamma and trigamma for n = 0, 1
V lower_polygamma(Ctx& c) {
  Builder& b = c.b;
  DType t = compute_type(c.odt());
  Value x = c.in_out(1, t);
  int64_t n = c.int_(0);
  if (n == 0) return {b.convert(digamma(b, x), c.odt())};
  if (n == 1) return {b.convert(trigamma(b, x), c.odt())};
  Value z = hurwitz_zeta(b, k(b, double(n + 1), x), x);
  return {b.convert(b.mul(z, k(b, (n % 2 ? 1 : -1) * std::tgamma(double(n + 1)), x)), c.odt())};
}

// mvlgamma(x, p) = p (p - 1) / 4 log(pi) + sum_{j < p} lgamma(x - j / 2); as CPU's
// composite, the arguments x - j / 2 and the lgamma values are rounded to x's type
// (f16/bf16: near the poles that rounding decides the value)
V lower_mvlgamma(Ctx& c) {
  Builder& b = c.b;
  DType ot = c.odt(), t = compute_type(ot);
  Value x = c.in_out(0, t);
  int64_t p = c.int_(1);
  if (p < 1) throw UserError("p has to be greater than or equal to 1");  // CPU's check (not the Meta kernel's)
  auto round = [&](Value v) { return b.convert(b.convert(v, ot), t); };
  Value r = k(b, 0, x);
  for (int64_t j = 0; j < p; ++j) r = b.add(r, round(chlo(b, "chlo.lgamma", {round(b.sub(x, k(b, j / 2.0, x)))})));
  r = b.add(round(r), k(b, p * (p - 1) / 4.0 * std::log(M_PI), x));
  return {b.convert(r, ot)};
}
}  // namespace

void register_special() {
  const std::pair<const char*, Rule> rules[] = {
      // erfcx(x) = exp(x^2) erfc(x)
      {"aten::special_erfcx", unary_fn([](Builder& b, Value x) { return erfcx(b, x); })},
      {"aten::special_log_ndtr", unary_fn(log_ndtr_fn)},
      {"aten::special_spherical_bessel_j0", unary_fn(spherical_bessel_j0_fn)},
      // Chebyshev T/U/V/W (and shifted: x -> 2x - 1), Hermite H/He, Laguerre L, Legendre P
      {"aten::special_chebyshev_polynomial_t", chebyshev('t', chebyshev_t_p1, false)},
      {"aten::special_shifted_chebyshev_polynomial_t", chebyshev('t', chebyshev_t_p1, true)},
      {"aten::special_chebyshev_polynomial_u", chebyshev('u', chebyshev_u_p1, false)},
      {"aten::special_shifted_chebyshev_polynomial_u", chebyshev('u', chebyshev_u_p1, true)},
      {"aten::special_chebyshev_polynomial_v", chebyshev('v', chebyshev_v_p1, false)},
      {"aten::special_shifted_chebyshev_polynomial_v", chebyshev('v', chebyshev_v_p1, true)},
      {"aten::special_chebyshev_polynomial_w", chebyshev('w', chebyshev_w_p1, false)},
      {"aten::special_shifted_chebyshev_polynomial_w", chebyshev('w', chebyshev_w_p1, true)},
      {"aten::special_hermite_polynomial_h", lower_special_hermite_polynomial_h},
      {"aten::special_hermite_polynomial_he", lower_special_hermite_polynomial_he},
      {"aten::special_laguerre_polynomial_l", lower_special_laguerre_polynomial_l},
      {"aten::special_legendre_polynomial_p", lower_special_legendre_polynomial_p},
      {"aten::special_entr", unary_fn(entr_fn)},
      {"aten::special_xlog1py", binary_fn(xlog1py_fn)},
      {"aten::special_xlog1py.other_scalar", binary_fn(xlog1py_fn)},
      {"aten::special_xlog1py.self_scalar", binary_fn(xlog1py_fn)},
      // one CHLO op each
      {"aten::erfinv", chlo_unary("chlo.erf_inv")},
      {"aten::lgamma", chlo_unary("chlo.lgamma")},
      {"aten::special_i1e", chlo_unary("chlo.bessel_i1e")},
      {"aten::digamma", unary_fn(digamma)},
      {"aten::special_ndtri", unary_fn(ndtri_fn)},
      {"aten::polygamma", lower_polygamma},
      // zeta(x, q) = sum_k (k + q)^-x (Hurwitz)
      {"aten::special_zeta", binary_fn(hurwitz_zeta)},
      {"aten::special_zeta.other_scalar", binary_fn(hurwitz_zeta)},
      {"aten::special_zeta.self_scalar", binary_fn(hurwitz_zeta)},
      {"aten::mvlgamma", lower_mvlgamma},
      // modified Bessel functions of the first kind, orders 0 and 1
      {"aten::i0", unary_fn([](Builder& b, Value x) { return bessel_i(b, x, 0, false); })},
      {"aten::special_modified_bessel_i0", unary_fn([](Builder& b, Value x) { return bessel_i(b, x, 0, false); })},
      {"aten::special_i1", unary_fn([](Builder& b, Value x) { return bessel_i(b, x, 1, false); })},
      {"aten::special_modified_bessel_i1", unary_fn([](Builder& b, Value x) { return bessel_i(b, x, 1, false); })},
      {"aten::special_i0e", unary_fn([](Builder& b, Value x) { return bessel_i(b, x, 0, true); })},
  };
  for (auto& [name, rule] : rules) add_rule(name, rule);
}

}  // namespace tt::lower
