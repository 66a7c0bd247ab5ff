#include "hlo/builder.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <sstream>

namespace tt::hlo {

const char* mlir_name(DType t) {
  switch (t) {
    case DType::Pred: return "i1";
    case DType::S8: return "i8";
    case DType::S16: return "i16";
    case DType::S32: return "i32";
    case DType::S64: return "i64";
    case DType::U8: return "ui8";
    case DType::U16: return "ui16";
    case DType::U32: return "ui32";
    case DType::U64: return "ui64";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::C64: return "complex<f32>";
    case DType::C128: return "complex<f64>";
  }
  return "?";
}

int64_t itemsize(DType t) {
  switch (t) {
    case DType::Pred: case DType::S8: case DType::U8: return 1;
    case DType::S16: case DType::U16: case DType::F16: case DType::BF16: return 2;
    case DType::S32: case DType::U32: case DType::F32: return 4;
    case DType::S64: case DType::U64: case DType::F64: case DType::C64: return 8;
    case DType::C128: return 16;
  }
  return 0;
}

bool is_float(DType t) { return t == DType::F16 || t == DType::BF16 || t == DType::F32 || t == DType::F64; }
bool is_complex(DType t) { return t == DType::C64 || t == DType::C128; }
bool is_unsigned(DType t) { return t == DType::U8 || t == DType::U16 || t == DType::U32 || t == DType::U64; }
DType real_part(DType t) { return t == DType::C128 ? DType::F64 : t == DType::C64 ? DType::F32 : t; }
DType complex_of(DType t) { return t == DType::F64 || t == DType::C128 ? DType::C128 : DType::C64; }
bool is_int(DType t) { return !is_float(t) && !is_complex(t) && t != DType::Pred; }

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string join(const std::vector<int64_t>& v, const char* sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += sep;
    s += std::to_string(v[i]);
  }
  return s;
}

std::string i64_array(const std::vector<int64_t>& v) {
  return v.empty() ? "array<i64>" : "array<i64: " + join(v) + ">";
}

std::string Type::str() const {
  std::string s = "tensor<";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (printed_dynamic >> i & 1 ? std::string("?") : std::to_string(shape[i])) + "x";
  s += mlir_name(dtype);
  if (printed_dynamic) {
    s += ", #stablehlo.bounds<";
    for (size_t i = 0; i < shape.size(); ++i)
      s += (i ? ", " : "") + (printed_dynamic >> i & 1 ? std::to_string(shape[i]) : std::string("?"));
    s += ">";
  }
  return s + ">";
}

namespace {
std::string types(const std::vector<Value>& vs) {
  std::string s;
  for (size_t i = 0; i < vs.size(); ++i) s += (i ? ", " : "") + vs[i].type.str();
  return s;
}
std::string types(const std::vector<Type>& ts) {
  std::string s;
  for (size_t i = 0; i < ts.size(); ++i) s += (i ? ", " : "") + ts[i].str();
  return s;
}

// Dimension arguments are checked before any shape is indexed with them: a bad
// dim from a rule is a BuildError (a RuntimeError for the user), never an
// out-of-bounds read.
void check_dim(const char* op, int64_t d, int64_t rank) {
  if (d < 0 || d >= rank)
    throw BuildError(std::string(op) + ": dimension " + std::to_string(d) + " out of range for rank " +
                     std::to_string(rank));
}
void check_dims(const char* op, const std::vector<int64_t>& dims, int64_t rank) {
  for (int64_t d : dims) check_dim(op, d, rank);
}
void check_arity(const char* op, size_t n, int64_t rank) {
  if (static_cast<int64_t>(n) != rank)
    throw BuildError(std::string(op) + ": " + std::to_string(n) + " entries for rank " + std::to_string(rank));
}

// Exact literal for a floating value of type t: its bit pattern in hex.
std::string float_literal(double v, DType t) {
  char buf[32];
  if (t == DType::F64) {
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    snprintf(buf, sizeof buf, "0x%016llX", static_cast<unsigned long long>(bits));
    return buf;
  }
  float f = static_cast<float>(v);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if (t == DType::F32) {
    snprintf(buf, sizeof buf, "0x%08X", bits);
  } else if (t == DType::BF16) {
    // round to nearest even
    uint32_t r = std::isnan(f) ? 0x7FC00000u : bits + 0x7FFFu + ((bits >> 16) & 1u);
    snprintf(buf, sizeof buf, "0x%04X", r >> 16);
  } else {  // F16
    uint16_t h;
    // IEEE half conversion with round-to-nearest-even
    uint32_t sign = (bits >> 16) & 0x8000u;
    int32_t exp = static_cast<int32_t>((bits >> 23) & 0xFF) - 127 + 15;
    uint32_t mant = bits & 0x7FFFFFu;
    if (((bits >> 23) & 0xFF) == 0xFF) {
      h = static_cast<uint16_t>(sign | 0x7C00u | (mant ? 0x200u : 0));
    } else if (exp >= 31) {
      h = static_cast<uint16_t>(sign | 0x7C00u);
    } else if (exp <= 0) {
      if (exp < -10) {
        h = static_cast<uint16_t>(sign);
      } else {
        mant |= 0x800000u;
        uint32_t shift = static_cast<uint32_t>(14 - exp);
        uint32_t hm = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (hm & 1))) ++hm;
        h = static_cast<uint16_t>(sign | hm);
      }
    } else {
      uint32_t hm = mant >> 13;
      uint32_t rem = mant & 0x1FFFu;
      uint32_t out = sign | (static_cast<uint32_t>(exp) << 10) | hm;
      if (rem > 0x1000u || (rem == 0x1000u && (hm & 1))) ++out;
      h = static_cast<uint16_t>(out);
    }
    snprintf(buf, sizeof buf, "0x%04X", h);
  }
  return buf;
}
}  // namespace

Builder::Builder() = default;

Value Builder::param(const Type& t) {
  params_.push_back(t);
  Value v;
  v.id = next_++;
  param_ids_.push_back(v.id);
  v.type = t;
  return v;
}

void Builder::alias(int p, int r) { aliases_.emplace_back(p, r); }

