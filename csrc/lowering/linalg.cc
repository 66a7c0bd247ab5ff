// Linalg/matmul family. Every contraction goes through lower::matmul, which
// applies the matmul precision mode (see common.cc).
#include <algorithm>

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

// LAPACK potrf's info for each matrix of a (lower triangle used) given its factor l:
// 0 where l's diagonal is finite and positive, else the first order j whose pivot
// a_jj - sum_k l_jk^2 is not positive, found by the unblocked factorization (a loop of
// n rank-1 updates that runs only when some matrix failed). S32, a's batch shape.
Value cholesky_info(Builder& b, Value a, Value l) {
  int64_t n = a.shape().back(), r = a.rank();
  const Shape& s = a.shape();
  Shape batch(s.begin(), s.end() - 2);
  std::vector<int64_t> last2{r - 2, r - 1}, all;
  for (int64_t i = 0; i < r - 2; ++i) all.push_back(i);
  DType t = a.dtype();
  Value row = b.iota(DType::S64, s, r - 2), col = b.iota(DType::S64, s, r - 1);
  Value zero = b.zeros(t, s);
  Value diag = b.reduce(b.select(b.compare(row, col, hlo::Cmp::EQ), l, zero), b.zeros(t, {}), {r - 1}, op::add);
  Value good = b.binary(op::and_, b.emit("is_finite", {diag}, Type{DType::Pred, diag.shape()}),
                        b.compare(diag, b.zeros(t, diag.shape()), hlo::Cmp::GT));
  Value failed = b.unary(op::not_, b.reduce(good, b.constant_int(1, DType::Pred), {r - 2}, op::and_));  // per matrix
  Value lower = keep_triangle(b, a, true);
  Value strict = b.select(b.compare(col, row, hlo::Cmp::LT), lower, zero);
  Value sym = b.add(lower, mT(b, strict));
  auto any = [&](Builder& bb, Value p) { return all.empty() ? p : bb.reduce(p, bb.constant_int(0, DType::Pred), all, op::or_); };
  Value info0 = b.zeros(DType::S32, batch);
  // carried: j, the trailing matrix, info, more
  auto out = b.while_loop(
      {b.constant_int(0, DType::S64), sym, info0, any(b, failed), failed},
      [n](Builder& bb, const std::vector<Value>& v) -> std::vector<Value> {
        return {bb.binary(op::and_, bb.compare(v[0], bb.constant_int(n, DType::S64), hlo::Cmp::LT), v[3])};
      },
      [&](Builder& bb, const std::vector<Value>& v) -> std::vector<Value> {
        Value j = bb.broadcast_to(v[0], s), m = v[1], info = v[2], fail = v[4];
        Value at_col = bb.compare(col, j, hlo::Cmp::EQ);
        Value pivot = bb.reduce(bb.select(bb.binary(op::and_, bb.compare(row, j, hlo::Cmp::EQ), at_col), m, zero),
                                bb.zeros(t, {}), last2, op::add);
        Value open = bb.binary(op::and_, fail, bb.compare(info, bb.zeros(DType::S32, batch), hlo::Cmp::EQ));
        Value bad = bb.unary(op::not_, bb.compare(pivot, bb.zeros(t, batch), hlo::Cmp::GT));
        Value jj = bb.broadcast_to(bb.convert(bb.add(v[0], bb.constant_int(1, DType::S64)), DType::S32), batch);
        info = bb.select(bb.binary(op::and_, open, bad), jj, info);
        // column j below the pivot, scaled: the rank-1 update of the trailing matrix
        Shape cs = batch;
        cs.push_back(n);
        Value cj = bb.reduce(bb.select(at_col, m, zero), bb.zeros(t, {}), {r - 1}, op::add);
        Value below = bb.compare(bb.iota(DType::S64, cs, r - 2), bb.broadcast_to(v[0], cs), hlo::Cmp::GT);
        Value sp = bb.broadcast_in_dim(bb.unary(op::sqrt, pivot), cs, all);
        Value lj = bb.select(below, bb.div(cj, sp), bb.zeros(t, cs));
        std::vector<int64_t> rows = all, cols = all;
        rows.push_back(r - 2);
        cols.push_back(r - 1);
        m = bb.sub(m, bb.mul(bb.broadcast_in_dim(lj, s, rows), bb.broadcast_in_dim(lj, s, cols)));
        Value more = any(bb, bb.binary(op::and_, fail, bb.compare(info, bb.zeros(DType::S32, batch), hlo::Cmp::EQ)));
        return {bb.add(v[0], bb.constant_int(1, DType::S64)), m, info, more, fail};
      });
  return out[2];
}

