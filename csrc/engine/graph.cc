// Graph: loads and stores of views (static and run-time geometry), trace keys, parameters.
#include "engine/engine.h"
#include "engine/layout.h"

#include <algorithm>
#include <numeric>
#include <unistd.h>

namespace tt::engine {

using hlo::Builder;
using hlo::Type;

namespace {

struct Dim {
  int64_t pos, size, stride;
};

// Dims that address memory: size > 1 and stride != 0, ordered by stride
// (largest first, ties keep order).
std::vector<Dim> core_dims(const Shape& sizes, const Shape& strides) {
  std::vector<Dim> d;
  for (size_t i = 0; i < sizes.size(); ++i)
    if (sizes[i] > 1 && strides[i] != 0) d.push_back({static_cast<int64_t>(i), sizes[i], strides[i]});
  std::stable_sort(d.begin(), d.end(), [](const Dim& a, const Dim& b) { return a.stride > b.stride; });
  return d;
}

bool dense(const std::vector<Dim>& d) {
  int64_t expect = 1;
  for (auto it = d.rbegin(); it != d.rend(); ++it) {
    if (it->stride != expect) return false;
    expect *= it->size;
  }
  return true;
}

int64_t count(const std::vector<Dim>& d) {
  int64_t n = 1;
  for (auto& x : d) n *= x.size;
  return n;
}

// Element positions (offset + sum i_k * stride_k) over the core dims, in core order;
// `offset` is an s64 scalar (a runtime parameter).
Value positions(Builder& b, const std::vector<Dim>& d, Value offset) {
  Shape s;
  for (auto& x : d) s.push_back(x.size);
  Value acc = b.broadcast_in_dim(offset, s, {});
  for (size_t i = 0; i < d.size(); ++i)
    acc = b.add(acc, b.mul(b.iota(DType::S64, s, static_cast<int64_t>(i)), b.constant_int(d[i].stride, DType::S64, s)));
  return b.reshape(acc, {hlo::numel(s)});
}

// The core dims' values (in core order) -> the view's logical shape.
Value to_logical(Builder& b, Value core, const std::vector<Dim>& d, const Shape& sizes) {
  // core is laid out in stride order; permute to the original dim order
  std::vector<int64_t> order(d.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t c) { return d[a].pos < d[c].pos; });
  Value t = b.transpose(core, order);
  std::vector<int64_t> bdims;
  for (int64_t i : order) bdims.push_back(d[i].pos);
  return b.broadcast_in_dim(t, sizes, bdims);
}

}  // namespace

Shape row_major_strides(const Shape& sizes) {
  Shape st(sizes.size());
  int64_t s = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    st[i] = s;
    s *= sizes[i];
  }
  return st;
}

// Dense row-major layout (size-1 dims may have any stride).
bool row_major(const Shape& sizes, const Shape& strides) {
  Shape c = row_major_strides(sizes);
  for (size_t i = 0; i < sizes.size(); ++i)
    if (sizes[i] != 1 && strides[i] != c[i]) return false;
  return true;
}

namespace {

// A flat array reinterpreted as another element type (the bytes in memory order).
Value reinterpret(Builder& b, Value v, DType as) {
  DType from = v.dtype();
  if (from == as) return v;
  // complex <-> pairs of its part type (real, imaginary), then any other type from that
  if (hlo::is_complex(from)) {
    int64_t n = v.shape()[0];
    Value re = b.reshape(b.real(v), {n, 1}), im = b.reshape(b.imag(v), {n, 1});
    return reinterpret(b, b.reshape(b.concatenate({re, im}, 1), {2 * n}), as);
  }
  if (hlo::is_complex(as)) {
    Value f = reinterpret(b, v, hlo::real_part(as));
    int64_t n = f.shape()[0];
    if (n % 2 != 0) throw rt::Error("tpu storage size is not a multiple of the element size");
    Value pairs = b.reshape(f, {n / 2, 2});
    Value re = b.reshape(b.slice(pairs, {0, 0}, {n / 2, 1}, {1, 1}), {n / 2});
    Value im = b.reshape(b.slice(pairs, {0, 1}, {n / 2, 2}, {1, 1}), {n / 2});
    return b.complex(re, im);
  }
  if (from == DType::Pred || as == DType::Pred) {
    if (from == DType::Pred) v = b.convert(v, DType::U8);
    from = DType::U8;
    if (as == DType::Pred) return b.convert(reinterpret(b, v, DType::U8), DType::Pred);
  }
  int64_t fs = hlo::itemsize(from), ts = hlo::itemsize(as), n = v.shape()[0];
  if (fs == ts) return b.bitcast(v, as);
  if (fs > ts) {  // [n] -> [n, fs/ts] -> [n * fs/ts]
    int64_t r = fs / ts;
    Value x = b.emit("bitcast_convert", {v}, hlo::Type{as, {n, r}});
    return b.reshape(x, {n * r});
  }
  int64_t r = ts / fs;
  if (n % r != 0) throw rt::Error("tpu storage size is not a multiple of the element size");
  Value x = b.reshape(v, {n / r, r});
  return b.emit("bitcast_convert", {x}, hlo::Type{as, {n / r}});
}

}  // namespace


