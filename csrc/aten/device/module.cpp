// Device plumbing for `tpu` (allocator, device guard, hooks, generator) and the
// Python module torch_tpu._C.
#include <ATen/Context.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/ops/empty.h>
#include <c10/core/CPUAllocator.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>

#include "aten/compile/layout.h"
#include "aten/tpu.h"
#include "remote/owner.h"

namespace py = pybind11;

namespace tt::aten {

hlo::DType to_hlo(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat: return hlo::DType::F32;
    case c10::kDouble: return hlo::DType::F64;
    case c10::kHalf: return hlo::DType::F16;
    case c10::kBFloat16: return hlo::DType::BF16;
    case c10::kLong: return hlo::DType::S64;
    case c10::kInt: return hlo::DType::S32;
    case c10::kShort: return hlo::DType::S16;
    case c10::kChar: return hlo::DType::S8;
    case c10::kByte: return hlo::DType::U8;
    case c10::kBool: return hlo::DType::Pred;
    case c10::kUInt16: return hlo::DType::U16;
    case c10::kUInt32: return hlo::DType::U32;
    case c10::kUInt64: return hlo::DType::U64;
    case c10::kComplexFloat: return hlo::DType::C64;
    case c10::kComplexDouble: return hlo::DType::C128;
    default: TORCH_CHECK_TYPE(false, "torch_tpu does not support dtype ", t, " on the tpu device");
  }
}

// ---------------------------------------------------------------- allocator
namespace {
std::atomic<int64_t> g_live{0}, g_peak{0};
std::atomic<uint64_t> g_next_addr{uint64_t(1) << 40};
thread_local int t_device = 0;
std::atomic<int> g_device_count{0};

void delete_holder(void* ctx) {
  auto* h = static_cast<engine::StoragePtr*>(ctx);
  g_live -= (*h)->nbytes;
  (*h)->alive = false;
  // No engine lock here (this runs under the GIL when Python frees a tensor; the
  // engine may hold its lock while waiting for the GIL): a pending graph keeps
  // its own reference, and PJRT buffer destruction is thread-safe.
  delete h;
}

// (available, total) bytes of this machine's memory: the CPU plugin's device memory is host memory
std::pair<size_t, size_t> host_memory() {
  size_t total = static_cast<size_t>(sysconf(_SC_PAGE_SIZE)) * static_cast<size_t>(sysconf(_SC_PHYS_PAGES));
  size_t avail = total;
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char key[64];
    unsigned long long kb = 0;
    while (std::fscanf(f, "%63s %llu kB", key, &kb) == 2) {
      if (std::strcmp(key, "MemAvailable:") == 0) avail = static_cast<size_t>(kb) * 1024;
    }
    std::fclose(f);
  }
  return {avail, total};
}

// A c10::DeviceAllocator, so that torch.accelerator's memory calls (empty_cache, memory_stats,
// get_memory_info, ...) work for tpu as they do for cuda. No caching allocator sits between
// storages and PJRT buffers: empty_cache has nothing to release.
class TpuAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    int dev = current_device();
    auto* h = new engine::StoragePtr(std::make_shared<engine::Storage>(static_cast<int64_t>(nbytes), dev));
    uint64_t span = (std::max<uint64_t>(nbytes, 1) + 255) & ~uint64_t(255);
    void* addr = reinterpret_cast<void*>(g_next_addr.fetch_add(span));
    int64_t live = g_live += static_cast<int64_t>(nbytes);
    int64_t peak = g_peak.load();
    while (live > peak && !g_peak.compare_exchange_weak(peak, live)) {
    }
    return {addr, h, &delete_holder, c10::Device(kTpu, static_cast<c10::DeviceIndex>(dev))};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void*, const void*, std::size_t) const override {
    TORCH_CHECK(false, "tpu storages cannot be copied by address; use Tensor.copy_");
  }
  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t) override {}
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex) override {
    c10::CachingDeviceAllocator::DeviceStats s;
    auto& a = s.allocated_bytes[0];
    a.current = g_live.load();
    a.peak = g_peak.load();
    s.active_bytes[0] = a;
    s.requested_bytes[0] = a;
    s.reserved_bytes[0].current = rt::Buffer::live_bytes();
    s.reserved_bytes[0].peak = rt::Buffer::peak_bytes();
    return s;
  }
  void resetAccumulatedStats(c10::DeviceIndex) override {}
  void resetPeakStats(c10::DeviceIndex) override {
    g_peak = g_live.load();
    rt::Buffer::reset_peak();
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    auto s = rt::Client::get().memory_stats(device);
    if (s.available && s.bytes_limit > 0) {
      auto limit = static_cast<size_t>(s.bytes_limit);
      auto used = static_cast<size_t>(std::max<int64_t>(s.bytes_in_use, 0));
      return {used < limit ? limit - used : 0, limit};
    }
    return host_memory();
  }
};
TpuAllocator g_allocator;

