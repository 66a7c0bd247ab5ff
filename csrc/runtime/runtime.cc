#include "runtime/runtime.h"
#include "runtime/activity.h"

#include <dlfcn.h>

#include <atomic>

#include <cstring>

namespace tt::rt {
namespace {

template <typename T>
T zeroed(size_t size) {
  T v;
  std::memset(&v, 0, sizeof(T));
  v.struct_size = size;
  return v;
}
#define TT_ARGS(type, last) zeroed<type>(TT_PJRT_SIZE(type, last))

std::unique_ptr<Client> g_client;
std::mutex g_init_mu;

// CompileOptionsProto{executable_build_options(3){num_replicas(4)=1,
// num_partitions(5)=1}, compile_portable_executable(4)=true}: one executable
// that runs on whichever device Execute names.
const char kCompileOptions[] = {0x1a, 0x04, 0x20, 0x01, 0x28, 0x01, 0x20, 0x01};

}  // namespace

void check(const PJRT_Api* api, PJRT_Error* err, const char* what) {
  if (!err) return;
  auto m = TT_ARGS(PJRT_Error_Message_Args, message_size);
  m.error = err;
  api->PJRT_Error_Message(&m);
  std::string msg(m.message, m.message_size);
  auto c = TT_ARGS(PJRT_Error_GetCode_Args, code);
  c.error = err;
  int code = 0;
  if (!api->PJRT_Error_GetCode(&c)) code = c.code;
  auto d = TT_ARGS(PJRT_Error_Destroy_Args, error);
  d.error = err;
  api->PJRT_Error_Destroy(&d);
  throw Error(std::string("PJRT ") + what + " failed: " + msg, code);
}

int64_t byte_size(PJRT_Buffer_Type t) {
  switch (t) {
    case PJRT_T_PRED: case PJRT_T_S8: case PJRT_T_U8: return 1;
    case PJRT_T_S16: case PJRT_T_U16: case PJRT_T_F16: case PJRT_T_BF16: return 2;
    case PJRT_T_S32: case PJRT_T_U32: case PJRT_T_F32: return 4;
    case PJRT_T_S64: case PJRT_T_U64: case PJRT_T_F64: case PJRT_T_C64: return 8;
    case PJRT_T_C128: return 16;
    default: throw Error("unsupported PJRT buffer type " + std::to_string(int(t)));
  }
}

// ---------------------------------------------------------------- Event
Event::~Event() {
  if (!ev_) return;
  auto a = TT_ARGS(PJRT_Event_Destroy_Args, event);
  a.event = ev_;
  PJRT_Error* e = api_->PJRT_Event_Destroy(&a);
  if (e) { try { check(api_, e, "Event_Destroy"); } catch (...) {} }  // destructor: swallow
}

bool Event::ready() const {
  auto a = TT_ARGS(PJRT_Event_IsReady_Args, is_ready);
  a.event = ev_;
  check(api_, api_->PJRT_Event_IsReady(&a), "Event_IsReady");
  return a.is_ready;
}

void Event::wait() {
  try {
    await();
  } catch (const Error&) {
    // the run's error stays with the event: whoever awaits it next raises it
  }
}

void Event::await() {
  auto a = TT_ARGS(PJRT_Event_Await_Args, event);
  a.event = ev_;
  check(api_, api_->PJRT_Event_Await(&a), "execution");
}

// ---------------------------------------------------------------- Buffer
namespace {
std::atomic<int64_t> g_live_bytes{0}, g_peak_bytes{0};
}

Buffer::Buffer(const PJRT_Api* api, PJRT_Buffer* b) : api_(api), b_(b) {
  auto a = TT_ARGS(PJRT_Buffer_OnDeviceSizeInBytes_Args, size);
  a.buffer = b_;
  PJRT_Error* e = api_->PJRT_Buffer_OnDeviceSizeInBytes(&a);
  if (e) {
    try { check(api_, e, "Buffer_OnDeviceSizeInBytes"); } catch (...) {}
    return;
  }
  bytes_ = static_cast<int64_t>(a.size);
  int64_t live = g_live_bytes += bytes_;
  int64_t peak = g_peak_bytes.load();
  while (live > peak && !g_peak_bytes.compare_exchange_weak(peak, live)) {
  }
}

int64_t Buffer::live_bytes() { return g_live_bytes.load(); }
int64_t Buffer::peak_bytes() { return g_peak_bytes.load(); }
void Buffer::reset_peak() { g_peak_bytes = g_live_bytes.load(); }

Buffer::~Buffer() {
  g_live_bytes -= bytes_;
  if (!b_) return;
  auto a = TT_ARGS(PJRT_Buffer_Destroy_Args, buffer);
  a.buffer = b_;
  PJRT_Error* e = api_->PJRT_Buffer_Destroy(&a);
  if (e) { try { check(api_, e, "Buffer_Destroy"); } catch (...) {} }
}

const void* Buffer::host_data() const {
  if (on_host_ == 0) return nullptr;
  if (on_host_ < 0) {
    if (!api_->PJRT_Buffer_IsOnCpu || !api_->PJRT_Buffer_ReadyEvent || !api_->PJRT_Buffer_UnsafePointer) {
      on_host_ = 0;  // optional slots this plugin leaves empty
      return nullptr;
    }
    auto c = TT_ARGS(PJRT_Buffer_IsOnCpu_Args, is_on_cpu);
    c.buffer = b_;
    PJRT_Error* e = api_->PJRT_Buffer_IsOnCpu(&c);
    if (e) {  // a plugin without it: its buffers are read through ToHostBuffer
      try { check(api_, e, "Buffer_IsOnCpu"); } catch (...) {}
      c.is_on_cpu = false;
    }
    on_host_ = c.is_on_cpu ? 1 : 0;
    if (!on_host_) return nullptr;
  }
  if (!host_) {
    await_ready();  // the run that defines it has finished (or raises its error)
    auto p = TT_ARGS(PJRT_Buffer_UnsafePointer_Args, buffer_pointer);
    p.buffer = b_;
    check(api_, api_->PJRT_Buffer_UnsafePointer(&p), "Buffer_UnsafePointer");
    host_ = reinterpret_cast<const void*>(p.buffer_pointer);
  }
  return host_;
}

void Buffer::await_ready() const {
  if (!api_->PJRT_Buffer_ReadyEvent) return;
  auto r = TT_ARGS(PJRT_Buffer_ReadyEvent_Args, event);
  r.buffer = b_;
  check(api_, api_->PJRT_Buffer_ReadyEvent(&r), "Buffer_ReadyEvent");
  Event ready(api_, r.event);
  ready.await();
}

void Buffer::to_host(void* dst, size_t nbytes) const {
  activity::Scope scope(activity::Kind::ToHost, static_cast<int64_t>(nbytes));
  if (nbytes == static_cast<size_t>(bytes_) && nbytes > 0) {
    if (const void* p = host_data()) {
      std::memcpy(dst, p, nbytes);
      return;
    }
  }
  auto a = TT_ARGS(PJRT_Buffer_ToHostBuffer_Args, event);
  a.src = b_;
  a.dst = dst;
  a.dst_size = nbytes;
  check(api_, api_->PJRT_Buffer_ToHostBuffer(&a), "Buffer_ToHostBuffer");
  Event ev(api_, a.event);
  ev.await();
}

// ---------------------------------------------------------------- Executable
Executable::Executable(Client* c, PJRT_LoadedExecutable* e) : client_(c), e_(e) {
  const PJRT_Api* api = c->api();
  auto g = TT_ARGS(PJRT_LoadedExecutable_GetExecutable_Args, executable);
  g.loaded = e_;
  check(api, api->PJRT_LoadedExecutable_GetExecutable(&g), "LoadedExecutable_GetExecutable");
  auto n = TT_ARGS(PJRT_Executable_NumOutputs_Args, num_outputs);
  n.executable = g.executable;
  PJRT_Error* err = api->PJRT_Executable_NumOutputs(&n);
  auto d = TT_ARGS(PJRT_Executable_Destroy_Args, executable);
  d.executable = g.executable;
  PJRT_Error* err2 = api->PJRT_Executable_Destroy(&d);
  check(api, err, "Executable_NumOutputs");
  check(api, err2, "Executable_Destroy");
  num_outputs_ = n.num_outputs;
}

Executable::~Executable() {
  if (!e_) return;
  const PJRT_Api* api = client_->api();
  auto a = TT_ARGS(PJRT_LoadedExecutable_Destroy_Args, executable);
  a.executable = e_;
  PJRT_Error* e = api->PJRT_LoadedExecutable_Destroy(&a);
  if (e) { try { check(api, e, "LoadedExecutable_Destroy"); } catch (...) {} }
}

void Executable::track_run(PJRT_Event* done, bool wait) {
  if (!done) return;
  auto ev = std::make_unique<Event>(client_->api(), done);
  if (wait) ev->wait();  // while profiling, a run's scope lasts until it finished
  client_->track(std::move(ev));
}

std::vector<BufferPtr> Executable::execute(int device, const std::vector<PJRT_Buffer*>& args,
                                           const std::vector<int64_t>& keep) {
  const PJRT_Api* api = client_->api();
  auto opts = TT_ARGS(PJRT_ExecuteOptions, incarnation_ids);
  opts.non_donatable_input_indices = keep.empty() ? nullptr : keep.data();
  opts.num_non_donatable_input_indices = keep.size();
  std::vector<PJRT_Buffer*> outs(num_outputs_, nullptr);
  PJRT_Buffer* const* arg_list = args.data();
  PJRT_Buffer** out_list = outs.data();
  PJRT_Event* done = nullptr;
  auto a = TT_ARGS(PJRT_LoadedExecutable_Execute_Args, execute_device);
  a.executable = e_;
  a.options = &opts;
  a.argument_lists = &arg_list;
  a.num_devices = 1;
  a.num_args = args.size();
  a.output_lists = &out_list;
  a.device_complete_events = &done;
  a.execute_device = client_->device(device);
  activity::Scope scope(activity::Kind::Execute, static_cast<int64_t>(args.size()));
  check(api, api->PJRT_LoadedExecutable_Execute(&a), "Execute");
  std::vector<BufferPtr> result;
  result.reserve(outs.size());
  for (PJRT_Buffer* b : outs) result.push_back(std::make_shared<Buffer>(api, b));
  track_run(done, scope.recording());
  return result;
}

std::vector<std::vector<BufferPtr>> Executable::execute_replicated(const std::vector<std::vector<PJRT_Buffer*>>& args,
                                                                   const std::vector<int64_t>& keep) {
  const PJRT_Api* api = client_->api();
  size_t n = args.size();
  if (n == 0) throw Error("execute_replicated: no replicas");
  for (auto& a : args)
    if (a.size() != args[0].size()) throw Error("execute_replicated: replicas have different argument counts");
  auto opts = TT_ARGS(PJRT_ExecuteOptions, incarnation_ids);
  opts.non_donatable_input_indices = keep.empty() ? nullptr : keep.data();
  opts.num_non_donatable_input_indices = keep.size();
  std::vector<PJRT_Buffer* const*> arg_lists(n);
  std::vector<std::vector<PJRT_Buffer*>> outs(n, std::vector<PJRT_Buffer*>(num_outputs_, nullptr));
  std::vector<PJRT_Buffer**> out_lists(n);
  std::vector<PJRT_Event*> done(n, nullptr);
  for (size_t i = 0; i < n; ++i) {
    arg_lists[i] = args[i].data();
    out_lists[i] = outs[i].data();
  }
  auto a = TT_ARGS(PJRT_LoadedExecutable_Execute_Args, execute_device);
  a.executable = e_;
  a.options = &opts;
  a.argument_lists = arg_lists.data();
  a.num_devices = n;
  a.num_args = args[0].size();
  a.output_lists = out_lists.data();
  a.device_complete_events = done.data();
  a.execute_device = nullptr;  // every device of the executable's assignment
  activity::Scope scope(activity::Kind::Execute, static_cast<int64_t>(n * args[0].size()));
  check(api, api->PJRT_LoadedExecutable_Execute(&a), "Execute (replicated)");
  std::vector<std::vector<BufferPtr>> result(n);
  for (size_t i = 0; i < n; ++i) {
    for (PJRT_Buffer* b : outs[i]) result[i].push_back(std::make_shared<Buffer>(api, b));
    track_run(done[i], scope.recording());
  }
  return result;
}

std::string Executable::serialize() const {
  const PJRT_Api* api = client_->api();
  if (!api->PJRT_Executable_Serialize) return "";  // optional: no disk cache for this plugin
  auto g = TT_ARGS(PJRT_LoadedExecutable_GetExecutable_Args, executable);
  g.loaded = e_;
  check(api, api->PJRT_LoadedExecutable_GetExecutable(&g), "LoadedExecutable_GetExecutable");
  auto s = TT_ARGS(PJRT_Executable_Serialize_Args, deleter);
  s.executable = g.executable;
  PJRT_Error* err = api->PJRT_Executable_Serialize(&s);
  std::string out;
  if (!err) {
    out.assign(s.bytes, s.bytes_size);
    if (s.deleter) s.deleter(s.serialized);
  }
  auto d = TT_ARGS(PJRT_Executable_Destroy_Args, executable);
  d.executable = g.executable;
  PJRT_Error* err2 = api->PJRT_Executable_Destroy(&d);
  if (err) { try { check(api, err, "Executable_Serialize"); } catch (...) {} out.clear(); }
  check(api, err2, "Executable_Destroy");
  return out;
}

// ---------------------------------------------------------------- Client
bool Client::initialized() { return g_client != nullptr; }

void* Client::symbol(const char* name) const { return dl_ ? dlsym(dl_, name) : nullptr; }

Client& Client::get() {
  if (!g_client) throw Error("torch_tpu runtime is not initialised (no PJRT plugin loaded)");
  return *g_client;
}

Client& Client::init(const std::string& path, const std::string& hint, int cpu_device_count) {
  std::lock_guard<std::mutex> lock(g_init_mu);
  if (g_client) return *g_client;
  std::unique_ptr<Client> c(new Client());
  c->plugin_path_ = path;
  c->dl_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!c->dl_) throw Error("cannot load PJRT plugin " + path + ": " + dlerror());
  auto get_api = reinterpret_cast<GetPjrtApiFn>(dlsym(c->dl_, "GetPjrtApi"));
  if (!get_api) throw Error("PJRT plugin " + path + " has no GetPjrtApi symbol");
  const PJRT_Api* api = get_api();
  if (!api) throw Error("PJRT plugin " + path + " returned no API table");
  // Check the ABI before touching any slot beyond the version.
  int major = api->pjrt_api_version.major_version, minor = api->pjrt_api_version.minor_version;
  if (major != 0 || minor < kTtMinPjrtMinor)
    throw Error("PJRT plugin " + path + " has API version " + std::to_string(major) + "." + std::to_string(minor) +
                "; torch_tpu needs 0.x with x >= " + std::to_string(kTtMinPjrtMinor));
  if (api->struct_size < offsetof(PJRT_Api, PJRT_Buffer_ReadyEvent) + sizeof(void*))
    throw Error("PJRT plugin " + path + " has a function table of " + std::to_string(api->struct_size) +
                " bytes, smaller than the " + std::to_string(sizeof(PJRT_Api)) + " torch_tpu uses");
  // every slot we call must be filled (a plugin may leave optional ones null)
  const std::pair<const char*, const void*> required[] = {
      {"PJRT_Error_Destroy", reinterpret_cast<const void*>(api->PJRT_Error_Destroy)},
      {"PJRT_Error_Message", reinterpret_cast<const void*>(api->PJRT_Error_Message)},
      {"PJRT_Error_GetCode", reinterpret_cast<const void*>(api->PJRT_Error_GetCode)},
      {"PJRT_Plugin_Initialize", reinterpret_cast<const void*>(api->PJRT_Plugin_Initialize)},
      {"PJRT_Event_Destroy", reinterpret_cast<const void*>(api->PJRT_Event_Destroy)},
      {"PJRT_Event_IsReady", reinterpret_cast<const void*>(api->PJRT_Event_IsReady)},
      {"PJRT_Event_Await", reinterpret_cast<const void*>(api->PJRT_Event_Await)},
      {"PJRT_Client_Create", reinterpret_cast<const void*>(api->PJRT_Client_Create)},
      {"PJRT_Client_Destroy", reinterpret_cast<const void*>(api->PJRT_Client_Destroy)},
      {"PJRT_Client_PlatformName", reinterpret_cast<const void*>(api->PJRT_Client_PlatformName)},
      {"PJRT_Client_PlatformVersion", reinterpret_cast<const void*>(api->PJRT_Client_PlatformVersion)},
      {"PJRT_Client_AddressableDevices", reinterpret_cast<const void*>(api->PJRT_Client_AddressableDevices)},
      {"PJRT_Client_Compile", reinterpret_cast<const void*>(api->PJRT_Client_Compile)},
      {"PJRT_Client_BufferFromHostBuffer", reinterpret_cast<const void*>(api->PJRT_Client_BufferFromHostBuffer)},
      {"PJRT_DeviceDescription_Kind", reinterpret_cast<const void*>(api->PJRT_DeviceDescription_Kind)},
      {"PJRT_Device_GetDescription", reinterpret_cast<const void*>(api->PJRT_Device_GetDescription)},
      {"PJRT_Executable_Destroy", reinterpret_cast<const void*>(api->PJRT_Executable_Destroy)},
      {"PJRT_Executable_NumOutputs", reinterpret_cast<const void*>(api->PJRT_Executable_NumOutputs)},
      {"PJRT_LoadedExecutable_Destroy", reinterpret_cast<const void*>(api->PJRT_LoadedExecutable_Destroy)},
      {"PJRT_LoadedExecutable_GetExecutable", reinterpret_cast<const void*>(api->PJRT_LoadedExecutable_GetExecutable)},
      {"PJRT_LoadedExecutable_Execute", reinterpret_cast<const void*>(api->PJRT_LoadedExecutable_Execute)},
      {"PJRT_Buffer_Destroy", reinterpret_cast<const void*>(api->PJRT_Buffer_Destroy)},
      {"PJRT_Buffer_OnDeviceSizeInBytes", reinterpret_cast<const void*>(api->PJRT_Buffer_OnDeviceSizeInBytes)},
      {"PJRT_Buffer_ToHostBuffer", reinterpret_cast<const void*>(api->PJRT_Buffer_ToHostBuffer)},
  };
  for (const auto& [name, fn] : required)
    if (!fn) throw Error("PJRT plugin " + path + " does not implement " + name + ", which torch_tpu needs");
  c->api_ = api;
  auto init = TT_ARGS(PJRT_Plugin_Initialize_Args, ext);
  check(api, api->PJRT_Plugin_Initialize(&init), "Plugin_Initialize");

