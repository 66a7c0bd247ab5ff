// View/shape family (data-moving ops; pure views are metadata in csrc/aten):
// copy, cat, pad, flip, roll, tril/triu, repeat_interleave-free tiling.
#include <algorithm>

#include <cmath>
#include <cstdint>

#include "lowering/lowering.h"

namespace tt::lower {
namespace {
using V = std::vector<Value>;

// tril / triu: keep x[..., i, j] where j - i <= k (tril) or j - i >= k (triu)
Rule triangle(bool lower) {
  return [lower](Ctx& c) -> V {
    Builder& b = c.b;
    Value x = c.in(0);
    int64_t r = x.rank();
    Shape s2{x.shape()[r - 2], x.shape()[r - 1]};
    Value row = b.iota(DType::S64, s2, 0), col = b.iota(DType::S64, s2, 1);
    Value diff = b.sub(col, row);
    Value kk = b.constant_int(c.int_or(1, 0), DType::S64, s2);
    Value keep = b.compare(diff, kk, lower ? hlo::Cmp::LE : hlo::Cmp::GE);
    keep = b.broadcast_in_dim(keep, x.shape(), {r - 2, r - 1});
    return {b.select(keep, x, b.zeros(x.dtype(), x.shape()))};
  };
}

// cat(tensors, dim): legacy 1-D empty inputs are skipped
V lower_cat(Ctx& c) {
  const auto& xs = c.list(0);
  int64_t dim = wrap_dim(c.int_or(1, 0), c.out().rank());
  std::vector<Value> parts;
  for (const Value& x : xs) {
    if (x.rank() == 1 && x.shape()[0] == 0 && c.out().rank() != 1) continue;
    if (hlo::numel(x.shape()) == 0) continue;
    parts.push_back(c.b.convert(x, c.odt()));
  }
  if (parts.empty()) return {c.b.zeros(c.odt(), c.oshape())};
  return {c.b.concatenate(parts, dim)};
}

// constant_pad_nd(x, pad, value): pad pairs from the last dim backwards; negative pads crop
V lower_constant_pad_nd(Ctx& c) {
  Builder& b = c.b;
  Value x = c.in(0);
  const auto& pad = c.ints(1);
  int64_t r = x.rank();
  Shape lo(r, 0), hi(r, 0), interior(r, 0);
  for (size_t i = 0; i + 1 < pad.size() + 1 && i / 2 < static_cast<size_t>(r); i += 2) {
    int64_t d = r - 1 - static_cast<int64_t>(i / 2);
    lo[d] = pad[i];
    hi[d] = pad[i + 1];
  }
  Shape start(r, 0), limit = x.shape(), step(r, 1);
  bool crop = false;
  for (int64_t d = 0; d < r; ++d) {
    if (lo[d] < 0) { start[d] = -lo[d]; lo[d] = 0; crop = true; }
    if (hi[d] < 0) { limit[d] += hi[d]; hi[d] = 0; crop = true; }
  }
  if (crop) x = b.slice(x, start, limit, step);
  return {b.pad(x, c.scalar_or(2, 0.0, x.dtype()), lo, hi, interior)};
}

// narrow_copy(x, dim, start, length) = x[..., start:start + length, ...] (start < 0 counts from the end)
V lower_narrow_copy(Ctx& c) {
  Value x = c.in(0);
  int64_t dim = wrap_dim(c.int_(1), x.rank()), start = c.int_(2), len = c.int_(3);
  if (x.rank() == 0) throw UserError("narrow() cannot be applied to a 0-dim tensor.");
  int64_t n = x.shape()[dim];
  if (start < 0) start += n;
  if (start < 0 || len < 0 || start + len > n) throw UserError("narrow_copy: start or length out of range");
  Shape st(x.rank(), 0), lim = x.shape(), step(x.rank(), 1);
  st[dim] = start;
  lim[dim] = start + len;
  return {c.b.slice(x, st, lim, step)};
}

V lower_flip(Ctx& c) {
  Value x = c.in(0);
  std::vector<int64_t> dims;
  for (int64_t d : c.ints(1)) dims.push_back(wrap_dim(d, x.rank()));
  if (x.rank() == 0) return {x};  // a 0-dim tensor flips to itself (dims 0 / -1)
  return {c.b.reverse(x, dims)};
}

// channel_shuffle(x, g): [N, C, *] -> [N, g, C/g, *] -> swap dims 1, 2 -> [N, C, *]
V lower_channel_shuffle(Ctx& c) {
  Builder& b = c.b;
  Value x = c.in(0);
  int64_t g = c.int_(1);
  if (x.rank() < 2 || g <= 0 || x.shape()[1] % g) throw Unsupported("channel_shuffle geometry");
  Shape s = x.shape();
  s[1] = s[1] / g;
  s.insert(s.begin() + 1, g);
  std::vector<int64_t> perm(s.size());
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
  std::swap(perm[1], perm[2]);
  return {b.reshape(b.transpose(b.reshape(x, s), perm), x.shape())};
}

// roll(x, shifts, dims): concat(x[n-s:], x[:n-s]) per dim; no dims = flattened
V lower_roll(Ctx& c) {
  Builder& b = c.b;
  Value x = c.in(0);
  Shape orig = x.shape();
  std::vector<int64_t> shifts = c.ints(1), dims = c.has(2) ? c.ints(2) : std::vector<int64_t>{};
  if (dims.empty()) {
    x = b.reshape(x, {hlo::numel(orig)});
    dims = {0};
  }
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i], x.rank()), n = x.shape()[d];
    if (n == 0) continue;
    int64_t s = ((shifts[i] % n) + n) % n;
    if (s == 0) continue;
    Shape st(x.rank(), 0), lim = x.shape(), step(x.rank(), 1);
    st[d] = n - s;
    Value tail = b.slice(x, st, lim, step);
    st[d] = 0;
    lim[d] = n - s;
    Value head = b.slice(x, st, lim, step);
    x = b.concatenate({tail, head}, d);
  }
  return {b.reshape(x, orig)};
}

