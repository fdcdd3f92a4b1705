// TCP socket helpers shared by the socket transport and the bootstrap: addresses, interface
// selection with NCCL_SOCKET_IFNAME's grammar, an owning fd, and deadline-bounded blocking I/O.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <atomic>
#include <string>
#include <vector>

#include "src/core/clock.h"
#include "src/core/status.h"

namespace loom {

struct SockAddr {
  sockaddr_storage ss{};
  socklen_t len = 0;

  int family() const { return ss.ss_family; }
  int port() const;
  void setPort(int port);
  bool isLoopback() const;
  // "1.2.3.4:5678" or "[::1]:5678".
  std::string toString() const;
};

// Parses "host:port", "[v6]:port", "v6addr" is not accepted without brackets when a port is given.
// host may be a name (resolved with getaddrinfo).
Result<SockAddr> parseSockAddr(const std::string& hostPort);
Result<SockAddr> resolveHost(const std::string& host, int port);

struct Interface {
  std::string name;
  SockAddr addr;  // port 0
};

// NCCL_SOCKET_IFNAME grammar: comma list of prefixes; a leading '^' excludes the listed prefixes;
// a leading '=' (after any '^') makes the names exact instead of prefixes.
bool matchIfName(const std::string& name, const std::string& spec);

// Interfaces that are up and have an address, filtered by spec (empty: every interface except
// lo and docker*, falling back to lo when nothing else exists) and family (AF_UNSPEC for any).
// Ordered as the spec lists them (then by name); IPv4 before IPv6 for one interface.
std::vector<Interface> findInterfaces(const std::string& spec, int family);
// The interface Loom uses by default (LOOM_SOCKET_IFNAME and LOOM_SOCKET_FAMILY applied).
Result<Interface> defaultInterface();
// The local interface whose subnet holds remote (for choosing the address to bind to reach a
// root given by address); falls back to defaultInterface().
Result<Interface> interfaceFor(const SockAddr& remote);

// Owning file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

Status setNonBlocking(int fd);
Status setNoDelay(int fd);

// Listening socket bound to addr (port 0: ephemeral); *bound gets the actual address.
Result<Fd> listenOn(const SockAddr& addr, SockAddr* bound, int backlog = 512);
// Starts a nonblocking connect; the result is a nonblocking fd whose connect may be in progress.
Result<Fd> startConnect(const SockAddr& addr);
// Checks a connect started by startConnect: true when connected, false while in progress, error
// when it failed (ECONNREFUSED etc).
Result<bool> checkConnect(int fd);
// Nonblocking accept: an invalid Fd when nothing is pending.
Result<Fd> tryAccept(int listenFd, SockAddr* peer);

// Blocking connect with retries until the deadline (the peer may not be listening yet).
Result<Fd> connectWithRetry(const SockAddr& addr, const Deadline& deadline,
                            const std::atomic<bool>* abort = nullptr);

// Nonblocking partial I/O: bytes moved (0 if it would block), or an error; a peer that closed
// the connection is an error (kRemote) "connection closed by peer".
Result<size_t> sendSome(int fd, const void* data, size_t bytes);
Result<size_t> recvSome(int fd, void* data, size_t bytes);
// sendSome over several buffers in one system call (sendmsg); same contract.
Result<size_t> sendvSome(int fd, const struct iovec* iov, int count);

// Moves all bytes on a nonblocking (or blocking) fd, polling until the deadline or until *abort
// becomes true (checked at least every 100 ms).
Status sendAll(int fd, const void* data, size_t bytes, const Deadline& deadline,
               const std::atomic<bool>* abort = nullptr);
Status recvAll(int fd, void* data, size_t bytes, const Deadline& deadline,
               const std::atomic<bool>* abort = nullptr);

// Random bytes from the kernel (getrandom), for secrets.
uint64_t randomU64();

}  // namespace loom
