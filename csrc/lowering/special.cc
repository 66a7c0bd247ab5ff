// Special-function family: entr, xlog1py, the gamma family (lgamma, digamma,
// polygamma, mvlgamma, zeta), erfinv / ndtri and the modified Bessel functions
// i0 / i1 (plain and exponentially scaled). Where CHLO has the function the rule
// emits it (the plugin's CHLO legalization expands it); f16/bf16 compute in f32.
#include <cmath>

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
  s = b.mul(s, b.unary("exponential", b.neg(small)));
  Value big = b.max(a, k(b, 12, a)), inv = b.div(k(b, 1, a), big), as = k(b, 1, a);
  for (int i = 12; i >= 1; --i) {
    double ratio = ((2.0 * i - 1) * (2.0 * i - 1) - 4.0 * nu * nu) / (8.0 * i);
    as = b.add(k(b, 1, a), b.mul(as, b.mul(inv, k(b, ratio, a))));
  }
  as = b.mul(as, b.unary("rsqrt", b.mul(big, k(b, 2 * M_PI, a))));
  return b.select(b.compare(a, k(b, 12, a), Cmp::LT), s, as);
}
// I_nu(x) (scaled: I_nu(x) e^-|x|); I_1 is odd.
Value bessel_i(Builder& b, Value x, int nu, bool scaled) {
  Value a = b.unary("abs", x);
  Value r = bessel_ie(b, a, nu);
  if (!scaled) r = b.mul(r, b.unary("exponential", a));
  if (nu == 1) r = b.select(b.compare(x, k(b, 0, x), Cmp::LT), b.neg(r), r);
  return b.select(b.compare(x, x, Cmp::NE), x, r);
}

}  // namespace

void register_special() {
  // entr(x) = x > 0 ? -x log x : x == 0 ? 0 : -inf (NaN stays NaN)
  add_rule("aten::special_entr", unary_fn([](Builder& b, Value x) {
    Value zero = k(b, 0, x);
    Value r = b.select(b.compare(x, zero, Cmp::EQ), zero, k(b, -INFINITY, x));
    r = b.select(b.compare(x, zero, Cmp::GT), b.neg(b.mul(x, b.unary("log", x))), r);
    return b.select(b.compare(x, x, Cmp::NE), x, r);
  }));
  // xlog1py(x, y) = isnan(y) ? NaN : x == 0 ? 0 : x * log1p(y)
  for (auto n : {"aten::special_xlog1py", "aten::special_xlog1py.other_scalar", "aten::special_xlog1py.self_scalar"})
    add_rule(n, binary_fn([](Builder& b, Value x, Value y) {
      Value r = b.select(b.compare(x, k(b, 0, x), Cmp::EQ), k(b, 0, x), b.mul(x, b.unary("log_plus_one", y)));
      return b.select(b.compare(y, y, Cmp::NE), y, r);
    }));
  // one CHLO op each
  const std::pair<const char*, const char*> direct[] = {{"aten::erfinv", "chlo.erf_inv"},
                                                        {"aten::lgamma", "chlo.lgamma"},
                                                        {"aten::digamma", "chlo.digamma"},
                                                        {"aten::special_i1e", "chlo.bessel_i1e"}};
  for (auto& [n, op] : direct)
    add_rule(n, unary_fn([op = op](Builder& b, Value x) { return chlo(b, op, {x}); }));
  // ndtri(p) = sqrt(2) erfinv(2p - 1)
  add_rule("aten::special_ndtri", unary_fn([](Builder& b, Value p) {
    Value y = b.sub(b.mul(k(b, 2, p), p), k(b, 1, p));
    return b.mul(k(b, M_SQRT2, p), chlo(b, "chlo.erf_inv", {y}));
  }));
  // polygamma(n, x) = (-1)^(n+1) n! zeta(n + 1, x), n >= 1. The first 16 terms
  // of zeta's series are summed here: chlo.zeta starts its Euler-Maclaurin tail
  // at q + 9, too early for negative q (where the series still converges).
  add_rule("aten::polygamma", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_type(c.odt());
    Value x = c.in_out(1, t);
    int64_t n = c.int_(0);
    if (n == 0) return {b.convert(chlo(b, "chlo.digamma", {x}), c.odt())};
    const int shift = 16;
    Value s = chlo(b, "chlo.zeta", {k(b, double(n + 1), x), b.add(x, k(b, shift, x))});
    for (int j = 0; j < shift; ++j) {
      Value r = b.div(k(b, 1, x), b.add(x, k(b, j, x))), p = r;
      for (int64_t e = 1; e <= n; ++e) p = b.mul(p, r);  // (x + j)^-(n+1), any sign
      s = b.add(s, p);
    }
    return {b.convert(b.mul(s, k(b, (n % 2 ? 1 : -1) * std::tgamma(double(n + 1)), x)), c.odt())};
  });
  // zeta(x, q) = sum_k (k + q)^-x (Hurwitz)
  for (auto n : {"aten::special_zeta", "aten::special_zeta.other_scalar", "aten::special_zeta.self_scalar"})
    add_rule(n, binary_fn([](Builder& b, Value x, Value q) { return chlo(b, "chlo.zeta", {x, q}); }));
  // mvlgamma(x, p) = p (p - 1) / 4 log(pi) + sum_{j < p} lgamma(x - j / 2)
  add_rule("aten::mvlgamma", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_type(c.odt());
    Value x = c.in_out(0, t);
    int64_t p = c.int_(1);
    Value r = k(b, p * (p - 1) / 4.0 * std::log(M_PI), x);
    for (int64_t j = 0; j < p; ++j) r = b.add(r, chlo(b, "chlo.lgamma", {b.sub(x, k(b, j / 2.0, x))}));
    return {b.convert(r, c.odt())};
  });
  // modified Bessel functions of the first kind, orders 0 and 1
  for (auto n : {"aten::i0", "aten::special_modified_bessel_i0"})
    add_rule(n, unary_fn([](Builder& b, Value x) { return bessel_i(b, x, 0, false); }));
  for (auto n : {"aten::special_i1", "aten::special_modified_bessel_i1"})
    add_rule(n, unary_fn([](Builder& b, Value x) { return bessel_i(b, x, 1, false); }));
  add_rule("aten::special_i0e", unary_fn([](Builder& b, Value x) { return bessel_i(b, x, 0, true); }));
}

}  // namespace tt::lower