  std::vector<PJRT_NamedValue> opts;
  auto named = [&](const char* name) {
    PJRT_NamedValue v;
    std::memset(&v, 0, sizeof v);
    v.struct_size = TT_PJRT_SIZE(PJRT_NamedValue, value_size);
    v.name = name;
    v.name_size = std::strlen(name);
    v.value_size = 1;
    return v;
  };
  if (hint == "cpu") {
    auto v = named("cpu_device_count");
    v.type = kNV_Int64;
    v.int64_value = cpu_device_count;
    opts.push_back(v);
  } else if (hint == "cuda") {
    auto v = named("platform_name");
    v.type = kNV_String;
    v.string_value = "cuda";
    v.value_size = 4;
    opts.push_back(v);
    auto p = named("preallocate");
    p.type = kNV_Bool;
    p.bool_value = false;
    opts.push_back(p);
  }
  auto cc = TT_ARGS(PJRT_Client_Create_Args, kv_try_get_user_arg);
  cc.create_options = opts.data();
  cc.num_options = opts.size();
  check(api, api->PJRT_Client_Create(&cc), "Client_Create");
  c->client_ = cc.client;

  auto pn = TT_ARGS(PJRT_Client_String_Args, str_size);
  pn.client = c->client_;
  check(api, api->PJRT_Client_PlatformName(&pn), "Client_PlatformName");
  c->platform_name_.assign(pn.str, pn.str_size);
  auto pv = TT_ARGS(PJRT_Client_String_Args, str_size);
  pv.client = c->client_;
  check(api, api->PJRT_Client_PlatformVersion(&pv), "Client_PlatformVersion");
  c->platform_version_.assign(pv.str, pv.str_size);