std::string Builder::module(const std::vector<Value>& results, int replicas) const {
  std::ostringstream os;
  os << "module @tt attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = " << replicas << " : i32} {\n"
     << "  func.func public @main(";
  for (size_t i = 0; i < params_.size(); ++i) {
    if (i) os << ", ";
    os << "%v" << param_ids_[i] << ": " << params_[i].str();
    for (auto& a : aliases_)
      if (a.first == static_cast<int>(i)) os << " {tf.aliasing_output = " << a.second << " : i32}";
  }
  os << ") -> (" << types(results) << ") {\n" << body_ << "    return";
  for (size_t i = 0; i < results.size(); ++i) os << (i ? ", " : " ") << "%v" << results[i].id;
  if (!results.empty()) os << " : " << types(results);
  os << "\n  }\n";
  for (const auto& f : funcs_) os << *f.second << "\n";
  os << "}\n";
  return os.str();
}

void Builder::add_function(const std::string& symbol, std::shared_ptr<const std::string> text) {
  for (const auto& f : funcs_)
    if (f.first == symbol) return;
  funcs_.emplace_back(symbol, std::move(text));
}

std::vector<Value> Builder::call(const std::string& symbol, const std::vector<Value>& operands,
                                 const std::vector<Type>& results) {
  return emit_multi("func.call", operands, results, "callee = @" + symbol);
}

std::vector<Value> Builder::emit_multi(const std::string& op, const std::vector<Value>& operands,
                                       const std::vector<Type>& results, const std::string& attrs,
                                       const std::string& region) {
  std::vector<Value> out;
  bool dyn = false;  // a result of an op on a dynamic value may be dynamic (see Type::dynamic)
  for (const Value& v : operands) dyn |= v.type.dynamic;
  if (dyn) {
    std::vector<Type> ts = results;
    for (auto& t : ts) t.dynamic = true;
    return emit_typed(op, operands, ts, attrs, region);
  }
  return emit_typed(op, operands, results, attrs, region);
}

std::vector<Value> Builder::emit_typed(const std::string& op, const std::vector<Value>& operands,
                                       const std::vector<Type>& results, const std::string& attrs,
                                       const std::string& region) {
  std::vector<Value> out;
  if (dry_) {  // the same ids as the text path below
    if (results.size() == 1) return {fresh(results[0])};
    next_ += static_cast<int>(results.size());
    for (auto& t : results) out.push_back(fresh(t));
    return out;
  }
  std::ostringstream os;
  os << "    ";
  int first = next_;
  if (results.size() == 1) {
    os << "%v" << first << " = ";
  } else if (results.size() > 1) {
    os << "%v" << first << ":" << results.size() << " = ";
  }
  next_ += static_cast<int>(results.size());
  // ops of other dialects (e.g. "chlo.erf") are named in full
  os << "\"" << (op.find('.') == std::string::npos ? "stablehlo." : "") << op << "\"(";
  for (size_t i = 0; i < operands.size(); ++i) os << (i ? ", " : "") << "%v" << operands[i].id;
  os << ")";
  if (!region.empty()) os << " (" << region << ")";
  if (!attrs.empty()) os << " {" << attrs << "}";
  os << " : (" << types(operands) << ") -> ";
  if (results.size() == 1) os << results[0].str();
  else os << "(" << types(results) << ")";
  os << "\n";
  body_ += os.str();
  if (results.size() == 1) {
    Value v;
    v.id = first;
    v.type = results[0];
    out.push_back(v);
  } else {
    // Multi-result ops are referenced as %vN#i; rebind each to a fresh name.
    for (size_t i = 0; i < results.size(); ++i) {
      Value v;
      v.id = next_++;
      v.type = results[i];
      // An identity-free alias: MLIR allows "%a = %b#i" only via ops, so reshape
      // to the same shape (folded away by the compiler).
      body_ += "    %v" + std::to_string(v.id) + " = \"stablehlo.reshape\"(%v" + std::to_string(first) + "#" +
               std::to_string(i) + ") : (" + results[i].str() + ") -> " + results[i].str() + "\n";
      out.push_back(v);
    }
  }
  return out;
}

Value Builder::emit(const std::string& op, const std::vector<Value>& operands, const Type& result,
                    const std::string& attrs) {
  return emit_multi(op, operands, {result}, attrs)[0];
}

// ---------------------------------------------------------------- constants
Value Builder::constant(double v, DType t, const Shape& shape) {
  if (dry_) return fresh(Type{t, shape});
  std::string lit;
  if (is_float(t)) lit = float_literal(v, t);
  else if (t == DType::Pred) lit = v != 0 ? "true" : "false";
  else if (is_complex(t)) lit = "(" + float_literal(v, real_part(t)) + ", " + float_literal(0.0, real_part(t)) + ")";
  else  // an integer type: truncated (NaN: 0; beyond int64: its bound), then wrapped by constant_int
    return constant_int(std::isnan(v) ? 0 : v >= 9.2233720368547758e18 ? INT64_MAX : v <= -9.2233720368547758e18 ? INT64_MIN
                                                                                                          : static_cast<int64_t>(v),
                        t, shape);
  Type ty{t, shape};
  return emit("constant", {}, ty, "value = dense<" + lit + "> : " + ty.str());
}

Value Builder::constant_int(int64_t v, DType t, const Shape& shape) {
  if (is_float(t) || is_complex(t)) return constant(static_cast<double>(v), t, shape);
  if (dry_) return fresh(Type{t, shape});
  Type ty{t, shape};
  // v wrapped to the type's width, as a C++ conversion does (the literal must fit the type)
  int bits = static_cast<int>(8 * itemsize(t));
  std::string lit;
  if (t == DType::Pred) lit = v ? "true" : "false";
  else if (bits == 64) lit = t == DType::U64 ? std::to_string(static_cast<uint64_t>(v)) : std::to_string(v);
  else {
    uint64_t u = static_cast<uint64_t>(v) & ((uint64_t{1} << bits) - 1);
    bool neg = !is_unsigned(t) && (u >> (bits - 1));
    lit = neg ? std::to_string(static_cast<int64_t>(u) - (int64_t{1} << bits)) : std::to_string(u);
  }
  return emit("constant", {}, ty, "value = dense<" + lit + "> : " + ty.str());
}

