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

// ---- triangular factorizations (stablehlo.cholesky / stablehlo.triangular_solve)
Value mT(Builder& b, Value x) {
  std::vector<int64_t> p;
  for (int64_t i = 0; i < x.rank(); ++i) p.push_back(i);
  std::swap(p[x.rank() - 1], p[x.rank() - 2]);
  return b.transpose(x, p);
}

// x where the (row, col) position is in the lower (or upper) triangle incl. the diagonal, else 0
Value keep_triangle(Builder& b, Value x, bool lower) {
  int64_t r = x.rank();
  Value row = b.iota(DType::S64, x.shape(), r - 2), col = b.iota(DType::S64, x.shape(), r - 1);
  Value in = b.compare(col, row, lower ? hlo::Cmp::LE : hlo::Cmp::GE);
  return b.select(in, x, b.zeros(x.dtype(), x.shape()));
}

// x broadcast to batch dims `batch` (its own last two dims kept)
Value to_batch(Builder& b, Value x, const Shape& batch) {
  Shape s = batch;
  s.push_back(x.shape()[x.rank() - 2]);
  s.push_back(x.shape()[x.rank() - 1]);
  return b.broadcast_to(x, s);
}

// lower Cholesky factor of symmetric positive-definite a (lower triangle used)
Value cholesky_lower(Builder& b, Value a) {
  return keep_triangle(b, b.emit("cholesky", {a}, a.type, "lower = true"), true);
}

// solves op(a) x = y (left) or x op(a) = y (right) for triangular a; batch dims must match
Value tri_solve(Builder& b, Value a, Value y, bool left, bool lower, bool unit, bool transpose_a) {
  std::string attrs = std::string("left_side = ") + (left ? "true" : "false") + ", lower = " + (lower ? "true" : "false") +
                      ", unit_diagonal = " + (unit ? "true" : "false") + ", transpose_a = #stablehlo<transpose " +
                      (transpose_a ? "TRANSPOSE" : "NO_TRANSPOSE") + ">";
  return b.emit("triangular_solve", {a, y}, y.type, attrs);
}