// solves op(a) x = y (left) or x op(a) = y (right) for triangular a; batch dims must match
Value tri_solve(Builder& b, Value a, Value y, bool left, bool lower, bool unit, bool transpose_a) {
  std::string attrs = std::string("left_side = ") + (left ? "true" : "false") + ", lower = " + (lower ? "true" : "false") +
                      ", unit_diagonal = " + (unit ? "true" : "false") + ", transpose_a = #stablehlo<transpose " +
                      (transpose_a ? "TRANSPOSE" : "NO_TRANSPOSE") + ">";
  return b.emit("triangular_solve", {a, y}, y.type, attrs);
}

Shape batch_of(const Shape& out) { return Shape(out.begin(), out.end() - 2); }

// PyTorch's det/slogdet factor A^T when A is contiguous and real (their
// backward formulas expect that factorization), A otherwise.
bool transposed(const Ctx& c, Value a) { return c.arg(0).contiguous && !hlo::is_complex(a.dtype()); }
Value factored(const Ctx& c, Value a) { return transposed(c, a) ? mT(c.b, a) : a; }

// ---- LU with partial pivoting, unrolled over the (static) columns
constexpr int64_t kMaxUnrolledLU = 128;

struct LU {
  Value lu;                 // [.., m, n]: unit-lower L below the diagonal, U on and above
  Value perm;               // [.., m] int64: row i of L U is row perm[i] of A
  std::vector<Value> piv;   // per step k: the row swapped with k (int64, [..])
  Value info;               // [..] int32: first k + 1 with a zero pivot, or 0
};

Value slice_last2(Builder& b, Value x, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  int64_t r = x.rank();
  Shape st(r, 0), lim = x.shape(), one(r, 1);
  st[r - 2] = r0;
  lim[r - 2] = r1;
  st[r - 1] = c0;
  lim[r - 1] = c1;
  return b.slice(x, st, lim, one);
}

// the permutation (row order) that the swap sequence `piv` (int64 [.., k]) applies to m rows
Value perm_from_swaps(Builder& b, const std::vector<Value>& piv, const Shape& batch, int64_t m) {
  Shape ps = batch;
  ps.push_back(m);
  int64_t r = static_cast<int64_t>(ps.size());
  Value perm = b.iota(DType::S64, ps, r - 1);
  for (size_t k = 0; k < piv.size(); ++k) {
    Value kk = b.constant_int(static_cast<int64_t>(k), DType::S64, ps);
    Value p = b.broadcast_in_dim(piv[k], ps, [&] {
      std::vector<int64_t> d;
      for (int64_t i = 0; i < r - 1; ++i) d.push_back(i);
      return d;
    }());
    Value rows = b.iota(DType::S64, ps, r - 1);
    Value src = b.select(b.compare(rows, kk, hlo::Cmp::EQ), p, b.select(b.compare(rows, p, hlo::Cmp::EQ), kk, rows));
    perm = b.take_along(perm, src, r - 1);
  }
  return perm;
}

