// Custom kernels: a user's StableHLO functions (written by hand or exported from
// JAX) applied to tpu tensors as one op of the current graph. torch_tpu/kernels.py
// validates the module and renames its functions to private symbols; here the
// kernel becomes a func.call in the program being built (eager flush, DeferAndFuse
// graph or torch.compile capture), so it fuses with the ops around it.
#include <ATen/ATen.h>
#include <c10/core/TensorImpl.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <mutex>

#include "aten/tpu.h"

namespace py = pybind11;

namespace tt::aten {
namespace {

using engine::Engine;

struct Kernel {
  std::string name;    // "ns::op": names the op in errors and in the program's op list
  std::string symbol;  // the private function the op calls
  std::shared_ptr<const std::string> funcs;  // its text and its helpers'
  std::vector<hlo::Type> args, results;
  int n_outputs = 0;         // results [0, n_outputs) are new tensors;
  std::vector<int> mutated;  // result n_outputs + k is written into input mutated[k]
  std::vector<int> donor;    // per output: the input whose storage it may reuse, or -1
  std::vector<int> donated;  // inputs invalid after the call
  std::string key;           // trace key: names the kernel (its symbol names its text)
};

std::mutex g_mu;
std::vector<std::unique_ptr<const Kernel>> g_kernels;  // id = index; never removed

hlo::DType dtype_of(const std::string& s) {
  static const std::pair<const char*, hlo::DType> names[] = {
      {"i1", hlo::DType::Pred}, {"i8", hlo::DType::S8},   {"i16", hlo::DType::S16}, {"i32", hlo::DType::S32},
      {"i64", hlo::DType::S64}, {"ui8", hlo::DType::U8},  {"ui16", hlo::DType::U16}, {"ui32", hlo::DType::U32}, {"ui64", hlo::DType::U64}, {"f16", hlo::DType::F16},
      {"bf16", hlo::DType::BF16}, {"f32", hlo::DType::F32}, {"f64", hlo::DType::F64},
      {"complex<f32>", hlo::DType::C64}, {"complex<f64>", hlo::DType::C128}};
  for (const auto& [n, t] : names)
    if (s == n) return t;
  TORCH_CHECK_TYPE(false, "torch_tpu kernels: element type ", s, " is not supported on tpu");
}

c10::ScalarType scalar_type(hlo::DType t) {
  switch (t) {
    case hlo::DType::Pred: return c10::kBool;
    case hlo::DType::S8: return c10::kChar;
    case hlo::DType::S16: return c10::kShort;
    case hlo::DType::S32: return c10::kInt;
    case hlo::DType::S64: return c10::kLong;
    case hlo::DType::U8: return c10::kByte;
    case hlo::DType::U16: return c10::kUInt16;
    case hlo::DType::U32: return c10::kUInt32;
    case hlo::DType::U64: return c10::kUInt64;
    case hlo::DType::F16: return c10::kHalf;
    case hlo::DType::BF16: return c10::kBFloat16;
    case hlo::DType::F32: return c10::kFloat;
    case hlo::DType::F64: return c10::kDouble;
    case hlo::DType::C64: return c10::kComplexFloat;
    case hlo::DType::C128: return c10::kComplexDouble;
  }
  return c10::kFloat;
}

using TypeSpec = std::pair<std::vector<int64_t>, std::string>;  // (shape, MLIR element type)

std::vector<hlo::Type> types_of(const std::vector<TypeSpec>& specs) {
  std::vector<hlo::Type> out;
  for (const auto& [shape, dt] : specs) out.push_back(hlo::Type{dtype_of(dt), shape});
  return out;
}

// Donation reuses t's storage for an output only when t is the storage's sole,
// dense, whole-storage tensor of the output's type and size; otherwise the
// output gets a new storage (t is invalidated either way).
bool storage_reusable(const at::Tensor& t, const hlo::Type& out) {
  auto st = storage_of(t);
  return t.storage().use_count() == 1 && t.storage_offset() == 0 && t.is_contiguous() && st->typed &&
         st->dtype == out.dtype && to_hlo(t.scalar_type()) == out.dtype && st->numel() == hlo::numel(out.shape);
}

// The donated tensor keeps its sizes but moves to an empty storage that refuses
// every use with a message naming the kernel.
void invalidate(const at::Tensor& t, const std::string& kernel) {
  c10::DeviceGuard guard(t.device());
  c10::DataPtr dp = allocator()->allocate(0);
  auto st = *static_cast<engine::StoragePtr*>(dp.get_context());
  st->donated = std::make_shared<const std::string>(
      "torch_tpu: this tensor was donated to the kernel " + kernel +
      " and cannot be used any more (its memory now holds the kernel's output); pass a clone "
      "to the kernel, or leave it out of `donate`, to keep using it");
  size_t nbytes = t.storage().nbytes();
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, std::move(dp), allocator(), /*resizable=*/true);
  storage.set_nbytes(nbytes);
  t.unsafeGetTensorImpl()->set_storage_keep_dtype(std::move(storage));
}

std::vector<at::Tensor> call_kernel(int id, const std::vector<at::Tensor>& inputs) {
  std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
  const Kernel* kp = nullptr;
  {
    std::lock_guard<std::mutex> l(g_mu);
    TORCH_CHECK(id >= 0 && static_cast<size_t>(id) < g_kernels.size(), "torch_tpu: no kernel with id ", id);
    kp = g_kernels[id].get();
  }
  const Kernel& k = *kp;
  TORCH_CHECK(inputs.size() == k.args.size(), "torch_tpu: kernel ", k.name, " takes ", k.args.size(),
              " tensors, got ", inputs.size());
  int device = -1;
  std::vector<engine::View> views;
  views.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = inputs[i];
    TORCH_CHECK(t.defined() && t.device().type() == kTpu, "torch_tpu: kernel ", k.name, ": input ", i,
                " must be a tensor on tpu, got ", t.defined() ? t.device().str() : std::string("None"));
    if (device < 0) device = t.device().index();
    TORCH_CHECK(t.device().index() == device, "Expected all tensors to be on the same device, but found at least "
                "two devices, tpu:", device, " and ", t.device(), "!");
    TORCH_CHECK(t.sizes().vec() == k.args[i].shape && to_hlo(t.scalar_type()) == k.args[i].dtype,
                "torch_tpu: kernel ", k.name, ": input ", i, " is ", t.scalar_type(), t.sizes(),
                ", the kernel was specialised for ", k.args[i].str());
    views.push_back(view_of(t));
  }
  if (device < 0) device = current_device();
  Engine& eng = Engine::get();
  engine::Graph& g = eng.graph(device);
  // a capture (torch.compile) is functional: the compiled program decides donation
  bool donate = !g.capture;
  std::vector<at::Tensor> outs(k.n_outputs);
  std::string key = k.key;
  for (int j = 0; j < k.n_outputs; ++j) {
    const hlo::Type& rt_ = k.results[j];
    int d = k.donor[j];
    if (donate && d >= 0 && storage_reusable(inputs[d], rt_)) {
      outs[j] = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(inputs[d].storage()),
                                                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                         caffe2::TypeMeta::fromScalarType(scalar_type(rt_.dtype)));
      outs[j].unsafeGetTensorImpl()->set_sizes_contiguous(rt_.shape);
      key += 'd';
    } else {
      outs[j] = at::empty(rt_.shape, at::TensorOptions()
                                         .dtype(scalar_type(rt_.dtype))
                                         .device(c10::Device(kTpu, static_cast<c10::DeviceIndex>(device))));
      key += 'n';
    }
  }
  engine::Op rec{k.name, eng.mode() == engine::Mode::DeferAndFuse ? current_python_site() : std::string(), true,
                 std::move(key), views, {}};
  try {
    eng.apply(g, rec, [&] {
      std::vector<hlo::Value> ins;
      ins.reserve(views.size());
      for (const auto& v : views) ins.push_back(g.load(v));
      g.b.add_function(k.symbol, k.funcs);
      std::vector<hlo::Value> res = g.b.call(k.symbol, ins, k.results);
      for (int j = 0; j < k.n_outputs; ++j) g.store(view_of(outs[j]), res[j]);
      for (size_t m = 0; m < k.mutated.size(); ++m) g.store(views[k.mutated[m]], res[k.n_outputs + m]);
      return lower::Reads{};
    });
    if (donate)
      for (int i : k.donated) invalidate(inputs[i], k.name);
    eng.op_done(device);
  } catch (const rt::Error& e) {
    TORCH_CHECK(false, e.what());
  } catch (const hlo::BuildError& e) {
    TORCH_CHECK(false, "torch_tpu could not apply the kernel ", k.name, ": ", e.what());
  }
  return outs;
}

}  // namespace

