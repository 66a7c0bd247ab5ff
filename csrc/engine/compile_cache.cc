// The compile cache: program text -> executable in memory and on disk, compile progress, map pressure.
#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>

namespace tt::engine {

using hlo::Builder;

namespace {
long read_number(const char* path, long fallback) {
  std::ifstream in(path);
  long v = 0;
  return in >> v ? v : fallback;
}

long count_lines(const char* path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return -1;
  long n = 0;
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) n += std::count(buf, buf + in.gcount(), '\n');
  return n;
}
}  // namespace

// A loaded executable keeps a few memory mappings of its JIT code (about three on the XLA CPU
// plugin, more for large programs). A process may hold vm.max_map_count mappings; a plugin that
// runs out fails inside LLVM and takes the process down. So every 32 loads the mappings are
// counted, and past half of the limit the caches let go of their executables (programs held
// elsewhere, such as compiled graphs, stay loaded).
void Engine::relieve_map_pressure() {
  if (++loads_since_map_check_ < 32) return;
  loads_since_map_check_ = 0;
  static const long limit = [] {  // TORCH_TPU_MAX_MAP_COUNT: a lower limit (tests)
    const char* e = std::getenv("TORCH_TPU_MAX_MAP_COUNT");
    long sys = read_number("/proc/sys/vm/max_map_count", 65530);
    return e && std::atol(e) > 0 ? std::min(sys, std::atol(e)) : sys;
  }();
  long n = count_lines("/proc/self/maps");
  if (n < 0 || n < limit / 2) return;
  cache_.clear();
  clear_traces();
  metrics.map_releases++;
}

rt::ExecutablePtr Engine::compile(const std::string& text) {
  if (auto* hit = cache_.find(text)) {
    metrics.cache_hits++;
    return *hit;
  }
  metrics.cache_misses++;
  relieve_map_pressure();
  if (auto cached = disk_load(text)) {
    cache_.put(text, cached);
    return cached;
  }
  auto t0 = std::chrono::steady_clock::now();
  auto exe = rt::Client::get().compile(text);
  note_compile(t0);
  disk_store(text, *exe);
  cache_.put(text, exe);
  return exe;
}

void Engine::note_compile(std::chrono::steady_clock::time_point t0) {
  int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  metrics.compile_ns += ns;
  metrics.compiles++;
  progress_.compiled(ns);
}

void CompileProgress::compiled(int64_t ns) {
  if (threshold_s_ < 0) {
    const char* env = std::getenv("TORCH_TPU_COMPILE_PROGRESS");
    char* end = nullptr;
    double v = env ? std::strtod(env, &end) : -1;
    threshold_s_ = (env && end != env && v >= 0) ? v : 5.0;  // unset or not a number: 5 s
    tty_ = isatty(2) != 0;
  }
  ++programs_;
  ns_ += ns;
  if (threshold_s_ == 0 || ns_ < static_cast<int64_t>(threshold_s_ * 1e9)) return;
  if (shown_ && (!tty_ || ns_ - shown_at_ns_ < 500000000)) return;  // a terminal: twice a second at most
  std::fprintf(stderr, "%storch_tpu: compiling programs for new shapes: %lld so far, %.1f s%s", tty_ ? "\r" : "",
               static_cast<long long>(programs_), static_cast<double>(ns_) / 1e9,
               tty_ ? "" : " (first runs at these shapes; later runs reuse them)\n");
  std::fflush(stderr);
  shown_ = true;
  shown_at_ns_ = ns_;
}

void CompileProgress::end() {
  if (shown_ && tty_) {
    std::fprintf(stderr, "\rtorch_tpu: compiled %lld programs in %.1f s\n", static_cast<long long>(programs_),
                 static_cast<double>(ns_) / 1e9);
    std::fflush(stderr);
  }
  programs_ = ns_ = shown_at_ns_ = 0;
  shown_ = false;
}

// ---- persistent cache. File: magic, key check, blob size, blob, blob checksum.
namespace {
const char kMagic[8] = {'T', 'T', 'P', 'C', 'A', 'C', 'H', '1'};

uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string cache_key(const std::string& text) {
  auto& c = rt::Client::get();
  return text + "\n// options: portable, 1 replica, 1 partition\n// platform: " + c.platform_name() + " " +
         c.platform_version() + " api " + std::to_string(c.api_minor()) + " plugin " + c.plugin_path();
}

void make_dirs(const std::string& dir) {
  std::string cur;
  std::stringstream ss(dir);
  std::string part;
  if (!dir.empty() && dir[0] == '/') cur = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    cur += part + "/";
    mkdir(cur.c_str(), 0755);
  }
}
}  // namespace

rt::ExecutablePtr Engine::disk_load(const std::string& text) {
  if (cache_dir_.empty()) return nullptr;
  std::string key = cache_key(text);
  uint64_t h1 = fnv1a(key), h2 = fnv1a(key, 0x9E3779B97F4A7C15ull);
  char name[40];
  snprintf(name, sizeof name, "%016llx.bin", static_cast<unsigned long long>(h1));
  std::string path = cache_dir_ + "/" + name;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    metrics.disk_misses++;
    return nullptr;
  }
  auto bad = [&]() -> rt::ExecutablePtr {
    metrics.disk_errors++;
    metrics.disk_misses++;
    in.close();
    std::remove(path.c_str());  // corrupt or stale: recompile and rewrite
    return nullptr;
  };
  char magic[8];
  uint64_t check = 0, size = 0, sum = 0;
  if (!in.read(magic, 8) || std::memcmp(magic, kMagic, 8) != 0) return bad();
  if (!in.read(reinterpret_cast<char*>(&check), 8) || check != h2) return bad();
  if (!in.read(reinterpret_cast<char*>(&size), 8) || size > (uint64_t(1) << 34)) return bad();
  std::string blob(size, '\0');
  if (!in.read(&blob[0], static_cast<std::streamsize>(size))) return bad();
  if (!in.read(reinterpret_cast<char*>(&sum), 8) || sum != fnv1a(blob)) return bad();
  try {
    auto exe = rt::Client::get().deserialize(blob);
    metrics.disk_hits++;
    return exe;
  } catch (const rt::Error&) {
    return bad();
  }
}

void Engine::disk_store(const std::string& text, const rt::Executable& exe) {
  if (cache_dir_.empty()) return;
  std::string blob = exe.serialize();
  if (blob.empty()) return;
  std::string key = cache_key(text);
  uint64_t h1 = fnv1a(key), h2 = fnv1a(key, 0x9E3779B97F4A7C15ull), size = blob.size(), sum = fnv1a(blob);
  char name[40];
  snprintf(name, sizeof name, "%016llx.bin", static_cast<unsigned long long>(h1));
  make_dirs(cache_dir_);
  std::string path = cache_dir_ + "/" + name;
  std::string tmp = path + ".tmp" + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      metrics.disk_errors++;
      return;
    }
    out.write(kMagic, 8);
    out.write(reinterpret_cast<const char*>(&h2), 8);
    out.write(reinterpret_cast<const char*>(&size), 8);
    out.write(blob.data(), static_cast<std::streamsize>(blob.size()));
    out.write(reinterpret_cast<const char*>(&sum), 8);
    if (!out) {
      metrics.disk_errors++;
      std::remove(tmp.c_str());
      return;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    metrics.disk_errors++;
    std::remove(tmp.c_str());
    return;
  }
  metrics.disk_writes++;
}

}  // namespace tt::engine
