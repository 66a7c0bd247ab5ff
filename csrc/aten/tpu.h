// Shared declarations of the PyTorch integration layer (the only layer that
// includes torch headers).
#pragma once

#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/GeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>

#include <map>
#include <string>

#include "engine/engine.h"

namespace tt::aten {

constexpr c10::DeviceType kTpu = c10::DeviceType::PrivateUse1;

hlo::DType to_hlo(c10::ScalarType t);         // throws for unsupported dtypes
engine::StoragePtr storage_of(const at::TensorBase& t);
engine::View view_of(const at::TensorBase& t);

c10::Allocator* allocator();
// The device of the replicated capture in progress (torch_tpu.spmd), or -1 (spmd.cpp).
int spmd_capture_device();
int current_device();
void set_current_device(int d);
int device_count();  // 0 until the runtime is initialised
void set_device_count(int n);

// Device generator state (seed, offset), advanced by random ops.
at::Generator default_generator_handle(int device);
std::pair<uint64_t, uint64_t> generator_take(int device, uint64_t n);  // (seed, offset before), offset += n

// Registers the generic lowered kernel for every rule in the lowering registry
// (and their in-place / out= variants). Returns the number of ATen overloads.
int register_lowered_ops();
void inject_invalid_op(const at::Tensor& t);
void test_keyed_op(const at::Tensor& t, bool fail);
at::PrivateUse1HooksInterface* hooks();
// Turns the runtime's activity scopes into torch.profiler events (aten/profiler.cpp).
void install_profiler_observer();
std::vector<std::string> lowered_op_names();
// The generic kernel's time per stage under TORCH_TPU_STAGE_TIMES=1: (stage, (calls, ns summed)).
std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> stage_times(bool reset);
std::map<std::string, std::string> lowered_op_rules();  // registered op -> the rule it runs
int64_t meta_runs();  // Meta kernel calls (cache misses of the per-signature cache)
std::map<std::string, int64_t> fallback_counts();
std::map<std::string, int64_t> bucketed_counts();  // op -> calls built at a bucket (bounded dynamism)
void reset_bucketed_counts();
void reset_fallback_counts();

// Replaces boolean/uint8 masks in x[indices] by the int64 coordinates of their
// true elements (computed on the device; their count is read back). False when
// there is no mask.
// The ops composed of lowered ops in dynamic.cpp (data-dependent shapes, host-read results).
std::vector<std::string> composed_op_names();
bool expand_mask_indices(const at::Tensor& self, c10::List<std::optional<at::Tensor>>& indices);
std::optional<at::Tensor> masked_put_as_where(const std::string& name, const std::vector<c10::IValue>& args);

// The matmul precision in effect on this thread (torch.tpu.precision, else the process-wide mode).
lower::Precision current_precision();
// The process-wide mode: torch.tpu.set_matmul_precision's, or ATen's float32 matmul setting
// (torch.set_float32_matmul_precision: medium/high/highest = DEFAULT/HIGH/HIGHEST) when that changed later.
lower::Precision process_precision();
void set_process_precision(lower::Precision p);
// "file.py:12 (in f)" of the innermost user Python frame, or "".
std::string current_python_site();

// Live bytes of tpu storages (what memory_allocated reports) and the peak.
int64_t allocated_bytes();
int64_t peak_allocated_bytes();
void reset_peak_allocated();

}  // namespace tt::aten