// ---------------------------------------------------------------- Graph
Value Graph::flat(const StoragePtr& st, DType as) {
  if (!st->typed) {
    st->dtype = as;
    st->typed = true;
  }
  auto it = index_.find(st.get());
  Value v;
  if (it != index_.end()) {
    v = entries_[it->second].cur;
  } else {
    Entry e;
    e.st = st;
    Type t{st->dtype, {st->elements()}};
    auto ext = external_.find(st.get());
    bool input = ext != external_.end() && ext->second.kind == Slot::Kind::Input;
    if (st->buffer || input) {
      e.param = static_cast<int>(params_.size());
      e.cur = b.param(t);
      Binding p;
      p.kind = input ? Binding::Kind::Input : Binding::Kind::Storage;
      p.st = st;
      if (input) p.index = ext->second.index;
      params_.push_back(std::move(p));
    } else {
      e.cur = b.zeros(st->dtype, t.shape);
    }
    index_[st.get()] = static_cast<int>(entries_.size());
    entries_.push_back(e);
    v = e.cur;
  }
  return reinterpret(b, v, as);
}

namespace {

// A view reads storage elements [offset, offset + span) as whole rows of its
// leading dim: each later dim fits in the stride of the one before ("padded").
bool padded_layout(const std::vector<Dim>& d) {
  bool padded = !d.empty();
  for (size_t i = 0; padded && i + 1 < d.size(); ++i)
    padded = d[i].stride % d[i + 1].stride == 0 && d[i].stride >= d[i + 1].stride * d[i + 1].size;
  return padded;
}

// The view's program text depends on its offset only through this (offsets are
// parameters): 0 = at the start of the storage, 1 = elsewhere, 2 = its last
// padded row runs past the storage's end (the load pads the storage).
int offset_class(const View& v, const std::vector<Dim>& d, int64_t N) {
  if (!dense(d) && padded_layout(d) && v.offset + d[0].size * d[0].stride > N) return 2;
  return v.offset == 0 ? 0 : 1;
}

}  // namespace

Value Graph::offset_param(int64_t offset) { return scalar_param(static_cast<double>(offset), true, DType::S64); }

Value Graph::view_offset(const View& v) {
  if (!in_op_) return offset_param(v.offset);
  for (const auto& o : op_offsets_)
    if (o.offset == v.offset) return o.v;
  Value p = offset_param(v.offset);
  op_offsets_.push_back({v.offset, p});
  return p;
}

namespace {
// A padded storage is read and written through run-time geometry in every view (its buffer
// is not PyTorch's layout), with the view's dims static where it has no bounds.
View runtime_view(const View& v) {
  View r = v;
  r.runtime = true;
  if (r.bound.empty()) r.bound.assign(r.sizes.size(), 0);
  return r;
}
}  // namespace