// The host (pinned) allocator torch.accelerator asks for (empty_host_cache, host_memory_stats):
// tpu's host buffers are plain CPU memory (PJRT copies them), so nothing is cached or pinned.
class TpuHostAllocator final : public at::HostAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override { return c10::GetCPUAllocator()->allocate(nbytes); }
  c10::DeleterFnPtr raw_deleter() const override { return c10::GetCPUAllocator()->raw_deleter(); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
  bool record_event(void*, void*, c10::Stream) override { return true; }
  void empty_cache() override {}
  at::HostStats get_stats() override { return {}; }
  void reset_accumulated_stats() override {}
  void reset_peak_stats() override {}
};
TpuHostAllocator g_host_allocator;
}  // namespace

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator);
REGISTER_HOST_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_host_allocator);

c10::Allocator* allocator() { return &g_allocator; }
int64_t allocated_bytes() { return g_live.load(); }
int64_t peak_allocated_bytes() { return g_peak.load(); }
void reset_peak_allocated() { g_peak = g_live.load(); }

engine::StoragePtr storage_of(const at::TensorBase& t) {
  void* ctx = t.storage().data_ptr().get_context();
  TORCH_CHECK(ctx && t.storage().data_ptr().get_deleter() == &delete_holder,
              "torch_tpu: tensor storage was not allocated by the tpu allocator");
  const auto& st = *static_cast<engine::StoragePtr*>(ctx);
  TORCH_CHECK(!st->donated, *st->donated);  // the tensor was donated to a custom kernel
  return st;
}

engine::View view_of(const at::TensorBase& t) {
  engine::View v;
  v.st = storage_of(t);
  v.offset = t.storage_offset();
  v.sizes = t.sizes().vec();
  v.strides = t.strides().vec();
  v.dtype = to_hlo(t.scalar_type());
  if (!v.st->typed) {
    v.st->dtype = v.dtype;
    v.st->typed = true;
  }
  return v;
}

int current_device() { return t_device; }
void set_current_device(int d) {
  int n = device_count();
  TORCH_CHECK(d >= 0 && (n == 0 || d < n), "tpu device index ", d, " is out of range (", n, " devices)");
  t_device = d;
}
int device_count() { return g_device_count.load(); }

// ---------------------------------------------------------------- device guard
namespace {
struct TpuGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kTpu; }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old(kTpu, static_cast<c10::DeviceIndex>(t_device));
    if (d.has_index()) set_current_device(d.index());
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kTpu, static_cast<c10::DeviceIndex>(t_device)); }
  void setDevice(c10::Device d) const override {
    if (d.has_index()) set_current_device(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.has_index()) t_device = d.index();
  }
  c10::Stream getStream(c10::Device d) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream getDefaultStream(c10::Device d) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream getNewStream(c10::Device d, int) const override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream exchangeStream(c10::Stream s) const override { return c10::Stream(c10::Stream::DEFAULT, s.device()); }
  c10::DeviceIndex deviceCount() const noexcept override { return static_cast<c10::DeviceIndex>(g_device_count.load()); }
  // One in-order queue per device: an event is a point in that queue; waiting
  // on it drains the queue.
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    if (rt::Client::initialized()) engine::Engine::get().synchronize();
  }
  void synchronizeEvent(void*) const override { synchronizeStream(c10::Stream(c10::Stream::DEFAULT, getDevice())); }
  void synchronizeDevice(const c10::DeviceIndex) const override {
    synchronizeStream(c10::Stream(c10::Stream::DEFAULT, getDevice()));
  }
};
C10_REGISTER_GUARD_IMPL(PrivateUse1, TpuGuardImpl);
}  // namespace

