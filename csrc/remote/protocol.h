// The device owner's wire protocol (torch-free; see owner.h and proxy_plugin.cc).
//
// One process opens the PJRT devices (the owner); other processes of the same user reach
// them through a Unix socket with a PJRT plugin of ours that forwards each call. On accepting
// a connection the owner speaks first: a reply with its pid, platform name and version, device
// kind and device count, or a refusal. Then a request is a header {u32 magic, u32 op, u64
// payload bytes} and a payload; a reply is {u32 magic, u32 status, u64 payload bytes} and a
// payload: status 0 and the op's result, or a PJRT error code and the message. Integers are little-endian (both ends are one machine). Every read
// of a payload is bounds-checked: a malformed message is an error reply, never a crash.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace tt::remote {

constexpr uint32_t kRequestMagic = 0x31525454;  // "TTR1"
constexpr uint32_t kReplyMagic = 0x31505454;    // "TTP1"
// The largest payload either side accepts: a message is read in chunks as it arrives, so a
// header that announces more than the sender sends costs the receiver no memory up front.
constexpr uint64_t kMaxPayload = uint64_t(1) << 40;

enum class Op : uint32_t {
  Compile = 2,      // replicas (0: portable), format, code -> executable, outputs
  Deserialize = 3,  // bytes -> executable, outputs
  Serialize = 4,    // executable -> bytes
  FreeExecutable = 5,  // ids (not answered)
  FromHost = 6,     // type, dims, device, bytes -> buffer, size
  ToHost = 7,       // buffer, bytes -> the bytes
  FreeBuffer = 8,      // ids (not answered)
  Execute = 9,      // executable, device (-1: replicated), replicas, args, keep -> outputs
  MemoryStats = 10, // device -> stats (or an error: the plugin has none)
  Export = 11,      // buffer -> token (another client may import it)
  Import = 12,      // token -> buffer, size
};

// PJRT status codes used here (the plugin's own codes pass through unchanged).
constexpr uint32_t kInvalidArgument = 3, kNotFound = 5, kPermissionDenied = 7, kUnimplemented = 12,
                   kInternal = 13, kUnavailable = 14;

class ProtocolError : public std::runtime_error {
 public:
  explicit ProtocolError(const std::string& m) : std::runtime_error(m) {}
};

// Appends fields to a payload.
class Writer {
 public:
  void u32(uint32_t v) { raw(&v, 4); }
  void u64(uint64_t v) { raw(&v, 8); }
  void i64(int64_t v) { raw(&v, 8); }
  void bytes(const void* p, size_t n) {
    u64(n);
    raw(p, n);
  }
  void str(const std::string& s) { bytes(s.data(), s.size()); }
  void raw(const void* p, size_t n) {
    if (n) out.append(static_cast<const char*>(p), n);
  }
  std::string out;
};

// Reads fields of a payload; any read past its end throws ProtocolError.
class Reader {
 public:
  Reader(const char* p, size_t n) : p_(p), n_(n) {}
  uint32_t u32() { return pod<uint32_t>(); }
  uint64_t u64() { return pod<uint64_t>(); }
  int64_t i64() { return pod<int64_t>(); }
  // A length-prefixed field: a view into the payload.
  std::pair<const char*, size_t> bytes() {
    uint64_t n = u64();
    if (n > n_ - at_) throw ProtocolError("a field runs past the end of the message");
    const char* p = p_ + at_;
    at_ += n;
    return {p, static_cast<size_t>(n)};
  }
  std::string str() {
    auto [p, n] = bytes();
    return std::string(p, n);
  }
  // A count of items of `item` bytes each that must fit in what is left.
  uint64_t count(size_t item) {
    uint64_t n = u64();
    if (item && n > (n_ - at_) / item) throw ProtocolError("a count exceeds the message");
    return n;
  }
  void done() const {
    if (at_ != n_) throw ProtocolError("the message has trailing bytes");
  }

 private:
  template <typename T>
  T pod() {
    if (sizeof(T) > n_ - at_) throw ProtocolError("the message ends early");
    T v;
    std::memcpy(&v, p_ + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  const char* p_;
  size_t n_, at_ = 0;
};

// Socket I/O. Each throws std::runtime_error naming errno on failure or on a closed peer.
void send_all(int fd, const void* p, size_t n);
void recv_all(int fd, void* p, size_t n);
// Sends one framed message (a request's op, or a reply's status).
void send_message(int fd, uint32_t magic, uint32_t code, const std::string& payload);
// Receives one framed message: false on a clean end of stream before a header; throws
// ProtocolError on a bad magic or an oversized payload.
bool recv_message(int fd, uint32_t magic, uint32_t* code, std::string* payload);

}  // namespace tt::remote
