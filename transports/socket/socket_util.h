// TCP socket helpers shared by the socket and InfiniBand transports and the bootstrap: addresses,
// interface selection with NCCL_SOCKET_IFNAME's grammar, an owning fd, nonblocking connects kept
// across calls, and deadline-bounded blocking I/O (connect with retries, send and receive all).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
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
// LOOM_SOCKET_FAMILY as an address family: AF_INET, AF_INET6, or AF_UNSPEC (either).
int socketFamilyParam();
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

// What ends a blocking wait below before its deadline: either of two flags (an object's own abort
// flag and its caller's, say) turning true. A null flag never does; a single pointer converts.
class AbortFlags {
 public:
  AbortFlags(const std::atomic<bool>* a = nullptr,  // NOLINT(runtime/explicit): from a pointer
             const std::atomic<bool>* b = nullptr)
      : a_(a), b_(b) {}
  bool raised() const {
    return (a_ && a_->load(std::memory_order_acquire)) ||
           (b_ && b_->load(std::memory_order_acquire));
  }

 private:
  const std::atomic<bool>* a_;
  const std::atomic<bool>* b_;
};

// Blocking connect with retries until the deadline (the peer may not be listening yet): kTimeout
// (naming the last refusal) when the deadline passes, kAborted when abort is raised (seen within
// 100 ms), any other failure to start a connect at once.
Result<Fd> connectWithRetry(const SockAddr& addr, const Deadline& deadline,
                            AbortFlags abort = AbortFlags());

// A listener's address and secret as the TCP-based transports carry them in a connect handle: H
// is their plain handle struct (magic, secret, addrLen, addr; SocketHandle, IbHandle), written at
// the start of the handle's bytes, the rest zero. Fails (kInternal) for an address that does not
// fit H.
template <typename H, size_t N>
Status writeListenHandle(uint64_t magic, uint64_t secret, const SockAddr& addr,
                         unsigned char (&bytes)[N]) {
  static_assert(sizeof(H) <= N, "the handle struct does not fit the handle");
  if (addr.len > sizeof(H::addr))
    return LOOM_ERROR(kInternal, "address {} does not fit a handle", addr.toString());
  H h{};
  h.magic = magic;
  h.secret = secret;
  h.addrLen = addr.len;
  std::memcpy(h.addr, &addr.ss, addr.len);
  std::memset(bytes, 0, N);
  std::memcpy(bytes, &h, sizeof(h));
  return Status();
}
// readListenHandle's checks (below), on the fields of the handle struct.
Status decodeListenAddr(uint64_t magic, uint64_t handleMagic, const unsigned char* raw,
                        uint32_t addrLen, size_t capacity, SockAddr* addr);

// Reads what writeListenHandle wrote into *h and the address into *addr (bytes come from another
// process: through the caller's exchange, or an NCCL net plugin's). kInvalidArgument, saying
// why, when the bytes are not a handle with this magic (another transport's, or garbage) or do
// not hold an IPv4 or IPv6 address with a port.
template <typename H, size_t N>
Status readListenHandle(uint64_t magic, const unsigned char (&bytes)[N], H* h, SockAddr* addr) {
  static_assert(sizeof(H) <= N, "the handle struct does not fit the handle");
  std::memcpy(h, bytes, sizeof(H));
  return decodeListenAddr(magic, h->magic, h->addr, h->addrLen, sizeof(h->addr), addr);
}
// The connects in progress of a transport whose connect() does not block (NCCL's contract: it
// returns no comm until connected, and the caller calls again with the same handle). NCCL keeps
// this state in the handle; ours is const, so each is kept per calling thread and handle bytes,
// and different threads may connect concurrently. Pending must have a `Deadline deadline`: one
// its caller abandoned is dropped (closing its sockets) by a later call once that has passed.
// Thread-safe.
template <typename Pending>
class PendingConnects {
 public:
  // The connect this thread left pending with these handle bytes, or null (start one then).
  std::unique_ptr<Pending> take(const void* handle, size_t bytes) {
    std::lock_guard<std::mutex> lk(mu_);
    std::unique_ptr<Pending> p;
    auto it = pending_.find(key(handle, bytes));
    if (it != pending_.end()) {
      p = std::move(it->second);
      pending_.erase(it);
    }
    for (auto a = pending_.begin(); a != pending_.end();)
      a = a->second->deadline.expired() ? pending_.erase(a) : std::next(a);
    return p;
  }
  // Keeps p, not yet connected, for this thread's next call with the same handle bytes.
  void keep(const void* handle, size_t bytes, std::unique_ptr<Pending> p) {
    std::lock_guard<std::mutex> lk(mu_);
    pending_[key(handle, bytes)] = std::move(p);
  }
  // No connect is pending (on any thread).
  bool empty() {
    std::lock_guard<std::mutex> lk(mu_);
    return pending_.empty();
  }

 private:
  using Key = std::pair<std::thread::id, std::string>;
  static Key key(const void* handle, size_t bytes) {
    return Key(std::this_thread::get_id(), std::string(static_cast<const char*>(handle), bytes));
  }
  std::mutex mu_;
  std::map<Key, std::unique_ptr<Pending>> pending_;
};

// Nonblocking partial I/O: bytes moved (0 if it would block), or an error; a peer that closed
// the connection is an error (kRemote) "connection closed by peer".
Result<size_t> sendSome(int fd, const void* data, size_t bytes);
Result<size_t> recvSome(int fd, void* data, size_t bytes);
// sendSome over several buffers in one system call (sendmsg); same contract.
Result<size_t> sendvSome(int fd, const struct iovec* iov, int count);

// Moves all bytes on a nonblocking (or blocking) fd, polling until the deadline (kTimeout) or until
// abort is raised (kAborted; checked at least every 100 ms).
Status sendAll(int fd, const void* data, size_t bytes, const Deadline& deadline,
               AbortFlags abort = AbortFlags());
Status recvAll(int fd, void* data, size_t bytes, const Deadline& deadline,
               AbortFlags abort = AbortFlags());

// How long an incoming connection on a transport's listener (socket, InfiniBand) may take to
// complete its handshake before it is dropped: min(LOOM_TIMEOUT, 30 s), so that a stranger that
// connects and stays silent holds its slot for a bounded time.
int64_t listenerHandshakeTimeoutMs();

// Random bytes from the kernel (getrandom), for secrets.
uint64_t randomU64();

}  // namespace loom