Value Builder::lowest(DType t) {
  switch (t) {
    case DType::Pred: return constant_int(0, t);
    case DType::S8: return constant_int(INT8_MIN, t);
    case DType::S16: return constant_int(INT16_MIN, t);
    case DType::S32: return constant_int(INT32_MIN, t);
    case DType::S64: return constant_int(INT64_MIN, t);
    case DType::U8: case DType::U16: case DType::U32: case DType::U64: return constant_int(0, t);
    default: return constant(-std::numeric_limits<double>::infinity(), t);
  }
}

Value Builder::highest(DType t) {
  switch (t) {
    case DType::Pred: return constant_int(1, t);
    case DType::S8: return constant_int(INT8_MAX, t);
    case DType::S16: return constant_int(INT16_MAX, t);
    case DType::S32: return constant_int(INT32_MAX, t);
    case DType::S64: return constant_int(INT64_MAX, t);
    case DType::U8: return constant_int(255, t);
    case DType::U16: return constant_int(UINT16_MAX, t);
    case DType::U32: return constant_int(UINT32_MAX, t);
    case DType::U64: return constant_int(-1, t);  // all ones: UINT64_MAX
    default: return constant(std::numeric_limits<double>::infinity(), t);
  }
}

Value Builder::constant_array(const std::vector<int64_t>& v, DType t) {
  Type ty{t, {static_cast<int64_t>(v.size())}};
  if (v.empty()) return zeros(t, ty.shape);
  if (dry_) return fresh(ty);
  return emit("constant", {}, ty, "value = dense<[" + join(v) + "]> : " + ty.str());
}

Value Builder::constant_array(const std::vector<double>& v, DType t) {
  if (!is_float(t) && !is_complex(t)) {  // integer literals, truncated
    std::vector<int64_t> iv;
    for (double x : v) iv.push_back(std::isnan(x) ? 0 : static_cast<int64_t>(std::max(-9.2e18, std::min(9.2e18, x))));
    return constant_array(iv, t);
  }
  Type ty{t, {static_cast<int64_t>(v.size())}};
  if (v.empty()) return zeros(t, ty.shape);
  if (dry_) return fresh(ty);
  std::string lits;
  for (size_t i = 0; i < v.size(); ++i)
    lits += (i ? ", " : "") + (is_complex(t) ? "(" + float_literal(v[i], real_part(t)) + ", " + float_literal(0.0, real_part(t)) + ")"
                                             : float_literal(v[i], t));
  return emit("constant", {}, ty, "value = dense<[" + lits + "]> : " + ty.str());
}

Value Builder::iota(DType t, const Shape& s, int64_t dim) {
  check_dim("iota", dim, static_cast<int64_t>(s.size()));
  return emit("iota", {}, Type{t, s}, "iota_dimension = " + std::to_string(dim) + " : i64");
}

// ---------------------------------------------------------------- elementwise
Value Builder::unary(op::Unary f, Value x) {
  if (f == op::abs && is_complex(x.dtype())) return emit(f.name, {x}, Type{real_part(x.dtype()), x.shape()});  // |re + i im|
  return emit(f.name, {x}, x.type);
}

Value Builder::real(Value x) { return emit("real", {x}, Type{real_part(x.dtype()), x.shape()}); }
Value Builder::imag(Value x) { return emit("imag", {x}, Type{real_part(x.dtype()), x.shape()}); }
Value Builder::complex(Value re, Value im) { return emit("complex", {re, im}, Type{complex_of(re.dtype()), re.shape()}); }
Value Builder::conj(Value x) { return is_complex(x.dtype()) ? complex(real(x), neg(imag(x))) : x; }

Value Builder::binary(op::Binary f, Value a, Value b) {
  if (a.type != b.type)
    throw BuildError(std::string("stablehlo.") + f.name + ": operand types differ: " + a.type.str() + " vs " + b.type.str());
  return emit(f.name, {a, b}, a.type);
}

// A NaN first operand propagates through stablehlo.maximum/minimum on every plugin;
// a NaN second operand is put back here (the XLA CPU plugin returns the first).
// max(x, constant) costs nothing extra once the compiler folds the constant's check.
Value Builder::max(Value a, Value b) {
  Value r = binary(op::maximum, a, b);
  return is_float(a.dtype()) ? select(compare(b, b, Cmp::NE), b, r) : r;
}

Value Builder::min(Value a, Value b) {
  Value r = binary(op::minimum, a, b);
  return is_float(a.dtype()) ? select(compare(b, b, Cmp::NE), b, r) : r;
}

Value Builder::compare(Value a, Value b, Cmp dir) {
  static const char* names[] = {"EQ", "NE", "LT", "LE", "GT", "GE"};
  if (a.type != b.type) throw BuildError("compare: operand types differ: " + a.type.str() + " vs " + b.type.str());
  std::string attrs = std::string("comparison_direction = #stablehlo<comparison_direction ") +
                      names[static_cast<int>(dir)] + ">";
  return emit("compare", {a, b}, Type{DType::Pred, a.shape()}, attrs);
}

Value Builder::select(Value p, Value t, Value f) {
  if (t.type != f.type || p.shape() != t.shape())
    throw BuildError("select: mismatched operands " + p.type.str() + ", " + t.type.str() + ", " + f.type.str());
  return emit("select", {p, t, f}, t.type);
}

Value Builder::convert(Value x, DType t) {
  if (x.dtype() == t) return x;
  return emit("convert", {x}, Type{t, x.shape()});
}

Value Builder::bitcast(Value x, DType t) {
  if (x.dtype() == t) return x;
  if (itemsize(x.dtype()) != itemsize(t)) throw BuildError("bitcast between types of different size");
  return emit("bitcast_convert", {x}, Type{t, x.shape()});
}

// min(max(x, lo), hi): NaN in x propagates (stablehlo.clamp drops it on the XLA CPU plugin)
Value Builder::clamp(Value lo, Value x, Value hi) {
  return min(max(x, broadcast_to(lo, x.shape())), broadcast_to(hi, x.shape()));
}

