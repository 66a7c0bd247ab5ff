// Ops whose output shape depends on the data (nonzero, masked_select, unique,
// boolean-mask indexing). Each is composed of lowered tpu ops: the one number
// the shape needs (a count) is computed on the device and read back, which is
// the host sync such an op needs on any accelerator, and the result is then
// built on the device with that size.
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/native/Resize.h>
#include <torch/library.h>

#include "aten/tpu.h"

namespace tt::aten {
namespace {

at::TensorOptions long_on(const at::Tensor& t) { return t.options().dtype(at::kLong); }

// Flat positions (int64, ascending) of the true elements of a flat bool tensor,
// given their count: each true element's rank among the true ones is its slot.
at::Tensor true_positions(const at::Tensor& flat_mask, int64_t count) {
  int64_t n = flat_mask.numel();
  at::Tensor slot = flat_mask.cumsum(0, at::kLong) - 1;
  slot = at::where(flat_mask, slot, at::scalar_tensor(count, long_on(flat_mask)));  // false -> a spare slot
  at::Tensor out = at::zeros({count + 1}, long_on(flat_mask));
  out.scatter_(0, slot, at::arange(n, long_on(flat_mask)));
  return out.narrow(0, 0, count);
}

int64_t count_true(const at::Tensor& flat_mask) { return flat_mask.sum().item<int64_t>(); }

// Flat positions -> [k, ndim] coordinates of a tensor of the given sizes.
at::Tensor unravel(const at::Tensor& flat, at::IntArrayRef sizes) {
  int64_t nd = static_cast<int64_t>(sizes.size());
  if (nd == 0) return at::zeros({flat.numel(), 0}, flat.options());
  // an empty tensor has no coordinates (rows here are only nonzero_static's fill): no division by a 0 size
  if (c10::multiply_integers(sizes) == 0) return at::zeros({flat.numel(), nd}, flat.options());
  std::vector<at::Tensor> cols(nd);
  int64_t step = 1;
  for (int64_t d = nd - 1; d >= 0; --d) {
    cols[d] = at::floor_divide(flat, step).remainder(sizes[d]);
    step *= sizes[d];
  }
  return at::cat(std::vector<at::Tensor>(cols.begin(), cols.end()), 0).view({nd, flat.numel()}).t().contiguous();
}

// nonzero(x) = coordinates of x's non-zero elements, in row-major order
at::Tensor tpu_nonzero(const at::Tensor& self) {
  TORCH_CHECK(self.numel() < std::numeric_limits<int>::max(), "nonzero is not supported for tensors with more than ",
              "INT_MAX elements, file a support request");
  at::Tensor mask = self.ne(0).reshape({-1});
  return unravel(true_positions(mask, count_true(mask)), self.sizes());
}

// an out= tensor on another device (a CPU tensor) is rejected, as on CUDA, instead of being written across
void check_out_device(const at::Tensor& self, const at::Tensor& out) {
  TORCH_CHECK(out.device() == self.device(), "Expected all tensors to be on the same device, but found at least two ",
              "devices, ", self.device(), " and ", out.device(), "!");
}

at::Tensor& tpu_nonzero_out(const at::Tensor& self, at::Tensor& out) {
  check_out_device(self, out);
  TORCH_CHECK(out.dtype() == at::kLong, "nonzero: Expected out tensor to have scalar type Long ",
              "but got scalar type", out.scalar_type());  // CPU's message, spacing included
  at::assert_no_internal_overlap(out);
  at::assert_no_overlap(out, self);
  at::Tensor r = tpu_nonzero(self);
  at::native::resize_output(out, r.sizes());
  out.copy_(r);
  return out;
}

// nonzero_static(x, size, fill) = the first `size` coordinates of nonzero(x),
// rows past the count filled with `fill` (no host read: the size is given)
at::Tensor tpu_nonzero_static(const at::Tensor& self, int64_t size, int64_t fill_value) {
  if (size < 0) (void)at::nonzero_static(at::empty({0}, self.options().device(at::kCPU)), size, fill_value);
  at::Tensor mask = self.ne(0).reshape({-1});
  at::Tensor rank = mask.cumsum(0, at::kLong) - 1;
  at::Tensor slot = at::where(mask.logical_and(rank.lt(size)), rank, at::scalar_tensor(size, long_on(self)));
  at::Tensor flat = at::zeros({size + 1}, long_on(self));
  flat.scatter_(0, slot, at::arange(mask.numel(), long_on(self)));
  at::Tensor coords = unravel(flat.narrow(0, 0, size), self.sizes());
  at::Tensor valid = at::arange(size, long_on(self)).lt(mask.sum()).unsqueeze(1);
  return at::where(valid, coords, at::scalar_tensor(fill_value, long_on(self)));
}

// masked_select(x, m) = x's elements where m (broadcast together), row-major
at::Tensor tpu_masked_select(const at::Tensor& self, const at::Tensor& mask) {
  TORCH_CHECK(mask.scalar_type() == at::kBool, "masked_select: expected BoolTensor for mask");
  auto shape = at::infer_size(self.sizes(), mask.sizes());
  at::Tensor m = mask.expand(shape).reshape({-1});
  at::Tensor x = self.expand(shape).reshape({-1});
  return x.index_select(0, true_positions(m, count_true(m)));
}

at::Tensor& tpu_masked_select_out(const at::Tensor& self, const at::Tensor& mask, at::Tensor& out) {
  check_out_device(self, out);
  TORCH_CHECK(self.scalar_type() == out.scalar_type(), "masked_select(): self and result must have the same scalar type");
  at::assert_no_internal_overlap(out);  // CPU's checks
  at::assert_no_overlap(out, self);
  at::assert_no_overlap(out, mask);
  at::Tensor r = tpu_masked_select(self, mask);
  at::native::resize_output(out, r.sizes());
  out.copy_(r);
  return out;
}

// unique over consecutive runs of `sorted_vals` (flat): the values, each
// element's run id, and the run lengths.
std::tuple<at::Tensor, at::Tensor, at::Tensor> runs(const at::Tensor& vals) {
  int64_t n = vals.numel();
  at::Tensor starts = at::ones({n}, vals.options().dtype(at::kBool));
  if (n > 1) starts.narrow(0, 1, n - 1).copy_(vals.narrow(0, 1, n - 1).ne(vals.narrow(0, 0, n - 1)));
  int64_t k = count_true(starts);
  at::Tensor id = starts.cumsum(0, at::kLong) - 1;
  at::Tensor uniq = at::zeros({k}, vals.options()).scatter_(0, id, vals);  // every member of a run is equal
  at::Tensor counts = at::zeros({k}, long_on(vals)).scatter_add_(0, id, at::ones({n}, long_on(vals)));
  return {uniq, id, counts};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> tpu_unique2(const at::Tensor& self, bool sorted, bool return_inverse,
                                                            bool return_counts) {
  (void)sorted;  // the result is sorted either way (as on CPU and CUDA)
  at::Tensor empty = at::empty({0}, long_on(self));
  if (self.numel() == 0)
    return {at::empty({0}, self.options()), return_inverse ? at::zeros(self.sizes(), long_on(self)) : empty,
            return_counts ? at::zeros({0}, long_on(self)) : empty};
  auto [vals, perm] = self.reshape({-1}).sort(/*stable=*/true, 0, false);
  auto [uniq, id, counts] = runs(vals);
  at::Tensor inverse = empty;
  if (return_inverse)
    inverse = at::empty({self.numel()}, long_on(self)).scatter_(0, perm, id).view(self.sizes());
  return {uniq, inverse, return_counts ? counts : empty};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> tpu_unique_consecutive(const at::Tensor& self, bool return_inverse,
                                                                       bool return_counts, std::optional<int64_t> dim) {
  if (dim.has_value() && self.dim() > 1) {  // unique rows/slices: on the CPU, as before
    auto r = at::unique_consecutive(self.cpu(), return_inverse, return_counts, dim);
    return {std::get<0>(r).to(self.device()), std::get<1>(r).to(self.device()), std::get<2>(r).to(self.device())};
  }
  at::Tensor empty = at::empty({0}, long_on(self));
  if (self.numel() == 0)
    return {at::empty({0}, self.options()), return_inverse ? at::zeros(self.sizes(), long_on(self)) : empty,
            return_counts ? at::zeros({0}, long_on(self)) : empty};
  auto [uniq, id, counts] = runs(self.reshape({-1}));
  return {uniq, return_inverse ? id.view(self.sizes()) : empty, return_counts ? counts : empty};
}

// equal(a, b) = same sizes and all(a == b) (types promoted, as on CPU), read back as a bool
bool tpu_equal(const at::Tensor& self, const at::Tensor& other) {
  TORCH_CHECK(self.device() == other.device(), "Cannot compare two tensors on different devices. Got: ",
              self.device(), " and ", other.device());
  if (!self.is_same_size(other)) return false;
  if (self.numel() == 0) return true;
  return self.eq(other).all().item<bool>();
}

// repeat_interleave(repeats) = i repeated repeats[i] times: out[j] = #{cumsum(repeats) <= j}.
// The total (and the sign check) is the one host read, unless output_size gives it.
at::Tensor tpu_repeat_interleave(const at::Tensor& repeats, std::optional<c10::SymInt> output_size) {
  TORCH_CHECK(repeats.dim() == 1, "repeat_interleave only accept 1D vector as repeat");
  if (repeats.scalar_type() != at::kLong && repeats.scalar_type() != at::kInt)
    (void)at::repeat_interleave(at::zeros({1}, repeats.options().device(at::kCPU)));  // CPU's error for the dtype
  if (repeats.size(0) == 0) return at::empty_like(repeats);
  at::Tensor cum = repeats.cumsum(0, at::kLong);
  int64_t total;
  if (output_size.has_value()) {
    total = output_size->guard_int(__FILE__, __LINE__);
  } else {
    at::Tensor host = at::stack({cum[-1], repeats.min().to(at::kLong)}).cpu();
    total = host[0].item<int64_t>();
    TORCH_CHECK(host[1].item<int64_t>() >= 0, "repeats can not be negative");
  }
  at::Tensor j = at::arange(total, long_on(repeats));
  return at::searchsorted(cum, j, /*out_int32=*/false, /*right=*/true).to(repeats.scalar_type());
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("repeat_interleave.Tensor", TORCH_FN(tpu_repeat_interleave));
  m.impl("equal", TORCH_FN(tpu_equal));
  m.impl("nonzero", TORCH_FN(tpu_nonzero));
  m.impl("nonzero.out", TORCH_FN(tpu_nonzero_out));
  m.impl("nonzero_static", TORCH_FN(tpu_nonzero_static));
  m.impl("masked_select", TORCH_FN(tpu_masked_select));
  m.impl("masked_select.out", TORCH_FN(tpu_masked_select_out));
  m.impl("_unique2", TORCH_FN(tpu_unique2));
  m.impl("unique_consecutive", TORCH_FN(tpu_unique_consecutive));
}

}  // namespace

std::vector<std::string> composed_op_names() {
  return {"aten::_unique2",        "aten::equal",       "aten::masked_select", "aten::masked_select.out",
          "aten::nonzero",         "aten::nonzero.out", "aten::nonzero_static", "aten::unique_consecutive",
          "aten::repeat_interleave.Tensor"};
}

// x[mask] = v with one boolean mask of x's own shape, one value of x's dtype and no
// accumulation: where(mask, v, x). No host read of the mask's count, and one program
// whatever the count (the coordinates path below compiles one per count).
std::optional<at::Tensor> masked_put_as_where(const std::string& name, const std::vector<c10::IValue>& args) {
  if (args.size() < 4 || !args[0].isTensor() || !args[1].isList() || !args[2].isTensor() || !args[3].isBool() ||
      args[3].toBool())
    return std::nullopt;
  auto l = args[1].toList();
  if (l.size() != 1 || !l.get(0).isTensor()) return std::nullopt;
  at::Tensor self = args[0].toTensor(), mask = l.get(0).toTensor(), values = args[2].toTensor();
  if (!mask.defined() || mask.scalar_type() != at::kBool || mask.device() != self.device() ||
      !mask.sizes().equals(self.sizes()) || self.dim() == 0 || values.numel() != 1 ||
      values.scalar_type() != self.scalar_type() || values.dim() > self.dim())
    return std::nullopt;
  at::Tensor v = values.reshape({}).to(self.device());
  at::Tensor r = at::where(mask, v, self);
  if (name.back() != '_') return r;
  self.copy_(r);
  return self;
}

// Boolean (and uint8) masks among the indices of x[indices] become the int64
// coordinates of their true elements, as PyTorch does before indexing; a mask
// takes as many index positions as it has dims.
bool expand_mask_indices(const at::Tensor& self, c10::List<std::optional<at::Tensor>>& indices) {
  bool any = false;
  for (size_t i = 0; i < indices.size(); ++i) {
    std::optional<at::Tensor> e = indices.get(i);
    if (e && e->defined() && (e->scalar_type() == at::kBool || e->scalar_type() == at::kByte)) {
      if (e->dim() == 0) return false;  // x[True]: left to the generic path
      any = true;
    }
  }
  if (!any) return false;
  c10::List<std::optional<at::Tensor>> out;
  for (size_t i = 0; i < indices.size(); ++i) {
    std::optional<at::Tensor> e = indices.get(i);
    if (!(e && e->defined() && (e->scalar_type() == at::kBool || e->scalar_type() == at::kByte))) {
      out.push_back(e);
      continue;
    }
    const at::Tensor& mask = *e;
    if (mask.scalar_type() == at::kByte)
      TORCH_WARN("indexing with dtype torch.uint8 is now deprecated, please use a dtype torch.bool instead.");
    int64_t first = static_cast<int64_t>(out.size());
    for (int64_t j = 0; j < mask.dim(); ++j) {
      int64_t src = first + j;
      TORCH_CHECK_INDEX(src < self.dim() && mask.size(j) == self.size(src), "The shape of the mask ", mask.sizes(),
                        " at index ", j, " does not match the shape of the indexed tensor ", self.sizes(),
                        " at index ", src);
    }
    at::Tensor coords = tpu_nonzero(mask.to(at::kBool));
    for (int64_t j = 0; j < mask.dim(); ++j) out.push_back(coords.select(1, j));
  }
  indices = out;
  return true;
}

}  // namespace tt::aten