// ---------------------------------------------------------------- generator
struct TpuGeneratorImpl : public c10::GeneratorImpl {
  explicit TpuGeneratorImpl(c10::DeviceIndex d)
      : c10::GeneratorImpl(c10::Device(kTpu, d), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}
  void set_current_seed(uint64_t s) override {
    seed_ = s;
    offset_ = 0;
  }
  void set_offset(uint64_t o) override { offset_ = o; }
  uint64_t get_offset() const override { return offset_; }
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override {
    uint64_t s = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
    set_current_seed(s);
    return s;
  }
  void set_state(const c10::TensorImpl& st) override {
    TORCH_CHECK(st.numel() == 16 && st.dtype() == caffe2::TypeMeta::Make<uint8_t>(),
                "tpu RNG state must be a uint8 tensor of 16 bytes");
    const uint8_t* p = static_cast<const uint8_t*>(st.data());
    std::memcpy(&seed_, p, 8);
    std::memcpy(&offset_, p + 8, 8);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto t = at::empty({16}, at::TensorOptions().dtype(at::kByte));
    std::memcpy(t.data_ptr(), &seed_, 8);
    std::memcpy(static_cast<uint8_t*>(t.data_ptr()) + 8, &offset_, 8);
    return t.getIntrusivePtr();
  }
  TpuGeneratorImpl* clone_impl() const override {
    auto* g = new TpuGeneratorImpl(device().index());
    g->seed_ = seed_;
    g->offset_ = offset_;
    return g;
  }
  uint64_t seed_ = 67280421310721ull;
  uint64_t offset_ = 0;
};

namespace {
std::vector<at::Generator>& generators() {
  static std::vector<at::Generator> g;
  return g;
}
const at::Generator& gen_for(int d) {
  auto& gs = generators();
  if (gs.empty()) {
    int n = std::max(1, device_count());
    for (int i = 0; i < n; ++i) gs.push_back(at::make_generator<TpuGeneratorImpl>(static_cast<c10::DeviceIndex>(i)));
  }
  TORCH_CHECK(d >= 0 && d < static_cast<int>(gs.size()), "tpu device index ", d, " is out of range");
  return gs[d];
}
}  // namespace

at::Generator default_generator_handle(int d) { return gen_for(d); }

std::pair<uint64_t, uint64_t> generator_take(int device, uint64_t n) {
  at::Generator g = gen_for(device);
  std::lock_guard<std::mutex> lock(g.mutex());
  auto* impl = static_cast<TpuGeneratorImpl*>(g.unsafeGetGeneratorImpl());
  uint64_t off = impl->offset_;
  impl->offset_ += n;
  return {impl->seed_, off};
}

// ---------------------------------------------------------------- storage resize
// The storage gets a fresh value of `newsize` bytes: its prefix in common with the
// old value is copied on the device, the rest reads as zeros; resize to 0 drops the
// buffer. Caller holds the engine lock.
void resize_storage_bytes(const c10::Storage& storage, size_t newsize) {
  auto* impl = storage.unsafeGetStorageImpl();
  size_t old_bytes = impl->nbytes();
  if (newsize == old_bytes) return;
  TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
  void* ctx = impl->data_ptr().get_context();
  TORCH_CHECK(ctx && impl->data_ptr().get_deleter() == &delete_holder,
              "torch_tpu: storage was not allocated by the tpu allocator");
  engine::StoragePtr old = *static_cast<engine::StoragePtr*>(ctx);
  c10::DeviceGuard guard(storage.device());
  c10::DataPtr fresh = g_allocator.allocate(newsize);
  engine::StoragePtr ns = *static_cast<engine::StoragePtr*>(fresh.get_context());
  if (old->typed) {
    ns->dtype = old->dtype;
    ns->typed = true;
    int64_t keep = static_cast<int64_t>(std::min(old_bytes, newsize)) / hlo::itemsize(old->dtype);
    if (keep > 0 && old->numel() > 0) {
      auto& eng = engine::Engine::get();
      auto& g = eng.graph(old->device);
      eng.copy_view(g, engine::View{old, 0, {keep}, {1}, old->dtype}, engine::View{ns, 0, {keep}, {1}, old->dtype},
                    "UntypedStorage.resize_");
      eng.op_done(old->device);
    }
  }
  impl->set_data_ptr_noswap(std::move(fresh));
  impl->set_nbytes(newsize);
}