  auto ad = TT_ARGS(PJRT_Client_AddressableDevices_Args, num_devices);
  ad.client = c->client_;
  check(api, api->PJRT_Client_AddressableDevices(&ad), "Client_AddressableDevices");
  c->devices_.assign(ad.devices, ad.devices + ad.num_devices);
  if (c->devices_.empty()) throw Error("PJRT plugin " + path + " reports no addressable devices");
  auto gd = TT_ARGS(PJRT_Device_GetDescription_Args, desc);
  gd.device = c->devices_[0];
  check(api, api->PJRT_Device_GetDescription(&gd), "Device_GetDescription");
  auto kd = TT_ARGS(PJRT_DeviceDescription_Kind_Args, kind_size);
  kd.desc = gd.desc;
  check(api, api->PJRT_DeviceDescription_Kind(&kd), "DeviceDescription_Kind");
  c->device_kind_.assign(kd.kind, kd.kind_size);
  g_client = std::move(c);
  return *g_client;
}

Client::~Client() {
  try { wait_all(); } catch (...) {}
  in_flight_.clear();
  if (client_) {
    auto a = TT_ARGS(PJRT_Client_Destroy_Args, client);
    a.client = client_;
    PJRT_Error* e = api_->PJRT_Client_Destroy(&a);
    if (e) { try { check(api_, e, "Client_Destroy"); } catch (...) {} }
  }
  // The plugin stays loaded: its threads may outlive this object at exit.
}