LU lu_factor(Builder& b, Value a, bool pivot) {
  int64_t r = a.rank(), m = a.shape()[r - 2], n = a.shape()[r - 1], kn = std::min(m, n);
  if (kn > kMaxUnrolledLU) throw Unsupported("LU of matrices larger than 128 (unrolled on tpu)");
  Shape batch(a.shape().begin(), a.shape().end() - 2);
  std::vector<int64_t> bdims;
  for (int64_t i = 0; i < r - 2; ++i) bdims.push_back(i);
  Shape vs = batch;
  vs.push_back(m);
  DType t = a.dtype();
  LU out;
  Value info = b.zeros(DType::S32, batch);
  Value rows_m = b.iota(DType::S64, a.shape(), r - 2), cols_m = b.iota(DType::S64, a.shape(), r - 1);
  for (int64_t k = 0; k < kn; ++k) {
    Value p;
    if (pivot) {
      Value col = b.reshape(slice_last2(b, a, 0, m, k, k + 1), vs);
      Value below = b.compare(b.iota(DType::S64, vs, r - 2), b.constant_int(k, DType::S64, vs), hlo::Cmp::GE);
      Value mag = b.select(below, b.unary(op::abs, col), b.broadcast_to(b.constant(-1, t), vs));
      p = b.reduce_arg(mag, r - 2, true).second;  // [..]
      // swap rows k and p
      Shape ms = a.shape();
      Value pb = b.broadcast_in_dim(p, ms, bdims);
      Value kk = b.constant_int(k, DType::S64, ms);
      Value src = b.select(b.compare(rows_m, kk, hlo::Cmp::EQ), pb,
                           b.select(b.compare(rows_m, pb, hlo::Cmp::EQ), kk, rows_m));
      a = b.take_along(a, src, r - 2);
    } else {
      p = b.constant_int(k, DType::S64, batch);
    }
    out.piv.push_back(p);
    Value pv = b.reshape(slice_last2(b, a, k, k + 1, k, k + 1), batch);  // pivot a[k, k]
    Value zero = b.compare(pv, b.zeros(t, batch), hlo::Cmp::EQ);
    info = b.select(b.binary(op::and_, zero, b.compare(info, b.zeros(DType::S32, batch), hlo::Cmp::EQ)),
                    b.constant_int(k + 1, DType::S32, batch), info);
    // multipliers l[i] = a[i, k] / pivot (rows below k), then a[i, j] -= l[i] a[k, j] (j > k)
    Value colk = b.broadcast_in_dim(b.reshape(slice_last2(b, a, 0, m, k, k + 1), vs), a.shape(), [&] {
      std::vector<int64_t> d = bdims;
      d.push_back(r - 2);
      return d;
    }());
    Value rowk = b.broadcast_in_dim(b.reshape(slice_last2(b, a, k, k + 1, 0, n), [&] {
      Shape s = batch;
      s.push_back(n);
      return s;
    }()), a.shape(), [&] {
      std::vector<int64_t> d = bdims;
      d.push_back(r - 1);
      return d;
    }());
    Value l = b.div(colk, b.broadcast_in_dim(pv, a.shape(), bdims));
    Value below = b.compare(rows_m, b.constant_int(k, DType::S64, a.shape()), hlo::Cmp::GT);
    Value right = b.compare(cols_m, b.constant_int(k, DType::S64, a.shape()), hlo::Cmp::GT);
    Value atk = b.compare(cols_m, b.constant_int(k, DType::S64, a.shape()), hlo::Cmp::EQ);
    Value upd = b.sub(a, b.mul(l, rowk));
    a = b.select(b.binary(op::and_, below, right), upd, b.select(b.binary(op::and_, below, atk), l, a));
  }
  out.lu = a;
  out.perm = perm_from_swaps(b, out.piv, batch, m);
  out.info = info;
  return out;
}

Value stack_pivots(Builder& b, const std::vector<Value>& piv, const Shape& batch, DType t) {
  std::vector<Value> cols;
  Shape one = batch;
  one.push_back(1);
  for (auto& p : piv) cols.push_back(b.reshape(b.add(p, b.constant_int(1, DType::S64, p.shape())), one));
  return b.convert(b.concatenate(cols, static_cast<int64_t>(batch.size())), t);
}

// x[.., perm[i], :] for each row i (rows permuted), or the inverse when `inverse`
Value permute_rows(Builder& b, Value x, Value perm, bool inverse) {
  int64_t r = x.rank();
  Shape ps = perm.shape();
  if (inverse) {  // inv[perm[i]] = i
    int64_t m = ps.back();
    Value idx = b.iota(DType::S64, ps, static_cast<int64_t>(ps.size()) - 1);
    // scatter i at perm[i] per batch: with a one-hot comparison (m is small)
    Shape sq = ps;
    sq.push_back(m);
    int64_t q = static_cast<int64_t>(sq.size());
    std::vector<int64_t> d;
    for (int64_t i = 0; i < q - 1; ++i) d.push_back(i);
    Value hit = b.compare(b.broadcast_in_dim(perm, sq, d), b.iota(DType::S64, sq, q - 1), hlo::Cmp::EQ);
    Value vals = b.broadcast_in_dim(idx, sq, d);
    perm = b.reduce(b.select(hit, vals, b.zeros(DType::S64, sq)), b.constant_int(0, DType::S64), {q - 2}, op::add);
  }
  Shape full = x.shape();
  std::vector<int64_t> d;
  for (int64_t i = 0; i < r - 1; ++i) d.push_back(i);
  return b.take_along(x, b.broadcast_in_dim(perm, full, d), r - 2);
}

