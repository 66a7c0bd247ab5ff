#include "remote/protocol.h"

#include <sys/socket.h>
#include <sys/types.h>

#include <algorithm>
#include <cerrno>

namespace tt::remote {

void send_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    // MSG_NOSIGNAL: a peer that went away is an error here, not a SIGPIPE that kills us
    ssize_t k = ::send(fd, c, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) throw std::runtime_error(std::string("send: ") + std::strerror(errno));
    c += k;
    n -= static_cast<size_t>(k);
  }
}

namespace {
// Reads up to n bytes; returns how many arrived before the end of the stream.
size_t recv_some(int fd, char* p, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t k = ::recv(fd, p + got, n - got, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) throw std::runtime_error(std::string("recv: ") + std::strerror(errno));
    if (k == 0) break;
    got += static_cast<size_t>(k);
  }
  return got;
}
}  // namespace

void recv_all(int fd, void* p, size_t n) {
  if (recv_some(fd, static_cast<char*>(p), n) != n) throw std::runtime_error("the connection closed");
}

void send_message(int fd, uint32_t magic, uint32_t code, const std::string& payload) {
  char header[16];
  uint64_t n = payload.size();
  std::memcpy(header, &magic, 4);
  std::memcpy(header + 4, &code, 4);
  std::memcpy(header + 8, &n, 8);
  send_all(fd, header, sizeof header);
  send_all(fd, payload.data(), payload.size());
}

bool recv_message(int fd, uint32_t magic, uint32_t* code, std::string* payload) {
  char header[16];
  size_t got = recv_some(fd, header, sizeof header);
  if (got == 0) return false;
  if (got != sizeof header) throw std::runtime_error("the connection closed inside a message header");
  uint32_t m;
  uint64_t n;
  std::memcpy(&m, header, 4);
  std::memcpy(code, header + 4, 4);
  std::memcpy(&n, header + 8, 8);
  if (m != magic) throw ProtocolError("not a torch_tpu device-owner message (bad magic)");
  if (n > kMaxPayload) throw ProtocolError("a message of " + std::to_string(n) + " bytes is over the limit");
  payload->clear();
  // in chunks, as the bytes arrive: memory follows what the peer actually sends
  constexpr size_t kChunk = size_t(1) << 20;
  while (payload->size() < n) {
    size_t want = static_cast<size_t>(std::min<uint64_t>(kChunk, n - payload->size()));
    size_t at = payload->size();
    payload->resize(at + want);
    size_t k = recv_some(fd, payload->data() + at, want);
    if (k != want) throw std::runtime_error("the connection closed inside a message");
  }
  return true;
}

}  // namespace tt::remote
