// libtt_remote_pjrt.so: a PJRT plugin whose devices are another process's. Each call of the
// subset of the PJRT C API that torch_tpu uses (runtime/pjrt_c.h) becomes a request to the
// device owner (owner.h) on the Unix socket named by TORCH_TPU_OWNER_SOCKET; buffers and
// executables here are handles to the owner's. Runs complete before Execute returns (the owner
// waits for them), so every event this plugin hands out is ready. If the owner goes away, every
// later call fails with UNAVAILABLE naming it; nothing here aborts the process.
//
// Beyond the table: tt_remote_export / tt_remote_import hand a buffer to another client of the
// same owner by token (the device memory is shared, not copied).
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "remote/protocol.h"
#include "runtime/pjrt_c.h"

using tt::remote::Op;
using tt::remote::Reader;
using tt::remote::Writer;

struct PJRT_Error {
  std::string message;
  int code;
};
struct PJRT_Event {
  PJRT_Error* error = nullptr;  // every event is ready
};
struct PJRT_DeviceDescription {
  int id;
  std::string kind;
};
struct PJRT_Device {
  PJRT_DeviceDescription desc;
};
struct PJRT_Buffer {
  uint64_t id;
  uint64_t size;
};
struct PJRT_LoadedExecutable;
struct PJRT_Executable {
  PJRT_LoadedExecutable* loaded;
};
struct PJRT_LoadedExecutable {
  uint64_t id;
  size_t outputs;
  PJRT_Executable view{this};
};

namespace {

PJRT_Error* error(int code, std::string msg) { return new PJRT_Error{std::move(msg), code}; }

// The one connection of this process to the owner.
class Connection {
 public:
  std::string path;
  int64_t owner_pid = 0;
  std::string platform_name, platform_version, kind;
  std::vector<std::unique_ptr<PJRT_Device>> devices;
  std::vector<PJRT_Device*> device_ptrs;

  // Connects and says hello; nullptr or the error.
  PJRT_Error* open() {
    const char* env = std::getenv("TORCH_TPU_OWNER_SOCKET");
    if (!env || !*env)
      return error(tt::remote::kInvalidArgument, "TORCH_TPU_OWNER_SOCKET names no device owner socket");
    path = env;
    sockaddr_un addr;
    std::memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    if (path.size() >= sizeof addr.sun_path) return error(tt::remote::kInvalidArgument, "socket path too long: " + path);
    std::memcpy(addr.sun_path, path.c_str(), path.size());
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0 || ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      std::string e = std::strerror(errno);
      if (fd_ >= 0) ::close(fd_);
      fd_ = -1;
      return error(tt::remote::kUnavailable, "no device owner at " + path + " (" + e +
                                                 "); start one with `python -m torch_tpu.owner`");
    }
    std::string reply;
    uint32_t status = 0;
    try {  // the owner speaks first: its greeting, or why it refuses this process
      if (!tt::remote::recv_message(fd_, tt::remote::kReplyMagic, &status, &reply))
        throw std::runtime_error("the owner closed the connection");
    } catch (const std::exception& e) {
      ::close(fd_);
      fd_ = -1;
      return error(tt::remote::kUnavailable, "the device owner at " + path + " did not answer: " + e.what());
    }
    if (status != 0) {
      ::close(fd_);
      fd_ = -1;
      std::string msg = "(no message)";
      try { msg = Reader(reply.data(), reply.size()).str(); } catch (const std::exception&) {}
      return error(static_cast<int>(status), "the device owner at " + path + " refused this process: " + msg);
    }
    try {
      Reader r(reply.data(), reply.size());
      owner_pid = r.i64();
      platform_name = r.str();
      platform_version = r.str();
      kind = r.str();
      int64_t n = r.i64();
      if (n < 0 || n > 4096) throw tt::remote::ProtocolError("bad device count");
      for (int64_t i = 0; i < n; ++i) {
        devices.push_back(std::make_unique<PJRT_Device>(PJRT_Device{{static_cast<int>(i), kind}}));
        device_ptrs.push_back(devices.back().get());
      }
    } catch (const std::exception& e) {
      return error(tt::remote::kInternal, std::string("bad greeting from the device owner: ") + e.what());
    }
    why_ = "the connection broke";
    return nullptr;
  }