PJRT_Device* Client::device(int i) const {
  if (i < 0 || i >= num_devices())
    throw Error("tpu device index " + std::to_string(i) + " is out of range (" + std::to_string(num_devices()) +
                " devices)");
  return devices_[i];
}

ExecutablePtr Client::compile(const std::string& text) {
  auto prog = TT_ARGS(PJRT_Program, format_size);
  prog.code = text.data();
  prog.code_size = text.size();
  prog.format = "mlir";
  prog.format_size = 4;
  auto a = TT_ARGS(PJRT_Client_Compile_Args, executable);
  a.client = client_;
  a.program = &prog;
  a.compile_options = kCompileOptions;
  a.compile_options_size = sizeof(kCompileOptions);
  activity::Scope scope(activity::Kind::Compile, static_cast<int64_t>(text.size()));
  check(api_, api_->PJRT_Client_Compile(&a), "Compile");
  return std::make_shared<Executable>(this, a.executable);
}

ExecutablePtr Client::compile_replicated(const std::string& text, int num_replicas) {
  if (num_replicas < 1 || num_replicas > 127 || num_replicas > num_devices())
    throw Error("compile_replicated: " + std::to_string(num_replicas) + " replicas for " +
                std::to_string(num_devices()) + " devices");
  // CompileOptionsProto{executable_build_options(3){num_replicas(4)=n, num_partitions(5)=1}}:
  // not portable, so the replicas get the default device assignment (devices 0..n-1)
  const char options[] = {0x1a, 0x04, 0x20, static_cast<char>(num_replicas), 0x28, 0x01};
  auto prog = TT_ARGS(PJRT_Program, format_size);
  prog.code = text.data();
  prog.code_size = text.size();
  prog.format = "mlir";
  prog.format_size = 4;
  auto a = TT_ARGS(PJRT_Client_Compile_Args, executable);
  a.client = client_;
  a.program = &prog;
  a.compile_options = options;
  a.compile_options_size = sizeof(options);
  activity::Scope scope(activity::Kind::Compile, static_cast<int64_t>(text.size()));
  check(api_, api_->PJRT_Client_Compile(&a), "Compile (replicated)");
  return std::make_shared<Executable>(this, a.executable);
}