Value Graph::load(const View& v) {
  if (v.runtime) return load_runtime(v);
  if (v.st->padded) return load_runtime(runtime_view(v));
  int64_t n = hlo::numel(v.sizes);
  if (n == 0) return b.zeros(v.dtype, v.sizes);
  Value fl = flat(v.st, v.dtype);
  int64_t N = fl.shape()[0];
  auto d = core_dims(v.sizes, v.strides);
  int64_t cn = count(d);
  Shape sorted;
  for (auto& x : d) sorted.push_back(x.size);
  Value core;
  if (dense(d)) {
    Value region = (v.offset == 0 && cn == N) ? fl : b.dynamic_slice(fl, {view_offset(v)}, {cn});
    core = b.reshape(region, sorted);
  } else {
    if (padded_layout(d)) {
      // flat[off : off + size0 * stride0] as [size0, s0/s1, ..., s_{k-1}], then the leading corner
      int64_t span = d[0].size * d[0].stride;
      Value region = fl;
      // past the end: pad by one row (the overrun is shorter than a row)
      if (offset_class(v, d, N) == 2) region = b.pad(fl, b.zeros(fl.dtype(), {}), {0}, {d[0].stride}, {0});
      region = v.offset == 0 && span == region.shape()[0] ? region
                                                           : b.dynamic_slice(region, {view_offset(v)}, {span});
      Shape p{d[0].size};
      for (size_t i = 1; i < d.size(); ++i) p.push_back(d[i - 1].stride / d[i].stride);
      p.push_back(d.back().stride);
      Value r = b.reshape(region, p);
      Shape lim{d[0].size};
      for (size_t i = 1; i < d.size(); ++i) lim.push_back(d[i].size);
      lim.push_back(1);
      r = b.slice(r, Shape(p.size(), 0), lim, Shape(p.size(), 1));
      core = b.reshape(r, sorted);
    } else {
      core = b.reshape(b.take(fl, positions(b, d, view_offset(v)), 0), sorted);
    }
  }
  return to_logical(b, core, d, v.sizes);
}

void Graph::store(const View& v, Value value) {
  if (v.runtime) return store_runtime(v, value);
  if (v.st->padded) return store_runtime(runtime_view(v), value);
  int64_t n = hlo::numel(v.sizes);
  if (n == 0) return;
  if (value.dtype() != v.dtype) value = b.convert(value, v.dtype);
  if (value.type.dynamic) return store_runtime(v, value);  // a bucketed value: its real part
  if (value.shape() != v.sizes) {
    if (hlo::numel(value.shape()) == n) value = b.reshape(value, v.sizes);
    else value = b.broadcast_to(value, v.sizes);
  }
  Value fl = flat(v.st, v.dtype);
  int64_t N = fl.shape()[0];
  auto d = core_dims(v.sizes, v.strides);
  bool has_bcast = false;
  for (size_t i = 0; i < v.sizes.size(); ++i) has_bcast |= v.sizes[i] > 1 && v.strides[i] == 0;
  // value in core order: drop size-1 dims, permute to stride order
  std::vector<int64_t> perm;
  Shape squeezed;
  for (size_t i = 0; i < v.sizes.size(); ++i)
    if (v.sizes[i] > 1) squeezed.push_back(v.sizes[i]);
  Value sq = b.reshape(value, squeezed);
  // positions of core dims inside `squeezed`
  std::vector<int64_t> sq_pos(v.sizes.size(), -1);
  int64_t k = 0;
  for (size_t i = 0; i < v.sizes.size(); ++i)
    if (v.sizes[i] > 1) sq_pos[i] = k++;
  Value next;
  if (!has_bcast) {
    for (auto& x : d) perm.push_back(sq_pos[x.pos]);
    Value ordered = b.reshape(b.transpose(sq, perm), {n});
    if (dense(d)) {
      if (v.offset == 0 && n == N) next = ordered;
      else
        next = b.dynamic_update_slice(fl, ordered, {view_offset(v)});
    } else {
      next = b.scatter(fl, b.reshape(positions(b, d, view_offset(v)), {n, 1}), ordered, {0}, std::nullopt);
    }
  } else {
    // an expanded destination (PyTorch rejects most such writes earlier): last write wins
    std::vector<Dim> all;
    for (size_t i = 0; i < v.sizes.size(); ++i)
      if (v.sizes[i] > 1) all.push_back({static_cast<int64_t>(i), v.sizes[i], v.strides[i]});
    Value pos = positions(b, all, view_offset(v));
    next = b.scatter(fl, b.reshape(pos, {n, 1}), b.reshape(sq, {n}), {0}, std::nullopt);
  }
  next = reinterpret(b, next, v.st->dtype);
  Entry& e = entries_[index_.at(v.st.get())];
  e.cur = next;
  e.written = true;
  e.last.valid = false;
  ++stores_;
}

