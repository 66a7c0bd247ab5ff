#include "aten/dispatch/args.h"

namespace tt::aten {

hlo::DType to_hlo(c10::ScalarType t);  // module.cpp

namespace {

bool is_number_type(const c10::TypePtr& t) {
  if (t->kind() == c10::TypeKind::NumberType) return true;
  return t->kind() == c10::TypeKind::OptionalType &&
         t->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::NumberType;
}

struct Converter {
  lower::Env& env;
  const TensorValueFn& value;

  hlo::Value tensor(const at::Tensor& t, lower::Arg* a) {
    if (t.device().is_cpu()) {  // a 0-dim CPU tensor (e.g. `x * 0.5`): a runtime scalar
      at::Scalar s = t.item();
      double v = s.isComplex() ? s.toComplexDouble().real() : s.toDouble();
      if (a) a->wrapped_number = t.unsafeGetTensorImpl()->is_wrapped_number();
      return env.scalar_param(v, s.isIntegral(false), to_hlo(t.scalar_type()));
    }
    return value(t);
  }

  lower::Arg list(const c10::List<c10::IValue>& l) {
    lower::Arg a;
    bool tensors = false;
    for (size_t i = 0; i < l.size(); ++i) tensors |= l.get(i).isTensor() || l.get(i).isNone();
    if (tensors) {
      a.kind = lower::Arg::TensorList;
      for (size_t i = 0; i < l.size(); ++i) {
        auto e = l.get(i);
        a.tensors.push_back(e.isTensor() && e.toTensor().defined() ? tensor(e.toTensor(), nullptr) : hlo::Value{});
      }
      return a;
    }
    a.kind = lower::Arg::IntList;
    for (size_t i = 0; i < l.size(); ++i) {
      auto e = l.get(i);
      if (e.isInt()) a.ints.push_back(e.toInt());
      else if (e.isSymInt()) a.ints.push_back(e.toSymInt().expect_int());
      else if (e.isBool()) a.ints.push_back(e.toBool());
      else if (e.isDouble()) {
        a.ints.push_back(static_cast<int64_t>(e.toDouble()));
        a.reals.push_back(e.toDouble());
      }
    }
    return a;
  }

  lower::Arg one(const c10::IValue& v, const c10::Argument& schema_arg) {
    lower::Arg a;
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) return a;
      a.kind = lower::Arg::Tensor;
      a.contiguous = t.is_contiguous();
      a.tensor = tensor(t, &a);
    } else if (v.isTensorList()) {
      a.kind = lower::Arg::TensorList;
      for (const at::Tensor& t : v.toTensorList()) a.tensors.push_back(tensor(t, nullptr));
    } else if (v.isList()) {
      a = list(v.toList());
    } else if (v.isBool()) {
      a.kind = lower::Arg::Bool;
      a.b = v.toBool();
    } else if (v.isInt() || v.isSymInt()) {
      int64_t x = v.isInt() ? v.toInt() : v.toSymInt().expect_int();
      if (is_number_type(schema_arg.type())) {  // a Python int passed as a Scalar
        a.kind = lower::Arg::Scalar;
        a.set_number(static_cast<double>(x));
        a.scalar_is_int = true;
      } else {
        a.kind = lower::Arg::Int;
        a.i = x;
      }
    } else if (v.isDouble()) {
      a.kind = lower::Arg::Scalar;
      a.set_number(v.toDouble());
    } else if (v.isString()) {
      a.kind = lower::Arg::Str;
      a.s = v.toStringRef();
    } else if (v.isComplexDouble()) {
      a.kind = lower::Arg::Scalar;
      a.set_complex(v.toComplexDouble().real(), v.toComplexDouble().imag());
    }
    // None, devices, generators, layouts, memory formats: nothing a rule reads
    return a;
  }
};

}  // namespace

std::vector<lower::Arg> rule_args(const c10::FunctionSchema& schema, const std::vector<int>& indices,
                                  const torch::jit::Stack& args, lower::Env& env, const TensorValueFn& value) {
  Converter conv{env, value};
  std::vector<lower::Arg> out;
  out.reserve(indices.size());
  for (int i : indices) out.push_back(conv.one(args[i], schema.arguments()[i]));
  return out;
}

}  // namespace tt::aten