// unit-lower L [.., m, k] and upper U [.., k, n] of an LU matrix
std::pair<Value, Value> lu_parts(Builder& b, Value lu) {
  int64_t r = lu.rank(), m = lu.shape()[r - 2], n = lu.shape()[r - 1], k = std::min(m, n);
  Value l = slice_last2(b, lu, 0, m, 0, k), u = slice_last2(b, lu, 0, k, 0, n);
  Value lr = b.iota(DType::S64, l.shape(), r - 2), lc = b.iota(DType::S64, l.shape(), r - 1);
  l = b.select(b.compare(lr, lc, hlo::Cmp::GT), l,
               b.select(b.compare(lr, lc, hlo::Cmp::EQ), b.constant(1, l.dtype(), l.shape()), b.zeros(l.dtype(), l.shape())));
  return {l, keep_triangle(b, u, false)};
}

// permutation matrix P [.., m, m] with P[perm[i], i] = 1
Value perm_matrix(Builder& b, Value perm, DType t) {
  Shape ps = perm.shape();
  int64_t m = ps.back(), q = static_cast<int64_t>(ps.size());
  Shape s = ps;
  s.push_back(m);  // [.., i(row of P), j]: P[r, j] = (perm[j] == r)
  std::vector<int64_t> d;
  for (int64_t i = 0; i < q - 1; ++i) d.push_back(i);
  d.push_back(q);
  Value pj = b.broadcast_in_dim(perm, s, d);
  return b.convert(b.compare(pj, b.iota(DType::S64, s, q - 1), hlo::Cmp::EQ), t);
}

// solves A X = B given A's LU (left), or A^T X = B (adjoint); B: [.., n, k]
Value lu_solve(Builder& b, Value lu, Value perm, Value rhs, bool adjoint) {
  auto [l, u] = lu_parts(b, lu);
  if (!adjoint) {
    Value y = tri_solve(b, l, permute_rows(b, rhs, perm, false), true, true, true, false);
    return tri_solve(b, u, y, true, false, false, false);
  }
  Value z = tri_solve(b, u, rhs, true, false, false, true);
  Value w = tri_solve(b, l, z, true, true, true, true);
  return permute_rows(b, w, perm, true);
}

Value diag_of(Builder& b, Value x) {
  int64_t r = x.rank();
  Value eye = b.compare(b.iota(DType::S64, x.shape(), r - 2), b.iota(DType::S64, x.shape(), r - 1), hlo::Cmp::EQ);
  return b.reduce(b.select(eye, x, b.zeros(x.dtype(), x.shape())), b.zeros(x.dtype(), {}), {r - 1}, op::add);
}

// (-1)^(number of real swaps)
Value perm_sign(Builder& b, const std::vector<Value>& piv, const Shape& batch, DType t) {
  Value sign = b.constant(1, t, batch);
  for (size_t k = 0; k < piv.size(); ++k) {
    Value swapped = b.compare(piv[k], b.constant_int(static_cast<int64_t>(k), DType::S64, batch), hlo::Cmp::NE);
    sign = b.select(swapped, b.neg(sign), sign);
  }
  return sign;
}

// ---- rule bodies (registered in register_linalg below)

// linalg_cross(a, b, dim): c_i = a_{i+1} b_{i+2} - a_{i+2} b_{i+1} (indices mod 3 along dim)
V lower_linalg_cross(Ctx& c) {
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
}

// addmm(self, m1, m2, beta, alpha) = beta self + alpha m1 @ m2
V lower_addmm(Ctx& c) {
  return {scale_add(c, matmul(c, c.in(1), c.in(2), kMM, c.odt()), 0, 3, 4)};
}

V lower_baddbmm(Ctx& c) {
  return {scale_add(c, matmul(c, c.in(1), c.in(2), kBMM, c.odt()), 0, 3, 4)};
}