// ---- bounded dynamism: views read and written through run-time geometry
Shape View::value_shape() const {
  if (bound.empty()) return sizes;
  Shape s = sizes;
  for (size_t i = 0; i < s.size(); ++i)
    if (bound[i] > 0) s[i] = bound[i];
  return s;
}

bool View::has_dynamic_dims() const {
  for (int64_t x : bound)
    if (x > 0) return true;
  return false;
}

namespace {
// The whole storage in PyTorch's row-major layout.
bool whole_row_major(const View& v) {
  return v.offset == 0 && row_major(v.sizes, v.strides) && hlo::numel(v.sizes) == v.st->numel() &&
         (!v.st->typed || v.st->dtype == v.dtype);
}

// A view of a padded storage that covers all of it densely, in some dim order, and whose
// dims in memory order regroup the base tensor's (merging consecutive dims, a dynamic one
// only as the outer one of its group, or splitting a static dim): its value is the buffer
// reshaped (`shape`, memory order at the bounds) and transposed to the view's dim order
// (`order`: the view's dims of size > 1 from outer to inner in memory). The base tensor
// itself, its transposes, [B, T, H, Dh] of [B, T, D], [B*H, T, T] of [B, H, T, T].
struct Regroup {
  std::vector<int64_t> order;
  Shape shape;
};

bool regroup(const View& v, const Shape& vs, Regroup* r) {
  const Storage& st = *v.st;
  if (!st.padded || v.offset != 0 || (st.typed && st.dtype != v.dtype) || hlo::numel(v.sizes) != st.numel() ||
      st.numel() == 0)
    return false;
  std::vector<int64_t> order;
  for (size_t i = 0; i < v.sizes.size(); ++i)
    if (v.sizes[i] > 1) order.push_back(static_cast<int64_t>(i));
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t c) { return v.strides[a] > v.strides[c]; });
  int64_t expect = 1;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    if (v.strides[*it] != expect) return false;
    expect *= v.sizes[*it];
  }
  std::vector<size_t> bd;
  for (size_t j = 0; j < st.base_sizes.size(); ++j)
    if (st.base_sizes[j] > 1) bd.push_back(j);
  auto dyn = [&](size_t j) { return st.base_bound[bd[j]] > 0; };
  auto padded = [&](size_t j) { return dyn(j) ? st.base_bound[bd[j]] : st.base_sizes[bd[j]]; };
  Shape shape;
  size_t j = 0;
  for (size_t a = 0; a < order.size();) {
    if (j >= bd.size()) return false;
    int64_t m = v.sizes[order[a]], n = st.base_sizes[bd[j]];
    if (m >= n) {  // base dims j.. merged (only the first may be dynamic)
      int64_t prod = n, pad = padded(j);
      for (++j; prod < m && j < bd.size(); ++j) {
        if (dyn(j)) return false;
        prod *= st.base_sizes[bd[j]];
        pad *= st.base_sizes[bd[j]];
      }
      if (prod != m) return false;
      shape.push_back(pad);
      ++a;
    } else {  // a static base dim split over view dims a..
      if (dyn(j)) return false;
      int64_t prod = 1;
      for (; prod < n && a < order.size(); ++a) {
        prod *= v.sizes[order[a]];
        shape.push_back(v.sizes[order[a]]);
      }
      if (prod != n) return false;
      ++j;
    }
  }
  if (j != bd.size()) return false;
  for (size_t k = 0; k < order.size(); ++k)
    if (vs[order[k]] != shape[k]) return false;
  if (r) {
    r->order = std::move(order);
    r->shape = std::move(shape);
  }
  return true;
}

// A packed whole storage whose dynamic dims follow only size-1 dims (at most one of them):
// its value is the buffer's first elements, reshaped.
bool reshape_layout(const View& v, const Shape& value_shape) {
  if (v.st->padded || !whole_row_major(v)) return false;
  bool leading = true;
  int dynamic = 0;
  for (size_t i = 0; i < v.sizes.size(); ++i) {
    bool dyn = !v.bound.empty() && v.bound[i] > 0;
    if (dyn && !leading) return false;
    dynamic += dyn;
    if (value_shape[i] != 1) leading = false;
  }
  return dynamic <= 1 && hlo::numel(value_shape) <= v.st->elements();
}

