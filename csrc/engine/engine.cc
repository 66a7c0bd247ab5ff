#include "engine/engine.h"
#include "runtime/activity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>

namespace tt::engine {

using hlo::Builder;
using hlo::Type;

std::recursive_mutex& engine_mutex() {
  static std::recursive_mutex m;
  return m;
}

PJRT_Buffer_Type pjrt_type(DType t) {
  switch (t) {
    case DType::Pred: return PJRT_T_PRED;
    case DType::S8: return PJRT_T_S8;
    case DType::S16: return PJRT_T_S16;
    case DType::S32: return PJRT_T_S32;
    case DType::S64: return PJRT_T_S64;
    case DType::U8: return PJRT_T_U8;
    case DType::U16: return PJRT_T_U16;
    case DType::U32: return PJRT_T_U32;
    case DType::U64: return PJRT_T_U64;
    case DType::F16: return PJRT_T_F16;
    case DType::BF16: return PJRT_T_BF16;
    case DType::F32: return PJRT_T_F32;
    case DType::F64: return PJRT_T_F64;
    case DType::C64: return PJRT_T_C64;
    case DType::C128: return PJRT_T_C128;
  }
  return PJRT_T_INVALID;
}

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
      next = b.scatter(fl, b.reshape(positions(b, d, view_offset(v)), {n, 1}), ordered, {0}, "");
    }
  } else {
    // an expanded destination (PyTorch rejects most such writes earlier): last write wins
    std::vector<Dim> all;
    for (size_t i = 0; i < v.sizes.size(); ++i)
      if (v.sizes[i] > 1) all.push_back({static_cast<int64_t>(i), v.sizes[i], v.strides[i]});
    Value pos = positions(b, all, view_offset(v));
    next = b.scatter(fl, b.reshape(pos, {n, 1}), b.reshape(sq, {n}), {0}, "");
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
    sub = b.binary("remainder", acc, r);
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
        i = b.binary("remainder", i, b.broadcast_in_dim(N, shape, {}));
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
    keep = keep.valid() ? b.binary("and", keep, in) : in;
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

// ---------------------------------------------------------------- Engine
Engine& Engine::get() {
  static Engine* e = new Engine();  // never destroyed: PJRT objects outlive static teardown
  return *e;
}

Graph& Engine::graph(int device) {
  if (Graph* c = capture_graph(device)) return *c;
  auto it = graphs_.find(device);
  // DeferAndFuse: ops from another thread (autograd's device thread running the
  // backward, then the optimizer back on the main thread) start a new graph; the
  // finished part runs while the next one is being recorded.
  if (mode_ == Mode::DeferAndFuse && split_threads_ && it != graphs_.end() && it->second &&
      !it->second->ops.empty() && it->second->owner != std::this_thread::get_id())
    flush(device);
  auto& g = graphs_[device];
  if (!g) g = std::make_unique<Graph>(device);
  return *g;
}

void Engine::begin_capture(int device) {
  auto key = std::make_pair(std::this_thread::get_id(), device);
  if (captures_.count(key)) throw rt::Error("torch_tpu: a capture is already in progress on this thread for tpu:" +
                                            std::to_string(device));
  flush(device);
  auto g = std::make_unique<Graph>(device);
  g->capture = true;
  g->traceable = false;
  captures_[key] = std::move(g);
}

std::unique_ptr<Graph> Engine::end_capture(int device) {
  auto it = captures_.find(std::make_pair(std::this_thread::get_id(), device));
  if (it == captures_.end()) return nullptr;
  std::unique_ptr<Graph> g = std::move(it->second);
  captures_.erase(it);
  g->broken = false;
  return g;
}

Graph* Engine::capture_graph(int device) {
  if (captures_.empty()) return nullptr;
  auto it = captures_.find(std::make_pair(std::this_thread::get_id(), device));
  return it != captures_.end() ? it->second.get() : nullptr;
}

bool Engine::capture_broken() {
  for (auto& [key, g] : captures_)
    if (key.first == std::this_thread::get_id() && g->broken) return true;
  return false;
}

void Engine::clear_capture_break() {
  for (auto& [key, g] : captures_)
    if (key.first == std::this_thread::get_id()) g->broken = false;
}

void Engine::zero_fill(Storage& st) {
  if (st.buffer) return;
  if (!st.typed) {
    st.dtype = DType::U8;
    st.typed = true;
  }
  int64_t nbytes = st.elements() * hlo::itemsize(st.dtype);
  std::vector<char> zeros(static_cast<size_t>(nbytes), 0);
  st.buffer = rt::Client::get().from_host(zeros.data(), pjrt_type(st.dtype), {st.elements()}, st.device);
  metrics.h2d_transfers++;
  metrics.h2d_bytes += nbytes;
}

void Engine::set_mode(Mode m) {
  if (m != mode_) flush_all();
  mode_ = m;
}

void Engine::op_done(int device) {
  metrics.ops++;
  if (capture_graph(device)) return;
  if (mode_ == Mode::DeferAndFuse) {
    auto it = graphs_.find(device);
    if (it != graphs_.end() && it->second && it->second->ops.size() >= fuse_limit_) flush(device);
    return;
  }
  flush(device);
  if (mode_ == Mode::Debug) {
    rt::Client::get().wait_all();
    raise_device_errors(device);
  }
}

void Engine::flush_all() {
  std::vector<int> devs;
  for (auto& kv : graphs_) devs.push_back(kv.first);
  for (auto& kv : captures_)  // this thread's capture breaks, as a flush of it would
    if (kv.first.first == std::this_thread::get_id()) devs.push_back(kv.first.second);
  for (int d : devs) flush(d);
}

void Engine::synchronize() {
  end_epoch();
  flush_all();
  rt::Client::get().wait_all();
  for (auto& [device, dirty] : check_dirty_)
    if (dirty) raise_device_errors(device);
}

StoragePtr Engine::check_word(int device) {
  auto& w = check_words_[device];
  if (!w) {
    w = std::make_shared<Storage>(16, device);
    w->dtype = DType::S64;
    w->typed = true;
    zero_fill(*w);
  }
  return w;
}

void Engine::add_check(Graph& g, Value bad, Value value, bool index_error, const std::string& message) {
  if (!checks_on_) return;
  std::string op = current_op_ ? current_op_->name : "";
  std::string site = current_op_ ? current_op_->site : "";
  if (site.empty() && site_source_) site = site_source_();
  std::string key = op + '\0' + site + '\0' + message + (index_error ? "I" : "R");
  auto it = check_ids_.find(key);
  int64_t id;
  if (it != check_ids_.end()) {
    id = it->second;
  } else {
    if (check_sites_.size() >= (1u << 20)) {  // bounded: old ids then report without their site
      check_sites_.clear();
      check_ids_.clear();
    }
    check_sites_.push_back({op, site, message, index_error});
    id = static_cast<int64_t>(check_sites_.size());
    check_ids_[key] = id;
  }
  // word = word[0] != 0 ? word : (bad ? [id, value] : word)
  hlo::Builder& b = g.b;
  View wv{check_word(g.device), 0, {2}, {1}, DType::S64};
  Value word = g.load(wv);
  Value failed = b.reshape(b.slice(word, {0}, {1}, {1}), {});
  Value mine = b.concatenate({b.reshape(g.scalar_param(static_cast<double>(id), true, DType::S64), {1}),
                              b.reshape(b.convert(value, DType::S64), {1})}, 0);
  Value keep = b.binary("or", b.compare(failed, b.constant_int(0, DType::S64), hlo::Cmp::NE),
                        b.compare(bad, b.constant_int(0, DType::Pred), hlo::Cmp::EQ));
  g.store(wv, b.select(b.broadcast_to(keep, {2}), word, mine));
}

void Engine::raise_device_errors(int device) {
  auto dirty = check_dirty_.find(device);
  if (dirty == check_dirty_.end() || !dirty->second) return;
  dirty->second = false;
  flush(device);
  StoragePtr w = check_word(device);
  int64_t word[2] = {0, 0};
  w->buffer->to_host(word, sizeof word);
  metrics.d2h_transfers++;
  metrics.d2h_bytes += sizeof word;
  if (word[0] == 0) return;
  w->buffer = nullptr;
  zero_fill(*w);  // the device stays usable
  std::string msg = "a device-side check failed";
  bool index_error = false;
  if (word[0] >= 1 && static_cast<size_t>(word[0]) <= check_sites_.size()) {
    const CheckSite& c = check_sites_[word[0] - 1];
    msg = c.message;
    auto at = msg.find("{}");
    if (at != std::string::npos) msg.replace(at, 2, std::to_string(word[1]));
    at = msg.find("{lo32}");  // two 32-bit numbers packed in the value (an index, a run-time size)
    if (at != std::string::npos) msg.replace(at, 6, std::to_string(static_cast<int32_t>(static_cast<uint64_t>(word[1]))));
    at = msg.find("{hi32}");
    if (at != std::string::npos) msg.replace(at, 6, std::to_string(static_cast<int32_t>(static_cast<uint64_t>(word[1]) >> 32)));
    at = msg.find("{f32,f32}");  // two float32 bit patterns, printed as PyTorch prints numbers
    if (at != std::string::npos) {
      auto f32 = [](uint32_t bits) {
        float f;
        std::memcpy(&f, &bits, sizeof f);
        if (std::isnan(f)) return std::string("nan");
        std::ostringstream o;
        o << f;
        return o.str();
      };
      auto u = static_cast<uint64_t>(word[1]);
      msg.replace(at, 9, f32(static_cast<uint32_t>(u >> 32)) + ", " + f32(static_cast<uint32_t>(u)));
    }
    msg += "\n(torch_tpu: checked on the device in " + c.op + (c.site.empty() ? "" : ", issued at " + c.site) + ")";
    index_error = c.index_error;
  }
  throw DeviceCheckError(msg, index_error);
}

namespace {
long read_number(const char* path, long fallback) {
  std::ifstream in(path);
  long v = 0;
  return in >> v ? v : fallback;
}

long count_lines(const char* path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return -1;
  long n = 0;
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) n += std::count(buf, buf + in.gcount(), '\n');
  return n;
}
}  // namespace

