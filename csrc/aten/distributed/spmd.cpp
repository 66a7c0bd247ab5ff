// In-program collectives (torch_tpu.spmd, v2 of distributed): a capture whose functional
// collectives (torch.ops._c10d_functional.*) become the builder's StableHLO collectives with
// replica groups, built into one program for N replicas on devices 0..N-1 of this process
// (torch_tpu/spmd.py drives it).
#include <ATen/ATen.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <atomic>
#include <functional>
#include <unordered_map>

#include "aten/compile/layout.h"
#include "aten/distributed/nogil.h"
#include "aten/tpu.h"

namespace py = pybind11;

namespace tt::aten {
namespace {

using engine::Engine;

std::atomic<int> g_spmd_device{-1};  // the device of the replicated capture in progress

// Adds `out = f(in)` to the capture on in's device; out has `out_sizes`.
at::Tensor emit_collective(const std::string& name, const at::Tensor& in, const std::vector<int64_t>& out_sizes,
                           const std::function<hlo::Value(hlo::Builder&, hlo::Value)>& f) {
  TORCH_CHECK(in.device().type() == kTpu, "torch_tpu.spmd: ", name, " needs a tpu tensor");
  NoGil nogil;
  std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
  auto& eng = Engine::get();
  engine::Graph* g = eng.capture_graph(in.device().index());
  TORCH_CHECK(g, "torch_tpu.spmd: ", name, " outside a replicated capture");
  at::Tensor out = at::empty(out_sizes, in.options());
  engine::Op op{name, "", false, "", {}, {}};
  try {
    eng.apply(*g, op, [&] {
      hlo::Value v = g->load(view_of(in));
      g->store(view_of(out), f(g->b, v));
      return lower::Reads{};
    });
  } catch (const std::runtime_error& e) {  // rt::Error, hlo::BuildError
    TORCH_CHECK(false, "torch_tpu.spmd: ", e.what());
  }
  return out;
}

int64_t group_size_of(const std::vector<std::vector<int64_t>>& groups) {
  TORCH_CHECK(!groups.empty(), "torch_tpu.spmd: no replica groups");
  return static_cast<int64_t>(groups[0].size());
}

at::Tensor spmd_all_reduce(const at::Tensor& x, const std::string& reduce_op,
                           const std::vector<std::vector<int64_t>>& groups) {
  group_size_of(groups);
  return emit_collective("_c10d_functional::all_reduce", x, x.sizes().vec(), [&](hlo::Builder& b, hlo::Value v) {
    return b.all_reduce(v, reduce_op, groups);
  });
}

at::Tensor spmd_all_gather(const at::Tensor& x, int64_t group_size, const std::vector<std::vector<int64_t>>& groups) {
  TORCH_CHECK(group_size == group_size_of(groups), "torch_tpu.spmd: all_gather_into_tensor over ", group_size,
              " ranks, but the replica groups have ", group_size_of(groups));
  TORCH_CHECK(x.dim() >= 1, "torch_tpu.spmd: all_gather_into_tensor needs a tensor with a dimension");
  auto out = x.sizes().vec();
  out[0] *= group_size;
  return emit_collective("_c10d_functional::all_gather_into_tensor", x, out, [&](hlo::Builder& b, hlo::Value v) {
    return b.all_gather(v, 0, groups);
  });
}

at::Tensor spmd_reduce_scatter(const at::Tensor& x, const std::string& reduce_op, int64_t group_size,
                               const std::vector<std::vector<int64_t>>& groups) {
  TORCH_CHECK(group_size == group_size_of(groups), "torch_tpu.spmd: reduce_scatter_tensor over ", group_size,
              " ranks, but the replica groups have ", group_size_of(groups));
  TORCH_CHECK(x.dim() >= 1 && x.size(0) % group_size == 0, "torch_tpu.spmd: reduce_scatter_tensor needs a first "
              "dimension divisible by the group size ", group_size, ", got ", x.sizes());
  auto out = x.sizes().vec();
  out[0] /= group_size;
  return emit_collective("_c10d_functional::reduce_scatter_tensor", x, out, [&](hlo::Builder& b, hlo::Value v) {
    return b.reduce_scatter(v, reduce_op, 0, groups);
  });
}

at::Tensor spmd_all_to_all(const at::Tensor& x, const std::vector<int64_t>& out_splits,
                           const std::vector<int64_t>& in_splits, const std::vector<std::vector<int64_t>>& groups) {
  int64_t k = group_size_of(groups);
  TORCH_CHECK(x.dim() >= 1 && x.size(0) % k == 0, "torch_tpu.spmd: all_to_all_single needs a first dimension "
              "divisible by the group size ", k, ", got ", x.sizes());
  for (auto* splits : {&out_splits, &in_splits})
    for (int64_t v : *splits)
      TORCH_CHECK(v == x.size(0) / k, "torch_tpu.spmd: all_to_all_single inside a program needs equal splits "
                  "(stablehlo.all_to_all); uneven splits run through the tpu_dist backend outside programs");
  return emit_collective("_c10d_functional::all_to_all_single", x, x.sizes().vec(), [&](hlo::Builder& b, hlo::Value v) {
    return b.all_to_all(v, 0, 0, groups);
  });
}

class ReplicatedProgram {
 public:
  engine::Program program;
  int replicas = 0;
  std::vector<Layout> inputs;
  struct Out {
    bool is_input = false;
    int index = 0;  // input number, or output slot
    Layout layout;
  };
  std::vector<Out> outs;
  std::vector<Layout> slots;  // per output slot: its storage's size and type (static)