// sort(x, stable?, dim, descending) -> (values, indices); NaN sorts as largest
V lower_sort_stable(Ctx& c) {
  Value x = c.in(0);
  if (x.rank() == 0) return {x, c.b.constant_int(0, DType::S64)};
  int64_t dim = wrap_dim(c.int_or(2, -1), x.rank());
  Value idx;
  Value v = c.b.sort_dim(x, dim, c.flag_or(3, false), &idx);
  return {v, idx};
}

// topk(x, k, dim, largest, sorted) = the first k of a stable sort
V lower_topk(Ctx& c) {
  Builder& b = c.b;
  Value x = c.in(0);
  int64_t k = c.int_(1);
  if (x.rank() == 0) return {x, b.constant_int(0, DType::S64)};
  int64_t dim = wrap_dim(c.int_or(2, -1), x.rank());
  Value idx;
  Value v = b.sort_dim(x, dim, c.flag_or(3, true), &idx);
  Shape st(x.rank(), 0), lim = x.shape(), step(x.rank(), 1);
  lim[dim] = k;
  return {b.slice(v, st, lim, step), b.slice(idx, st, lim, step)};
}

// Order statistics along a dim from a stable sort (NaN sorts last): the element
// at (per-row) position `pos` of the sorted row, and its original index.
V pick_sorted(Builder& b, Value x, int64_t dim, Value pos, bool keepdim) {
  Value idx;
  Value v = b.sort_dim(x, dim, false, &idx);
  Shape one = x.shape();
  one[dim] = 1;
  Value p = b.broadcast_to(b.reshape(pos, pos.rank() == x.rank() ? pos.shape() : one), one);
  Value val = b.take_along(v, p, dim), ind = b.take_along(idx, p, dim);
  if (!keepdim) {
    Shape s;
    for (int64_t i = 0; i < x.rank(); ++i)
      if (i != dim) s.push_back(x.shape()[i]);
    val = b.reshape(val, s);
    ind = b.reshape(ind, s);
  }
  return {val, ind};
}

// whether each row along dim holds a NaN, and where the first one is (keepdim shape)
std::pair<Value, Value> first_nan(Builder& b, Value x, int64_t dim) {
  Value nan = b.compare(x, x, hlo::Cmp::NE);
  Value pos = b.select(nan, b.iota(DType::S64, x.shape(), dim), b.constant_int(INT64_MAX, DType::S64, x.shape()));
  Value first = b.reduce(pos, b.constant_int(INT64_MAX, DType::S64), {dim}, op::minimum);
  Shape one = x.shape();
  one[dim] = 1;
  first = b.reshape(first, one);
  return {b.compare(first, b.constant_int(INT64_MAX, DType::S64, one), hlo::Cmp::NE), first};
}