void bind_kernels(py::module& m) {
  // Compiles a kernel's module on its own (memory and disk caches): a bad module
  // raises RuntimeError with the plugin's message.
  m.def("_kernel_compile", [](const std::string& text) {
    py::gil_scoped_release nogil;
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    try {
      Engine::get().compile(text);
    } catch (const rt::Error& e) {
      throw std::runtime_error(e.what());
    }
  });
  // Registers a validated kernel specialisation; returns its id for _kernel_call.
  m.def("_kernel_register", [](const std::string& name, const std::string& symbol, const std::string& funcs,
                               const std::vector<TypeSpec>& args, const std::vector<TypeSpec>& results,
                               int n_outputs, const std::vector<int>& mutated, const std::vector<int>& donor,
                               const std::vector<int>& donated) {
    auto k = std::make_unique<Kernel>();
    k->name = name;
    k->symbol = symbol;
    k->funcs = std::make_shared<const std::string>(funcs);
    k->args = types_of(args);
    k->results = types_of(results);
    k->n_outputs = n_outputs;
    k->mutated = mutated;
    k->donor = donor;
    k->donated = donated;
    TORCH_CHECK(n_outputs >= 0 && static_cast<size_t>(n_outputs) + mutated.size() == k->results.size() &&
                    donor.size() == static_cast<size_t>(n_outputs),
                "torch_tpu: kernel ", name, ": inconsistent result description");
    for (int i : mutated) TORCH_CHECK(i >= 0 && static_cast<size_t>(i) < k->args.size(), "bad mutated input");
    for (int i : donor) TORCH_CHECK(i < static_cast<int>(k->args.size()), "bad donated input");
    for (int i : donated) TORCH_CHECK(i >= 0 && i < static_cast<int>(k->args.size()), "bad donated input");
    k->key = "kernel:" + symbol + '\0';
    std::lock_guard<std::mutex> l(g_mu);
    g_kernels.push_back(std::move(k));
    return static_cast<int>(g_kernels.size() - 1);
  });
  // Applies kernel `id` to tpu tensors: returns its new output tensors (mutated
  // inputs are written in place).
  m.def("_kernel_call", [](int id, const std::vector<at::Tensor>& inputs) {
    py::gil_scoped_release nogil;
    return call_kernel(id, inputs);
  });
}

}  // namespace tt::aten
