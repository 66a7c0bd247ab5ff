// nn family: softmax, layer norm, losses, dropout, convolution, pooling, and
// their backward kernels.
#include <algorithm>

#include "lowering/lowering.h"

namespace tt::lower {
namespace {
using V = std::vector<Value>;
using hlo::Cmp;

// reduce x over `dims` and broadcast the result back to x's shape
Value reduce_bcast(Builder& b, Value x, const std::vector<int64_t>& dims, op::Binary body, Value init) {
  Value r = b.reduce(x, init, dims, body);
  return b.broadcast_in_dim(keep_dims(b, r, x.shape(), dims), x.shape(), all_dims(x.rank()));
}

// softmax(x) = exp(x - max) / sum(exp(x - max)); log_softmax = (x - max) - log(sum)
Rule softmax(bool log) {
  return [log](Ctx& c) -> V {
    Builder& b = c.b;
    Value x = b.convert(c.in(0), compute_type(c.odt()));
    // a 0-dim tensor as one element along dim 0: nan for -inf, inf and nan, as CPU
    bool scalar = x.rank() == 0;
    int64_t dim = wrap_dim(c.int_(1), x.rank());
    if (scalar) x = b.reshape(x, {1});
    Value m = reduce_bcast(b, x, {dim}, op::maximum, b.lowest(x.dtype()));
    m = b.select(b.emit("is_finite", {m}, Type{DType::Pred, m.shape()}), m, b.zeros(m.dtype(), m.shape()));
    Value z = b.sub(x, m);
    Value e = b.unary(op::exponential, z);
    Value s = reduce_bcast(b, e, {dim}, op::add, b.zeros(x.dtype(), {}));
    Value r = b.convert(log ? b.sub(z, b.unary(op::log, s)) : b.div(e, s), c.odt());
    return {scalar ? b.reshape(r, {}) : r};
  };
}

Value norm_dims_bcast(Builder& b, Value v, const Shape& full, int64_t axis) {
  // mean/rstd have shape full[:axis] + [1]*...; broadcast over the normalized dims
  Shape s(full.begin(), full.begin() + axis);
  Value r = b.reshape(v, s);
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < axis; ++i) dims.push_back(i);
  return b.broadcast_in_dim(r, full, dims);
}
Value param_bcast(Builder& b, Value w, const Shape& full, int64_t axis, DType t) {
  std::vector<int64_t> dims;
  for (int64_t i = axis; i < static_cast<int64_t>(full.size()); ++i) dims.push_back(i);
  return b.broadcast_in_dim(b.convert(w, t), full, dims);
}

// Layout of a convolution: batch 0, feature 1, spatial 2.. for input/output;
// weight out 0, in 1, spatial 2.. (or in/out swapped).
hlo::ConvDims conv_dims(int64_t n_spatial, bool swap_kernel_io) {
  hlo::ConvDims d;
  for (int64_t i = 0; i < n_spatial; ++i) {
    d.in_spatial.push_back(2 + i);
    d.k_spatial.push_back(2 + i);
    d.out_spatial.push_back(2 + i);
  }
  if (swap_kernel_io) {
    d.k_out = 1;
    d.k_in = 0;
  }
  return d;
}

// One convolution through the precision helper.
Value conv(Ctx& c, Value lhs, Value rhs, const hlo::ConvDims& d, const Shape& strides,
           const std::vector<std::pair<int64_t, int64_t>>& pad, const Shape& lhs_dil, const Shape& rhs_dil,
           int64_t groups, const Shape& out_shape, DType out) {
  auto op = [&](Value x, Value y, const std::string& prec) {
    DType acc = (x.dtype() == DType::BF16 || x.dtype() == DType::F16) ? DType::F32 : x.dtype();
    return c.b.convolution(x, y, d, strides, pad, lhs_dil, rhs_dil, groups, out_shape, acc, prec);
  };
  return contract(c, lhs, rhs, op, out);
}

Shape ints_n(const std::vector<int64_t>& v, size_t n, int64_t dflt) {
  if (v.empty()) return Shape(n, dflt);
  if (v.size() == 1) return Shape(n, v[0]);
  return Shape(v.begin(), v.end());
}

// grad of x for y = conv(x, w): a transposed convolution of g with the flipped kernel.
Value conv_input_grad(Ctx& c, Value g, Value w, const Shape& in_shape, const Shape& stride, const Shape& pad,
                      const Shape& dil, int64_t groups, DType out) {
  int64_t ns = static_cast<int64_t>(in_shape.size()) - 2;
  std::vector<std::pair<int64_t, int64_t>> p;
  std::vector<int64_t> spatial;
  for (int64_t i = 0; i < ns; ++i) {
    int64_t k = w.shape()[2 + i];
    int64_t extra = (in_shape[2 + i] + 2 * pad[i] - dil[i] * (k - 1) - 1) % stride[i];
    int64_t lo = dil[i] * (k - 1) - pad[i];
    p.push_back({lo, lo + extra});
    spatial.push_back(2 + i);
  }
  if (groups > 1) {
    // w [Cout, Cin/G, k..] as G blocks -> [Cout/G, Cin, k..]: group g's output channels
    // contract with its gradient block and give its Cin/G input channels
    const Shape& ws = w.shape();
    Shape blocks{groups, ws[0] / groups, ws[1]}, perm{1, 0, 2}, merged{ws[0] / groups, groups * ws[1]};
    for (int64_t i = 0; i < ns; ++i) {
      blocks.push_back(ws[2 + i]);
      perm.push_back(3 + i);
      merged.push_back(ws[2 + i]);
    }
    w = c.b.reshape(c.b.transpose(c.b.reshape(w, blocks), perm), merged);
  }
  Value wf = c.b.reverse(w, spatial);
  return conv(c, g, wf, conv_dims(ns, true), Shape(ns, 1), p, stride, dil, groups, in_shape, out);
}

// grad of w: correlate the input with g, batch acting as the contracted feature
// (a grouped convolution's G input-channel blocks pair with its G output blocks: batch groups).
Value conv_weight_grad(Ctx& c, Value x, Value g, const Shape& w_shape, const Shape& stride, const Shape& pad,
                       const Shape& dil, int64_t groups, DType out) {
  int64_t ns = static_cast<int64_t>(w_shape.size()) - 2;
  hlo::ConvDims d = conv_dims(ns, false);
  d.in_batch = 1;
  d.in_feature = 0;
  d.k_in = 0;
  d.k_out = 1;
  d.out_batch = 1;
  d.out_feature = 0;
  d.batch_groups = groups;
  std::vector<std::pair<int64_t, int64_t>> p;
  for (int64_t i = 0; i < ns; ++i) {
    int64_t k = w_shape[2 + i];
    int64_t extra = (x.shape()[2 + i] + 2 * pad[i] - dil[i] * (k - 1) - 1) % stride[i];
    p.push_back({pad[i], pad[i] - extra});
  }
  return conv(c, x, g, d, dil, p, Shape(ns, 1), stride, 1, w_shape, out);
}

// Batch-norm geometry: channel dim 1, reduced dims 0 and 2.., N = reduced count.
struct BN {
  std::vector<int64_t> red;
  double n = 1;
  Shape cshape;  // [C]
};
BN bn_dims(const Value& x) {
  BN r;
  for (int64_t i = 0; i < x.rank(); ++i)
    if (i != 1) {
      r.red.push_back(i);
      r.n *= static_cast<double>(x.shape()[i]);
    }
  r.cshape = {x.rank() > 1 ? x.shape()[1] : 1};
  return r;
}
Value per_channel(Builder& b, Value v, const Shape& full) {  // [C] -> full, along dim 1
  return b.broadcast_in_dim(v, full, {1});
}

// Windows of avg_pool over the last n dims: (sum of x, count per window).
struct Pool {
  int n = 2;
  Shape k, s, p;
  std::vector<std::pair<int64_t, int64_t>> pad;  // reduce_window padding for x
  Shape window, strides;
};
Pool pool_geometry(const Value& x, int n, const std::vector<int64_t>& ks, const std::vector<int64_t>& st,
                   const std::vector<int64_t>& pd, const Shape& out) {
  Pool q;
  int64_t r = x.rank();
  q.n = n;
  q.k = ints_n(ks, n, 1);
  q.s = st.empty() ? q.k : ints_n(st, n, 1);
  q.p = ints_n(pd, n, 0);
  q.window = Shape(r, 1);
  q.strides = Shape(r, 1);
  q.pad.assign(r, {0, 0});
  for (int i = 0; i < n; ++i) {
    int64_t d = r - n + i, H = x.shape()[d], O = out[d];
    int64_t extra = std::max<int64_t>(0, (O - 1) * q.s[i] + q.k[i] - (H + 2 * q.p[i]));
    q.window[d] = q.k[i];
    q.strides[d] = q.s[i];
    q.pad[d] = {q.p[i], q.p[i] + extra};
  }
  return q;
}
// Elements each window averages over (count_include_pad counts the zero padding,
// not the ceil_mode overhang), or the divisor override.
Value pool_count(Builder& b, const Value& x, const Pool& q, bool include_pad, int64_t divisor, DType t,
                 const Shape& out) {
  if (divisor != 0) return b.constant(static_cast<double>(divisor), t, out);  // any sign, as on CPU
  int64_t r = x.rank();
  Value ones = b.constant(1, t, x.shape());
  std::vector<std::pair<int64_t, int64_t>> pad = q.pad;
  if (include_pad) {
    Shape lo(r, 0), hi(r, 0), in(r, 0);
    for (int i = 0; i < q.n; ++i) {
      int64_t d = r - q.n + i;
      lo[d] = hi[d] = q.p[i];
      pad[d] = {0, q.pad[d].second - q.p[i]};
    }
    ones = b.pad(ones, b.constant(1, t), lo, hi, in);
  }
  return b.reduce_window(ones, b.zeros(t, {}), q.window, q.strides, pad, op::add);
}

// avg_pool{n}d(x, k, stride, pad, ceil, count_include_pad, divisor?) = window sum / count
Rule avg_pool(int n) {
  return [n](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_type(c.odt());
    Value x = b.convert(c.in(0), t);
    Pool q = pool_geometry(x, n, c.ints(1), c.ints(2), c.ints(3), c.oshape());
    Value sum = b.reduce_window(x, b.zeros(t, {}), q.window, q.strides, q.pad, op::add);
    Value cnt = pool_count(b, x, q, c.flag_or(5, true), c.int_or(6, 0), t, sum.shape());
    return {b.convert(b.div(sum, cnt), c.odt())};
  };
}
// avg_pool{n}d_backward(g, x, k, stride, pad, ceil, count_include_pad, divisor?):
// dx[h] = sum of g/count over the windows holding h: g/count spread by the stride
// (interior padding), then summed over k-wide windows.
Rule avg_pool_backward(int n) {
  return [n](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_type(c.odt());
    Value g = b.convert(c.in(0), t), x = b.convert(c.in(1), t);
    Pool q = pool_geometry(x, n, c.ints(2), c.ints(3), c.ints(4), g.shape());
    Value cnt = pool_count(b, x, q, c.flag_or(6, true), c.int_or(7, 0), t, g.shape());
    Value gs = b.div(g, cnt);
    int64_t r = x.rank();
    Shape lo(r, 0), hi(r, 0), in(r, 0);
    for (int i = 0; i < n; ++i) {
      int64_t dd = r - n + i, H = x.shape()[dd], O = g.shape()[dd];
      int64_t len = (O - 1) * q.s[i] + 1;
      lo[dd] = q.k[i] - 1 - q.p[i];
      hi[dd] = H - len - lo[dd] + q.k[i] - 1;
      in[dd] = q.s[i] - 1;
    }
    Value spread = b.pad(gs, b.zeros(t, {}), lo, hi, in);
    std::vector<std::pair<int64_t, int64_t>> none(r, {0, 0});
    Value dx = b.reduce_window(spread, b.zeros(t, {}), q.window, Shape(r, 1), none, op::add);
    return {b.convert(dx, c.odt())};
  };
}

// The two halves of x along dim.
std::pair<Value, Value> halves(Builder& b, Value x, int64_t dim) {
  int64_t h = x.shape()[dim] / 2;
  Shape st(x.rank(), 0), lim = x.shape(), step(x.rank(), 1);
  lim[dim] = h;
  Value first = b.slice(x, st, lim, step);
  st[dim] = h;
  lim[dim] = 2 * h;
  return {first, b.slice(x, st, lim, step)};
}

// nll_loss geometry: x as [N, C], targets with ignore_index masked to class 0,
// per-sample weights (zero where ignored).
struct Nll {
  Value x, safe, w;
  int64_t n;
  DType t;
};
// `check`: validate the targets on the device (the forward does; its backward reads the
// same targets, and a second check would make every host read wait for the backward).
Nll nll_targets(Ctx& c, Value x, Value tgt, size_t weight_arg, int64_t ignore_index, bool check) {
  Builder& b = c.b;
  Nll l;
  l.t = x.dtype();
  tgt = b.convert(tgt, DType::S64);
  if (x.rank() == 1) {
    x = b.reshape(x, {1, x.shape()[0]});
    tgt = b.reshape(tgt, {1});
  }
  l.n = x.shape()[0];
  l.x = x;
  Value valid = b.compare(tgt, b.constant_int(ignore_index, DType::S64, {l.n}), Cmp::NE);
  l.safe = b.select(valid, tgt, b.zeros(DType::S64, {l.n}));
  if (check) check_range(c, l.safe, 0, x.shape()[1], true, "Target {} is out of bounds.");
  Value w = c.has(weight_arg) ? b.take(b.convert(c.in(weight_arg), l.t), l.safe, 0) : b.constant(1, l.t, {l.n});
  l.w = b.select(valid, w, b.zeros(l.t, {l.n}));
  return l;
}

// Batch norm over (x, w?, b?, running_mean?, running_var?) at argument
// positions a[0..4] (-1: absent), momentum and eps at mom / eps:
//   -> (y, save_mean, save_invstd[, reserve]); training also updates the running statistics
V batch_norm(Ctx& c, const int (&a)[5], bool training, int mom, int eps_arg) {
  Builder& b = c.b;
  auto has = [&](int k) { return a[k] >= 0 && c.has(a[k]); };
  Value x0 = c.in(a[0]);
  DType t = compute_type(x0.dtype());
  Value x = b.convert(x0, t);
  BN d = bn_dims(x);
  Value eps = c.scalar(eps_arg, t);
  Value mean, var;
  if (training) {
    Value n = elements(b, x, d.red, t, d.cshape);  // the batch (and spatial) count at run time when bucketed
    mean = b.div(b.reduce(x, b.zeros(t, {}), d.red, op::add), n);
    Value xc = b.sub(x, per_channel(b, mean, x.shape()));
    var = b.div(b.reduce(b.mul(xc, xc), b.zeros(t, {}), d.red, op::add), n);
    if (has(3) && has(4)) {
      Value m = b.broadcast_to(c.scalar(mom, t), d.cshape);
      Value one_m = b.sub(b.constant(1, t, d.cshape), m);
      Value unbiased = b.mul(var, x.type.dynamic ? b.div(n, b.max(b.sub(n, b.constant(1, t, d.cshape)), b.constant(1, t, d.cshape)))
                                                 : b.constant(d.n / std::max(d.n - 1, 1.0), t, d.cshape));
      c.write(a[3], b.add(b.mul(one_m, b.convert(c.in(a[3]), t)), b.mul(m, mean)));
      c.write(a[4], b.add(b.mul(one_m, b.convert(c.in(a[4]), t)), b.mul(m, unbiased)));
    }
  } else {
    mean = b.convert(c.in(a[3]), t);
    var = b.convert(c.in(a[4]), t);
  }
  Value invstd = b.unary(op::rsqrt, b.add(var, b.broadcast_to(eps, d.cshape)));
  Value y = b.mul(b.sub(x, per_channel(b, mean, x.shape())), per_channel(b, invstd, x.shape()));
  if (has(1)) y = b.mul(y, per_channel(b, b.convert(c.in(a[1]), t), x.shape()));
  if (has(2)) y = b.add(y, per_channel(b, b.convert(c.in(a[2]), t), x.shape()));
  V out{b.convert(y, c.odt(0)), training ? mean : b.zeros(t, c.oshape(1)), training ? invstd : b.zeros(t, c.oshape(2))};
  if (c.nouts() > 3) out.push_back(b.zeros(c.odt(3), c.oshape(3)));  // reserve: unused (empty)
  return out;
}


// ---- fused RNN cells (what nn.LSTM / nn.GRU run on accelerators)
// Column block j of width h of a [B, k h] matrix.
Value block(Builder& b, Value x, int64_t j, int64_t h) {
  int64_t n = x.shape()[0];
  return b.slice(x, {0, j * h}, {n, (j + 1) * h}, {1, 1});
}
Value sigmoid(Builder& b, Value x) { return b.unary(op::logistic, x); }
Value one_minus(Builder& b, Value x) { return b.sub(b.constant(1, x.dtype(), x.shape()), x); }
// gates = input_gates + hidden_gates (+ input_bias + hidden_bias, broadcast over the batch)
Value bias_rows(Builder& b, Ctx& c, Value g, size_t i) {
  return c.has(i) ? b.add(g, b.broadcast_in_dim(b.convert(c.in(i), g.dtype()), g.shape(), {1})) : g;
}
Value col_sum(Builder& b, Value g) { return b.reduce(g, b.zeros(g.dtype(), {}), {0}, op::add); }

// ---- rule bodies (registered in register_nn below)

// native_group_norm(x, w?, b?, N, C, HxW, G, eps) -> (y, mean [N, G], rstd [N, G]): over each
//   (n, group) of C/G * HxW values, y = (x - mean) rstd w + b with the biased variance. A rule of
//   its own (not math_group_norm, which views x and so fails for a channels_last input).
V lower_native_group_norm(Ctx& c) {
  Builder& b = c.b;
  Value x0 = c.in(0);
  DType t = compute_type(c.odt(0));
  int64_t N = c.int_(3), C = c.int_(4), HW = c.int_(5), G = c.int_(6), Cg = C / std::max<int64_t>(G, 1);
  Shape s{N, G, Cg, HW}, ng{N, G};
  Value x = b.reshape(b.convert(x0, t), s);
  double M = static_cast<double>(Cg * HW);
  Value mean = b.div(b.reduce(x, b.zeros(t, {}), {2, 3}, op::add), b.constant(M, t, ng));
  Value xc = b.sub(x, b.broadcast_in_dim(mean, s, {0, 1}));
  Value var = b.div(b.reduce(b.mul(xc, xc), b.zeros(t, {}), {2, 3}, op::add), b.constant(M, t, ng));
  Value rstd = b.unary(op::rsqrt, b.add(var, b.broadcast_to(c.scalar(7, t), ng)));
  Value y = b.mul(xc, b.broadcast_in_dim(rstd, s, {0, 1}));
  auto per_c = [&](size_t i) { return b.broadcast_in_dim(b.reshape(b.convert(c.in(i), t), {G, Cg}), s, {1, 2}); };
  if (c.has(1)) y = b.mul(y, per_c(1));
  if (c.has(2)) y = b.add(y, per_c(2));
  return {b.convert(b.reshape(y, x0.shape()), c.odt(0)), b.convert(mean, c.odt(1)), b.convert(rstd, c.odt(2))};
}

// _weight_norm_interface(v, g, dim) -> (w, norm): norm = ||v|| over every dim but `dim` (0 or
//   the last; g's shape), w = v * g / norm. Backward, with s = sum(gw * v) over the same dims:
//   dg = s / norm, dv = (g / norm) * (gw - v * dg / norm).
std::vector<int64_t> norm_dims(const Value& v, int64_t dim) {
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < v.rank(); ++i)
    if (i != (dim < 0 ? dim + v.rank() : dim)) dims.push_back(i);
  return dims;
}

