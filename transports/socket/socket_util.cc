#include "transports/socket/socket_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <thread>

#include "src/core/log.h"
#include "src/core/params.h"

namespace loom {

int SockAddr::port() const {
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port);
  return 0;
}

void SockAddr::setPort(int port) {
  if (ss.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&ss)->sin_port = htons(port);
  if (ss.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port = htons(port);
}

bool SockAddr::isLoopback() const {
  if (ss.ss_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr.s_addr) >> 24) == 127;
  if (ss.ss_family == AF_INET6)
    return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr);
  return false;
}

std::string SockAddr::toString() const {
  char host[INET6_ADDRSTRLEN] = "?";
  if (ss.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, host, sizeof(host));
    return fmt::format("{}:{}", host, port());
  }
  if (ss.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr, host, sizeof(host));
    return fmt::format("[{}]:{}", host, port());
  }
  return "<no address>";
}

Result<SockAddr> resolveHost(const std::string& host, int port) {
  if (port < 0 || port > 65535) return LOOM_ERROR(kInvalidArgument, "port {} out of range", port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr)
    return LOOM_ERROR(kInvalidArgument, "cannot resolve host '{}': {}", host, gai_strerror(rc));
  SockAddr a;
  // Prefer IPv4 when a name resolves to both.
  addrinfo* pick = res;
  for (addrinfo* p = res; p; p = p->ai_next)
    if (p->ai_family == AF_INET) {
      pick = p;
      break;
    }
  std::memcpy(&a.ss, pick->ai_addr, pick->ai_addrlen);
  a.len = pick->ai_addrlen;
  freeaddrinfo(res);
  a.setPort(port);
  return a;
}

Result<SockAddr> parseSockAddr(const std::string& text) {
  std::string host, portText;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      return LOOM_ERROR(kInvalidArgument, "malformed address '{}': expected [ipv6]:port", text);
    host = text.substr(1, close - 1);
    portText = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string::npos || colon == 0)
      return LOOM_ERROR(kInvalidArgument, "malformed address '{}': expected host:port", text);
    host = text.substr(0, colon);
    portText = text.substr(colon + 1);
    if (host.find(':') != std::string::npos)
      return LOOM_ERROR(kInvalidArgument, "malformed address '{}': IPv6 needs [brackets]", text);
  }
  char* end = nullptr;
  long port = std::strtol(portText.c_str(), &end, 10);
  if (portText.empty() || *end != '\0' || port <= 0 || port > 65535)
    return LOOM_ERROR(kInvalidArgument, "malformed address '{}': bad port '{}'", text, portText);
  return resolveHost(host, static_cast<int>(port));
}

bool matchIfName(const std::string& name, const std::string& specIn) {
  std::string spec = specIn;
  bool exclude = false, exact = false;
  if (!spec.empty() && spec[0] == '^') exclude = true, spec = spec.substr(1);
  if (!spec.empty() && spec[0] == '=') exact = true, spec = spec.substr(1);
  bool matched = false;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    // NCCL also accepts "name:port" items; the port part is ignored here.
    size_t colon = item.find(':');
    if (colon != std::string::npos) item = item.substr(0, colon);
    if (exact ? name == item : name.compare(0, item.size(), item) == 0) {
      matched = true;
      break;
    }
  }
  return exclude ? !matched : matched;
}

namespace {

int specRank(const std::string& name, const std::string& specIn) {
  // Position of the first matching item in the spec (for ordering); large if none.
  std::string spec = specIn;
  if (!spec.empty() && spec[0] == '^') return 0;
  if (!spec.empty() && spec[0] == '=') spec = spec.substr(1);
  std::stringstream ss(spec);
  std::string item;
  int i = 0;
  while (std::getline(ss, item, ',')) {
    if (!item.empty() && name.compare(0, item.size(), item) == 0) return i;
    ++i;
  }
  return i;
}

}  // namespace

