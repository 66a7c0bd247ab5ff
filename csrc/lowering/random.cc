// Random family: counter-based draws from the device generator's (seed, offset),
// bound as runtime parameters, so a new draw never recompiles and a seed
// reproduces the same numbers on every plugin.
#include "lowering/lowering.h"

namespace tt::lower {
namespace {
using V = std::vector<Value>;

// from + (to - from) * u
V uniform(Ctx& c) {
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
}  // namespace

void register_random() {
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
      Value r = b.add(lo, b.unary("floor", b.mul(u, b.sub(hi, lo))));
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