V lower_weight_norm_interface(Ctx& c) {
  Builder& b = c.b;
  Value v = c.in(0), g = c.in(1);
  DType t = compute_type(c.odt(0));
  Value vt = b.convert(v, t);
  Value n = b.reshape(b.unary(op::sqrt, sum(b, b.mul(vt, vt), norm_dims(v, c.int_(2)))), g.shape());
  Value w = b.mul(vt, b.broadcast_to(b.div(b.convert(g, t), n), v.shape()));
  return {b.convert(w, c.odt(0)), b.convert(n, c.odt(1))};
}

V lower_weight_norm_interface_backward(Ctx& c) {
  Builder& b = c.b;
  Value gw = c.in(0), v = c.in(1), g = c.in(2);
  DType t = compute_type(c.odt(0));
  Value vt = b.convert(v, t), gt = b.convert(g, t), n = b.convert(c.in(3), t);
  Value dg = b.div(b.reshape(sum(b, b.mul(b.convert(gw, t), vt), norm_dims(v, c.int_(4))), g.shape()), n);
  auto full = [&](Value x) { return b.broadcast_to(x, v.shape()); };
  Value dv = b.mul(full(b.div(gt, n)), b.sub(b.convert(gw, t), b.mul(vt, full(b.div(dg, n)))));
  return {b.convert(dv, c.odt(0)), b.convert(dg, c.odt(1))};
}

