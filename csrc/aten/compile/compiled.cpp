// Compiled mode: an FX graph (from torch.compile / AOTAutograd) is captured by
// running its nodes through the same kernels as eager on stand-in tpu tensors
// whose storages stand for the graph's runtime inputs. The capture graph is
// never run; it becomes one Program that each call of the compiled graph runs
// with one PJRT execute over the callers' buffers.
#include <ATen/ATen.h>
#include <c10/core/TensorImpl.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <chrono>

#include "aten/compile/layout.h"
#include "aten/tpu.h"

namespace py = pybind11;

namespace tt::aten {
namespace {

using engine::Engine;
using engine::Slot;

// An output of a compiled graph: a view of a program output's storage, of a
// runtime input's storage, or a tensor the graph returns as it is (a constant).
struct OutSpec {
  Slot::Kind kind = Slot::Kind::Output;
  int index = 0;
  Layout layout;
  at::Tensor fixed;  // kind == Storage: returned as is
};

class CompiledProgram {
 public:
  engine::Program program;
  std::vector<Layout> inputs;       // the layout each runtime input was captured with
  std::vector<OutSpec> outs;
  std::vector<size_t> out_first;    // per Output slot: the first of `outs` in it (its layout has the storage's size)
  std::vector<bool> input_written;  // a result of the program (mutated input)
  bool read_precision = false;

  std::vector<at::Tensor> run(const std::vector<at::Tensor>& args) {
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    Engine& eng = Engine::get();
    int device = program.device;
    eng.metrics.compiled_runs++;
    if (args.size() != inputs.size())
      TORCH_CHECK(false, "torch_tpu: a compiled graph expects ", inputs.size(), " tensors, got ", args.size());
    eng.flush(device);  // pending eager work that the inputs may depend on
    std::vector<engine::StoragePtr> in(args.size());
    std::vector<at::Tensor> staged(args.size());  // inputs copied to the captured layout
    for (size_t k = 0; k < args.size(); ++k) {
      const at::Tensor& t = args[k];
      TORCH_CHECK(t.defined() && t.device().type() == kTpu && t.device().index() == device,
                  "torch_tpu: input ", k, " of a compiled graph must be a tensor on tpu:", device, ", got ",
                  t.defined() ? t.device().str() : std::string("an undefined tensor"));
      auto st = storage_of(t);
      if (!inputs[k].matches(t, *st) && inputs[k].capacity > 0 && !st->dynamic() && inputs[k].same_place(t, *st))
        inputs[k].make_dynamic(st);  // captured at a bucket: padded in place (through host memory, no program)
      else if (!inputs[k].matches(t, *st) && inputs[k].capacity == 0 && st->dynamic() && inputs[k].same_place(t, *st))
        eng.make_static(st);  // captured static: cut in place (through host memory, no program)
      if (inputs[k].matches(t, *st)) {
        in[k] = st;
      } else {  // another layout than at capture: stage a copy in the captured one
        staged[k] = tensor_on_new_storage(inputs[k], device);
        guarded_copy(t, staged[k]);
        eng.flush(device);
        in[k] = storage_of(staged[k]);
      }
      if (!in[k]->buffer) eng.zero_fill(*in[k]);
    }
    // each output storage is made as the first output that lies in it
    std::vector<engine::StoragePtr> out_st(out_first.size());
    std::vector<at::Tensor> out_base(out_first.size());
    for (size_t j = 0; j < out_first.size(); ++j) {
      out_base[j] = tensor_on_new_storage(outs[out_first[j]].layout, device);
      out_st[j] = storage_of(out_base[j]);
    }
    try {
      eng.run(program, in, out_st);
    } catch (const rt::Error& e) {
      TORCH_CHECK(false, e.what());
    }
    for (size_t k = 0; k < args.size(); ++k)
      if (staged[k].defined() && input_written[k]) {
        guarded_copy(staged[k], args[k]);
        eng.op_done(device);
      }
    std::vector<at::Tensor> result;
    result.reserve(outs.size());
    for (const auto& o : outs) {
      switch (o.kind) {
        case Slot::Kind::Output:
          result.push_back(&o == &outs[out_first[o.index]] ? out_base[o.index] : view_like(out_base[o.index], o.layout));
          break;
        case Slot::Kind::Input:
          result.push_back(view_like(staged[o.index].defined() ? staged[o.index] : args[o.index], o.layout));
          break;
        case Slot::Kind::Storage: result.push_back(o.fixed); break;
      }
    }
    return result;
  }