// A runtime view read and written by rows: its last dim is static and contiguous, so a
// gather or scatter moves whole rows (one position per row, not per element). In a padded
// storage each row must lie in one row of the base tensor (whose last dim is then static).
bool row_access(const View& v, const Shape& value_shape) {
  size_t r = v.sizes.size();
  if (!(r >= 2 && v.strides[r - 1] == 1 && (v.bound.empty() || v.bound[r - 1] == 0) && v.sizes[r - 1] >= 2 &&
        value_shape[r - 1] == v.sizes[r - 1]))
    return false;
  const Storage& st = *v.st;
  if (!st.padded) return true;
  if (st.typed && st.dtype != v.dtype) return false;
  int64_t w = st.base_sizes.back();
  if (st.base_bound.back() > 0 || v.offset % w + v.sizes[r - 1] > w) return false;
  for (size_t i = 0; i + 1 < r; ++i)
    if (v.sizes[i] > 1 && v.strides[i] % w != 0) return false;
  return true;
}
}  // namespace

// How a runtime view is read (the op's trace key holds it): the value an earlier op stored
// through it, the buffer reshaped, rows or elements gathered.
char Graph::access(const View& v, const Shape& vs) const {
  if (forwards(v)) return 'F';
  if (regroup(v, vs, nullptr)) return 'S';
  if (reshape_layout(v, vs)) return 'R';
  if (row_access(v, vs) && vs.back() <= v.st->elements()) return 'W';
  return 'G';
}

// Buffer positions of a view's elements over `shape` (offset + sum_k i_k * stride_k in
// PyTorch's layout: offset and strides are s64 parameters, they may depend on a dynamic
// size). In a padded storage that position p is moved to the base element it names:
// i_j = (p / S_j) % n_j (S_j, n_j the base's strides and sizes, parameters where they
// depend on a dynamic size), at sum i_j * F_j (F_j the row-major strides at the bounds).
Value Graph::runtime_positions(const View& v, const Shape& shape) {
  Value acc = b.broadcast_in_dim(offset_param(v.offset), shape, {});
  for (size_t k = 0; k < shape.size(); ++k) {
    if (shape[k] == 1) continue;
    Value stride = b.broadcast_in_dim(scalar_param(static_cast<double>(v.strides[k]), true, DType::S64), shape, {});
    acc = b.add(acc, b.mul(b.iota(DType::S64, shape, static_cast<int64_t>(k)), stride));
  }
  const Storage& st = *v.st;
  if (!st.padded) return acc;
  // a view of another element type (view_as_real, x.view(torch.int8)): positions in its
  // elements, r of them to a storage element, or a storage element to k of them
  int64_t vi = hlo::itemsize(v.dtype), si = hlo::itemsize(st.dtype);
  Value sub;
  if (vi < si) {
    Value r = b.constant_int(si / vi, DType::S64, shape);
    sub = b.binary(hlo::op::remainder, acc, r);
    acc = b.div(acc, r);
  } else if (vi > si) {
    acc = b.mul(acc, b.constant_int(vi / si, DType::S64, shape));
  }
  Shape full = st.full();
  size_t k = st.base_sizes.size();
  Value q;
  int64_t F = 1;
  bool dyn_after = false;  // a dynamic dim after j: S_j varies within the bucket
  for (size_t j = k; j-- > 0;) {
    int64_t n = st.base_sizes[j];
    if (n > 1) {
      Value i = acc;
      if (j + 1 < k) {
        Value S = dyn_after ? scalar_param(static_cast<double>(st.base_strides[j]), true, DType::S64)
                            : b.constant_int(st.base_strides[j], DType::S64);
        i = b.div(i, b.broadcast_in_dim(S, shape, {}));
      }
      if (j > 0) {
        Value N = st.base_bound[j] > 0 ? scalar_param(static_cast<double>(n), true, DType::S64) : b.constant_int(n, DType::S64);
        i = b.binary(hlo::op::remainder, i, b.broadcast_in_dim(N, shape, {}));
      }
      if (F != 1) i = b.mul(i, b.constant_int(F, DType::S64, shape));
      q = q.valid() ? b.add(q, i) : i;
    }
    F *= full[j];
    dyn_after |= st.base_bound[j] > 0;
  }
  if (!q.valid()) q = b.zeros(DType::S64, shape);
  if (vi < si) return b.add(b.mul(q, b.constant_int(si / vi, DType::S64, shape)), sub);
  if (vi > si) return b.div(q, b.constant_int(vi / si, DType::S64, shape));
  return q;
}