// native_group_norm_backward(g, x, mean [N, G], rstd [N, G], w?, N, C, HxW, G, mask):
//   over each (n, group) of M = C/G * HxW values, with xh = (x - mean) rstd and d = g w:
//   dx = rstd / M (M d - sum(d) - xh sum(d xh)); dw = sum_{n, hw} g xh; db = sum_{n, hw} g
V lower_native_group_norm_backward(Ctx& c) {
  Builder& b = c.b;
  DType t = compute_type(c.odt(0));
  Value x0 = c.in(1);
  int64_t N = c.int_(5), C = c.int_(6), HW = c.int_(7), G = c.int_(8), Cg = C / std::max<int64_t>(G, 1);
  if (N * C * HW == 0) return {b.zeros(c.odt(0), c.oshape(0)), b.zeros(c.odt(1), c.oshape(1)), b.zeros(c.odt(2), c.oshape(2))};
  Shape s{N, G, Cg, HW};
  Value g = b.reshape(b.convert(c.in(0), t), s), x = b.reshape(b.convert(x0, t), s);
  Value mean = b.broadcast_in_dim(b.convert(c.in(2), t), s, {0, 1});
  Value rstd = b.broadcast_in_dim(b.convert(c.in(3), t), s, {0, 1});
  Value xh = b.mul(b.sub(x, mean), rstd);
  Value w = c.has(4) ? b.broadcast_in_dim(b.reshape(b.convert(c.in(4), t), {G, Cg}), s, {1, 2}) : Value{};
  Value d = w.valid() ? b.mul(g, w) : g;
  auto group_sum = [&](Value v) { return b.broadcast_in_dim(b.reduce(v, b.zeros(t, {}), {2, 3}, op::add), s, {0, 1}); };
  double M = static_cast<double>(Cg * HW);
  Value inner = b.sub(b.sub(b.mul(b.constant(M, t, s), d), group_sum(d)), b.mul(xh, group_sum(b.mul(d, xh))));
  Value dx = b.mul(b.div(rstd, b.constant(M, t, s)), inner);
  Value dw = b.reshape(b.reduce(b.mul(g, xh), b.zeros(t, {}), {0, 3}, op::add), {C});
  Value db = b.reshape(b.reduce(g, b.zeros(t, {}), {0, 3}, op::add), {C});
  return {b.convert(b.reshape(dx, x0.shape()), c.odt(0)), b.convert(dw, c.odt(1)), b.convert(db, c.odt(2))};
}

