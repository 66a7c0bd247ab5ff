#include "remote/owner.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>

#include "remote/protocol.h"
#include "runtime/runtime.h"

namespace tt::remote {
namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_clients{0};
std::mutex g_fds_mu;
std::vector<int> g_fds;  // connected clients' sockets (stop() shuts them down)

// What every client shares: executables by program (a second client running the same program
// does not compile it again), exported buffers by token, and the buffers that more than one
// client may hold (exported or imported), which no run may donate.
struct Shared {
  std::mutex mu;
  std::unordered_map<std::string, std::weak_ptr<rt::Executable>> programs;
  std::unordered_map<std::string, std::weak_ptr<rt::Buffer>> exports;
  std::unordered_map<const PJRT_Buffer*, std::weak_ptr<rt::Buffer>> shared;

  bool is_shared(const PJRT_Buffer* b) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = shared.find(b);
    if (it == shared.end()) return false;
    if (it->second.expired()) {
      shared.erase(it);
      return false;
    }
    return true;
  }
  void mark_shared(const rt::BufferPtr& b) {
    std::lock_guard<std::mutex> lock(mu);
    shared[b->get()] = b;
    for (auto it = exports.begin(); it != exports.end();)  // drop exports whose buffer is gone
      it = it->second.expired() ? exports.erase(it) : std::next(it);
  }
};
Shared g_shared;

std::string new_token() {
  std::random_device rd;  // the kernel's randomness: a token cannot be guessed
  static const char hex[] = "0123456789abcdef";
  std::string t;
  for (int i = 0; i < 8; ++i) {
    uint32_t v = rd();
    for (int k = 0; k < 8; ++k) t += hex[(v >> (4 * k)) & 15];
  }
  return t;
}

class Session {
 public:
  explicit Session(int fd) : fd_(fd) {}

  void run() {
    try {  // the greeting
      rt::Client& c = rt::Client::get();
      Writer hello;
      hello.i64(getpid());
      hello.str(c.platform_name());
      hello.str(c.platform_version());
      hello.str(c.device_kind());
      hello.i64(c.num_devices());
      send_message(fd_, kReplyMagic, 0, hello.out);
    } catch (const std::exception&) {
      return;
    }
    std::string req;
    uint32_t op = 0;
    while (!g_stop.load()) {
      try {
        if (!recv_message(fd_, kRequestMagic, &op, &req)) return;  // the client closed
      } catch (const ProtocolError& e) {
        reply_error(kInvalidArgument, e.what());  // out of step with the stream: answer, then hang up
        drain();
        return;
      } catch (const std::exception&) {
        return;  // the connection broke
      }
      Writer out;
      uint32_t status = 0;
      std::string msg;
      try {
        Reader in(req.data(), req.size());
        handle(static_cast<Op>(op), in, out);
      } catch (const rt::Error& e) {
        status = e.code() ? static_cast<uint32_t>(e.code()) : kInternal;
        msg = e.what();
      } catch (const ProtocolError& e) {
        status = kInvalidArgument;
        msg = std::string("malformed request: ") + e.what();
      } catch (const std::bad_alloc&) {
        status = kInternal;
        msg = "out of host memory in the device owner";
      } catch (const std::exception& e) {
        status = kInternal;
        msg = e.what();
      }
      // frees are not answered (the client sends them ahead of its next request, so a free
      // costs no round trip); an error in one (an unknown id) has no one to tell
      if (static_cast<Op>(op) == Op::FreeBuffer || static_cast<Op>(op) == Op::FreeExecutable) continue;
      try {
        if (status) reply_error(status, msg);
        else send_message(fd_, kReplyMagic, 0, out.out);
      } catch (const std::exception&) {
        return;
      }
    }
  }

 private:
  // Ends our side and reads what the client still sends (briefly), so that the close does not
  // reset the connection before the client has read the error.
  void drain() {
    ::shutdown(fd_, SHUT_WR);
    timeval tv{0, 100000};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[65536];
    for (int i = 0; i < 16 && ::recv(fd_, buf, sizeof buf, 0) > 0; ++i) {
    }
  }

  void reply_error(uint32_t status, const std::string& msg) {
    Writer w;
    w.str(msg);
    try { send_message(fd_, kReplyMagic, status, w.out); } catch (const std::exception&) {}
  }

  rt::BufferPtr buffer(uint64_t id) const {
    auto it = bufs_.find(id);
    if (it == bufs_.end()) throw rt::Error("no buffer " + std::to_string(id) + " in this client", kNotFound);
    return it->second;
  }
  rt::ExecutablePtr executable(uint64_t id) const {
    auto it = exes_.find(id);
    if (it == exes_.end()) throw rt::Error("no executable " + std::to_string(id) + " in this client", kNotFound);
    return it->second;
  }
  void put_buffer(Writer& out, rt::BufferPtr b) {
    uint64_t id = ++next_;
    out.u64(id);
    out.u64(static_cast<uint64_t>(b->bytes()));
    bufs_.emplace(id, std::move(b));
  }
  void put_executable(Writer& out, rt::ExecutablePtr e) {
    uint64_t id = ++next_;
    out.u64(id);
    out.u64(e->num_outputs());
    exes_.emplace(id, std::move(e));
  }

