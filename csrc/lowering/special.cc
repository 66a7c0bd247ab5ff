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


// Orthogonal polynomials p_n(x) from their three-term recurrences
//   p_{k+1} = a_k(x) p_k - b_k p_{k-1}
// run on the device by a while loop up to the largest n (n is data); each
// element takes p at its own n (0 for n < 0).
using Step = std::function<Value(Builder&, Value x, Value k, Value p, Value q)>;  // p = p_k, q = p_{k-1}
Value recurrence(Ctx& c, const std::function<Value(Builder&, Value)>& p1, const Step& next,
                 const std::function<Value(Builder&, Value)>& prep = {}) {
  Builder& b = c.b;
  DType t = compute_type(c.odt());
  const Shape& s = c.oshape();
  Value x = c.in_out(0, t);
  if (prep) x = prep(b, x);
  Value n = b.broadcast_to(b.convert(c.arg(1).kind == Arg::Tensor ? c.in(1) : c.scalar(1, t), DType::S64), s);
  if (hlo::numel(s) == 0) return b.zeros(c.odt(), s);
  Value one = k(b, 1, x), first = p1(b, x);
  Value res = b.select(b.compare(n, b.zeros(DType::S64, s), Cmp::EQ), one,
                       b.select(b.compare(n, b.constant_int(1, DType::S64, s), Cmp::EQ), first, b.zeros(t, s)));
  std::vector<int64_t> all;
  for (int64_t i = 0; i < static_cast<int64_t>(s.size()); ++i) all.push_back(i);
  Value nmax = b.reduce(n, b.constant_int(1, DType::S64), all, "maximum");
  auto out = b.while_loop(
      {b.constant_int(1, DType::S64), one, first, res, nmax, x, n},
      [](Builder& bb, const std::vector<Value>& v) -> V { return {bb.compare(v[0], v[4], Cmp::LT)}; },
      [&next, s](Builder& bb, const std::vector<Value>& v) -> V {
        Value kv = v[0], xv = v[5], nv = v[6];
        Value p = next(bb, xv, bb.broadcast_to(bb.convert(kv, xv.dtype()), s), v[2], v[1]);
        Value k1 = bb.add(kv, bb.constant_int(1, DType::S64));
        Value hit = bb.compare(nv, bb.broadcast_to(k1, s), Cmp::EQ);
        return {k1, v[2], p, bb.select(hit, p, v[3]), v[4], xv, nv};
      });
  return b.convert(out[3], c.odt());
}

// erfcx(x) = exp(x^2) erfc(x): directly below 2, else the continued fraction
// erfc(x) exp(x^2) sqrt(pi) = 1 / (x + (1/2) / (x + 1 / (x + (3/2) / (x + ...)))) (48 levels)
Value erfcx(Builder& b, Value x) {
  Value direct = b.mul(b.unary("exponential", b.mul(x, x)), b.emit("chlo.erfc", {x}, x.type));
  Value xs = b.max(x, k(b, 2, x));
  Value f = xs;
  for (int i = 48; i >= 1; --i) f = b.add(xs, b.div(k(b, 0.5 * i, x), f));
  Value cf = b.div(k(b, 1.0 / std::sqrt(M_PI), x), f);
  return b.select(b.compare(x, k(b, 2, x), Cmp::LT), direct, cf);
}
}  // namespace

