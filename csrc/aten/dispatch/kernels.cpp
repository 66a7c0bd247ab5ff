// The ATen kernels of device `tpu`: one generic boxed kernel for every lowered
// op, the storage/view kernels, copies, and the CPU fallback.
#include <cstring>
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/autocast_mode.h>
#include <ATen/ThreadLocalPythonObjects.h>
#include <Python.h>
#include <pybind11/pybind11.h>
#include <frameobject.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <set>
#include <unordered_map>

#include "aten/dispatch/args.h"
#include "aten/tpu.h"

namespace tt::aten {
namespace {

using engine::Engine;
using engine::View;

// Turns engine/runtime/builder failures into PyTorch errors (RuntimeError in Python).
template <typename F>
auto guarded(const char* what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error&) {
    throw;
  } catch (const engine::DeviceCheckError& e) {
    TORCH_CHECK_INDEX(!e.index_error, e.what());
    TORCH_CHECK(false, e.what());
  } catch (const rt::Error& e) {
    TORCH_CHECK(false, e.what());
  } catch (const hlo::BuildError& e) {
    TORCH_CHECK(false, "torch_tpu could not lower ", what, ": ", e.what());
  } catch (const lower::IndexError& e) {
    TORCH_CHECK_INDEX(false, e.what());
  } catch (const lower::UserError& e) {
    TORCH_CHECK(false, e.what());
  }
}

// ---------------------------------------------------------------- op metadata
struct Call;
struct Bucketing;
// An op's quirks, as small functions that the generic kernel's stages call; an op with none
// takes the generic path only. Their table (kHooks) is below the kernel, one row per op.
struct OpHooks {
  bool cpu_indices = false;  // its index list may hold CPU tensors, as on CUDA: uploaded first
  // rewrites arguments before the Meta kernel sees them; true when it has finished the call
  bool (*prepare)(Call&) = nullptr;
  // edits a bucketed call's arguments at the bounds (past: how far past them)
  void (*at_bounds)(const Bucketing& bk, const torch::jit::Stack& args, torch::jit::Stack& at_bounds, int64_t past) = nullptr;
};

// What the generic kernel knows of one registered op, computed once when it is registered
// (LoweredOp holds it).
struct OpInfo {
  std::string name;                 // "aten::add_.Tensor"
  const lower::Rule* rule = nullptr;
  std::vector<int> rule_args;       // schema argument indices the rule sees
  std::vector<int> ret_alias;       // per return: aliased (written) argument, or -1
  bool factory = false;             // no tensor inputs among rule_args
  bool bucketed = false;            // its rule runs on bucketed values (lower::bucketed_rule)
  // an in-place or out= variant of an elementwise op: the functional op, whose result
  // type the rule computes in before the cast into the target (lower::casts_to_output)
  std::optional<c10::OperatorHandle> functional;
  OpHooks hooks;
};

std::unordered_map<std::string, std::string> g_rule_for;  // op name -> rule name
std::vector<std::string> g_lowered;

std::string op_name(const c10::OperatorName& n) {
  return n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
}

bool is_out_arg(const c10::Argument& a) {
  return a.kwarg_only() && a.alias_info() && a.alias_info()->isWrite();
}

// ---------------------------------------------------------------- meta
struct MetaOut {
  bool defined = false;
  std::vector<int64_t> sizes, strides;
  c10::ScalarType dtype = c10::kFloat;
};
struct MetaResult {
  std::vector<MetaOut> rets;
  // the sizes the bounded-dynamism policy made dynamic for this signature (decided on
  // its first call, and again on a call after some site turned dynamic, see plan_bucketing)
  bool seeded = false;
  int64_t seed_generation = 0;
  std::vector<int64_t> seeds;
};

// The IValue with every tpu tensor replaced by conv(t) and tpu devices by `dev`
// (inputs for running the same call under another dispatch key).
template <typename Conv>
c10::IValue map_tensors(const c10::IValue& v, const Conv& conv, c10::Device dev) {
  auto one = [&](const at::Tensor& t) { return (!t.defined() || t.device().type() != kTpu) ? t : conv(t); };
  if (v.isTensor()) return one(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> l;
    for (const at::Tensor& t : v.toTensorList()) l.push_back(one(t));
    return l;
  }
  if (v.isList()) {
    auto in = v.toList();
    if (in.size() > 0 && (in.get(0).isTensor() || in.get(0).isNone())) {
      c10::List<std::optional<at::Tensor>> l;
      for (size_t i = 0; i < in.size(); ++i)
        l.push_back(in.get(i).isNone() || !in.get(i).toTensor().defined()
                        ? std::optional<at::Tensor>()
                        : std::optional<at::Tensor>(one(in.get(i).toTensor())));
      return l;
    }
    return v;
  }
  if (v.isDevice() && v.toDevice().type() == kTpu) return dev;
  if (v.isGenerator()) return c10::IValue();
  return v;
}

c10::IValue meta_ivalue(const c10::IValue& v) {
  return map_tensors(
      v, [](const at::Tensor& t) { return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta)); },
      c10::Device(c10::kMeta));
}

c10::IValue cpu_ivalue(const c10::IValue& v) {
  return map_tensors(
      v,
      [](const at::Tensor& t) {
        return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kCPU)).zero_();
      },
      c10::Device(c10::kCPU));
}

void sig_append(std::string& k, const void* p, size_t n) { k.append(static_cast<const char*>(p), n); }
void sig_tensor(std::string& k, const at::Tensor& t) {
  if (!t.defined()) { k += 'u'; return; }
  k += 't';
  k += static_cast<char>(t.scalar_type());
  k += static_cast<char>(t.device().type());
  k += t.unsafeGetTensorImpl()->is_wrapped_number() ? 'w' : 'n';
  int64_t d = t.dim();
  sig_append(k, &d, sizeof d);
  sig_append(k, t.sizes().data(), d * sizeof(int64_t));
  sig_append(k, t.strides().data(), d * sizeof(int64_t));
}

// A tensor's layout as far as it holds for every size in a bucket: the order of its dims
// by stride (size-1 dims left out), and its strides themselves where it is not dense.
void layout_key(std::string& k, const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  std::vector<int64_t> order;
  for (size_t i = 0; i < sizes.size(); ++i)
    if (sizes[i] != 1) order.push_back(static_cast<int64_t>(i));
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return strides[a] > strides[b]; });
  int64_t expect = 1;
  bool dense = true;
  for (size_t i = order.size(); i-- > 0;) {
    dense = dense && strides[order[i]] == expect;
    expect *= sizes[order[i]];
  }
  k += dense ? 'd' : 's';
  for (int64_t d : order) k += static_cast<char>(d);
  if (!dense) sig_append(k, strides.data(), strides.size() * sizeof(int64_t));
}

// Signature of the arguments for the meta cache: tensors by metadata, numbers
// by type (floats by value too for factories, whose output shape may depend on
// them); ints always by value.
std::string signature(const c10::OperatorHandle& op, const torch::jit::Stack& args, bool factory) {
  std::string k;
  sig_append(k, &op.schema(), sizeof(void*));
  for (const auto& v : args) {
    if (v.isTensor()) sig_tensor(k, v.toTensor());
    else if (v.isTensorList()) { k += 'L'; for (const at::Tensor& t : v.toTensorList()) sig_tensor(k, t); }
    else if (v.isList()) {
      auto l = v.toList();
      k += 'l';
      for (size_t i = 0; i < l.size(); ++i) {
        auto e = l.get(i);
        if (e.isTensor()) sig_tensor(k, e.toTensor());
        else if (e.isNone()) k += 'n';
        else if (e.isInt()) { int64_t x = e.toInt(); sig_append(k, &x, sizeof x); }
        else if (e.isSymInt()) { int64_t x = e.toSymInt().expect_int(); sig_append(k, &x, sizeof x); }
        else if (e.isBool()) k += e.toBool() ? 'T' : 'F';
        else if (e.isDouble()) { double x = e.toDouble(); sig_append(k, &x, sizeof x); }
      }
      k += ']';
    } else if (v.isNone()) k += 'N';
    else if (v.isBool()) k += v.toBool() ? 'T' : 'F';
    else if (v.isInt()) {  // ints are dims and sizes more often than not: always exact
      int64_t x = v.toInt();
      sig_append(k, &x, sizeof x);
      k += 'i';
    } else if (v.isSymInt()) { int64_t x = v.toSymInt().expect_int(); sig_append(k, &x, sizeof x); k += 'I'; }
    else if (v.isDouble()) {
      if (factory) { double x = v.toDouble(); sig_append(k, &x, sizeof x); }
      k += 'd';
    } else if (v.isString()) { k += 's'; k += v.toStringRef(); k += '\0'; }
    else if (v.isDevice()) { k += 'D'; k += static_cast<char>(v.toDevice().type()); }
    else if (v.isComplexDouble()) k += 'c';
    else k += '?';
  }
  return k;
}

// A replay on CPU stand-ins must not advance the user's CPU random stream (a random op
// replayed for its checks): the default CPU generator's state is put back afterwards.
struct KeepCpuRng {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  at::Tensor state = gen.get_state();
  ~KeepCpuRng() { gen.set_state(state); }
};

void replay_on_cpu(const c10::OperatorHandle& op, const torch::jit::Stack& args) {
  int64_t total = 0;
  for (const auto& v : args)
    if (v.isTensor() && v.toTensor().defined()) total += v.toTensor().numel();
  if (total > (int64_t(1) << 26)) return;  // too large to stand in for; keep the Meta error
  torch::jit::Stack cs;
  for (const auto& v : args) cs.push_back(cpu_ivalue(v));
  KeepCpuRng keep;
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &cs);  // throws the CPU error
}

bool cpu_scalar(const at::Tensor& t) { return t.device().is_cpu() && t.dim() == 0; }

// ---------------------------------------------------------------- memory overlap
// CPU and CUDA reject a write into a tensor whose elements share memory (an expanded
// tensor) or that partly overlaps an input, with messages that depend on the op (most
// follow TensorIterator, index_select/cat/gather reject any overlap, fill_/zero_ accept
// it). Meta kernels skip these checks, so a call whose written tensor may overlap (its
// own elements, or a tensor argument in the same storage) is replayed once on CPU
// stand-ins with the same storages, offsets and strides, and an overlap error of CPU's
// is raised here. The outcome is cached per call geometry.
template <typename F>
void for_each_tensor(const torch::jit::Stack& args, const F& f) {
  for (const auto& v : args) {
    if (v.isTensor()) f(v.toTensor());
    else if (v.isTensorList()) for (const at::Tensor& t : v.toTensorList()) f(t);
    else if (v.isList()) {
      auto l = v.toList();
      for (size_t i = 0; i < l.size(); ++i)
        if (l.get(i).isTensor()) f(l.get(i).toTensor());
    }
  }
}

bool may_overlap(const c10::FunctionSchema& schema, const torch::jit::Stack& args) {
  const auto& sargs = schema.arguments();
  for (size_t i = 0; i < sargs.size() && i < args.size(); ++i) {
    if (!(sargs[i].alias_info() && sargs[i].alias_info()->isWrite()) || !args[i].isTensor()) continue;
    const at::Tensor& w = args[i].toTensor();
    if (!w.defined() || w.device().type() != kTpu || w.numel() == 0) continue;
    if (at::has_internal_overlap(w) == at::MemOverlap::Yes) return true;
    bool shared = false;
    int itself = 0;  // the written tensor passed again as an input (index_select(x, .., out=x))
    for_each_tensor(args, [&](const at::Tensor& t) {
      if (shared || !t.defined() || t.device().type() != kTpu || !t.has_storage()) return;
      if (t.unsafeGetTensorImpl() == w.unsafeGetTensorImpl()) shared = ++itself > 1;
      else shared = t.storage().is_alias_of(w.storage()) && at::get_overlap_status(w, t) != at::MemOverlapStatus::No;
    });
    if (shared) return true;
  }
  return false;
}

// Complex support: CPU implements many ops for real types only ("clamp is not supported
// for complex types", "lt_cpu" not implemented for 'ComplexFloat'), and Meta kernels do
// not tell. A call with a complex operand is replayed once per op and dtypes on CPU
// stand-ins; CPU's dtype error (NotImplementedError, or one naming complex types) is
// raised here, any other outcome is the call's own (the stand-ins are zeros).
std::mutex g_complex_mu;  // also guards g_empty_ok (calls with only empty tensors, checked on CPU)
std::set<std::string> g_complex_ok, g_empty_ok;

std::mutex g_overlap_mu;
std::set<std::string> g_overlap_ok;