  // One request and its reply; nullptr (and the reply's payload) or the error.
  PJRT_Error* call(Op op, const Writer& req, std::string* reply) {
    std::lock_guard<std::mutex> lock(mu_);
    if (fd_ < 0) return lost();
    uint32_t status = 0;
    try {
      flush_frees_locked();
      tt::remote::send_message(fd_, tt::remote::kRequestMagic, static_cast<uint32_t>(op), req.out);
      if (!tt::remote::recv_message(fd_, tt::remote::kReplyMagic, &status, reply))
        throw std::runtime_error("the owner closed the connection");
    } catch (const std::exception& e) {
      why_ = e.what();
      ::close(fd_);
      fd_ = -1;
      return lost();
    }
    if (status == 0) return nullptr;
    std::string msg;
    try {
      msg = Reader(reply->data(), reply->size()).str();
    } catch (const std::exception&) {
      msg = "(no message)";
    }
    return error(static_cast<int>(status), msg);
  }

  // Frees go out in batches, unanswered, ahead of the next request.
  void free_buffer(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    if (fd_ < 0) return;
    buffer_frees_.push_back(id);
  }
  void free_executable(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    if (fd_ < 0) return;
    exe_frees_.push_back(id);
  }
  void close() {
    std::lock_guard<std::mutex> lock(mu_);
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    why_ = "this process closed its client";
  }

 private:
  PJRT_Error* lost() const {
    return error(tt::remote::kUnavailable,
                 "the device owner (process " + std::to_string(owner_pid) + ", socket " + path +
                     ") is gone: " + why_ + "; the tpu tensors of this process are lost");
  }
  void flush_frees_locked() {
    for (auto* list : {&buffer_frees_, &exe_frees_}) {
      if (list->empty()) continue;
      Writer w;
      w.u64(list->size());
      for (uint64_t id : *list) w.u64(id);
      Op op = list == &buffer_frees_ ? Op::FreeBuffer : Op::FreeExecutable;
      list->clear();
      // not answered: the request that follows goes out right behind it
      tt::remote::send_message(fd_, tt::remote::kRequestMagic, static_cast<uint32_t>(op), w.out);
    }
  }

  std::mutex mu_;
  int fd_ = -1;
  std::string why_ = "never connected";
  std::vector<uint64_t> buffer_frees_, exe_frees_;
};

Connection* g_conn = nullptr;  // PJRT_Client* is this

Connection* conn(PJRT_Client* c) { return reinterpret_cast<Connection*>(c); }

template <typename F>
PJRT_Error* guarded(F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    return error(tt::remote::kInternal, std::string("device owner client: ") + e.what());
  }
}

PJRT_Error* read_loaded(const std::string& reply, PJRT_LoadedExecutable** out) {
  Reader r(reply.data(), reply.size());
  auto* e = new PJRT_LoadedExecutable;
  e->id = r.u64();
  e->outputs = static_cast<size_t>(r.u64());
  *out = e;
  return nullptr;
}

// ---- errors
void Error_Destroy(PJRT_Error_Destroy_Args* a) { delete a->error; }
void Error_Message(PJRT_Error_Message_Args* a) {
  a->message = a->error->message.data();
  a->message_size = a->error->message.size();
}
PJRT_Error* Error_GetCode(PJRT_Error_GetCode_Args* a) {
  a->code = a->error->code;
  return nullptr;
}
PJRT_Error* Plugin_Initialize(PJRT_Plugin_Initialize_Args*) { return nullptr; }