// A loaded executable keeps a few memory mappings of its JIT code (about three on the XLA CPU
// plugin, more for large programs). A process may hold vm.max_map_count mappings; a plugin that
// runs out fails inside LLVM and takes the process down. So every 32 loads the mappings are
// counted, and past half of the limit the caches let go of their executables (programs held
// elsewhere, such as compiled graphs, stay loaded).
void Engine::relieve_map_pressure() {
  if (++loads_since_map_check_ < 32) return;
  loads_since_map_check_ = 0;
  static const long limit = [] {  // TORCH_TPU_MAX_MAP_COUNT: a lower limit (tests)
    const char* e = std::getenv("TORCH_TPU_MAX_MAP_COUNT");
    long sys = read_number("/proc/sys/vm/max_map_count", 65530);
    return e && std::atol(e) > 0 ? std::min(sys, std::atol(e)) : sys;
  }();
  long n = count_lines("/proc/self/maps");
  if (n < 0 || n < limit / 2) return;
  cache_.clear();
  clear_traces();
  metrics.map_releases++;
}

rt::ExecutablePtr Engine::compile(const std::string& text) {
  auto it = cache_.find(text);
  if (it != cache_.end()) {
    metrics.cache_hits++;
    return it->second;
  }
  metrics.cache_misses++;
  relieve_map_pressure();
  if (auto cached = disk_load(text)) {
    if (cache_.size() >= 8192) cache_.clear();
    cache_[text] = cached;
    return cached;
  }
  auto t0 = std::chrono::steady_clock::now();
  auto exe = rt::Client::get().compile(text);
  note_compile(t0);
  disk_store(text, *exe);
  if (cache_.size() >= 8192) cache_.clear();
  cache_[text] = exe;
  return exe;
}

void Engine::note_compile(std::chrono::steady_clock::time_point t0) {
  int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  metrics.compile_ns += ns;
  metrics.compiles++;
  progress_.compiled(ns);
}

void CompileProgress::compiled(int64_t ns) {
  if (threshold_s_ < 0) {
    const char* env = std::getenv("TORCH_TPU_COMPILE_PROGRESS");
    char* end = nullptr;
    double v = env ? std::strtod(env, &end) : -1;
    threshold_s_ = (env && end != env && v >= 0) ? v : 5.0;  // unset or not a number: 5 s
    tty_ = isatty(2) != 0;
  }
  ++programs_;
  ns_ += ns;
  if (threshold_s_ == 0 || ns_ < static_cast<int64_t>(threshold_s_ * 1e9)) return;
  if (shown_ && (!tty_ || ns_ - shown_at_ns_ < 500000000)) return;  // a terminal: twice a second at most
  std::fprintf(stderr, "%storch_tpu: compiling programs for new shapes: %lld so far, %.1f s%s", tty_ ? "\r" : "",
               static_cast<long long>(programs_), static_cast<double>(ns_) / 1e9,
               tty_ ? "" : " (first runs at these shapes; later runs reuse them)\n");
  std::fflush(stderr);
  shown_ = true;
  shown_at_ns_ = ns_;
}

void CompileProgress::end() {
  if (shown_ && tty_) {
    std::fprintf(stderr, "\rtorch_tpu: compiled %lld programs in %.1f s\n", static_cast<long long>(programs_),
                 static_cast<double>(ns_) / 1e9);
    std::fflush(stderr);
  }
  programs_ = ns_ = shown_at_ns_ = 0;
  shown_ = false;
}

// ---- persistent cache. File: magic, key check, blob size, blob, blob checksum.
namespace {
const char kMagic[8] = {'T', 'T', 'P', 'C', 'A', 'C', 'H', '1'};

uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string cache_key(const std::string& text) {
  auto& c = rt::Client::get();
  return text + "\n// options: portable, 1 replica, 1 partition\n// platform: " + c.platform_name() + " " +
         c.platform_version() + " api " + std::to_string(c.api_minor()) + " plugin " + c.plugin_path();
}

void make_dirs(const std::string& dir) {
  std::string cur;
  std::stringstream ss(dir);
  std::string part;
  if (!dir.empty() && dir[0] == '/') cur = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    cur += part + "/";
    mkdir(cur.c_str(), 0755);
  }
}
}  // namespace

