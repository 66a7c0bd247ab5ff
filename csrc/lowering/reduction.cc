// Reduction family: sum, mean, prod, amax/amin, max/min(.dim), argmax/argmin,
// var/std (+_mean), all/any, logsumexp, vector norm, cumsum/cumprod.
// f16/bf16 inputs accumulate in f32, as on CUDA.
#include <cmath>

#include "lowering/lowering.h"

namespace tt::lower {
namespace {

using V = std::vector<Value>;

// The input converted for accumulation into the output's type.
Value acc_input(Ctx& c, size_t i, DType out) {
  DType acc = compute_type(out);
  return c.b.convert(c.in(i), acc);
}

int64_t count(const Shape& s, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= s[d];
  return n;
}

// sum(x, dims) / mean(x, dims); dim argument at `dim_arg`
Rule sum_like(size_t dim_arg, bool mean) {
  return [dim_arg, mean](Ctx& c) -> V {
    Value x = acc_input(c, 0, c.odt());
    auto dims = reduce_dims(c, dim_arg, x.rank());
    Value r = c.b.reduce(x, c.b.zeros(x.dtype(), {}), dims, "add");
    if (mean) r = c.b.div(r, c.b.constant(static_cast<double>(count(x.shape(), dims)), r.dtype(), r.shape()));
    return {r};
  };
}

// amax / amin over dims (NaN propagates)
Rule extreme(size_t dim_arg, bool is_max) {
  return [dim_arg, is_max](Ctx& c) -> V {
    Value x = c.in(0);
    auto dims = reduce_dims(c, dim_arg, x.rank());
    Value init = is_max ? c.b.lowest(x.dtype()) : c.b.highest(x.dtype());
    return {c.b.reduce(x, init, dims, is_max ? "maximum" : "minimum")};
  };
}

// max.dim / min.dim -> (values, indices); argmax / argmin
Rule arg_extreme(bool is_max, bool with_values) {
  return [is_max, with_values](Ctx& c) -> V {
    Value x = c.in(0);
    if (!c.has(1)) {  // argmax without dim: over the flattened tensor
      Value flat = c.b.reshape(x, {hlo::numel(x.shape())});
      return {c.b.reduce_arg(flat, 0, is_max).second};
    }
    int64_t dim = wrap_dim(c.int_(1), x.rank());
    if (x.rank() == 0) {
      V r;
      if (with_values) r.push_back(x);
      r.push_back(c.b.constant_int(0, DType::S64));
      return r;
    }
    auto [v, i] = c.b.reduce_arg(x, dim, is_max);
    if (with_values) return {v, i};
    return {i};
  };
}

// var(x) = sum((x - mean)^2) / max(N - correction, 0)
std::pair<Value, Value> var_mean(Ctx& c, size_t dim_arg, size_t corr_arg) {
  Builder& b = c.b;
  Value x = b.convert(c.in(0), compute_type(c.in(0).dtype()));
  auto dims = reduce_dims(c, dim_arg, x.rank());
  double n = static_cast<double>(count(x.shape(), dims));
  double corr = c.num_or(corr_arg, 1.0);
  Value s = b.reduce(x, b.zeros(x.dtype(), {}), dims, "add");
  Value mean = b.div(s, b.constant(n, x.dtype(), s.shape()));
  Value centered = b.sub(x, b.broadcast_in_dim(keep_dims(b, mean, x.shape(), dims), x.shape(),
                                               [&] {
                                                 std::vector<int64_t> all;
                                                 for (int64_t i = 0; i < x.rank(); ++i) all.push_back(i);
                                                 return all;
                                               }()));
  Value ss = b.reduce(b.mul(centered, centered), b.zeros(x.dtype(), {}), dims, "add");
  Value var = b.div(ss, b.constant(std::max(n - corr, 0.0), x.dtype(), ss.shape()));
  return {var, mean};
}

}  // namespace

void register_reduction() {
  add_rule("aten::sum", sum_like(99, false));
  add_rule("aten::sum.dim_IntList", sum_like(1, false));
  add_rule("aten::mean", sum_like(99, true));
  add_rule("aten::mean.dim", sum_like(1, true));
  add_rule("aten::nansum", [](Ctx& c) -> V {
    Value x = acc_input(c, 0, c.odt());
    Value clean = c.b.select(c.b.compare(x, x, hlo::Cmp::NE), c.b.zeros(x.dtype(), x.shape()), x);
    return {c.b.reduce(clean, c.b.zeros(x.dtype(), {}), reduce_dims(c, 1, x.rank()), "add")};
  });
  for (auto [n, dim_arg] : {std::pair{"aten::prod", size_t(99)}, {"aten::prod.dim_int", size_t(1)}})
    add_rule(n, [dim_arg = dim_arg](Ctx& c) -> V {
      Value x = acc_input(c, 0, c.odt());
      return {c.b.reduce(x, c.b.constant(1, x.dtype()), reduce_dims(c, dim_arg, x.rank()), "multiply")};
    });
  add_rule("aten::amax", extreme(1, true));
  add_rule("aten::amin", extreme(1, false));
  add_rule("aten::max", extreme(99, true));
  add_rule("aten::min", extreme(99, false));
  add_rule("aten::max.dim", arg_extreme(true, true));
  add_rule("aten::min.dim", arg_extreme(false, true));
  add_rule("aten::argmax", arg_extreme(true, false));
  add_rule("aten::argmin", arg_extreme(false, false));
  add_rule("aten::var.correction", [](Ctx& c) -> V { return {var_mean(c, 1, 2).first}; });
  add_rule("aten::std.correction", [](Ctx& c) -> V { return {c.b.unary("sqrt", var_mean(c, 1, 2).first)}; });
  add_rule("aten::var_mean.correction", [](Ctx& c) -> V {
    auto [v, m] = var_mean(c, 1, 2);
    return {v, m};
  });
  add_rule("aten::std_mean.correction", [](Ctx& c) -> V {
    auto [v, m] = var_mean(c, 1, 2);
    return {c.b.unary("sqrt", v), m};
  });
  // all / any: reduce the "is nonzero" predicate with and / or
  for (bool is_all : {true, false})
    for (auto ov : {"", ".dim", ".dims"})
      add_rule(std::string(is_all ? "aten::all" : "aten::any") + ov, [is_all, ov](Ctx& c) -> V {
        Value x = c.in(0);
        Value p = x.dtype() == DType::Pred ? x : c.b.compare(x, c.b.zeros(x.dtype(), x.shape()), hlo::Cmp::NE);
        auto dims = std::string(ov).empty() ? reduce_dims(c, 99, x.rank()) : reduce_dims(c, 1, x.rank());
        return {c.b.reduce(p, c.b.constant_int(is_all ? 1 : 0, DType::Pred), dims, is_all ? "and" : "or")};
      });
  // logsumexp(x) = m + log(sum(exp(x - m))), m = max (0 where infinite)
  add_rule("aten::logsumexp", [](Ctx& c) -> V {
    Builder& b = c.b;
    Value x = b.convert(c.in(0), compute_type(c.odt()));
    auto dims = reduce_dims(c, 1, x.rank());
    std::vector<int64_t> all;
    for (int64_t i = 0; i < x.rank(); ++i) all.push_back(i);
    Value m = b.reduce(x, b.lowest(x.dtype()), dims, "maximum");
    m = b.select(b.emit("is_finite", {m}, Type{DType::Pred, m.shape()}), m, b.zeros(m.dtype(), m.shape()));
    Value mb = b.broadcast_in_dim(keep_dims(b, m, x.shape(), dims), x.shape(), all);
    Value s = b.reduce(b.unary("exponential", b.sub(x, mb)), b.zeros(x.dtype(), {}), dims, "add");
    return {b.add(b.unary("log", s), m)};
  });
  // linalg_vector_norm(x, ord, dim, keepdim, dtype): sum(|x|^p)^(1/p); inf: max|x|
  add_rule("aten::linalg_vector_norm", [](Ctx& c) -> V {
    Builder& b = c.b;
    Value x = b.unary("abs", b.convert(c.in(0), compute_type(c.odt())));
    double p = c.num_or(1, 2.0);
    auto dims = reduce_dims(c, 2, x.rank());
    if (std::isinf(p))
      return {b.reduce(x, p > 0 ? b.lowest(x.dtype()) : b.highest(x.dtype()), dims, p > 0 ? "maximum" : "minimum")};
    if (p == 0) {
      Value nz = b.convert(b.compare(x, b.zeros(x.dtype(), x.shape()), hlo::Cmp::NE), x.dtype());
      return {b.reduce(nz, b.zeros(x.dtype(), {}), dims, "add")};
    }
    if (p == 1) return {b.reduce(x, b.zeros(x.dtype(), {}), dims, "add")};
    if (p == 2) return {b.unary("sqrt", b.reduce(b.mul(x, x), b.zeros(x.dtype(), {}), dims, "add"))};
    Value pv = c.scalar(1, x.dtype());
    Value s = b.reduce(b.binary("power", x, b.broadcast_to(pv, x.shape())), b.zeros(x.dtype(), {}), dims, "add");
    return {b.binary("power", s, b.broadcast_to(b.div(b.constant(1, x.dtype()), pv), s.shape()))};
  });
  // trace(x) = sum of x[i, i]
  add_rule("aten::trace", [](Ctx& c) -> V {
    Builder& b = c.b;
    Value x = c.in(0);
    DType t = compute_type(c.odt());
    Value diag = b.compare(b.iota(DType::S64, x.shape(), 0), b.iota(DType::S64, x.shape(), 1), hlo::Cmp::EQ);
    Value v = b.select(diag, b.convert(x, t), b.zeros(t, x.shape()));
    return {b.convert(b.reduce(v, b.zeros(t, {}), {0, 1}, "add"), c.odt())};
  });
  // renorm(x, p, dim, maxnorm): each slice along dim with p-norm > maxnorm scaled by maxnorm / (norm + 1e-7)
  add_rule("aten::renorm", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_type(c.odt());
    Value x = b.convert(c.in(0), t);
    if (x.rank() == 0) throw Unsupported("renorm of a 0-dim tensor");
    int64_t dim = wrap_dim(c.int_(2), x.rank());
    std::vector<int64_t> others;
    for (int64_t d = 0; d < x.rank(); ++d)
      if (d != dim) others.push_back(d);
    double p = c.num(1);
    Value a = b.unary("abs", x);
    Value norm;
    if (std::isinf(p)) {
      norm = b.reduce(a, p > 0 ? b.lowest(t) : b.highest(t), others, p > 0 ? "maximum" : "minimum");
    } else if (p == 0) {
      norm = b.reduce(b.convert(b.compare(a, b.zeros(t, a.shape()), hlo::Cmp::NE), t), b.zeros(t, {}), others, "add");
    } else {
      Value pw = b.binary("power", a, b.constant(p, t, a.shape()));
      Value sm = b.reduce(pw, b.zeros(t, {}), others, "add");
      norm = b.binary("power", sm, b.constant(1.0 / p, t, sm.shape()));
    }
    Value maxn = b.broadcast_to(c.scalar(3, t), norm.shape());
    Value factor = b.select(b.compare(norm, maxn, hlo::Cmp::GT),
                            b.div(maxn, b.add(norm, b.constant(1e-7, t, norm.shape()))), b.constant(1, t, norm.shape()));
    return {b.convert(b.mul(x, b.broadcast_in_dim(factor, x.shape(), {dim})), c.odt())};
  });
  // logcumsumexp(x, dim) = m + log(cumsum(exp(x - m))), m = max over the dim (0 where not finite)
  add_rule("aten::_logcumsumexp", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_type(c.odt());
    Value x = b.convert(c.in(0), t);
    if (x.rank() == 0 || hlo::numel(x.shape()) == 0) return {b.convert(x, c.odt())};
    int64_t dim = wrap_dim(c.int_(1), x.rank());
    Value m = b.reduce(x, b.lowest(t), {dim}, "maximum");
    m = b.select(b.emit("is_finite", {m}, Type{DType::Pred, m.shape()}), m, b.zeros(t, m.shape()));
    Value mb = b.broadcast_in_dim(m, x.shape(), [&] {
      std::vector<int64_t> d;
      for (int64_t i = 0; i < x.rank(); ++i)
        if (i != dim) d.push_back(i);
      return d;
    }());
    int64_t n = x.shape()[dim];
    Shape window(x.rank(), 1), strides(x.rank(), 1);
    window[dim] = n;
    std::vector<std::pair<int64_t, int64_t>> pad(x.rank(), {0, 0});
    pad[dim] = {n - 1, 0};
    Value cs = b.reduce_window(b.unary("exponential", b.sub(x, mb)), b.zeros(t, {}), window, strides, pad, "add");
    return {b.convert(b.add(b.unary("log", cs), mb), c.odt())};
  });
  // cumsum / cumprod along dim: reduce_window over a full-length causal window
  for (bool is_prod : {false, true})
    add_rule(is_prod ? "aten::cumprod" : "aten::cumsum", [is_prod](Ctx& c) -> V {
      Builder& b = c.b;
      Value x = b.convert(c.in(0), compute_type(c.odt()));
      if (x.rank() == 0) return {x};
      int64_t dim = wrap_dim(c.int_(1), x.rank());
      int64_t n = x.shape()[dim];
      if (hlo::numel(x.shape()) == 0) return {x};
      Shape window(x.rank(), 1), strides(x.rank(), 1);
      window[dim] = n;
      std::vector<std::pair<int64_t, int64_t>> pad(x.rank(), {0, 0});
      pad[dim] = {n - 1, 0};
      Value init = b.constant(is_prod ? 1 : 0, x.dtype());
      return {b.reduce_window(x, init, window, strides, pad, is_prod ? "multiply" : "add")};
    });
}

}  // namespace tt::lower