// ---- events: all ready
PJRT_Error* Event_Destroy(PJRT_Event_Destroy_Args* a) {
  if (a->event) delete a->event->error;
  delete a->event;
  return nullptr;
}
PJRT_Error* Event_IsReady(PJRT_Event_IsReady_Args* a) {
  a->is_ready = true;
  return nullptr;
}
PJRT_Error* Event_Await(PJRT_Event_Await_Args* a) {
  const PJRT_Error* e = a->event->error;
  return e ? error(e->code, e->message) : nullptr;
}

// ---- client
PJRT_Error* Client_Create(PJRT_Client_Create_Args* a) {
  return guarded([&]() -> PJRT_Error* {
    auto c = std::make_unique<Connection>();
    if (PJRT_Error* e = c->open()) return e;
    g_conn = c.release();
    a->client = reinterpret_cast<PJRT_Client*>(g_conn);
    return nullptr;
  });
}
PJRT_Error* Client_Destroy(PJRT_Client_Destroy_Args* a) {
  conn(a->client)->close();  // the object stays: buffers freed later find a closed connection
  return nullptr;
}
PJRT_Error* Client_PlatformName(PJRT_Client_String_Args* a) {
  a->str = conn(a->client)->platform_name.data();
  a->str_size = conn(a->client)->platform_name.size();
  return nullptr;
}
PJRT_Error* Client_PlatformVersion(PJRT_Client_String_Args* a) {
  a->str = conn(a->client)->platform_version.data();
  a->str_size = conn(a->client)->platform_version.size();
  return nullptr;
}
PJRT_Error* Client_AddressableDevices(PJRT_Client_AddressableDevices_Args* a) {
  a->devices = conn(a->client)->device_ptrs.data();
  a->num_devices = conn(a->client)->device_ptrs.size();
  return nullptr;
}

// The two compile options torch_tpu sends (runtime.cc): portable single-device, or n replicas.
bool replicas_of(const char* o, size_t n, uint32_t* replicas) {
  static const char portable[] = {0x1a, 0x04, 0x20, 0x01, 0x28, 0x01, 0x20, 0x01};
  if (n == sizeof portable && std::memcmp(o, portable, n) == 0) {
    *replicas = 0;
    return true;
  }
  if (n == 6 && o[0] == 0x1a && o[1] == 0x04 && o[2] == 0x20 && o[4] == 0x28 && o[5] == 0x01 && o[3] > 0) {
    *replicas = static_cast<uint32_t>(o[3]);
    return true;
  }
  return false;
}

PJRT_Error* Client_Compile(PJRT_Client_Compile_Args* a) {
  return guarded([&]() -> PJRT_Error* {
    uint32_t replicas = 0;
    if (!replicas_of(a->compile_options, a->compile_options_size, &replicas))
      return error(tt::remote::kUnimplemented, "the device owner takes torch_tpu's compile options only");
    Writer w;
    w.u32(replicas);
    w.str(std::string(a->program->format, a->program->format_size));
    w.bytes(a->program->code, a->program->code_size);
    std::string reply;
    if (PJRT_Error* e = conn(a->client)->call(Op::Compile, w, &reply)) return e;
    return read_loaded(reply, &a->executable);
  });
}
PJRT_Error* Executable_DeserializeAndLoad(PJRT_Executable_DeserializeAndLoad_Args* a) {
  return guarded([&]() -> PJRT_Error* {
    Writer w;
    w.bytes(a->bytes, a->bytes_size);
    std::string reply;
    if (PJRT_Error* e = conn(a->client)->call(Op::Deserialize, w, &reply)) return e;
    return read_loaded(reply, &a->loaded);
  });
}