rt::ExecutablePtr Engine::disk_load(const std::string& text) {
  if (cache_dir_.empty()) return nullptr;
  std::string key = cache_key(text);
  uint64_t h1 = fnv1a(key), h2 = fnv1a(key, 0x9E3779B97F4A7C15ull);
  char name[40];
  snprintf(name, sizeof name, "%016llx.bin", static_cast<unsigned long long>(h1));
  std::string path = cache_dir_ + "/" + name;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    metrics.disk_misses++;
    return nullptr;
  }
  auto bad = [&]() -> rt::ExecutablePtr {
    metrics.disk_errors++;
    metrics.disk_misses++;
    in.close();
    std::remove(path.c_str());  // corrupt or stale: recompile and rewrite
    return nullptr;
  };
  char magic[8];
  uint64_t check = 0, size = 0, sum = 0;
  if (!in.read(magic, 8) || std::memcmp(magic, kMagic, 8) != 0) return bad();
  if (!in.read(reinterpret_cast<char*>(&check), 8) || check != h2) return bad();
  if (!in.read(reinterpret_cast<char*>(&size), 8) || size > (uint64_t(1) << 34)) return bad();
  std::string blob(size, '\0');
  if (!in.read(&blob[0], static_cast<std::streamsize>(size))) return bad();
  if (!in.read(reinterpret_cast<char*>(&sum), 8) || sum != fnv1a(blob)) return bad();
  try {
    auto exe = rt::Client::get().deserialize(blob);
    metrics.disk_hits++;
    return exe;
  } catch (const rt::Error&) {
    return bad();
  }
}

void Engine::disk_store(const std::string& text, const rt::Executable& exe) {
  if (cache_dir_.empty()) return;
  std::string blob = exe.serialize();
  if (blob.empty()) return;
  std::string key = cache_key(text);
  uint64_t h1 = fnv1a(key), h2 = fnv1a(key, 0x9E3779B97F4A7C15ull), size = blob.size(), sum = fnv1a(blob);
  char name[40];
  snprintf(name, sizeof name, "%016llx.bin", static_cast<unsigned long long>(h1));
  make_dirs(cache_dir_);
  std::string path = cache_dir_ + "/" + name;
  std::string tmp = path + ".tmp" + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      metrics.disk_errors++;
      return;
    }
    out.write(kMagic, 8);
    out.write(reinterpret_cast<const char*>(&h2), 8);
    out.write(reinterpret_cast<const char*>(&size), 8);
    out.write(blob.data(), static_cast<std::streamsize>(blob.size()));
    out.write(reinterpret_cast<const char*>(&sum), 8);
    if (!out) {
      metrics.disk_errors++;
      std::remove(tmp.c_str());
      return;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    metrics.disk_errors++;
    std::remove(tmp.c_str());
    return;
  }
  metrics.disk_writes++;
}

rt::BufferPtr Engine::scalar_buffer(double v, bool is_int, DType t, int device) {
  std::string key(reinterpret_cast<const char*>(&v), sizeof v);
  key += static_cast<char>(t);
  key += static_cast<char>(is_int);
  key += std::to_string(device);
  auto it = scalars_.find(key);
  if (it != scalars_.end()) return it->second;
  unsigned char buf[16] = {0};
  auto put = [&](auto x) { std::memcpy(buf, &x, sizeof x); };
  switch (t) {
    case DType::Pred: put(static_cast<uint8_t>(v != 0)); break;
    case DType::S8: put(static_cast<int8_t>(v)); break;
    case DType::U8: put(static_cast<uint8_t>(v)); break;
    case DType::S16: put(static_cast<int16_t>(v)); break;
    case DType::S32: put(static_cast<int32_t>(v)); break;
    case DType::U16: put(static_cast<uint16_t>(static_cast<int64_t>(v))); break;
    case DType::U32: put(static_cast<uint32_t>(static_cast<int64_t>(v))); break;
    case DType::U64: put(v >= 9.2233720368547758e18 ? static_cast<uint64_t>(v) : static_cast<uint64_t>(static_cast<int64_t>(v))); break;
    case DType::S64: put(static_cast<int64_t>(v)); break;
    case DType::F32: put(static_cast<float>(v)); break;
    case DType::F64: put(v); break;
    case DType::F16: case DType::BF16: {
      // convert through a tiny program-free path: use the builder's literal rules
      float f = static_cast<float>(v);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      uint16_t h;
      if (t == DType::BF16) {
        h = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
      } else {
        // via the standard half conversion of the compiler
        _Float16 hf = static_cast<_Float16>(f);
        std::memcpy(&h, &hf, 2);
      }
      put(h);
      break;
    }
    case DType::C64: {
      float c[2] = {static_cast<float>(v), 0.f};
      std::memcpy(buf, c, 8);
      break;
    }
    case DType::C128: {
      double c[2] = {v, 0.0};
      std::memcpy(buf, c, 16);
      break;
    }
  }
  auto buffer = rt::Client::get().from_host(buf, pjrt_type(t), {}, device);
  metrics.h2d_transfers++;
  metrics.h2d_bytes += hlo::itemsize(t);
  if (scalars_.size() > 4096) scalars_.clear();
  scalars_[key] = buffer;
  return buffer;
}

// The error, the op of the program that caused it (from the "-:LINE:COL" the
// compiler reports) and the Python line that issued that op.
std::string Engine::describe_failure(const Graph& g, const std::string& what) {
  std::string msg = what;
  int op = -1;
  auto p = what.find("-:");
  if (p != std::string::npos) op = g.op_at_line(std::atoi(what.c_str() + p + 2));
  if (op >= 0) {
    msg += "\n(torch_tpu: the failing op is " + g.ops[op];
    if (!g.sites[op].where.empty()) msg += ", issued at " + g.sites[op].where;
    msg += ")";
  } else {
    msg += "\n(torch_tpu: in the program for " + std::to_string(g.ops.size()) + " ops:";
    for (size_t i = g.ops.size() > 5 ? g.ops.size() - 5 : 0; i < g.ops.size(); ++i)
      msg += " " + g.ops[i] + (g.sites[i].where.empty() ? "" : " (" + g.sites[i].where + ")") + ";";
    msg += ")";
  }
  return msg;
}

// ---- traces
void Engine::begin_op(Graph& g, const std::string* key, const CurrentFn& current) {
  if (!key || !trace_on_) {
    leave_trace(g);
    g.traceable = false;
    return;
  }
  if (!g.traceable) return;
  size_t i = g.ops.size();
  auto reads_match = [&](const lower::Reads& r) {
    for (const auto& x : r) {
      double c = current ? current(x.arg) : std::nan("");
      if (x.test < 0 ? std::memcmp(&c, &x.value, sizeof c) != 0 : (c == x.value) != (x.test == 1)) return false;
    }
    return true;
  };
  auto fits = [&](const Trace& t) { return i < t.keys.size() && t.keys[i] == *key && reads_match(t.reads[i]); };
  if (i == 0) {
    if (g.trace) {  // chosen for a first op that failed and was rolled back
      g.trace = nullptr;
      g.b.set_dry(false);
    }
    auto it = traces_.find(*key);
    if (it == traces_.end()) return;
    for (const auto& t : it->second)
      if (fits(*t)) {
        g.trace = t;
        g.b.set_dry(!trace_verify_);
        return;
      }
    return;
  }
  if (!g.trace) return;
  if (fits(*g.trace)) return;
  // another recorded trace that shares this graph's ops so far?
  auto it = traces_.find(g.keys[0]);
  if (it != traces_.end())
    for (const auto& t : it->second) {
      if (t == g.trace || !fits(*t)) continue;
      bool same = true;
      for (size_t k = 0; same && k < i; ++k) same = t->keys[k] == g.keys[k] && t->reads[k] == g.reads[k];
      if (same) {
        g.trace = t;
        return;
      }
    }
  leave_trace(g);
}