// ---------------------------------------------------------------- hooks
namespace {
struct TpuHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex d) const override {
    return gen_for(d < 0 ? current_device() : d);
  }
  at::Generator getNewGenerator(c10::DeviceIndex d) const override {
    return at::make_generator<TpuGeneratorImpl>(d < 0 ? static_cast<c10::DeviceIndex>(current_device()) : d);
  }
  at::Device getDeviceFromPtr(void*) const override {
    return c10::Device(kTpu, static_cast<c10::DeviceIndex>(current_device()));
  }
  bool isPinnedPtr(const void*) const override { return false; }
  c10::Allocator* getPinnedMemoryAllocator() const override { return c10::GetCPUAllocator(); }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return static_cast<c10::DeviceIndex>(device_count()); }
  c10::DeviceIndex getCurrentDevice() const override { return static_cast<c10::DeviceIndex>(current_device()); }
  void setCurrentDevice(c10::DeviceIndex d) const override { set_current_device(d); }
  // untyped_storage().resize_(n): FSDP2 frees a parameter's memory with resize_(0) and
  // allocates it again with resize_(n) before an all-gather fills it.
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    std::optional<py::gil_scoped_release> nogil;  // the engine lock is never taken under the GIL
    if (Py_IsInitialized() && PyGILState_Check()) nogil.emplace();
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    resize_storage_bytes(storage, newsize);
  }
};
TpuHooks g_hooks;
}  // namespace

at::PrivateUse1HooksInterface* hooks() { return &g_hooks; }
void set_device_count(int n) { g_device_count = n; }

}  // namespace tt::aten

// ---------------------------------------------------------------- Python module
namespace {
using namespace tt;

template <typename F>
auto py_guard(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const engine::DeviceCheckError& e) {
    if (e.index_error) throw py::index_error(e.what());
    throw std::runtime_error(e.what());
  } catch (const rt::Error& e) {
    throw std::runtime_error(e.what());
  }
}

// ---- device owner (csrc/remote): serving this process's devices, and buffers shared between
// the processes attached to an owner (the plugin's tt_remote_export / tt_remote_import)
using ExportFn = int (*)(PJRT_Buffer*, char*, size_t, char*, size_t);
using ImportFn = int (*)(const char*, PJRT_Buffer**, char*, size_t);

template <typename Fn>
Fn owner_symbol(const char* name) {
  auto fn = reinterpret_cast<Fn>(rt::Client::get().symbol(name));
  if (!fn)
    throw std::runtime_error("sharing tensors between processes needs a process attached to a device owner "
                             "(TORCH_TPU_OWNER; see `python -m torch_tpu.owner`)");
  return fn;
}

// (token, storage bytes, storage dtype) of t's storage, shared with the owner's other clients.
py::tuple share_storage(const at::Tensor& t) {
  std::string token;
  int64_t nbytes = 0;
  int dtype = 0;
  {
    py::gil_scoped_release nogil;
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    py_guard([&] {
      auto fn = owner_symbol<ExportFn>("tt_remote_export");
      auto st = aten::storage_of(t);
      auto& eng = engine::Engine::get();
      eng.flush_all();  // the storage's pending writes
      if (st->dynamic()) throw std::runtime_error("a tensor with bucketed sizes cannot be shared yet");
      if (!st->buffer) eng.zero_fill(*st);
      char tok[128], err[512];
      if (fn(st->buffer->get(), tok, sizeof tok, err, sizeof err) != 0) throw std::runtime_error(err);
      token = tok;
      nbytes = st->nbytes;
      dtype = static_cast<int>(st->dtype);
      return 0;
    });
  }
  return py::make_tuple(token, nbytes, dtype);
}