PJRT_Error* Client_BufferFromHostBuffer(PJRT_Client_BufferFromHostBuffer_Args* a) {
  return guarded([&]() -> PJRT_Error* {
    if (a->byte_strides && a->num_byte_strides)
      return error(tt::remote::kUnimplemented, "strided host buffers are not supported by the device owner client");
    auto* dev = reinterpret_cast<PJRT_Device*>(a->device);
    uint64_t n = 0;
    switch (a->type) {
      case PJRT_T_PRED: case PJRT_T_S8: case PJRT_T_U8: n = 1; break;
      case PJRT_T_S16: case PJRT_T_U16: case PJRT_T_F16: case PJRT_T_BF16: n = 2; break;
      case PJRT_T_S32: case PJRT_T_U32: case PJRT_T_F32: n = 4; break;
      case PJRT_T_S64: case PJRT_T_U64: case PJRT_T_F64: case PJRT_T_C64: n = 8; break;
      case PJRT_T_C128: n = 16; break;
      default: return error(tt::remote::kInvalidArgument, "unsupported buffer type");
    }
    Writer w;
    w.u32(static_cast<uint32_t>(a->type));
    w.u64(a->num_dims);
    for (size_t i = 0; i < a->num_dims; ++i) {
      w.i64(a->dims[i]);
      n *= static_cast<uint64_t>(a->dims[i]);
    }
    w.i64(dev ? dev->desc.id : 0);
    w.bytes(a->data, n);
    std::string reply;
    if (PJRT_Error* e = g_conn->call(Op::FromHost, w, &reply)) return e;
    Reader r(reply.data(), reply.size());
    uint64_t id = r.u64(), size = r.u64();
    a->buffer = new PJRT_Buffer{id, size};
    a->done_with_host_buffer = new PJRT_Event;  // the bytes were sent during the call
    return nullptr;
  });
}

// ---- devices
PJRT_Error* Device_GetDescription(PJRT_Device_GetDescription_Args* a) {
  a->desc = &a->device->desc;
  return nullptr;
}
PJRT_Error* DeviceDescription_Id(PJRT_DeviceDescription_Id_Args* a) {
  a->id = a->desc->id;
  return nullptr;
}
PJRT_Error* DeviceDescription_Kind(PJRT_DeviceDescription_Kind_Args* a) {
  a->kind = a->desc->kind.data();
  a->kind_size = a->desc->kind.size();
  return nullptr;
}
PJRT_Error* Device_MemoryStats(PJRT_Device_MemoryStats_Args* a) {
  return guarded([&]() -> PJRT_Error* {
    Writer w;
    w.i64(a->device->desc.id);
    std::string reply;
    if (PJRT_Error* e = g_conn->call(Op::MemoryStats, w, &reply)) return e;
    Reader r(reply.data(), reply.size());
    a->bytes_in_use = r.i64();
    a->peak_bytes_in_use = r.i64();
    a->peak_bytes_in_use_is_set = true;
    a->num_allocs = r.i64();
    a->num_allocs_is_set = true;
    a->bytes_limit = r.i64();
    a->bytes_limit_is_set = a->bytes_limit > 0;
    return nullptr;
  });
}

