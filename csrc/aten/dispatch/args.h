// Dispatcher arguments -> lowering-rule arguments. Shared by the front ends
// that apply rules: the eager kernel (tensors are views of storages) and the
// compiled-graph builder (tensors stand for values of an FX graph).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/function_schema.h>
#include <ATen/core/stack.h>

#include <functional>
#include <vector>

#include "lowering/lowering.h"

namespace tt::aten {

// The graph value of a defined tensor argument that lives on the device.
using TensorValueFn = std::function<hlo::Value(const at::Tensor&)>;

// One Arg per schema argument index in `indices` (the rule's arguments: the
// schema's non-out arguments), read from `args` (the whole argument stack).
// A 0-dim CPU tensor becomes a runtime scalar of env; other tensors go
// through `value`.
std::vector<lower::Arg> rule_args(const c10::FunctionSchema& schema, const std::vector<int>& indices,
                                  const torch::jit::Stack& args, lower::Env& env, const TensorValueFn& value);

}  // namespace tt::aten
