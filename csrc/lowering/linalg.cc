// Linalg/matmul family. Every contraction goes through lower::matmul, which
// applies the matmul precision mode (see common.cc).
#include "lowering/lowering.h"

namespace tt::lower {
namespace {
using V = std::vector<Value>;

const hlo::DotDims kMM{{}, {}, {1}, {0}};          // [m,k] x [k,n]
const hlo::DotDims kBMM{{0}, {0}, {2}, {1}};       // [b,m,k] x [b,k,n]

// beta * self + alpha * prod (beta == 0 ignores self, NaNs included)
Value scale_add(Ctx& c, Value prod, size_t self_arg, size_t beta_arg, size_t alpha_arg) {
  Builder& b = c.b;
  DType t = c.odt();
  if (c.has(alpha_arg) && !c.num_is(alpha_arg, 1.0)) prod = b.mul(prod, c.in_out(alpha_arg, t));
  if (c.has(beta_arg) && c.num_is(beta_arg, 0.0)) return prod;
  Value self = c.in_out(self_arg, t);
  if (c.has(beta_arg) && !c.num_is(beta_arg, 1.0)) self = b.mul(self, c.in_out(beta_arg, t));
  return b.add(self, prod);
}
}  // namespace

void register_linalg() {
  // linalg_cross(a, b, dim): c_i = a_{i+1} b_{i+2} - a_{i+2} b_{i+1} (indices mod 3 along dim)
  add_rule("aten::linalg_cross", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = c.odt();
    Value x = c.in_out(0, t), y = c.in_out(1, t);
    int64_t d = wrap_dim(c.int_or(2, -1), x.rank());
    auto roll = [&](Value v, int64_t s) {  // v[(i + s) % 3]
      Shape lo(v.rank(), 0), hi = v.shape(), st(v.rank(), 1);
      hi[d] = s;
      Value head = b.slice(v, lo, hi, st);
      lo[d] = s;
      hi[d] = 3;
      return b.concatenate({b.slice(v, lo, hi, st), head}, d);
    };
    return {b.sub(b.mul(roll(x, 1), roll(y, 2)), b.mul(roll(x, 2), roll(y, 1)))};
  });
  add_rule("aten::mm", [](Ctx& c) -> V { return {matmul(c, c.in(0), c.in(1), kMM, c.odt())}; });
  add_rule("aten::bmm", [](Ctx& c) -> V { return {matmul(c, c.in(0), c.in(1), kBMM, c.odt())}; });
  add_rule("aten::dot", [](Ctx& c) -> V { return {matmul(c, c.in(0), c.in(1), {{}, {}, {0}, {0}}, c.odt())}; });
  add_rule("aten::vdot", [](Ctx& c) -> V { return {matmul(c, c.in(0), c.in(1), {{}, {}, {0}, {0}}, c.odt())}; });
  add_rule("aten::mv", [](Ctx& c) -> V { return {matmul(c, c.in(0), c.in(1), {{}, {}, {1}, {0}}, c.odt())}; });
  // addmm(self, m1, m2, beta, alpha) = beta self + alpha m1 @ m2
  add_rule("aten::addmm", [](Ctx& c) -> V {
    return {scale_add(c, matmul(c, c.in(1), c.in(2), kMM, c.odt()), 0, 3, 4)};
  });
  add_rule("aten::baddbmm", [](Ctx& c) -> V {
    return {scale_add(c, matmul(c, c.in(1), c.in(2), kBMM, c.odt()), 0, 3, 4)};
  });
  add_rule("aten::addmv", [](Ctx& c) -> V {
    return {scale_add(c, matmul(c, c.in(1), c.in(2), {{}, {}, {1}, {0}}, c.odt()), 0, 3, 4)};
  });
  // addbmm(self, b1, b2) = beta self + alpha sum_b b1[b] @ b2[b]
  add_rule("aten::addbmm", [](Ctx& c) -> V {
    Value p = matmul(c, c.in(1), c.in(2), {{}, {}, {0, 2}, {0, 1}}, c.odt());
    return {scale_add(c, p, 0, 3, 4)};
  });
  // outer product via a contraction-free dot: x[:, None] * y[None, :]
  add_rule("aten::outer", [](Ctx& c) -> V {
    Value x = c.in(0), y = c.in(1);
    Value x2 = c.b.reshape(x, {x.shape()[0], 1}), y2 = c.b.reshape(y, {1, y.shape()[0]});
    return {matmul(c, x2, y2, kMM, c.odt())};
  });
}

}  // namespace tt::lower
