// Where a tensor lies in its storage: the one layout type of the programs that bind tensors
// per call (compiled graphs, replicated programs).
#pragma once

#include <ATen/core/Tensor.h>

#include "aten/tpu.h"

namespace tt::aten {

// Where a tensor lies in its storage, and the storage's size and type (and, for a
// dynamic storage, its capacity and dynamic sizes: a program reads it at its bucket).
struct Layout {
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0, nbytes = 0;
  c10::ScalarType dtype = c10::kFloat;
  hlo::DType storage_dtype = hlo::DType::F32;
  int64_t capacity = 0;  // > 0: a dynamic storage
  std::vector<std::pair<int64_t, int64_t>> dyn;
  engine::Shape base_sizes, base_strides, base_bound;
  bool padded = false;  // its buffer holds the base tensor at its bounds (engine.h, Storage::padded)
  engine::Shape full;   // that shape

  static Layout of(const at::Tensor& t) {
    auto st = storage_of(t);
    Layout l{t.sizes().vec(), t.strides().vec(), t.storage_offset(), st->nbytes, t.scalar_type(),
             st->typed ? st->dtype : to_hlo(t.scalar_type())};
    if (st->dynamic()) {
      l.capacity = st->capacity;
      l.dyn = st->dyn;
      l.base_sizes = st->base_sizes;
      l.base_strides = st->base_strides;
      l.base_bound = st->base_bound;
      l.padded = st->padded;
      if (st->padded) l.full = st->full();
    }
    return l;
  }
  // the same place, whether or not the storage is dynamic
  bool same_place(const at::Tensor& t, const engine::Storage& st) const {
    return t.scalar_type() == dtype && t.storage_offset() == offset && st.nbytes == nbytes &&
           (!st.typed || st.dtype == storage_dtype) && t.sizes().equals(sizes) && t.strides().equals(strides);
  }
  bool matches(const at::Tensor& t, const engine::Storage& st) const {
    return same_place(t, st) && (capacity > 0 ? st.dynamic() && st.capacity == capacity && st.padded == padded &&
                                                    (!padded || st.full() == full)
                                              : !st.dynamic());
  }
  void make_dynamic(const engine::StoragePtr& st) const {  // st as the captured storage
    if (capacity <= 0) return;
    engine::Engine& eng = engine::Engine::get();
    if (!base_sizes.empty() && !st->dynamic()) eng.make_dynamic(st, base_sizes, base_strides, base_bound);
    eng.make_dynamic(st, capacity, dyn);
  }
};

// A tensor on device `device` over a new storage laid out as l (typed, dynamic as at capture).
at::Tensor tensor_on_new_storage(const Layout& l, int device);
// A tensor of l's sizes, strides, offset and dtype over base's storage.
at::Tensor view_like(const at::Tensor& base, const Layout& l);

}  // namespace tt::aten