Value Graph::load_runtime(const View& v) {
  Shape vs = v.value_shape();
  if (hlo::numel(vs) == 0 || hlo::numel(v.sizes) == 0) return b.zeros(v.dtype, vs);
  Value val;
  char how = access(v, vs);
  if (how == 'F') {  // what an earlier op stored through this view: its dims re-marked below
    val = entries_[index_.at(v.st.get())].last.value;
  } else {
    Value fl = flat(v.st, v.dtype);
    int64_t N = fl.shape()[0], m = hlo::numel(vs);
    if (how == 'S') {
      Regroup r;
      regroup(v, vs, &r);
      val = b.reshape(m == N ? fl : b.slice(fl, {0}, {m}, {1}), r.shape);
      // memory order -> the view's order of its dims of size > 1, then its size-1 dims
      std::vector<int64_t> perm(r.order.size());
      std::vector<int64_t> sorted = r.order;
      std::sort(sorted.begin(), sorted.end());
      for (size_t i = 0; i < sorted.size(); ++i)
        perm[i] = std::find(r.order.begin(), r.order.end(), sorted[i]) - r.order.begin();
      val = b.reshape(b.transpose(val, perm), vs);
    } else if (how == 'R') {
      val = b.reshape(m == N ? fl : b.slice(fl, {0}, {m}, {1}), vs);
    } else if (how == 'W') {
      Shape rows(vs.begin(), vs.end() - 1);
      val = b.take_rows(fl, runtime_positions(v, rows), vs.back());
    } else {  // positions past the real elements read the padding
      Value pos = runtime_positions(v, vs);
      pos = b.clamp(b.constant_int(0, DType::S64), pos, b.constant_int(N - 1, DType::S64));
      val = b.take(fl, pos, 0);
    }
  }
  for (size_t i = 0; i < vs.size(); ++i)
    if (!v.bound.empty() && v.bound[i] > 0) {
      val = b.set_dimension_size(val, size_param(v.sizes[i]), static_cast<int64_t>(i));
      if (std::find(buckets.begin(), buckets.end(), v.bound[i]) == buckets.end()) buckets.push_back(v.bound[i]);
    }
  return val;
}

// Writes of a bucketed value: dims of the value beyond the view's real sizes are padding.
// A view that regroups a padded storage's base tensor writes the value itself (made static:
// a program's result has a static shape, and what lay past a run-time size stays as
// padding); any other view is a scatter over the value's shape (by rows where they are
// contiguous) whose positions past a real size are out of range (dropped).
void Graph::store_runtime(const View& v, Value value) {
  if (hlo::numel(v.sizes) == 0) return;
  if (value.dtype() != v.dtype) value = b.convert(value, v.dtype);
  // one entry per dim of the view, at least its real size (more in a bucketed dim)
  bool fits = value.rank() == static_cast<int64_t>(v.sizes.size());
  for (size_t i = 0; fits && i < v.sizes.size(); ++i) fits = value.shape()[i] >= v.sizes[i];
  Shape vs = v.value_shape();
  if (!fits) {
    int64_t m = hlo::numel(value.shape());
    value = m == hlo::numel(vs) ? b.reshape(value, vs) : m == hlo::numel(v.sizes) ? b.reshape(value, v.sizes) : b.broadcast_to(value, vs);
  }
  Shape U = value.shape();
  Value fl = flat(v.st, v.dtype);
  int64_t N = fl.shape()[0];
  Value plain = b.static_shape(value);  // XLA's run-time sizes dropped: what lay past them stays as padding
  Regroup r;
  if (U == vs && regroup(v, vs, &r)) {  // the value in memory order is the buffer
    std::vector<int64_t> sorted = r.order;
    std::sort(sorted.begin(), sorted.end());
    Shape squeezed;
    for (int64_t d : sorted) squeezed.push_back(vs[d]);
    std::vector<int64_t> perm;
    for (int64_t d : r.order) perm.push_back(std::find(sorted.begin(), sorted.end(), d) - sorted.begin());
    Value next = b.reshape(b.transpose(b.reshape(plain, squeezed), perm), {hlo::numel(U)});
    if (hlo::numel(U) < N) next = b.pad(next, b.zeros(next.dtype(), {}), {0}, {N - hlo::numel(U)}, {0});
    return finish_store(v, value, reinterpret(b, next, v.st->dtype), true);
  }
  bool rows = v.has_dynamic_dims() && row_access(v, U) && U.back() <= N;
  Shape P = U;  // one position per element, or per row
  if (rows) P.pop_back();
  Value pos = runtime_positions(v, P);
  Value keep;
  for (size_t k = 0; k < P.size(); ++k) {  // (the text follows the key: a dynamic dim's size is a parameter)
    if (U[k] == v.sizes[k] && (v.bound.empty() || v.bound[k] == 0)) continue;
    Value size = b.broadcast_in_dim(scalar_param(static_cast<double>(v.sizes[k]), true, DType::S64), P, {});
    Value in = b.compare(b.iota(DType::S64, P, static_cast<int64_t>(k)), size, hlo::Cmp::LT);
    keep = keep.valid() ? b.binary(hlo::op::and_, keep, in) : in;
  }
  if (keep.valid()) pos = b.select(keep, pos, b.constant_int(N, DType::S64, P));
  Value next;
  if (rows) {
    next = b.scatter_rows(fl, pos, plain);
  } else {
    Shape ishape = U;
    ishape.push_back(1);
    next = b.scatter_nd(fl, b.reshape(pos, ishape), plain);
  }
  finish_store(v, value, reinterpret(b, next, v.st->dtype), U == vs);
}