void register_special() {
  // erfcx(x) = exp(x^2) erfc(x)
  add_rule("aten::special_erfcx", unary_fn([](Builder& b, Value x) { return erfcx(b, x); }));
  // log_ndtr(x) = log(Phi(x)): t = x / sqrt 2; x < -1: log(erfcx(-t) / 2) - t^2, else log1p(-erfc(t) / 2)
  add_rule("aten::special_log_ndtr", unary_fn([](Builder& b, Value x) {
    Value t = b.mul(x, k(b, M_SQRT1_2, x));
    Value lo = b.sub(b.unary("log", b.mul(erfcx(b, b.neg(t)), k(b, 0.5, x))), b.mul(t, t));
    Value hi = b.unary("log_plus_one", b.neg(b.mul(b.emit("chlo.erfc", {t}, t.type), k(b, 0.5, x))));
    return b.select(b.compare(x, k(b, -1, x), Cmp::LT), lo, hi);
  }));
  // spherical j0(x) = sin(x) / x; a series below |x| = 0.5
  add_rule("aten::special_spherical_bessel_j0", unary_fn([](Builder& b, Value x) {
    Value x2 = b.mul(x, x);
    double c[] = {-1.0 / 6, 1.0 / 120, -1.0 / 5040, 1.0 / 362880, -1.0 / 39916800, 1.0 / 6227020800.0};
    Value s = k(b, c[5], x);
    for (int i = 4; i >= 0; --i) s = b.add(k(b, c[i], x), b.mul(x2, s));
    Value series = b.add(k(b, 1, x), b.mul(x2, s));
    Value safe = b.select(b.compare(b.unary("abs", x), k(b, 0.5, x), Cmp::LT), k(b, 1, x), x);
    Value direct = b.div(b.unary("sine", safe), safe);
    return b.select(b.compare(b.unary("abs", x), k(b, 0.5, x), Cmp::LT), series, direct);
  }));
  // Chebyshev T/U/V/W (and shifted: x -> 2x - 1), Hermite H/He, Laguerre L, Legendre P
  {
    auto two_x = [](Builder& b, Value x, Value, Value p, Value q) { return b.sub(b.mul(b.add(x, x), p), q); };
    auto shift = [](Builder& b, Value x) { return b.sub(b.add(x, x), k(b, 1, x)); };
    struct Cheb {
      const char* name;
      std::function<Value(Builder&, Value)> p1;
    };
    std::vector<Cheb> cheb = {
        {"t", [](Builder& b, Value x) { return x; }},
        {"u", [](Builder& b, Value x) { return b.add(x, x); }},
        {"v", [](Builder& b, Value x) { return b.sub(b.add(x, x), k(b, 1, x)); }},
        {"w", [](Builder& b, Value x) { return b.add(b.add(x, x), k(b, 1, x)); }},
    };
    for (auto& ch : cheb)
      for (bool shifted : {false, true}) {
        std::string n = std::string("aten::special_") + (shifted ? "shifted_" : "") + "chebyshev_polynomial_" + ch.name;
        auto p1 = ch.p1;
        add_rule(n, [p1, two_x, shift, shifted](Ctx& c) -> V {
          return {recurrence(c, p1, two_x, shifted ? std::function<Value(Builder&, Value)>(shift) : nullptr)};
        });
      }
    // H_{k+1} = 2x H_k - 2k H_{k-1};  He_{k+1} = x He_k - k He_{k-1}
    add_rule("aten::special_hermite_polynomial_h", [](Ctx& c) -> V {
      return {recurrence(c, [](Builder& b, Value x) { return b.add(x, x); },
                         [](Builder& b, Value x, Value kk, Value p, Value q) {
                           return b.sub(b.mul(b.add(x, x), p), b.mul(b.add(kk, kk), q));
                         })};
    });
    add_rule("aten::special_hermite_polynomial_he", [](Ctx& c) -> V {
      return {recurrence(c, [](Builder& b, Value x) { return x; },
                         [](Builder& b, Value x, Value kk, Value p, Value q) { return b.sub(b.mul(x, p), b.mul(kk, q)); })};
    });
    // L_{k+1} = ((2k + 1 - x) L_k - k L_{k-1}) / (k + 1)
    add_rule("aten::special_laguerre_polynomial_l", [](Ctx& c) -> V {
      return {recurrence(c, [](Builder& b, Value x) { return b.sub(k(b, 1, x), x); },
                         [](Builder& b, Value x, Value kk, Value p, Value q) {
                           Value a = b.sub(b.add(b.add(kk, kk), k(b, 1, x)), x);
                           return b.div(b.sub(b.mul(a, p), b.mul(kk, q)), b.add(kk, k(b, 1, x)));
                         })};
    });
    // P_{k+1} = ((2k + 1) x P_k - k P_{k-1}) / (k + 1)
    add_rule("aten::special_legendre_polynomial_p", [](Ctx& c) -> V {
      return {recurrence(c, [](Builder& b, Value x) { return x; },
                         [](Builder& b, Value x, Value kk, Value p, Value q) {
                           Value a = b.mul(b.add(b.add(kk, kk), k(b, 1, x)), x);
                           return b.div(b.sub(b.mul(a, p), b.mul(kk, q)), b.add(kk, k(b, 1, x)));
                         })};
    });
  }
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