void Engine::leave_trace(Graph& g) {
  if (!g.trace) return;
  if (g.b.dry()) {  // the text the ops so far produced when the trace was recorded
    size_t n = g.ops.size();
    g.b.materialize(g.trace->body.substr(0, g.trace->marks[n]));
    for (size_t k = 0; k < n; ++k) g.sites[k].body_start = g.trace->marks[k];
  }
  g.trace = nullptr;
  metrics.trace_exits++;
}

void Engine::record_trace(Graph& g, const std::vector<int>& outs, const Program& p) {
  if (!trace_on_ || !g.traceable || g.ops.empty()) return;
  auto t = std::make_shared<Trace>();
  t->keys = std::move(g.keys);
  t->reads = std::move(g.reads);
  for (auto& s : g.sites) t->marks.push_back(s.body_start);
  t->body = g.b.body_text();
  t->marks.push_back(t->body.size());
  t->outs = outs;
  t->aliases = p.donations;
  t->exe = p.exe;
  t->text = p.text;
  if (trace_count_ >= 4096) clear_traces();
  auto& bucket = traces_[t->keys[0]];
  for (auto it = bucket.begin(); it != bucket.end(); ++it)
    if ((*it)->keys == t->keys && (*it)->reads == t->reads && (*it)->outs == t->outs && (*it)->aliases == t->aliases) {
      bucket.erase(it);
      --trace_count_;
      break;
    }
  bucket.insert(bucket.begin(), std::move(t));
  ++trace_count_;
  if (bucket.size() > 8) {
    bucket.pop_back();
    --trace_count_;
  }
  metrics.trace_recorded++;
}

void Engine::collect_results(Graph& g, Program& p, std::vector<int>& entries, std::vector<Value>& values) {
  // The storages written and still alive. An overwritten storage whose buffer
  // nothing else holds donates it to its new value (in-place updates do not
  // double memory).
  p.device = g.device;
  for (size_t i = 0; i < g.entries_.size(); ++i) {
    auto& e = g.entries_[i];
    if (!e.written || !e.st->alive.load()) continue;
    auto ext = g.external_.find(e.st.get());
    // a capture returns what its inputs and outputs stand for, and storages
    // that existed before it; what it created and did not return is internal
    if (g.capture && ext == g.external_.end() && e.param < 0) continue;
    // a capture donates every written input (a run opts out where the buffer is shared)
    bool donor = g.capture ? ext != g.external_.end() && ext->second.kind == Slot::Kind::Input
                           : e.st->buffer && e.st->buffer.use_count() == 1;
    if (e.param >= 0 && donor && e.cur.type == Type{e.st->dtype, {e.st->elements()}})
      p.donations.emplace_back(e.param, static_cast<int>(values.size()));
    p.results.push_back(ext != g.external_.end() ? ext->second : Slot{Slot::Kind::Storage, e.st, 0});
    entries.push_back(static_cast<int>(i));
    values.push_back(e.cur);
  }
  p.params = g.params_;
}

void Engine::finish(Graph& g, Program& p, const std::vector<Value>& values) {
  set_param_bytes(g, p);
  for (auto& [param, result] : p.donations) g.b.alias(param, result);
  p.text = std::make_shared<const std::string>(g.b.module(values));
  metrics.program_bytes += static_cast<int64_t>(p.text->size());
  last_program_ = p.text;
  int64_t before = metrics.compiles.load();
  try {
    p.exe = compile(*p.text);
  } catch (const rt::Error& err) {
    throw rt::Error(describe_failure(g, err.what()), err.code());
  }
  if (metrics.compiles.load() != before) {
    static const bool log = std::getenv("TORCH_TPU_LOG_COMPILES") != nullptr;  // debugging aid
    if (log) {
      std::string ops;
      for (size_t i = 0; i < g.ops.size() && i < 6; ++i) ops += " " + g.ops[i];
      std::string ps;
      for (const auto& t : g.b.param_types()) ps += " " + t.str();
      std::fprintf(stderr, "torch_tpu compile: %zu ops:%s%s (%s)\n", g.ops.size(), ops.c_str(), g.ops.size() > 6 ? " ..." : "", ps.c_str());
    }
    // debugging aid: every compiled program's text, numbered, with the ops it holds
    static const char* dump = std::getenv("TORCH_TPU_DUMP_PROGRAMS");
    if (dump && *dump) {
      std::string path = std::string(dump) + "/program_" + std::to_string(metrics.compiles.load()) + ".mlir";
      if (FILE* f = std::fopen(path.c_str(), "w")) {
        std::string head = "// ops:";
        for (const auto& o : g.ops) head += " " + o;
        std::fprintf(f, "%s\n%s", head.c_str(), p.text->c_str());
        std::fclose(f);
      }
    }
    note_compile(g, values);
    if (!g.buckets.empty()) {
      std::vector<int64_t> bs = g.buckets;
      std::sort(bs.begin(), bs.end());
      std::string k;
      for (int64_t x : bs) k += (k.empty() ? "" : ",") + std::to_string(x);
      programs_per_bucket_[k]++;
      metrics.dynamic_compiles++;
    }
  }
}

// Like PyTorch/XLA's "CompileTime too frequent": the same ops compiling program
// after program means something that varies call to call is in the program text.
void Engine::note_compile(const Graph& g, const std::vector<Value>& results) {
  if (g.ops.empty()) return;
  std::string name = g.ops.size() == 1 ? g.ops[0] : g.ops.front() + " ... " + g.ops.back() + " (" + std::to_string(g.ops.size()) + " ops)";
  // the same ops on the same parameter and result types: new shapes alone do not
  // count (an op that creates its output, such as zero_ of a fresh tensor, has none
  // of its shapes in the parameters)
  std::string key = name;
  for (const auto& t : g.b.param_types()) key += t.str();
  key += "->";
  for (const auto& v : results) key += v.type.str();
  if (compiles_by_ops_.size() > 4096) compiles_by_ops_.clear();
  if (++compiles_by_ops_[key] != kFrequentCompiles) return;
  key = name;
  metrics.frequent_compiles++;
  if (warn_)
    warn_("torch_tpu: " + key + " has compiled " + std::to_string(kFrequentCompiles) +
          " different programs for the same input shapes; something that changes from call to call is part of "
          "the program (e.g. a Python number the op reads as a constant). Each new program costs a compile "
          "(torch_tpu.metrics.report()['frequent_compiles'] counts such op sequences).");
}

void Engine::set_param_bytes(const Graph& g, Program& p) {
  p.param_bytes.clear();
  for (const auto& t : g.b.param_types()) p.param_bytes.push_back(hlo::numel(t.shape) * hlo::itemsize(t.dtype));
}

Program Engine::build(Graph& g) {
  Program p;
  std::vector<int> entries;
  std::vector<Value> values;
  collect_results(g, p, entries, values);
  finish(g, p, values);
  return p;
}