void check_overlap(const c10::OperatorHandle& op, const torch::jit::Stack& args) {
  if (!may_overlap(op.schema(), args)) return;
  // the geometry: per tpu tensor its storage (as the first tensor sharing it), offset, sizes, strides
  std::vector<const c10::StorageImpl*> storages;
  std::string key;
  sig_append(key, &op.schema(), sizeof(void*));
  int64_t bytes = 0;
  for_each_tensor(args, [&](const at::Tensor& t) {
    if (!t.defined() || t.device().type() != kTpu || !t.has_storage()) { key += 'u'; return; }
    const c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
    auto it = std::find(storages.begin(), storages.end(), s);
    int64_t group = it - storages.begin(), off = t.storage_offset();
    if (it == storages.end()) {
      storages.push_back(s);
      bytes += static_cast<int64_t>(s->nbytes());
    }
    sig_append(key, &group, sizeof group);
    sig_append(key, &off, sizeof off);
    sig_tensor(key, t);
  });
  for (const auto& v : args)  // scalars may pick the overload path (e.g. dims)
    if (v.isInt()) { int64_t x = v.toInt(); sig_append(key, &x, sizeof x); }
  {
    std::lock_guard<std::mutex> lock(g_overlap_mu);
    if (g_overlap_ok.count(key)) return;
  }
  if (bytes > (int64_t(1) << 28)) return;  // too large to stand in for
  std::vector<at::Tensor> bases(storages.size());
  for (size_t i = 0; i < storages.size(); ++i)
    bases[i] = at::zeros({static_cast<int64_t>(storages[i]->nbytes())}, at::TensorOptions().dtype(c10::kByte));
  torch::jit::Stack cs;
  for (const auto& v : args)
    cs.push_back(map_tensors(
        v,
        [&](const at::Tensor& t) {
          if (!t.has_storage()) return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kCPU)).zero_();
          size_t g = std::find(storages.begin(), storages.end(), t.storage().unsafeGetStorageImpl()) - storages.begin();
          return at::empty({0}, t.options().device(c10::kCPU))
              .set_(bases[g].storage(), t.storage_offset(), t.sizes(), t.strides());
        },
        c10::Device(c10::kCPU)));
  try {
    KeepCpuRng keep;
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &cs);
  } catch (const c10::Error& e) {
    if (std::string(e.what_without_backtrace()).find("unsupported operation:") != std::string::npos) throw;
  } catch (const std::exception&) {  // another error (the stand-ins are zeros): the call reports its own
  }
  std::lock_guard<std::mutex> lock(g_overlap_mu);
  if (g_overlap_ok.size() > 4096) g_overlap_ok.clear();
  g_overlap_ok.insert(key);
}

std::mutex g_meta_mu;
std::atomic<int64_t> g_meta_runs{0};
struct MetaUnavailable {};
std::unordered_map<std::string, MetaResult> g_meta_cache;

// `sig` receives the call's signature (the start of its trace key).
MetaResult run_meta(const c10::OperatorHandle& op, const torch::jit::Stack& args, bool factory, std::string& sig,
                    bool* miss = nullptr) {
  sig = signature(op, args, factory);
  const std::string& key = sig;
  {
    std::lock_guard<std::mutex> lock(g_meta_mu);
    auto it = g_meta_cache.find(key);
    if (it != g_meta_cache.end()) return it->second;
  }
  if (miss) *miss = true;
  g_meta_runs++;
  torch::jit::Stack ms;
  // CPU scalars (0-dim CPU tensors) stay on the CPU for the Meta kernel, as they do for
  // CUDA's kernels; a Meta kernel that insists on one device (masked_fill.Tensor's value)
  // gets them as 0-dim meta tensors instead (same dtype, so the same promotion).
  auto redispatch_meta = [&](bool scalars_too) {
    ms.clear();
    for (const auto& v : args) {
      if (scalars_too && v.isTensor() && v.toTensor().defined() && cpu_scalar(v.toTensor())) {
        at::Tensor m = at::empty({}, v.toTensor().options().device(c10::kMeta));
        m.unsafeGetTensorImpl()->set_wrapped_number(v.toTensor().unsafeGetTensorImpl()->is_wrapped_number());
        ms.push_back(m);
      } else {
        ms.push_back(meta_ivalue(v));
      }
    }
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &ms);
  };
  try {
    try {
      redispatch_meta(false);
    } catch (const std::exception&) {
      bool has_cpu_scalar = false;
      for (const auto& v : args) has_cpu_scalar |= v.isTensor() && v.toTensor().defined() && cpu_scalar(v.toTensor());
      if (!has_cpu_scalar) throw;
      redispatch_meta(true);
    }
  } catch (const std::exception&) {
    // Some Meta kernels are Python decompositions whose messages differ from
    // the CPU kernel's. Replay the call on CPU with zero-filled stand-ins so the
    // user sees exactly the CPU error (type and message); if the CPU accepts
    // it, the Meta error stands.
    replay_on_cpu(op, args);
    // The CPU accepts it: the Meta kernel cannot compute this output shape
    // (data-dependent, e.g. boolean-mask indexing); run the call on the CPU.
    throw MetaUnavailable();
  }
  MetaResult r;
  for (const auto& v : ms) {
    MetaOut o;
    if (v.isTensor() && v.toTensor().defined()) {
      const at::Tensor& t = v.toTensor();
      o.defined = true;
      o.sizes = t.sizes().vec();
      o.strides = t.strides().vec();
      o.dtype = t.scalar_type();
    }
    r.rets.push_back(o);
  }
  std::lock_guard<std::mutex> lock(g_meta_mu);
  if (g_meta_cache.size() > 65536) g_meta_cache.clear();
  g_meta_cache[key] = r;
  return r;
}

bool non_overlapping_dense(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  std::vector<size_t> order(sizes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return strides[a] < strides[b]; });
  int64_t expect = 1;
  for (size_t i : order) {
    if (sizes[i] == 1) continue;
    if (strides[i] != expect) return false;
    expect *= sizes[i];
  }
  return true;
}

at::Tensor new_tpu_tensor(const MetaOut& m, int device) {
  c10::DeviceGuard g(c10::Device(kTpu, static_cast<c10::DeviceIndex>(device)));
  at::TensorBase t;
  if (non_overlapping_dense(m.sizes, m.strides))
    t = at::detail::empty_strided_generic(m.sizes, m.strides, allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), m.dtype);
  else
    t = at::detail::empty_generic(m.sizes, allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), m.dtype, std::nullopt);
  auto st = storage_of(t);
  st->dtype = to_hlo(m.dtype);
  st->typed = true;
  return at::Tensor(t);
}

// ---------------------------------------------------------------- rule env
class OpEnv final : public lower::Env {
 public:
  OpEnv(engine::Graph& g, int device) : g_(g), device_(device) {}
  hlo::Value scalar_param(double v, bool is_int, hlo::DType t) override {
    hlo::Value p = g_.scalar_param(v, is_int, t);
    values_.emplace_back(p.id, v);
    return p;
  }
  std::optional<double> scalar_value(const hlo::Value& v) const override {
    for (const auto& [id, x] : values_)
      if (id == v.id) return x;
    return std::nullopt;
  }
  std::pair<hlo::Value, hlo::Value> rng(int64_t n) override {
    if (g_.capture) return g_.rng_param(n);  // drawn each time the captured program runs
    auto [seed, offset] = generator_take(device_, static_cast<uint64_t>(n));
    auto [key, counter] = Engine::rng_words(seed, offset);
    return {g_.scalar_param(key, true, hlo::DType::U32), g_.scalar_param(counter, true, hlo::DType::U32)};
  }
  // `with torch.tpu.precision(p)` stashes p in PyTorch's thread-local Python
  // objects, which autograd carries to the threads that run backward ops; the
  // process-wide default applies where no override is set (or it is -1).
  lower::Precision precision() const override {
    lower::Precision p = current_precision();
    read_precision = static_cast<int>(p);
    return p;
  }
  static lower::Precision current_precision() {
    static const std::string key = "torch_tpu.matmul_precision";
    if (Py_IsInitialized() && at::impl::ThreadLocalPythonObjects::contains(key)) {
      const auto& obj = at::impl::ThreadLocalPythonObjects::get(key);
      long v = -1;
      {
        pybind11::gil_scoped_acquire gil;
        v = PyLong_AsLong(obj->ptr(&obj->pyinterpreter()));
        if (PyErr_Occurred()) {
          PyErr_Clear();
          v = -1;
        }
      }
      if (v >= 0 && v <= 2) return static_cast<lower::Precision>(v);
    }
    return process_precision();
  }
  bool native_precision() const override { return rt::Client::get().platform_name() == "tpu"; }
  void check(hlo::Value bad, hlo::Value value, bool index_error, const std::string& message) override {
    Engine::get().add_check(g_, bad, value, index_error, message);
  }
  mutable int read_precision = -1;  // the mode the rule read (it shapes the text), or -1

 private:
  engine::Graph& g_;
  int device_;
  std::vector<std::pair<int, double>> values_;  // scalar parameters made for this op
};

[[noreturn]] void device_mismatch(const c10::Device& a, const c10::Device& b) {
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ", a, " and ",
              b, "!");
}


bool dtype_supported(c10::ScalarType t) {
  try {
    (void)to_hlo(t);
    return true;
  } catch (const c10::Error&) {
    return false;
  }
}

// A CPU tensor passed where the op allows one (indices of index/index_put):
// uploaded to a temporary tpu storage.
at::Tensor upload(const at::Tensor& t, int device) {
  return t.to(c10::Device(kTpu, static_cast<c10::DeviceIndex>(device)));
}

void fallback_impl(const c10::OperatorHandle& op, torch::jit::Stack* stack, const char* reason);

// "file.py:123 (in fn)" of the innermost Python frame outside torch and
// torch_tpu, or "" when no Python code is running on this thread (autograd's
// backward threads). Used to name the line of a failing op in deferred programs.
// With `inner`, the innermost frame of all (a line in torch.nn or torch.optim) comes
// first: the size policy tells apart calls that the user's line alone would not. (Not the
// user frame's caller: as Dynamo's memory of a frame, a helper's sizes are one history
// whoever calls it, so moving a call elsewhere does not start the policy over.)
std::string python_site(bool inner = false) {
  if (!Py_IsInitialized()) return "";
  pybind11::gil_scoped_acquire gil;
  PyFrameObject* f = PyEval_GetFrame();
  if (!f) return "";
  Py_INCREF(f);
  // "file:line (in function)" of a frame; the line is computed only for the frame reported
  auto describe = [](PyFrameObject* fr) {
    PyCodeObject* code = PyFrame_GetCode(fr);
    const char* file = PyUnicode_AsUTF8(code->co_filename);
    const char* fn = PyUnicode_AsUTF8(code->co_name);
    std::string where = std::string(file ? file : "?") + ":" + std::to_string(PyFrame_GetLineNumber(fr)) + " (in " +
                        (fn ? fn : "?") + ")";
    Py_DECREF(code);
    return where;
  };
  PyFrameObject* first = f;  // reported when no user frame is found
  Py_INCREF(first);
  std::string out;
  for (int depth = 0; f && depth < 32; ++depth) {
    PyCodeObject* code = PyFrame_GetCode(f);
    const char* file = PyUnicode_AsUTF8(code->co_filename);
    bool internal = file && (std::strstr(file, "/torch/") || std::strstr(file, "/torch_tpu/"));
    Py_DECREF(code);
    if (!internal) {
      out = describe(f);
      break;
    }
    PyFrameObject* back = PyFrame_GetBack(f);
    Py_DECREF(f);
    f = back;
  }
  if (!out.empty() && inner && first != f) out = describe(first) + " < " + out;
  if (f) Py_DECREF(f);
  if (out.empty()) out = describe(first);
  Py_DECREF(first);
  if (PyErr_Occurred()) PyErr_Clear();
  return out;
}

void check_complex_support(const c10::OperatorHandle& op, const torch::jit::Stack& args) {
  bool complex = false;
  std::string key;
  sig_append(key, &op.schema(), sizeof(void*));
  for (const auto& v : args)
    if (v.isComplexDouble()) {
      complex = true;
      key += 'c';
    }
  for_each_tensor(args, [&](const at::Tensor& t) {
    key += t.defined() ? static_cast<char>(t.scalar_type()) : 'u';
    complex |= t.defined() && t.is_complex();
  });
  if (!complex) return;
  {
    std::lock_guard<std::mutex> lock(g_complex_mu);
    if (g_complex_ok.count(key)) return;
  }
  try {
    replay_on_cpu(op, args);
  } catch (const c10::NotImplementedError&) {
    throw;
  } catch (const c10::Error& e) {
    std::string m = e.what_without_backtrace();
    if (m.find("complex") != std::string::npos || m.find("Complex") != std::string::npos) throw;
  } catch (const std::exception&) {
  }
  std::lock_guard<std::mutex> lock(g_complex_mu);
  g_complex_ok.insert(key);
}