 private:
  static void guarded_copy(const at::Tensor& from, const at::Tensor& to) {
    Engine& eng = Engine::get();
    try {
      eng.copy_view(eng.graph(to.device().index()), view_of(from), view_of(to), "torch.compile input layout");
    } catch (const rt::Error& e) {
      TORCH_CHECK(false, e.what());
    }
  }
};

engine::Graph& capture(int device) {
  engine::Graph* g = Engine::get().capture_graph(device);
  TORCH_CHECK(g, "torch_tpu: no capture in progress on tpu:", device);
  return *g;
}

}  // namespace

// A tensor on device `device` over a new storage of `nbytes` typed `st_dtype`.
at::Tensor tensor_on_new_storage(const Layout& l, int device) {
  c10::DeviceGuard guard(c10::Device(kTpu, static_cast<c10::DeviceIndex>(device)));
  c10::DataPtr dp = allocator()->allocate(static_cast<size_t>(l.nbytes));
  auto st = *static_cast<engine::StoragePtr*>(dp.get_context());
  st->dtype = l.storage_dtype;
  st->typed = true;
  l.make_dynamic(st);
  c10::Storage storage(c10::Storage::use_byte_size_t(), static_cast<size_t>(l.nbytes), std::move(dp), allocator(),
                       /*resizable=*/true);
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                          caffe2::TypeMeta::fromScalarType(l.dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(l.sizes, l.strides, l.offset);
  return t;
}

at::Tensor view_like(const at::Tensor& base, const Layout& l) {
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(base.storage()), base.key_set(),
                                                          caffe2::TypeMeta::fromScalarType(l.dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(l.sizes, l.strides, l.offset);
  return t;
}

void bind_compiled(py::module& m) {
  py::class_<engine::Graph::Mark>(m, "_CaptureMark");
  py::class_<CompiledProgram, std::shared_ptr<CompiledProgram>>(m, "CompiledProgram")
      // the GIL is released before the engine lock is taken (an op holding the lock may need the GIL)
      .def("run", &CompiledProgram::run, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("text", [](const CompiledProgram& p) { return *p.program.text; })
      .def_property_readonly("read_precision", [](const CompiledProgram& p) { return p.read_precision; })
      .def_property_readonly("num_params", [](const CompiledProgram& p) { return p.program.params.size(); })
      .def_property_readonly("num_results", [](const CompiledProgram& p) { return p.program.results.size(); });
  m.def("_capture_begin", [](int device) {
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    try {
      Engine::get().begin_capture(device);
    } catch (const rt::Error& e) {
      TORCH_CHECK(false, e.what());
    }
  }, py::call_guard<py::gil_scoped_release>());
  // Runtime input k of the graph being captured is stood for by t's storage.
  m.def("_capture_input", [](const at::Tensor& t, int k) {
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    capture(t.device().index()).bind_external(storage_of(t), Slot::Kind::Input, k);
  }, py::call_guard<py::gil_scoped_release>());
  m.def("_capture_mark", [](int device) {
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    return capture(device).mark();
  }, py::call_guard<py::gil_scoped_release>());
  m.def("_capture_rollback", [](int device, const engine::Graph::Mark& mark) {
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    capture(device).rollback(mark);
    Engine::get().clear_capture_break();
  }, py::call_guard<py::gil_scoped_release>());
  m.def("_capture_broken", [] { return Engine::get().capture_broken(); });
  m.def("_current_precision", [] { return static_cast<int>(current_precision()); });
  m.def("_capture_abort", [](int device) {
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    Engine::get().end_capture(device);
  }, py::call_guard<py::gil_scoped_release>());
  // Ends the capture: the program whose results are what `outputs` hold and
  // what the graph wrote into `inputs` (the stand-ins bound with _capture_input).
  m.def("_capture_end", [](int device, const std::vector<at::Tensor>& inputs,
                           const std::vector<std::optional<at::Tensor>>& outputs) {
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    Engine& eng = Engine::get();
    auto g = eng.end_capture(device);
    TORCH_CHECK(g, "torch_tpu: no capture in progress on tpu:", device);
    auto cp = std::make_shared<CompiledProgram>();
    std::unordered_map<const engine::Storage*, int> input_of;
    for (size_t k = 0; k < inputs.size(); ++k) {
      cp->inputs.push_back(Layout::of(inputs[k]));
      input_of[storage_of(inputs[k]).get()] = static_cast<int>(k);
    }
    std::unordered_map<const engine::Storage*, int> output_of;
    for (const auto& maybe : outputs) {
      OutSpec o;
      if (!maybe || !maybe->defined()) {  // a None output: returned as None
        o.kind = Slot::Kind::Storage;
        cp->outs.push_back(std::move(o));
        continue;
      }
      const at::Tensor& t = *maybe;
      o.layout = Layout::of(t);
      auto st = storage_of(t);
      auto in = input_of.find(st.get());
      if (in != input_of.end()) {
        o.kind = Slot::Kind::Input;
        o.index = in->second;
      } else if (st->buffer) {  // a tensor that existed before the capture (a constant)
        o.kind = Slot::Kind::Storage;
        o.fixed = t;
      } else {
        auto [it, fresh] = output_of.emplace(st.get(), static_cast<int>(cp->out_first.size()));
        if (fresh) {
          g->bind_external(st, Slot::Kind::Output, it->second);
          cp->out_first.push_back(cp->outs.size());
        }
        o.kind = Slot::Kind::Output;
        o.index = it->second;
      }
      cp->outs.push_back(std::move(o));
    }
    for (const auto& r : g->reads)
      for (const auto& x : r) cp->read_precision |= x.arg < 0;
    try {
      cp->program = eng.build(*g);
    } catch (const rt::Error& e) {
      TORCH_CHECK(false, e.what());
    }
    cp->input_written.assign(inputs.size(), false);
    for (const auto& s : cp->program.results)
      if (s.kind == Slot::Kind::Input) cp->input_written[s.index] = true;
    eng.metrics.captures++;
    return cp;
  }, py::call_guard<py::gil_scoped_release>());
}

}  // namespace tt::aten