// _thnn_fused_lstm_cell(ig, hg, cx, ib?, hb?) -> (hy, cy, workspace = [i f g o] activated):
//   (i, f, g, o) = (sig, sig, tanh, sig)(ig + hg + biases); cy = f cx + i g; hy = o tanh(cy)
V lower_thnn_fused_lstm_cell(Ctx& c) {
  Builder& b = c.b;
  DType t = compute_type(c.odt(0));
  Value gates = bias_rows(b, c, bias_rows(b, c, b.add(b.convert(c.in(0), t), b.convert(c.in(1), t)), 3), 4);
  Value cx = b.convert(c.in(2), t);
  int64_t h = cx.shape()[1];
  Value i = sigmoid(b, block(b, gates, 0, h)), f = sigmoid(b, block(b, gates, 1, h));
  Value g = b.unary(op::tanh, block(b, gates, 2, h)), o = sigmoid(b, block(b, gates, 3, h));
  Value cy = b.add(b.mul(f, cx), b.mul(i, g));
  Value hy = b.mul(o, b.unary(op::tanh, cy));
  return {b.convert(hy, c.odt(0)), b.convert(cy, c.odt(1)), b.convert(b.concatenate({i, f, g, o}, 1), c.odt(2))};
}

// backward: with tc = tanh(cy), dc = gcy + ghy o (1 - tc^2):
//   d(i, f, g, o) = (dc g i(1-i), dc cx f(1-f), dc i (1-g^2), ghy tc o(1-o)); dcx = dc f
V lower_thnn_fused_lstm_cell_backward_impl(Ctx& c) {
  Builder& b = c.b;
  DType t = compute_type(c.odt(0));
  Value cx = b.convert(c.in(2), t), cy = b.convert(c.in(3), t), ws = b.convert(c.in(4), t);
  int64_t h = cx.shape()[1];
  Value ghy = c.has(0) ? b.convert(c.in(0), t) : b.zeros(t, cx.shape());
  Value gcy = c.has(1) ? b.convert(c.in(1), t) : b.zeros(t, cx.shape());
  Value i = block(b, ws, 0, h), f = block(b, ws, 1, h), g = block(b, ws, 2, h), o = block(b, ws, 3, h);
  Value tc = b.unary(op::tanh, cy);
  Value dc = b.add(gcy, b.mul(b.mul(ghy, o), one_minus(b, b.mul(tc, tc))));
  Value di = b.mul(b.mul(dc, g), b.mul(i, one_minus(b, i)));
  Value df = b.mul(b.mul(dc, cx), b.mul(f, one_minus(b, f)));
  Value dg = b.mul(b.mul(dc, i), one_minus(b, b.mul(g, g)));
  Value dout = b.mul(b.mul(ghy, tc), b.mul(o, one_minus(b, o)));
  Value dgates = b.concatenate({di, df, dg, dout}, 1);
  Value dbias = c.flag(5) ? col_sum(b, dgates) : b.zeros(t, c.oshape(2));
  return {b.convert(dgates, c.odt(0)), b.convert(b.mul(dc, f), c.odt(1)), b.convert(dbias, c.odt(2))};
}

// _thnn_fused_gru_cell(ig, hg, hx, ib?, hb?) -> (hy, workspace = [r z n hn hx]):
//   r = sig(ig_r + hg_r), z = sig(ig_z + hg_z), n = tanh(ig_n + r hn), hn = hg_n; hy = (1 - z) n + z hx
V lower_thnn_fused_gru_cell(Ctx& c) {
  Builder& b = c.b;
  DType t = compute_type(c.odt(0));
  Value ig = bias_rows(b, c, b.convert(c.in(0), t), 3), hg = bias_rows(b, c, b.convert(c.in(1), t), 4);
  Value hx = b.convert(c.in(2), t);
  int64_t h = hx.shape()[1];
  Value r = sigmoid(b, b.add(block(b, ig, 0, h), block(b, hg, 0, h)));
  Value z = sigmoid(b, b.add(block(b, ig, 1, h), block(b, hg, 1, h)));
  Value hn = block(b, hg, 2, h);
  Value n = b.unary(op::tanh, b.add(block(b, ig, 2, h), b.mul(r, hn)));
  Value hy = b.add(b.mul(one_minus(b, z), n), b.mul(z, hx));
  return {b.convert(hy, c.odt(0)), b.convert(b.concatenate({r, z, n, hn, hx}, 1), c.odt(1))};
}

// backward: dn = ghy (1-z)(1-n^2), dz = ghy (hx - n) z(1-z), dr = dn hn r(1-r), dhx = ghy z;
//   d input gates = (dr, dz, dn), d hidden gates = (dr, dz, dn r)
V lower_thnn_fused_gru_cell_backward(Ctx& c) {
  Builder& b = c.b;
  DType t = compute_type(c.odt(0));
  Value ghy = b.convert(c.in(0), t), ws = b.convert(c.in(1), t);
  int64_t h = ghy.shape()[1];
  Value r = block(b, ws, 0, h), z = block(b, ws, 1, h), n = block(b, ws, 2, h), hn = block(b, ws, 3, h),
        hx = block(b, ws, 4, h);
  Value dn = b.mul(b.mul(ghy, one_minus(b, z)), one_minus(b, b.mul(n, n)));
  Value dz = b.mul(b.mul(ghy, b.sub(hx, n)), b.mul(z, one_minus(b, z)));
  Value dr = b.mul(b.mul(dn, hn), b.mul(r, one_minus(b, r)));
  Value gi = b.concatenate({dr, dz, dn}, 1), gh = b.concatenate({dr, dz, b.mul(dn, r)}, 1);
  bool bias = c.flag(2);
  return {b.convert(gi, c.odt(0)), b.convert(gh, c.odt(1)), b.convert(b.mul(ghy, z), c.odt(2)),
          bias ? b.convert(col_sum(b, gi), c.odt(3)) : b.zeros(c.odt(3), c.oshape(3)),
          bias ? b.convert(col_sum(b, gh), c.odt(4)) : b.zeros(c.odt(4), c.oshape(4))};
}