// ---------------------------------------------------------------- shape
Value Builder::reshape(Value x, const Shape& s) {
  if (x.shape() == s) return x;
  if (numel(x.shape()) != numel(s)) throw BuildError("reshape: element count differs");
  return emit("reshape", {x}, Type{x.dtype(), s});
}

Value Builder::transpose(Value x, const std::vector<int64_t>& perm) {
  check_arity("transpose", perm.size(), x.rank());
  check_dims("transpose", perm, x.rank());
  bool identity = true;
  Shape s(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) {
    s[i] = x.shape()[perm[i]];
    identity &= perm[i] == static_cast<int64_t>(i);
  }
  if (identity) return x;
  return emit("transpose", {x}, Type{x.dtype(), s}, "permutation = " + i64_array(perm));
}

Value Builder::broadcast_in_dim(Value x, const Shape& s, const std::vector<int64_t>& dims) {
  if (x.shape() == s) return x;
  check_arity("broadcast_in_dim", dims.size(), x.rank());
  check_dims("broadcast_in_dim", dims, static_cast<int64_t>(s.size()));
  return emit("broadcast_in_dim", {x}, Type{x.dtype(), s}, "broadcast_dimensions = " + i64_array(dims));
}

Value Builder::broadcast_to(Value x, const Shape& s) {
  if (x.shape() == s) return x;
  int64_t off = static_cast<int64_t>(s.size()) - x.rank();
  if (off < 0) throw BuildError("broadcast_to: target rank is smaller");
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < x.rank(); ++i) {
    if (x.shape()[i] != 1 && x.shape()[i] != s[i + off]) throw BuildError("broadcast_to: incompatible shapes");
    dims.push_back(i + off);
  }
  return broadcast_in_dim(x, s, dims);
}

Value Builder::slice(Value x, const Shape& start, const Shape& limit, const Shape& strides) {
  check_arity("slice", start.size(), x.rank());
  check_arity("slice", limit.size(), x.rank());
  check_arity("slice", strides.size(), x.rank());
  Shape s(x.rank());
  bool whole = true;
  for (int64_t i = 0; i < x.rank(); ++i) {
    s[i] = (limit[i] - start[i] + strides[i] - 1) / strides[i];
    if (s[i] < 0) s[i] = 0;
    whole &= start[i] == 0 && limit[i] == x.shape()[i] && strides[i] == 1;
  }
  if (whole) return x;
  return emit("slice", {x}, Type{x.dtype(), s},
              "start_indices = " + i64_array(start) + ", limit_indices = " + i64_array(limit) +
                  ", strides = " + i64_array(strides));
}

Value Builder::dynamic_update_slice(Value x, Value u, const std::vector<Value>& starts) {
  std::vector<Value> ops{x, u};
  ops.insert(ops.end(), starts.begin(), starts.end());
  return emit("dynamic_update_slice", ops, x.type);
}

Value Builder::dynamic_slice(Value x, const std::vector<Value>& starts, const Shape& sizes) {
  if (static_cast<int64_t>(starts.size()) != x.rank() || static_cast<int64_t>(sizes.size()) != x.rank())
    throw BuildError("dynamic_slice: one start and one size per dimension");
  std::vector<Value> ops{x};
  ops.insert(ops.end(), starts.begin(), starts.end());
  return emit("dynamic_slice", ops, Type{x.dtype(), sizes}, "slice_sizes = " + i64_array(sizes));
}

Value Builder::concatenate(const std::vector<Value>& xs, int64_t dim) {
  if (xs.empty()) throw BuildError("concatenate: no operands");
  for (auto& x : xs) {
    check_dim("concatenate", dim, x.rank());
    check_arity("concatenate", x.shape().size(), xs[0].rank());
  }
  if (xs.size() == 1) return xs[0];
  Shape s = xs[0].shape();
  s[dim] = 0;
  for (auto& x : xs) s[dim] += x.shape()[dim];
  return emit("concatenate", xs, Type{xs[0].dtype(), s}, "dimension = " + std::to_string(dim) + " : i64");
}

Value Builder::pad(Value x, Value pv, const Shape& lo, const Shape& hi, const Shape& interior) {
  check_arity("pad", lo.size(), x.rank());
  check_arity("pad", hi.size(), x.rank());
  check_arity("pad", interior.size(), x.rank());
  Shape s(x.rank());
  for (int64_t i = 0; i < x.rank(); ++i)
    s[i] = lo[i] + hi[i] + x.shape()[i] + std::max<int64_t>(0, x.shape()[i] - 1) * interior[i];
  return emit("pad", {x, pv}, Type{x.dtype(), s},
              "edge_padding_low = " + i64_array(lo) + ", edge_padding_high = " + i64_array(hi) +
                  ", interior_padding = " + i64_array(interior));
}

Value Builder::reverse(Value x, const std::vector<int64_t>& dims) {
  if (dims.empty()) return x;
  check_dims("reverse", dims, x.rank());
  return emit("reverse", {x}, x.type, "dimensions = " + i64_array(dims));
}

// ---------------------------------------------------------------- reductions
std::string Builder::region(std::optional<op::Binary> body, DType t, int n) {
  // ^bb0(%a0..%a{n-1}, %b0..%b{n-1}) -> elementwise body over pairs (n == 1 only
  // for named bodies).
  std::string st = Type{t, {}}.str();
  int a = next_++, b = next_++, r = next_++;
  (void)n;
  std::string s = "{\n    ^bb0(%v" + std::to_string(a) + ": " + st + ", %v" + std::to_string(b) + ": " + st + "):\n";
  if (!body) {  // replace: keep the update
    s += "      \"stablehlo.return\"(%v" + std::to_string(b) + ") : (" + st + ") -> ()\n    }";
    return s;
  }
  s += "      %v" + std::to_string(r) + " = \"stablehlo." + body->name + "\"(%v" + std::to_string(a) + ", %v" +
       std::to_string(b) + ") : (" + st + ", " + st + ") -> " + st + "\n";
  s += "      \"stablehlo.return\"(%v" + std::to_string(r) + ") : (" + st + ") -> ()\n    }";
  return s;
}