// ---- executables
PJRT_Error* Executable_Destroy(PJRT_Executable_Destroy_Args*) { return nullptr; }  // a view of its loaded one
PJRT_Error* Executable_NumOutputs(PJRT_Executable_NumOutputs_Args* a) {
  a->num_outputs = a->executable->loaded->outputs;
  return nullptr;
}
PJRT_Error* LoadedExecutable_GetExecutable(PJRT_LoadedExecutable_GetExecutable_Args* a) {
  a->executable = &a->loaded->view;
  return nullptr;
}
PJRT_Error* LoadedExecutable_Destroy(PJRT_LoadedExecutable_Destroy_Args* a) {
  if (g_conn) g_conn->free_executable(a->executable->id);
  delete a->executable;
  return nullptr;
}
PJRT_Error* Executable_Serialize(PJRT_Executable_Serialize_Args* a) {
  return guarded([&]() -> PJRT_Error* {
    Writer w;
    w.u64(a->executable->loaded->id);
    std::string reply;
    if (PJRT_Error* e = g_conn->call(Op::Serialize, w, &reply)) return e;
    auto* s = new std::string(Reader(reply.data(), reply.size()).str());
    a->bytes = s->data();
    a->bytes_size = s->size();
    a->serialized = reinterpret_cast<PJRT_SerializedExecutable*>(s);
    a->deleter = [](PJRT_SerializedExecutable* p) { delete reinterpret_cast<std::string*>(p); };
    return nullptr;
  });
}
PJRT_Error* LoadedExecutable_Execute(PJRT_LoadedExecutable_Execute_Args* a) {
  return guarded([&]() -> PJRT_Error* {
    Writer w;
    w.u64(a->executable->id);
    w.i64(a->execute_device ? reinterpret_cast<PJRT_Device*>(a->execute_device)->desc.id : -1);
    w.u64(a->num_devices);
    w.u64(a->num_args);
    for (size_t d = 0; d < a->num_devices; ++d)
      for (size_t i = 0; i < a->num_args; ++i) w.u64(a->argument_lists[d][i]->id);
    size_t nkeep = a->options ? a->options->num_non_donatable_input_indices : 0;
    w.u64(nkeep);
    for (size_t i = 0; i < nkeep; ++i) w.i64(a->options->non_donatable_input_indices[i]);
    std::string reply;
    if (PJRT_Error* e = g_conn->call(Op::Execute, w, &reply)) return e;
    Reader r(reply.data(), reply.size());
    for (size_t d = 0; d < a->num_devices; ++d) {
      uint64_t n = r.u64();
      if (n != a->executable->outputs) return error(tt::remote::kInternal, "the owner returned a wrong output count");
      for (uint64_t j = 0; j < n; ++j) {
        uint64_t id = r.u64(), size = r.u64();
        a->output_lists[d][j] = new PJRT_Buffer{id, size};
      }
      if (a->device_complete_events) a->device_complete_events[d] = new PJRT_Event;
    }
    return nullptr;
  });
}

// ---- buffers
PJRT_Error* Buffer_Destroy(PJRT_Buffer_Destroy_Args* a) {
  if (g_conn) g_conn->free_buffer(a->buffer->id);
  delete a->buffer;
  return nullptr;
}
PJRT_Error* Buffer_OnDeviceSizeInBytes(PJRT_Buffer_OnDeviceSizeInBytes_Args* a) {
  a->size = a->buffer->size;
  return nullptr;
}
PJRT_Error* Buffer_ReadyEvent(PJRT_Buffer_ReadyEvent_Args* a) {
  a->event = new PJRT_Event;
  return nullptr;
}
PJRT_Error* Buffer_ToHostBuffer(PJRT_Buffer_ToHostBuffer_Args* a) {
  return guarded([&]() -> PJRT_Error* {
    if (!a->dst) {  // a query of the size
      a->dst_size = a->src->size;
      return nullptr;
    }
    Writer w;
    w.u64(a->src->id);
    w.u64(a->dst_size);
    std::string reply;
    if (PJRT_Error* e = g_conn->call(Op::ToHost, w, &reply)) return e;
    auto [p, n] = Reader(reply.data(), reply.size()).bytes();
    if (n != a->dst_size) return error(tt::remote::kInternal, "the owner sent a wrong byte count");
    std::memcpy(a->dst, p, n);
    a->event = new PJRT_Event;
    return nullptr;
  });
}