Shape batch_of(const Shape& out) { return Shape(out.begin(), out.end() - 2); }
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
  // linalg_cholesky_ex(a, upper, check) -> (L with a = L L^T (or U^T U), info: 0, or the first
  // failing order where the factor is not finite)
  add_rule("aten::linalg_cholesky_ex", [](Ctx& c) -> V {
    Builder& b = c.b;
    Value a = b.convert(c.in(0), c.odt(0));
    if (hlo::numel(a.shape()) == 0) return {a, b.zeros(c.odt(1), c.oshape(1))};
    Value l = cholesky_lower(b, a);
    int64_t n = a.shape().back(), r = a.rank();
    Value eye = b.compare(b.iota(DType::S64, a.shape(), r - 2), b.iota(DType::S64, a.shape(), r - 1), hlo::Cmp::EQ);
    Value diag = b.reduce(b.select(eye, l, b.zeros(l.dtype(), l.shape())), b.zeros(l.dtype(), {}), {r - 1}, "add");
    Value ok = b.emit("is_finite", {diag}, Type{DType::Pred, diag.shape()});
    // first non-finite position + 1 (n + 1 stands for none)
    Value pos = b.add(b.iota(DType::S32, diag.shape(), r - 2), b.constant_int(1, DType::S32, diag.shape()));
    Value cand = b.select(ok, b.constant_int(n + 1, DType::S32, diag.shape()), pos);
    Value first = b.reduce(cand, b.constant_int(n + 1, DType::S32), {r - 2}, "minimum");
    Value info = b.select(b.compare(first, b.constant_int(n + 1, DType::S32, first.shape()), hlo::Cmp::EQ),
                          b.zeros(DType::S32, first.shape()), first);
    return {c.flag_or(1, false) ? mT(b, l) : l, b.convert(info, c.odt(1))};
  });
  add_rule("aten::cholesky", [](Ctx& c) -> V {
    Builder& b = c.b;
    Value a = b.convert(c.in(0), c.odt());
    if (hlo::numel(a.shape()) == 0) return {a};
    Value l = cholesky_lower(b, a);
    return {c.flag_or(1, false) ? mT(b, l) : l};
  });
  // linalg_solve_triangular(a, y, upper, left, unit) = x with a x = y (left) or x a = y
  add_rule("aten::linalg_solve_triangular", [](Ctx& c) -> V {
    Builder& b = c.b;
    Shape batch = batch_of(c.oshape());
    Value a = to_batch(b, b.convert(c.in(0), c.odt()), batch), y = to_batch(b, b.convert(c.in(1), c.odt()), batch);
    if (hlo::numel(c.oshape()) == 0) return {b.zeros(c.odt(), c.oshape())};
    bool upper = c.flag(2), left = c.flag_or(3, true), unit = c.flag_or(4, false);
    a = keep_triangle(b, a, !upper);
    return {tri_solve(b, a, y, left, !upper, unit, false)};
  });
  // triangular_solve(y, a, upper, transpose, unit) -> (x with op(a) x = y, a)
  add_rule("aten::triangular_solve", [](Ctx& c) -> V {
    Builder& b = c.b;
    Shape batch = batch_of(c.oshape(0));
    Value y = to_batch(b, b.convert(c.in(0), c.odt(0)), batch), a = to_batch(b, b.convert(c.in(1), c.odt(0)), batch);
    if (hlo::numel(c.oshape(0)) == 0) return {b.zeros(c.odt(0), c.oshape(0)), b.broadcast_to(a, c.oshape(1))};
    bool upper = c.flag_or(2, true), trans = c.flag_or(3, false), unit = c.flag_or(4, false);
    Value x = tri_solve(b, keep_triangle(b, a, !upper), y, true, !upper, unit, trans);
    return {x, b.broadcast_to(a, c.oshape(1))};
  });
  // _cholesky_solve_helper(y, L, upper) = x with L L^T x = y (U^T U x = y when upper)
  add_rule("aten::_cholesky_solve_helper", [](Ctx& c) -> V {
    Builder& b = c.b;
    Shape batch = batch_of(c.oshape());
    Value y = to_batch(b, b.convert(c.in(0), c.odt()), batch), l = to_batch(b, b.convert(c.in(1), c.odt()), batch);
    if (hlo::numel(c.oshape()) == 0) return {b.zeros(c.odt(), c.oshape())};
    bool upper = c.flag_or(2, false);
    if (upper) l = mT(b, l);
    l = keep_triangle(b, l, true);
    Value z = tri_solve(b, l, y, true, true, false, false);
    return {tri_solve(b, l, z, true, true, false, true)};
  });
  // cholesky_inverse(L, upper) = (L L^T)^-1 (or (U^T U)^-1)
  add_rule("aten::cholesky_inverse", [](Ctx& c) -> V {
    Builder& b = c.b;
    Value l = b.convert(c.in(0), c.odt());
    if (hlo::numel(l.shape()) == 0) return {l};
    if (c.flag_or(1, false)) l = mT(b, l);
    l = keep_triangle(b, l, true);
    int64_t r = l.rank();
    Value eye = b.convert(b.compare(b.iota(DType::S64, l.shape(), r - 2), b.iota(DType::S64, l.shape(), r - 1),
                                    hlo::Cmp::EQ), l.dtype());
    Value z = tri_solve(b, l, eye, true, true, false, false);
    return {tri_solve(b, l, z, true, true, false, true)};
  });
  // outer product via a contraction-free dot: x[:, None] * y[None, :]
  add_rule("aten::outer", [](Ctx& c) -> V {
    Value x = c.in(0), y = c.in(1);
    Value x2 = c.b.reshape(x, {x.shape()[0], 1}), y2 = c.b.reshape(y, {1, y.shape()[0]});
    return {matmul(c, x2, y2, kMM, c.odt())};
  });
}

}  // namespace tt::lower