// ---- collectives
std::string Builder::replica_groups(const Groups& groups) {
  if (groups.empty() || groups[0].empty()) throw BuildError("collective: empty replica groups");
  std::string s = "replica_groups = dense<[";
  for (size_t i = 0; i < groups.size(); ++i) {
    if (groups[i].size() != groups[0].size()) throw BuildError("collective: replica groups must have one size");
    s += i ? ", [" : "[";
    for (size_t j = 0; j < groups[i].size(); ++j) s += (j ? ", " : "") + std::to_string(groups[i][j]);
    s += "]";
  }
  return s + "]> : tensor<" + std::to_string(groups.size()) + "x" + std::to_string(groups[0].size()) + "xi64>";
}

op::Binary Builder::combiner(const std::string& reduce) {
  static const std::map<std::string, op::Binary> ops = {
      {"sum", op::add}, {"avg", op::add}, {"product", op::multiply}, {"min", op::minimum}, {"max", op::maximum},
      {"band", op::and_}, {"bor", op::or_}, {"bxor", op::xor_}};
  auto it = ops.find(reduce);
  if (it == ops.end()) throw BuildError("collective: reduce op '" + reduce + "' is not supported in a program");
  return it->second;
}

// The group size, which dimension dim of x must be divisible by (its pieces go to the replicas).
int64_t Builder::group_split(const char* op, Value x, int64_t dim, const Groups& groups) {
  replica_groups(groups);  // checks the groups
  auto k = static_cast<int64_t>(groups[0].size());
  if (x.shape()[dim] % k != 0)
    throw BuildError(std::string(op) + ": dimension " + std::to_string(dim) + " of " + x.type.str() +
                     " is not divisible by the group size " + std::to_string(k));
  return k;
}

Value Builder::all_reduce(Value x, const std::string& reduce, const Groups& groups) {
  std::string attrs = replica_groups(groups);
  Value r = emit_multi("all_reduce", {x}, {x.type}, attrs, region(combiner(reduce), x.dtype(), 1))[0];
  return reduce == "avg" ? div(r, scalar_like(static_cast<double>(groups[0].size()), r)) : r;
}

Value Builder::all_gather(Value x, int64_t dim, const Groups& groups) {
  check_dims("all_gather", {dim}, x.rank());
  std::string attrs = "all_gather_dim = " + std::to_string(dim) + " : i64, " + replica_groups(groups);
  Shape s = x.shape();
  s[dim] *= static_cast<int64_t>(groups[0].size());
  return emit_multi("all_gather", {x}, {Type{x.dtype(), s}}, attrs)[0];
}

Value Builder::reduce_scatter(Value x, const std::string& reduce, int64_t dim, const Groups& groups) {
  check_dims("reduce_scatter", {dim}, x.rank());
  std::string attrs = "scatter_dimension = " + std::to_string(dim) + " : i64, " + replica_groups(groups);
  int64_t k = group_split("reduce_scatter", x, dim, groups);
  Shape s = x.shape();
  s[dim] /= k;
  Value r = emit_multi("reduce_scatter", {x}, {Type{x.dtype(), s}}, attrs, region(combiner(reduce), x.dtype(), 1))[0];
  return reduce == "avg" ? div(r, scalar_like(static_cast<double>(k), r)) : r;
}

Value Builder::all_to_all(Value x, int64_t split_dim, int64_t concat_dim, const Groups& groups) {
  check_dims("all_to_all", {split_dim, concat_dim}, x.rank());
  int64_t k = group_split("all_to_all", x, split_dim, groups);
  Shape s = x.shape();
  s[split_dim] /= k;
  s[concat_dim] *= k;
  std::string attrs = "split_dimension = " + std::to_string(split_dim) + " : i64, concat_dimension = " +
                      std::to_string(concat_dim) + " : i64, split_count = " + std::to_string(k) + " : i64, " +
                      replica_groups(groups);
  return emit_multi("all_to_all", {x}, {Type{x.dtype(), s}}, attrs)[0];
}

Value Builder::reduce(Value x, Value init, const std::vector<int64_t>& dims, op::Binary body) {
  if (dims.empty()) return x;
  check_dims("reduce", dims, x.rank());
  Shape s;
  for (int64_t i = 0; i < x.rank(); ++i) {
    bool reduced = false;
    for (int64_t d : dims) reduced |= d == i;
    if (!reduced) s.push_back(x.shape()[i]);
  }
  std::string reg = region(body, x.dtype(), 1);
  return emit_multi("reduce", {x, init}, {Type{x.dtype(), s}}, "dimensions = " + i64_array(dims), reg)[0];
}