void Graph::finish_store(const View& v, Value value, Value next, bool forward) {
  Entry& e = entries_[index_.at(v.st.get())];
  e.cur = next;
  e.written = true;
  e.last.valid = forward;
  if (forward) {
    e.last.view = v;
    e.last.value = value;
    e.last.op = ops.size();
  }
  ++stores_;
}

bool Graph::forwards(const View& v) const {
  if (!v.runtime) return false;
  auto it = index_.find(v.st.get());
  if (it == index_.end()) return false;
  const auto& l = entries_[it->second].last;
  return l.valid && l.op < ops.size() && l.view.offset == v.offset && l.view.dtype == v.dtype &&
         l.view.sizes == v.sizes && l.view.strides == v.strides && l.view.bound == v.bound;
}

int Graph::op_at_line(int line) const {
  // module(): two header lines precede the body
  int body_line = line - 2;
  if (body_line < 1) return -1;
  size_t pos = 0;
  for (int l = 1; l < body_line; ++l) {
    pos = b.body_text().find('\n', pos);
    if (pos == std::string::npos) return -1;
    ++pos;
  }
  int found = -1;
  for (size_t i = 0; i < sites.size(); ++i)
    if (sites[i].body_start <= pos) found = static_cast<int>(i);
  return found;
}

void Graph::key_view(KeyBuilder& kb, const View& v) const {
  const Storage* st = v.st.get();
  auto it = index_.find(const_cast<Storage*>(st));
  if (it != index_.end()) {
    kb.k += 'e';
    kb.i64(it->second);
  } else {
    auto f = std::find(kb.fresh.begin(), kb.fresh.end(), st);
    if (f != kb.fresh.end()) {
      kb.k += 'r';
      kb.i64(f - kb.fresh.begin());
    } else {
      kb.fresh.push_back(st);
      kb.k += st->buffer ? 'p' : 'z';
      kb.k += static_cast<char>(st->typed);
      kb.k += static_cast<char>(st->dtype);
      if (st->dynamic()) {  // its bucket, not its size (and a padded one's shape at the bounds)
        kb.k += st->padded ? 'P' : 'D';
        kb.i64(st->elements());
        if (st->padded) {
          Shape f = st->full();
          kb.i64(static_cast<int64_t>(f.size()));
          for (size_t i = 0; i < f.size(); ++i) kb.i64(st->base_bound[i] > 0 ? -f[i] : f[i]);
        }
      } else {
        kb.i64(st->nbytes);
      }
    }
  }
  kb.k += static_cast<char>(v.dtype);
  if (v.runtime || st->padded) {  // offset, strides and dynamic sizes are parameters
    View rv = v.runtime ? v : runtime_view(v);
    Shape vs = rv.value_shape();
    char how = access(rv, vs);
    kb.k += how;
    Regroup r;
    if (how == 'S' && regroup(rv, vs, &r))
      for (int64_t d : r.order) kb.i64(d);
    kb.k += whole_row_major(rv) ? 'H' : 'h';
    kb.k += row_access(rv, vs) ? 'w' : '-';
    kb.i64(static_cast<int64_t>(vs.size()));
    for (size_t i = 0; i < vs.size(); ++i) {
      bool dyn = !rv.bound.empty() && rv.bound[i] > 0;
      kb.i64(dyn ? -vs[i] : vs[i]);
      if (!dyn) continue;
      // which of the graph's size parameters this dim's size is (equal sizes share one)
      int64_t n = rv.sizes[i], cls = -1;
      for (size_t k = 0; k < size_params_.size() && cls < 0; ++k)
        if (size_params_[k].n == n) cls = static_cast<int64_t>(k);
      if (cls < 0) {
        auto f = std::find(kb.new_sizes.begin(), kb.new_sizes.end(), n);
        cls = -1 - (f - kb.new_sizes.begin());
        if (f == kb.new_sizes.end()) kb.new_sizes.push_back(n);
      }
      kb.i64(cls);
    }
    return;
  }
  // offsets are program parameters: only their class shapes the text
  int64_t N = st->typed ? st->nbytes / hlo::itemsize(v.dtype) : 0;
  kb.k += static_cast<char>(offset_class(v, core_dims(v.sizes, v.strides), N));
  auto same = std::find(kb.offsets.begin(), kb.offsets.end(), v.offset);
  kb.i64(same - kb.offsets.begin());  // which earlier view of the op has its offset (see view_offset)
  if (same == kb.offsets.end()) kb.offsets.push_back(v.offset);
  kb.i64(static_cast<int64_t>(v.sizes.size()));
  kb.add(v.sizes.data(), v.sizes.size() * sizeof(int64_t));
  kb.add(v.strides.data(), v.strides.size() * sizeof(int64_t));
}