// native_batch_norm(x, w?, b?, running_mean?, running_var?, training, momentum, eps), also
// registered as _native_batch_norm_legit (the same argument list)
V lower_native_batch_norm(Ctx& c) { return batch_norm(c, {0, 1, 2, 3, 4}, c.flag(5), 6, 7); }

// native_batch_norm_backward(g, x, w?, rm?, rv?, save_mean?, save_invstd?, train, eps, mask)
// train: dx = w * invstd / N * (N g - sum(g) - xhat * sum(g xhat)); eval: dx = g w invstd
// (batch_norm_backward has the same first ten arguments; its save_var is the saved invstd)
V lower_batch_norm_backward(Ctx& c) {
  Builder& b = c.b;
  DType t = compute_type(c.in(1).dtype());
  Value g = b.convert(c.in(0), t), x = b.convert(c.in(1), t);
  BN d = bn_dims(x);
  bool train = c.flag(7);
  Value mean, invstd;
  if (train) {
    mean = b.convert(c.in(5), t);
    invstd = b.convert(c.in(6), t);
  } else {
    mean = b.convert(c.in(3), t);
    invstd = b.unary(op::rsqrt, b.add(b.convert(c.in(4), t), b.broadcast_to(c.scalar(8, t), d.cshape)));
  }
  Value w = c.has(2) ? b.convert(c.in(2), t) : b.constant(1, t, d.cshape);
  Value xhat = b.mul(b.sub(x, per_channel(b, mean, x.shape())), per_channel(b, invstd, x.shape()));
  Value sg = b.reduce(g, b.zeros(t, {}), d.red, op::add);
  Value sgx = b.reduce(b.mul(g, xhat), b.zeros(t, {}), d.red, op::add);
  Value dx;
  if (train) {
    Value nn = elements(b, x, d.red, t, x.shape());
    Value inner = b.sub(b.sub(b.mul(nn, g), per_channel(b, sg, x.shape())), b.mul(xhat, per_channel(b, sgx, x.shape())));
    Value scale = b.div(b.mul(w, invstd), elements(b, x, d.red, t, d.cshape));
    dx = b.mul(per_channel(b, scale, x.shape()), inner);
  } else {
    dx = b.mul(g, per_channel(b, b.mul(w, invstd), x.shape()));
  }
  return {dx, sgx, sg};
}

// softmax backward: y * (g - sum(g * y)); log_softmax backward: g - exp(y) * sum(g)
V lower_softmax_backward_data(Ctx& c) {
  Builder& b = c.b;
  DType t = compute_type(c.odt());
  Value g = b.convert(c.in(0), t), y = b.convert(c.in(1), t);
  int64_t dim = wrap_dim(c.int_(2), g.rank());
  // a 0-dim tensor: the sum over its one element is the element (nan stays nan, as CPU)
  Value s = g.rank() == 0 ? b.mul(g, y) : reduce_bcast(b, b.mul(g, y), {dim}, op::add, b.zeros(t, {}));
  return {b.convert(b.mul(y, b.sub(g, s)), c.odt())};
}

V lower_log_softmax_backward_data(Ctx& c) {
  Builder& b = c.b;
  DType t = compute_type(c.odt());
  Value g = b.convert(c.in(0), t), y = b.convert(c.in(1), t);
  int64_t dim = wrap_dim(c.int_(2), g.rank());
  Value s = g.rank() == 0 ? g : reduce_bcast(b, g, {dim}, op::add, b.zeros(t, {}));
  return {b.convert(b.sub(g, b.mul(b.unary(op::exponential, y), s)), c.odt())};
}

// native_layer_norm(x, shape, w?, b?, eps) -> (y, mean, rstd)
V lower_native_layer_norm(Ctx& c) {
  Builder& b = c.b;
  Value x0 = c.in(0);
  DType t = compute_type(x0.dtype());
  Value x = b.convert(x0, t);
  int64_t axis = x.rank() - static_cast<int64_t>(c.ints(1).size());
  std::vector<int64_t> nd;
  for (int64_t i = axis; i < x.rank(); ++i) nd.push_back(i);
  Value mean = b.div(b.reduce(x, b.zeros(t, {}), nd, op::add), elements(b, x, nd, t, Shape(x.shape().begin(), x.shape().begin() + axis)));
  Value mb = norm_dims_bcast(b, mean, x.shape(), axis);
  Value xc = b.sub(x, mb);
  Value var = b.div(b.reduce(b.mul(xc, xc), b.zeros(t, {}), nd, op::add), elements(b, x, nd, t, mean.shape()));
  Value rstd = b.unary(op::rsqrt, b.add(var, b.broadcast_to(c.scalar(4, t), var.shape())));
  Value y = b.mul(xc, norm_dims_bcast(b, rstd, x.shape(), axis));
  if (c.has(2)) y = b.mul(y, param_bcast(b, c.in(2), x.shape(), axis, t));
  if (c.has(3)) y = b.add(y, param_bcast(b, c.in(3), x.shape(), axis, t));
  return {b.convert(y, c.odt(0)), mean, rstd};
}

// native_layer_norm_backward(g, x, shape, mean, rstd, w?, b?, mask) -> (dx, dw, db)
// dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)), gw = g * w
V lower_native_layer_norm_backward(Ctx& c) {
  Builder& b = c.b;
  DType t = compute_type(c.in(1).dtype());
  Value g = b.convert(c.in(0), t), x = b.convert(c.in(1), t);
  int64_t axis = x.rank() - static_cast<int64_t>(c.ints(2).size());
  std::vector<int64_t> nd, bd;
  for (int64_t i = 0; i < x.rank(); ++i) (i >= axis ? nd : bd).push_back(i);
  Value mean = norm_dims_bcast(b, b.convert(c.in(3), t), x.shape(), axis);
  Value rstd = norm_dims_bcast(b, b.convert(c.in(4), t), x.shape(), axis);
  Value xhat = b.mul(b.sub(x, mean), rstd);
  Value gw = c.has(5) ? b.mul(g, param_bcast(b, c.in(5), x.shape(), axis, t)) : g;
  Value inv_n = x.type.dynamic ? b.div(b.constant(1, t, x.shape()), elements(b, x, nd, t, x.shape())) : [&] {
    double n = 1;
    for (int64_t d : nd) n *= static_cast<double>(x.shape()[d]);
    return b.constant(1.0 / n, t, x.shape());
  }();
  Value m1 = b.mul(reduce_bcast(b, gw, nd, op::add, b.zeros(t, {})), inv_n);
  Value m2 = b.mul(reduce_bcast(b, b.mul(gw, xhat), nd, op::add, b.zeros(t, {})), inv_n);
  Value dx = b.mul(rstd, b.sub(b.sub(gw, m1), b.mul(xhat, m2)));
  Value dw = b.reduce(b.mul(g, xhat), b.zeros(t, {}), bd, op::add);
  Value db = b.reduce(g, b.zeros(t, {}), bd, op::add);
  return {dx, dw, db};
}

// nll_loss_forward(x, target, w?, reduction, ignore_index) -> (loss, total_weight)
V lower_nll_loss_forward(Ctx& c) {
  Builder& b = c.b;
  Nll l = nll_targets(c, c.in(0), c.in(1), 2, c.int_(4), true);
  Value picked = b.reshape(b.take_along(l.x, b.reshape(l.safe, {l.n, 1}), 1), {l.n});
  int64_t reduction = c.int_(3);
  Value loss = b.neg(b.mul(picked, l.w));
  Value total = b.reduce(l.w, b.zeros(l.t, {}), {0}, op::add);
  if (reduction == 0) return {loss, total};
  Value s = b.reduce(loss, b.zeros(l.t, {}), {0}, op::add);
  if (reduction == 1) s = b.div(s, total);
  return {s, total};
}

