// Pooling family (adaptive and unpooling; the fixed-window pools live in nn.cc):
// adaptive avg/max pooling over the last 1-3 dims with PyTorch's windows
// [floor(i L / o), ceil((i + 1) L / o)), max_unpool, and im2col / col2im.
#include <algorithm>
#include <cmath>

#include "lowering/lowering.h"

namespace tt::lower {
namespace {
using V = std::vector<Value>;

int64_t win_start(int64_t i, int64_t L, int64_t o) { return (i * L) / o; }
int64_t win_end(int64_t i, int64_t L, int64_t o) { return ((i + 1) * L + o - 1) / o; }

// x with dim d (length L) replaced by o entries: entry i = sum_l M[i, l] x[.., l, ..]
Value apply_rows(Builder& b, Value x, int64_t d, const std::vector<double>& m, int64_t o) {
  int64_t L = x.shape()[d];
  Value mat = b.reshape(b.constant_array(m, x.dtype()), {o, L});
  Value y = b.dot_general(x, mat, hlo::DotDims{{}, {}, {d}, {1}}, x.dtype(), "HIGHEST");  // [.. without d .., o]
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < x.rank() - 1; ++i) {
    if (i == d) perm.push_back(x.rank() - 1);
    perm.push_back(i);
  }
  if (d == x.rank() - 1) perm.push_back(x.rank() - 1);
  return b.transpose(y, perm);
}

// averaging matrix [o, L] of adaptive windows (transposed: [L, o], for the backward)
std::vector<double> avg_matrix(int64_t L, int64_t o, bool transposed) {
  std::vector<double> m(o * L, 0.0);
  for (int64_t i = 0; i < o; ++i) {
    int64_t s = win_start(i, L, o), e = win_end(i, L, o);
    for (int64_t l = s; l < e; ++l) (transposed ? m[l * o + i] : m[i * L + l]) = 1.0 / static_cast<double>(e - s);
  }
  return m;
}

// adaptive_avg_pool over the last k dims: one averaging matrix per dim
Value adaptive_avg(Builder& b, Value x, const Shape& out, int64_t k) {
  for (int64_t j = 0; j < k; ++j) {
    int64_t d = x.rank() - k + j, L = x.shape()[d], o = out[d];
    x = apply_rows(b, x, d, avg_matrix(L, o, false), o);
  }
  return x;
}

// the backward: each gradient entry spread evenly over its window
Value adaptive_avg_back(Builder& b, Value g, const Shape& in, int64_t k) {
  for (int64_t j = 0; j < k; ++j) {
    int64_t d = g.rank() - k + j, o = g.shape()[d], L = in[d];
    g = apply_rows(b, g, d, avg_matrix(L, o, true), L);
  }
  return g;
}

// Max over the adaptive windows of dim d: values and (within-dim) argmax,
// first occurrence, NaN wins (PyTorch's rule).
std::pair<Value, Value> window_max(Builder& b, Value x, int64_t d, int64_t o) {
  int64_t L = x.shape()[d], r = x.rank();
  // [.., o, L] at dims (d, d + 1): x broadcast along o, out-of-window entries masked
  Shape s = x.shape();
  s.insert(s.begin() + d, o);
  std::vector<int64_t> bd;
  for (int64_t i = 0; i < r; ++i) bd.push_back(i < d ? i : i + 1);
  Value xb = b.broadcast_in_dim(x, s, bd);
  std::vector<int64_t> starts, ends;
  for (int64_t i = 0; i < o; ++i) {
    starts.push_back(win_start(i, L, o));
    ends.push_back(win_end(i, L, o));
  }
  Value pos = b.iota(DType::S64, s, d + 1);
  Value lo = b.broadcast_in_dim(b.constant_array(starts, DType::S64), s, {d});
  Value hi = b.broadcast_in_dim(b.constant_array(ends, DType::S64), s, {d});
  Value in = b.binary(op::and_, b.compare(pos, lo, hlo::Cmp::GE), b.compare(pos, hi, hlo::Cmp::LT));
  Value masked = b.select(in, xb, b.broadcast_to(b.lowest(x.dtype()), s));
  auto [v, i] = b.reduce_arg(masked, d + 1, true);
  return {v, i};
}

// adaptive_max_pool over the last k dims -> (values, flat index within the pooled plane)
V adaptive_max(Builder& b, Value x, const Shape& out, int64_t k) {
  int64_t r = x.rank();
  // innermost dim first; track each result's flat index into the spatial plane
  Value v = x, flat;
  for (int64_t j = k - 1; j >= 0; --j) {
    int64_t d = r - k + j;
    int64_t o = out[d];
    auto [m, idx] = window_max(b, v, d, o);
    if (j == k - 1) {
      flat = idx;  // position along the last dim
    } else {
      // the flat index of the winner: idx * (product of inner input dims) + flat of the chosen row
      int64_t inner = 1;
      for (int64_t q = d + 1; q < r; ++q) inner *= x.shape()[q];
      // flat currently has dim d of length L (input); pick the entries at idx along d
      Value picked = b.take_along(flat, idx, d);
      flat = b.add(b.mul(idx, b.constant_int(inner, DType::S64, idx.shape())), picked);
    }
    v = m;
  }
  return {v, flat};
}

// dx for a pooled result: gradient entries added at their flat positions within each plane
Value unpool_planes(Builder& b, Value g, Value idx, const Shape& plane_shape, int64_t k, bool add) {
  int64_t r = g.rank();
  int64_t B = 1, O = 1, S = 1;
  for (int64_t i = 0; i < r - k; ++i) B *= g.shape()[i];
  for (int64_t i = r - k; i < r; ++i) O *= g.shape()[i];
  for (int64_t i = r - k; i < r; ++i) S *= plane_shape[i];
  Value gv = b.reshape(g, {B * O});
  Value iv = b.reshape(b.convert(idx, DType::S64), {B * O, 1});
  Value bi = b.reshape(b.iota(DType::S64, {B, O}, 0), {B * O, 1});
  Value coords = b.concatenate({bi, iv}, 1);
  Value out = b.scatter(b.zeros(g.dtype(), {B, S}), coords, gv, {0, 1}, add ? std::optional(op::add) : std::nullopt);
  return b.reshape(out, plane_shape);
}

V adaptive_avg_rule(Ctx& c, int64_t k) {
  Builder& b = c.b;
  DType t = compute_type(c.odt());
  Value x = b.convert(c.in(0), t);
  if (hlo::numel(c.oshape()) == 0 || hlo::numel(x.shape()) == 0) return {b.zeros(c.odt(), c.oshape())};
  return {b.convert(adaptive_avg(b, x, c.oshape(), k), c.odt())};
}

V adaptive_avg_back_rule(Ctx& c, int64_t k) {
  Builder& b = c.b;
  DType t = compute_type(c.odt());
  Value g = b.convert(c.in(0), t);
  if (hlo::numel(c.oshape()) == 0 || hlo::numel(g.shape()) == 0) return {b.zeros(c.odt(), c.oshape())};
  return {b.convert(adaptive_avg_back(b, g, c.in(1).shape(), k), c.odt())};
}

// im2col over the last two dims of x [.., C, H, W] -> [.., C * kh * kw, Lh * Lw]
Value im2col(Builder& b, Value x, const std::vector<int64_t>& k, const std::vector<int64_t>& dil,
             const std::vector<int64_t>& pad, const std::vector<int64_t>& st, const Shape& out) {
  int64_t r = x.rank();
  Shape lo(r, 0), hi(r, 0), in(r, 0);
  lo[r - 2] = hi[r - 2] = pad[0];
  lo[r - 1] = hi[r - 1] = pad[1];
  Value xp = b.pad(x, b.zeros(x.dtype(), {}), lo, hi, in);
  int64_t H = xp.shape()[r - 2], W = xp.shape()[r - 1];
  int64_t Lh = (H - (dil[0] * (k[0] - 1) + 1)) / st[0] + 1, Lw = (W - (dil[1] * (k[1] - 1) + 1)) / st[1] + 1;
  std::vector<Value> parts;
  Shape one = xp.shape();
  one[r - 2] = Lh;
  one[r - 1] = Lw;
  one.insert(one.end() - 2, 1);  // [.., C, 1, Lh, Lw]
  for (int64_t i = 0; i < k[0]; ++i)
    for (int64_t j = 0; j < k[1]; ++j) {
      parts.push_back(b.reshape(window_tap(b, xp, i, j, dil, st, Lh, Lw), one));
    }
  Value cols = b.concatenate(parts, r - 2);  // [.., C, kh * kw, Lh, Lw]
  return b.reshape(cols, out);
}

// max_pool3d_with_indices(x, k, stride, pad, dil, ceil) -> (max over each window, flat index in the
// D x H x W plane): the k0 k1 k2 taps as strided slices of the -inf padded input
V lower_max_pool3d_with_indices(Ctx& c) {
  Builder& b = c.b;
  Value x = c.in(0);
  int64_t r = x.rank();
  auto fill = [](const std::vector<int64_t>& v, int64_t dflt) {
    Shape s(3, dflt);
    for (size_t i = 0; i < 3 && !v.empty(); ++i) s[i] = v.size() == 1 ? v[0] : v[i];
    return s;
  };
  Shape k = fill(c.ints(1), 1);
  Shape st = c.ints(2).empty() ? k : fill(c.ints(2), 1);
  Shape p = fill(c.ints(3), 0), d = fill(c.ints(4), 1);
  const Shape& out = c.oshape(0);
  if (hlo::numel(out) == 0) return {b.zeros(c.odt(0), out), b.zeros(c.odt(1), c.oshape(1))};
  Shape in_sz(x.shape().end() - 3, x.shape().end()), o(out.end() - 3, out.end());
  Shape lo(r, 0), hi(r, 0), interior(r, 0);
  for (int i = 0; i < 3; ++i) {
    lo[r - 3 + i] = p[i];
    hi[r - 3 + i] = std::max<int64_t>(0, (o[i] - 1) * st[i] + d[i] * (k[i] - 1) + 1 - in_sz[i] - p[i]);
  }
  Value xp = b.pad(x, b.lowest(x.dtype()), lo, hi, interior);
  Value best, bidx;
  for (int64_t i = 0; i < k[0]; ++i)
    for (int64_t j = 0; j < k[1]; ++j)
      for (int64_t l = 0; l < k[2]; ++l) {
        int64_t tap[3] = {i, j, l};
        Shape s0(r, 0), lim = xp.shape(), step(r, 1);
        Value flat = b.constant_int(0, DType::S64, o);
        for (int q = 0; q < 3; ++q) {
          s0[r - 3 + q] = tap[q] * d[q];
          lim[r - 3 + q] = s0[r - 3 + q] + (o[q] - 1) * st[q] + 1;
          step[r - 3 + q] = st[q];
          Value pos = b.add(b.mul(b.iota(DType::S64, o, q), b.constant_int(st[q], DType::S64, o)),
                            b.constant_int(tap[q] * d[q] - p[q], DType::S64, o));
          flat = b.add(b.mul(flat, b.constant_int(in_sz[q], DType::S64, o)), pos);
        }
        Value cand = b.slice(xp, s0, lim, step);
        flat = b.broadcast_in_dim(flat, cand.shape(), {r - 3, r - 2, r - 1});
        if (!best.valid()) {
          best = cand;
          bidx = flat;
          continue;
        }
        Value take = b.binary(op::or_, b.compare(cand, best, hlo::Cmp::GT),
                              b.binary(op::and_, b.compare(cand, cand, hlo::Cmp::NE), b.compare(best, best, hlo::Cmp::EQ)));
        best = b.select(take, cand, best);
        bidx = b.select(take, flat, bidx);
      }
  return {best, bidx};
}
V lower_max_pool3d_with_indices_backward(Ctx& c) {
  Builder& b = c.b;
  Value g = b.convert(c.in(0), compute_type(c.odt()));
  if (hlo::numel(g.shape()) == 0) return {b.zeros(c.odt(), c.oshape())};
  return {b.convert(unpool_planes(b, g, c.in(7), c.oshape(), 3, true), c.odt())};
}
// _cdist_forward(x1 [.., P, M], x2 [.., R, M], p) = p-norm distances [.., P, R]
V lower_cdist_forward(Ctx& c) {
  Builder& b = c.b;
  DType t = compute_type(c.odt());
  const Shape& out = c.oshape();
  if (hlo::numel(out) == 0) return {b.zeros(c.odt(), out)};
  Value x1 = c.in(0), x2 = c.in(1);
  int64_t m = x1.shape().back(), r = static_cast<int64_t>(out.size());
  Shape full = out;
  full.push_back(m);  // [.., P, R, M]
  Shape b1(out.begin(), out.end() - 2), b2 = b1;
  b1.insert(b1.end(), {x1.shape()[x1.rank() - 2], m});
  b2.insert(b2.end(), {x2.shape()[x2.rank() - 2], m});
  std::vector<int64_t> d1, d2;
  for (int64_t i = 0; i < r - 2; ++i) {
    d1.push_back(i);
    d2.push_back(i);
  }
  d1.insert(d1.end(), {r - 2, r});
  d2.insert(d2.end(), {r - 1, r});
  Value a = b.broadcast_in_dim(b.broadcast_to(b.convert(x1, t), b1), full, d1);
  Value e = b.broadcast_in_dim(b.broadcast_to(b.convert(x2, t), b2), full, d2);
  Value diff = b.unary(op::abs, b.sub(a, e));
  double p = c.num(2);
  Value dist;
  if (std::isinf(p)) {
    dist = b.reduce(diff, b.zeros(t, {}), {r}, op::maximum);
  } else if (p == 0) {
    dist = b.reduce(b.convert(b.compare(diff, b.zeros(t, full), hlo::Cmp::NE), t), b.zeros(t, {}), {r}, op::add);
  } else if (p == 1) {
    dist = b.reduce(diff, b.zeros(t, {}), {r}, op::add);
  } else if (p == 2) {
    dist = b.unary(op::sqrt, b.reduce(b.mul(diff, diff), b.zeros(t, {}), {r}, op::add));
  } else {
    Value s = b.reduce(b.binary(op::power, diff, b.constant(p, t, full)), b.zeros(t, {}), {r}, op::add);
    dist = b.binary(op::power, s, b.constant(1.0 / p, t, s.shape()));
  }
  return {b.convert(dist, c.odt())};
}
// _pdist_forward(x [N, M], p) = the p-norm distances of the pairs i < j, row-major
V lower_pdist_forward(Ctx& c) {
  Builder& b = c.b;
  DType t = compute_type(c.odt());
  Value x = b.convert(c.in(0), t);
  int64_t n = x.shape()[0], m = x.shape()[1], k = hlo::numel(c.oshape());
  if (k == 0) return {b.zeros(c.odt(), c.oshape())};
  std::vector<int64_t> ii, jj;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = i + 1; j < n; ++j) {
      ii.push_back(i);
      jj.push_back(j);
    }
  Value a = b.take(x, b.constant_array(ii, DType::S64), 0), e = b.take(x, b.constant_array(jj, DType::S64), 0);
  Value diff = b.unary(op::abs, b.sub(a, e));  // [k, M]
  double p = c.num_or(1, 2.0);
  Shape full{k, m};
  Value dist;
  if (std::isinf(p)) dist = b.reduce(diff, b.zeros(t, {}), {1}, op::maximum);
  else if (p == 0) dist = b.reduce(b.convert(b.compare(diff, b.zeros(t, full), hlo::Cmp::NE), t), b.zeros(t, {}), {1}, op::add);
  else if (p == 1) dist = b.reduce(diff, b.zeros(t, {}), {1}, op::add);
  else if (p == 2) dist = b.unary(op::sqrt, b.reduce(b.mul(diff, diff), b.zeros(t, {}), {1}, op::add));
  else {
    Value s = b.reduce(b.binary(op::power, diff, b.constant(p, t, full)), b.zeros(t, {}), {1}, op::add);
    dist = b.binary(op::power, s, b.constant(1.0 / p, t, s.shape()));
  }
  return {b.convert(dist, c.odt())};
}
// adaptive_max_pool{2,3}d -> (max over each window, its flat index in the input plane)
Rule adaptive_max_pool(int64_t k) {
  return [k](Ctx& c) -> V {
    Builder& b = c.b;
    Value x = c.in(0);
    if (hlo::numel(c.oshape(0)) == 0 || hlo::numel(x.shape()) == 0)
      return {b.zeros(c.odt(0), c.oshape(0)), b.zeros(c.odt(1), c.oshape(1))};
    return adaptive_max(b, x, c.oshape(0), k);
  };
}
// adaptive_max_pool backward: g added at the recorded positions
Rule adaptive_max_pool_backward(int64_t k) {
  return [k](Ctx& c) -> V {
    Builder& b = c.b;
    Value g = b.convert(c.in(0), compute_type(c.odt()));
    if (hlo::numel(g.shape()) == 0) return {b.zeros(c.odt(), c.oshape())};
    return {b.convert(unpool_planes(b, g, c.in(2), c.oshape(), k, true), c.odt())};
  };
}
// max_unpool{2,3}d(x, idx, size, ...) = zeros of `size` per plane with x written at idx
Rule max_unpool(int64_t k) {
  return [k](Ctx& c) -> V {
    Builder& b = c.b;
    Value x = b.convert(c.in(0), c.odt());
    if (hlo::numel(x.shape()) == 0 || hlo::numel(c.oshape()) == 0) return {b.zeros(c.odt(), c.oshape())};
    return {unpool_planes(b, x, c.in(1), c.oshape(), k, false)};
  };
}
// im2col(x, k, dilation, padding, stride) = the k-windows of x as columns
V lower_im2col(Ctx& c) {
  Builder& b = c.b;
  Value x = c.in(0);
  if (hlo::numel(c.oshape()) == 0) return {b.zeros(c.odt(), c.oshape())};
  return {im2col(b, x, c.ints(1), c.ints(2), c.ints(3), c.ints(4), c.oshape())};
}
// col2im(cols, size, k, dilation, padding, stride) = each column entry added back at its position
V lower_col2im(Ctx& c) {
  Builder& b = c.b;
  DType t = compute_type(c.odt());
  Value cols = b.convert(c.in(0), t);
  auto size = c.ints(1), k = c.ints(2), dil = c.ints(3), pad = c.ints(4), st = c.ints(5);
  const Shape& out = c.oshape();
  if (hlo::numel(out) == 0 || hlo::numel(cols.shape()) == 0) return {b.zeros(c.odt(), out)};
  int64_t r = static_cast<int64_t>(out.size());
  int64_t H = size[0] + 2 * pad[0], W = size[1] + 2 * pad[1];
  int64_t Lh = (H - (dil[0] * (k[0] - 1) + 1)) / st[0] + 1, Lw = (W - (dil[1] * (k[1] - 1) + 1)) / st[1] + 1;
  Shape lead(out.begin(), out.end() - 2);  // [.., C]
  Shape cs = lead;
  cs.insert(cs.end(), {k[0] * k[1], Lh, Lw});
  Value blocks = b.reshape(cols, cs);
  Shape padded = lead;
  padded.insert(padded.end(), {H, W});
  Value acc = b.zeros(t, padded);
  for (int64_t i = 0; i < k[0]; ++i)
    for (int64_t j = 0; j < k[1]; ++j) {
      Shape s0(r + 1, 0), lim = cs, one(r + 1, 1);
      s0[r - 2] = i * k[1] + j;
      lim[r - 2] = s0[r - 2] + 1;
      Value blk = b.reshape(b.slice(blocks, s0, lim, one), [&] {
        Shape s = lead;
        s.insert(s.end(), {Lh, Lw});
        return s;
      }());
      // place blk[a, b] at (i*dil + a*stride, j*dil + b*stride): interior padding spreads it
      Shape lo(r, 0), hi(r, 0), in(r, 0);
      lo[r - 2] = i * dil[0];
      lo[r - 1] = j * dil[1];
      in[r - 2] = st[0] - 1;
      in[r - 1] = st[1] - 1;
      hi[r - 2] = H - lo[r - 2] - ((Lh - 1) * st[0] + 1);
      hi[r - 1] = W - lo[r - 1] - ((Lw - 1) * st[1] + 1);
      acc = b.add(acc, b.pad(blk, b.zeros(t, {}), lo, hi, in));
    }
  Shape s0(r, 0), lim = padded, one(r, 1);
  s0[r - 2] = pad[0];
  s0[r - 1] = pad[1];
  lim[r - 2] = pad[0] + size[0];
  lim[r - 1] = pad[1] + size[1];
  return {b.convert(b.slice(acc, s0, lim, one), c.odt())};
}
}  // namespace