std::vector<Interface> findInterfaces(const std::string& spec, int family) {
  std::vector<Interface> all;
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return all;
  for (ifaddrs* p = ifs; p; p = p->ifa_next) {
    if (!p->ifa_addr || !(p->ifa_flags & IFF_UP)) continue;
    int fam = p->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    if (family != AF_UNSPEC && fam != family) continue;
    if (fam == AF_INET6) {
      auto* a6 = reinterpret_cast<sockaddr_in6*>(p->ifa_addr);
      if (IN6_IS_ADDR_LINKLOCAL(&a6->sin6_addr)) continue;  // needs a scope id; skip like NCCL
    }
    Interface itf;
    itf.name = p->ifa_name;
    itf.addr.len = fam == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    std::memcpy(&itf.addr.ss, p->ifa_addr, itf.addr.len);
    all.push_back(itf);
  }
  freeifaddrs(ifs);
  std::vector<Interface> out;
  if (!spec.empty()) {
    for (auto& i : all)
      if (matchIfName(i.name, spec)) out.push_back(i);
  } else {
    for (auto& i : all)
      if (!matchIfName(i.name, "docker,lo,virbr")) out.push_back(i);
    if (out.empty())
      for (auto& i : all)
        if (matchIfName(i.name, "lo")) out.push_back(i);
  }
  std::stable_sort(out.begin(), out.end(), [&](const Interface& a, const Interface& b) {
    int ra = specRank(a.name, spec), rb = specRank(b.name, spec);
    if (ra != rb) return ra < rb;
    if (a.name != b.name) return a.name < b.name;
    return a.addr.family() == AF_INET && b.addr.family() != AF_INET;
  });
  return out;
}

int socketFamilyParam() {
  const std::string fam = params::kSocketFamily.str();
  if (fam == "AF_INET" || fam == "4") return AF_INET;
  if (fam == "AF_INET6" || fam == "6") return AF_INET6;
  return AF_UNSPEC;
}

Result<Interface> defaultInterface() {
  std::string spec = params::kSocketIfname.str();
  auto ifs = findInterfaces(spec, socketFamilyParam());
  if (ifs.empty())
    return LOOM_ERROR(
        kSystem, "no usable network interface (LOOM_SOCKET_IFNAME='{}', LOOM_SOCKET_FAMILY='{}')",
        spec, params::kSocketFamily.str());
  return ifs.front();
}

Result<Interface> interfaceFor(const SockAddr& remote) {
  if (remote.isLoopback() && !params::kSocketIfname.isSet()) {
    auto lo = findInterfaces("lo", remote.family());
    if (!lo.empty()) return lo.front();
  }
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) == 0) {
    for (ifaddrs* p = ifs; p; p = p->ifa_next) {
      if (!p->ifa_addr || !p->ifa_netmask || !(p->ifa_flags & IFF_UP)) continue;
      if (p->ifa_addr->sa_family != AF_INET || remote.family() != AF_INET) continue;
      uint32_t a = reinterpret_cast<sockaddr_in*>(p->ifa_addr)->sin_addr.s_addr;
      uint32_t m = reinterpret_cast<sockaddr_in*>(p->ifa_netmask)->sin_addr.s_addr;
      uint32_t r = reinterpret_cast<const sockaddr_in*>(&remote.ss)->sin_addr.s_addr;
      if ((a & m) == (r & m) && matchIfName(p->ifa_name, params::kSocketIfname.str().empty()
                                                             ? std::string("^=")
                                                             : params::kSocketIfname.str())) {
        Interface itf;
        itf.name = p->ifa_name;
        itf.addr.len = sizeof(sockaddr_in);
        std::memcpy(&itf.addr.ss, p->ifa_addr, itf.addr.len);
        freeifaddrs(ifs);
        return itf;
      }
    }
    freeifaddrs(ifs);
  }
  return defaultInterface();
}

