// Complex/FFT family. conj_physical, and PyTorch's three FFT primitives (_fft_c2c, _fft_r2c, _fft_c2r),
// which every torch.fft function and their gradients decompose to, as 1-D
// stablehlo.fft transforms applied one signal dim at a time (the DFT is
// separable). stablehlo's inverse transforms scale by 1/n; PyTorch's
// `normalization` (0: none, 1: 1/sqrt(n), 2: 1/n over the signal size) is
// applied on top.
#include <cmath>

#include "lowering/lowering.h"

namespace tt::lower {
namespace {
using V = std::vector<Value>;

// One 1-D transform of kind (FFT, IFFT, RFFT, IRFFT) along dim d with length n.
Value fft1(Builder& b, Value x, int64_t d, const char* kind, int64_t n, DType out, int64_t out_len) {
  int64_t r = x.rank();
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < r; ++i)
    if (i != d) perm.push_back(i);
  perm.push_back(d);
  Value t = b.transpose(x, perm);
  Shape s = t.shape();
  s.back() = out_len;
  Value y = b.emit("fft", {t}, Type{out, s},
                   std::string("fft_type = #stablehlo<fft_type ") + kind + ">, fft_length = " + hlo::i64_array({n}));
  std::vector<int64_t> inv(r);
  for (int64_t i = 0; i < r; ++i) inv[perm[i]] = i;
  return b.transpose(y, inv);
}

// x * f for a real factor f (complex or real x)
Value scale(Builder& b, Value x, double f) {
  if (f == 1.0) return x;
  return b.mul(x, b.constant(f, x.dtype(), x.shape()));
}

double norm_factor(int64_t mode, double n) { return mode == 1 ? 1.0 / std::sqrt(n) : mode == 2 ? 1.0 / n : 1.0; }

std::vector<int64_t> dims_of(const Ctx& c, size_t i, int64_t rank) {
  std::vector<int64_t> d;
  for (int64_t x : c.ints(i)) d.push_back(wrap_dim(x, rank));
  return d;
}

// c2c over `dims`; an inverse transform is made unnormalized (x n) before `norm` applies
Value c2c(Builder& b, Value x, const std::vector<int64_t>& dims, bool forward) {
  for (int64_t d : dims) {
    int64_t n = x.shape()[d];
    x = fft1(b, x, d, forward ? "FFT" : "IFFT", n, x.dtype(), n);
    if (!forward) x = scale(b, x, static_cast<double>(n));
  }
  return x;
}
}  // namespace

void register_fft() {
  // complex(re, im) = re + i im ; polar(r, t) = r cos t + i r sin t
  add_rule("aten::complex", [](Ctx& c) -> V {
    // CPU's checks: equal part dtypes, and (out=) the complex type of theirs
    DType part = hlo::real_part(c.odt());
    if (c.in(0).dtype() != c.in(1).dtype() || !hlo::is_complex(c.odt()) || c.in(0).dtype() != part)
      throw UserError("complex: real and imag parts must both be float32 (float64) for a complex64 (complex128) result");
    Value re = c.in_out(0, part), im = c.in_out(1, part);
    return {c.b.complex(re, im)};
  });
  add_rule("aten::polar", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType part = hlo::real_part(c.odt());
    Value r = c.in_out(0, part), t = c.in_out(1, part);
    return {b.complex(b.mul(r, b.unary(op::cosine, t)), b.mul(r, b.unary(op::sine, t)))};
  });
  // conj_physical(x) = re(x) - i im(x) (real x unchanged)
  add_rule("aten::conj_physical", [](Ctx& c) -> V { return {c.b.conj(c.in(0))}; });
  // _fft_c2c(x, dim, norm, forward) = DFT (or inverse DFT, unscaled) over dim, times norm
  add_rule("aten::_fft_c2c", [](Ctx& c) -> V {
    Builder& b = c.b;
    Value x = b.convert(c.in(0), hlo::complex_of(c.odt()));
    auto dims = dims_of(c, 1, x.rank());
    double n = 1;
    for (int64_t d : dims) n *= static_cast<double>(x.shape()[d]);
    return {scale(b, c2c(b, x, dims, c.flag(3)), norm_factor(c.int_(2), n))};
  });
  // _fft_r2c(x, dim, norm, onesided) = DFT of real x over dim (last dim halved when onesided), times norm
  add_rule("aten::_fft_r2c", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType ct = hlo::complex_of(c.odt());
    Value x = b.convert(c.in(0), hlo::real_part(ct));
    auto dims = dims_of(c, 1, x.rank());
    double n = 1;
    for (int64_t d : dims) n *= static_cast<double>(x.shape()[d]);
    Value y;
    if (c.flag(3)) {
      int64_t last = dims.back(), len = x.shape()[last];
      y = fft1(b, x, last, "RFFT", len, ct, len / 2 + 1);
      dims.pop_back();
      y = c2c(b, y, dims, true);
    } else {
      y = c2c(b, b.convert(x, ct), dims, true);
    }
    return {scale(b, y, norm_factor(c.int_(2), n))};
  });
  // _fft_c2r(x, dim, norm, n_last) = real inverse DFT (unscaled) over dim, last dim of length n_last, times norm
  add_rule("aten::_fft_c2r", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType ct = hlo::complex_of(c.odt());
    Value x = b.convert(c.in(0), ct);
    auto dims = dims_of(c, 1, x.rank());
    int64_t last = dims.back(), len = c.int_(3);
    double n = static_cast<double>(len);
    for (size_t i = 0; i + 1 < dims.size(); ++i) n *= static_cast<double>(x.shape()[dims[i]]);
    std::vector<int64_t> rest(dims.begin(), dims.end() - 1);
    x = c2c(b, x, rest, false);
    // IRFFT reads len/2 + 1 bins: pad or cut the last dim to that
    int64_t bins = len / 2 + 1, have = x.shape()[last];
    if (have > bins) {
      Shape lo(x.rank(), 0), hi = x.shape(), st(x.rank(), 1);
      hi[last] = bins;
      x = b.slice(x, lo, hi, st);
    } else if (have < bins) {
      Shape lo(x.rank(), 0), hi(x.rank(), 0), in(x.rank(), 0);
      hi[last] = bins - have;
      x = b.pad(x, b.zeros(ct, {}), lo, hi, in);
    }
    Value y = fft1(b, x, last, "IRFFT", len, hlo::real_part(ct), len);
    return {scale(b, scale(b, y, static_cast<double>(len)), norm_factor(c.int_(2), n))};
  });
}

}  // namespace tt::lower
