// The device owner: this process's PJRT client served to other processes of its user over a
// Unix socket (protocol.h). Each connection is a client with its own handles: it sees only the
// buffers and executables it made, and buffers another client exported to it by token. Torch-free.
#pragma once

#include <string>

namespace tt::remote {

// Serves rt::Client::get() on a Unix socket at `path` (created 0600; a stale socket file there
// is replaced) until stop() is called. Blocks; one thread per connected client. Throws
// rt::Error when the socket cannot be set up.
void serve(const std::string& path);
void stop();
// Clients connected now (for tests and the owner's status line).
int connected_clients();

}  // namespace tt::remote