Status decodeListenAddr(uint64_t magic, uint64_t handleMagic, const unsigned char* raw,
                        uint32_t addrLen, size_t capacity, SockAddr* addr) {
  if (handleMagic != magic)
    return LOOM_ERROR(kInvalidArgument,
                      "the handle's magic is {:#x}, not {:#x} (another transport's handle, or "
                      "garbage)",
                      handleMagic, magic);
  *addr = SockAddr();
  if (addrLen == 0 || addrLen > capacity || addrLen > sizeof(addr->ss))
    return LOOM_ERROR(kInvalidArgument, "the handle's address has {} bytes", addrLen);
  std::memcpy(&addr->ss, raw, addrLen);
  addr->len = addrLen;
  const int family = addr->family();
  if (!((family == AF_INET && addrLen == sizeof(sockaddr_in)) ||
        (family == AF_INET6 && addrLen == sizeof(sockaddr_in6)))) {
    *addr = SockAddr();
    return LOOM_ERROR(kInvalidArgument,
                      "the handle holds no IPv4 or IPv6 address (family {}, {} bytes)", family,
                      addrLen);
  }
  if (addr->port() == 0) {
    *addr = SockAddr();
    return LOOM_ERROR(kInvalidArgument, "the handle's address has port 0");
  }
  return Status();
}

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

Status setNonBlocking(int fd) {
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
    return systemError("fcntl(O_NONBLOCK)", errno);
  return Status();
}

Status setNoDelay(int fd) {
  int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0)
    return systemError("setsockopt(TCP_NODELAY)", errno);
  return Status();
}

Result<Fd> listenOn(const SockAddr& addr, SockAddr* bound, int backlog) {
  Fd fd(::socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return systemError("socket", errno);
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr.ss), addr.len) < 0)
    return systemError(fmt::format("bind to {}", addr.toString()), errno);
  if (::listen(fd.get(), backlog) < 0) return systemError("listen", errno);
  LOOM_TRY(setNonBlocking(fd.get()));
  if (bound) {
    bound->len = sizeof(bound->ss);
    if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound->ss), &bound->len) < 0)
      return systemError("getsockname", errno);
  }
  return fd;
}

Result<Fd> startConnect(const SockAddr& addr) {
  Fd fd(::socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return systemError("socket", errno);
  LOOM_TRY(setNoDelay(fd.get()));
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr.ss), addr.len) < 0 &&
      errno != EINPROGRESS)
    return systemError(fmt::format("connect to {}", addr.toString()), errno);
  return fd;
}

Result<bool> checkConnect(int fd) {
  pollfd p{fd, POLLOUT, 0};
  int rc = ::poll(&p, 1, 0);
  if (rc < 0) return systemError("poll", errno);
  if (rc == 0) return false;
  int err = 0;
  socklen_t len = sizeof(err);
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) return systemError("getsockopt", errno);
  if (err != 0) return systemError("connect", err);
  return true;
}

Result<Fd> tryAccept(int listenFd, SockAddr* peer) {
  SockAddr tmp;
  SockAddr* p = peer ? peer : &tmp;
  p->len = sizeof(p->ss);
  int fd = ::accept4(listenFd, reinterpret_cast<sockaddr*>(&p->ss), &p->len,
                     SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED)
      return Fd();
    return systemError("accept", errno);
  }
  Fd out(fd);
  LOOM_TRY(setNoDelay(fd));
  return out;
}

Result<Fd> connectWithRetry(const SockAddr& addr, const Deadline& deadline, AbortFlags abort) {
  int delayMs = 1;
  Status last;
  while (true) {
    if (abort.raised())
      return LOOM_ERROR(kAborted, "aborted while connecting to {}", addr.toString());
    auto fdr = startConnect(addr);
    if (!fdr.isOk()) return fdr.status();
    Fd fd = std::move(fdr).value();
    while (true) {
      auto c = checkConnect(fd.get());
      if (!c.isOk()) {
        last = c.status();
        break;
      }
      if (c.value()) return fd;
      if (deadline.expired()) break;
      if (abort.raised()) break;
      pollfd p{fd.get(), POLLOUT, 0};
      ::poll(&p, 1, std::min(deadline.remainingMs(100), 100));
    }
    if (deadline.expired())
      return LOOM_ERROR(kTimeout, "could not connect to {} within {} ms{}", addr.toString(),
                        deadline.timeoutMs(),
                        last.isOk() ? "" : " (last error: " + last.message() + ")");
    std::this_thread::sleep_for(
        std::chrono::milliseconds(std::min(delayMs, deadline.remainingMs(100))));
    delayMs = std::min(delayMs * 2, 100);
  }
}