// kthvalue(x, k, dim, keepdim) = the k-th smallest along dim and its index
V lower_kthvalue(Ctx& c) {
  Builder& b = c.b;
  Value x = c.in(0);
  if (x.rank() == 0) return {x, b.constant_int(0, DType::S64)};
  int64_t dim = wrap_dim(c.int_or(2, -1), x.rank());
  Shape one = x.shape();
  one[dim] = 1;
  return pick_sorted(b, x, dim, b.constant_int(c.int_(1) - 1, DType::S64, one), c.flag_or(3, false));
}

// median(x, dim, keepdim) = the lower median along dim; a row with NaN gives NaN at its first NaN
// nanmedian: the lower median of the row's non-NaN elements
Rule median_dim(bool nan_ignoring) {
  return [nan_ignoring](Ctx& c) -> V {
    Builder& b = c.b;
    Value x = c.in(0);
    if (x.rank() == 0) return {x, b.constant_int(0, DType::S64)};
    int64_t dim = wrap_dim(c.int_(1), x.rank());
    bool keep = c.flag_or(2, false);
    int64_t n = x.shape()[dim];
    Shape one = x.shape();
    one[dim] = 1;
    if (nan_ignoring) {
      Value valid = b.convert(b.compare(x, x, hlo::Cmp::EQ), DType::S64);
      Value m = b.reshape(b.reduce(valid, b.constant_int(0, DType::S64), {dim}, op::add), one);
      // (m - 1) / 2, with m = 0 -> 0 (the row is all NaN: position 0 holds a NaN)
      Value pos = b.div(b.max(b.sub(m, b.constant_int(1, DType::S64, one)), b.zeros(DType::S64, one)),
                        b.constant_int(2, DType::S64, one));
      return pick_sorted(b, x, dim, pos, keep);
    }
    V r = pick_sorted(b, x, dim, b.constant_int((n - 1) / 2, DType::S64, one), true);
    auto [has, at] = first_nan(b, x, dim);
    Value val = b.select(has, b.broadcast_to(b.constant(NAN, x.dtype()), one), r[0]);
    Value ind = b.select(has, at, r[1]);
    if (!keep) {
      val = b.reshape(val, c.oshape(0));
      ind = b.reshape(ind, c.oshape(1));
    }
    return {val, ind};
  };
}

// median(x) / nanmedian(x) over all elements
Rule median_all(bool nan_ignoring) {
  return [nan_ignoring](Ctx& c) -> V {
    Builder& b = c.b;
    Value x = c.in(0);
    int64_t n = hlo::numel(x.shape());
    if (n == 0) return {b.constant(NAN, c.odt())};
    x = b.reshape(x, {n});
    Value pos;
    if (nan_ignoring) {
      Value m = b.reduce(b.convert(b.compare(x, x, hlo::Cmp::EQ), DType::S64), b.constant_int(0, DType::S64), {0}, op::add);
      pos = b.div(b.max(b.sub(m, b.constant_int(1, DType::S64)), b.constant_int(0, DType::S64)),
                  b.constant_int(2, DType::S64));
      return {pick_sorted(b, x, 0, b.reshape(pos, {1}), false)[0]};
    }
    Value v = pick_sorted(b, x, 0, b.constant_int((n - 1) / 2, DType::S64, {1}), false)[0];
    Value any_nan = b.reduce(b.compare(x, x, hlo::Cmp::NE), b.constant_int(0, DType::Pred), {0}, op::or_);
    return {b.select(any_nan, b.constant(NAN, x.dtype()), v)};
  };
}