// nll_loss_backward(g, x, target, w?, reduction, ignore_index, total_weight)
// dx[i, target_i] = -w_i * g_i (/ total_weight for mean)
V lower_nll_loss_backward(Ctx& c) {
  Builder& b = c.b;
  Value g = c.in(0);
  Shape orig = c.in(1).shape();
  Nll l = nll_targets(c, c.in(1), c.in(2), 3, c.int_(5), false);
  DType t = l.t;
  int64_t n = l.n, cls = l.x.shape()[1];
  int64_t reduction = c.int_(4);
  Value w = l.w, safe = l.safe;
  Value gv = reduction == 0 ? b.reshape(b.convert(g, t), {n}) : b.broadcast_to(b.convert(g, t), {n});
  Value coef = b.neg(b.mul(w, gv));
  if (reduction == 1) coef = b.div(coef, b.broadcast_to(b.convert(c.in(6), t), {n}));
  Value hit = b.compare(b.iota(DType::S64, {n, cls}, 1), b.broadcast_in_dim(safe, {n, cls}, {0}), Cmp::EQ);
  Value dx = b.select(hit, b.broadcast_in_dim(coef, {n, cls}, {0}), b.zeros(t, {n, cls}));
  return {b.reshape(dx, orig)};
}

// mse_loss(x, y, reduction) = reduce((x - y)^2)
V lower_mse_loss(Ctx& c) {
  Builder& b = c.b;
  DType t = compute_type(c.odt());
  Value d = b.sub(b.convert(c.in(0), t), b.convert(c.in(1), t));
  Value sq = b.mul(d, d);
  int64_t red = c.int_or(2, 1);
  if (red == 0) return {sq};
  Value s = b.reduce(sq, b.zeros(t, {}), all_dims(sq.rank()), op::add);
  if (red == 1) s = b.div(s, elements(b, sq, all_dims(sq.rank()), t));
  return {s};
}

V lower_mse_loss_backward(Ctx& c) {
  Builder& b = c.b;
  DType t = compute_type(c.odt());
  Value x = b.convert(c.in(1), t), y = b.convert(c.in(2), t);
  Value g = b.broadcast_to(b.convert(c.in(0), t), x.shape());
  Value d = b.mul(b.mul(b.constant(2, t, x.shape()), b.sub(x, y)), g);
  if (c.int_or(3, 1) == 1) d = b.div(d, elements(b, x, all_dims(x.rank()), t, x.shape()));
  return {d};
}

// pointwise losses: smooth_l1(beta) = |d| < beta ? 0.5 d^2 / beta : |d| - 0.5 beta;
// huber(delta) = |d| < delta ? 0.5 d^2 : delta (|d| - 0.5 delta); bce = -(y log x + (1-y) log(1-x)), logs >= -100
Value reduce_loss(Builder& b, Value l, int64_t red) {
  if (red == 0) return l;
  Value s = b.reduce(l, b.zeros(l.dtype(), {}), all_dims(l.rank()), op::add);
  return red == 1 ? b.div(s, elements(b, l, all_dims(l.rank()), l.dtype())) : s;
}
Value grad_scale(Builder& b, Value d, Value g, int64_t red) {  // g broadcast, / N for mean
  Value r = b.mul(d, b.broadcast_to(g, d.shape()));
  if (red == 1) r = b.div(r, elements(b, d, all_dims(d.rank()), d.dtype(), d.shape()));
  return r;
}

// smooth_l1_loss (huber = false) or huber_loss (huber = true)
Rule smooth_l1_or_huber_loss(bool huber) {
  return [huber](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_type(c.odt());
    Value d = b.sub(b.convert(c.in(0), t), b.convert(c.in(1), t));
    Value a = b.unary(op::abs, d);
    double beta = c.num_or(3, 1.0);
    Value bv = b.constant(beta, t, d.shape());
    Value half = b.constant(0.5, t, d.shape());
    Value quad = huber ? b.mul(half, b.mul(d, d)) : b.div(b.mul(half, b.mul(d, d)), bv);
    Value lin = huber ? b.mul(bv, b.sub(a, b.mul(half, bv))) : b.sub(a, b.mul(half, bv));
    Value l = (beta == 0.0 && !huber) ? a : b.select(b.compare(a, bv, Cmp::LT), quad, lin);
    return {b.convert(reduce_loss(b, l, c.int_or(2, 1)), c.odt())};
  };
}

// smooth_l1_loss_backward (huber = false) or huber_loss_backward (huber = true)
Rule smooth_l1_or_huber_loss_backward(bool huber) {
  return [huber](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_type(c.odt());
    Value d = b.sub(b.convert(c.in(1), t), b.convert(c.in(2), t));
    Value a = b.unary(op::abs, d);
    double beta = c.num_or(4, 1.0);
    Value bv = b.constant(beta, t, d.shape());
    Value sign = b.unary(op::sign, d);
    Value in = huber ? d : (beta == 0.0 ? sign : b.div(d, bv));
    Value out = huber ? b.mul(bv, sign) : sign;
    Value dl = b.select(b.compare(a, bv, Cmp::LT), in, out);
    return {b.convert(grad_scale(b, dl, b.convert(c.in(0), t), c.int_or(3, 1)), c.odt())};
  };
}

V lower_binary_cross_entropy(Ctx& c) {
  Builder& b = c.b;
  DType t = compute_type(c.odt());
  Value x = b.convert(c.in(0), t), y = b.convert(c.in(1), t);
  Value floor = b.constant(-100, t, x.shape());
  Value lx = b.max(b.unary(op::log, x), floor), l1x = b.max(b.unary(op::log_plus_one, b.neg(x)), floor);
  Value one = b.constant(1, t, x.shape());
  Value l = b.neg(b.add(b.mul(y, lx), b.mul(b.sub(one, y), l1x)));
  if (c.has(2)) l = b.mul(l, b.broadcast_to(b.convert(c.in(2), t), l.shape()));
  return {b.convert(reduce_loss(b, l, c.int_or(3, 1)), c.odt())};
}

// d bce / dx = (x - y) / max((1 - x) x, 1e-12)
V lower_binary_cross_entropy_backward(Ctx& c) {
  Builder& b = c.b;
  DType t = compute_type(c.odt());
  Value x = b.convert(c.in(1), t), y = b.convert(c.in(2), t);
  Value one = b.constant(1, t, x.shape());
  Value den = b.max(b.mul(b.sub(one, x), x), b.constant(1e-12, t, x.shape()));
  Value d = b.div(b.sub(x, y), den);
  if (c.has(3)) d = b.mul(d, b.broadcast_to(b.convert(c.in(3), t), d.shape()));
  return {b.convert(grad_scale(b, d, b.convert(c.in(0), t), c.int_or(4, 1)), c.odt())};
}

// glu(x, dim) = a * sigmoid(b) for the two halves of x along dim
V lower_glu(Ctx& c) {
  Builder& b = c.b;
  Value x = b.convert(c.in(0), compute_type(c.odt()));
  int64_t dim = wrap_dim(c.int_or(1, -1), x.rank());
  auto [a, g] = halves(b, x, dim);
  return {b.convert(b.mul(a, b.unary(op::logistic, g)), c.odt())};
}