at::Tensor open_shared(const std::string& token, std::vector<int64_t> sizes, std::vector<int64_t> strides,
                       int64_t offset, c10::ScalarType dtype, int64_t nbytes, int storage_dtype, int device) {
  py::gil_scoped_release nogil;
  std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
  return py_guard([&] {
    auto fn = owner_symbol<ImportFn>("tt_remote_import");
    PJRT_Buffer* b = nullptr;
    char err[512];
    if (fn(token.c_str(), &b, err, sizeof err) != 0) throw std::runtime_error(err);
    auto buf = std::make_shared<rt::Buffer>(rt::Client::get().api(), b);
    if (buf->bytes() != nbytes)
      throw std::runtime_error("the shared buffer holds " + std::to_string(buf->bytes()) + " bytes, not " +
                               std::to_string(nbytes));
    aten::Layout l{std::move(sizes), std::move(strides), offset, nbytes, dtype, static_cast<hlo::DType>(storage_dtype)};
    at::Tensor t = aten::tensor_on_new_storage(l, device);
    aten::storage_of(t)->buffer = std::move(buf);
    return t;
  });
}

void bind_owner(py::module& m) {
  m.def("_serve_devices", [](const std::string& path) {
    py::gil_scoped_release nogil;
    py_guard([&] { remote::serve(path); return 0; });
  });
  m.def("_stop_serving", [] { remote::stop(); });
  m.def("_owner_clients", [] { return remote::connected_clients(); });
  m.def("_share_storage", &share_storage);
  m.def("_open_shared", &open_shared);
}

py::dict metrics_dict() {
  auto& m = engine::Engine::get().metrics;
  py::dict d;
  d["compiles"] = m.compiles.load();
  d["cache_hits"] = m.cache_hits.load();
  d["cache_misses"] = m.cache_misses.load();
  d["executions"] = m.executions.load();
  d["ops"] = m.ops.load();
  d["flushes"] = m.flushes.load();
  d["compile_seconds"] = m.compile_ns.load() / 1e9;
  d["flush_seconds"] = m.flush_ns.load() / 1e9;
  d["program_bytes"] = m.program_bytes.load();
  d["h2d_transfers"] = m.h2d_transfers.load();
  d["h2d_bytes"] = m.h2d_bytes.load();
  d["d2h_transfers"] = m.d2h_transfers.load();
  d["d2h_bytes"] = m.d2h_bytes.load();
  d["cpu_fallbacks"] = aten::fallback_counts();
  d["meta_runs"] = aten::meta_runs();
  d["cache_entries"] = engine::Engine::get().cache_size();
  d["disk_cache_hits"] = m.disk_hits.load();
  d["disk_cache_misses"] = m.disk_misses.load();
  d["disk_cache_writes"] = m.disk_writes.load();
  d["disk_cache_errors"] = m.disk_errors.load();
  d["trace_hits"] = m.trace_hits.load();
  d["trace_ops"] = m.trace_ops.load();
  d["trace_exits"] = m.trace_exits.load();
  d["trace_recorded"] = m.trace_recorded.load();
  d["trace_verify_failures"] = m.trace_verify_failures.load();
  d["traces"] = engine::Engine::get().trace_count();
  d["captures"] = m.captures.load();
  d["compiled_runs"] = m.compiled_runs.load();
  d["frequent_compiles"] = m.frequent_compiles.load();
  d["map_releases"] = m.map_releases.load();
  d["dynamic_ops"] = m.dynamic_ops.load();
  d["bucketed_ops"] = aten::bucketed_counts();
  d["dynamic_exact_ops"] = m.dynamic_exact_ops.load();
  d["dynamic_conversions"] = m.dynamic_conversions.load();
  d["dynamic_compiles"] = m.dynamic_compiles.load();
  {
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    py::dict per;
    for (const auto& [k, v] : engine::Engine::get().programs_per_bucket()) per[py::str(k)] = v;
    d["programs_per_bucket"] = per;
  }
  return d;
}

