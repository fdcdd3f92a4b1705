// The TCP socket transport ("Socket"): net::Transport over plain sockets, one device per network
// interface selected by LOOM_SOCKET_IFNAME / LOOM_SOCKET_FAMILY. Connections use
// LOOM_SOCKET_NSOCKS sockets (large messages are split across them) and, with
// LOOM_SOCKET_NTHREADS > 0, helper threads that move the bytes. Host memory only.
#pragma once

#include <memory>

#include "transports/net.h"

namespace loom {

// Discovers the interfaces now (parameters are read again by each listen/connect/accept). Returns
// nullptr, with a warning, when no interface matches LOOM_SOCKET_IFNAME / LOOM_SOCKET_FAMILY.
std::unique_ptr<net::Transport> makeSocketTransport();

}  // namespace loom