Result<size_t> sendSome(int fd, const void* data, size_t bytes) {
  if (bytes == 0) return size_t(0);
  ssize_t n = ::send(fd, data, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n >= 0) return static_cast<size_t>(n);
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return size_t(0);
  if (errno == EPIPE || errno == ECONNRESET)
    return Status(Code::kRemote, std::string("connection closed by peer (") + strerror(errno) + ")")
        .withCause(Cause::kPeerGone);
  return systemError("send", errno);
}

Result<size_t> sendvSome(int fd, const struct iovec* iov, int count) {
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(iov);
  msg.msg_iovlen = static_cast<size_t>(count);
  ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n >= 0) return static_cast<size_t>(n);
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return size_t(0);
  if (errno == EPIPE || errno == ECONNRESET)
    return Status(Code::kRemote, std::string("connection closed by peer (") + strerror(errno) + ")")
        .withCause(Cause::kPeerGone);
  return systemError("sendmsg", errno);
}

Result<size_t> recvSome(int fd, void* data, size_t bytes) {
  if (bytes == 0) return size_t(0);
  ssize_t n = ::recv(fd, data, bytes, MSG_DONTWAIT);
  if (n > 0) return static_cast<size_t>(n);
  if (n == 0) return Status(Code::kRemote, "connection closed by peer").withCause(Cause::kPeerGone);
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return size_t(0);
  if (errno == ECONNRESET)
    return Status(Code::kRemote, "connection reset by peer").withCause(Cause::kPeerGone);
  return systemError("recv", errno);
}

namespace {

template <typename Fn>
Status moveAll(int fd, size_t bytes, short events, const Deadline& deadline,
               const AbortFlags& abort, const char* what, Fn&& fn) {
  size_t done = 0;
  while (done < bytes) {
    auto r = fn(done);
    if (!r.isOk()) return r.status();
    done += r.value();
    if (done == bytes) break;
    if (r.value() > 0) continue;
    if (abort.raised()) return LOOM_ERROR(kAborted, "aborted during {}", what);
    if (deadline.expired())
      return LOOM_ERROR(kTimeout, "{} timed out after {} ms ({} of {} bytes)", what,
                        deadline.timeoutMs(), done, bytes);
    pollfd p{fd, events, 0};
    ::poll(&p, 1, std::min(deadline.remainingMs(100), 100));
  }
  return Status();
}

}  // namespace

Status sendAll(int fd, const void* data, size_t bytes, const Deadline& deadline, AbortFlags abort) {
  const char* p = static_cast<const char*>(data);
  return moveAll(fd, bytes, POLLOUT, deadline, abort, "send",
                 [&](size_t done) { return sendSome(fd, p + done, bytes - done); });
}

Status recvAll(int fd, void* data, size_t bytes, const Deadline& deadline, AbortFlags abort) {
  char* p = static_cast<char*>(data);
  return moveAll(fd, bytes, POLLIN, deadline, abort, "receive",
                 [&](size_t done) { return recvSome(fd, p + done, bytes - done); });
}

int64_t listenerHandshakeTimeoutMs() {
  constexpr int64_t kCapMs = 30000;
  int64_t t = defaultTimeoutMs();
  return t > 0 ? std::min(t, kCapMs) : kCapMs;
}

uint64_t randomU64() {
  uint64_t v = 0;
  if (getrandom(&v, sizeof(v), 0) != sizeof(v))
    v = static_cast<uint64_t>(nowNs()) * 0x9e3779b97f4a7c15ull ^ getpid();
  return v;
}

}  // namespace loom