V lower_addmv(Ctx& c) {
  return {scale_add(c, matmul(c, c.in(1), c.in(2), {{}, {}, {1}, {0}}, c.odt()), 0, 3, 4)};
}

// addbmm(self, b1, b2) = beta self + alpha sum_b b1[b] @ b2[b]
V lower_addbmm(Ctx& c) {
  Value p = matmul(c, c.in(1), c.in(2), {{}, {}, {0, 2}, {0, 1}}, c.odt());
  return {scale_add(c, p, 0, 3, 4)};
}

// The factorizations below (Cholesky, triangular solves, LU and what is built on
// it) are written for real matrices: complex ones run on the CPU fallback.
Rule real_rule(Rule r) {
  return [r](Ctx& c) -> V {
    for (size_t i = 0; i < c.nargs(); ++i)
      if (c.arg(i).kind == Arg::Tensor && c.has(i) && hlo::is_complex(c.in(i).dtype()))
        throw Unsupported("complex matrices in a factorization");
    return r(c);
  };
}

// linalg_cholesky_ex(a, upper, check) -> (L with a = L L^T (or U^T U), info: 0, or LAPACK's
// order of the first leading minor that is not positive-definite)
V lower_linalg_cholesky_ex(Ctx& c) {
  Builder& b = c.b;
  Value a = b.convert(c.in(0), c.odt(0));
  if (hlo::numel(a.shape()) == 0) return {a, b.zeros(c.odt(1), c.oshape(1))};
  Value l = cholesky_lower(b, a);
  return {c.flag_or(1, false) ? mT(b, l) : l, b.convert(cholesky_info(b, a, l), c.odt(1))};
}

// linalg_solve_triangular(a, y, upper, left, unit) = x with a x = y (left) or x a = y
V lower_linalg_solve_triangular(Ctx& c) {
  Builder& b = c.b;
  Shape batch = batch_of(c.oshape());
  Value a = to_batch(b, b.convert(c.in(0), c.odt()), batch), y = to_batch(b, b.convert(c.in(1), c.odt()), batch);
  if (hlo::numel(c.oshape()) == 0) return {b.zeros(c.odt(), c.oshape())};
  bool upper = c.flag(2), left = c.flag_or(3, true), unit = c.flag_or(4, false);
  a = keep_triangle(b, a, !upper);
  return {tri_solve(b, a, y, left, !upper, unit, false)};
}

// triangular_solve(y, a, upper, transpose, unit) -> (x with op(a) x = y, a)
V lower_triangular_solve(Ctx& c) {
  Builder& b = c.b;
  Shape batch = batch_of(c.oshape(0));
  Value y = to_batch(b, b.convert(c.in(0), c.odt(0)), batch), a = to_batch(b, b.convert(c.in(1), c.odt(0)), batch);
  if (hlo::numel(c.oshape(0)) == 0) return {b.zeros(c.odt(0), c.oshape(0)), b.broadcast_to(a, c.oshape(1))};
  bool upper = c.flag_or(2, true), trans = c.flag_or(3, false), unit = c.flag_or(4, false);
  Value x = tri_solve(b, keep_triangle(b, a, !upper), y, true, !upper, unit, trans);
  return {x, b.broadcast_to(a, c.oshape(1))};
}

// _cholesky_solve_helper(y, L, upper) = x with L L^T x = y (U^T U x = y when upper)
V lower_cholesky_solve_helper(Ctx& c) {
  Builder& b = c.b;
  Shape batch = batch_of(c.oshape());
  Value y = to_batch(b, b.convert(c.in(0), c.odt()), batch), l = to_batch(b, b.convert(c.in(1), c.odt()), batch);
  if (hlo::numel(c.oshape()) == 0) return {b.zeros(c.odt(), c.oshape())};
  bool upper = c.flag_or(2, false);
  if (upper) l = mT(b, l);
  l = keep_triangle(b, l, true);
  Value z = tri_solve(b, l, y, true, true, false, false);
  return {tri_solve(b, l, z, true, true, false, true)};
}

// cholesky_inverse(L, upper) = (L L^T)^-1 (or (U^T U)^-1)
V lower_cholesky_inverse(Ctx& c) {
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
}