void reset_metrics() {
  auto& m = engine::Engine::get().metrics;
  for (auto* c : {&m.compiles, &m.cache_hits, &m.cache_misses, &m.executions, &m.ops, &m.flushes, &m.compile_ns, &m.flush_ns, &m.program_bytes, &m.disk_hits, &m.disk_misses,
                  &m.disk_writes, &m.disk_errors, &m.trace_hits, &m.trace_ops, &m.trace_exits, &m.trace_recorded,
                  &m.trace_verify_failures, &m.captures, &m.compiled_runs, &m.frequent_compiles, &m.map_releases,
                  &m.h2d_transfers, &m.h2d_bytes, &m.d2h_transfers, &m.d2h_bytes, &m.dynamic_ops,
                  &m.dynamic_exact_ops, &m.dynamic_conversions, &m.dynamic_compiles})
    *c = 0;
  aten::reset_fallback_counts();
  aten::reset_bucketed_counts();
  std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
  engine::Engine::get().reset_compile_counts();
  engine::Engine::get().reset_programs_per_bucket();
}
}  // namespace

namespace tt::aten {
void bind_compiled(py::module& m);  // compiled.cpp
void bind_kernels(py::module& m);   // custom_kernels.cpp
void bind_distributed(py::module& m);  // distributed.cpp: the c10d backend
void bind_spmd(py::module& m);         // spmd.cpp: in-program collectives
}

