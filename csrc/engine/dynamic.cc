// Bounded dynamism: buckets, dynamic storages and their layouts, the size policy.
#include "engine/engine.h"
#include "engine/layout.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace tt::engine {

using hlo::Builder;
using hlo::Type;

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
    live_.put(size, {bound, epoch_});
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
  const auto* it = live_.peek(size);
  return it && epoch_ - it->second <= 2 ? it->first : 0;
}

bool Engine::size_changed(const std::string& site, int64_t size) {
  if (!dynamism_) return false;
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
