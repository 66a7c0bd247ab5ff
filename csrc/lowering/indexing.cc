// Indexing/scatter family: index_select, gather, scatter(_add), index (advanced
// indexing), index_put, index_add, embedding backward.
// Negative indices wrap as in PyTorch where it allows them. Out-of-range
// indices are checked on the device (Env::check: the next host sync raises
// CPU's error); the program itself clamps them (StableHLO gather semantics).
#include <cmath>
#include <functional>
#include <tuple>

#include "lowering/lowering.h"

namespace tt::lower {
namespace {
using V = std::vector<Value>;

// idx + size where idx < 0
Value wrap_index(Builder& b, Value idx, const Extent& size) {
  idx = b.convert(idx, DType::S64);
  Value zero = b.zeros(DType::S64, idx.shape());
  Value n = size.as(b, idx.shape());
  return b.select(b.compare(idx, zero, hlo::Cmp::LT), b.add(idx, n), idx);
}

// CPU's message for an index out of range along a dimension ("{}": the index)
std::string oob(int64_t dim, const Extent& size) { return index_oob(dim, size); }
const char* kOutOfRange = "index out of range in self";

// A 0-dim x (and its 0-dim source) as 1-element vectors; true when lifted
bool lift_0d(Builder& b, Value& x, Value& src) {
  if (x.rank() != 0) return false;
  x = b.reshape(x, {1});
  src = b.reshape(src, {1});
  return true;
}

// Full coordinates for torch.gather/scatter style indexing: [numel(idx), rank]
Value coords_along(Builder& b, Value idx, int64_t dim, int64_t rank) {
  Shape s = idx.shape();
  int64_t n = hlo::numel(s);
  std::vector<Value> comps;
  for (int64_t d = 0; d < rank; ++d) {
    Value comp = d == dim ? idx : b.iota(DType::S64, s, d);
    comps.push_back(b.reshape(comp, {n, 1}));
  }
  return b.concatenate(comps, 1);
}

// scatter(self, dim, index, src|value, reduce?) with replace or add
V scatter_along(Ctx& c, bool add, bool src_is_tensor) {
  Builder& b = c.b;
  Value x = b.convert(c.in(0), c.odt());
  int64_t dim = wrap_dim(c.int_(1), x.rank());
  Value idx = c.in(2);
  if (hlo::numel(idx.shape()) == 0) return {x};
  if (x.rank() == 0) {
    x = b.reshape(x, {1});
    idx = b.reshape(idx, {1});
  }
  Extent size(b, x, dim);
  check_range(c, idx, 0, size, false, oob(dim, size));
  idx = wrap_index(b, idx, size);
  int64_t n = hlo::numel(idx.shape());
  Value upd;
  if (src_is_tensor) {
    Value src = b.convert(c.in(3), c.odt());
    if (src.rank() == 0) src = b.reshape(src, Shape(idx.rank(), 1));
    Shape lim = idx.shape();
    upd = b.slice(b.broadcast_to(src, src.shape()), Shape(idx.rank(), 0), lim, Shape(idx.rank(), 1));
  } else {
    upd = b.broadcast_to(c.scalar(3, c.odt()), idx.shape());
  }
  std::string reduce = c.nargs() > 4 && c.has(4) ? c.str(4) : "";
  if (reduce == "add" || reduce == "sum") add = true;
  else if (!reduce.empty()) throw Unsupported("scatter reduce=" + reduce);
  std::vector<int64_t> all;
  for (int64_t d = 0; d < x.rank(); ++d) all.push_back(d);
  Value out = b.scatter(x, coords_along(b, idx, dim, x.rank()), b.reshape(upd, {n}), all, add ? std::optional(op::add) : std::nullopt);
  return {b.reshape(out, c.oshape())};
}

struct Advanced {
  std::vector<int64_t> dims;  // indexed dims of self
  Value coords;               // [bshape..., dims.size()] (no dims merged: a dynamic one stays whole)
  Shape bshape;               // broadcast index shape
  bool adjacent;              // indexed dims consecutive: result dims go at dims[0]
};

// Broadcasts the non-None index tensors of Tensor?[] `indices` (bool masks are
// not handled here: they have data-dependent shapes).
Advanced advanced(Ctx& c, Value x, const std::vector<Value>& indices) {
  Builder& b = c.b;
  Advanced a;
  std::vector<Value> idx;
  for (size_t d = 0; d < indices.size(); ++d) {
    if (!indices[d].valid()) continue;
    if (indices[d].dtype() == DType::Pred || indices[d].dtype() == DType::U8)
      throw Unsupported("boolean mask indexing");
    a.dims.push_back(static_cast<int64_t>(d));
    idx.push_back(indices[d]);
  }
  for (auto& v : idx) {  // broadcast shape
    const Shape& s = v.shape();
    if (s.size() > a.bshape.size()) a.bshape.insert(a.bshape.begin(), s.size() - a.bshape.size(), 1);
    for (size_t i = 0; i < s.size(); ++i) {
      size_t j = a.bshape.size() - s.size() + i;
      if (s[i] != 1) a.bshape[j] = s[i];
    }
  }
  a.adjacent = true;
  for (size_t i = 1; i < a.dims.size(); ++i) a.adjacent &= a.dims[i] == a.dims[i - 1] + 1;
  Shape cshape = a.bshape;
  cshape.push_back(1);
  std::vector<int64_t> keep = all_dims(static_cast<int64_t>(a.bshape.size()));
  std::vector<Value> comps;
  for (size_t i = 0; i < idx.size(); ++i) {
    Extent size(b, x, a.dims[i]);
    check_range(c, idx[i], size.negated(b), size, true, oob(static_cast<int64_t>(i), size));  // CPU numbers the index tensors
    Value w = wrap_index(b, b.broadcast_to(idx[i], a.bshape), size);
    comps.push_back(b.broadcast_in_dim(w, cshape, keep));
  }
  a.coords = b.concatenate(comps, static_cast<int64_t>(a.bshape.size()));
  return a;
}

// Shape of x[indices]: batch dims B at dims[0] when adjacent, else in front.
void index_layout(const Value& x, const Advanced& a, Shape* out, std::vector<int64_t>* offset_dims,
                  Shape* rest);

// x[indices] as an Advanced description plus the result layout.
struct Indexed {
  Advanced a;
  Shape out, rest;
  std::vector<int64_t> offset_dims;
};
Indexed indexed(Ctx& c, Value x) {
  Indexed r;
  r.a = advanced(c, x, c.list(1));
  index_layout(x, r.a, &r.out, &r.offset_dims, &r.rest);
  return r;
}

void index_layout(const Value& x, const Advanced& a, Shape* out, std::vector<int64_t>* offset_dims,
                  Shape* rest) {
  auto indexed = [&](int64_t d) {
    for (int64_t e : a.dims) if (e == d) return true;
    return false;
  };
  int64_t pos = 0;
  bool placed = false;
  for (int64_t d = 0; d < x.rank(); ++d) {
    if (indexed(d)) {
      if (!placed && a.adjacent) {
        for (int64_t s : a.bshape) out->push_back(s);
        pos += static_cast<int64_t>(a.bshape.size());
        placed = true;
      }
      continue;
    }
    rest->push_back(x.shape()[d]);
    offset_dims->push_back(pos + (a.adjacent ? 0 : static_cast<int64_t>(a.bshape.size())));
    out->push_back(x.shape()[d]);
    ++pos;
  }
  if (!a.adjacent) out->insert(out->begin(), a.bshape.begin(), a.bshape.end());
}

// x with src[i...] reduced into x[i with dim -> idx[i...]...] (torch.scatter_reduce
// semantics; idx has src's shape): sum | prod | mean | amax | amin
V reduce_into(Ctx& c, Value x, int64_t dim, Value idx, Value src, const std::string& red, bool include_self) {
  Builder& b = c.b;
  DType t = x.dtype();
  idx = wrap_index(b, idx, Extent(b, x, dim));
  int64_t n = hlo::numel(idx.shape());
  std::vector<int64_t> all;
  for (int64_t d = 0; d < x.rank(); ++d) all.push_back(d);
  Value coords = coords_along(b, idx, dim, x.rank());
  Value upd = b.reshape(src, {n});
  // how many updates each position receives
  Value count = b.scatter(b.zeros(t, x.shape()), coords, b.constant(1, t, {n}), all, op::add);
  Value hit = b.compare(count, b.zeros(t, x.shape()), hlo::Cmp::GT);
  auto base = [&](Value neutral) { return include_self ? x : b.select(hit, neutral, x); };
  if (red == "sum" || red == "mean") {
    Value s = b.scatter(base(b.zeros(t, x.shape())), coords, upd, all, op::add);
    if (red == "sum") return {s};
    Value cnt = include_self ? b.add(count, b.constant(1, t, x.shape())) : b.max(count, b.constant(1, t, x.shape()));
    Value m = b.div(s, cnt);
    if (hlo::is_int(t)) {  // PyTorch floors integer means
      Value r = b.binary(op::remainder, s, cnt);
      Value adj = b.binary(op::and_, b.compare(r, b.zeros(t, r.shape()), hlo::Cmp::NE),
                           b.compare(s, b.zeros(t, s.shape()), hlo::Cmp::LT));
      m = b.select(adj, b.sub(m, b.constant(1, t, m.shape())), m);
    }
    return {b.select(hit, m, x)};
  }
  if (red == "prod") return {b.scatter(base(b.constant(1, t, x.shape())), coords, upd, all, op::multiply)};
  if (red == "amax")
    return {b.scatter(base(b.broadcast_to(b.lowest(t), x.shape())), coords, upd, all, op::maximum)};
  if (red == "amin")
    return {b.scatter(base(b.broadcast_to(b.highest(t), x.shape())), coords, upd, all, op::minimum)};
  throw Unsupported("scatter_reduce reduce=" + red);
}

// scatter_reduce(self, dim, index, src, reduce, include_self)
V scatter_reduce(Ctx& c) {
  Builder& b = c.b;
  Value x = b.convert(c.in(0), c.odt());
  if (x.rank() == 0) throw Unsupported("scatter_reduce on a 0-dim tensor");
  int64_t dim = wrap_dim(c.int_(1), x.rank());
  Value idx = c.in(2);
  if (hlo::numel(idx.shape()) == 0) return {x};
  Value src = b.slice(b.convert(c.in(3), x.dtype()), Shape(idx.rank(), 0), idx.shape(), Shape(idx.rank(), 1));
  Extent size(b, x, dim);
  check_range(c, idx, 0, size, false, oob(dim, size));
  return reduce_into(c, x, dim, idx, src, c.str(4), c.flag_or(5, true));
}

// index_fill / index_copy: x with the slices at idx along dim replaced by src
// (src already shaped like those slices: x.shape with dim -> len(idx))
Value put_slices(Builder& b, Value x, int64_t dim, Value idx, Value src) {
  idx = wrap_index(b, b.reshape(idx, {hlo::numel(idx.shape())}), Extent(b, x, dim));
  Value full = b.broadcast_in_dim(idx, src.shape(), {dim});
  std::vector<int64_t> all;
  for (int64_t d = 0; d < x.rank(); ++d) all.push_back(d);
  int64_t n = hlo::numel(src.shape());
  return b.scatter(x, coords_along(b, full, dim, x.rank()), b.reshape(src, {n}), all, std::nullopt);
}

// x(0) with its slices at idx(2) along dim(1) replaced by slices(dtype, their shape)
// (indices outside [lo * size, size) fail the device check with `prefix` + CPU's message)
V replace_slices(Ctx& c, int64_t lo, const std::string& prefix, const std::function<Value(DType, const Shape&)>& slices) {
  Builder& b = c.b;
  Value x = b.convert(c.in(0), c.odt());
  Value idx = c.in(2);
  if (hlo::numel(idx.shape()) == 0) return {x};
  bool scalar0 = x.rank() == 0;
  if (scalar0) x = b.reshape(x, {1});
  int64_t dim = wrap_dim(c.int_(1), x.rank());
  Extent size(b, x, dim);
  check_range(c, idx, lo == 0 ? Extent(0) : size.negated(b), size, true, prefix + oob(dim, size));
  Shape s = x.shape();
  s[dim] = hlo::numel(idx.shape());
  Value out = put_slices(b, x, dim, idx, slices(x.dtype(), s));
  return {scalar0 ? b.reshape(out, {}) : out};
}


// ---- histograms
// bins + 1 edges from lo to hi (scalars), computed from both ends as PyTorch's linspace does
Value linear_edges(Builder& b, Value lo, Value hi, int64_t bins, DType t) {
  Shape s{bins + 1};
  Value step = b.div(b.sub(hi, lo), b.constant(static_cast<double>(bins), t));
  Value i = b.iota(DType::S64, s, 0);
  Value fi = b.convert(i, t);
  Value from_lo = b.add(b.broadcast_to(lo, s), b.mul(fi, b.broadcast_to(step, s)));
  Value from_hi = b.sub(b.broadcast_to(hi, s),
                        b.mul(b.sub(b.constant(static_cast<double>(bins), t, s), fi), b.broadcast_to(step, s)));
  Value first_half = b.compare(i, b.constant_int((bins + 1) / 2, DType::S64, s), hlo::Cmp::LT);
  return b.select(first_half, from_lo, from_hi);
}

// counts (or weight sums) of flat x per bin of `edges` [bins + 1]; values outside
// [edges[0], edges[bins]] (and NaN) are not counted. linear: equal-width bins
// (the bin computed, then corrected against the edges), else a count of edges <= x.
Value bin_counts(Builder& b, Value x, Value w, Value edges, int64_t bins, bool linear) {
  DType t = edges.dtype();
  int64_t n = hlo::numel(x.shape());
  Value xf = b.reshape(b.convert(x, t), {n});
  Shape s{n};
  Value e0 = b.broadcast_to(b.reshape(b.slice(edges, {0}, {1}, {1}), {}), s);
  Value eL = b.broadcast_to(b.reshape(b.slice(edges, {bins}, {bins + 1}, {1}), {}), s);
  Value inr = b.binary(op::and_, b.compare(xf, e0, hlo::Cmp::GE), b.compare(xf, eL, hlo::Cmp::LE));
  Value pos;
  if (linear && hlo::is_int(t)) {
    // integers are binned as CUDA bins them: (x - lo) * bins / (hi - lo) in 64-bit integers
    // (truncating; x >= lo in range), the top edge in the last bin (CPU has no integer histc)
    auto wide = [&](Value v) { return b.convert(v, DType::S64); };
    Value q = b.div(b.mul(b.sub(wide(xf), wide(e0)), b.constant_int(bins, DType::S64, s)), b.sub(wide(eL), wide(e0)));
    pos = b.clamp(b.zeros(DType::S64, s), b.select(inr, q, b.zeros(DType::S64, s)),
                  b.constant_int(bins - 1, DType::S64, s));
  } else if (linear) {
    Value f = b.unary(op::floor, b.div(b.mul(b.sub(xf, e0), b.constant(static_cast<double>(bins), t, s)), b.sub(eL, e0)));
    f = b.select(inr, f, b.zeros(t, s));
    pos = b.clamp(b.zeros(DType::S64, s), b.convert(f, DType::S64), b.constant_int(bins - 1, DType::S64, s));
    Value lo = b.take(edges, pos, 0), hi = b.take(edges, b.add(pos, b.constant_int(1, DType::S64, s)), 0);
    Value down = b.binary(op::and_, b.compare(xf, lo, hlo::Cmp::LT), b.compare(pos, b.zeros(DType::S64, s), hlo::Cmp::GT));
    Value up = b.binary(op::and_, b.compare(xf, hi, hlo::Cmp::GE),
                        b.compare(pos, b.constant_int(bins - 1, DType::S64, s), hlo::Cmp::LT));
    Value one = b.constant_int(1, DType::S64, s);
    pos = b.select(down, b.sub(pos, one), b.select(up, b.add(pos, one), pos));
  } else if (bins > 1) {
    Value inner = b.slice(edges, {1}, {bins}, {1});  // edges[1 .. bins-1]
    Value ge = b.compare(b.broadcast_in_dim(xf, {n, bins - 1}, {0}), b.broadcast_in_dim(inner, {n, bins - 1}, {1}),
                         hlo::Cmp::GE);
    pos = b.reduce(b.convert(ge, DType::S64), b.constant_int(0, DType::S64), {1}, op::add);
  } else {
    pos = b.zeros(DType::S64, s);
  }
  Value slot = b.select(inr, pos, b.constant_int(bins, DType::S64, s));
  Value upd = w.valid() ? b.reshape(b.convert(w, t), {n}) : b.constant(1, t, s);
  Value h = b.scatter(b.zeros(t, {bins + 1}), b.reshape(slot, {n, 1}), upd, {0}, op::add);
  return b.slice(h, {0}, {bins}, {1});
}

// the data's [min, max] (scalars), widened by 0.5 each way where they are equal
std::pair<Value, Value> data_range(Builder& b, Value x, DType t) {
  int64_t n = hlo::numel(x.shape());
  Value xf = b.reshape(b.convert(x, t), {n});
  Value lo = b.reduce(xf, b.highest(t), {0}, op::minimum), hi = b.reduce(xf, b.lowest(t), {0}, op::maximum);
  Value same = b.compare(lo, hi, hlo::Cmp::EQ);
  Value half = b.constant(0.5, t);
  return {b.select(same, b.sub(lo, half), lo), b.select(same, b.add(hi, half), hi)};
}

Value density(Builder& b, Value h, Value edges, int64_t bins) {
  Value width = b.sub(b.slice(edges, {1}, {bins + 1}, {1}), b.slice(edges, {0}, {bins}, {1}));
  Value total = b.broadcast_to(b.reduce(h, b.zeros(h.dtype(), {}), {0}, op::add), {bins});
  return b.div(h, b.mul(total, width));
}
}  // namespace

// The rank of each element of a flat mask among the true ones (0-based; an
// inclusive running count minus one), as int64.
Value true_rank(Builder& b, Value flat_mask) {
  int64_t n = flat_mask.shape()[0];
  Value ones = b.convert(flat_mask, DType::S64);
  Value run = b.reduce_window(ones, b.constant_int(0, DType::S64), {n}, {1}, {{n - 1, 0}}, op::add);
  return b.sub(run, b.constant_int(1, DType::S64, {n}));
}

// ---- rules (the same anonymous namespace, reopened: they use true_rank above)
namespace {
// masked_scatter(x, m, src) = where(m, src.flat[rank of the element among m's true ones], x)
// (a source with fewer elements than m has true ones fails the device check, as CPU raises)
V lower_masked_scatter(Ctx& c) {
  if (c.in(1).dtype() != DType::Pred) throw UserError("masked_scatter_ only supports boolean masks");
  Builder& b = c.b;
  const Shape& s = c.oshape();
  int64_t n = hlo::numel(s);
  if (n == 0) return {c.in_out(0, c.odt())};
  Value m = b.reshape(b.broadcast_to(b.convert(c.in(1), DType::Pred), s), {n});
  Value src = c.in(2);
  int64_t ns = hlo::numel(src.shape());
  Value ones = b.reduce(b.convert(m, DType::S64), b.constant_int(0, DType::S64), {0}, op::add);
  check_range(c, ones, 0, ns + 1, false, "Number of elements of source < number of ones in mask");
  if (ns == 0) return {c.in_out(0, c.odt())};
  Value pos = b.clamp(b.constant_int(0, DType::S64, {n}), true_rank(b, m), b.constant_int(ns - 1, DType::S64, {n}));
  Value taken = b.take(b.reshape(b.convert(src, c.odt()), {ns}), pos, 0);
  return {b.reshape(b.select(m, taken, b.reshape(c.in_out(0, c.odt()), {n})), s)};
}
// masked_scatter_backward(g, m, sizes) = g's elements where m, in order, zero-padded to `sizes`
V lower_masked_scatter_backward(Ctx& c) {
  Builder& b = c.b;
  Value g = c.in(0);
  int64_t n = hlo::numel(g.shape()), ns = hlo::numel(c.oshape());
  if (n == 0 || ns == 0) return {b.zeros(c.odt(), c.oshape())};
  Value m = b.reshape(b.broadcast_to(b.convert(c.in(1), DType::Pred), g.shape()), {n});
  Value rank = true_rank(b, m);
  // false elements, and true ones past the end, go to a spare slot ns
  Value keep = b.select(m, b.compare(rank, b.constant_int(ns, DType::S64, {n}), hlo::Cmp::LT),
                        b.constant_int(0, DType::Pred, {n}));
  Value slot = b.select(keep, rank, b.constant_int(ns, DType::S64, {n}));
  Value out = b.scatter(b.zeros(c.odt(), {ns + 1}), b.reshape(slot, {n, 1}),
                        b.reshape(b.convert(g, c.odt()), {n}), {0}, op::add);
  return {b.reshape(b.slice(out, {0}, {ns}, {1}), c.oshape())};
}
V lower_index_select(Ctx& c) {
  Value x = c.in(0);
  if (x.rank() == 0) return {c.b.reshape(x, c.oshape())};
  int64_t dim = wrap_dim(c.int_(1), x.rank());
  Extent size(c.b, x, dim);
  check_range(c, c.in(2), 0, size, true, kOutOfRange);
  Value idx = wrap_index(c.b, c.in(2), size);
  return {c.b.reshape(c.b.take(x, idx, dim), c.oshape())};
}
// gather(x, dim, idx): out[i...] = x[..., idx[i...], ...]
V lower_gather(Ctx& c) {
  Value x = c.in(0);
  if (x.rank() == 0) return {c.b.reshape(x, c.oshape())};
  int64_t dim = wrap_dim(c.int_(1), x.rank());
  Extent size(c.b, x, dim);
  check_range(c, c.in(2), 0, size, false, oob(dim, size));
  Value idx = wrap_index(c.b, c.in(2), size);
  return {c.b.take_along(x, idx, dim)};
}
// index(x, indices): advanced indexing as one gather
V lower_index(Ctx& c) {
  Builder& b = c.b;
  Value x = c.in(0);
  auto [a, out, rest, offset_dims] = indexed(c, x);
  Shape sizes = x.shape();
  for (int64_t d : a.dims) {
    // any index into an empty dim is out of range (CPU: IndexError); an empty result never gets here
    if (sizes[d] == 0) throw UserError("index is out of bounds for dimension with size 0");
    sizes[d] = 1;
  }
  Value coords = a.coords;
  std::string attrs = "dimension_numbers = #stablehlo.gather<" +
                      (offset_dims.empty() ? std::string() : "offset_dims = [" + hlo::join(offset_dims) + "], ") +
                      "collapsed_slice_dims = [" + hlo::join(a.dims) + "], start_index_map = [" +
                      hlo::join(a.dims) + "], index_vector_dim = " + std::to_string(a.bshape.size()) +
                      ">, slice_sizes = " + hlo::i64_array(sizes) + ", indices_are_sorted = false";
  return {b.emit("gather", {x, coords}, Type{x.dtype(), out}, attrs)};
}
// index_put(x, indices, values, accumulate): scatter of values broadcast to x[indices]
V lower_index_put(Ctx& c) {
  Builder& b = c.b;
  Value x = c.in(0);
  auto [a, out, rest, offset_dims] = indexed(c, x);
  Value vals = b.broadcast_to(b.convert(c.in(2), x.dtype()), out);
  // move batch dims to the front: [B..., rest...]
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < static_cast<int64_t>(out.size()); ++i) {
    bool is_off = false;
    for (int64_t o : offset_dims) is_off |= o == i;
    if (!is_off) perm.push_back(i);
  }
  for (int64_t o : offset_dims) perm.push_back(o);
  vals = b.transpose(vals, perm);
  Shape us{hlo::numel(a.bshape)};
  for (int64_t s : rest) us.push_back(s);
  vals = b.reshape(vals, us);
  bool acc = c.flag_or(3, false);
  Value coords = b.reshape(a.coords, {hlo::numel(a.bshape), static_cast<int64_t>(a.dims.size())});
  return {b.scatter(x, coords, vals, a.dims, acc ? std::optional(op::add) : std::nullopt)};
}
// index_add(x, dim, idx, src, alpha) = x with x[.., idx[i], ..] += alpha * src[.., i, ..]
V lower_index_add(Ctx& c) {
  Builder& b = c.b;
  Value x = c.in(0);
  Value src = b.convert(c.in(3), x.dtype());
  bool scalar0 = lift_0d(b, x, src);
  int64_t dim = wrap_dim(c.int_(1), x.rank());
  Extent size(b, x, dim);
  check_range(c, c.in(2), 0, size, true, kOutOfRange);
  Value idx = wrap_index(b, b.reshape(c.in(2), {hlo::numel(c.in(2).shape())}), size);
  if (c.has(4) && !c.num_is(4, 1.0)) src = b.mul(src, b.broadcast_to(c.scalar(4, x.dtype()), src.shape()));
  std::vector<int64_t> perm{dim};
  for (int64_t d = 0; d < x.rank(); ++d)
    if (d != dim) perm.push_back(d);
  src = b.transpose(src, perm);
  int64_t n = hlo::numel(idx.shape());
  Value out = b.scatter(x, b.reshape(idx, {n, 1}), src, {dim}, op::add);
  return {scalar0 ? b.reshape(out, {}) : out};
}
// index_reduce(x, dim, idx, src, reduce, include_self) = scatter_reduce with idx spread over src's slices
V lower_index_reduce(Ctx& c) {
  Builder& b = c.b;
  Value x = b.convert(c.in(0), c.odt());
  Value idx = c.in(2);
  if (hlo::numel(idx.shape()) == 0) return {x};
  Value src = b.convert(c.in(3), x.dtype());
  bool scalar0 = lift_0d(b, x, src);
  int64_t dim = wrap_dim(c.int_(1), x.rank());
  check_range(c, idx, 0, Extent(b, x, dim), true, kOutOfRange);
  Value full = b.broadcast_in_dim(b.reshape(idx, {hlo::numel(idx.shape())}), src.shape(), {dim});
  Value out = reduce_into(c, x, dim, full, src, c.str(4), c.flag_or(5, true))[0];
  return {scalar0 ? b.reshape(out, {}) : out};
}
// index_fill(x, dim, idx, v) = x with x[.., idx[i], ..] = v
V lower_index_fill(Ctx& c) {
  return replace_slices(c, -1, "", [&](DType t, const Shape& s) { return c.b.broadcast_to(c.scalar(3, t), s); });
}
// index_copy(x, dim, idx, src) = x with x[.., idx[i], ..] = src[.., i, ..]
V lower_index_copy(Ctx& c) {
  return replace_slices(c, 0, "index_copy_(): ",
                        [&](DType t, const Shape& s) { return c.b.reshape(c.b.convert(c.in(3), t), s); });
}
// take(x, idx) = x.flatten()[idx]
V lower_take(Ctx& c) {
  Builder& b = c.b;
  Value x = c.in(0);
  int64_t n = hlo::numel(x.shape());
  if (n == 0) return {b.zeros(c.odt(), c.oshape())};
  std::string msg = "out of range: tried to access index {} on a tensor of " + std::to_string(n) + " elements.";
  check_range(c, c.in(1), -n, n, true, msg);
  Value idx = wrap_index(b, c.in(1), n);
  return {b.reshape(b.take(b.reshape(x, {n}), b.reshape(idx, {hlo::numel(idx.shape())}), 0), c.oshape())};
}
// put(x, idx, src, accumulate) = x with x.flatten()[idx] = (or +=) src
V lower_put(Ctx& c) {
  Builder& b = c.b;
  Value x = b.convert(c.in(0), c.odt());
  int64_t n = hlo::numel(x.shape()), k = hlo::numel(c.in(1).shape());
  if (n == 0 || k == 0) return {x};
  std::string msg = "out of range: tried to access index {} on a tensor of " + std::to_string(n) + " elements.";
  check_range(c, c.in(1), -n, n, true, msg);
  Value idx = b.reshape(wrap_index(b, c.in(1), n), {k, 1});
  Value src = b.reshape(b.convert(c.in(2), x.dtype()), {k});
  Value out = b.scatter(b.reshape(x, {n}), idx, src, {0}, c.flag_or(3, false) ? std::optional(op::add) : std::nullopt);
  return {b.reshape(out, x.shape())};
}
// searchsorted(seq, v, out_int32, right, side, sorter): CPU's binary search, unrolled
// (floor(log2 M) + 1 halvings of [start, end) per element): left moves start past
// mid while !(seq[mid] >= v), right while !(seq[mid] > v), so NaN values and NaN
// boundaries land where CPU puts them (a count of seq < v put NaN at 0)
Value search(Ctx& c, Value seq, Value v, bool right) {
  Builder& b = c.b;
  bool i32 = c.flag_or(2, false);  // out_int32 (both ops); an out= tensor of another dtype: CPU's error
  if (c.odt() != (i32 ? DType::S32 : DType::S64))
    throw UserError(std::string("torch.searchsorted(): output tensor's dtype is wrong, it can only be Int(int32) or "
                                "Long(int64) depending on whether out_int32 flag is True, but we got output tensor's "
                                "dtype ") + torch_dtype_name(c.odt()) + " and out_int32 flag is " + (i32 ? "True" : "False"));
  DType t = promote(seq.dtype(), v.dtype());
  seq = b.convert(seq, t);
  v = b.convert(v, t);
  int64_t m = seq.shape().back();
  Shape vshape = v.shape();
  if (m == 0 || hlo::numel(vshape) == 0) return b.zeros(c.odt(), vshape);
  if (seq.rank() == 1) v = b.reshape(v, {hlo::numel(vshape)});  // every value against the one row
  Value lo = b.zeros(DType::S64, v.shape()), hi = b.constant_int(m, DType::S64, v.shape());
  Value one = b.constant_int(1, DType::S64, v.shape());
  int steps = 1;
  while ((int64_t{1} << steps) <= m) ++steps;
  for (int i = 0; i < steps; ++i) {
    Value active = b.compare(lo, hi, hlo::Cmp::LT);
    Value mid = b.add(lo, b.binary(op::shift_right_logical, b.sub(hi, lo), one));
    Value at = b.take_along(seq, b.min(mid, b.constant_int(m - 1, DType::S64, v.shape())), seq.rank() - 1);
    Value below = b.compare(at, v, right ? hlo::Cmp::GT : hlo::Cmp::GE);  // false for NaN on either side
    Value go_right = b.binary(op::and_, active, b.unary(op::not_, below));
    Value go_left = b.binary(op::and_, active, below);
    lo = b.select(go_right, b.add(mid, one), lo);
    hi = b.select(go_left, mid, hi);
  }
  return b.convert(b.reshape(lo, vshape), c.odt());
}
V lower_searchsorted(Ctx& c) {
  Value seq = c.in(0);
  if (c.has(5)) {  // sorter: CPU's checks (its dtype and shape, then each index)
    Value sorter = c.in(5);
    if (sorter.dtype() != DType::S64 || sorter.shape() != seq.shape())
      throw UserError("torch.searchsorted(): sorter must be an int64 tensor of the boundaries' shape");
    check_range(c, sorter, 0, seq.shape().empty() ? 1 : seq.shape().back(), false,
                "torch.searchsorted(): sorter index out of range");
    seq = c.b.take_along(seq, sorter, seq.rank() - 1);
  }
  if (c.has(4) && c.str(4) != "left" && c.str(4) != "right")
    throw UserError("torch.searchsorted(): side can only be 'left' or 'right' but got " + c.str(4));
  if (c.has(4) && c.str(4) == "left" && c.flag_or(3, false))
    throw UserError("torch.searchsorted(): side and right can't be set to opposites, got side of left while right was True");
  bool right = c.flag_or(3, false) || (c.has(4) && c.str(4) == "right");
  return {search(c, seq, c.in(1), right)};
}
V lower_bucketize(Ctx& c) {
  if (c.in(1).rank() != 1) throw UserError("boundaries tensor must be 1 dimension");
  return {search(c, c.in(1), c.in(0), c.flag_or(3, false))};
}
// histc(x, bins, min, max): counts over equal-width bins of [min, max] (the data's range when min == max)
V lower_histc(Ctx& c) {
  Builder& b = c.b;
  DType t = compute_type(c.odt());
  Value x = c.in(0);
  int64_t bins = c.int_or(1, 100);
  if (hlo::numel(x.shape()) == 0) return {b.zeros(c.odt(), c.oshape())};
  Value lo, hi;
  if (c.num_or(2, 0) == c.num_or(3, 0)) {
    std::tie(lo, hi) = data_range(b, x, t);
    if (hlo::is_float(t)) {  // data with inf or NaN: CPU's error, naming the data's range
      int64_t n = hlo::numel(x.shape());
      Value xf = b.convert(b.reshape(x, {n}), DType::F32);
      Value nan = b.reduce(b.compare(xf, xf, hlo::Cmp::NE), b.constant_int(0, DType::Pred), {0}, op::or_);
      Value mn = b.reduce(xf, b.highest(DType::F32), {0}, op::minimum), mx = b.reduce(xf, b.lowest(DType::F32), {0}, op::maximum);
      mn = b.select(nan, b.constant(NAN, DType::F32), mn);  // any NaN: the range is [nan, nan]
      mx = b.select(nan, b.constant(NAN, DType::F32), mx);
      auto finite = [&](Value v) { return b.emit("is_finite", {v}, Type{DType::Pred, {}}); };
      Value bad = b.unary(op::not_, b.binary(op::and_, finite(mn), finite(mx)));
      auto bits = [&](Value v) { return b.convert(b.bitcast(v, DType::U32), DType::S64); };
      Value pair = b.binary(op::or_, b.binary(op::shift_left, bits(mn), b.constant_int(32, DType::S64)), bits(mx));
      c.env.check(bad, pair, false, "torch.histc: range of [{f32,f32}] is not finite");
    }
  } else {
    if (!std::isfinite(c.num(2)) || !std::isfinite(c.num(3))) throw UserError("torch.histc: range is not finite");
    lo = c.scalar(2, t);
    hi = c.scalar(3, t);
  }
  return {b.convert(bin_counts(b, x, Value{}, linear_edges(b, lo, hi, bins, t), bins, true), c.odt())};
}
// histogram(x, bins, range?, weight?, density) -> (hist, edges): equal-width bins
V lower_histogram_bin_ct(Ctx& c) {
  Builder& b = c.b;
  DType t = c.odt(0);
  Value x = c.in(0);
  int64_t bins = c.int_or(1, 100);
  Value lo, hi;
  if (c.has(2) && c.arg(2).reals.size() == 2) {
    lo = b.constant(c.arg(2).reals[0], t);
    hi = b.constant(c.arg(2).reals[1], t);
    if (c.arg(2).reals[0] == c.arg(2).reals[1]) {
      lo = b.sub(lo, b.constant(0.5, t));
      hi = b.add(hi, b.constant(0.5, t));
    }
  } else if (hlo::numel(x.shape()) == 0) {
    lo = b.constant(0, t);
    hi = b.constant(1, t);
  } else {
    std::tie(lo, hi) = data_range(b, x, t);
  }
  Value edges = linear_edges(b, lo, hi, bins, t);
  // no data: zero counts, and a density of 0 / 0 = NaN, as on CPU
  if (hlo::numel(x.shape()) == 0) return {b.constant(c.flag_or(4, false) ? NAN : 0.0, t, {bins}), edges};
  Value h = bin_counts(b, x, c.has(3) ? c.in(3) : Value{}, edges, bins, true);
  return {c.flag_or(4, false) ? density(b, h, edges, bins) : h, edges};
}
// histogram(x, edges tensor, weight?, density) -> (hist, edges)
V lower_histogram_bins_tensor(Ctx& c) {
  Builder& b = c.b;
  DType t = c.odt(0);
  Value edges = b.convert(c.in(1), t);
  int64_t bins = edges.shape()[0] - 1;
  if (hlo::numel(c.in(0).shape()) == 0 || bins <= 0)  // no data: a density of 0 / 0 = NaN, as on CPU
    return {b.constant(c.flag_or(3, false) && bins > 0 ? NAN : 0.0, t, c.oshape(0)), edges};
  Value h = bin_counts(b, c.in(0), c.has(2) ? c.in(2) : Value{}, edges, bins, false);
  return {c.flag_or(3, false) ? density(b, h, edges, bins) : h, edges};
}
// embedding_dense_backward(g, idx, num_weights, padding_idx, scale_grad_by_freq)
V lower_embedding_dense_backward(Ctx& c) {
  Builder& b = c.b;
  if (c.flag_or(4, false)) throw Unsupported("embedding backward with scale_grad_by_freq");
  Value g = b.convert(c.in(0), compute_type(c.odt()));
  Value idx = b.convert(c.in(1), DType::S64);
  int64_t nw = c.int_(2), pad = c.int_(3);
  int64_t n = hlo::numel(idx.shape());
  int64_t dmodel = c.oshape()[1];
  Value rows = b.reshape(g, {n, dmodel});
  Value flat = b.reshape(idx, {n});
  if (pad >= 0) {
    Value keep = b.compare(flat, b.constant_int(pad, DType::S64, {n}), hlo::Cmp::NE);
    rows = b.select(b.broadcast_in_dim(keep, {n, dmodel}, {0}), rows, b.zeros(rows.dtype(), rows.shape()));
  }
  Value zeros = b.zeros(rows.dtype(), {nw, dmodel});
  return {b.scatter(zeros, b.reshape(flat, {n, 1}), rows, {0}, op::add)};
}
}  // namespace