Program Engine::build_replicated(Graph& g, int replicas) {
  Program p;
  std::vector<int> entries;
  std::vector<Value> values;
  collect_results(g, p, entries, values);
  p.donations.clear();
  for (const auto& r : p.results)
    if (r.kind == Slot::Kind::Storage)
      throw rt::Error("torch_tpu: a replicated program may write only its inputs and outputs (it wrote a tensor "
                      "that existed before the capture)");
  std::string text = g.b.module(values);
  const std::string one = "mhlo.num_replicas = 1 : i32";  // the module says how many replicas run it
  auto at = text.find(one);
  if (at != std::string::npos)
    text.replace(at, one.size(), "mhlo.num_replicas = " + std::to_string(replicas) + " : i32");
  p.text = std::make_shared<const std::string>(std::move(text));
  metrics.program_bytes += static_cast<int64_t>(p.text->size());
  last_program_ = p.text;
  auto t0 = std::chrono::steady_clock::now();
  try {
    p.exe = rt::Client::get().compile_replicated(*p.text, replicas);
  } catch (const rt::Error& err) {
    throw rt::Error(describe_failure(g, err.what()), err.code());
  }
  note_compile(t0);
  return p;
}

void Engine::run_replicated(const Program& p, const std::vector<std::vector<StoragePtr>>& inputs,
                            const std::vector<std::vector<StoragePtr>>& outputs) {
  size_t n = inputs.size();
  if (n == 0 || outputs.size() != n) throw rt::Error("torch_tpu: a replicated program needs inputs and outputs per replica");
  auto& client = rt::Client::get();
  std::vector<std::vector<rt::BufferPtr>> keep(n);
  std::vector<std::vector<PJRT_Buffer*>> args(n);
  std::pair<uint32_t, uint32_t> draw{0, 0};
  auto on_device = [&](Storage& st, int r) -> rt::BufferPtr {  // st's value on device r
    if (!st.buffer) zero_fill(st);
    if (st.device == r) return st.buffer;
    std::vector<char> host(static_cast<size_t>(st.elements() * hlo::itemsize(st.dtype)));
    st.buffer->to_host(host.data(), host.size());
    return client.from_host(host.data(), pjrt_type(st.dtype), {st.elements()}, r);
  };
  for (size_t i = 0; i < p.params.size(); ++i) {
    const Binding& b = p.params[i];
    if (b.kind == Binding::Kind::Rng && b.index == 0) {
      if (!rng_source_) throw rt::Error("torch_tpu: no device generator");
      auto [seed, offset] = rng_source_(p.device, static_cast<uint64_t>(b.n));
      draw = rng_words(seed, offset);
    }
    for (size_t r = 0; r < n; ++r) {
      int dev = static_cast<int>(r);
      rt::BufferPtr buf;
      switch (b.kind) {
        case Binding::Kind::Input: {
          if (b.index < 0 || static_cast<size_t>(b.index) >= inputs[r].size())
            throw rt::Error("torch_tpu: a replicated program ran with too few tensors");
          buf = on_device(*inputs[r][b.index], dev);
          break;
        }
        case Binding::Kind::Storage: buf = on_device(*b.st, dev); break;
        case Binding::Kind::Scalar: buf = scalar_buffer(b.v, b.is_int, b.t, dev); break;
        case Binding::Kind::Rng:
          buf = scalar_buffer(b.index == 0 ? draw.first : draw.second, true, DType::U32, dev);
          break;
      }
      args[r].push_back(buf->get());
      keep[r].push_back(std::move(buf));
    }
  }
  auto outs = p.exe->execute_replicated(args);
  metrics.executions++;
  for (size_t r = 0; r < n; ++r)
    for (size_t i = 0; i < p.results.size(); ++i) {
      const Slot& s = p.results[i];
      const auto& v = s.kind == Slot::Kind::Input ? inputs[r] : outputs[r];
      if (s.index < 0 || static_cast<size_t>(s.index) >= v.size())
        throw rt::Error("torch_tpu: a replicated program ran with too few tensors");
      v[s.index]->buffer = outs[r][i];
    }
}

void Engine::run(const Program& p, const std::vector<StoragePtr>& inputs, const std::vector<StoragePtr>& outputs) {
  auto storage = [&](const StoragePtr& st, Slot::Kind kind, int index) -> const StoragePtr& {
    if (kind == Slot::Kind::Storage) return st;
    const auto& v = kind == Slot::Kind::Input ? inputs : outputs;
    if (index < 0 || static_cast<size_t>(index) >= v.size()) throw rt::Error("torch_tpu: a program ran with too few tensors");
    return v[index];
  };
  std::vector<rt::BufferPtr> keep;
  std::vector<PJRT_Buffer*> args;
  keep.reserve(p.params.size());
  args.reserve(p.params.size());
  std::pair<uint32_t, uint32_t> draw{0, 0};
  if (p.scalars.size() != p.params.size()) p.scalars.assign(p.params.size(), nullptr);
  for (size_t i = 0; i < p.params.size(); ++i) {
    const Binding& b = p.params[i];
    rt::BufferPtr buf;
    switch (b.kind) {
      case Binding::Kind::Storage:
      case Binding::Kind::Input: {
        const StoragePtr& st = storage(b.st, b.kind == Binding::Kind::Input ? Slot::Kind::Input : Slot::Kind::Storage, b.index);
        buf = st->buffer;
        if (!buf) throw rt::Error("torch_tpu: a program input has no device buffer");
        if (i < p.param_bytes.size() && st->elements() * hlo::itemsize(st->dtype) != p.param_bytes[i])
          throw rt::Error("torch_tpu: a tensor the program reads (" +
                          std::string(b.kind == Binding::Kind::Input ? "input " + std::to_string(b.index) : "a storage") +
                          ") changed its storage size since the program was built (" + std::to_string(p.param_bytes[i]) +
                          " bytes expected, " + std::to_string(st->elements() * hlo::itemsize(st->dtype)) +
                          (st->dynamic() ? ", made dynamic" : "") + ")");
        if (i < p.param_bytes.size() && buf->bytes() != p.param_bytes[i])
          throw rt::Error("torch_tpu: internal error: parameter " + std::to_string(i) + " of a program expects " +
                          std::to_string(p.param_bytes[i]) + " bytes, its buffer holds " +
                          std::to_string(buf->bytes()) + " (storage " + std::to_string(st->nbytes) + " bytes" +
                          (st->dynamic() ? ", dynamic, capacity " + std::to_string(st->capacity) : "") + ")");
        break;
      }
      case Binding::Kind::Scalar:
        if (!p.scalars[i]) p.scalars[i] = scalar_buffer(b.v, b.is_int, b.t, p.device);
        buf = p.scalars[i];
        break;
      case Binding::Kind::Rng:
        if (b.index == 0) {
          if (!rng_source_) throw rt::Error("torch_tpu: no device generator");
          auto [seed, offset] = rng_source_(p.device, static_cast<uint64_t>(b.n));
          draw = rng_words(seed, offset);
        }
        buf = scalar_buffer(b.index == 0 ? draw.first : draw.second, true, DType::U32, p.device);
        break;
    }
    args.push_back(buf->get());
    keep.push_back(std::move(buf));
  }
  // a donated buffer that something else still holds (beyond its storage and `keep`) is kept
  std::vector<int64_t> no_donate;
  for (const auto& [param, result] : p.donations)
    if (keep[param].use_count() > 2) no_donate.push_back(param);
  auto outs = p.exe->execute(p.device, args, no_donate);
  metrics.executions++;
  auto cw = check_words_.find(p.device);
  for (size_t i = 0; i < p.results.size(); ++i) {
    const StoragePtr& st = storage(p.results[i].st, p.results[i].kind, p.results[i].index);
    st->buffer = outs[i];
    if (cw != check_words_.end() && st == cw->second) check_dirty_[p.device] = true;
  }
}