std::pair<Value, Value> Builder::reduce_arg(Value x, int64_t dim, bool is_max) {
  DType t = x.dtype();
  check_dim("reduce_arg", dim, x.rank());
  Shape s;
  for (int64_t i = 0; i < x.rank(); ++i)
    if (i != dim) s.push_back(x.shape()[i]);
  Value idx = iota(DType::S64, x.shape(), dim);
  Value init_v = is_max ? lowest(t) : highest(t);
  Value init_i = constant_int(INT64_MAX, DType::S64);
  // Region: pick a when it wins the comparison, is NaN (and b is not, or has the
  // smaller index), or ties with a smaller index. Symmetric, so order-free.
  std::string st = Type{t, {}}.str(), si = Type{DType::S64, {}}.str(), sp = Type{DType::Pred, {}}.str();
  auto v = [&](int id) { return "%v" + std::to_string(id); };
  int av = next_++, ai = next_++, bv = next_++, bi = next_++;
  int win = next_++, eq = next_++, ilt = next_++, tie = next_++, an = next_++, bn = next_++, nbn = next_++,
      anb = next_++, bothn = next_++, bothlt = next_++, nanpick = next_++, p1 = next_++, pick = next_++,
      rv = next_++, ri = next_++;
  std::ostringstream r;
  auto cmp = [&](int out, int a, int b, const char* dir, const std::string& ty) {
    r << "      " << v(out) << " = \"stablehlo.compare\"(" << v(a) << ", " << v(b)
      << ") {comparison_direction = #stablehlo<comparison_direction " << dir << ">} : (" << ty << ", " << ty
      << ") -> " << sp << "\n";
  };
  auto bin = [&](int out, op::Binary f, int a, int b) {
    r << "      " << v(out) << " = \"stablehlo." << f.name << "\"(" << v(a) << ", " << v(b) << ") : (" << sp << ", "
      << sp << ") -> " << sp << "\n";
  };
  r << "{\n    ^bb0(" << v(av) << ": " << st << ", " << v(ai) << ": " << si << ", " << v(bv) << ": " << st << ", "
    << v(bi) << ": " << si << "):\n";
  cmp(win, av, bv, is_max ? "GT" : "LT", st);
  cmp(eq, av, bv, "EQ", st);
  cmp(ilt, ai, bi, "LT", si);
  bin(tie, op::and_, eq, ilt);
  cmp(an, av, av, "NE", st);
  cmp(bn, bv, bv, "NE", st);
  r << "      " << v(nbn) << " = \"stablehlo.not\"(" << v(bn) << ") : (" << sp << ") -> " << sp << "\n";
  bin(anb, op::and_, an, nbn);
  bin(bothn, op::and_, an, bn);
  bin(bothlt, op::and_, bothn, ilt);
  bin(nanpick, op::or_, anb, bothlt);
  bin(p1, op::or_, win, tie);
  bin(pick, op::or_, p1, nanpick);
  // b wins outright when b is NaN and a is not: p1 may be true only if a>b, impossible with NaN b.
  r << "      " << v(rv) << " = \"stablehlo.select\"(" << v(pick) << ", " << v(av) << ", " << v(bv) << ") : (" << sp
    << ", " << st << ", " << st << ") -> " << st << "\n";
  r << "      " << v(ri) << " = \"stablehlo.select\"(" << v(pick) << ", " << v(ai) << ", " << v(bi) << ") : (" << sp
    << ", " << si << ", " << si << ") -> " << si << "\n";
  r << "      \"stablehlo.return\"(" << v(rv) << ", " << v(ri) << ") : (" << st << ", " << si << ") -> ()\n    }";
  auto outs = emit_multi("reduce", {x, idx, init_v, init_i}, {Type{t, s}, Type{DType::S64, s}},
                         "dimensions = " + i64_array({dim}), r.str());
  return {outs[0], outs[1]};
}

Value Builder::reduce_window(Value x, Value init, const Shape& window, const Shape& strides,
                             const std::vector<std::pair<int64_t, int64_t>>& padding, op::Binary body) {
  check_arity("reduce_window", window.size(), x.rank());
  check_arity("reduce_window", strides.size(), x.rank());
  check_arity("reduce_window", padding.size(), x.rank());
  Shape s(x.rank());
  std::string pads;
  for (int64_t i = 0; i < x.rank(); ++i) {
    int64_t padded = x.shape()[i] + padding[i].first + padding[i].second;
    s[i] = padded < window[i] ? 0 : (padded - window[i]) / strides[i] + 1;
    pads += (i ? ", [" : "[") + std::to_string(padding[i].first) + ", " + std::to_string(padding[i].second) + "]";
  }
  std::string reg = region(body, x.dtype(), 1);
  std::string attrs = "window_dimensions = " + i64_array(window) + ", window_strides = " + i64_array(strides) +
                      ", padding = dense<[" + pads + "]> : tensor<" + std::to_string(x.rank()) + "x2xi64>";
  return emit_multi("reduce_window", {x, init}, {Type{x.dtype(), s}}, attrs, reg)[0];
}

// ---------------------------------------------------------------- contraction
Value Builder::dot_general(Value a, Value b, const DotDims& d, DType result, const std::string& precision) {
  if (a.dtype() != b.dtype()) throw BuildError("dot_general: operand element types differ");
  check_dims("dot_general", d.lhs_batch, a.rank());
  check_dims("dot_general", d.lhs_contract, a.rank());
  check_dims("dot_general", d.rhs_batch, b.rank());
  check_dims("dot_general", d.rhs_contract, b.rank());
  Shape s;
  auto in = [](const std::vector<int64_t>& v, int64_t i) {
    for (int64_t x : v) if (x == i) return true;
    return false;
  };
  for (int64_t i : d.lhs_batch) s.push_back(a.shape()[i]);
  for (int64_t i = 0; i < a.rank(); ++i)
    if (!in(d.lhs_batch, i) && !in(d.lhs_contract, i)) s.push_back(a.shape()[i]);
  for (int64_t i = 0; i < b.rank(); ++i)
    if (!in(d.rhs_batch, i) && !in(d.rhs_contract, i)) s.push_back(b.shape()[i]);
  std::string dn = "dot_dimension_numbers = #stablehlo.dot<";
  std::vector<std::string> parts;
  auto field = [&](const char* n, const std::vector<int64_t>& v) {
    if (!v.empty()) parts.push_back(std::string(n) + " = [" + join(v) + "]");
  };
  field("lhs_batching_dimensions", d.lhs_batch);
  field("rhs_batching_dimensions", d.rhs_batch);
  field("lhs_contracting_dimensions", d.lhs_contract);
  field("rhs_contracting_dimensions", d.rhs_contract);
  for (size_t i = 0; i < parts.size(); ++i) dn += (i ? ", " : "") + parts[i];
  dn += ">";
  if (!precision.empty())
    dn += ", precision_config = [#stablehlo<precision " + precision + ">, #stablehlo<precision " + precision + ">]";
  return emit("dot_general", {a, b}, Type{result, s}, dn);
}

