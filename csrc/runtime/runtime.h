// PJRT runtime: plugin loading, client, devices, buffers, executables, events.
// One RAII owner per PJRT handle; every PJRT_Error becomes a tt::rt::Error.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/pjrt_c.h"

namespace tt::rt {

// A PJRT error (or a misuse detected here). `code` is PJRT's status code, 0 when
// the error did not come from the plugin.
class Error : public std::runtime_error {
 public:
  Error(const std::string& msg, int code = 0) : std::runtime_error(msg), code_(code) {}
  int code() const { return code_; }
 private:
  int code_;
};

class Client;

// Owns one PJRT_Event.
class Event {
 public:
  Event(const PJRT_Api* api, PJRT_Event* ev) : api_(api), ev_(ev) {}
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  bool ready() const;
  void await();  // throws the event's error, if any
  void wait();   // blocks until ready; the error, if any, is left for await()
 private:
  const PJRT_Api* api_;
  PJRT_Event* ev_;
};

// Owns one PJRT_Buffer.
class Buffer {
 public:
  Buffer(const PJRT_Api* api, PJRT_Buffer* b);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  PJRT_Buffer* get() const { return b_; }
  int64_t bytes() const { return bytes_; }
  // Copies the whole (dense, row-major) buffer to `dst`; blocks until done.
  void to_host(void* dst, size_t nbytes) const;
  // The buffer's bytes, once its value is ready, where they already lie in this
  // process's memory (the CPU plugin: dense, row-major, `bytes()` long); nullptr on
  // plugins whose buffers live on a device. Valid while this Buffer lives.
  const void* host_data() const;
  // Blocks until the run that defines the buffer has finished; throws that run's error.
  void await_ready() const;
  // Bytes held by live buffers of this process (device memory actually in use) and its peak.
  static int64_t live_bytes();
  static int64_t peak_bytes();
  static void reset_peak();
 private:
  const PJRT_Api* api_;
  PJRT_Buffer* b_;
  int64_t bytes_ = 0;
  mutable const void* host_ = nullptr;  // host_data(), once known
  mutable int on_host_ = -1;            // -1: not asked yet
};
using BufferPtr = std::shared_ptr<Buffer>;

// Owns one PJRT_LoadedExecutable.
class Executable {
 public:
  Executable(Client* c, PJRT_LoadedExecutable* e);
  ~Executable();
  Executable(const Executable&) = delete;
  Executable& operator=(const Executable&) = delete;
  size_t num_outputs() const { return num_outputs_; }
  // Enqueues one run on `device`; returns the output buffers (not yet ready).
  // `keep`: argument indices whose buffers must not be donated this time
  // (donation is compiled in; a buffer still referenced elsewhere opts out).
  std::vector<BufferPtr> execute(int device, const std::vector<PJRT_Buffer*>& args,
                                 const std::vector<int64_t>& keep = {});
  // A replicated executable (Client::compile_replicated): runs every replica once,
  // replica i on device i with arguments args[i]; returns each replica's outputs.
  std::vector<std::vector<BufferPtr>> execute_replicated(const std::vector<std::vector<PJRT_Buffer*>>& args,
                                                         const std::vector<int64_t>& keep = {});
  std::string serialize() const;  // empty when the plugin cannot serialize
 private:
  void track_run(PJRT_Event* done, bool wait);  // bounds runs in flight (Client::track)
  Client* client_;
  PJRT_LoadedExecutable* e_;
  size_t num_outputs_ = 0;
};
using ExecutablePtr = std::shared_ptr<Executable>;

struct MemoryStats {
  int64_t bytes_in_use = 0, peak_bytes_in_use = 0, num_allocs = 0, bytes_limit = 0;
  bool available = false;
};

// Owns the plugin's PJRT_Client. There is one per process (see Client::get).
class Client {
 public:
  // Loads the plugin at `plugin_path` and creates the client. `cpu_device_count`
  // is passed to the CPU plugin only; `platform_hint` is "cpu", "cuda" or "tpu".
  static Client& init(const std::string& plugin_path, const std::string& platform_hint, int cpu_device_count);
  static Client& get();  // throws if init has not run
  static bool initialized();
  // A symbol of the loaded plugin beyond the PJRT table (nullptr if it has none).
  void* symbol(const char* name) const;

  ~Client();
  const PJRT_Api* api() const { return api_; }
  PJRT_Client* raw() const { return client_; }
  int num_devices() const { return static_cast<int>(devices_.size()); }
  PJRT_Device* device(int i) const;
  const std::string& platform_name() const { return platform_name_; }
  const std::string& platform_version() const { return platform_version_; }
  const std::string& device_kind() const { return device_kind_; }
  const std::string& plugin_path() const { return plugin_path_; }
  int api_minor() const { return api_->pjrt_api_version.minor_version; }

  ExecutablePtr compile(const std::string& mlir_text);
  // One program for `num_replicas` replicas on devices 0..num_replicas-1 (the
  // default assignment): collectives inside it (stablehlo.all_reduce, all_gather,
  // reduce_scatter, all_to_all, collective_permute) run across those devices.
  ExecutablePtr compile_replicated(const std::string& mlir_text, int num_replicas);
  ExecutablePtr deserialize(const std::string& bytes);
  // Copies `nbytes` at `data` into a new device buffer of `dims` (row-major).
  BufferPtr from_host(const void* data, PJRT_Buffer_Type type, const std::vector<int64_t>& dims, int device);
  MemoryStats memory_stats(int device) const;

  // Bound on runs in flight: remember a run's completion event; waits for the
  // oldest when more than `max_in_flight()` are pending.
  void track(std::unique_ptr<Event> done);
  void wait_all();  // waits for every tracked run; rethrows the first error
  static size_t max_in_flight() { return 32; }

 private:
  Client() = default;
  void* dl_ = nullptr;
  const PJRT_Api* api_ = nullptr;
  PJRT_Client* client_ = nullptr;
  std::vector<PJRT_Device*> devices_;
  std::string platform_name_, platform_version_, device_kind_, plugin_path_;
  std::deque<std::unique_ptr<Event>> in_flight_;
  std::mutex mu_;
};

// Turns a PJRT_Error into tt::rt::Error (and frees it). No-op on nullptr.
void check(const PJRT_Api* api, PJRT_Error* err, const char* what);

int64_t byte_size(PJRT_Buffer_Type t);

}  // namespace tt::rt