// ---------------------------------------------------------------- bounded dynamism
// A call that reads a tensor of a dynamic storage (engine.h, Storage::dyn) is built for
// its bucket: its views are read through run-time geometry, dims of a dynamic size at
// their bound, and a rule that is correct on padded values (lower::bucketed_rule) runs
// at the bounds. The Meta kernel at the bounds gives the rule its output types; against
// a second run one element larger in every dynamic size, it tells which output dims
// follow a dynamic size: those get dynamic storages. A rule without that property runs
// at the call's sizes (a program per size, as for static shapes).
struct Bucketing {
  // a call with dynamic inputs built at its sizes: outputs with a dim of one of those
  // sizes are still made dynamic (their consumers keep serving the bucket)
  std::vector<std::pair<int64_t, int64_t>> exact_sizes;
  std::vector<std::vector<int64_t>> exact_bound;  // or per output the bound of each dim (from the Meta kernel)
  bool active = false;    // some tensor reads through run-time geometry
  bool bucketed = false;  // some dim is dynamic and the rule runs at the bounds
  std::vector<std::pair<int64_t, int64_t>> sizes;  // the call's dynamic (size, bound) pairs
  torch::jit::Stack args;                          // the rule's arguments (SymInts of a dynamic size at their bound)
  MetaResult meta;                                 // output types at the bounds
  std::vector<std::vector<int64_t>> out_bound;     // per output: per dim the bound of a dynamic dim, else 0
  std::string key;                                 // the call's signature at the bounds
  // dims the size policy made dynamic in tensors of static storages with values (a slice of
  // a fixed buffer, mask[:T, :T]): read through run-time geometry at their bound, the storage
  // left as it is
  std::vector<std::pair<const c10::TensorImpl*, hlo::Shape>> marks;
  // sizes at their bound that another tensor of the call holds static (x[n/16, 8] @ w[8/8, 8/8]):
  // read as static dims (through run-time geometry), so the call pairs no bound with a size
  std::vector<int64_t> demoted;
  // one bound per dynamic size in the call: the largest any of its tensors has for it ([B*T] of
  // a [B, T/16] storage bounded by B*16, the same size in an uploaded target at its own bucket)
  std::vector<std::pair<int64_t, int64_t>> unified;
  engine::View view(const at::Tensor& t) const {
    engine::View v = Engine::get().dynamic_view(view_of(t));
    for (const auto& [impl, bound] : marks)
      if (impl == t.unsafeGetTensorImpl()) {
        v.runtime = true;
        if (v.bound.empty()) v.bound.assign(v.sizes.size(), 0);
        for (size_t i = 0; i < bound.size() && i < v.bound.size(); ++i) v.bound[i] = std::max(v.bound[i], bound[i]);
      }
    for (size_t i = 0; i < v.bound.size(); ++i)
      if (v.bound[i] > 0 && std::find(demoted.begin(), demoted.end(), v.sizes[i]) != demoted.end()) v.bound[i] = 0;
    for (size_t i = 0; i < v.bound.size(); ++i)
      for (const auto& [n, b] : unified)
        if (v.bound[i] > 0 && v.sizes[i] == n) v.bound[i] = b;
    return v;
  }
};

bool is_symint(const c10::TypePtr& t) {
  switch (t->kind()) {
    case c10::TypeKind::SymIntType: return true;
    case c10::TypeKind::ListType: return is_symint(t->castRaw<c10::ListType>()->getElementType());
    case c10::TypeKind::OptionalType: return is_symint(t->castRaw<c10::OptionalType>()->getElementType());
    default: return false;
  }
}

// A SymInt[] argument that lists sizes (size, input_sizes, split_sizes, ...; not pads,
// repeats or strides): its entries of a dynamic size are put at their bound.
bool is_size_list(const c10::Argument& a) {
  const auto& t = a.real_type();
  bool list = t->kind() == c10::TypeKind::ListType ||
              (t->kind() == c10::TypeKind::OptionalType &&
               t->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::ListType);
  return list && is_symint(t) && a.name().find("size") != std::string::npos;
}

bool is_number(const c10::Argument& a) {
  auto k = a.type()->kind();
  return k == c10::TypeKind::NumberType ||
         (k == c10::TypeKind::OptionalType && a.type()->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::NumberType);
}

// A policy site: the call's structure (its op, dtypes and ranks) with the places that hold
// n marked, and no other sizes, strides (they follow the sizes) or Python numbers (values,
// not structure); plan_bucketing adds the lines that made the call. The same n in several
// places (a square mask, both operands of an add) is one site. Other sizes are left out so
// that a size's history survives the others' changes: a batch of 7 that drops to 2 in an
// epoch's last step is a change of the batch, whatever the lengths of both steps.
std::string policy_site(const c10::OperatorHandle& op, const torch::jit::Stack& args, int64_t n) {
  std::string k;
  sig_append(k, &op.schema(), sizeof(void*));
  auto size = [&](int64_t x) { k += x == n ? 'n' : '.'; };
  auto tensor = [&](const at::Tensor& t) {
    if (!t.defined()) { k += 'u'; return; }
    k += static_cast<char>(t.scalar_type());
    k += static_cast<char>(t.device().type());
    for (int64_t d = 0; d < t.dim(); ++d) size(t.size(d));
    k += '|';
  };
  const auto& sargs = op.schema().arguments();
  for (size_t a = 0; a < args.size(); ++a) {
    const c10::IValue& v = args[a];
    bool sizes = a < sargs.size() && is_size_list(sargs[a]);
    if (a < sargs.size() && is_number(sargs[a])) { k += '#'; continue; }
    if (v.isTensor()) tensor(v.toTensor());
    else if (v.isTensorList()) for (const at::Tensor& t : v.toTensorList()) tensor(t);
    else if (v.isList()) {
      auto l = v.toList();
      for (size_t i = 0; i < l.size(); ++i)
        if (l.get(i).isTensor()) tensor(l.get(i).toTensor());
        else if (l.get(i).isInt()) {
          if (sizes) size(l.get(i).toInt());
          else { int64_t x = l.get(i).toInt(); sig_append(k, &x, sizeof x); }
        }
      k += ']';
    } else if (v.isInt()) { int64_t x = v.toInt(); sig_append(k, &x, sizeof x); }
    else if (v.isBool()) k += v.toBool() ? 'T' : 'F';
    else k += '.';
  }
  return k;
}

std::mutex g_bucket_mu;
std::map<std::string, int64_t> g_bucketed_counts;  // op -> calls built at a bucket (metrics)
struct BucketMeta {
  bool ok = false;
  MetaResult at_bound, past_bound;
};
std::unordered_map<std::string, BucketMeta> g_bucket_meta;

// The call's arguments with each tpu tensor as a meta tensor of its value shape (plus
// `plus` in its dynamic dims) and each SymInt equal to a dynamic size at its bound (+ plus).
torch::jit::Stack bucket_stack(const c10::FunctionSchema& schema, const torch::jit::Stack& args,
                               const std::function<engine::View(const at::Tensor&)>& view,
                               const std::vector<std::pair<int64_t, int64_t>>& sizes, int64_t plus, bool meta) {
  auto sub = [&](int64_t v) {
    for (const auto& [s, b] : sizes)
      if (v == s) return b + plus;
    return v;
  };
  auto tensor = [&](const at::Tensor& t) -> at::Tensor {
    if (!t.defined() || t.device().type() != kTpu) return t;
    engine::View v = view(t);
    hlo::Shape shape = v.value_shape();
    for (size_t i = 0; i < shape.size(); ++i)
      if (!v.bound.empty() && v.bound[i] > 0) shape[i] += plus;
    return meta ? at::empty(shape, t.options().device(c10::kMeta)) : t;
  };
  torch::jit::Stack out;
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = args[i];
    bool symint = i < schema.arguments().size() && is_size_list(schema.arguments()[i]);
    bool out_arg = i < schema.arguments().size() && schema.arguments()[i].is_out();
    // an out= tensor starts empty in a probe: its resize is silent (a Python Meta kernel's
    // resize warning would reach the user, past any C++ warning handler)
    if (meta && out_arg && v.isTensor() && v.toTensor().defined() && v.toTensor().device().type() == kTpu)
      out.push_back(at::empty({0}, v.toTensor().options().device(c10::kMeta)));
    else if (v.isTensor()) out.push_back(tensor(v.toTensor()));
    else if (v.isTensorList()) {
      c10::List<at::Tensor> l;
      for (const at::Tensor& t : v.toTensorList()) l.push_back(tensor(t));
      out.push_back(l);
    } else if (v.isList()) {
      auto in = v.toList();
      bool tensors = in.size() > 0 && (in.get(0).isTensor() || in.get(0).isNone());
      if (tensors) {
        c10::List<std::optional<at::Tensor>> l;
        for (size_t j = 0; j < in.size(); ++j)
          l.push_back(in.get(j).isNone() || !in.get(j).toTensor().defined() ? std::optional<at::Tensor>()
                                                                             : std::optional<at::Tensor>(tensor(in.get(j).toTensor())));
        out.push_back(l);
      } else if (symint) {
        std::vector<int64_t> l;
        for (size_t j = 0; j < in.size(); ++j) l.push_back(sub(in.get(j).toInt()));
        out.push_back(l);
      } else {
        out.push_back(v);
      }
    } else if (meta && v.isDevice() && v.toDevice().type() == kTpu) {
      out.push_back(c10::Device(c10::kMeta));
    } else if (meta && v.isGenerator()) {
      out.push_back(c10::IValue());
    } else {
      out.push_back(v);
    }
  }
  return out;
}

// the bucket probes run Meta kernels on shapes the user never passed: their warnings
// (an out= tensor resized) are not the call's
struct QuietWarnings : c10::WarningHandler {
  void process(const c10::Warning&) override {}
};

bool meta_of(const c10::OperatorHandle& op, torch::jit::Stack ms, MetaResult& r) {
  static QuietWarnings quiet;
  c10::WarningUtils::WarningHandlerGuard guard(&quiet);
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &ms);
  } catch (const std::exception&) {
    return false;
  }
  for (const auto& v : ms) {
    MetaOut o;
    if (v.isTensor() && v.toTensor().defined()) {
      o.defined = true;
      o.sizes = v.toTensor().sizes().vec();
      o.dtype = v.toTensor().scalar_type();
    }
    r.rets.push_back(o);
  }
  return true;
}