// glu_backward(g, x, dim) = [g * s, g * a * s * (1 - s)], s = sigmoid(second half)
V lower_glu_backward(Ctx& c) {
  Builder& b = c.b;
  DType t = compute_type(c.odt());
  Value go = b.convert(c.in(0), t), x = b.convert(c.in(1), t);
  int64_t dim = wrap_dim(c.int_or(2, -1), x.rank());
  auto [a, second] = halves(b, x, dim);
  Value s = b.unary(op::logistic, second);
  Value da = b.mul(go, s);
  Value db = b.mul(b.mul(go, a), b.mul(s, b.sub(b.constant(1, t, s.shape()), s)));
  return {b.convert(b.concatenate({da, db}, dim), c.odt())};
}

// _prelu_kernel(x, w) = x > 0 ? x : w x  (w broadcast as given)
V lower_prelu_kernel(Ctx& c) {
  Builder& b = c.b;
  DType t = c.odt();
  Value x = c.in_out(0, t), w = c.in_out(1, t);
  return {b.select(b.compare(x, b.zeros(t, x.shape()), Cmp::GT), x, b.mul(w, x))};
}

// _prelu_kernel_backward(g, x, w) -> (x > 0 ? g : w g, x > 0 ? 0 : x g)
V lower_prelu_kernel_backward(Ctx& c) {
  Builder& b = c.b;
  DType t = c.odt();
  Value g = c.in_out(0, t), x = c.in_out(1, t), w = c.in_out(2, t);
  Value pos = b.compare(x, b.zeros(t, x.shape()), Cmp::GT);
  Value dx = b.select(pos, g, b.mul(w, g));
  Value dw = b.select(pos, b.zeros(t, x.shape()), b.mul(x, g));
  return {dx, dw};  // autograd sums dw down to the weight's shape
}

// native_dropout(x, p, train) -> (x * keep / (1 - p), keep), keep = u >= p
V lower_native_dropout(Ctx& c) {
  Builder& b = c.b;
  Value x = c.in(0);
  bool train = c.flag_or(2, true);
  if (!train) return {x, b.constant_int(1, DType::Pred, x.shape())};
  DType t = compute_type(x.dtype());
  Value p = c.scalar(1, DType::F32);
  Value u = uniform01(c, x.shape());
  Value keep = b.compare(u, b.broadcast_to(p, x.shape()), Cmp::GE);
  Value one = b.constant(1, DType::F32);
  Value scale = b.select(b.compare(p, one, Cmp::GE), b.zeros(DType::F32, {}), b.div(one, b.sub(one, p)));
  Value y = b.mul(b.select(keep, b.convert(x, t), b.zeros(t, x.shape())), b.broadcast_to(b.convert(scale, t), x.shape()));
  return {b.convert(y, x.dtype()), keep};
}

V lower_native_dropout_backward(Ctx& c) {
  Builder& b = c.b;
  DType t = c.odt();
  Value g = c.in_out(0, t);
  Value keep = b.convert(c.in(1), DType::Pred);
  return {b.mul(b.select(keep, g, b.zeros(t, g.shape())), c.in_out(2, t))};
}

// convolution(x, w, b?, stride, padding, dilation, transposed, output_padding, groups)
V lower_convolution(Ctx& c) {
  Builder& b = c.b;
  Value x = c.in(0), w = c.in(1);
  int64_t ns = x.rank() - 2;
  Shape stride = ints_n(c.ints(3), ns, 1), pad = ints_n(c.ints(4), ns, 0), dil = ints_n(c.ints(5), ns, 1);
  for (int64_t i = 0; i < ns; ++i)  // CPU's checks (the Meta kernel lets these through)
    if (stride[i] <= 0 || pad[i] < 0 || dil[i] <= 0) throw UserError("convolution: invalid stride, padding or dilation");
  bool transposed = c.flag(6);
  int64_t groups = c.int_(8);
  Value y;
  if (!transposed) {
    std::vector<std::pair<int64_t, int64_t>> p;
    for (int64_t i = 0; i < ns; ++i) p.push_back({pad[i], pad[i]});
    y = conv(c, x, w, conv_dims(ns, false), stride, p, Shape(ns, 1), dil, groups, c.oshape(), c.odt());
  } else {
    if (groups != 1) throw Unsupported("grouped transposed convolution");
    Shape opad = ints_n(c.ints(7), ns, 0);
    std::vector<std::pair<int64_t, int64_t>> p;
    std::vector<int64_t> spatial;
    for (int64_t i = 0; i < ns; ++i) {
      int64_t k = w.shape()[2 + i];
      int64_t lo = dil[i] * (k - 1) - pad[i];
      p.push_back({lo, lo + opad[i]});
      spatial.push_back(2 + i);
    }
    y = conv(c, x, b.reverse(w, spatial), conv_dims(ns, true), Shape(ns, 1), p, stride, dil, 1, c.oshape(),
             c.odt());
  }
  if (c.has(2)) y = b.add(y, b.broadcast_in_dim(b.convert(c.in(2), y.dtype()), y.shape(), {1}));
  return {y};
}

// convolution_backward(g, x, w, bias_sizes?, stride, padding, dilation, transposed,
//                      output_padding, groups, mask) -> (dx, dw, db)
V lower_convolution_backward(Ctx& c) {
  Builder& b = c.b;
  Value g = c.in(0), x = c.in(1), w = c.in(2);
  int64_t ns = x.rank() - 2;
  Shape stride = ints_n(c.ints(4), ns, 1), pad = ints_n(c.ints(5), ns, 0), dil = ints_n(c.ints(6), ns, 1);
  int64_t groups = c.int_(9);
  bool transposed = c.flag(7);
  if (groups != 1 && transposed) throw Unsupported("backward of grouped transposed convolution");
  const auto& mask = c.ints(10);
  DType t = x.dtype();
  Value dx, dw, db;
  if (!transposed) {
    if (mask.size() > 0 && mask[0]) dx = conv_input_grad(c, g, w, x.shape(), stride, pad, dil, groups, t);
    if (mask.size() > 1 && mask[1]) dw = conv_weight_grad(c, x, g, w.shape(), stride, pad, dil, groups, w.dtype());
  } else {
    // y = conv_transpose(x, w) is the adjoint of x = conv(y, w): its input
    // gradient is that plain convolution of g, its weight gradient correlates g with x.
    if (mask.size() > 0 && mask[0]) {
      std::vector<std::pair<int64_t, int64_t>> p;
      for (int64_t i = 0; i < ns; ++i) p.push_back({pad[i], pad[i]});
      dx = conv(c, g, w, conv_dims(ns, false), stride, p, Shape(ns, 1), dil, 1, x.shape(), t);
    }
    if (mask.size() > 1 && mask[1]) dw = conv_weight_grad(c, g, x, w.shape(), stride, pad, dil, 1, w.dtype());
  }
  if (mask.size() > 2 && mask[2]) {
    std::vector<int64_t> dims{0};
    for (int64_t i = 2; i < g.rank(); ++i) dims.push_back(i);
    db = b.convert(sum(b, g, dims), g.dtype());
  }
  return {dx, dw, db};
}