void Engine::flush(int device) {
  if (Graph* c = capture_graph(device)) {
    c->broken = true;
    throw CaptureBreak("torch_tpu: this op needs the values of a graph being captured for torch.compile");
  }
  auto it = graphs_.find(device);
  if (it == graphs_.end() || !it->second) return;
  std::unique_ptr<Graph> g = std::move(it->second);
  graphs_.erase(it);
  if (!g->has_stores()) return;
  Program p;
  std::vector<int> out_entries;
  std::vector<Value> values;
  collect_results(*g, p, out_entries, values);
  if (values.empty()) {
    if (g->trace) metrics.trace_exits++;
    return;
  }
  metrics.flushes++;
  rt::activity::Scope scope(rt::activity::Kind::Flush, static_cast<int64_t>(g->ops.size()));
  auto t_start = std::chrono::steady_clock::now();
  struct Timer {
    std::chrono::steady_clock::time_point t0;
    std::atomic<int64_t>& acc;
    ~Timer() {
      acc += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
    }
  } timer{t_start, metrics.flush_ns};
  const Trace* t = g->trace.get();
  std::string mismatch;
  if (t && g->ops.size() == t->keys.size() && out_entries == t->outs && p.donations == t->aliases) {
    metrics.trace_hits++;
    metrics.trace_ops += static_cast<int64_t>(g->ops.size());
    if (g->b.dry()) {  // the recorded program, without text
      last_program_ = t->text;
      p.exe = t->exe;
      p.text = t->text;
      set_param_bytes(*g, p);
      run(p);
      return;
    }
    if (g->b.body_text() != t->body) {
      metrics.trace_verify_failures++;
      size_t k = 0;
      while (k + 1 < g->ops.size() && g->sites[k + 1].body_start == t->marks[k + 1] &&
             g->b.body_text().compare(0, t->marks[k + 1], t->body, 0, t->marks[k + 1]) == 0)
        ++k;
      if (std::getenv("TORCH_TPU_VERIFY_DUMP")) {  // debugging aid: both texts
        std::ofstream("/tmp/tt_verify_recorded.txt") << t->body;
        std::ofstream("/tmp/tt_verify_built.txt") << g->b.body_text();
      }
      mismatch = "torch_tpu: trace verify: the program text differs from the recorded trace at op " +
                 std::to_string(k) + " (" + g->ops[k] + "): a rule's text depends on something its trace key misses";
    }
  }
  leave_trace(*g);
  finish(*g, p, values);
  run(p);  // the program built from text: results are right either way
  record_trace(*g, out_entries, p);
  if (!mismatch.empty()) throw rt::Error(mismatch);  // verify mode: a key bug fails loudly
}

namespace {
// Copies the view (sizes, strides, offset in elements of `item` bytes) of `base` into
// `dst` in row-major order: a memcpy per run of contiguous innermost elements.
void copy_strided(void* dst, const char* base, int64_t item, const Shape& sizes, const Shape& strides,
                  int64_t offset) {
  char* out = static_cast<char*>(dst);
  size_t k = sizes.size();
  if (k == 0) {
    std::memcpy(out, base + offset * item, static_cast<size_t>(item));
    return;
  }
  // the innermost dims that are contiguous in memory form one run
  size_t inner = k;
  int64_t run = 1;
  while (inner > 0 && (sizes[inner - 1] == 1 || strides[inner - 1] == run)) {
    run *= sizes[inner - 1];
    --inner;
  }
  size_t run_bytes = static_cast<size_t>(run * item);
  std::vector<int64_t> idx(inner, 0);
  while (true) {
    int64_t at = offset;
    for (size_t d = 0; d < inner; ++d) at += idx[d] * strides[d];
    std::memcpy(out, base + at * item, run_bytes);
    out += run_bytes;
    size_t d = inner;
    while (d > 0) {
      if (++idx[d - 1] < sizes[d - 1]) break;
      idx[d - 1] = 0;
      --d;
    }
    if (d == 0) return;
  }
}
}  // namespace

void Engine::read(const View& v, void* dst) {
  int64_t n = hlo::numel(v.sizes);
  if (n == 0) return;
  flush(v.st->device);
  raise_device_errors(v.st->device);  // a failed check comes before the data it may have spoiled
  end_epoch();
  size_t nbytes = static_cast<size_t>(n * hlo::itemsize(v.dtype));
  bool whole = v.st->typed && v.st->dtype == v.dtype && v.offset == 0 && n == v.st->numel() &&
               row_major(v.sizes, v.strides);
  if (!v.st->buffer && whole) {
    std::memset(dst, 0, nbytes);
    return;
  }
  StoragePtr src = v.st;
  if (!whole && v.st->buffer && !v.st->dynamic() && v.st->typed && v.st->dtype == v.dtype &&
      v.st->buffer->bytes() == v.st->nbytes) {
    // a view of a buffer that lies in host memory (the CPU plugin): copy its elements
    if (const void* base = v.st->buffer->host_data()) {
      rt::activity::Scope scope(rt::activity::Kind::ToHost, static_cast<int64_t>(nbytes));
      copy_strided(dst, static_cast<const char*>(base), hlo::itemsize(v.dtype), v.sizes, v.strides, v.offset);
      metrics.d2h_transfers++;
      metrics.d2h_bytes += static_cast<int64_t>(nbytes);
      return;
    }
  }
  if (!whole) {
    // materialise the view into a fresh dense storage first (a dynamic one for a view
    // with dynamic dims, so the copy serves its bucket)
    auto tmp = std::make_shared<Storage>(n * hlo::itemsize(v.dtype), v.st->device);
    tmp->dtype = v.dtype;
    tmp->typed = true;
    View from = dynamic_view(v);
    if (from.has_dynamic_dims()) make_dynamic(tmp, v.sizes, row_major_strides(v.sizes), from.bound);
    Graph& g = graph(v.st->device);
    copy_view(g, v, View{tmp, 0, v.sizes, row_major_strides(v.sizes), v.dtype}, "read (tpu to host)");
    flush(v.st->device);
    src = tmp;
  }
  if (src->dynamic()) {  // its real elements in PyTorch's layout
    std::vector<char> all = host_packed(*src);
    std::memcpy(dst, all.data(), nbytes);
  } else {
    src->buffer->to_host(dst, nbytes);
  }
  metrics.d2h_transfers++;
  metrics.d2h_bytes += static_cast<int64_t>(nbytes);
}

void Engine::copy_view(Graph& g, const View& from_view, const View& to_view, const std::string& name,
                       const std::string& site, bool promote) {
  View from = dynamic_view(from_view), to = dynamic_view(to_view);
  // a copy of a view with dynamic dims into a whole fresh storage (clone, contiguous):
  // the copy is dynamic too
  if (promote && from.has_dynamic_dims() && !to.st->dynamic() && !to.st->buffer && !g.index_.count(to.st.get()) &&
      to.offset == 0 && to.sizes == from.sizes && row_major(to.sizes, to.strides) &&
      hlo::numel(to.sizes) * hlo::itemsize(to.dtype) == to.st->nbytes) {
    if (!to.st->typed) {
      to.st->dtype = to.dtype;
      to.st->typed = true;
    }
    make_dynamic(to.st, to.sizes, to.strides, from.bound);
    to = dynamic_view(to_view);
  }
  Op op{name, site, true, "copy", {from, to}, {}};
  apply(g, op, [&] {
    g.store(to, g.load(from));  // store converts the type and reshapes / broadcasts
    return lower::Reads{};
  });
}

