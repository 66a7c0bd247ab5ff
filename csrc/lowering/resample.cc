// Resampling family: nearest/bilinear upsampling and reflection/replication
// padding, each a per-dimension remap x[idx] (or a blend of two) with indices
// and weights computed on the host exactly as PyTorch's CPU kernels compute them,
// and backward kernels that scatter-add the gradient back through the same map.
#include <algorithm>
#include <cmath>

#include "lowering/lowering.h"

namespace tt::lower {
namespace {
using V = std::vector<Value>;

// x with dimension `dim` remapped: out[..., i, ...] = x[..., idx[i], ...]
Value remap(Builder& b, Value x, int64_t dim, const std::vector<int64_t>& idx) {
  return b.take(x, b.constant_array(idx, DType::S64), dim);
}

// The adjoint of remap: dx[..., j, ...] = sum over i with idx[i] == j of g[..., i, ...]
Value remap_grad(Builder& b, Value g, int64_t dim, const std::vector<int64_t>& idx, int64_t in_size) {
  std::vector<int64_t> perm{dim};
  for (int64_t d = 0; d < g.rank(); ++d)
    if (d != dim) perm.push_back(d);
  Value front = b.transpose(g, perm);
  Shape zs = front.shape();
  zs[0] = in_size;
  int64_t n = static_cast<int64_t>(idx.size());
  Value out = b.scatter(b.zeros(g.dtype(), zs), b.reshape(b.constant_array(idx, DType::S64), {n, 1}), front, {0}, op::add);
  std::vector<int64_t> inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = static_cast<int64_t>(i);
  return b.transpose(out, inv);
}

// weights along `dim` (shape [n]) broadcast against x
Value along(Builder& b, const std::vector<double>& w, DType t, const Shape& full, int64_t dim) {
  return b.broadcast_in_dim(b.constant_array(w, t), full, {dim});
}

// PyTorch's source scale: align_corners ? (in-1)/(out-1) : (scale given ? 1/scale : in/out)
float area_scale(int64_t in, int64_t out, bool align, double given) {
  if (align) return out > 1 ? static_cast<float>(in - 1) / static_cast<float>(out - 1) : 0.f;
  return given > 0 ? static_cast<float>(1.0 / given) : static_cast<float>(in) / static_cast<float>(out);
}

std::vector<int64_t> nearest_index(int64_t in, int64_t out, double given) {
  float scale = area_scale(in, out, false, given);
  std::vector<int64_t> idx(out);
  for (int64_t i = 0; i < out; ++i)
    idx[i] = std::min(static_cast<int64_t>(std::floor(static_cast<float>(i) * scale)), in - 1);
  return idx;
}

struct Linear {
  std::vector<int64_t> i0, i1;
  std::vector<double> w0, w1;
};
Linear linear_weights(int64_t in, int64_t out, bool align, double given) {
  Linear l;
  float scale = area_scale(in, out, align, given);
  for (int64_t i = 0; i < out; ++i) {
    float src = align ? scale * static_cast<float>(i) : std::max(scale * (static_cast<float>(i) + 0.5f) - 0.5f, 0.f);
    int64_t h0 = std::min(static_cast<int64_t>(src), in - 1);
    int64_t h1 = h0 + (h0 < in - 1 ? 1 : 0);
    float lambda1 = std::min(std::max(src - static_cast<float>(h0), 0.f), 1.f);
    l.i0.push_back(h0);
    l.i1.push_back(h1);
    l.w0.push_back(1.f - lambda1);
    l.w1.push_back(lambda1);
  }
  return l;
}

std::vector<int64_t> pad_index(int64_t in, int64_t lo, int64_t hi, bool reflect) {
  std::vector<int64_t> idx;
  for (int64_t o = -lo; o < in + hi; ++o) {
    int64_t j = o;
    if (reflect) {
      int64_t period = 2 * (in - 1);
      if (period > 0) {
        j = ((j % period) + period) % period;
        if (j >= in) j = period - j;
      } else {
        j = 0;
      }
    } else {
      j = std::min(std::max<int64_t>(j, 0), in - 1);
    }
    idx.push_back(j);
  }
  return idx;
}

double opt(Ctx& c, size_t i) { return c.has(i) ? c.num(i) : 0.0; }

// The spatial dims of a resample: the last n dims.
Rule nearest(int n) {
  return [n](Ctx& c) -> V {
    Value x = c.in(0);
    int64_t r = x.rank();
    for (int i = 0; i < n; ++i) {
      int64_t d = r - n + i;
      x = remap(c.b, x, d, nearest_index(c.in(0).shape()[d], c.oshape()[d], opt(c, 2 + i)));
    }
    return {x};
  };
}
Rule nearest_backward(int n) {
  return [n](Ctx& c) -> V {
    Value g = c.b.convert(c.in(0), compute_type(c.odt()));
    const auto& in_size = c.ints(2);
    int64_t r = g.rank();
    for (int i = 0; i < n; ++i) {
      int64_t d = r - n + i;
      g = remap_grad(c.b, g, d, nearest_index(in_size[d], g.shape()[d], opt(c, 3 + i)), in_size[d]);
    }
    return {c.b.convert(g, c.odt())};
  };
}
Rule linear(int n) {
  return [n](Ctx& c) -> V {
    // CPU's uint8 kernel blends in fixed point with its own rounding: run it there
    if (!hlo::is_float(c.odt())) throw Unsupported("linear resampling of an integer tensor");
    Builder& b = c.b;
    DType t = compute_type(c.odt());
    Value x = b.convert(c.in(0), t);
    bool align = c.flag(2);
    int64_t r = x.rank();
    for (int i = 0; i < n; ++i) {
      int64_t d = r - n + i;
      Linear l = linear_weights(x.shape()[d], c.oshape()[d], align, opt(c, 3 + i));
      Value a = remap(b, x, d, l.i0), z = remap(b, x, d, l.i1);
      x = b.add(b.mul(a, along(b, l.w0, t, a.shape(), d)), b.mul(z, along(b, l.w1, t, z.shape(), d)));
    }
    return {b.convert(x, c.odt())};
  };
}
Rule linear_backward(int n) {
  return [n](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_type(c.odt());
    Value g = b.convert(c.in(0), t);
    const auto& in_size = c.ints(2);
    bool align = c.flag(3);
    int64_t r = g.rank();
    for (int i = n - 1; i >= 0; --i) {
      int64_t d = r - n + i;
      Linear l = linear_weights(in_size[d], g.shape()[d], align, opt(c, 4 + i));
      Value g0 = b.mul(g, along(b, l.w0, t, g.shape(), d)), g1 = b.mul(g, along(b, l.w1, t, g.shape(), d));
      g = b.add(remap_grad(b, g0, d, l.i0, in_size[d]), remap_grad(b, g1, d, l.i1, in_size[d]));
    }
    return {b.convert(g, c.odt())};
  };
}
// pad (left, right, top, bottom, ...) pairs from the last dim backwards
Rule padding(int n, bool reflect) {
  return [n, reflect](Ctx& c) -> V {
    Value x = c.in(0);
    const auto& p = c.ints(1);
    int64_t r = x.rank();
    for (int i = 0; i < n; ++i) {
      int64_t d = r - 1 - i;
      x = remap(c.b, x, d, pad_index(x.shape()[d], p[2 * i], p[2 * i + 1], reflect));
    }
    return {x};
  };
}
Rule padding_backward(int n, bool reflect) {
  return [n, reflect](Ctx& c) -> V {
    Value g = c.b.convert(c.in(0), compute_type(c.odt()));
    Value x = c.in(1);
    const auto& p = c.ints(2);
    int64_t r = g.rank();
    for (int i = 0; i < n; ++i) {
      int64_t d = r - 1 - i, in = x.shape()[d];
      g = remap_grad(c.b, g, d, pad_index(in, p[2 * i], p[2 * i + 1], reflect), in);
    }
    return {c.b.convert(g, c.odt())};
  };
}
}  // namespace

void register_resample() {
  add_rule("aten::upsample_nearest1d", nearest(1));
  add_rule("aten::upsample_nearest2d", nearest(2));
  add_rule("aten::upsample_nearest1d_backward", nearest_backward(1));
  add_rule("aten::upsample_nearest2d_backward", nearest_backward(2));
  add_rule("aten::upsample_linear1d", linear(1));
  add_rule("aten::upsample_bilinear2d", linear(2));
  add_rule("aten::upsample_linear1d_backward", linear_backward(1));
  add_rule("aten::upsample_bilinear2d_backward", linear_backward(2));
  for (bool reflect : {true, false}) {
    const char* base = reflect ? "aten::reflection_pad" : "aten::replication_pad";
    for (int n : {1, 2, 3}) {
      add_rule(std::string(base) + std::to_string(n) + "d", padding(n, reflect));
      add_rule(std::string(base) + std::to_string(n) + "d_backward", padding_backward(n, reflect));
    }
  }
}

}  // namespace tt::lower