Bucketing plan_bucketing(const c10::OperatorHandle& op, const OpInfo& info, const torch::jit::Stack& args,
                         const MetaResult& meta, bool meta_miss, const std::string& sig) {
  Bucketing bk;
  Engine& eng = Engine::get();
  if (!eng.dynamism() || !info.rule) return bk;
  bool any = false;
  for_each_tensor(args, [&](const at::Tensor& t) {
    any |= t.defined() && t.device().type() == kTpu && storage_of(t)->dynamic();
  });
  bool safe = lower::bucket_rules_override() == 0 ? info.bucketed : lower::bucket_rule_allowed(info.name, info.bucketed);
  // the size policy, on a new signature: a size that changed since the last epoch makes
  // the storages of the tensors with a dim of that size dynamic (never parameters), and
  // the size lists' entries of that size (zeros(n), new_ones((b, n))) create dynamic dims
  std::vector<std::pair<int64_t, int64_t>> created;
  // (decided on a signature's first call, then applied to every call of it: the same
  // mask built twice in a step is dynamic both times)
  std::vector<int64_t> seeds = meta.seeds;
  // (a signature first seen in the warm-up, when its sizes were still static, is decided
  // again once a site has turned dynamic since: a [6, 68] mask built in step 0 and again
  // in step 8, after the length went dynamic, is dynamic in step 8)
  if (safe && (!meta.seeded || meta.seed_generation != eng.site_generation())) {
    std::vector<int64_t> sizes;
    auto note = [&](int64_t n) {
      if (n >= 2 && std::find(sizes.begin(), sizes.end(), n) == sizes.end()) sizes.push_back(n);
    };
    for_each_tensor(args, [&](const at::Tensor& t) {
      if (t.defined() && t.device().type() == kTpu)
        for (int64_t d = 0; d < t.dim(); ++d) note(t.size(d));
    });
    const auto& sargs = op.schema().arguments();
    for (size_t a = 0; a < args.size() && a < sargs.size(); ++a)
      if (is_size_list(sargs[a]) && args[a].isList()) {
        auto l = args[a].toList();
        for (size_t i = 0; i < l.size(); ++i)
          if (l.get(i).isInt()) note(l.get(i).toInt());
      }
    // the lines that made the call are part of the site: the same op at the same other
    // sizes elsewhere (AdamW on a [32, 64] weight, a [6, T] mask when T is 64) is not the
    // size that keeps changing
    std::string where = sizes.empty() ? std::string() : python_site(/*inner=*/true);
    for (int64_t n : sizes)
      if (std::find(seeds.begin(), seeds.end(), n) == seeds.end() && eng.size_changed(policy_site(op, args, n) + where, n))
        seeds.push_back(n);
    std::lock_guard<std::mutex> lock(g_meta_mu);
    auto it = g_meta_cache.find(sig);
    if (it != g_meta_cache.end()) {
      it->second.seeded = true;
      it->second.seed_generation = eng.site_generation();
      it->second.seeds = seeds;
    }
  }
  // a size that a dynamic tensor of the call holds static (its own dims decide) stays static
  // in the others too: marking it there would pair a bound with a size (x[n/16, 8] @ w[8, 8])
  seeds.erase(std::remove_if(seeds.begin(), seeds.end(),
                             [&](int64_t n) {
                               bool held = false;
                               for_each_tensor(args, [&](const at::Tensor& t) {
                                 if (held || !t.defined() || t.device().type() != kTpu || !storage_of(t)->dynamic()) return;
                                 engine::View v = Engine::get().dynamic_view(view_of(t));
                                 for (int64_t d = 0; d < t.dim(); ++d)
                                   held |= t.size(d) == n && (!v.runtime || v.bound.size() <= static_cast<size_t>(d) || v.bound[d] <= 0);
                               });
                               return held;
                             }),
              seeds.end());
  if (!seeds.empty()) {
    const auto& sargs = op.schema().arguments();
    for (int64_t n : seeds) {
      int64_t b = eng.bucket(n);
      bool in_list = false;
      for (size_t a = 0; a < args.size() && a < sargs.size(); ++a)
        if (is_size_list(sargs[a]) && args[a].isList()) {
          auto l = args[a].toList();
          for (size_t i = 0; i < l.size(); ++i) in_list |= l.get(i).isInt() && l.get(i).toInt() == n;
        }
      if (in_list) created.emplace_back(n, b);
      for_each_tensor(args, [&](const at::Tensor& t) {
        if (!t.defined() || t.device().type() != kTpu || (t.is_leaf() && t.requires_grad())) return;
        auto st = storage_of(t);
        if (st->pinned_static) return;
        hlo::Shape bound(t.dim(), 0);
        bool hit = false;
        for (int64_t d = 0; d < t.dim(); ++d)
          if (t.size(d) == n) {
            bound[d] = b;
            hit = true;
          }
        if (!hit || st->dynamic()) return;  // a dynamic storage: its own dims decide
        // A storage with a value is not padded in place (a compiled program may read its
        // buffer as it is): this call reads it through run-time geometry with those dims dynamic.
        if (st->buffer || eng.pending(st)) {
          auto impl = t.unsafeGetTensorImpl();
          auto it = std::find_if(bk.marks.begin(), bk.marks.end(), [&](const auto& m) { return m.first == impl; });
          if (it == bk.marks.end()) bk.marks.emplace_back(impl, bound);
          else
            for (size_t i = 0; i < bound.size(); ++i) it->second[i] = std::max(it->second[i], bound[i]);
          any = true;
          return;
        }
        if (t.storage_offset() == 0 && t.is_non_overlapping_and_dense() && t.numel() == st->numel()) {
          eng.make_dynamic(st, t.sizes().vec(), t.strides().vec(), bound);
        } else {
          int64_t N = st->numel(), m = t.numel();
          eng.make_dynamic(st, N - m + m / n * b, {{n, b}});
        }
        any = true;
      });
    }
  }
  if (!any && created.empty()) return bk;
  {
    // A dynamic size that some tensor of the call holds static is read static (demoted), so
    // the call pairs no bound with a size and its other dynamic dims stay bucketed (the size
    // held is a size of the program anyway): held by another tensor (a batch of 3 that an
    // index made dynamic, met by a KV cache built with a static batch of 3), or by the same
    // tensor when the dynamic dim is at its bound (x[n/16, 8] with n = 16 = a fixed dim).
    struct Dim {
      int64_t size;
      const c10::TensorImpl* in;
      bool full;  // a dynamic dim at its bound
    };
    std::vector<Dim> held, dynamic;
    for_each_tensor(args, [&](const at::Tensor& t) {
      if (!t.defined() || t.device().type() != kTpu) return;
      engine::View v = bk.view(t);
      for (size_t i = 0; i < v.sizes.size(); ++i) {
        bool dyn = i < v.bound.size() && v.bound[i] > 0;
        if (dyn) dynamic.push_back({v.sizes[i], t.unsafeGetTensorImpl(), v.bound[i] == v.sizes[i]});
        else if (v.sizes[i] >= 2) held.push_back({v.sizes[i], t.unsafeGetTensorImpl(), false});
      }
    });
    for (const Dim& d : dynamic)
      for (const Dim& h : held)
        if (h.size == d.size && (d.full || h.in != d.in) &&
            std::find(bk.demoted.begin(), bk.demoted.end(), d.size) == bk.demoted.end())
          bk.demoted.push_back(d.size);
  }
  auto unify = [&](int64_t n, int64_t b) {
    auto it = std::find_if(bk.unified.begin(), bk.unified.end(), [&](const auto& u) { return u.first == n; });
    if (it == bk.unified.end()) bk.unified.emplace_back(n, b);
    else it->second = std::max(it->second, b);
  };
  for (const auto& [n, b] : created) unify(n, b);
  for_each_tensor(args, [&](const at::Tensor& t) {
    if (!t.defined() || t.device().type() != kTpu) return;
    engine::View v = bk.view(t);
    for (size_t i = 0; i < v.bound.size(); ++i)
      if (v.bound[i] > 0) unify(v.sizes[i], v.bound[i]);
  });
  for (auto& [n, b] : created)
    for (const auto& [un, ub] : bk.unified)
      if (un == n) b = ub;
  auto view = [&](const at::Tensor& t) { return bk.view(t); };
  bk.sizes = created;
  for_each_tensor(args, [&](const at::Tensor& t) {
    if (!t.defined() || t.device().type() != kTpu) return;
    engine::View v = view(t);
    for (size_t i = 0; i < v.bound.size(); ++i)
      if (v.bound[i] > 0 && std::find(bk.sizes.begin(), bk.sizes.end(), std::make_pair(v.sizes[i], v.bound[i])) == bk.sizes.end())
        bk.sizes.emplace_back(v.sizes[i], v.bound[i]);
  });
  static const bool log = std::getenv("TORCH_TPU_LOG_COMPILES") != nullptr;
  // (debugging aid: TORCH_TPU_LOG_COMPILES / TORCH_TPU_LOG_BUCKETS) sizes/bounds of the call's tensors
  auto describe = [&]() {
    std::string shapes;
    for_each_tensor(args, [&](const at::Tensor& t) {
      if (!t.defined() || t.device().type() != kTpu) return;
      engine::View v = view(t);
      shapes += " [";
      for (size_t i = 0; i < v.sizes.size(); ++i)
        shapes += std::to_string(v.sizes[i]) + (v.bound.size() > i && v.bound[i] ? "/" + std::to_string(v.bound[i]) : "") + ",";
      shapes += "]";
    });
    return shapes;
  };
  const auto& schema = op.schema();
  auto hook_at_bounds = [&](torch::jit::Stack& st, int64_t past) {
    if (info.hooks.at_bounds) info.hooks.at_bounds(bk, args, st, past);
  };
  torch::jit::Stack ms = bucket_stack(schema, args, view, bk.sizes, 0, true);
  hook_at_bounds(ms, 0);
  bk.key = signature(op, ms, info.factory);
  bk.key += 'B';  // which dims are dynamic (the shapes at the bounds do not tell)
  for_each_tensor(args, [&](const at::Tensor& t) {
    if (!t.defined() || t.device().type() != kTpu) return;
    engine::View v = view(t);
    uint64_t mask = 0;
    for (size_t i = 0; i < v.bound.size() && i < 64; ++i) mask |= uint64_t{v.bound[i] > 0} << i;
    sig_append(bk.key, &mask, sizeof mask);
  });
  if (bk.sizes.empty()) {  // only run-time geometry: the call's own shapes
    bk.active = true;
    bk.args = args;
    bk.meta = meta;
    bk.out_bound.assign(meta.rets.size(), {});
    return bk;
  }
  BucketMeta bm;
  {
    std::lock_guard<std::mutex> lock(g_bucket_mu);
    auto it = g_bucket_meta.find(bk.key);
    if (it != g_bucket_meta.end()) bm = it->second;
  }
  if (!bm.ok && (bm.at_bound.rets.empty())) {
    torch::jit::Stack past = bucket_stack(schema, args, view, bk.sizes, 1, true);
    hook_at_bounds(past, 1);
    bm.ok = meta_of(op, ms, bm.at_bound) && meta_of(op, past, bm.past_bound);
    if (!bm.ok) bm.at_bound.rets.clear();
    std::lock_guard<std::mutex> lock(g_bucket_mu);
    if (g_bucket_meta.size() > 65536) g_bucket_meta.clear();
    g_bucket_meta[bk.key] = bm;
  }
  // every output: the same rank at the bounds, no dim smaller than the call's
  bool ok = bm.ok && bm.at_bound.rets.size() == meta.rets.size() && bm.past_bound.rets.size() == meta.rets.size();
  for (size_t k = 0; ok && k < meta.rets.size(); ++k) {
    const auto &t = meta.rets[k], &b = bm.at_bound.rets[k], &p = bm.past_bound.rets[k];
    ok = t.defined == b.defined && b.defined == p.defined;
    if (!ok || !t.defined) continue;
    ok = t.sizes.size() == b.sizes.size() && b.sizes.size() == p.sizes.size();
    for (size_t i = 0; ok && i < t.sizes.size(); ++i) ok = b.sizes[i] >= t.sizes[i];
  }
  // the output dims that follow a dynamic size: they differ at the bounds and one past them
  std::vector<std::vector<int64_t>> out_bound;
  for (size_t k = 0; ok && k < meta.rets.size(); ++k) {
    const auto &t = meta.rets[k], &b = bm.at_bound.rets[k], &p = bm.past_bound.rets[k];
    std::vector<int64_t> ob(t.sizes.size(), 0);
    for (size_t i = 0; i < t.sizes.size(); ++i)
      // A dim of a dynamic size of the call keeps that size's bound ([B*T] of an mm over a
      // [B*T / B*256] operand keeps B*256, whatever bucket B*T alone would take: the program
      // depends on the bucket only); another takes its own bucket (cat's T+1 stays on the
      // ladder step by step, where its size at the bounds would grow by one each step).
      if (t.sizes[i] >= 2 && (b.sizes[i] != p.sizes[i] || t.sizes[i] != b.sizes[i])) {
        int64_t through = 0;
        for (const auto& [n, nb] : bk.sizes)
          if (n == t.sizes[i]) through = std::max(through, nb);
        ob[i] = through ? std::min(through, b.sizes[i]) : eng.bucket(t.sizes[i]);
      }
    out_bound.push_back(std::move(ob));
  }
  // A tensor with no dynamic dim but one of a dynamic size (a gradient uploaded from the host
  // beside its dynamic indices): the rule could combine a bound with a size (a scatter of padded
  // indices with an unpadded source writes the padding's garbage), so the call runs at its sizes.
  // A coincidence (a head dim equal to the sequence length) costs that size a program.
  bool mixed = false;
  for_each_tensor(args, [&](const at::Tensor& t) {
    if (mixed || !t.defined() || t.device().type() != kTpu) return;
    engine::View v = view(t);
    if (v.has_dynamic_dims()) return;
    for (size_t i = 0; i < v.sizes.size(); ++i)
      for (const auto& [n, b] : bk.sizes) mixed |= v.sizes[i] >= 2 && v.sizes[i] == n;
  });
  if (!ok || !safe || mixed) {  // at the call's sizes; its outputs still turn dynamic where they follow a dynamic size
    if (log)
      std::fprintf(stderr, "torch_tpu dynamic: %s %s:%s\n", info.name.c_str(),
                   !safe ? "has no bucketed rule" : !ok ? "has no Meta result at the bounds" : "mixes bounds and sizes",
                   describe().c_str());
    eng.metrics.dynamic_exact_ops++;
    if (ok) bk.exact_bound = std::move(out_bound);
    else bk.exact_sizes = std::move(bk.sizes);
    bk.sizes.clear();
    return bk;
  }
  bk.active = bk.bucketed = true;
  bk.meta = bm.at_bound;
  for (size_t k = 0; k < meta.rets.size(); ++k) {
    const auto& t = meta.rets[k];
    // the output's bucket is in the program (its storage's capacity), and its layout
    for (int64_t x : out_bound[k]) sig_append(bk.key, &x, sizeof x);
    bool contiguous = true;
    for (int64_t i = static_cast<int64_t>(t.sizes.size()) - 1, st = 1; i >= 0; st *= t.sizes[i--])
      contiguous &= t.sizes[i] == 1 || t.strides[i] == st;
    bk.key += contiguous ? 'c' : 'o';
  }
  bk.out_bound = std::move(out_bound);
  bk.args = bucket_stack(schema, args, view, bk.sizes, 0, false);
  hook_at_bounds(bk.args, 0);
  {
    std::lock_guard<std::mutex> lock(g_bucket_mu);
    g_bucketed_counts[info.name]++;
  }
  if (log && std::getenv("TORCH_TPU_LOG_BUCKETS")) {
    std::string shapes = describe() + " ->";
    for (size_t k = 0; k < meta.rets.size(); ++k) {
      shapes += " [";
      for (size_t i = 0; i < meta.rets[k].sizes.size(); ++i)
        shapes += std::to_string(meta.rets[k].sizes[i]) + "/" + std::to_string(bk.out_bound[k][i]) + ",";
      shapes += "]";
    }
    std::fprintf(stderr, "torch_tpu bucketed: %s%s\n", info.name.c_str(), shapes.c_str());
  }
  eng.metrics.dynamic_ops++;
  return bk;
}

// A new output of a bucketed call: a dynamic storage where a dim follows a dynamic size.
void make_output_dynamic(const at::Tensor& out, const std::vector<int64_t>& bound) {
  if (bound.size() != static_cast<size_t>(out.dim())) return;
  Engine::get().make_dynamic(storage_of(out), out.sizes().vec(), out.strides().vec(), bound);
}