PJRT_Api make_api() {
  PJRT_Api api;
  std::memset(&api, 0, sizeof api);
  api.struct_size = sizeof(PJRT_Api);
  api.pjrt_api_version.struct_size = sizeof(PJRT_Api_Version);
  api.pjrt_api_version.major_version = 0;
  api.pjrt_api_version.minor_version = kTtMinPjrtMinor;
  api.PJRT_Error_Destroy = Error_Destroy;
  api.PJRT_Error_Message = Error_Message;
  api.PJRT_Error_GetCode = Error_GetCode;
  api.PJRT_Plugin_Initialize = Plugin_Initialize;
  api.PJRT_Event_Destroy = Event_Destroy;
  api.PJRT_Event_IsReady = Event_IsReady;
  api.PJRT_Event_Await = Event_Await;
  api.PJRT_Client_Create = Client_Create;
  api.PJRT_Client_Destroy = Client_Destroy;
  api.PJRT_Client_PlatformName = Client_PlatformName;
  api.PJRT_Client_PlatformVersion = Client_PlatformVersion;
  api.PJRT_Client_AddressableDevices = Client_AddressableDevices;
  api.PJRT_Client_Compile = Client_Compile;
  api.PJRT_Client_BufferFromHostBuffer = Client_BufferFromHostBuffer;
  api.PJRT_DeviceDescription_Id = DeviceDescription_Id;
  api.PJRT_DeviceDescription_Kind = DeviceDescription_Kind;
  api.PJRT_Device_GetDescription = Device_GetDescription;
  api.PJRT_Device_MemoryStats = Device_MemoryStats;
  api.PJRT_Executable_Destroy = Executable_Destroy;
  api.PJRT_Executable_NumOutputs = Executable_NumOutputs;
  api.PJRT_Executable_Serialize = Executable_Serialize;
  api.PJRT_LoadedExecutable_Destroy = LoadedExecutable_Destroy;
  api.PJRT_LoadedExecutable_GetExecutable = LoadedExecutable_GetExecutable;
  api.PJRT_LoadedExecutable_Execute = LoadedExecutable_Execute;
  api.PJRT_Executable_DeserializeAndLoad = Executable_DeserializeAndLoad;
  api.PJRT_Buffer_Destroy = Buffer_Destroy;
  api.PJRT_Buffer_OnDeviceSizeInBytes = Buffer_OnDeviceSizeInBytes;
  api.PJRT_Buffer_ToHostBuffer = Buffer_ToHostBuffer;
  api.PJRT_Buffer_ReadyEvent = Buffer_ReadyEvent;
  return api;
}

void copy_message(const std::string& m, char* out, size_t cap) {
  if (!out || cap == 0) return;
  size_t n = std::min(m.size(), cap - 1);
  std::memcpy(out, m.data(), n);
  out[n] = 0;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) const PJRT_Api* GetPjrtApi() {
  static const PJRT_Api api = make_api();
  return &api;
}

// Lets another client of the same owner open `b` (the same device memory): writes a token of
// at most `cap` - 1 characters. 0 on success, else -1 and the message in `err`.
__attribute__((visibility("default"))) int tt_remote_export(PJRT_Buffer* b, char* token, size_t cap, char* err,
                                                            size_t errcap) {
  if (!g_conn) {
    copy_message("not attached to a device owner", err, errcap);
    return -1;
  }
  Writer w;
  w.u64(b->id);
  std::string reply;
  if (PJRT_Error* e = g_conn->call(Op::Export, w, &reply)) {
    copy_message(e->message, err, errcap);
    delete e;
    return -1;
  }
  try {
    copy_message(Reader(reply.data(), reply.size()).str(), token, cap);
  } catch (const std::exception& e) {
    copy_message(e.what(), err, errcap);
    return -1;
  }
  return 0;
}

// A buffer of this client for a token another client exported. 0 on success, else -1.
__attribute__((visibility("default"))) int tt_remote_import(const char* token, PJRT_Buffer** out, char* err,
                                                            size_t errcap) {
  if (!g_conn) {
    copy_message("not attached to a device owner", err, errcap);
    return -1;
  }
  Writer w;
  w.str(token);
  std::string reply;
  if (PJRT_Error* e = g_conn->call(Op::Import, w, &reply)) {
    copy_message(e->message, err, errcap);
    delete e;
    return -1;
  }
  try {
    Reader r(reply.data(), reply.size());
    uint64_t id = r.u64(), size = r.u64();
    *out = new PJRT_Buffer{id, size};
  } catch (const std::exception& e) {
    copy_message(e.what(), err, errcap);
    return -1;
  }
  return 0;
}

}  // extern "C"