  void handle(Op op, Reader& in, Writer& out) {
    rt::Client& c = rt::Client::get();
    switch (op) {
      case Op::Compile: {
        uint32_t replicas = in.u32();
        std::string format = in.str();
        auto [code, n] = in.bytes();
        in.done();
        if (format != "mlir") throw rt::Error("the device owner compiles MLIR programs only", kInvalidArgument);
        std::string text(code, n);
        std::string key = std::to_string(replicas) + ":" + text;
        rt::ExecutablePtr exe;
        {
          std::lock_guard<std::mutex> lock(g_shared.mu);
          auto it = g_shared.programs.find(key);
          if (it != g_shared.programs.end()) exe = it->second.lock();
        }
        if (!exe) {
          exe = replicas == 0 ? c.compile(text) : c.compile_replicated(text, static_cast<int>(replicas));
          std::lock_guard<std::mutex> lock(g_shared.mu);
          for (auto it = g_shared.programs.begin(); it != g_shared.programs.end();)
            it = it->second.expired() ? g_shared.programs.erase(it) : std::next(it);
          g_shared.programs[key] = exe;
        }
        put_executable(out, std::move(exe));
        return;
      }
      case Op::Deserialize: {
        auto [p, n] = in.bytes();
        in.done();
        put_executable(out, c.deserialize(std::string(p, n)));
        return;
      }
      case Op::Serialize: {
        uint64_t id = in.u64();
        in.done();
        out.str(executable(id)->serialize());
        return;
      }
      case Op::FreeExecutable: {
        uint64_t n = in.count(8);
        for (uint64_t i = 0; i < n; ++i) exes_.erase(in.u64());
        in.done();
        return;
      }
      case Op::FreeBuffer: {
        uint64_t n = in.count(8);
        for (uint64_t i = 0; i < n; ++i) bufs_.erase(in.u64());
        in.done();
        return;
      }
      case Op::FromHost: {
        auto type = static_cast<PJRT_Buffer_Type>(in.u32());
        uint64_t nd = in.count(8);
        std::vector<int64_t> dims(nd);
        uint64_t want = static_cast<uint64_t>(rt::byte_size(type));  // throws for a bad type
        for (auto& d : dims) {
          d = in.i64();
          if (d < 0 || (d > 0 && want > kMaxPayload / static_cast<uint64_t>(d)))
            throw rt::Error("bad buffer dimensions", kInvalidArgument);
          want *= static_cast<uint64_t>(d);
        }
        int64_t device = in.i64();
        auto [data, n] = in.bytes();
        in.done();
        if (n != want)
          throw rt::Error("buffer data of " + std::to_string(n) + " bytes for " + std::to_string(want), kInvalidArgument);
        if (device < 0 || device >= c.num_devices()) c.device(-1);  // throws the range error
        put_buffer(out, c.from_host(data, type, dims, static_cast<int>(device)));
        return;
      }
      case Op::ToHost: {
        uint64_t id = in.u64();
        uint64_t n = in.u64();
        in.done();
        rt::BufferPtr b = buffer(id);
        if (n != static_cast<uint64_t>(b->bytes()))
          throw rt::Error("asked " + std::to_string(n) + " bytes of a buffer of " + std::to_string(b->bytes()),
                          kInvalidArgument);
        out.u64(n);
        size_t at = out.out.size();
        out.out.resize(at + n);
        b->to_host(out.out.data() + at, n);
        return;
      }
      case Op::Execute: {
        rt::ExecutablePtr exe = executable(in.u64());
        int64_t device = in.i64();
        uint64_t replicas = in.count(8);
        uint64_t nargs = in.u64();
        if (replicas == 0 || (device >= 0 && replicas != 1))
          throw rt::Error("bad replica count", kInvalidArgument);
        if (nargs > (1u << 20)) throw rt::Error("too many arguments", kInvalidArgument);
        std::vector<std::vector<rt::BufferPtr>> hold(replicas);
        std::vector<std::vector<PJRT_Buffer*>> args(replicas);
        for (uint64_t r = 0; r < replicas; ++r)
          for (uint64_t i = 0; i < nargs; ++i) {
            hold[r].push_back(buffer(in.u64()));
            args[r].push_back(hold[r].back()->get());
          }
        uint64_t nkeep = in.count(8);
        std::vector<int64_t> keep;
        for (uint64_t i = 0; i < nkeep; ++i) {
          int64_t k = in.i64();
          if (k < 0 || static_cast<uint64_t>(k) >= nargs) throw rt::Error("bad non-donatable index", kInvalidArgument);
          keep.push_back(k);
        }
        in.done();
        // a buffer that another client may hold is never donated
        for (uint64_t i = 0; i < nargs; ++i)
          for (uint64_t r = 0; r < replicas; ++r)
            if (g_shared.is_shared(args[r][i])) {
              keep.push_back(static_cast<int64_t>(i));
              break;
            }
        std::vector<std::vector<rt::BufferPtr>> outs;
        if (device >= 0) {
          if (device >= c.num_devices()) c.device(static_cast<int>(device));  // throws the range error
          outs.push_back(exe->execute(static_cast<int>(device), args[0], keep));
        } else {
          outs = exe->execute_replicated(args, keep);
        }
        for (auto& rep : outs)  // the run's error, if any, is this request's
          for (auto& b : rep) b->await_ready();
        for (auto& rep : outs) {
          out.u64(rep.size());
          for (auto& b : rep) put_buffer(out, b);
        }
        return;
      }
      case Op::MemoryStats: {
        int64_t device = in.i64();
        in.done();
        if (device < 0 || device >= c.num_devices()) c.device(-1);
        rt::MemoryStats s = c.memory_stats(static_cast<int>(device));
        if (!s.available) throw rt::Error("the plugin reports no memory statistics", kUnimplemented);
        out.i64(s.bytes_in_use);
        out.i64(s.peak_bytes_in_use);
        out.i64(s.num_allocs);
        out.i64(s.bytes_limit);
        return;
      }
      case Op::Export: {
        rt::BufferPtr b = buffer(in.u64());
        in.done();
        std::string token = new_token();
        g_shared.mark_shared(b);
        {
          std::lock_guard<std::mutex> lock(g_shared.mu);
          g_shared.exports[token] = b;
        }
        out.str(token);
        return;
      }
      case Op::Import: {
        std::string token = in.str();
        in.done();
        rt::BufferPtr b;
        {
          std::lock_guard<std::mutex> lock(g_shared.mu);
          auto it = g_shared.exports.find(token);
          if (it != g_shared.exports.end()) b = it->second.lock();
        }
        if (!b) throw rt::Error("no shared buffer for this token (never exported, or freed by its exporter)", kNotFound);
        put_buffer(out, b);
        return;
      }
    }
    throw rt::Error("unknown request " + std::to_string(static_cast<uint32_t>(op)), kInvalidArgument);
  }