void Graph::rollback(const Mark& m) {
  b.rollback(m.b);
  if (m.ops < ops.size()) {
    ops.resize(m.ops);
    sites.resize(m.ops);
    keys.resize(m.ops);
    reads.resize(m.ops);
  }
  for (size_t i = m.entries; i < entries_.size(); ++i) index_.erase(entries_[i].st.get());
  entries_.resize(m.entries);
  params_.resize(m.params);
  while (!size_params_.empty() && size_params_.back().param >= m.params) size_params_.pop_back();
  stores_ = m.stores;
  rng_.param = m.rng_param;
  rng_.key = m.rng_key;
  rng_.counter = m.rng_counter;
}

Value Graph::size_param(int64_t n) {
  for (const auto& p : size_params_)
    if (p.n == n) return p.v;
  size_t at = params_.size();
  Value v = scalar_param(static_cast<double>(n), true, DType::S32);
  size_params_.push_back({n, v, at});
  return v;
}

Value Graph::scalar_param(double v, bool is_int, DType t) {
  Binding p;
  p.kind = Binding::Kind::Scalar;
  p.v = v;
  p.is_int = is_int;
  p.t = t;
  params_.push_back(p);
  return b.param(Type{t, {}});
}

std::pair<Value, Value> Graph::rng_param(int64_t n) {
  // one draw per run for the whole program: later draws continue its counter
  size_t at = rng_.param;
  if (at != SIZE_MAX && at + 1 < params_.size() && params_[at].kind == Binding::Kind::Rng && params_[at].index == 0) {
    int64_t offset = params_[at].n;
    params_[at].n += n;
    params_[at + 1].n += n;
    Value base = b.add(rng_.counter, b.constant_int(offset, DType::U32));
    return {rng_.key, base};
  }
  Binding p;
  p.kind = Binding::Kind::Rng;
  p.n = n;
  p.t = DType::U32;
  rng_.param = params_.size();
  params_.push_back(p);
  rng_.key = b.param(Type{DType::U32, {}});
  p.index = 1;
  params_.push_back(p);
  rng_.counter = b.param(Type{DType::U32, {}});
  return {rng_.key, rng_.counter};
}

void Graph::bind_external(const StoragePtr& st, Slot::Kind kind, int index) {
  external_[st.get()] = Slot{kind, st, index};
}

}  // namespace tt::engine