  std::string text() const { return program.text ? *program.text : ""; }

  std::vector<std::vector<at::Tensor>> run(const std::vector<std::vector<at::Tensor>>& args) {
    TORCH_CHECK(static_cast<int>(args.size()) == replicas, "torch_tpu.spmd: the program has ", replicas,
                " replicas, got arguments for ", args.size());
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    auto& eng = Engine::get();
    std::vector<std::vector<engine::StoragePtr>> in(replicas), out(replicas);
    std::vector<std::vector<at::Tensor>> bases(replicas);
    for (int r = 0; r < replicas; ++r) {
      eng.flush(r);
      TORCH_CHECK(args[r].size() == inputs.size(), "torch_tpu.spmd: replica ", r, " got ", args[r].size(),
                  " tensors, the program takes ", inputs.size());
      for (size_t k = 0; k < inputs.size(); ++k) {
        const at::Tensor& t = args[r][k];
        TORCH_CHECK(t.defined() && t.device().type() == kTpu && t.device().index() == r, "torch_tpu.spmd: input ", k,
                    " of replica ", r, " must be on tpu:", r);
        TORCH_CHECK(inputs[k].same_place(t, *storage_of(t)), "torch_tpu.spmd: input ", k, " of replica ", r,
                    " has another shape, dtype or layout than at capture");
        // the program takes exact shapes: a tensor the size policy made dynamic (padded to its
        // bucket) is cut back to its size first, once
        if (storage_of(t)->dynamic()) eng.make_static(storage_of(t));
        in[r].push_back(storage_of(t));
      }
      for (const auto& sl : slots) {
        bases[r].push_back(tensor_on_new_storage(sl, r));
        out[r].push_back(storage_of(bases[r].back()));
      }
    }
    try {
      eng.run_replicated(program, in, out);
    } catch (const rt::Error& e) {
      TORCH_CHECK(false, e.what());
    }
    std::vector<std::vector<at::Tensor>> result(replicas);
    for (int r = 0; r < replicas; ++r)
      for (const auto& o : outs)
        result[r].push_back(o.is_input ? args[r][o.index] : view_like(bases[r][o.index], o.layout));
    return result;
  }
};

bool g_spmd_checks = true;  // device checks, restored when the replicated capture ends

}  // namespace

int spmd_capture_device() { return g_spmd_device.load(); }

void bind_spmd(py::module& m) {
  py::class_<ReplicatedProgram, std::shared_ptr<ReplicatedProgram>>(m, "ReplicatedProgram")
      .def("run", &ReplicatedProgram::run, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("text", &ReplicatedProgram::text)
      .def_readonly("replicas", &ReplicatedProgram::replicas);
  m.def("_spmd_begin", [](int device) {
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    TORCH_CHECK(g_spmd_device.load() < 0, "torch_tpu.spmd: a replicated capture is already in progress");
    auto& eng = Engine::get();
    try {
      eng.begin_capture(device);
    } catch (const rt::Error& e) {
      TORCH_CHECK(false, e.what());
    }
    g_spmd_checks = eng.device_checks();
    eng.set_device_checks(false);  // the check word is a per-device storage: not part of replicated programs
    g_spmd_device = device;
  }, py::call_guard<py::gil_scoped_release>());
  m.def("_spmd_input", [](const at::Tensor& t, int k) {
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    engine::Graph* g = Engine::get().capture_graph(t.device().index());
    TORCH_CHECK(g && g_spmd_device.load() == t.device().index(), "torch_tpu.spmd: no replicated capture on ", t.device());
    g->bind_external(storage_of(t), engine::Slot::Kind::Input, k);
  }, py::call_guard<py::gil_scoped_release>());
  m.def("_spmd_abort", [] {
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    int d = g_spmd_device.exchange(-1);
    if (d < 0) return;
    Engine::get().end_capture(d);
    Engine::get().set_device_checks(g_spmd_checks);
  }, py::call_guard<py::gil_scoped_release>());
  m.def("_spmd_end", [](const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs, int replicas) {
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    auto& eng = Engine::get();
    int d = g_spmd_device.exchange(-1);
    TORCH_CHECK(d >= 0, "torch_tpu.spmd: no replicated capture in progress");
    eng.set_device_checks(g_spmd_checks);
    auto g = eng.end_capture(d);
    TORCH_CHECK(g, "torch_tpu.spmd: the capture was lost");
    TORCH_CHECK(d == 0, "torch_tpu.spmd: replicas run on devices 0..N-1, capture on tpu:0");
    TORCH_CHECK(replicas >= 1 && replicas <= device_count(), "torch_tpu.spmd: ", replicas, " replicas for ",
                device_count(), " devices (TORCH_TPU_NUM_DEVICES)");
    auto rp = std::make_shared<ReplicatedProgram>();
    rp->replicas = replicas;
    std::unordered_map<const engine::Storage*, int> input_of, slot_of;
    for (size_t k = 0; k < inputs.size(); ++k) {
      rp->inputs.push_back(Layout::of(inputs[k]));
      input_of[storage_of(inputs[k]).get()] = static_cast<int>(k);
    }
    for (const auto& t : outputs) {
      ReplicatedProgram::Out o;
      o.layout = Layout::of(t);
      auto st = storage_of(t);
      auto in = input_of.find(st.get());
      if (in != input_of.end()) {
        o.is_input = true;
        o.index = in->second;
      } else {
        TORCH_CHECK(!st->buffer, "torch_tpu.spmd: an output of a replicated program must be computed by it (got a "
                    "tensor that existed before the capture)");
        auto [it, fresh] = slot_of.emplace(st.get(), static_cast<int>(rp->slots.size()));
        if (fresh) {
          g->bind_external(st, engine::Slot::Kind::Output, it->second);
          Layout sl = o.layout;  // its storage's size and type, made static (programs take exact shapes)
          sl.capacity = 0;
          sl.padded = false;
          rp->slots.push_back(sl);
        }
        o.index = it->second;
      }
      rp->outs.push_back(std::move(o));
    }
    try {
      rp->program = eng.build_replicated(*g, replicas);
    } catch (const rt::Error& e) {
      TORCH_CHECK(false, e.what());
    }
    eng.metrics.captures++;
    return rp;
  }, py::call_guard<py::gil_scoped_release>());
  m.def("_spmd_all_reduce", &spmd_all_reduce, py::call_guard<py::gil_scoped_release>());
  m.def("_spmd_all_gather", &spmd_all_gather, py::call_guard<py::gil_scoped_release>());
  m.def("_spmd_reduce_scatter", &spmd_reduce_scatter, py::call_guard<py::gil_scoped_release>());
  m.def("_spmd_all_to_all", &spmd_all_to_all, py::call_guard<py::gil_scoped_release>());
}

}  // namespace tt::aten