Value Builder::convolution(Value lhs, Value rhs, const ConvDims& d, const Shape& strides,
                           const std::vector<std::pair<int64_t, int64_t>>& padding, const Shape& lhs_dil,
                           const Shape& rhs_dil, int64_t groups, const Shape& out_shape, DType result,
                           const std::string& precision) {
  auto layout = [](int64_t rank, int64_t b, int64_t f, const std::vector<int64_t>& sp, const char* bn,
                   const char* fn) {
    std::vector<std::string> pos(rank);
    pos[b] = bn;
    pos[f] = fn;
    for (size_t i = 0; i < sp.size(); ++i) pos[sp[i]] = std::to_string(i);
    std::string s = "[";
    for (int64_t i = 0; i < rank; ++i) s += (i ? ", " : "") + pos[i];
    return s + "]";
  };
  std::string dn = "dimension_numbers = #stablehlo.conv<" +
                   layout(lhs.rank(), d.in_batch, d.in_feature, d.in_spatial, "b", "f") + "x" +
                   layout(rhs.rank(), d.k_out, d.k_in, d.k_spatial, "o", "i") + "->" +
                   layout(static_cast<int64_t>(out_shape.size()), d.out_batch, d.out_feature, d.out_spatial, "b",
                          "f") +
                   ">";
  std::string pads;
  for (size_t i = 0; i < padding.size(); ++i)
    pads += (i ? ", [" : "[") + std::to_string(padding[i].first) + ", " + std::to_string(padding[i].second) + "]";
  std::string attrs = dn + ", window_strides = " + i64_array(strides) + ", padding = dense<[" + pads +
                      "]> : tensor<" + std::to_string(padding.size()) + "x2xi64>, lhs_dilation = " +
                      i64_array(lhs_dil) + ", rhs_dilation = " + i64_array(rhs_dil) +
                      ", feature_group_count = " + std::to_string(groups) +
                      " : i64, batch_group_count = " + std::to_string(d.batch_groups) + " : i64";
  if (!precision.empty())
    attrs += ", precision_config = [#stablehlo<precision " + precision + ">, #stablehlo<precision " + precision + ">]";
  return emit("convolution", {lhs, rhs}, Type{result, out_shape}, attrs);
}

// ---------------------------------------------------------------- indexing
Value Builder::take(Value x, Value idx, int64_t dim) {
  check_dim("take", dim, x.rank());
  if (x.shape()[dim] == 0 && numel(idx.shape()) > 0) throw BuildError("take: indexing an empty dimension");
  int64_t r = idx.rank();
  Shape ishape = idx.shape();
  ishape.push_back(1);
  Value idx2 = reshape(convert(idx, DType::S64), ishape);
  Shape out;
  std::vector<int64_t> offset_dims;
  for (int64_t i = 0; i < dim; ++i) {
    offset_dims.push_back(static_cast<int64_t>(out.size()));
    out.push_back(x.shape()[i]);
  }
  for (int64_t d : idx.shape()) out.push_back(d);
  for (int64_t i = dim + 1; i < x.rank(); ++i) {
    offset_dims.push_back(static_cast<int64_t>(out.size()));
    out.push_back(x.shape()[i]);
  }
  Shape sizes = x.shape();
  sizes[dim] = 1;
  std::string attrs = "dimension_numbers = #stablehlo.gather<offset_dims = [" + join(offset_dims) +
                      "], collapsed_slice_dims = [" + std::to_string(dim) + "], start_index_map = [" +
                      std::to_string(dim) + "], index_vector_dim = " + std::to_string(r) +
                      ">, slice_sizes = " + i64_array(sizes) + ", indices_are_sorted = false";
  return emit("gather", {x, idx2}, Type{x.dtype(), out}, attrs);
}

Value Builder::take_along(Value x, Value idx, int64_t dim) {
  int64_t r = x.rank();
  check_dim("take_along", dim, r);
  check_arity("take_along", idx.shape().size(), r);
  if (x.shape()[dim] == 0 && numel(idx.shape()) > 0) throw BuildError("take_along: indexing an empty dimension");
  Shape ishape = idx.shape();
  ishape.push_back(1);
  std::vector<Value> comps;
  for (int64_t d = 0; d < r; ++d) {
    Value c = d == dim ? convert(idx, DType::S64) : iota(DType::S64, idx.shape(), d);
    comps.push_back(reshape(c, ishape));
  }
  Value full = concatenate(comps, r);
  std::vector<int64_t> all(r);
  for (int64_t i = 0; i < r; ++i) all[i] = i;
  std::string attrs = "dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [" + join(all) +
                      "], start_index_map = [" + join(all) + "], index_vector_dim = " + std::to_string(r) +
                      ">, slice_sizes = " + i64_array(Shape(r, 1)) + ", indices_are_sorted = false";
  return emit("gather", {x, full}, Type{x.dtype(), idx.shape()}, attrs);
}

Value Builder::scatter(Value x, Value idx, Value upd, const std::vector<int64_t>& dims,
                       std::optional<op::Binary> body) {
  check_dims("scatter", dims, x.rank());
  std::vector<int64_t> window;
  for (int64_t i = 1; i < upd.rank(); ++i) window.push_back(i);
  std::string reg = region(body, x.dtype(), 1);
  std::string attrs = "scatter_dimension_numbers = #stablehlo.scatter<" +
                      (window.empty() ? std::string() : "update_window_dims = [" + join(window) + "], ") +
                      "inserted_window_dims = [" + join(dims) + "], scatter_dims_to_operand_dims = [" + join(dims) +
                      "], index_vector_dim = 1>, indices_are_sorted = false, unique_indices = false";
  return emit_multi("scatter", {x, convert(idx, DType::S64), upd}, {x.type}, attrs, reg)[0];
}

Value Builder::scatter_nd(Value x, Value idx, Value upd) {
  if (x.rank() != 1 || idx.rank() != upd.rank() + 1) throw BuildError("scatter_nd: a 1-D operand and one index per update");
  std::string reg = region(std::nullopt, x.dtype(), 1);
  std::string attrs = "scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], "
                      "scatter_dims_to_operand_dims = [0], index_vector_dim = " + std::to_string(upd.rank()) +
                      ">, indices_are_sorted = false, unique_indices = false";
  return emit_multi("scatter", {x, convert(idx, DType::S64), upd}, {x.type}, attrs, reg)[0];
}