// ---------------------------------------------------------------- the generic kernel
// One call of a lowered op, as the stages of LoweredOp::operator() see it.
struct Call {
  Call(const c10::OperatorHandle& op, const OpInfo& info, torch::jit::Stack* stack)
      : op(op), info(info), schema(op.schema()), stack(stack), nargs(schema.arguments().size()),
        args(stack->end() - static_cast<std::ptrdiff_t>(nargs), stack->end()) {}
  const c10::OperatorHandle& op;
  const OpInfo& info;
  const c10::FunctionSchema& schema;
  torch::jit::Stack* stack;
  size_t nargs;
  torch::jit::Stack args;  // the arguments as the Meta kernel and the rule see them
  int device = -1;
  MetaResult meta;         // the outputs' types and sizes
  std::string key;         // the call's signature (the Meta cache's key)
  bool meta_miss = false;  // the Meta kernel ran for it (a new signature)
  bool all_empty = false;  // every output empty: nothing to compute
  // per output: the type the rule computes in, where it differs from the output's
  std::vector<std::optional<c10::ScalarType>> compute_dtype;
  std::vector<at::Tensor> outs;

  // rewrites argument i both for the rule and for a CPU fallback of the call
  void set_arg(size_t i, c10::IValue v) {
    args[i] = v;
    *(stack->end() - static_cast<std::ptrdiff_t>(nargs - i)) = std::move(v);
  }
  // the call's results in place of its arguments
  void finish(std::vector<at::Tensor> results) {
    torch::jit::drop(*stack, nargs);
    for (auto& t : results) stack->emplace_back(std::move(t));
  }
};

// ---------------------------------------------------------------- per-op hooks
// nansum(x, dim=[]) reduces every dim on CPU, but its Meta kernel keeps x's shape: dim=None
bool nansum_empty_dims_are_all(Call& c) {
  if (c.args.size() > 1 && c.args[1].isIntList() && c.args[1].toIntList().empty()) c.set_arg(1, c10::IValue());
  return false;
}

// x[mask]: masks become coordinates first (a data-dependent count), as in PyTorch
bool mask_to_coordinates(Call& c) {
  if (!c.args[1].isList()) return false;
  auto l = c.args[1].to<c10::List<std::optional<at::Tensor>>>();
  if (expand_mask_indices(c.args[0].toTensor(), l)) c.set_arg(1, l);
  return false;
}

// x[mask] = v over all of x is a select (no coordinates); other masks as for x[mask]
bool masked_put(Call& c) {
  if (auto r = masked_put_as_where(c.info.name, c.args)) {
    c.finish({*r});
    return true;
  }
  return mask_to_coordinates(c);
}

// arange(start, end, step, out=) into a dynamic out: the count at the out's bound (its rule
// reads start and step only)
void arange_count_at_bound(const Bucketing& bk, const torch::jit::Stack& args, torch::jit::Stack& st, int64_t past) {
  if (st.size() < 4 || !args[3].isTensor()) return;
  engine::View o = bk.view(args[3].toTensor());
  if (o.bound.size() != 1 || o.bound[0] <= 0) return;
  double start = st[0].toScalar().toDouble(), step = st[2].toScalar().toDouble();
  double end = start + static_cast<double>(o.bound[0] + past) * step;
  st[1] = st[0].isInt() && st[2].isInt() ? c10::IValue(static_cast<int64_t>(end)) : c10::IValue(end);
}

// One row per op with a quirk: the op's name (every overload) or one overload's.
const std::pair<const char*, OpHooks> kHooks[] = {
    {"aten::index", {true, mask_to_coordinates}},
    {"aten::index_put", {true, masked_put}},
    {"aten::index_put_", {true, masked_put}},
    {"aten::_index_put_impl", {true, masked_put}},
    {"aten::_index_put_impl_", {true, masked_put}},
    {"aten::nansum", {false, nansum_empty_dims_are_all}},
    {"aten::arange.start_out", {false, nullptr, arange_count_at_bound}},
};

OpHooks hooks_for(const c10::FunctionSchema& s, const std::string& name) {
  for (const auto& [op, hooks] : kHooks)
    if (s.name() == op || name == op) return hooks;
  return {};
}

// ---------------------------------------------------------------- the kernel's stages
// Time per stage, summed over calls (TORCH_TPU_STAGE_TIMES=1; torch_tpu._C._stage_times()).
// A hook that runs tpu ops (mask coordinates) counts them in its own stage too.
enum Stage { kDevices, kArguments, kMeta, kParity, kOutputs, kTypes, kBucketing, kTransaction, kRun, kResults, kStages };
const char* const kStageNames[kStages] = {"devices",   "arguments",   "meta", "cpu_parity", "outputs", "compute_types",
                                          "bucketing", "transaction", "run",  "results"};
std::atomic<int64_t> g_stage_ns[kStages];
std::atomic<int64_t> g_stage_calls{0};

class StageClock {
 public:
  StageClock() : on_(enabled()), last_(on_ ? now() : 0) {}
  void lap(Stage s) {
    if (!on_) return;
    int64_t t = now();
    g_stage_ns[s].fetch_add(t - last_, std::memory_order_relaxed);
    last_ = t;
    if (s == kResults) g_stage_calls.fetch_add(1, std::memory_order_relaxed);
  }
  static bool enabled() {
    static const bool on = [] {
      const char* e = std::getenv("TORCH_TPU_STAGE_TIMES");
      return e && *e && std::string(e) != "0";
    }();
    return on;
  }

 private:
  static int64_t now() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  bool on_;
  int64_t last_;
};

// 1. The call's device: every tensor on it, but CPU scalars (and the CPU index tensors of the
// ops that take them); lazy conjugate / negative inputs materialized; outputs that overlap
// inputs rejected.
void check_devices(Call& c) {
  c10::Device first_dev(c10::kCPU);
  auto visit = [&](const at::Tensor& t, bool in_index_list) {
    if (!t.defined()) return;
    if (t.device().type() == kTpu) {
      if (c.device < 0) {
        c.device = t.device().index();
        first_dev = t.device();
      } else if (t.device().index() != c.device) {
        device_mismatch(first_dev, t.device());
      }
    } else if (!cpu_scalar(t) && !(c.info.hooks.cpu_indices && in_index_list)) {
      device_mismatch(c.device >= 0 ? first_dev : c10::Device(kTpu, 0), t.device());
    }
  };
  // x.conj() and x.mH reach this kernel for the ops that PyTorch's Conjugate and Negative
  // fallbacks let through because the CPU and CUDA kernels read the bit themselves (mm, bmm,
  // addmm, dot, mv, clone, ...). Rules see values, so such an input is materialized first
  // (copy_ resolves the bits); an argument the op writes keeps its bits.
  for (size_t i = 0; i < c.nargs; ++i) {
    if (!c.args[i].isTensor()) continue;
    const at::Tensor& t = c.args[i].toTensor();
    if (!t.defined() || !(t.is_conj() || t.is_neg()) || t.device().type() != kTpu) continue;
    const auto* alias = c.schema.arguments()[i].alias_info();
    if (!(alias && alias->isWrite())) c.set_arg(i, t.resolve_conj().resolve_neg());
  }
  for (auto& v : c.args) {
    if (v.isTensor()) {
      visit(v.toTensor(), false);
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) visit(t, false);
    } else if (v.isList()) {
      auto l = v.toList();
      for (size_t i = 0; i < l.size(); ++i)
        if (l.get(i).isTensor()) visit(l.get(i).toTensor(), true);
    } else if (v.isDevice() && v.toDevice().type() == kTpu && c.device < 0) {
      c.device = v.toDevice().has_index() ? v.toDevice().index() : current_device();
    }
  }
  if (c.device < 0) c.device = current_device();
  check_overlap(c.op, c.args);
}

// 2. Arguments as the Meta kernel and the rule take them: CPU index tensors uploaded, then the
// op's own hook. True when the hook finished the call.
bool normalise_args(Call& c) {
  if (c.info.hooks.cpu_indices)
    for (auto& v : c.args) {
      if (!v.isList()) continue;
      auto l = v.toList();
      bool changed = false;
      c10::List<std::optional<at::Tensor>> nl;
      for (size_t i = 0; i < l.size(); ++i) {
        auto e = l.get(i);
        bool defined = e.isTensor() && e.toTensor().defined();
        changed |= defined && e.toTensor().device().is_cpu();
        nl.push_back(!defined ? std::optional<at::Tensor>()
                              : e.toTensor().device().is_cpu() ? upload(e.toTensor(), c.device) : e.toTensor());
      }
      if (changed) v = nl;
    }
  return c.info.hooks.prepare && c.info.hooks.prepare(c);
}

// 3. The outputs' types and sizes from the Meta kernel (cached per signature). False when it
// cannot tell them (a data-dependent size): the call then ran on CPU.
bool infer(Call& c) {
  try {
    c.meta = run_meta(c.op, c.args, c.info.factory, c.key, &c.meta_miss);
  } catch (const MetaUnavailable&) {
    fallback_impl(c.op, c.stack, "data-dependent output shape");
    return false;
  }
  return true;
}

// 4. CPU's own errors for what the Meta kernels let through: complex support, complex CPU
// scalars written into real tensors, result types tpu lacks.
void check_cpu_parity(Call& c) {
  check_complex_support(c.op, c.args);
  // A complex CPU scalar (`x * 1j`): scalar parameters are real, so it takes part as a 0-dim
  // complex tpu tensor (the Meta kernel saw the original), complex128 only where the result
  // is (a complex64 op keeps its type).
  for (auto& v : c.args)
    if (v.isTensor() && v.toTensor().defined() && cpu_scalar(v.toTensor()) && v.toTensor().is_complex()) {
      // a real tensor written with a complex result (`x.add_(1j)`): CPU's cast error (the
      // Meta kernels let it through)
      for (int a : c.info.ret_alias)
        if (a >= 0 && c.args[a].isTensor() && !c.args[a].toTensor().is_complex()) {
          replay_on_cpu(c.op, c.args);
          break;
        }
      bool c128 = std::any_of(c.meta.rets.begin(), c.meta.rets.end(),
                              [](const auto& m) { return m.defined && m.dtype == c10::kComplexDouble; });
      v = upload(v.toTensor().to(c128 ? c10::kComplexDouble : c10::kComplexFloat), c.device);
    }
  for (const auto& m : c.meta.rets)
    if (m.defined && !dtype_supported(m.dtype)) {
      replay_on_cpu(c.op, c.args);
      break;
    }
}

// 5. out= arguments take the Meta kernel's sizes (it has warned already). With every output and
// input empty the rule is skipped, and with it the argument checks some Meta kernels leave to
// the CPU kernel (logcumsumexp's dim): such a call runs once per signature on CPU stand-ins.
void size_outputs(Call& c) {
  for (size_t k = 0; k < c.info.ret_alias.size(); ++k) {
    int a = c.info.ret_alias[k];
    if (a < 0 || !c.meta.rets[k].defined) continue;
    at::Tensor t = c.args[a].toTensor();
    if (t.sizes().vec() != c.meta.rets[k].sizes) t.resize_(c.meta.rets[k].sizes);
  }
  c.all_empty = !c.meta.rets.empty();
  for (auto& m : c.meta.rets) c.all_empty = c.all_empty && m.defined && c10::multiply_integers(m.sizes) == 0;
  if (!c.all_empty) return;
  bool inputs_empty = true;
  for_each_tensor(c.args, [&](const at::Tensor& t) { inputs_empty = inputs_empty && (!t.defined() || t.numel() == 0); });
  std::unique_lock<std::mutex> lock(g_complex_mu);
  if (inputs_empty && !g_empty_ok.count(c.key)) {
    lock.unlock();
    replay_on_cpu(c.op, c.args);
    lock.lock();
    g_empty_ok.insert(c.key);
  }
}

// 6. An in-place or out= variant of an elementwise op whose target differs in dtype from an
// input computes in the functional op's result type and casts into the target, as CPU's
// TensorIterator does: fmod(int16, int32, out=complex64) is an int32 fmod (XLA has no complex
// remainder), a_f32.add_(b_f64) adds in float64.
void compute_types(Call& c) {
  c.compute_dtype.assign(c.meta.rets.size(), std::nullopt);
  if (!c.info.functional) return;
  // a Python number (`x.mul_(0.9)`) changes the type only from a higher category: the
  // optimizers' in-place steps skip the second Meta lookup
  auto category = [](c10::ScalarType t) {
    return t == c10::kBool ? 0 : c10::isIntegralType(t, false) ? 1 : c10::isComplexType(t) ? 3 : 2;
  };
  bool differs = false;
  for (int i : c.info.rule_args) {
    if (!c.args[i].isTensor() || !c.args[i].toTensor().defined()) continue;
    const at::Tensor& t = c.args[i].toTensor();
    bool wrapped = t.unsafeGetTensorImpl()->is_wrapped_number();
    for (const auto& m : c.meta.rets)
      differs |= m.defined && (wrapped ? category(t.scalar_type()) > category(m.dtype) : t.scalar_type() != m.dtype);
  }
  if (!differs) return;
  torch::jit::Stack fargs;
  for (int i : c.info.rule_args) fargs.push_back(c.args[i]);
  std::string fkey;
  MetaResult fm;
  try {
    fm = run_meta(*c.info.functional, fargs, false, fkey);
  } catch (...) {  // the functional call is not one the Meta kernels take: keep the target's type
    return;
  }
  for (size_t k = 0; k < c.meta.rets.size() && k < fm.rets.size(); ++k) {
    if (!c.meta.rets[k].defined || !fm.rets[k].defined || fm.rets[k].dtype == c.meta.rets[k].dtype) continue;
    // an in-place target that cannot hold the result (int.mul_(float)): CPU's cast error,
    // which the Meta kernels of in-place ops do not raise (those of out= variants do)
    if (!c10::canCast(fm.rets[k].dtype, c.meta.rets[k].dtype)) {
      replay_on_cpu(c.op, c.args);
      continue;  // CPU accepts it (an op that is not a plain TensorIterator one): as the target's type
    }
    if (dtype_supported(fm.rets[k].dtype)) c.compute_dtype[k] = fm.rets[k].dtype;
  }
}