ExecutablePtr Client::deserialize(const std::string& bytes) {
  auto a = TT_ARGS(PJRT_Executable_DeserializeAndLoad_Args, overridden_compile_options_size);
  a.client = client_;
  a.bytes = bytes.data();
  a.bytes_size = bytes.size();
  if (!api_->PJRT_Executable_DeserializeAndLoad) throw Error("the PJRT plugin cannot load serialized executables");
  activity::Scope scope(activity::Kind::LoadProgram, static_cast<int64_t>(bytes.size()));
  check(api_, api_->PJRT_Executable_DeserializeAndLoad(&a), "Executable_DeserializeAndLoad");
  return std::make_shared<Executable>(this, a.loaded);
}

BufferPtr Client::from_host(const void* data, PJRT_Buffer_Type type, const std::vector<int64_t>& dims, int dev) {
  auto a = TT_ARGS(PJRT_Client_BufferFromHostBuffer_Args, buffer);
  a.client = client_;
  a.data = data;
  a.type = type;
  a.dims = dims.data();
  a.num_dims = dims.size();
  a.host_buffer_semantics = kImmutableOnlyDuringCall;
  a.device = device(dev);
  int64_t nbytes = byte_size(type);
  for (int64_t d : dims) nbytes *= d;
  activity::Scope scope(activity::Kind::ToDevice, nbytes);
  check(api_, api_->PJRT_Client_BufferFromHostBuffer(&a), "BufferFromHostBuffer");
  auto buf = std::make_shared<Buffer>(api_, a.buffer);
  if (a.done_with_host_buffer) {
    Event ev(api_, a.done_with_host_buffer);
    ev.await();  // the data was copied during the call; this only releases the event
  }
  return buf;
}