// mode(x, dim, keepdim) = the smallest of the most frequent values along dim, and its last index
V lower_mode(Ctx& c) {
  Builder& b = c.b;
  Value x = c.in(0);
  if (x.rank() == 0) return {x, b.constant_int(0, DType::S64)};
  if (hlo::numel(x.shape()) == 0) return {b.zeros(c.odt(0), c.oshape(0)), b.zeros(c.odt(1), c.oshape(1))};
  int64_t dim = wrap_dim(c.int_or(1, -1), x.rank()), r = x.rank();
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < r; ++i)
    if (i != dim) perm.push_back(i);
  perm.push_back(dim);
  Value xt = b.transpose(x, perm);  // [.., n]
  int64_t n = xt.shape().back();
  Shape sq = xt.shape();
  sq.push_back(n);
  std::vector<int64_t> lead, a, bb;
  for (int64_t i = 0; i < r - 1; ++i) lead.push_back(i);
  a = lead;
  a.push_back(r - 1);
  bb = lead;
  bb.push_back(r);
  Value eq = b.compare(b.broadcast_in_dim(xt, sq, a), b.broadcast_in_dim(xt, sq, bb), hlo::Cmp::EQ);
  Value cnt = b.reduce(b.convert(eq, DType::S64), b.constant_int(0, DType::S64), {r}, op::add);  // [.., n]
  Value best = b.reduce(cnt, b.constant_int(0, DType::S64), {r - 1}, op::maximum);
  Value cand = b.compare(cnt, b.broadcast_in_dim(best, xt.shape(), lead), hlo::Cmp::EQ);
  Value v = b.reduce(b.select(cand, xt, b.broadcast_to(b.highest(x.dtype()), xt.shape())), b.highest(x.dtype()),
                     {r - 1}, op::minimum);
  Value at = b.compare(xt, b.broadcast_in_dim(v, xt.shape(), lead), hlo::Cmp::EQ);
  Value idx = b.reduce(b.select(at, b.iota(DType::S64, xt.shape(), r - 1), b.constant_int(-1, DType::S64, xt.shape())),
                       b.constant_int(-1, DType::S64), {r - 1}, op::maximum);
  return {b.reshape(v, c.oshape(0)), b.reshape(idx, c.oshape(1))};
}

// unfold_backward(g, sizes, dim, size, step): window w's element j goes back to w * step + j (summed)
V lower_unfold_backward(Ctx& c) {
  Builder& b = c.b;
  DType t = compute_type(c.odt());
  Value g = b.convert(c.in(0), t);
  const Shape& out = c.oshape();
  if (hlo::numel(out) == 0 || hlo::numel(g.shape()) == 0) return {b.zeros(c.odt(), out)};
  int64_t r = static_cast<int64_t>(out.size());
  int64_t dim = r == 0 ? 0 : wrap_dim(c.int_(2), r), size = c.int_(3), step = c.int_(4);
  if (r == 0) return {b.convert(b.reshape(g, {}), c.odt())};
  int64_t nw = g.shape()[dim], L = out[dim];
  Value acc = b.zeros(t, out);
  for (int64_t j = 0; j < size; ++j) {
    Shape st(g.rank(), 0), lim = g.shape(), one(g.rank(), 1);
    st.back() = j;
    lim.back() = j + 1;
    Value part = b.reshape(b.slice(g, st, lim, one), Shape(g.shape().begin(), g.shape().end() - 1));
    Shape lo(r, 0), hi(r, 0), in(r, 0);
    lo[dim] = j;
    in[dim] = step - 1;
    hi[dim] = L - j - ((nw - 1) * step + 1);
    Value placed = b.pad(part, b.zeros(t, {}), lo, hi, in);
    // a gradient broadcast along other dims (size 1 there; istft's window sum) spreads over them
    if (placed.shape() != out) {
      std::vector<int64_t> dims(r);
      for (int64_t d = 0; d < r; ++d) dims[d] = d;
      placed = b.broadcast_in_dim(placed, out, dims);
    }
    acc = b.add(acc, placed);
  }
  return {b.convert(acc, c.odt())};
}

// repeat(x, reps): broadcast into interleaved dims [r0, s0, r1, s1, ...] then merge
V lower_repeat(Ctx& c) {
  Builder& b = c.b;
  Value x = c.in(0);
  const auto& reps = c.ints(1);
  int64_t lead = static_cast<int64_t>(reps.size()) - x.rank();
  Shape xs(lead, 1);
  for (int64_t d : x.shape()) xs.push_back(d);
  x = b.reshape(x, xs);
  Shape big;
  std::vector<int64_t> dims;
  for (size_t i = 0; i < reps.size(); ++i) {
    big.push_back(reps[i]);
    big.push_back(xs[i]);
    dims.push_back(static_cast<int64_t>(2 * i + 1));
  }
  return {b.reshape(b.broadcast_in_dim(x, big, dims), c.oshape())};
}

