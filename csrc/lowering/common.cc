// Registry, Ctx accessors and helpers shared by the op families.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "lowering/lowering.h"

namespace tt::lower {

// Rules checked on bucketed values (see bucketed_rule), listed in dynamic_rules.cc
const std::unordered_set<std::string>& bucketed_rules();

namespace {
std::unordered_map<std::string, Rule>& registry() {
  static std::unordered_map<std::string, Rule> r;
  return r;
}
[[noreturn]] void bad_arg(size_t i, const char* want) {
  throw hlo::BuildError("lowering: argument " + std::to_string(i) + " is not " + want);
}

std::unordered_set<std::string>& casting() {
  static std::unordered_set<std::string> c;
  return c;
}
// the rules a family's register function added
template <typename F>
void mark_casting(F register_family) {
  std::unordered_set<std::string> old;
  for (auto& kv : registry()) old.insert(kv.first);
  register_family();
  for (auto& kv : registry())
    if (!old.count(kv.first)) casting().insert(kv.first);
}
}  // namespace

void add_rule(const std::string& name, Rule r) { registry()[name] = std::move(r); }

bool casts_to_output(const std::string& name) { return casting().count(name) > 0; }

namespace {
std::atomic<int>& bucket_override() {  // 0: the list, 1: every rule, 2: only `only_rules`
  static std::atomic<int> mode{[] {
    const char* e = std::getenv("TORCH_TPU_BUCKET_ALL_RULES");
    return e && *e && *e != '0' ? 1 : 0;
  }()};
  return mode;
}
std::unordered_set<std::string>& only_rules() {
  static std::unordered_set<std::string> s;
  return s;
}
}  // namespace

bool bucketed_rule(const std::string& name) { return bucketed_rules().count(name) > 0; }
int bucket_rules_override() { return bucket_override().load(std::memory_order_relaxed); }
bool bucket_rule_allowed(const std::string& name, bool listed) {
  switch (bucket_rules_override()) {
    case 1: return true;
    case 2: return only_rules().count(name) > 0;
    default: return listed;
  }
}
void set_bucket_rules_override(int mode, const std::vector<std::string>& only) {
  only_rules() = std::unordered_set<std::string>(only.begin(), only.end());
  bucket_override() = mode;
}

const Rule* find_rule(const std::string& name) {
  auto& r = registry();
  auto it = r.find(name);
  return it == r.end() ? nullptr : &it->second;
}

std::vector<std::string> rule_names() {
  std::vector<std::string> v;
  for (auto& kv : registry()) v.push_back(kv.first);
  std::sort(v.begin(), v.end());
  return v;
}

void register_all() {
  static std::once_flag once;
  std::call_once(once, [] {
    mark_casting(register_elementwise);
    register_reduction();
    register_shape();
    register_indexing();
    register_linalg();
    register_nn();
    register_random();
    register_resample();
    register_fft();
    register_pooling();
    mark_casting(register_special);
  });
}

// ---------------------------------------------------------------- Ctx
const Arg& Ctx::arg(size_t i) const {
  if (i >= args_.size()) bad_arg(i, "present");
  return args_[i];
}
Value Ctx::in(size_t i) const {
  const Arg& a = arg(i);
  if (a.kind != Arg::Tensor) bad_arg(i, "a tensor");
  return a.tensor;
}
const std::vector<Value>& Ctx::list(size_t i) const {
  const Arg& a = arg(i);
  if (a.kind != Arg::TensorList) bad_arg(i, "a tensor list");
  return a.tensors;
}
namespace {
const Arg& real_number(const Arg& a) {
  if (a.is_complex_number()) throw Unsupported("complex scalar argument");
  return a;
}
}  // namespace

int64_t Ctx::int_(size_t i) const {
  const Arg& a = real_number(arg(i));
  if (a.kind == Arg::Int) return a.i;
  if (a.kind == Arg::Scalar) {
    reads_.push_back({static_cast<int>(i), a.d_, -1});
    return static_cast<int64_t>(a.d_);
  }
  if (a.kind == Arg::Bool) return a.b;
  bad_arg(i, "an int");
}
bool Ctx::flag(size_t i) const {
  const Arg& a = arg(i);
  if (a.kind == Arg::Bool) return a.b;
  if (a.kind == Arg::Int) return a.i != 0;
  bad_arg(i, "a bool");
}
const std::vector<int64_t>& Ctx::ints(size_t i) const {
  const Arg& a = arg(i);
  if (a.kind != Arg::IntList) bad_arg(i, "an int list");
  return a.ints;
}
const std::string& Ctx::str(size_t i) const {
  const Arg& a = arg(i);
  if (a.kind != Arg::Str) bad_arg(i, "a string");
  return a.s;
}
double Ctx::check_number(size_t i) const {
  const Arg& a = real_number(arg(i));
  if (a.kind == Arg::Scalar) return a.d_;
  if (a.kind == Arg::Int) return static_cast<double>(a.i);
  if (a.kind == Arg::Bool) return a.b;
  bad_arg(i, "a number");
}
double Ctx::num(size_t i) const {
  const Arg& a = real_number(arg(i));
  if (a.kind == Arg::Scalar) {
    reads_.push_back({static_cast<int>(i), a.d_, -1});
    return a.d_;
  }
  if (a.kind == Arg::Int) return static_cast<double>(a.i);
  if (a.kind == Arg::Bool) return a.b;
  bad_arg(i, "a number");
}
bool Ctx::num_is(size_t i, double v) const {
  const Arg& a = arg(i);
  if (a.kind != Arg::Scalar) return num(i) == v;
  bool r = a.d_ == v && a.imag_ == 0;  // a complex number equals v only on the real line
  reads_.push_back({static_cast<int>(i), v, r ? 1 : 0});
  return r;
}
Value Ctx::scalar(size_t i, DType t) {
  const Arg& a = arg(i);
  if (a.kind == Arg::Tensor && a.tensor.rank() == 0) return b.convert(a.tensor, t);
  if (a.complex_) {  // a complex number: two runtime parameters (real, imaginary)
    if (!hlo::is_complex(t)) throw Unsupported("complex scalar argument for a real result");
    DType r = hlo::real_part(t);
    return b.complex(env.scalar_param(a.d_, false, r), env.scalar_param(a.imag_, false, r));
  }
  // a runtime parameter: the value is not part of the text (no read recorded)
  double v = a.kind == Arg::Scalar ? a.d_ : num(i);
  return env.scalar_param(v, a.kind == Arg::Int || a.scalar_is_int, t);
}
Value Ctx::scalar_or(size_t i, double dflt, DType t) {
  return has(i) ? scalar(i, t) : env.scalar_param(dflt, false, t);
}
const Type& Ctx::out(size_t k) const {
  if (k >= outs_.size()) throw hlo::BuildError("lowering: no output " + std::to_string(k));
  return outs_[k];
}
Value Ctx::in_as(size_t i, DType t, const Shape& s) {
  const Arg& a = arg(i);
  if (a.kind == Arg::Scalar || a.kind == Arg::Int || a.kind == Arg::Bool) {
    return b.broadcast_to(scalar(i, t), s);
  }
  return b.broadcast_to(b.convert(in(i), t), s);
}

// ---------------------------------------------------------------- helpers
int64_t wrap_dim(int64_t d, int64_t rank) {
  int64_t r = std::max<int64_t>(rank, 1);
  if (d < -r || d >= r)
    throw IndexError("Dimension out of range (expected to be in range of [" + std::to_string(-r) + ", " +
                     std::to_string(r - 1) + "], but got " + std::to_string(d) + ")");
  return d < 0 ? d + r : d;
}

std::vector<int64_t> reduce_dims(const Ctx& c, size_t i, int64_t rank) {
  // CPU's reductions keep dims in a 64-bit mask and reject more for some ops:
  // the CPU fallback gives exactly its result or error
  if (rank > 64) throw Unsupported("reduction over a tensor with more than 64 dims");
  std::vector<int64_t> dims;
  if (c.has(i)) {
    const Arg& a = c.arg(i);
    if (a.kind == Arg::Int) dims.push_back(wrap_dim(a.i, rank));
    else
      for (int64_t d : a.ints) dims.push_back(wrap_dim(d, rank));
  }
  if (dims.empty())
    for (int64_t d = 0; d < rank; ++d) dims.push_back(d);
  if (rank == 0) dims.clear();
  std::sort(dims.begin(), dims.end());
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  return dims;
}

// PyTorch's name of a dtype, as its messages spell it ("Float", "Long")
const char* torch_dtype_name(DType t) {
  switch (t) {
    case DType::Pred: return "Bool";
    case DType::S8: return "Char";
    case DType::S16: return "Short";
    case DType::S32: return "Int";
    case DType::S64: return "Long";
    case DType::U8: return "Byte";
    case DType::U16: return "UInt16";
    case DType::U32: return "UInt32";
    case DType::U64: return "UInt64";
    case DType::F16: return "Half";
    case DType::BF16: return "BFloat16";
    case DType::F32: return "Float";
    case DType::F64: return "Double";
    case DType::C64: return "ComplexFloat";
    case DType::C128: return "ComplexDouble";
  }
  return "?";
}

DType promote(DType a, DType b) {
  auto cat = [](DType t) { return t == DType::Pred ? 0 : hlo::is_int(t) ? 1 : hlo::is_float(t) ? 2 : 3; };
  if (cat(a) != cat(b)) return cat(a) > cat(b) ? a : b;
  if (a == b) return a;
  if ((a == DType::F16 && b == DType::BF16) || (a == DType::BF16 && b == DType::F16)) return DType::F32;
  return hlo::itemsize(a) >= hlo::itemsize(b) ? a : b;
}

DType compute_type(DType t) { return (t == DType::F16 || t == DType::BF16) ? DType::F32 : t; }

Value sum(Builder& b, Value x, const std::vector<int64_t>& dims) {
  DType acc = compute_type(x.dtype());
  if (acc == DType::Pred) acc = DType::S64;
  Value xa = b.convert(x, acc);
  return b.reduce(xa, b.constant(0, acc), dims, op::add);
}

Value reduce_extreme(Builder& b, Value x, const std::vector<int64_t>& dims, bool is_max) {
  Value r = b.reduce(x, is_max ? b.lowest(x.dtype()) : b.highest(x.dtype()), dims, is_max ? op::maximum : op::minimum);
  if (!hlo::is_float(x.dtype()) || dims.empty()) return r;
  Value nan = b.reduce(b.compare(x, x, hlo::Cmp::NE), b.constant_int(0, DType::Pred), dims, op::or_);
  return b.select(nan, b.constant(NAN, x.dtype(), r.shape()), r);
}

Value elements(Builder& b, Value x, const std::vector<int64_t>& dims, DType t, const Shape& shape) {
  if (!x.type.dynamic) {
    double n = 1;
    for (int64_t d : dims) n *= static_cast<double>(x.shape().at(d));
    return b.constant(n, t, shape);
  }
  return b.broadcast_in_dim(b.count(x, dims, t), shape, {});
}

std::vector<int64_t> all_dims(int64_t rank) {
  std::vector<int64_t> d(rank);
  for (int64_t i = 0; i < rank; ++i) d[i] = i;
  return d;
}

Value window_tap(Builder& b, Value xp, int64_t i, int64_t j, const Shape& dil, const Shape& stride, int64_t out_h,
                 int64_t out_w) {
  int64_t r = xp.rank();
  Shape start(r, 0), limit = xp.shape(), step(r, 1);
  start[r - 2] = i * dil[0];
  start[r - 1] = j * dil[1];
  limit[r - 2] = start[r - 2] + (out_h - 1) * stride[0] + 1;
  limit[r - 1] = start[r - 1] + (out_w - 1) * stride[1] + 1;
  step[r - 2] = stride[0];
  step[r - 1] = stride[1];
  return b.slice(xp, start, limit, step);
}

Value keep_dims(Builder& b, Value r, const Shape& full, const std::vector<int64_t>& dims) {
  Shape s = full;
  for (int64_t d : dims) s[d] = 1;
  return b.reshape(r, s);
}

// matmul precision: split f32 into bf16 parts hi + mid + lo and sum the products
// of the parts that the mode keeps, smallest first.
Value contract(Ctx& c, Value a, Value b, const ContractFn& op3, DType out) {
  auto op = [&](Value x, Value y) { return op3(x, y, ""); };
  Builder& B = c.b;
  DType t = a.dtype();
  if (b.dtype() != t) {
    t = promote(t, b.dtype());
    a = B.convert(a, t);
    b = B.convert(b, t);
  }
  if (t != DType::F32) return B.convert(op(a, b), out);  // bf16/f16 accumulate in f32 inside op
  Precision p = c.env.precision();
  if (c.env.native_precision()) {
    static const char* names[] = {"DEFAULT", "HIGH", "HIGHEST"};
    return B.convert(op3(a, b, names[static_cast<int>(p)]), out);
  }
  // HIGHEST elsewhere: one native float32 contraction (precision_config HIGHEST
  // keeps GPUs off TF32). It is at least as accurate as bf16x6 and, on plugins
  // without native bf16 products (CPU), about 6x cheaper.
  if (p == Precision::HIGHEST) return B.convert(op3(a, b, "HIGHEST"), out);
  auto split = [&](Value x, int parts) {
    std::vector<Value> ps;
    Value rest = x;
    for (int i = 0; i < parts; ++i) {
      Value p = B.convert(rest, DType::BF16);
      ps.push_back(p);
      if (i + 1 < parts) rest = B.sub(rest, B.convert(p, DType::F32));
    }
    return ps;
  };
  int parts = p == Precision::DEFAULT ? 1 : p == Precision::HIGH ? 2 : 3;
  auto pa = split(a, parts), pb = split(b, parts);
  Value r;
  if (p == Precision::DEFAULT) {
    r = op(pa[0], pb[0]);
  } else if (p == Precision::HIGH) {
    r = B.add(B.add(op(pa[1], pb[0]), op(pa[0], pb[1])), op(pa[0], pb[0]));
  } else {
    Value small = B.add(B.add(op(pa[2], pb[0]), op(pa[0], pb[2])), op(pa[1], pb[1]));
    Value mid = B.add(op(pa[1], pb[0]), op(pa[0], pb[1]));
    r = B.add(B.add(small, mid), op(pa[0], pb[0]));
  }
  return B.convert(r, out);
}

Value matmul(Ctx& c, Value a, Value b, const hlo::DotDims& d, DType out) {
  if (a.dtype() != b.dtype()) {
    auto name = [](DType t) {
      switch (t) {
        case DType::F32: return "float";
        case DType::F64: return "double";
        case DType::F16: return "c10::Half";
        case DType::BF16: return "c10::BFloat16";
        case DType::S64: return "long int";
        case DType::S32: return "int";
        default: return hlo::mlir_name(t);
      }
    };
    throw UserError(std::string("expected m1 and m2 to have the same dtype, but got: ") + name(a.dtype()) +
                    " != " + name(b.dtype()));
  }
  auto op = [&](Value x, Value y, const std::string& prec) {
    DType acc = (x.dtype() == DType::BF16 || x.dtype() == DType::F16) ? DType::F32 : x.dtype();
    return c.b.dot_general(x, y, d, acc, prec);
  };
  return contract(c, a, b, op, out);
}

// ---- counter-based RNG: lowbias32 hash (Wellons) of (counter + key), twice.
namespace {
Value hash32(Builder& b, Value x) {
  const Shape& s = x.shape();
  auto k = [&](int64_t v) { return b.constant_int(v, DType::U32, s); };
  auto xorshift = [&](Value v, int64_t sh) {
    return b.binary(op::xor_, v, b.binary(op::shift_right_logical, v, k(sh)));
  };
  x = xorshift(x, 16);
  x = b.mul(x, k(0x7feb352d));
  x = xorshift(x, 15);
  x = b.mul(x, k(0x846ca68b));
  x = xorshift(x, 16);
  return x;
}
Value random_bits(Ctx& c, int64_t n) {
  Builder& b = c.b;
  auto [key, base] = c.env.rng(n);
  Shape s{n};
  Value ctr = b.add(b.iota(DType::U32, s, 0), b.broadcast_to(base, s));
  Value kk = b.broadcast_to(key, s);
  Value h = hash32(b, b.binary(op::xor_, ctr, b.mul(kk, b.constant_int(0x9E3779B1, DType::U32, s))));
  return hash32(b, b.add(h, kk));
}
Value bits_to_unit(Builder& b, Value bits) {
  const Shape& s = bits.shape();
  Value top = b.binary(op::shift_right_logical, bits, b.constant_int(8, DType::U32, s));
  return b.mul(b.convert(top, DType::F32), b.constant(1.0 / 16777216.0, DType::F32, s));
}
}  // namespace

Value uniform01(Ctx& c, const Shape& s) {
  int64_t n = hlo::numel(s);
  return c.b.reshape(bits_to_unit(c.b, random_bits(c, n)), s);
}

Value normal01(Ctx& c, const Shape& s) {
  Builder& b = c.b;
  int64_t n = hlo::numel(s);
  int64_t h = (n + 1) / 2;
  Value u = bits_to_unit(b, random_bits(c, 2 * h));
  Shape hs{h};
  Value u1 = b.slice(u, {0}, {h}, {1}), u2 = b.slice(u, {h}, {2 * h}, {1});
  // u1 in (0, 1]: avoid log(0)
  u1 = b.sub(b.constant(1.0, DType::F32, hs), u1);
  Value r = b.unary(op::sqrt, b.mul(b.constant(-2.0, DType::F32, hs), b.unary(op::log, u1)));
  Value th = b.mul(b.constant(6.283185307179586, DType::F32, hs), u2);
  Value z = b.concatenate({b.mul(r, b.unary(op::cosine, th)), b.mul(r, b.unary(op::sine, th))}, 0);
  return b.reshape(b.slice(z, {0}, {n}, {1}), s);
}

Extent::Extent(Builder& b, Value x, int64_t dim) : n(x.shape().at(dim)) {
  if (x.type.dynamic) v = b.dim_size(x, dim, DType::S64);
}

Extent Extent::negated(Builder& b) const {
  Extent e(-n);
  if (v.valid()) e.v = b.neg(v);
  return e;
}

Value Extent::as(Builder& b, const Shape& shape) const {
  return v.valid() ? b.broadcast_in_dim(v, shape, {}) : b.constant_int(n, DType::S64, shape);
}

std::string index_oob(int64_t dim, const Extent& size) {
  return size.dynamic() ? "index {lo32} is out of bounds for dimension " + std::to_string(dim) + " with size {hi32}"
                        : "index {} is out of bounds for dimension " + std::to_string(dim) + " with size " + std::to_string(size.n);
}

void check_range(Ctx& c, Value idx, Extent lo, Extent hi, bool index_error, const std::string& message) {
  int64_t n = hlo::numel(idx.shape());
  if (n == 0) return;
  Builder& b = c.b;
  Value i = b.reshape(b.convert(idx, DType::S64), {n});
  // bad = i < lo or i >= hi; value = the largest offending index (else the smallest)
  Value bad = b.binary(op::or_, b.compare(i, lo.as(b, {n}), hlo::Cmp::LT), b.compare(i, hi.as(b, {n}), hlo::Cmp::GE));
  Value any = b.reduce(bad, b.constant_int(0, DType::Pred), {0}, op::or_);
  Value low = b.lowest(DType::S64);
  Value worst = b.reduce(b.select(bad, i, b.broadcast_to(low, {n})), low, {0}, op::maximum);
  if (hi.dynamic()) {  // the offending value in the low 32 bits, the run-time size in the high ones
    Value mask = b.constant_int(0xffffffffLL, DType::S64);
    worst = b.binary(op::or_, b.binary(op::and_, worst, mask), b.binary(op::shift_left, hi.v, b.constant_int(32, DType::S64)));
  }
  c.env.check(any, worst, index_error, message);
}

}  // namespace tt::lower