MemoryStats Client::memory_stats(int dev) const {
  MemoryStats s;
  auto a = TT_ARGS(PJRT_Device_MemoryStats_Args, largest_free_block_bytes_is_set);
  a.device = device(dev);
  if (!api_->PJRT_Device_MemoryStats) return MemoryStats{};
  PJRT_Error* e = api_->PJRT_Device_MemoryStats(&a);
  if (e) {
    try { check(api_, e, "Device_MemoryStats"); } catch (...) {}
    return s;  // e.g. UNIMPLEMENTED on the CPU plugin
  }
  s.available = true;
  s.bytes_in_use = a.bytes_in_use;
  s.peak_bytes_in_use = a.peak_bytes_in_use_is_set ? a.peak_bytes_in_use : 0;
  s.num_allocs = a.num_allocs_is_set ? a.num_allocs : 0;
  s.bytes_limit = a.bytes_limit_is_set ? a.bytes_limit : 0;
  return s;
}

void Client::track(std::unique_ptr<Event> done) {
  std::unique_ptr<Event> oldest;
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_.push_back(std::move(done));
    while (!in_flight_.empty() && in_flight_.front()->ready()) {
      auto ev = std::move(in_flight_.front());
      in_flight_.pop_front();
      ev->await();  // ready: returns at once, throws the run's error
    }
    if (in_flight_.size() <= max_in_flight()) return;
    oldest = std::move(in_flight_.front());
    in_flight_.pop_front();
  }
  oldest->await();
}

void Client::wait_all() {
  std::deque<std::unique_ptr<Event>> evs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    evs.swap(in_flight_);
  }
  std::string first;
  for (auto& e : evs) {
    try { e->await(); } catch (const Error& err) { if (first.empty()) first = err.what(); }
  }
  if (!first.empty()) throw Error(first);
}

}  // namespace tt::rt