void Engine::apply(Graph& g, Op& op, const std::function<lower::Reads()>& body) {
  struct Current {  // the op whose rule is running (named by the checks it adds)
    const Op*& slot;
    const Op* prev;
    ~Current() { slot = prev; }
  } current{current_op_, current_op_};
  current_op_ = &op;
  struct InOp {  // the op's views share offset parameters (Graph::view_offset) until it ends
    Graph& g;
    bool was;
    std::vector<Graph::OpOffset> outer;
    explicit InOp(Graph& g) : g(g), was(g.in_op_), outer(std::move(g.op_offsets_)) {
      g.in_op_ = true;
      g.op_offsets_.clear();
    }
    ~InOp() {
      g.in_op_ = was;
      g.op_offsets_ = std::move(outer);
    }
  } in_op{g};
  if (op.keyed && trace_on_) {
    KeyBuilder kb{op.key};
    for (const auto& v : op.views) g.key_view(kb, v);
    begin_op(g, &op.key, op.current);
  } else {
    op.key.clear();
    begin_op(g, nullptr);
  }
  auto mark = g.mark();
  lower::Reads reads;
  try {
    reads = body();
  } catch (...) {
    g.rollback(mark);
    throw;
  }
  g.note_op(op.name, op.site, mark.b.body, std::move(op.key), std::move(reads));
}

void Engine::write(const View& v, const void* src) {
  int64_t n = hlo::numel(v.sizes);
  if (n == 0) return;
  auto& client = rt::Client::get();
  int64_t nbytes = n * hlo::itemsize(v.dtype);
  metrics.h2d_transfers++;
  metrics.h2d_bytes += nbytes;
  bool whole = (!v.st->typed || v.st->dtype == v.dtype) && v.offset == 0 &&
               n * hlo::itemsize(v.dtype) == v.st->nbytes && row_major(v.sizes, v.strides);
  if (whole && !capture_graph(v.st->device)) {
    flush(v.st->device);  // pending writes to this storage happen before the upload
    v.st->dtype = v.dtype;
    v.st->typed = true;
    if (v.st->dynamic()) {  // in the storage's layout, at its capacity
      set_packed(*v.st, src);
    } else {
      v.st->buffer = client.from_host(src, pjrt_type(v.dtype), {n}, v.st->device);
    }
    return;
  }
  auto tmp = std::make_shared<Storage>(nbytes, v.st->device);
  tmp->dtype = v.dtype;
  tmp->typed = true;
  tmp->buffer = client.from_host(src, pjrt_type(v.dtype), {n}, v.st->device);
  Graph& g = graph(v.st->device);
  copy_view(g, View{tmp, 0, v.sizes, row_major_strides(v.sizes), v.dtype}, v, "copy_ (host to tpu)");
  op_done(v.st->device);
}

// ---------------------------------------------------------------- bounded dynamism
int64_t Engine::bucket(int64_t n) const {
  for (int64_t s : steps_)
    if (s >= n) return s;
  double b = steps_.empty() ? 1.0 : static_cast<double>(steps_.back());
  while (b < static_cast<double>(n)) {
    b *= growth_ > 1.0 ? growth_ : 2.0;
    b = std::ceil(b / static_cast<double>(align_)) * static_cast<double>(align_);
  }
  return static_cast<int64_t>(b);
}

void Engine::set_buckets(std::vector<int64_t> steps, double growth, int64_t align) {
  std::sort(steps.begin(), steps.end());
  steps_ = std::move(steps);
  growth_ = growth;
  align_ = align > 0 ? align : 1;
}

View Engine::dynamic_view(const View& v) const {
  if (!v.st->dynamic()) return v;
  View d = v;
  d.runtime = true;
  const Storage& st = *v.st;
  if (v.sizes == st.base_sizes && v.strides == st.base_strides && v.offset == 0) {
    d.bound = st.base_bound;
    return d;
  }
  d.bound.assign(v.sizes.size(), 0);
  if (!st.base_sizes.empty() && (!st.typed || st.dtype == v.dtype)) {
    // a view of the tensor the storage was made for: a dim that walks a dynamic dim of it
    // (the same stride) is dynamic with that dim's bound; one that walks a slice or a split
    // of it, or several dims of it merged (x.view(-1)) with a dynamic one, at its own bucket
    const Shape &bs = st.base_sizes, &bt = st.base_strides, &bb = st.base_bound;
    // dim i walks inside base dim k (its stride a multiple of k's, within k's extent)
    auto inside = [&](size_t i, size_t k) {
      return bs[k] >= 2 && bt[k] > 0 && v.strides[i] % bt[k] == 0 && v.strides[i] < bt[k] * bs[k];
    };
    for (size_t i = 0; i < v.sizes.size(); ++i) {
      if (v.sizes[i] < 2) continue;
      for (size_t k = 0; k < bs.size(); ++k) {
        if (bs[k] < 2 || bt[k] != v.strides[i]) {
          if (inside(i, k) && bb[k] > 0) d.bound[i] = live_bound(v.sizes[i]);  // a split's outer factor
          if (inside(i, k)) break;
          continue;
        }
        if (v.sizes[i] == bs[k]) {
          d.bound[i] = bb[k];
          break;
        }
        if (v.sizes[i] < bs[k]) {
          if (bb[k] == 0) break;
          // the inner factor of a split (another dim walks k at this dim's extent), or a slice
          bool split = false;
          for (size_t j = 0; j < v.sizes.size(); ++j)
            split |= j != i && v.sizes[j] >= 2 && v.strides[j] == v.strides[i] * v.sizes[i];
          d.bound[i] = split ? live_bound(v.sizes[i]) : bucket(v.sizes[i]);
          break;
        }
        // merged with the dims before it (row-major among themselves): the product of their
        // bounds, so [B*T] of a [B, T/256] storage is bounded by B*256 whatever T is in that
        // bucket (one program for the bucket), and is read as a prefix of the buffer
        int64_t span = bs[k], stride = bt[k] * bs[k], padded = bb[k] > 0 ? bb[k] : bs[k];
        bool dyn = bb[k] > 0;
        for (size_t j = k; j-- > 0 && span < v.sizes[i];) {
          if (bs[j] == 1) continue;
          if (bt[j] != stride) break;
          span *= bs[j];
          stride *= bs[j];
          padded *= bb[j] > 0 ? bb[j] : bs[j];
          dyn |= bb[j] > 0;
        }
        if (span == v.sizes[i] && dyn) d.bound[i] = padded;
        break;
      }
    }
    return d;
  }
  for (size_t i = 0; i < v.sizes.size(); ++i)
    if (v.sizes[i] >= 2) d.bound[i] = st.bound_of(v.sizes[i]);
  return d;
}

