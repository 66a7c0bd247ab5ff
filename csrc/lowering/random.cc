// Random family: counter-based draws from the device generator's (seed, offset),
// bound as runtime parameters, so a new draw never recompiles and a seed
// reproduces the same numbers on every plugin.
#include <cmath>
#include <functional>

#include "lowering/lowering.h"

namespace tt::lower {
namespace {
using V = std::vector<Value>;

// from + (to - from) * u
V uniform(Ctx& c) {
  if (c.has(1) && c.has(2) && c.arg(1).kind == Arg::Scalar && c.arg(2).kind == Arg::Scalar &&
      c.check_number(1) > c.check_number(2))  // a check only: the values stay runtime parameters
    throw UserError("uniform_ expects to return a [from, to) range, but found from > to");
  Builder& b = c.b;
  DType t = compute_type(c.odt());
  Value u = b.convert(uniform01(c, c.oshape()), t);
  Value lo = c.scalar_or(1, 0.0, t), hi = c.scalar_or(2, 1.0, t);
  Value r = b.add(b.broadcast_to(lo, u.shape()), b.mul(u, b.broadcast_to(b.sub(hi, lo), u.shape())));
  return {b.convert(r, c.odt())};
}

// mean + std * z
V normal(Ctx& c) {
  Builder& b = c.b;
  DType t = compute_type(c.odt());
  Value z = b.convert(normal01(c, c.oshape()), t);
  Value m = c.scalar_or(1, 0.0, t), s = c.scalar_or(2, 1.0, t);
  return {b.convert(b.add(b.broadcast_to(m, z.shape()), b.mul(z, b.broadcast_to(s, z.shape()))), c.odt())};
}

// Inverse-CDF draws: f(u, params) for u uniform in (0, 1] (1 - u01, so log(u) is finite).
Rule inverse_cdf(std::function<Value(Builder&, Value, Ctx&, DType)> f) {
  return [f](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_type(c.odt());
    Value u = b.convert(uniform01(c, c.oshape()), t);
    u = b.sub(b.constant(1, t, u.shape()), u);
    return {b.convert(f(b, u, c, t), c.odt())};
  };
}
Value param(Ctx& c, size_t i, double dflt, DType t, const Shape& s) {
  return c.b.broadcast_to(c.scalar_or(i, dflt, t), s);
}
}  // namespace

void register_random() {
  // exponential_(lambd) = -log(u) / lambd
  add_rule("aten::exponential_", inverse_cdf([](Builder& b, Value u, Ctx& c, DType t) {
    return b.div(b.neg(b.unary(op::log, u)), param(c, 1, 1.0, t, u.shape()));
  }));
  // cauchy_(median, sigma) = median + sigma tan(pi (u - 1/2))
  add_rule("aten::cauchy_", inverse_cdf([](Builder& b, Value u, Ctx& c, DType t) {
    Value half = b.constant(0.5, t, u.shape()), pi = b.constant(M_PI, t, u.shape());
    Value tan = b.unary(op::tan, b.mul(pi, b.sub(u, half)));
    return b.add(param(c, 1, 0.0, t, u.shape()), b.mul(param(c, 2, 1.0, t, u.shape()), tan));
  }));
  // log_normal_(mean, std) = exp(mean + std z)
  add_rule("aten::log_normal_", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_type(c.odt());
    Value z = b.convert(normal01(c, c.oshape()), t);
    Value y = b.add(param(c, 1, 1.0, t, z.shape()), b.mul(param(c, 2, 2.0, t, z.shape()), z));
    return {b.convert(b.unary(op::exponential, y), c.odt())};
  });
  // geometric_(p) = max(ceil(log(u) / log1p(-p)), 1) (trials up to the first success)
  add_rule("aten::geometric_", inverse_cdf([](Builder& b, Value u, Ctx& c, DType t) {
    Value l = b.unary(op::log_plus_one, b.neg(param(c, 1, 0.5, t, u.shape())));
    return b.max(b.unary(op::ceil, b.div(b.unary(op::log, u), l)), b.constant(1, t, u.shape()));
  }));
  add_rule("aten::uniform_", uniform);
  add_rule("aten::uniform", uniform);
  add_rule("aten::normal_", normal);
  add_rule("aten::normal_functional", normal);
  // random_(self, from, to): from + floor(u * (to - from)) (integers in [from, to))
  for (auto n : {"aten::random_.from", "aten::random.from"})
    add_rule(n, [](Ctx& c) -> V {
      Builder& b = c.b;
      if (!c.has(2)) throw Unsupported("random_ without an upper bound");
      const Shape& s = c.oshape();
      Value u = b.convert(uniform01(c, s), DType::F64);
      Value lo = b.broadcast_to(c.scalar(1, DType::F64), s), hi = b.broadcast_to(c.scalar(2, DType::F64), s);
      Value r = b.add(lo, b.unary(op::floor, b.mul(u, b.sub(hi, lo))));
      return {b.convert(r, c.odt())};
    });
  // bernoulli_(self, p): u < p
  add_rule("aten::bernoulli_.float", [](Ctx& c) -> V {
    Builder& b = c.b;
    Value u = uniform01(c, c.oshape());
    Value p = b.broadcast_to(c.scalar_or(1, 0.5, DType::F32), u.shape());
    return {b.convert(b.compare(u, p, hlo::Cmp::LT), c.odt())};
  });
  add_rule("aten::bernoulli.p", [](Ctx& c) -> V {
    Builder& b = c.b;
    Value u = uniform01(c, c.oshape());
    Value p = b.broadcast_to(c.scalar_or(1, 0.5, DType::F32), u.shape());
    return {b.convert(b.compare(u, p, hlo::Cmp::LT), c.odt())};
  });
  // bernoulli(probs): u < probs (elementwise)
  add_rule("aten::bernoulli", [](Ctx& c) -> V {
    Builder& b = c.b;
    Value u = uniform01(c, c.oshape());
    return {b.convert(b.compare(u, b.convert(c.in(0), DType::F32), hlo::Cmp::LT), c.odt())};
  });
}

}  // namespace tt::lower