// linalg_lu_factor_ex(A, pivot, check) -> (LU, pivots (1-based, int32), info)
V lower_linalg_lu_factor_ex(Ctx& c) {
  Builder& b = c.b;
  Value a = b.convert(c.in(0), c.odt(0));
  if (hlo::numel(a.shape()) == 0) return {a, b.zeros(c.odt(1), c.oshape(1)), b.zeros(c.odt(2), c.oshape(2))};
  LU f = lu_factor(b, a, c.flag_or(1, true));
  return {f.lu, stack_pivots(b, f.piv, batch_of(a.shape()), c.odt(1)), b.convert(f.info, c.odt(2))};
}

// linalg_lu(A, pivot) -> (P, L, U) with A = P L U
V lower_linalg_lu(Ctx& c) {
  Builder& b = c.b;
  Value a = b.convert(c.in(0), c.odt(1));
  if (hlo::numel(a.shape()) == 0) return {b.zeros(c.odt(0), c.oshape(0)), b.zeros(c.odt(1), c.oshape(1)), b.zeros(c.odt(2), c.oshape(2))};
  bool pivot = c.flag_or(1, true);
  LU f = lu_factor(b, a, pivot);
  auto [l, u] = lu_parts(b, f.lu);
  Value p = pivot ? perm_matrix(b, f.perm, c.odt(0)) : b.zeros(c.odt(0), c.oshape(0));
  return {p, l, u};
}

// lu_unpack(LU, pivots, unpack_data, unpack_pivots) -> (P, L, U)
V lower_lu_unpack(Ctx& c) {
  Builder& b = c.b;
  Value lu = c.in(0), piv = b.convert(c.in(1), DType::S64);
  if (hlo::numel(lu.shape()) == 0) return {b.zeros(c.odt(0), c.oshape(0)), b.zeros(c.odt(1), c.oshape(1)), b.zeros(c.odt(2), c.oshape(2))};
  int64_t r = lu.rank(), m = lu.shape()[r - 2];
  Shape batch = batch_of(lu.shape());
  V out;
  if (c.flag_or(3, true)) {
    std::vector<Value> swaps;
    int64_t kp = piv.shape().back();
    for (int64_t k = 0; k < kp; ++k) {
      Shape st(piv.rank(), 0), lim = piv.shape(), one(piv.rank(), 1);
      st.back() = k;
      lim.back() = k + 1;
      Value pk = b.reshape(b.slice(piv, st, lim, one), batch);
      swaps.push_back(b.sub(pk, b.constant_int(1, DType::S64, batch)));
    }
    out.push_back(perm_matrix(b, perm_from_swaps(b, swaps, batch, m), c.odt(0)));
  } else {
    out.push_back(b.zeros(c.odt(0), c.oshape(0)));
  }
  if (c.flag_or(2, true)) {
    auto [l, u] = lu_parts(b, lu);
    out.push_back(l);
    out.push_back(u);
  } else {
    out.push_back(b.zeros(c.odt(1), c.oshape(1)));
    out.push_back(b.zeros(c.odt(2), c.oshape(2)));
  }
  return out;
}

// linalg_lu_solve(LU, pivots, B, left, adjoint) = X with A X = B (A^T X = B; X A = B when !left)
V lower_linalg_lu_solve(Ctx& c) {
  Builder& b = c.b;
  Shape batch = batch_of(c.oshape());
  Value lu = to_batch(b, b.convert(c.in(0), c.odt()), batch), rhs = b.convert(c.in(2), c.odt());
  if (hlo::numel(c.oshape()) == 0 || hlo::numel(lu.shape()) == 0) return {b.zeros(c.odt(), c.oshape())};
  Value piv = b.convert(c.in(1), DType::S64);
  int64_t m = lu.shape()[lu.rank() - 2];
  std::vector<Value> swaps;
  Shape pb = batch_of(c.in(0).shape());
  for (int64_t k = 0; k < piv.shape().back(); ++k) {
    Shape st(piv.rank(), 0), lim = piv.shape(), one(piv.rank(), 1);
    st.back() = k;
    lim.back() = k + 1;
    swaps.push_back(b.sub(b.reshape(b.slice(piv, st, lim, one), pb), b.constant_int(1, DType::S64, pb)));
  }
  Value perm = perm_from_swaps(b, swaps, pb, m);
  Shape full = batch;
  full.push_back(m);
  perm = b.broadcast_to(perm, full);
  bool left = c.flag_or(3, true), adjoint = c.flag_or(4, false);
  if (left) return {lu_solve(b, lu, perm, to_batch(b, rhs, batch), adjoint)};
  // X A = B  <=>  A^T X^T = B^T
  return {mT(b, lu_solve(b, lu, perm, to_batch(b, mT(b, rhs), batch), !adjoint))};
}