// arange(start, end, step) = start + i * step (the count comes from Meta)
V lower_arange_start_out(Ctx& c) {
  Builder& b = c.b;
  DType t = compute_type(c.odt());
  const Shape& s = c.oshape();
  Value i = b.convert(b.iota(DType::S64, s, 0), t);
  Value r = b.add(b.broadcast_to(c.scalar(0, t), s), b.mul(i, b.broadcast_to(c.scalar(2, t), s)));
  return {b.convert(r, c.odt())};
}

// eye(n, m) = (row == col)
V lower_eye(Ctx& c) {
  const Shape& s = c.oshape();
  Value eq = c.b.compare(c.b.iota(DType::S64, s, 0), c.b.iota(DType::S64, s, 1), hlo::Cmp::EQ);
  return {c.b.convert(eq, c.odt())};
}

// triu_indices / tril_indices(row, col, offset): coordinates listed on the host
Rule tri_indices(bool upper) {
  return [upper](Ctx& c) -> V {
    int64_t rows = c.int_(0), cols = c.int_(1), off = c.int_or(2, 0);
    std::vector<int64_t> rr, cc;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        if (upper ? j - i >= off : j - i <= off) {
          rr.push_back(i);
          cc.push_back(j);
        }
    int64_t n = static_cast<int64_t>(rr.size());
    rr.insert(rr.end(), cc.begin(), cc.end());
    return {c.b.reshape(c.b.constant_array(rr, c.odt()), {2, n})};
  };
}

// linspace(start, end, steps) = start + i * (end - start) / (steps - 1)
V lower_linspace_out(Ctx& c) {
  Builder& b = c.b;
  DType t = compute_type(c.odt());
  if (!hlo::is_float(t)) t = DType::F32;
  const Shape& s = c.oshape();
  int64_t n = s.empty() ? 1 : s[0];
  Value lo = c.scalar(0, t), hi = c.scalar(1, t);
  Value step = b.div(b.sub(hi, lo), b.constant(static_cast<double>(std::max<int64_t>(n - 1, 1)), t));
  Value i = b.convert(b.iota(DType::S64, s, 0), t);
  return {b.convert(b.add(b.broadcast_to(lo, s), b.mul(i, b.broadcast_to(step, s))), c.odt())};
}
}  // namespace

void register_shape() {
  const std::pair<const char*, Rule> rules[] = {
      // copy(self, src) = src broadcast to self, in self's dtype
      {"aten::copy", [](Ctx& c) -> V { return {c.in_out(1, c.odt())}; }},
      {"aten::cat", lower_cat},
      {"aten::constant_pad_nd", lower_constant_pad_nd},
      {"aten::narrow_copy", lower_narrow_copy},
      {"aten::flip", lower_flip},
      {"aten::channel_shuffle", lower_channel_shuffle},
      {"aten::roll", lower_roll},
      {"aten::sort.stable", lower_sort_stable},
      {"aten::topk", lower_topk},
      // order statistics (a stable sort, NaN last)
      {"aten::kthvalue", lower_kthvalue},
      {"aten::median.dim", median_dim(false)},
      {"aten::nanmedian.dim", median_dim(true)},
      {"aten::median", median_all(false)},
      {"aten::nanmedian", median_all(true)},
      {"aten::mode", lower_mode},
      {"aten::unfold_backward", lower_unfold_backward},
      {"aten::tril", triangle(true)},
      {"aten::triu", triangle(false)},
      {"aten::repeat", lower_repeat},
      // tensor factories
      {"aten::arange.start_out", lower_arange_start_out},
      {"aten::eye.out", lower_eye},
      {"aten::eye.m_out", lower_eye},
      {"aten::triu_indices", tri_indices(true)},
      {"aten::tril_indices", tri_indices(false)},
      {"aten::linspace.out", lower_linspace_out},
  };
  for (auto& [name, rule] : rules) add_rule(name, rule);
}

}  // namespace tt::lower