// (7. is plan_bucketing, above: the bucket a call with dynamic sizes is built for.)

engine::View call_view(const Bucketing& bk, const at::Tensor& t) { return bk.active ? bk.view(t) : view_of(t); }

// The bounds of each new output (0: a static dim): the buffers the program makes, so part of its key.
std::vector<std::vector<int64_t>> output_bounds(const Call& c, const Bucketing& bk) {
  std::vector<std::vector<int64_t>> out_bounds(c.meta.rets.size());
  for (size_t k = 0; k < c.meta.rets.size(); ++k) {
    if (!c.meta.rets[k].defined || c.info.ret_alias[k] >= 0) continue;
    const auto& sizes = c.meta.rets[k].sizes;
    if (bk.bucketed && k < bk.out_bound.size()) out_bounds[k] = bk.out_bound[k];
    else if (k < bk.exact_bound.size()) out_bounds[k] = bk.exact_bound[k];
    else if (!bk.exact_sizes.empty()) {
      out_bounds[k].assign(sizes.size(), 0);
      for (size_t i = 0; i < sizes.size(); ++i)
        for (const auto& [n, b] : bk.exact_sizes)
          if (sizes[i] == n && n >= 2) out_bounds[k][i] = b;
    }
    if (out_bounds[k].size() != sizes.size()) out_bounds[k].clear();
  }
  return out_bounds;
}

// The op as the engine records it: the trace key is the signature (at the bounds for a bucketed
// call, with the outputs' real layouts and bounds) plus where each tpu tensor lives in the graph.
engine::Op trace_op(const Call& c, const Bucketing& bk, const std::vector<std::vector<int64_t>>& out_bounds) {
  Engine& eng = Engine::get();
  std::string key = bk.active ? bk.key : c.key;
  if (bk.active)  // the key at the bounds has contiguous stand-ins: the outputs' real layouts shape their stores
    for (size_t k = 0; k < c.meta.rets.size(); ++k)
      if (c.meta.rets[k].defined && c.info.ret_alias[k] < 0) layout_key(key, c.meta.rets[k].sizes, c.meta.rets[k].strides);
  if (!bk.bucketed)
    for (const auto& ob : out_bounds)
      if (std::any_of(ob.begin(), ob.end(), [](int64_t b) { return b > 0; })) {
        key += 'X';
        for (int64_t b : ob) sig_append(key, &b, sizeof b);
      }
  engine::Op rec{c.info.name, eng.mode() == engine::Mode::DeferAndFuse ? python_site() : std::string(), true,
                 std::move(key), {}, {}};
  if (eng.tracing()) {
    for_each_tensor(c.args, [&](const at::Tensor& t) {
      if (t.defined() && t.device().type() == kTpu) rec.views.push_back(call_view(bk, t));
    });
    rec.current = [&c](int a) -> double {
      if (a < 0) return static_cast<double>(OpEnv::current_precision());
      const c10::IValue& v = c.args[c.info.rule_args[a]];
      return v.isDouble() ? v.toDouble() : v.isInt() ? static_cast<double>(v.toInt()) : std::nan("");
    };
  }
  return rec;
}

struct AtSizes {};  // a bucketed call its rule cannot build at the bounds: built again at the call's sizes

// The body of the op transaction: the rule on loads of the inputs, its writes stored, the
// results converted to the outputs' types and stored into them (new outputs made here).
lower::Reads emit(Call& c, const Bucketing& bk, engine::Graph& g, const std::vector<std::vector<int64_t>>& out_bounds) {
  const char* name = c.info.name.c_str();
  const torch::jit::Stack& rargs = bk.active ? bk.args : c.args;
  const MetaResult& rmeta = bk.active ? bk.meta : c.meta;
  OpEnv env(g, c.device);
  auto largs = rule_args(c.schema, c.info.rule_args, rargs, env, [&](const at::Tensor& t) { return g.load(call_view(bk, t)); });
  std::vector<hlo::Type> out_types;
  for (size_t k = 0; k < rmeta.rets.size(); ++k) {
    const auto& m = rmeta.rets[k];
    out_types.push_back(m.defined ? hlo::Type{to_hlo(c.compute_dtype[k].value_or(m.dtype)), m.sizes}
                                  : hlo::Type{hlo::DType::F32, {}});
  }
  lower::Ctx ctx(g.b, env, std::move(largs), out_types);
  // every output empty: nothing to compute (rules need not handle 0-element operands)
  std::vector<hlo::Value> res = c.all_empty ? std::vector<hlo::Value>(c.meta.rets.size()) : guarded(name, [&] {
    // a rule that rejects the input, or cannot build it: CPU's own error where CPU rejects it too
    try {
      return (*c.info.rule)(ctx);
    } catch (const lower::UserError&) {
      replay_on_cpu(c.op, c.args);
      throw;
    } catch (const hlo::BuildError&) {
      if (bk.bucketed) throw AtSizes{};
      replay_on_cpu(c.op, c.args);
      throw;
    }
  });
  lower::Reads reads = ctx.reads();
  if (env.read_precision >= 0) reads.push_back({-1, static_cast<double>(env.read_precision), -1});
  TORCH_CHECK(res.size() >= c.meta.rets.size(), "torch_tpu lowering of ", c.info.name, " returned ", res.size(),
              " values for ", c.meta.rets.size(), " outputs");
  for (const auto& [ai, v] : ctx.writes()) {
    const c10::IValue& iv = c.args[c.info.rule_args[ai]];
    if (iv.isTensor() && iv.toTensor().defined() && iv.toTensor().device().type() == kTpu)
      guarded(name, [&] { g.store(call_view(bk, iv.toTensor()), v); return 0; });
  }
  for (size_t k = 0; k < c.meta.rets.size(); ++k) {
    if (!c.meta.rets[k].defined) continue;
    int a = c.info.ret_alias[k];
    c.outs[k] = a >= 0 ? c.args[a].toTensor() : new_tpu_tensor(c.meta.rets[k], c.device);
    if (a < 0 && !out_bounds[k].empty()) make_output_dynamic(c.outs[k], out_bounds[k]);
    if (res[k].valid() && c.compute_dtype[k])
      res[k] = guarded(name, [&] { return g.b.convert(res[k], to_hlo(c.meta.rets[k].dtype)); });
    if (res[k].valid() && bk.bucketed && res[k].shape() != rmeta.rets[k].sizes &&
        hlo::numel(res[k].shape()) == hlo::numel(rmeta.rets[k].sizes))  // at the bounds' shape
      res[k] = guarded(name, [&] { return g.b.reshape(res[k], rmeta.rets[k].sizes); });
    if (res[k].valid()) guarded(name, [&] { g.store(call_view(bk, c.outs[k]), res[k]); return 0; });
  }
  return reads;
}

// 8. The op transaction (Engine::apply: run now in Strict, recorded in DeferAndFuse). A bucketed
// call whose rule cannot build it at the bounds is built again at the call's sizes. False when
// the rule has no lowering for the call: it then ran on CPU.
bool transact(Call& c, Bucketing& bk) {
  Engine& eng = Engine::get();
  c.outs.assign(c.info.ret_alias.size(), at::Tensor());
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1) {
      std::vector<std::vector<int64_t>> bounds = bk.out_bound;
      bk = Bucketing{};
      bk.exact_bound = std::move(bounds);
      eng.metrics.dynamic_exact_ops++;
    }
    engine::Graph& g = eng.graph(c.device);
    std::vector<std::vector<int64_t>> out_bounds = output_bounds(c, bk);
    engine::Op rec = trace_op(c, bk, out_bounds);
    try {
      eng.apply(g, rec, [&] { return emit(c, bk, g, out_bounds); });
    } catch (const lower::Unsupported& u) {
      fallback_impl(c.op, c.stack, u.what());
      return false;
    } catch (const AtSizes&) {
      continue;
    }
    break;
  }
  return true;
}

// Every ATen overload with a lowering rule runs this kernel, which holds the op's metadata.
class LoweredOp final : public c10::OperatorKernel {
 public:
  explicit LoweredOp(OpInfo info) : info_(std::move(info)) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    StageClock clock;
    Call c(op, info_, stack);
    check_devices(c);
    clock.lap(kDevices);
    if (normalise_args(c)) return;
    clock.lap(kArguments);
    if (!infer(c)) return;
    clock.lap(kMeta);
    check_cpu_parity(c);
    clock.lap(kParity);
    size_outputs(c);
    clock.lap(kOutputs);
    compute_types(c);
    clock.lap(kTypes);
    Bucketing bk = c.all_empty ? Bucketing{} : plan_bucketing(c.op, c.info, c.args, c.meta, c.meta_miss, c.key);
    clock.lap(kBucketing);
    if (!transact(c, bk)) return;
    clock.lap(kTransaction);
    // 9. Strict runs the op's program now (DeferAndFuse: when a flush is due)
    guarded(c.info.name.c_str(), [&] { Engine::get().op_done(c.device); return 0; });
    clock.lap(kRun);
    c.finish(std::move(c.outs));
    clock.lap(kResults);
  }

 private:
  OpInfo info_;
};

// ---------------------------------------------------------------- fallback
std::mutex g_fb_mu;
std::map<std::string, int64_t> g_fb_counts;

void fallback_impl(const c10::OperatorHandle& op, torch::jit::Stack* stack, const char* reason) {
  std::string name = op_name(op.schema().operator_name());
  const char* env = std::getenv("TORCH_TPU_CPU_FALLBACK");
  if (env && std::string(env) == "0") {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "The operator '", name,
                                "' is not implemented natively for the tpu device and the CPU fallback is disabled "
                                "(TORCH_TPU_CPU_FALLBACK=0)",
                                reason ? std::string(" (") + reason + ")" : std::string());
  }
  bool first;
  {
    std::lock_guard<std::mutex> lock(g_fb_mu);
    first = g_fb_counts[name]++ == 0;
  }
  if (first)
    TORCH_WARN("torch_tpu: '", name, "' has no tpu lowering", reason ? std::string(" (") + reason + ")" : std::string(),
               "; it runs on the CPU and its results are copied back (warned once per op; counted in "
               "torch_tpu.metrics)");
  std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
  at::native::cpu_fallback(op, stack);
}

void tpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  size_t nargs = op.schema().arguments().size();
  check_overlap(op, torch::jit::Stack(stack->end() - static_cast<std::ptrdiff_t>(nargs), stack->end()));
  fallback_impl(op, stack, nullptr);
}

// ---------------------------------------------------------------- storage & views
at::Tensor tpu_empty(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype, std::optional<c10::Layout>,
                     std::optional<c10::Device> device, std::optional<bool>,
                     std::optional<c10::MemoryFormat> memory_format) {
  int d = device && device->has_index() ? device->index() : current_device();
  c10::DeviceGuard g(c10::Device(kTpu, static_cast<c10::DeviceIndex>(d)));
  auto st = dtype.value_or(c10::get_default_dtype_as_scalartype());
  at::Tensor t(at::detail::empty_generic(size, allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), st,
                                         memory_format));
  auto s = storage_of(t);
  s->dtype = to_hlo(st);
  s->typed = true;
  return t;
}

at::Tensor tpu_empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                             std::optional<c10::Layout>, std::optional<c10::Device> device, std::optional<bool>) {
  int d = device && device->has_index() ? device->index() : current_device();
  c10::DeviceGuard g(c10::Device(kTpu, static_cast<c10::DeviceIndex>(d)));
  auto st = dtype.value_or(c10::get_default_dtype_as_scalartype());
  at::Tensor t(at::detail::empty_strided_generic(size, stride, allocator(),
                                                 c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), st));
  auto s = storage_of(t);
  s->dtype = to_hlo(st);
  s->typed = true;
  return t;
}

at::Tensor tpu_as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                          std::optional<int64_t> offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, offset);
}

at::Tensor tpu_view(const at::Tensor& self, c10::IntArrayRef size) { return at::native::view(self, size); }

at::Tensor tpu_reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

at::Tensor tpu_unfold(const at::Tensor& self, int64_t dim, int64_t size, int64_t step) {
  return at::native::unfold(self, dim, size, step);
}