// _linalg_solve_ex(A, B, left, check) -> (X, LU, pivots, info)
V lower_linalg_solve_ex(Ctx& c) {
  Builder& b = c.b;
  DType t = c.odt(0);
  Value a = b.convert(c.in(0), t), rhs = b.convert(c.in(1), t);
  bool left = c.flag_or(2, true);
  const Shape& xs = c.oshape(0);
  bool vec = static_cast<int64_t>(xs.size()) == a.rank() - 1;  // B was a (batch of) vector(s)
  Shape batch = vec ? Shape(xs.begin(), xs.end() - 1) : batch_of(xs);
  if (hlo::numel(a.shape()) == 0 || hlo::numel(xs) == 0)
    return {b.zeros(t, xs), b.zeros(t, c.oshape(1)), b.zeros(c.odt(2), c.oshape(2)), b.zeros(c.odt(3), c.oshape(3))};
  LU f = lu_factor(b, a, true);
  Shape ab = batch_of(a.shape());
  Value lu = to_batch(b, f.lu, batch);
  Shape pfull = batch;
  pfull.push_back(a.shape().back());
  Value perm = b.broadcast_to(f.perm, pfull);
  Value x;
  if (vec) {
    Value rb = b.broadcast_to(rhs, xs);
    Shape col = xs;
    col.push_back(1);
    x = b.reshape(lu_solve(b, lu, perm, b.reshape(rb, col), !left), xs);
  } else if (left) {
    x = lu_solve(b, lu, perm, to_batch(b, rhs, batch), false);
  } else {
    x = mT(b, lu_solve(b, lu, perm, to_batch(b, mT(b, rhs), batch), true));
  }
  return {x, f.lu, stack_pivots(b, f.piv, ab, c.odt(2)), b.convert(f.info, c.odt(3))};
}

// linalg_inv_ex(A, check) -> (A^-1 via LU, info)
V lower_linalg_inv_ex(Ctx& c) {
  Builder& b = c.b;
  Value a = b.convert(c.in(0), c.odt(0));
  if (hlo::numel(a.shape()) == 0) return {a, b.zeros(c.odt(1), c.oshape(1))};
  LU f = lu_factor(b, a, true);
  int64_t r = a.rank();
  Value eye = b.convert(b.compare(b.iota(DType::S64, a.shape(), r - 2), b.iota(DType::S64, a.shape(), r - 1),
                                  hlo::Cmp::EQ), a.dtype());
  return {lu_solve(b, f.lu, f.perm, eye, false), b.convert(f.info, c.odt(1))};
}

// _linalg_det(A) -> (det = sign(P) prod diag(U), LU, pivots)
V lower_linalg_det(Ctx& c) {
  Builder& b = c.b;
  Value a = b.convert(c.in(0), c.odt(0));
  Shape batch = batch_of(a.shape());
  if (hlo::numel(a.shape()) == 0)
    return {b.constant(1, c.odt(0), c.oshape(0)), b.zeros(c.odt(1), c.oshape(1)), b.zeros(c.odt(2), c.oshape(2))};
  LU f = lu_factor(b, factored(c, a), true);
  Value d = b.reduce(diag_of(b, f.lu), b.constant(1, a.dtype()), {a.rank() - 2}, op::multiply);
  return {b.mul(d, perm_sign(b, f.piv, batch, a.dtype())), f.lu, stack_pivots(b, f.piv, batch, c.odt(2))};
}