Value Builder::take_rows(Value x, Value starts, int64_t w) {
  if (x.rank() != 1 || w < 1 || w > x.shape()[0]) throw BuildError("take_rows: a 1-D operand holding a row");
  int64_t r = starts.rank();
  Shape ishape = starts.shape(), out = starts.shape();
  ishape.push_back(1);
  out.push_back(w);
  std::string attrs = "dimension_numbers = #stablehlo.gather<offset_dims = [" + std::to_string(r) +
                      "], start_index_map = [0], index_vector_dim = " + std::to_string(r) +
                      ">, slice_sizes = " + i64_array({w}) + ", indices_are_sorted = false";
  return emit("gather", {x, reshape(convert(starts, DType::S64), ishape)}, Type{x.dtype(), out}, attrs);
}

Value Builder::scatter_rows(Value x, Value starts, Value rows) {
  int64_t r = starts.rank();
  if (x.rank() != 1 || rows.rank() != r + 1) throw BuildError("scatter_rows: a 1-D operand and one start per row");
  Shape ishape = starts.shape();
  ishape.push_back(1);
  std::string reg = region(std::nullopt, x.dtype(), 1);
  std::string attrs = "scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [" + std::to_string(r) +
                      "], scatter_dims_to_operand_dims = [0], index_vector_dim = " + std::to_string(r) +
                      ">, indices_are_sorted = false, unique_indices = false";
  return emit_multi("scatter", {x, reshape(convert(starts, DType::S64), ishape), rows}, {x.type}, attrs, reg)[0];
}

Value Builder::sort_dim(Value x, int64_t dim, bool descending, Value* indices) {
  check_dim("sort", dim, x.rank());
  Value idx = iota(DType::S64, x.shape(), dim);
  std::string st = Type{x.dtype(), {}}.str(), si = Type{DType::S64, {}}.str();
  int a = next_++, ai = next_++, b = next_++, bi = next_++, c = next_++;
  auto v = [](int id) { return "%v" + std::to_string(id); };
  std::string r = "{\n    ^bb0(" + v(a) + ": " + st + ", " + v(b) + ": " + st + ", " + v(ai) + ": " + si + ", " +
                  v(bi) + ": " + si + "):\n";
  r += "      " + v(c) + " = \"stablehlo.compare\"(" + v(a) + ", " + v(b) +
       ") {comparison_direction = #stablehlo<comparison_direction " + (descending ? "GT" : "LT") +
       ">, compare_type = #stablehlo<comparison_type TOTALORDER>} : (" + st + ", " + st + ") -> tensor<i1>\n";
  r += "      \"stablehlo.return\"(" + v(c) + ") : (tensor<i1>) -> ()\n    }";
  auto outs = emit_multi("sort", {x, idx}, {x.type, idx.type},
                         "dimension = " + std::to_string(dim) + " : i64, is_stable = true", r);
  if (indices) *indices = outs[1];
  return outs[0];
}

// ---------------------------------------------------------------- bounded dynamic sizes
Value Builder::set_dimension_size(Value x, Value size, int64_t dim) {
  check_dim("set_dimension_size", dim, x.rank());
  Type t = x.type;
  t.dynamic = true;
  return emit_typed("set_dimension_size", {x, convert(size, DType::S32)}, {t},
                    "dimension = " + std::to_string(dim) + " : i64")[0];
}

Value Builder::static_shape(Value x) {
  if (!x.type.dynamic) return x;
  Type plain = x.type;
  plain.dynamic = false;
  plain.printed_dynamic = 0;
  for (int64_t d = 0; d < x.rank(); ++d) {
    Type bounded = plain;
    bounded.printed_dynamic = uint64_t{1} << d;
    Value q = emit_typed("convert", {x}, {bounded})[0];
    x = emit_typed("set_dimension_size", {q, constant_int(x.shape()[d], DType::S32)}, {plain},
                   "dimension = " + std::to_string(d) + " : i64")[0];
  }
  return x;
}

Value Builder::dim_size(Value x, int64_t dim, DType t) {
  check_dim("get_dimension_size", dim, x.rank());
  if (!x.type.dynamic) return constant_int(x.shape()[dim], t);
  // x retyped with dim `dim` bounded-dynamic: on its static type the size would fold to the bound
  Type bounded = x.type;
  bounded.printed_dynamic = uint64_t{1} << dim;
  Value q = emit_typed("convert", {x}, {bounded})[0];
  Value s = emit_typed("get_dimension_size", {q}, {Type{DType::S32, {}}}, "dimension = " + std::to_string(dim) + " : i64")[0];
  return convert(s, t);
}

Value Builder::count(Value x, const std::vector<int64_t>& dims, DType t) {
  if (!x.type.dynamic) {
    double n = 1;
    for (int64_t d : dims) {
      check_dim("count", d, x.rank());
      n *= static_cast<double>(x.shape()[d]);
    }
    return is_float(t) ? constant(n, t) : constant_int(static_cast<int64_t>(n), t);
  }
  Value n = constant_int(1, DType::S64);
  for (int64_t d : dims) n = mul(n, dim_size(x, d, DType::S64));
  return convert(n, t);
}

// ---------------------------------------------------------------- control flow
std::vector<Value> Builder::while_loop(const std::vector<Value>& init, const LoopFn& cond, const LoopFn& body) {
  std::vector<Type> ts;
  for (const Value& v : init) ts.push_back(v.type);
  // each block is built into an empty body_, then moved into the region text
  auto block = [&](const LoopFn& fn) {
    std::string outer;
    outer.swap(body_);
    std::vector<Value> args;
    for (const Type& t : ts) args.push_back(fresh(t));
    std::vector<Value> res = fn(*this, args);
    std::string inner;
    inner.swap(body_);
    body_.swap(outer);
    if (dry_) return std::string();
    std::string s = "{\n    ^bb0(";
    for (size_t i = 0; i < args.size(); ++i) s += (i ? ", %v" : "%v") + std::to_string(args[i].id) + ": " + ts[i].str();
    s += "):\n" + inner + "      \"stablehlo.return\"(";
    for (size_t i = 0; i < res.size(); ++i) s += (i ? ", %v" : "%v") + std::to_string(res[i].id);
    s += ") : (" + types(res) + ") -> ()\n    }";
    return s;
  };
  std::string c = block(cond), b = block(body);
  return emit_multi("while", init, ts, "", c + ", " + b);
}

}  // namespace tt::hlo