  int fd_;
  uint64_t next_ = 0;
  std::unordered_map<uint64_t, rt::BufferPtr> bufs_;
  std::unordered_map<uint64_t, rt::ExecutablePtr> exes_;
};

void serve_client(int fd) {
  {
    Session s(fd);
    s.run();
  }  // the client's handles are released here
  {
    std::lock_guard<std::mutex> lock(g_fds_mu);
    g_fds.erase(std::find(g_fds.begin(), g_fds.end(), fd));
  }
  ::close(fd);
  g_clients--;
}

// Only processes of the owner's own user: the socket file is 0600 in a 0700 directory, and the
// peer's credentials are checked here as well (root passes file permissions).
bool same_user(int fd, std::string* why) {
  struct ucred cred;
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    *why = std::string("cannot read the peer's credentials: ") + std::strerror(errno);
    return false;
  }
  if (cred.uid != geteuid()) {
    *why = "refused: process " + std::to_string(cred.pid) + " of uid " + std::to_string(cred.uid) +
           " is not of the device owner's user (uid " + std::to_string(geteuid()) + ")";
    return false;
  }
  return true;
}

}  // namespace

void stop() { g_stop = true; }
int connected_clients() { return g_clients.load(); }

void serve(const std::string& path) {
  g_stop = false;
  sockaddr_un addr;
  std::memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path)
    throw rt::Error("device owner socket path is empty or too long: " + path);
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw rt::Error(std::string("socket: ") + std::strerror(errno));
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) ::unlink(path.c_str());  // a stale socket
  mode_t old = ::umask(0177);  // created 0600
  int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::umask(old);
  if (rc != 0 || ::listen(fd, 64) != 0) {
    std::string e = std::strerror(errno);
    ::close(fd);
    throw rt::Error("cannot listen on " + path + ": " + e);
  }
  while (!g_stop.load()) {
    pollfd p{fd, POLLIN, 0};
    int k = ::poll(&p, 1, 200);
    if (k <= 0) continue;
    int c = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    std::string why;
    if (!same_user(c, &why)) {
      Writer w;
      w.str(why);
      try { send_message(c, kReplyMagic, kPermissionDenied, w.out); } catch (const std::exception&) {}
      ::close(c);
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(g_fds_mu);
      g_fds.push_back(c);
    }
    g_clients++;
    std::thread(serve_client, c).detach();
  }
  ::close(fd);
  ::unlink(path.c_str());
  // end the sessions (their reads fail) and wait for them to release their handles
  {
    std::lock_guard<std::mutex> lock(g_fds_mu);
    for (int c : g_fds) ::shutdown(c, SHUT_RDWR);
  }
  for (int i = 0; i < 600 && g_clients.load() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

}  // namespace tt::remote