// _linalg_slogdet(A) -> (sign, log|det|, LU, pivots)
V lower_linalg_slogdet(Ctx& c) {
  Builder& b = c.b;
  Value a = b.convert(c.in(0), c.odt(0));
  Shape batch = batch_of(a.shape());
  if (hlo::numel(a.shape()) == 0)
    return {b.constant(1, c.odt(0), c.oshape(0)), b.zeros(c.odt(1), c.oshape(1)), b.zeros(c.odt(2), c.oshape(2)),
            b.zeros(c.odt(3), c.oshape(3))};
  LU f = lu_factor(b, factored(c, a), true);
  Value dg = diag_of(b, f.lu);
  int64_t last = a.rank() - 2;
  Value neg = b.reduce(b.convert(b.compare(dg, b.zeros(dg.dtype(), dg.shape()), hlo::Cmp::LT), DType::S64),
                       b.constant_int(0, DType::S64), {last}, op::add);
  Value odd = b.compare(b.binary(op::remainder, neg, b.constant_int(2, DType::S64, neg.shape())),
                        b.zeros(DType::S64, neg.shape()), hlo::Cmp::NE);
  Value sign = b.mul(perm_sign(b, f.piv, batch, a.dtype()), b.select(odd, b.constant(-1, a.dtype(), batch), b.constant(1, a.dtype(), batch)));
  Value zero = b.reduce(b.compare(dg, b.zeros(dg.dtype(), dg.shape()), hlo::Cmp::EQ), b.constant_int(0, DType::Pred), {last}, op::or_);
  sign = b.select(zero, b.zeros(a.dtype(), batch), sign);
  Value logabs = b.reduce(b.unary(op::log, b.unary(op::abs, dg)), b.zeros(a.dtype(), {}), {last}, op::add);
  return {sign, logabs, f.lu, stack_pivots(b, f.piv, batch, c.odt(3))};
}
}  // namespace

void register_linalg() {
  const std::pair<const char*, Rule> rules[] = {
      // ---- products
      {"aten::linalg_cross", lower_linalg_cross},
      {"aten::mm", [](Ctx& c) -> V { return {matmul(c, c.in(0), c.in(1), kMM, c.odt())}; }},
      {"aten::bmm", [](Ctx& c) -> V { return {matmul(c, c.in(0), c.in(1), kBMM, c.odt())}; }},
      {"aten::dot", [](Ctx& c) -> V { return {matmul(c, c.in(0), c.in(1), {{}, {}, {0}, {0}}, c.odt())}; }},
      // vdot(a, b) = sum(conj(a) * b)
      {"aten::vdot", [](Ctx& c) -> V { return {matmul(c, c.b.conj(c.in(0)), c.in(1), {{}, {}, {0}, {0}}, c.odt())}; }},
      {"aten::mv", [](Ctx& c) -> V { return {matmul(c, c.in(0), c.in(1), {{}, {}, {1}, {0}}, c.odt())}; }},
      {"aten::addmm", lower_addmm},
      {"aten::baddbmm", lower_baddbmm},
      {"aten::addmv", lower_addmv},
      {"aten::addbmm", lower_addbmm},

      // ---- factorizations (real matrices only: real_rule)
      {"aten::linalg_cholesky_ex", real_rule(lower_linalg_cholesky_ex)},
      // aten::cholesky (deprecated) is linalg_cholesky_ex plus CPU's error check: csrc/aten/dispatch/kernels.cpp
      {"aten::linalg_solve_triangular", real_rule(lower_linalg_solve_triangular)},
      {"aten::triangular_solve", real_rule(lower_triangular_solve)},
      {"aten::_cholesky_solve_helper", real_rule(lower_cholesky_solve_helper)},
      {"aten::cholesky_inverse", real_rule(lower_cholesky_inverse)},
      {"aten::linalg_lu_factor_ex", real_rule(lower_linalg_lu_factor_ex)},
      {"aten::linalg_lu", real_rule(lower_linalg_lu)},
      {"aten::lu_unpack", real_rule(lower_lu_unpack)},
      {"aten::linalg_lu_solve", real_rule(lower_linalg_lu_solve)},
      {"aten::_linalg_solve_ex", real_rule(lower_linalg_solve_ex)},
      {"aten::linalg_inv_ex", real_rule(lower_linalg_inv_ex)},
      {"aten::_linalg_det", real_rule(lower_linalg_det)},
      {"aten::_linalg_slogdet", real_rule(lower_linalg_slogdet)},
  };
  for (auto& [name, rule] : rules) add_rule(name, rule);
}

}  // namespace tt::lower