const at::Tensor& tpu_resize_(const at::Tensor& self, c10::IntArrayRef size,
                              std::optional<c10::MemoryFormat> memory_format) {
  std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
  auto* impl = self.unsafeGetTensorImpl();
  int64_t numel = c10::multiply_integers(size);
  int64_t needed = (numel + self.storage_offset()) * static_cast<int64_t>(self.element_size());
  if (numel == 0) needed = 0;
  c10::Storage storage = self.storage();
  if (needed > static_cast<int64_t>(storage.nbytes())) {
    // new storage holding the old contents as its prefix
    auto old = storage_of(self);
    c10::DeviceGuard guard(self.device());
    c10::DataPtr fresh = allocator()->allocate(needed);
    auto* holder = static_cast<engine::StoragePtr*>(fresh.get_context());
    auto& ns = *holder;
    ns->dtype = old->typed ? old->dtype : to_hlo(self.scalar_type());
    ns->typed = true;
    if (old->typed && old->numel() > 0 && (old->buffer || true)) {
      auto& g = Engine::get().graph(old->device);
      int64_t n = old->numel();
      engine::View src{old, 0, {n}, {1}, old->dtype};
      engine::View dst{ns, 0, {n}, {1}, old->dtype};
      guarded("resize_", [&] {
        Engine::get().copy_view(g, src, dst, "aten::resize_");
        Engine::get().op_done(old->device);
        return 0;
      });
    }
    storage.set_data_ptr_noswap(std::move(fresh));
    storage.set_nbytes(needed);
  }
  // as CPU's resize_: contiguous sizes first, then the strides of the requested format for the new rank
  TORCH_CHECK(!memory_format || *memory_format != c10::MemoryFormat::Preserve, "Unsupported memory format",
              *memory_format);
  impl->set_sizes_contiguous(size);
  if (memory_format) impl->empty_tensor_restride(*memory_format);
  return self;
}

at::Tensor& tpu_set_storage_offset(at::Tensor& self, c10::Storage src, c10::SymInt offset, c10::SymIntArrayRef size,
                                   c10::SymIntArrayRef stride) {
  TORCH_CHECK(src.device().type() == kTpu, "Attempted to set the storage of a tensor on device \"", self.device(),
              "\" to a storage on different device \"", src.device(), "\".  This is no longer allowed; the devices must match.");
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(std::move(src));
  impl->set_storage_offset(offset.expect_int());
  std::vector<int64_t> sz, st;
  for (auto& x : size) sz.push_back(x.expect_int());
  for (auto& x : stride) st.push_back(x.expect_int());
  if (st.empty()) impl->set_sizes_contiguous(sz);
  else impl->set_sizes_and_strides(sz, st);
  return self;
}

at::Tensor& tpu_set_storage(at::Tensor& self, c10::Storage src) {
  int64_t n = static_cast<int64_t>(src.nbytes()) / static_cast<int64_t>(self.element_size());
  std::vector<c10::SymInt> size{c10::SymInt(n)};
  return tpu_set_storage_offset(self, std::move(src), c10::SymInt(0), size, {});
}

at::Tensor& tpu_set_tensor(at::Tensor& self, const at::Tensor& src) {
  return tpu_set_storage_offset(self, src.storage(), c10::SymInt(src.storage_offset()), src.sym_sizes(),
                                src.sym_strides());
}

// ---------------------------------------------------------------- copies & host reads
// Bounded dynamism at the upload of a whole new tensor (x.to("tpu"), a DataLoader batch):
// a size that changed since the last epoch at this dtype and rank makes the new storage
// dynamic before the upload, so the host pads it (no conversion later).
void upload_policy(const at::Tensor& dst) {
  Engine& eng = Engine::get();
  if (!eng.dynamism() || dst.dim() == 0) return;
  auto st = storage_of(dst);
  if (st->buffer || st->dynamic() || st->pinned_static || dst.storage_offset() != 0 || !dst.is_contiguous() ||
      dst.numel() != st->numel() || (dst.is_leaf() && dst.requires_grad()))
    return;
  hlo::Shape bound(dst.dim(), 0);
  bool any = false;
  std::string where;  // the uploading line, as in the op policy (computed once, if needed)
  for (int64_t d = 0; d < dst.dim(); ++d) {
    int64_t n = dst.size(d);
    if (n < 2 || bound[d]) continue;
    if (where.empty()) where = "@" + python_site(/*inner=*/true);
    std::string site = "h2d" + where;  // (the places of n, as policy_site)
    site += static_cast<char>(dst.scalar_type());
    for (int64_t e = 0; e < dst.dim(); ++e) site += dst.size(e) == n ? 'n' : '.';
    if (!eng.size_changed(site, n)) continue;
    for (int64_t e = 0; e < dst.dim(); ++e)
      if (dst.size(e) == n) bound[e] = eng.bucket(n);
    any = true;
  }
  if (any) eng.make_dynamic(st, dst.sizes().vec(), dst.strides().vec(), bound);
}

void copy_impl(const at::Tensor& dst, const at::Tensor& src) {
  if (dst.numel() == 0) return;
  bool dst_tpu = dst.device().type() == kTpu, src_tpu = src.device().type() == kTpu;
  std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
  Engine& eng = Engine::get();
  // A tpu source's elements as a CPU tensor, with its conjugate/negative bits
  // applied (those views carry a bit, not data).
  auto src_on_host = [&]() {
    at::Tensor raw = at::empty(src.sizes(), src.options().device(c10::kCPU));
    eng.read(view_of(src), raw.data_ptr());
    if (src.is_conj()) raw._set_conj(true);
    if (src.is_neg()) raw._set_neg(true);
    return raw.resolve_conj().resolve_neg();
  };
  bool lazy_bits = src.is_conj() || src.is_neg();
  if (dst_tpu && src_tpu && dst.device() == src.device() && !lazy_bits) {
    auto& g = eng.graph(dst.device().index());
    eng.copy_view(g, view_of(src), view_of(dst), "aten::copy_",
                  eng.mode() == engine::Mode::DeferAndFuse ? python_site() : std::string(), /*promote=*/true);
    eng.op_done(dst.device().index());
    return;
  }
  if (dst_tpu) {  // host (or another tpu, or a lazy view) -> tpu
    if (!src_tpu) upload_policy(dst);
    at::Tensor host = src_tpu ? src_on_host() : src.resolve_conj().resolve_neg();
    at::Tensor c = host.to(dst.scalar_type()).expand(dst.sizes()).contiguous();
    eng.write(view_of(dst), c.data_ptr());
    return;
  }
  // tpu -> host
  dst.copy_(src_on_host());
}

at::Tensor& tpu_copy_(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  (void)non_blocking;
  TORCH_CHECK(self.defined() && src.defined(), "copy_: undefined tensor");
  {
    // shape/dtype validation as on CPU: src must broadcast to self
    at::infer_size(self.sizes(), src.sizes());
    TORCH_CHECK(self.dim() >= src.dim() || src.numel() == self.numel(),
                "copy_: the source of shape ", src.sizes(), " cannot be broadcast to ", self.sizes());
  }
  guarded("copy_", [&] { copy_impl(self, src); return 0; });
  return self;
}

// copy_ as users call it: CPU's overlap checks (a write into an expanded tensor, a source
// that partly overlaps the destination) first. The CPU fallback's copy-back goes through
// _copy_from instead: it writes results of ops that accept overlap (fill_ of an expanded tensor).
at::Tensor& tpu_checked_copy_(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  if (self.defined() && src.defined() && self.device().type() == kTpu && !self.is_same(src)) {
    at::assert_no_internal_overlap(self);
    if (src.device() == self.device()) at::assert_no_partial_overlap(self, src);
  }
  return tpu_copy_(self, src, non_blocking);
}

at::Tensor tpu_copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  at::Tensor d = dst;
  tpu_copy_(d, self, non_blocking);
  return dst;
}

at::Tensor tpu_copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) at::native::resize_output(dst, self.sizes());
  at::Tensor d = dst;
  tpu_copy_(d, self, false);
  return dst;
}

// torch.cholesky (deprecated): the factor and, as on CPU and CUDA, the LinAlgError of a
// matrix that is not positive-definite (reading `info` synchronises, as there)
at::Tensor tpu_cholesky(const at::Tensor& self, bool upper) {
  auto [l, info] = at::linalg_cholesky_ex(self, upper, false);
  at::_linalg_check_errors(info, "cholesky", self.dim() == 2);
  return l;
}

at::Scalar tpu_local_scalar_dense(const at::Tensor& self) {
  TORCH_CHECK(self.numel() == 1, "a Tensor with ", self.numel(), " elements cannot be converted to Scalar");
  at::Tensor host = at::empty({}, self.options().device(c10::kCPU));
  {
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    guarded("item", [&] { Engine::get().read(view_of(self), host.data_ptr()); return 0; });
  }
  return host.item();
}

// Scaled dot-product attention: the fused backend PyTorch leaves to out-of-tree devices
// ("overrideable", torch_tpu/_flash_attention.py: keeps the log-sum-exp, not the probabilities,
// for the backward) when sdpa_kernel allows a fused backend (code written for CUDA asks for
// flash or memory-efficient attention) and there is no dropout, no grouped-query expansion and
// no mask that needs a gradient; otherwise the math path (matmul + softmax), as before, even
// where sdpa_kernel excludes it. Both lower natively and follow the matmul precision mode.
// Tensors being traced (FakeTensor, FunctionalTensor, functorch wrappers: torch.compile, vmap)
// take the math path: a traced graph then holds plain ops, and AOTAutograd does not wrap the
// fused op's recompute in run_and_save_rng_state, whose backends are cpu/cuda/hpu/xpu only.
int64_t tpu_fused_sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                             const std::optional<at::Tensor>& attn_mask, double dropout_p, bool,
                             std::optional<double>, bool) {
  constexpr int64_t kMath = 0, kOverrideable = 4;  // sdp::SDPBackend
  static const c10::DispatchKeySet traced({c10::DispatchKey::Python, c10::DispatchKey::Functionalize,
                                    c10::DispatchKey::FuncTorchBatched, c10::DispatchKey::FuncTorchGradWrapper});
  for (const at::Tensor* t : {&query, &key, &value}) {
    if (t->key_set().has_any(traced)) return kMath;
  }
  auto& ctx = at::globalContext();
  bool allowed = ctx.userEnabledOverrideableSDP() || ctx.userEnabledFlashSDP() || ctx.userEnabledMemEfficientSDP() ||
                 ctx.userEnabledCuDNNSDP();
  bool fused = allowed && dropout_p == 0.0 && query.dim() == 4 && key.dim() == 4 &&
               value.dim() == 4 && query.size(1) == key.size(1) && key.size(1) == value.size(1) &&
               !query.is_nested() && !(attn_mask.has_value() && attn_mask->requires_grad());
  return fused ? kOverrideable : kMath;
}

}  // namespace
}  // namespace tt::aten
namespace at::native {
// scaled_dot_product_attention asks this stub (not the _fused_sdp_choice op) which backend runs
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &tt::aten::tpu_fused_sdp_choice)
}  // namespace at::native
namespace tt::aten {
namespace {

// nn.Module.to("tpu") moves each parameter in place (`param.data = moved`: tied
// weights stay tied, an optimizer made before the move keeps its parameters) only
// when this says the tensor types are compatible, as it does between CPU and CUDA.
// c10's own answer knows the in-tree dense backends only; PyTorch leaves the answer
// for PrivateUse1 to the backend. Same rule with tpu added to those backends.
bool tpu_has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  if (self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set())) return true;
  auto dense = [](c10::DispatchKeySet ks) {
    return ks.has_any(c10::DispatchKeySet(c10::DispatchKey::Dense)) &&
           ks.has_any(c10::DispatchKeySet({c10::BackendComponent::CPUBit, c10::BackendComponent::PrivateUse1Bit}));
  };
  return dense(self.key_set()) && dense(from.key_set());
}

}  // namespace

lower::Precision current_precision() { return OpEnv::current_precision(); }

namespace {
// ATen's float32 matmul setting as CPU's matmuls read it (torch.set_float32_matmul_precision sets it,
// as do torch.backends.fp32_precision and torch.backends.mkldnn.matmul.fp32_precision): -1 while unset.
int aten_matmul_precision() {
  switch (at::globalContext().float32Precision(at::Float32Backend::MKLDNN, at::Float32Op::MATMUL)) {
    case at::Float32Precision::IEEE: return static_cast<int>(lower::Precision::HIGHEST);
    case at::Float32Precision::TF32: return static_cast<int>(lower::Precision::HIGH);
    case at::Float32Precision::BF16: return static_cast<int>(lower::Precision::DEFAULT);
    default: return -1;
  }
}
// ATen's setting as last seen, and whether it changed after torch.tpu.set_matmul_precision last ran:
// whichever of the two was set later applies (a change ATen undoes before tpu reads it again is missed).
std::atomic<int> g_aten_seen{-1};
std::atomic<bool> g_aten_later{true};
}  // namespace

lower::Precision process_precision() {
  int a = aten_matmul_precision();
  if (a != g_aten_seen.exchange(a)) g_aten_later = a >= 0;
  if (g_aten_later && a >= 0) return static_cast<lower::Precision>(a);
  return Engine::get().precision();
}

