// Reduction family: sum, mean, prod, amax/amin, max/min(.dim), argmax/argmin,
// var/std (+_mean), all/any, logsumexp, vector norm, count_nonzero, aminmax, isin,
// cumsum/cumprod, cummax/cummin.
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
    Value r = c.b.reduce(x, c.b.zeros(x.dtype(), {}), dims, op::add);
    if (mean) r = c.b.div(r, elements(c.b, x, dims, r.dtype(), r.shape()));
    return {r};
  };
}

// amax / amin over dims (NaN propagates)
Rule extreme(size_t dim_arg, bool is_max) {
  return [dim_arg, is_max](Ctx& c) -> V {
    Value x = c.in(0);
    return {reduce_extreme(c.b, x, reduce_dims(c, dim_arg, x.rank()), is_max)};
  };
}

// max.dim / min.dim -> (values, indices); argmax / argmin
Rule arg_extreme(bool is_max, bool with_values) {
  return [is_max, with_values](Ctx& c) -> V {
    Value x = c.in(0);
    if (x.rank() > 64) throw Unsupported("reduction over a tensor with more than 64 dims");  // as reduce_dims
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

// vector norm of x over dims (ord at p_arg, None = 2): sum(|x|^p)^(1/p); inf: max|x|; 0: count of nonzeros
Value vector_norm(Ctx& c, size_t p_arg, size_t dim_arg) {
  Builder& b = c.b;
  Value in = c.in(0);  // |x| first: a complex x has a real norm
  Value x = hlo::is_complex(in.dtype()) ? b.convert(b.unary(op::abs, in), compute_type(c.odt()))
                                        : b.unary(op::abs, b.convert(in, compute_type(c.odt())));
  double p = c.num_or(p_arg, 2.0);
  auto dims = reduce_dims(c, dim_arg, x.rank());
  if (std::isinf(p)) return reduce_extreme(b, x, dims, p > 0);
  if (p == 0) {
    Value nz = b.convert(b.compare(x, b.zeros(x.dtype(), x.shape()), hlo::Cmp::NE), x.dtype());
    return b.reduce(nz, b.zeros(x.dtype(), {}), dims, op::add);
  }
  if (p == 1) return b.reduce(x, b.zeros(x.dtype(), {}), dims, op::add);
  if (p == 2) return b.unary(op::sqrt, b.reduce(b.mul(x, x), b.zeros(x.dtype(), {}), dims, op::add));
  Value pv = c.scalar(p_arg, x.dtype());
  Value s = b.reduce(b.binary(op::power, x, b.broadcast_to(pv, x.shape())), b.zeros(x.dtype(), {}), dims, op::add);
  return b.binary(op::power, s, b.broadcast_to(b.div(b.constant(1, x.dtype()), pv), s.shape()));
}

// Running (inclusive prefix) reduction along dim: reduce_window over a full-length causal window.
Value running(Builder& b, Value x, int64_t dim, Value init, op::Binary body) {
  int64_t n = x.shape()[dim];
  if (n == 0) return x;
  Shape window(x.rank(), 1), strides(x.rank(), 1);
  window[dim] = n;
  std::vector<std::pair<int64_t, int64_t>> pad(x.rank(), {0, 0});
  pad[dim] = {n - 1, 0};
  return b.reduce_window(x, init, window, strides, pad, body);
}

// var(x) = sum((x - mean)^2) / max(N - correction, 0)
std::pair<Value, Value> var_mean(Ctx& c, size_t dim_arg, size_t corr_arg) {
  Builder& b = c.b;
  Value x = b.convert(c.in(0), compute_type(c.in(0).dtype()));
  auto dims = reduce_dims(c, dim_arg, x.rank());
  double n = static_cast<double>(count(x.shape(), dims));
  double corr = c.num_or(corr_arg, 1.0);
  Value s = b.reduce(x, b.zeros(x.dtype(), {}), dims, op::add);
  Value mean = b.div(s, elements(b, x, dims, x.dtype(), s.shape()));
  Value centered = b.sub(x, b.broadcast_in_dim(keep_dims(b, mean, x.shape(), dims), x.shape(),
                                               [&] {
                                                 std::vector<int64_t> all;
                                                 for (int64_t i = 0; i < x.rank(); ++i) all.push_back(i);
                                                 return all;
                                               }()));
  auto square = [&](Value v) { return b.mul(v, v); };  // |x - mean|^2: real for complex x
  Value sq = hlo::is_complex(x.dtype()) ? b.add(square(b.real(centered)), square(b.imag(centered))) : square(centered);
  Value ss = b.reduce(sq, b.zeros(sq.dtype(), {}), dims, op::add);
  Value dof = x.type.dynamic  // max(N - correction, 0), N at run time for a bucketed x
                  ? b.max(b.sub(elements(b, x, dims, sq.dtype(), ss.shape()), b.constant(corr, sq.dtype(), ss.shape())),
                          b.zeros(sq.dtype(), ss.shape()))
                  : b.constant(std::max(n - corr, 0.0), sq.dtype(), ss.shape());
  Value var = b.div(ss, dof);
  return {var, mean};
}

// ---- rule bodies (registered in register_reduction below)

V lower_nansum(Ctx& c) {
  Value x = acc_input(c, 0, c.odt());
  Value clean = c.b.select(c.b.compare(x, x, hlo::Cmp::NE), c.b.zeros(x.dtype(), x.shape()), x);
  return {c.b.reduce(clean, c.b.zeros(x.dtype(), {}), reduce_dims(c, 1, x.rank()), op::add)};
}

// prod(x, dims); dim argument at `dim_arg`
Rule prod_like(size_t dim_arg) {
  return [dim_arg](Ctx& c) -> V {
    Value x = acc_input(c, 0, c.odt());
    return {c.b.reduce(x, c.b.constant(1, x.dtype()), reduce_dims(c, dim_arg, x.rank()), op::multiply)};
  };
}

// var_mean / std_mean -> (var or std, mean)
V lower_var_mean(Ctx& c) {
  auto [v, m] = var_mean(c, 1, 2);
  return {v, m};
}

V lower_std_mean(Ctx& c) {
  auto [v, m] = var_mean(c, 1, 2);
  return {c.b.unary(op::sqrt, v), m};
}

// all / any: reduce the "is nonzero" predicate with and / or
Rule all_any(bool is_all, const char* ov) {
  return [is_all, ov](Ctx& c) -> V {
    // out= of another dtype: CPU's error (the Meta kernel casts instead); bool and uint8 results only
    if (c.odt() != DType::Pred && c.odt() != DType::U8)
      throw UserError(std::string(is_all ? "all" : "any") + " only supports bool tensor for result, got: " +
                      torch_dtype_name(c.odt()));
    Value x = c.in(0);
    Value p = x.dtype() == DType::Pred ? x : c.b.compare(x, c.b.zeros(x.dtype(), x.shape()), hlo::Cmp::NE);
    auto dims = std::string(ov).empty() ? reduce_dims(c, kNoArg, x.rank()) : reduce_dims(c, 1, x.rank());
    return {c.b.reduce(p, c.b.constant_int(is_all ? 1 : 0, DType::Pred), dims, is_all ? op::and_ : op::or_)};
  };
}

// logsumexp(x) = m + log(sum(exp(x - m))), m = max (0 where infinite)
V lower_logsumexp(Ctx& c) {
  Builder& b = c.b;
  if (hlo::is_complex(c.in(0).dtype())) throw Unsupported("logsumexp of a complex tensor");
  Value x = b.convert(c.in(0), compute_type(c.odt()));
  auto dims = reduce_dims(c, 1, x.rank());
  std::vector<int64_t> all;
  for (int64_t i = 0; i < x.rank(); ++i) all.push_back(i);
  Value m = b.reduce(x, b.lowest(x.dtype()), dims, op::maximum);
  m = b.select(b.emit("is_finite", {m}, Type{DType::Pred, m.shape()}), m, b.zeros(m.dtype(), m.shape()));
  Value mb = b.broadcast_in_dim(keep_dims(b, m, x.shape(), dims), x.shape(), all);
  Value s = b.reduce(b.unary(op::exponential, b.sub(x, mb)), b.zeros(x.dtype(), {}), dims, op::add);
  return {b.add(b.unary(op::log, s), m)};
}

// legacy norm(x, p?, dim?, keepdim, dtype?): the same vector norm
Rule legacy_norm(size_t dim_arg) {
  return [dim_arg](Ctx& c) -> V { return {vector_norm(c, 1, dim_arg)}; };
}

// count_nonzero(x, dims) = sum(x != 0) over dims (int64)
V lower_count_nonzero(Ctx& c) {
  Value x = c.in(0);
  Value nz = c.b.convert(c.b.compare(x, c.b.zeros(x.dtype(), x.shape()), hlo::Cmp::NE), DType::S64);
  return {c.b.reduce(nz, c.b.zeros(DType::S64, {}), reduce_dims(c, 1, x.rank()), op::add)};
}

// aminmax(x, dim?, keepdim) = (amin, amax), NaN where the reduced slice has a NaN
// (the CPU plugin's min/max reductions skip NaNs)
V lower_aminmax(Ctx& c) {
  Builder& b = c.b;
  Value x = c.in(0);
  if (c.odt(0) != x.dtype() || c.odt(1) != x.dtype())  // out= tensors of another dtype: CPU rejects them
    throw UserError("aminmax: expected out tensors of the input's dtype");
  auto dims = reduce_dims(c, 1, x.rank());
  return {reduce_extreme(b, x, dims, false), reduce_extreme(b, x, dims, true)};
}

// trace(x) = sum of x[i, i]
V lower_trace(Ctx& c) {
  Builder& b = c.b;
  Value x = c.in(0);
  DType t = compute_type(c.odt());
  Value diag = b.compare(b.iota(DType::S64, x.shape(), 0), b.iota(DType::S64, x.shape(), 1), hlo::Cmp::EQ);
  Value v = b.select(diag, b.convert(x, t), b.zeros(t, x.shape()));
  return {b.convert(b.reduce(v, b.zeros(t, {}), {0, 1}, op::add), c.odt())};
}

// renorm(x, p, dim, maxnorm): each slice along dim with p-norm > maxnorm scaled by maxnorm / (norm + 1e-7)
V lower_renorm(Ctx& c) {
  Builder& b = c.b;
  if (hlo::is_complex(c.in(0).dtype())) throw Unsupported("renorm of a complex tensor");
  DType t = compute_type(c.odt());
  Value x = b.convert(c.in(0), t);
  if (x.rank() == 0) throw Unsupported("renorm of a 0-dim tensor");
  int64_t dim = wrap_dim(c.int_(2), x.rank());
  std::vector<int64_t> others;
  for (int64_t d = 0; d < x.rank(); ++d)
    if (d != dim) others.push_back(d);
  double p = c.num(1);
  Value a = b.unary(op::abs, x);
  Value norm;
  if (std::isinf(p)) {
    norm = reduce_extreme(b, a, others, p > 0);
  } else if (p == 0) {
    norm = b.reduce(b.convert(b.compare(a, b.zeros(t, a.shape()), hlo::Cmp::NE), t), b.zeros(t, {}), others, op::add);
  } else {
    Value pw = b.binary(op::power, a, b.constant(p, t, a.shape()));
    Value sm = b.reduce(pw, b.zeros(t, {}), others, op::add);
    norm = b.binary(op::power, sm, b.constant(1.0 / p, t, sm.shape()));
  }
  Value maxn = b.broadcast_to(c.scalar(3, t), norm.shape());
  Value factor = b.select(b.compare(norm, maxn, hlo::Cmp::GT),
                          b.div(maxn, b.add(norm, b.constant(1e-7, t, norm.shape()))), b.constant(1, t, norm.shape()));
  return {b.convert(b.mul(x, b.broadcast_in_dim(factor, x.shape(), {dim})), c.odt())};
}

// logcumsumexp(x, dim) = m + log(cumsum(exp(x - m))), m = max over the dim (0 where not finite)
V lower_logcumsumexp(Ctx& c) {
  Builder& b = c.b;
  DType t = compute_type(c.odt());
  Value x = b.convert(c.in(0), t);
  int64_t dim = wrap_dim(c.int_(1), x.rank());
  // complex: CPU scans log(e^a + e^b) pairwise, whose imaginary part is not
  // reduced to (-pi, pi]; not lowered
  if (hlo::is_complex(t)) throw Unsupported("logcumsumexp of a complex tensor");
  if (x.rank() == 0 || hlo::numel(x.shape()) == 0) return {b.convert(x, c.odt())};
  Value m = b.reduce(x, b.lowest(t), {dim}, op::maximum);
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
  Value cs = b.reduce_window(b.unary(op::exponential, b.sub(x, mb)), b.zeros(t, {}), window, strides, pad, op::add);
  return {b.convert(b.add(b.unary(op::log, cs), mb), c.odt())};
}

// isin(e, t, assume_unique, invert) = any(e[..., None] == flat(t)) (xor invert); one
// side may be a Python number
V lower_isin(Ctx& c) {
  Builder& b = c.b;
  auto dtype = [&](size_t i) {
    const Arg& a = c.arg(i);
    if (a.kind == Arg::Tensor) return a.tensor.dtype();
    return a.scalar_is_bool ? DType::Pred : a.scalar_is_int ? DType::S64 : DType::F32;
  };
  bool s0 = c.arg(0).kind != Arg::Tensor, s1 = c.arg(1).kind != Arg::Tensor;
  DType t = promote(dtype(0), dtype(1));
  if (s0 || s1) {  // a Python number only raises the category (to its default type)
    auto cat = [](DType d) { return d == DType::Pred ? 0 : hlo::is_int(d) ? 1 : hlo::is_float(d) ? 2 : 3; };
    DType tt = dtype(s0 ? 1 : 0), st = dtype(s0 ? 0 : 1);
    t = cat(st) > cat(tt) ? st : tt;
  }
  Shape es = c.oshape();
  int64_t m = s1 ? 1 : hlo::numel(c.in(1).shape());
  Value e = c.in_as(0, t, es);
  Value tv = s1 ? c.in_as(1, t, {1}) : b.reshape(b.convert(c.in(1), t), {m});
  Shape full = es;
  full.push_back(m);
  std::vector<int64_t> edims;
  for (size_t i = 0; i < es.size(); ++i) edims.push_back(static_cast<int64_t>(i));
  Value eq = b.compare(b.broadcast_in_dim(e, full, edims), b.broadcast_in_dim(tv, full, {int64_t(es.size())}),
                       hlo::Cmp::EQ);
  Value r = b.reduce(eq, b.constant_int(0, DType::Pred), {int64_t(es.size())}, op::or_);
  return {c.flag_or(3, false) ? b.unary(op::not_, r) : r};
}

// cummax(x, dim) = (v, i): v = running max, NaN from the first NaN on; i =
// running max of (hit ? position : -1), hit = (NaN seen ? isnan(x) : x == v): the
// last position holding the running maximum (ties take the later one, as on
// CPU). cummin alike. (Registered as cummax itself: CPU's _cummax_helper has
// no Meta kernel.)
Rule cummax_cummin(bool is_max) {
  return [is_max](Ctx& c) -> V {
    Builder& b = c.b;
    Value x = c.in(0);
    if (x.dtype() == DType::Pred) throw Unsupported("cummax/cummin of bool");
    if (x.rank() == 0) return {x, b.constant_int(0, DType::S64)};
    int64_t dim = wrap_dim(c.int_(1), x.rank());
    Value init = is_max ? b.lowest(x.dtype()) : b.highest(x.dtype());
    Value v = running(b, x, dim, init, is_max ? op::maximum : op::minimum);
    Value hit = b.compare(x, v, hlo::Cmp::EQ);
    if (hlo::is_float(x.dtype())) {  // the CPU plugin's max/min windows skip NaNs
      Value isnan = b.compare(x, x, hlo::Cmp::NE);
      Value seen = running(b, isnan, dim, b.constant_int(0, DType::Pred), op::or_);
      v = b.select(seen, b.constant(NAN, x.dtype(), x.shape()), v);
      hit = b.select(seen, isnan, hit);
    }
    Value pos = b.select(hit, b.iota(DType::S64, x.shape(), dim), b.constant_int(-1, DType::S64, x.shape()));
    return {v, running(b, pos, dim, b.constant_int(-1, DType::S64), op::maximum)};
  };
}

// cumsum / cumprod along dim
Rule cumsum_cumprod(bool is_prod) {
  return [is_prod](Ctx& c) -> V {
    Builder& b = c.b;
    Value x = b.convert(c.in(0), compute_type(c.odt()));
    if (x.rank() == 0) return {x};
    Value init = b.constant(is_prod ? 1 : 0, x.dtype());
    return {running(b, x, wrap_dim(c.int_(1), x.rank()), init, is_prod ? op::multiply : op::add)};
  };
}

}  // namespace

void register_reduction() {
  const std::pair<const char*, Rule> rules[] = {
      {"aten::sum", sum_like(kNoArg, false)},
      {"aten::sum.dim_IntList", sum_like(1, false)},
      {"aten::mean", sum_like(kNoArg, true)},
      {"aten::mean.dim", sum_like(1, true)},
      {"aten::nansum", lower_nansum},
      {"aten::prod", prod_like(kNoArg)},
      {"aten::prod.dim_int", prod_like(1)},
      {"aten::amax", extreme(1, true)},
      {"aten::amin", extreme(1, false)},
      {"aten::max", extreme(kNoArg, true)},
      {"aten::min", extreme(kNoArg, false)},
      {"aten::max.dim", arg_extreme(true, true)},
      {"aten::min.dim", arg_extreme(false, true)},
      {"aten::argmax", arg_extreme(true, false)},
      {"aten::argmin", arg_extreme(false, false)},
      {"aten::var.correction", [](Ctx& c) -> V { return {var_mean(c, 1, 2).first}; }},
      {"aten::std.correction", [](Ctx& c) -> V { return {c.b.unary(op::sqrt, var_mean(c, 1, 2).first)}; }},
      {"aten::var_mean.correction", lower_var_mean},
      {"aten::std_mean.correction", lower_std_mean},
      // all / any: reduce the "is nonzero" predicate with and / or
      {"aten::all", all_any(true, "")},
      {"aten::all.dim", all_any(true, ".dim")},
      {"aten::all.dims", all_any(true, ".dims")},
      {"aten::any", all_any(false, "")},
      {"aten::any.dim", all_any(false, ".dim")},
      {"aten::any.dims", all_any(false, ".dims")},
      {"aten::logsumexp", lower_logsumexp},
      {"aten::linalg_vector_norm", [](Ctx& c) -> V { return {vector_norm(c, 1, 2)}; }},
      // legacy norm(x, p?, dim?, keepdim, dtype?): the same vector norm
      {"aten::norm.Scalar", legacy_norm(kNoArg)},
      {"aten::norm.ScalarOpt_dtype", legacy_norm(kNoArg)},
      {"aten::norm.ScalarOpt_dim", legacy_norm(2)},
      {"aten::norm.ScalarOpt_dim_dtype", legacy_norm(2)},
      {"aten::count_nonzero", lower_count_nonzero},
      {"aten::count_nonzero.dim_IntList", lower_count_nonzero},
      {"aten::aminmax", lower_aminmax},
      {"aten::trace", lower_trace},
      {"aten::renorm", lower_renorm},
      {"aten::_logcumsumexp", lower_logcumsumexp},
      // isin: one side may be a Python number
      {"aten::isin.Tensor_Tensor", lower_isin},
      {"aten::isin.Tensor_Scalar", lower_isin},
      {"aten::isin.Scalar_Tensor", lower_isin},
      // cummax / cummin (registered as cummax itself: CPU's _cummax_helper has no Meta kernel)
      {"aten::cummax", cummax_cummin(true)},
      {"aten::cummin", cummax_cummin(false)},
      {"aten::cumsum", cumsum_cumprod(false)},
      {"aten::cumprod", cumsum_cumprod(true)},
  };
  for (auto& [name, rule] : rules) add_rule(name, rule);
}

}  // namespace tt::lower