// max_pool2d_with_indices(x, k, stride, pad, dil, ceil) -> (y, flat argmax index)
// The window's k_h * k_w taps as strided slices of the -inf padded input.
V lower_max_pool2d_with_indices(Ctx& c) {
  Builder& b = c.b;
  Value x = c.in(0);
  int64_t r = x.rank();
  Shape k = ints_n(c.ints(1), 2, 1);
  Shape s = c.ints(2).empty() ? k : ints_n(c.ints(2), 2, 1);
  Shape p = ints_n(c.ints(3), 2, 0), d = ints_n(c.ints(4), 2, 1);
  const Shape& out = c.oshape(0);
  int64_t H = x.shape()[r - 2], W = x.shape()[r - 1], Ho = out[r - 2], Wo = out[r - 1];
  Shape lo(r, 0), hi(r, 0), in(r, 0);
  lo[r - 2] = p[0];
  lo[r - 1] = p[1];
  hi[r - 2] = std::max<int64_t>(0, (Ho - 1) * s[0] + d[0] * (k[0] - 1) + 1 - H - p[0]);
  hi[r - 1] = std::max<int64_t>(0, (Wo - 1) * s[1] + d[1] * (k[1] - 1) + 1 - W - p[1]);
  Value xp = b.pad(x, b.lowest(x.dtype()), lo, hi, in);
  Value best, bidx;
  for (int64_t i = 0; i < k[0]; ++i)
    for (int64_t j = 0; j < k[1]; ++j) {
      Value cand = window_tap(b, xp, i, j, d, s, Ho, Wo);
      Shape hw{Ho, Wo};
      Value hidx = b.add(b.mul(b.iota(DType::S64, hw, 0), b.constant_int(s[0], DType::S64, hw)),
                         b.constant_int(i * d[0] - p[0], DType::S64, hw));
      Value widx = b.add(b.mul(b.iota(DType::S64, hw, 1), b.constant_int(s[1], DType::S64, hw)),
                         b.constant_int(j * d[1] - p[1], DType::S64, hw));
      Value flat = b.add(b.mul(hidx, b.constant_int(W, DType::S64, hw)), widx);
      flat = b.broadcast_in_dim(flat, cand.shape(), {r - 2, r - 1});
      if (!best.valid()) {
        best = cand;
        bidx = flat;
        continue;
      }
      Value take = b.binary(op::or_, b.compare(cand, best, Cmp::GT),
                            b.binary(op::and_, b.compare(cand, cand, Cmp::NE), b.compare(best, best, Cmp::EQ)));
      best = b.select(take, cand, best);
      bidx = b.select(take, flat, bidx);
    }
  return {best, bidx};
}

// backward: scatter-add g at the saved argmax positions
V lower_max_pool2d_with_indices_backward(Ctx& c) {
  Builder& b = c.b;
  Value g = c.in(0), x = c.in(1), idx = c.in(7);
  int64_t r = x.rank();
  int64_t lead = hlo::numel(Shape(x.shape().begin(), x.shape().end() - 2));
  int64_t hw = x.shape()[r - 2] * x.shape()[r - 1];
  int64_t ohw = g.shape()[r - 2] * g.shape()[r - 1];
  Value g2 = b.reshape(b.convert(g, compute_type(g.dtype())), {lead * ohw});
  Value i2 = b.reshape(b.convert(idx, DType::S64), {lead, ohw});
  Value row = b.iota(DType::S64, {lead, ohw}, 0);
  Value coords = b.concatenate({b.reshape(row, {lead * ohw, 1}), b.reshape(i2, {lead * ohw, 1})}, 1);
  Value z = b.zeros(g2.dtype(), {lead, hw});
  Value out = b.scatter(z, coords, g2, {0, 1}, op::add);
  return {b.convert(b.reshape(out, x.shape()), x.dtype())};
}
}  // namespace

void register_nn() {
  const std::pair<const char*, Rule> rules[] = {
      // group norm, weight norm
      {"aten::native_group_norm", lower_native_group_norm},
      {"aten::_weight_norm_interface", lower_weight_norm_interface},
      {"aten::_weight_norm_interface_backward", lower_weight_norm_interface_backward},
      {"aten::native_group_norm_backward", lower_native_group_norm_backward},
      // fused RNN cells
      {"aten::_thnn_fused_lstm_cell", lower_thnn_fused_lstm_cell},
      {"aten::_thnn_fused_lstm_cell_backward_impl", lower_thnn_fused_lstm_cell_backward_impl},
      {"aten::_thnn_fused_gru_cell", lower_thnn_fused_gru_cell},
      {"aten::_thnn_fused_gru_cell_backward", lower_thnn_fused_gru_cell_backward},
      // native_batch_norm(x, w?, b?, running_mean?, running_var?, training, momentum, eps) and its
      // newer spellings (the same computation, other argument lists)
      {"aten::native_batch_norm", lower_native_batch_norm},
      {"aten::_native_batch_norm_legit", lower_native_batch_norm},
      {"aten::_native_batch_norm_legit.no_stats",
       [](Ctx& c) -> V { return batch_norm(c, {0, 1, 2, -1, -1}, c.flag(3), 4, 5); }},
      {"aten::_native_batch_norm_legit_no_training",
       [](Ctx& c) -> V { return batch_norm(c, {0, 1, 2, 3, 4}, false, 5, 6); }},
      {"aten::_batch_norm_with_update", [](Ctx& c) -> V { return batch_norm(c, {0, 1, 2, 3, 4}, true, 5, 6); }},
      {"aten::_batch_norm_no_update", [](Ctx& c) -> V { return batch_norm(c, {0, 1, 2, 3, 4}, false, 5, 6); }},
      // batch norm backward (batch_norm_backward has the same first ten arguments)
      {"aten::native_batch_norm_backward", lower_batch_norm_backward},
      {"aten::batch_norm_backward", lower_batch_norm_backward},
      // pooling, softmax
      {"aten::avg_pool2d", avg_pool(2)},
      {"aten::avg_pool2d_backward", avg_pool_backward(2)},
      {"aten::avg_pool3d", avg_pool(3)},
      {"aten::avg_pool3d_backward", avg_pool_backward(3)},
      {"aten::_softmax", softmax(false)},
      {"aten::_log_softmax", softmax(true)},
      {"aten::_softmax_backward_data", lower_softmax_backward_data},
      {"aten::_log_softmax_backward_data", lower_log_softmax_backward_data},

      // layer norm
      {"aten::native_layer_norm", lower_native_layer_norm},
      {"aten::native_layer_norm_backward", lower_native_layer_norm_backward},

      // losses
      {"aten::nll_loss_forward", lower_nll_loss_forward},
      {"aten::nll_loss_backward", lower_nll_loss_backward},
      {"aten::mse_loss", lower_mse_loss},
      {"aten::mse_loss_backward", lower_mse_loss_backward},

      // pointwise losses, glu, prelu
      {"aten::smooth_l1_loss", smooth_l1_or_huber_loss(false)},
      {"aten::smooth_l1_loss_backward", smooth_l1_or_huber_loss_backward(false)},
      {"aten::huber_loss", smooth_l1_or_huber_loss(true)},
      {"aten::huber_loss_backward", smooth_l1_or_huber_loss_backward(true)},
      {"aten::binary_cross_entropy", lower_binary_cross_entropy},
      {"aten::binary_cross_entropy_backward", lower_binary_cross_entropy_backward},
      {"aten::glu", lower_glu},
      {"aten::glu_backward", lower_glu_backward},
      {"aten::_prelu_kernel", lower_prelu_kernel},
      {"aten::_prelu_kernel_backward", lower_prelu_kernel_backward},

      // dropout
      {"aten::native_dropout", lower_native_dropout},
      {"aten::native_dropout_backward", lower_native_dropout_backward},

      // convolution
      {"aten::convolution", lower_convolution},
      {"aten::convolution_backward", lower_convolution_backward},

      // max pooling
      {"aten::max_pool2d_with_indices", lower_max_pool2d_with_indices},
      {"aten::max_pool2d_with_indices_backward", lower_max_pool2d_with_indices_backward},
  };
  for (auto& [name, rule] : rules) add_rule(name, rule);
}

}  // namespace tt::lower