void set_process_precision(lower::Precision p) {
  g_aten_seen = aten_matmul_precision();
  g_aten_later = false;
  Engine::get().set_precision(p);
}
std::string current_python_site() { return python_site(); }

// ---------------------------------------------------------------- registration
TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&tpu_fallback>()); }

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(tpu_empty));
  m.impl("empty_strided", TORCH_FN(tpu_empty_strided));
  m.impl("as_strided", TORCH_FN(tpu_as_strided));
  m.impl("view", TORCH_FN(tpu_view));
  m.impl("_reshape_alias", TORCH_FN(tpu_reshape_alias));
  m.impl("view_as_real", TORCH_FN(at::native::view_as_real));  // views: the storage read as the other type
  m.impl("view_as_complex", TORCH_FN(at::native::view_as_complex));
  m.impl("unfold", TORCH_FN(tpu_unfold));
  m.impl("resize_", TORCH_FN(tpu_resize_));
  m.impl("set_.source_Storage", TORCH_FN(tpu_set_storage));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(tpu_set_storage_offset));
  m.impl("set_.source_Tensor", TORCH_FN(tpu_set_tensor));
  m.impl("copy_", TORCH_FN(tpu_checked_copy_));
  m.impl("_copy_from", TORCH_FN(tpu_copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(tpu_copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(tpu_local_scalar_dense));
  m.impl("_fused_sdp_choice", TORCH_FN(tpu_fused_sdp_choice));
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(tpu_has_compatible_shallow_copy_type));
  m.impl("cholesky", TORCH_FN(tpu_cholesky));
}

// Test hook: adds an op whose program text fails verification to the current
// graph of t's device (the error must name it and its Python line at the flush).
void inject_invalid_op(const at::Tensor& t) {
  std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
  auto& g = Engine::get().graph(t.device().index());
  auto v = view_of(t);
  engine::Op rec{"tt::test_invalid_op", python_site()};
  Engine::get().apply(g, rec, [&] {
    hlo::Value x = g.load(v);
    g.b.emit("add", {x, x}, hlo::Type{x.dtype(), {hlo::numel(x.shape()) + 1}});
    g.store(v, x);
    return lower::Reads{};
  });
  guarded("test op", [&] { Engine::get().op_done(t.device().index()); return 0; });
}

// Test hook: an op the trace cache recognises (t *= 2), or, with fail, the
// same op whose rule emits values and then raises (a rule's own check): its
// rollback must leave the graph, trace and value numbering as they were.
void test_keyed_op(const at::Tensor& t, bool fail) {
  std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
  int device = t.device().index();
  auto& g = Engine::get().graph(device);
  auto v = view_of(t);
  engine::Op rec{"tt::test_keyed_op", python_site(), true, "tt::test_keyed_op", {v}, {}};
  guarded("test op", [&] {
    Engine::get().apply(g, rec, [&] {
      hlo::Value x = g.load(v);
      hlo::Value y = g.b.add(x, x);
      if (fail) throw lower::UserError("tt::test_keyed_op failed on purpose");
      g.store(v, y);
      return lower::Reads{};
    });
    Engine::get().op_done(device);
    return 0;
  });
}

// A Meta kernel for an op whose (single) output has its first input's sizes and dtype.
void meta_like_input(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  size_t nargs = op.schema().arguments().size();
  at::Tensor self = (*stack)[stack->size() - nargs].toTensor();
  at::Tensor out = at::empty(self.sizes(), self.options().device(c10::kMeta));
  torch::jit::drop(*stack, nargs);
  stack->emplace_back(out);
}

// Meta kernels for torch.histogram: (hist [bins], bin_edges [bins + 1]) in the input's dtype.
void meta_histogram(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  size_t nargs = op.schema().arguments().size();
  auto args = torch::jit::last(*stack, nargs);
  at::Tensor self = args[0].toTensor();
  int64_t bins = args[1].isInt() ? args[1].toInt() : args[1].toTensor().numel() - 1;
  TORCH_CHECK(bins > 0, "torch.histogram(): bins must be > 0");  // CPU's own message replaces this one
  auto o = self.options().device(c10::kMeta);
  at::Tensor hist = at::empty({bins}, o), edges = at::empty({bins + 1}, o);
  torch::jit::drop(*stack, nargs);
  stack->emplace_back(hist);
  stack->emplace_back(edges);
}

// Meta kernels for the fused GRU cell (CUDA-only in PyTorch, so it has none):
// forward -> (hy [B, H], workspace [B, 5H]); backward -> (d input gates [B, 3H],
// d hidden gates [B, 3H], d hx [B, H], d input bias [3H], d hidden bias [3H]).
void meta_gru_cell(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  size_t nargs = op.schema().arguments().size();
  auto args = torch::jit::last(*stack, nargs);
  bool backward = nargs == 3;
  at::Tensor ref = args[backward ? 0 : 2].toTensor();  // grad_hy or hx: [B, H]
  auto o = ref.options().device(c10::kMeta);
  int64_t B = ref.size(0), H = ref.size(1);
  std::vector<at::Tensor> outs;
  if (backward) outs = {at::empty({B, 3 * H}, o), at::empty({B, 3 * H}, o), at::empty({B, H}, o),
                        at::empty({3 * H}, o), at::empty({3 * H}, o)};
  else outs = {at::empty({B, H}, o), at::empty({B, 5 * H}, o)};
  torch::jit::drop(*stack, nargs);
  for (auto& t : outs) stack->emplace_back(t);
}

OpInfo make_info(const c10::OperatorHandle& op, const std::string& rule) {
  OpInfo info;
  const auto& s = op.schema();
  info.name = op_name(s.operator_name());
  info.rule = lower::find_rule(rule);
  info.bucketed = info.rule && lower::bucketed_rule(info.name);
  if (info.rule && rule != info.name && lower::casts_to_output(rule)) {
    auto dot = rule.find('.', 6);
    info.functional = c10::Dispatcher::singleton().findSchema(
        {rule.substr(0, dot), dot == std::string::npos ? "" : rule.substr(dot + 1)});
  }
  const auto& args = s.arguments();
  bool any_tensor = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (is_out_arg(args[i])) continue;
    info.rule_args.push_back(static_cast<int>(i));
    auto k = args[i].type()->kind();
    if (k == c10::TypeKind::TensorType || k == c10::TypeKind::ListType ||
        (k == c10::TypeKind::OptionalType &&
         args[i].type()->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::TensorType))
      any_tensor = true;
  }
  info.factory = !any_tensor;
  for (const auto& ret : s.returns()) {
    int alias = -1;
    if (ret.alias_info() && ret.alias_info()->isWrite()) {
      for (size_t i = 0; i < args.size(); ++i)
        if (args[i].alias_info() && args[i].alias_info()->beforeSets() == ret.alias_info()->beforeSets())
          alias = static_cast<int>(i);
    }
    info.ret_alias.push_back(alias);
  }
  info.hooks = hooks_for(s, info.name);
  return info;
}

int register_lowered_ops() {
  static int count = -1;
  if (count >= 0) return count;
  lower::register_all();
  static torch::Library lib(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  auto& disp = c10::Dispatcher::singleton();
  // Meta kernels PyTorch lacks for ops we lower (output like the input), where still missing
  static torch::Library meta(torch::Library::IMPL, "aten", c10::DispatchKey::Meta, __FILE__, __LINE__);
  for (const char* name : {"_logcumsumexp"}) {
    auto h = disp.findSchema({std::string("aten::") + name, ""});
    if (h && !h->hasKernelForDispatchKey(c10::DispatchKey::Meta))
      meta.impl(name, torch::CppFunction::makeFromBoxedFunction<&meta_like_input>());
  }
  for (const char* name : {"_thnn_fused_gru_cell", "_thnn_fused_gru_cell_backward"}) {
    auto h = disp.findSchema({std::string("aten::") + name, ""});
    if (h && !h->hasKernelForDispatchKey(c10::DispatchKey::Meta))
      meta.impl(name, torch::CppFunction::makeFromBoxedFunction<&meta_gru_cell>());
  }
  for (const char* overload : {"bin_ct", "bins_tensor"}) {
    auto h = disp.findSchema({"aten::histogram", overload});
    if (h && !h->hasKernelForDispatchKey(c10::DispatchKey::Meta))
      meta.impl((std::string("histogram.") + overload).c_str(), torch::CppFunction::makeFromBoxedFunction<&meta_histogram>());
  }
  std::set<std::string> rules;
  for (auto& n : lower::rule_names()) rules.insert(n);
  // functional name + argument names, to find in-place and out= variants
  std::map<std::string, std::vector<std::pair<std::string, std::vector<std::string>>>> by_base;
  for (const auto& name : rules) {
    auto dot = name.find('.', 6);
    std::string base = name.substr(0, dot), overload = dot == std::string::npos ? "" : name.substr(dot + 1);
    auto h = disp.findSchema({base, overload});
    if (!h) continue;
    std::vector<std::string> an;
    for (auto& a : h->schema().arguments()) an.push_back(a.name());
    by_base[base].push_back({name, an});
  }
  int n = 0;
  auto reg = [&](const c10::OperatorHandle& h, const std::string& rule) {
    const auto& s = h.schema();
    std::string name = op_name(s.operator_name());
    if (h.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) return;
    if (h.hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) return;  // a dedicated kernel above
    if (g_rule_for.count(name)) return;
    g_rule_for[name] = rule;
    lib.impl(name.substr(6).c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<LoweredOp>(make_info(h, rule))));
    g_lowered.push_back(name);
    ++n;
  };
  for (const auto& opn : disp.getAllOpNames()) {
    if (opn.name.rfind("aten::", 0) != 0) continue;
    auto h = disp.findOp(opn);
    if (!h) continue;
    std::string name = op_name(opn);
    if (rules.count(name)) {
      reg(*h, name);
      continue;
    }
    const auto& s = h->schema();
    std::string base = opn.name;
    bool inplace = base.size() > 1 && base.back() == '_' && base[base.size() - 2] != '_';
    if (inplace) base.pop_back();
    auto it = by_base.find(base);
    if (it == by_base.end()) continue;
    std::vector<std::string> an;
    bool has_out = false;
    for (auto& a : s.arguments()) {
      if (is_out_arg(a)) has_out = true;
      else an.push_back(a.name());
    }
    if (!inplace && !has_out) continue;
    for (auto& [fname, fargs] : it->second) {
      bool match = fargs == an;
      if (inplace) match = match && (fname.substr(base.size()) == name.substr(base.size() + 1));
      if (match) {
        reg(*h, fname);
        break;
      }
    }
  }
  std::sort(g_lowered.begin(), g_lowered.end());
  count = n;
  return n;
}

std::vector<std::string> lowered_op_names() { return g_lowered; }
std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> stage_times(bool reset) {
  std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> out;
  int64_t calls = reset ? g_stage_calls.exchange(0) : g_stage_calls.load();
  for (int s = 0; s < kStages; ++s)
    out.push_back({kStageNames[s], {calls, reset ? g_stage_ns[s].exchange(0) : g_stage_ns[s].load()}});
  return out;
}
std::map<std::string, std::string> lowered_op_rules() {
  return std::map<std::string, std::string>(g_rule_for.begin(), g_rule_for.end());
}
int64_t meta_runs() { return g_meta_runs.load(); }

std::map<std::string, int64_t> bucketed_counts() {
  std::lock_guard<std::mutex> lock(g_bucket_mu);
  return g_bucketed_counts;
}
void reset_bucketed_counts() {
  std::lock_guard<std::mutex> lock(g_bucket_mu);
  g_bucketed_counts.clear();
}

std::map<std::string, int64_t> fallback_counts() {
  std::lock_guard<std::mutex> lock(g_fb_mu);
  return g_fb_counts;
}

void reset_fallback_counts() {
  std::lock_guard<std::mutex> lock(g_fb_mu);
  g_fb_counts.clear();
}

}  // namespace tt::aten

// Autocast registrations use ATen's unqualified type names, so they live in at::autocast.
namespace at::autocast {
namespace {
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

// Autocast for tpu: the cast policies CUDA uses (matmul-like ops in the autocast
// dtype, numerically sensitive ops in float32); everything else falls through.

#define TT_AUTOCAST_LOWER(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define TT_AUTOCAST_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define TT_AUTOCAST_FP32_OPT(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define TT_AUTOCAST_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
#define TT_AUTOCAST_APPEND(REDISPATCH_FUNC, REGISTER_NAME, REGISTER_SIGNATURE, REDISPATCH_SIGNATURE, POLICY) \
  KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE(REDISPATCH_FUNC, REGISTER_NAME, REGISTER_SIGNATURE,     \
                                                      REDISPATCH_SIGNATURE, POLICY)
TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(TT_AUTOCAST_LOWER)
  AT_FORALL_FP32(TT_AUTOCAST_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(TT_AUTOCAST_FP32_OPT)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(TT_AUTOCAST_APPEND)
  AT_FORALL_PROMOTE(TT_AUTOCAST_PROMOTE)
}

}  // namespace
}  // namespace at::autocast