void register_indexing() {
  const std::pair<const char*, Rule> rules[] = {
      // scatter / gather
      {"aten::scatter_reduce.two", scatter_reduce},
      {"aten::masked_scatter", lower_masked_scatter},
      {"aten::masked_scatter_backward", lower_masked_scatter_backward},
      {"aten::index_select", lower_index_select},
      {"aten::gather", lower_gather},
      {"aten::scatter.src", [](Ctx& c) { return scatter_along(c, false, true); }},
      {"aten::scatter.value", [](Ctx& c) { return scatter_along(c, false, false); }},
      {"aten::scatter.reduce", [](Ctx& c) { return scatter_along(c, false, true); }},
      {"aten::scatter.value_reduce", [](Ctx& c) { return scatter_along(c, false, false); }},
      {"aten::scatter_add", [](Ctx& c) { return scatter_along(c, true, true); }},
      // advanced indexing
      {"aten::index.Tensor", lower_index},
      {"aten::index_put", lower_index_put},
      {"aten::_index_put_impl", lower_index_put},
      // index_add / index_reduce / index_fill / index_copy along a dim
      {"aten::index_add", lower_index_add},
      {"aten::index_reduce", lower_index_reduce},
      {"aten::index_fill.int_Scalar", lower_index_fill},
      {"aten::index_fill.int_Tensor", lower_index_fill},
      {"aten::index_copy", lower_index_copy},
      // flat take / put
      {"aten::take", lower_take},
      {"aten::put", lower_put},
      // searchsorted, bucketize
      {"aten::searchsorted.Tensor", lower_searchsorted},
      {"aten::bucketize.Tensor", lower_bucketize},
      // histograms
      {"aten::histc", lower_histc},
      {"aten::histogram.bin_ct", lower_histogram_bin_ct},
      {"aten::histogram.bins_tensor", lower_histogram_bins_tensor},
      // embedding backward
      {"aten::embedding_dense_backward", lower_embedding_dense_backward},
  };
  for (auto& [name, rule] : rules) add_rule(name, rule);
}

}  // namespace tt::lower