namespace {
// The plugin and its devices: start-up, device selection, synchronisation.
void bind_runtime(py::module& m) {
  // Loads the PJRT plugin, creates the client and registers the device hooks
  // and every lowered op. Returns the number of devices.
  m.def("_init", [](const std::string& plugin, const std::string& hint, int cpu_devices) {
    return py_guard([&] {
      std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
      auto& c = rt::Client::init(plugin, hint, cpu_devices);
      aten::set_device_count(c.num_devices());
      at::RegisterPrivateUse1HooksInterface(aten::hooks());
      engine::Engine::get().set_rng_source(&aten::generator_take);
      engine::Engine::get().set_warn([](const std::string& msg) { TORCH_WARN(msg); });
      engine::Engine::get().set_site_source(&aten::current_python_site);
      aten::register_lowered_ops();
      aten::install_profiler_observer();
      return c.num_devices();
    });
  });
  m.def("_test_keyed_op", [](const at::Tensor& t, bool fail) { aten::test_keyed_op(t, fail); },
        py::call_guard<py::gil_scoped_release>());
  m.def("_test_inject_invalid_op", [](const at::Tensor& t) { aten::inject_invalid_op(t); },
        py::call_guard<py::gil_scoped_release>());
  m.def("_is_initialized", [] { return rt::Client::initialized(); });
  m.def("device_count", [] { return aten::device_count(); });
  m.def("current_device", [] { return aten::current_device(); });
  m.def("set_device", [](int d) { aten::set_current_device(d); });
  m.def("platform_name", [] { return py_guard([] { return rt::Client::get().platform_name(); }); });
  m.def("platform_version", [] { return py_guard([] { return rt::Client::get().platform_version(); }); });
  m.def("device_kind", [] { return py_guard([] { return rt::Client::get().device_kind(); }); });
  m.def("plugin_path", [] { return py_guard([] { return rt::Client::get().plugin_path(); }); });
  m.def("pjrt_api_version", [] { return py_guard([] { return rt::Client::get().api_minor(); }); });
  m.def("synchronize", [] {
    py::gil_scoped_release nogil;
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    py_guard([] { engine::Engine::get().synchronize(); return 0; });
  });
  // Runs what DeferAndFuse recorded so far as its programs, without waiting for them: the ops
  // recorded next start a new program.
  m.def("_flush", [] {
    py::gil_scoped_release nogil;
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    py_guard([] { engine::Engine::get().flush_all(); return 0; });
  });
}

// The engine's modes and settings (torch_tpu.set_eager_mode, dynamic.py, the trace cache, precision).
void bind_engine_settings(py::module& m) {
  m.def("_set_mode", [](int mode) {
    py::gil_scoped_release nogil;
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    py_guard([&] { engine::Engine::get().set_mode(static_cast<engine::Mode>(mode)); return 0; });
  });
  m.def("_set_cache_dir", [](const std::string& d) {
    py::gil_scoped_release nogil;
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    engine::Engine::get().set_cache_dir(d);
  });
  m.def("_get_cache_dir", [] { return engine::Engine::get().cache_dir(); });
  m.def("_set_fuse_limit", [](size_t n) { engine::Engine::get().set_fuse_limit(n); });
  // bounded dynamism (torch_tpu/dynamic.py)
  m.def("_set_dynamism", [](bool on) { engine::Engine::get().set_dynamism(on); });
  m.def("_get_dynamism", [] { return engine::Engine::get().dynamism(); });
  m.def("_set_buckets", [](std::vector<int64_t> steps, double growth, int64_t align) {
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    engine::Engine::get().set_buckets(std::move(steps), growth, align);
  });
  // testing rules on bucketed values: 0 the list, 1 every rule, 2 only `only`
  m.def("_set_bucket_rules", [](int mode, std::vector<std::string> only) { lower::set_bucket_rules_override(mode, only); },
        py::arg("mode"), py::arg("only") = std::vector<std::string>{});
  m.def("_bucket_steps", [] { return engine::Engine::get().bucket_steps(); });
  m.def("_bucket", [](int64_t n) { return engine::Engine::get().bucket(n); });
  m.def("_mark_dynamic", [](const at::Tensor& t, int64_t dim, int64_t bound) {
    py::gil_scoped_release nogil;
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    py_guard([&] {
      auto st = aten::storage_of(t);
      int64_t n = t.size(dim);
      auto& eng = engine::Engine::get();
      st->pinned_static = false;
      if (t.storage_offset() == 0 && t.is_non_overlapping_and_dense() && t.numel() == st->numel() &&
          (!st->dynamic() || (st->base_sizes == t.sizes().vec() && st->base_strides == t.strides().vec()))) {
        engine::Shape b = st->dynamic() ? st->base_bound : engine::Shape(t.dim(), 0);
        b[dim] = bound;
        eng.make_dynamic(st, t.sizes().vec(), t.strides().vec(), b);
      } else {
        eng.make_dynamic(st, st->numel() - t.numel() + t.numel() / n * bound, {{n, bound}});
      }
      return 0;
    });
  });
  m.def("_mark_static", [](const at::Tensor& t) {
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    aten::storage_of(t)->pinned_static = true;
  });
  m.def("_dynamic_sizes", [](const at::Tensor& t) {
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    auto st = aten::storage_of(t);
    return std::make_pair(st->dyn, st->elements());
  });
  m.def("_get_fuse_limit", [] { return engine::Engine::get().fuse_limit(); });
  m.def("_set_fuse_split_threads", [](bool on) {
    py::gil_scoped_release nogil;
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    engine::Engine::get().set_split_on_thread_switch(on);
  });
  // The trace cache (repeated op sequences are built without text; see engine.h).
  m.def("_set_tracing", [](bool on, bool verify) {
    py::gil_scoped_release nogil;
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    auto& e = engine::Engine::get();
    e.flush_all();
    e.set_tracing(on);
    e.set_trace_verify(verify);
    if (!on) e.clear_traces();
  });
  m.def("_get_tracing", [] {
    auto& e = engine::Engine::get();
    return py::make_tuple(e.tracing(), e.trace_verify());
  });
  m.def("_get_mode", [] { return static_cast<int>(engine::Engine::get().mode()); });
  m.def("_set_device_checks", [](bool on) {
    py::gil_scoped_release nogil;
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    engine::Engine::get().set_device_checks(on);
  });
  m.def("_get_device_checks", [] { return engine::Engine::get().device_checks(); });
  m.def("_set_precision", [](int p) {
    py::gil_scoped_release nogil;
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    aten::set_process_precision(static_cast<lower::Precision>(p));
  });
  m.def("_get_precision", [] { return static_cast<int>(aten::process_precision()); });
}

// What ran and how: metrics, rules, stage times, the last program, the compile cache.
void bind_introspection(py::module& m) {
  m.def("metrics", &metrics_dict);
  m.def("reset_metrics", &reset_metrics, py::call_guard<py::gil_scoped_release>());
  m.def("lowered_ops", [] { return aten::lowered_op_names(); });
  m.def("lowered_op_rules", [] { return aten::lowered_op_rules(); });
  // {stage: (calls, ns)} of the generic kernel, recorded under TORCH_TPU_STAGE_TIMES=1
  m.def("_stage_times", [](bool reset) {
    py::dict d;
    for (const auto& [stage, cn] : aten::stage_times(reset)) d[py::str(stage)] = py::make_tuple(cn.first, cn.second);
    return d;
  }, py::arg("reset") = false);
  m.def("lowering_rules", [] { return lower::rule_names(); });
  m.def("composed_ops", [] { return aten::composed_op_names(); });
  m.def("last_program", [] { return engine::Engine::get().last_program(); });
  m.def("clear_compile_cache", [] {
    py::gil_scoped_release nogil;
    std::lock_guard<std::recursive_mutex> lock(engine::engine_mutex());
    engine::Engine::get().clear_cache();
  });
}

// torch.tpu's generators and memory figures.
void bind_rng_and_memory(py::module& m) {
  m.def("manual_seed", [](int d, uint64_t seed) {
    at::Generator g = aten::default_generator_handle(d);
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_current_seed(seed);
  });
  m.def("seed", [](int d) {
    at::Generator g = aten::default_generator_handle(d);
    std::lock_guard<std::mutex> lock(g.mutex());
    return g.seed();
  });
  m.def("initial_seed", [](int d) { return aten::default_generator_handle(d).current_seed(); });
  m.def("get_rng_state", [](int d) {
    at::Generator g = aten::default_generator_handle(d);
    std::lock_guard<std::mutex> lock(g.mutex());
    auto impl = g.get_state();
    return py::bytes(static_cast<const char*>(impl.data_ptr()), impl.numel());
  });
  m.def("set_rng_state", [](int d, const std::string& state) {
    at::Generator g = aten::default_generator_handle(d);
    std::lock_guard<std::mutex> lock(g.mutex());
    auto t = at::empty({static_cast<int64_t>(state.size())}, at::TensorOptions().dtype(at::kByte));
    std::memcpy(t.data_ptr(), state.data(), state.size());
    g.set_state(t);
  });
  m.def("memory_allocated", [] { return aten::allocated_bytes(); });
  m.def("max_memory_allocated", [] { return aten::peak_allocated_bytes(); });
  m.def("reset_peak_memory_stats", [] { aten::reset_peak_allocated(); });
  m.def("buffer_bytes", [] { return rt::Buffer::live_bytes(); });
  m.def("peak_buffer_bytes", [] { return rt::Buffer::peak_bytes(); });
  m.def("reset_peak_buffer_bytes", [] { rt::Buffer::reset_peak(); });
  // (free, total) bytes, as torch.accelerator.get_memory_info: the plugin's limit, else the host's memory
  m.def("memory_info", [](int d) {
    auto* a = static_cast<c10::DeviceAllocator*>(aten::allocator());
    return py_guard([&] { return a->getMemoryInfo(static_cast<c10::DeviceIndex>(d)); });
  });
  m.def("device_memory_stats", [](int d) {
    py::dict out;
    auto s = py_guard([&] { return rt::Client::get().memory_stats(d); });
    if (s.available) {
      out["bytes_in_use"] = s.bytes_in_use;
      out["peak_bytes_in_use"] = s.peak_bytes_in_use;
      out["num_allocs"] = s.num_allocs;
      out["bytes_limit"] = s.bytes_limit;
    }
    return out;
  });
}
}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch_tpu C++ core";
  aten::bind_compiled(m);
  aten::bind_kernels(m);
  aten::bind_distributed(m);
  aten::bind_spmd(m);
  bind_owner(m);
  bind_runtime(m);
  bind_engine_settings(m);
  bind_introspection(m);
  bind_rng_and_memory(m);
}