namespace {
// Calls f(packed offset, padded offset) for each row (last dim) of a padded storage's base.
template <typename F>
void for_each_row(const Storage& st, F f) {
  const Shape &B = st.base_sizes;
  Shape full = st.full();
  size_t k = B.size();
  if (k == 0 || hlo::numel(B) == 0) return;
  Shape idx(k, 0);
  for (;;) {
    int64_t p = 0, q = 0, ps = B[k - 1], qs = full[k - 1];
    for (size_t j = k - 1; j-- > 0;) {
      p += idx[j] * ps;
      q += idx[j] * qs;
      ps *= B[j];
      qs *= full[j];
    }
    f(p, q);
    size_t j = k - 1;
    while (j-- > 0) {
      if (++idx[j] < B[j]) break;
      idx[j] = 0;
    }
    if (j == static_cast<size_t>(-1)) return;
  }
}
}  // namespace

std::vector<char> Engine::host_packed(const Storage& st) {
  size_t item = static_cast<size_t>(hlo::itemsize(st.dtype));
  std::vector<char> all(static_cast<size_t>(st.elements()) * item);
  st.buffer->to_host(all.data(), all.size());
  metrics.d2h_transfers++;
  metrics.d2h_bytes += static_cast<int64_t>(all.size());
  if (!st.padded) {
    all.resize(static_cast<size_t>(st.numel()) * item);
    return all;
  }
  std::vector<char> packed(static_cast<size_t>(st.numel()) * item);
  size_t row = static_cast<size_t>(st.base_sizes.back()) * item;
  for_each_row(st, [&](int64_t p, int64_t q) { std::memcpy(packed.data() + p * item, all.data() + q * item, row); });
  return packed;
}

void Engine::set_packed(Storage& st, const void* packed) {
  size_t item = static_cast<size_t>(hlo::itemsize(st.dtype));
  std::vector<char> buf(static_cast<size_t>(st.elements()) * item, 0);
  const char* src = static_cast<const char*>(packed);
  if (st.padded) {
    size_t row = static_cast<size_t>(st.base_sizes.back()) * item;
    for_each_row(st, [&](int64_t p, int64_t q) { std::memcpy(buf.data() + q * item, src + p * item, row); });
  } else {
    std::memcpy(buf.data(), src, static_cast<size_t>(st.numel()) * item);
  }
  st.buffer = rt::Client::get().from_host(buf.data(), pjrt_type(st.dtype), {st.elements()}, st.device);
  metrics.h2d_transfers++;
  metrics.h2d_bytes += static_cast<int64_t>(buf.size());
}

void Engine::make_dynamic(const StoragePtr& st, const Shape& sizes, const Shape& strides, const Shape& bound) {
  std::vector<std::pair<int64_t, int64_t>> dyn;
  Shape full = sizes;
  for (size_t i = 0; i < sizes.size(); ++i)
    if (bound[i] > 0) {
      dyn.emplace_back(sizes[i], bound[i]);
      full[i] = bound[i];
    }
  if (dyn.empty()) return;
  if (!st->typed) {
    st->dtype = DType::U8;
    st->typed = true;
  }
  // the whole storage as one row-major tensor (a fresh one, or the base it was made for with
  // more dims dynamic): laid out padded, its values (if any) moved through host memory
  bool whole = hlo::numel(sizes) == st->numel() && row_major(sizes, strides) && hlo::numel(sizes) > 0;
  bool same = st->dynamic() && st->padded && st->base_sizes == sizes && st->base_strides == strides;
  if (whole && (!st->dynamic() || same)) {
    Shape b = bound;
    if (same)
      for (size_t i = 0; i < b.size(); ++i) b[i] = std::max(b[i], st->base_bound[i]);
    if (!(same && b == st->base_bound)) {
      std::vector<char> values;
      if (st->buffer || pending(st)) {
        flush(st->device);
        if (st->buffer) values = host_packed(*st);
        metrics.dynamic_conversions++;
      }
      st->base_sizes = sizes;
      st->base_strides = strides;
      st->base_bound = b;
      st->padded = true;
      st->capacity = hlo::numel(st->full());
      record_sizes(*st, dyn);
      if (!values.empty()) set_packed(*st, values.data());
    }
    record_sizes(*st, dyn);
    return;
  }
  bool fresh = !st->dynamic();
  make_dynamic(st, st->numel() - hlo::numel(sizes) + hlo::numel(full), dyn);
  if (fresh) {
    st->base_sizes = sizes;
    st->base_strides = strides;
    st->base_bound = bound;
  } else if (!st->padded && st->base_sizes == sizes && st->base_strides == strides) {
    for (size_t i = 0; i < bound.size(); ++i) st->base_bound[i] = std::max(st->base_bound[i], bound[i]);
  }
}

void Engine::make_dynamic(const StoragePtr& st, int64_t capacity, const std::vector<std::pair<int64_t, int64_t>>& sizes) {
  if (!st->typed) {
    st->dtype = DType::U8;
    st->typed = true;
  }
  int64_t old = st->elements();
  capacity = std::max({capacity, st->numel(), st->dynamic() ? st->capacity : int64_t{0}});
  std::vector<char> values;  // moved through host memory: no program to compile
  bool move = (st->buffer || pending(st)) && capacity > old;
  if (move) {
    flush(st->device);  // its pending value first
    if (st->buffer) values = host_packed(*st);
    metrics.dynamic_conversions++;
  }
  if (capacity > st->capacity) st->padded = false;  // a larger buffer than the base's: packed
  st->capacity = capacity;
  record_sizes(*st, sizes);
  if (!values.empty()) set_packed(*st, values.data());
}

void Engine::record_sizes(Storage& st, const std::vector<std::pair<int64_t, int64_t>>& sizes) {
  for (const auto& [size, bound] : sizes) {
    if (live_.size() > 4096) live_.clear();
    live_[size] = {bound, epoch_};
    bool known = false;
    for (auto& e : st.dyn)
      if (e.first == size) {
        e.second = std::max(e.second, bound);
        known = true;
      }
    if (!known) st.dyn.emplace_back(size, bound);
  }
}

void Engine::make_static(const StoragePtr& st) {
  if (!st->dynamic()) return;
  if (pending(st)) flush(st->device);
  std::vector<char> values;
  if (st->buffer) values = host_packed(*st);
  st->dyn.clear();
  st->capacity = 0;
  st->padded = false;
  st->base_sizes.clear();
  st->base_strides.clear();
  st->base_bound.clear();
  if (!values.empty()) set_packed(*st, values.data());
}

int64_t Engine::live_bound(int64_t size) const {
  auto it = live_.find(size);
  return it != live_.end() && epoch_ - it->second.second <= 2 ? it->second.first : 0;
}

bool Engine::size_changed(const std::string& site, int64_t size) {
  if (!dynamism_) return false;
  if (sites_.size() > 65536) sites_.clear();
  SiteSizes& s = sites_[site];
  if (s.epoch != epoch_) {
    if (!s.cur.empty()) s.prev = std::move(s.cur);
    s.cur.clear();
    s.epoch = epoch_;
  }
  if (s.dynamic) return true;
  if (std::find(s.cur.begin(), s.cur.end(), size) == s.cur.end()) s.cur.push_back(size);
  s.dynamic = !s.prev.empty() && std::find(s.prev.begin(), s.prev.end(), size) == s.prev.end();
  if (s.dynamic) ++site_generation_;
  return s.dynamic;
}

}  // namespace tt::engine