void register_pooling() {
  const std::pair<const char*, Rule> rules[] = {
      // max pooling over 3 dims and its backward
      {"aten::max_pool3d_with_indices", lower_max_pool3d_with_indices},
      {"aten::max_pool3d_with_indices_backward", lower_max_pool3d_with_indices_backward},
      // distances
      {"aten::_cdist_forward", lower_cdist_forward},
      {"aten::_pdist_forward", lower_pdist_forward},
      // adaptive_avg_pool{1,2,3}d: per pooled dim, a matrix of window means
      {"aten::_adaptive_avg_pool2d", [](Ctx& c) -> V { return adaptive_avg_rule(c, 2); }},
      {"aten::_adaptive_avg_pool3d", [](Ctx& c) -> V { return adaptive_avg_rule(c, 3); }},
      {"aten::_adaptive_avg_pool2d_backward", [](Ctx& c) -> V { return adaptive_avg_back_rule(c, 2); }},
      {"aten::_adaptive_avg_pool3d_backward", [](Ctx& c) -> V { return adaptive_avg_back_rule(c, 3); }},
      // adaptive max pooling and its backward
      {"aten::adaptive_max_pool2d", adaptive_max_pool(2)},
      {"aten::adaptive_max_pool3d", adaptive_max_pool(3)},
      {"aten::adaptive_max_pool2d_backward", adaptive_max_pool_backward(2)},
      {"aten::adaptive_max_pool3d_backward", adaptive_max_pool_backward(3)},
      // unpooling
      {"aten::max_unpool2d", max_unpool(2)},
      {"aten::max_unpool3d", max_unpool(3)},
      // im2col / col2im
      {"aten::im2col", lower_im2col},
      {"aten::col2im", lower_col2im},
  };
  for (auto& [name, rule] : rules) add_rule(name, rule);
}

}  // namespace tt::lower
