#include "transports/socket/socket_transport.h"

#include <limits.h>
#include <poll.h>
#include <stdlib.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <fstream>
#include <unordered_map>
#include <utility>
#include <vector>

#include "src/core/clock.h"
#include "src/core/log.h"
#include "src/core/params.h"
#include "transports/socket/socket_comm.h"
#include "transports/socket/socket_util.h"
#include "transports/socket/socket_wire.h"

namespace loom {
namespace net {
namespace {

constexpr int kMaxAcceptsPerCall = 256;
constexpr int kDefaultSpeedMbps = 10000;

int nsocksParam() {
  return static_cast<int>(std::clamp<int64_t>(params::kSocketNsocks.asInt(), 1, kSocketMaxSocks));
}

SocketComm::Options commOptions() {
  SocketComm::Options o;
  o.nthreads =
      static_cast<int>(std::clamp<int64_t>(params::kSocketNthreads.asInt(), 0, kSocketMaxSocks));
  o.maxInflight = static_cast<int>(std::clamp<int64_t>(params::kMaxInflight.asInt(), 1, 65536));
  o.minSplit = params::kSocketMinSplit.asInt();
  return o;
}

std::string readSysfs(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  if (!(in >> s)) return std::string();
  return s;
}

struct MemoryHandle {
  void* data;
  size_t size;
};

// An accepted socket whose Hello has not fully arrived.
struct HalfOpen {
  Fd fd;
  SockAddr peer;
  SocketHello hello{};
  size_t got = 0;
  int64_t deadlineNs = 0;
};

// Sockets of one incoming connection, gathered by connection id.
struct Gathering {
  std::vector<Fd> socks;
  int arrived = 0;
  SockAddr peer;
  int64_t deadlineNs = 0;
};

struct SocketListener {
  int dev = 0;
  std::string ifname;
  Fd fd;
  SockAddr addr;
  uint64_t secret = 0;
  std::vector<HalfOpen> halfOpen;
  std::unordered_map<uint64_t, Gathering> gathering;
  std::deque<std::unique_ptr<SocketComm>> ready;
};

// A connect in progress: connect() is called again until it completes.
struct PendingConnect {
  SockAddr addr;
  std::string addrText;
  std::vector<Fd> fds;
  std::vector<SocketHello> hello;
  std::vector<size_t> sent;
  std::vector<bool> connected;
  Deadline deadline = Deadline::never();
};

class SocketTransport final : public Transport {
 public:
  explicit SocketTransport(std::vector<Interface> ifs) : ifs_(std::move(ifs)) {
    for (const auto& itf : ifs_) props_.push_back(probe(itf));
  }

  const char* name() const override { return "Socket"; }
  int devices() const override { return static_cast<int>(ifs_.size()); }

  Status getProperties(int dev, Properties* props) const override {
    LOOM_TRY(checkDev(dev));
    *props = props_[dev];
    return Status();
  }

  Status listen(int dev, Handle* handle, void** listener) override;
  Status connect(int dev, const Handle& handle, void** sendConn) override;
  Status accept(void* listener, void** recvConn) override;

  Status regMr(void* comm, void* data, size_t size, int type, void** mhandle) override;
  Status deregMr(void* comm, void* mhandle) override;

  Status isend(void* sendConn, const void* data, size_t size, int tag, void* mhandle,
               void** request) override {
    *request = nullptr;
    LOOM_ASSIGN(SocketComm * c, commOf(sendConn, SocketComm::Role::kSend, "isend"));
    return c->isend(data, size, tag, request);
  }
  Status irecv(void* recvConn, int n, void** data, const size_t* sizes, const int* tags,
               void** mhandles, void** request) override {
    *request = nullptr;
    LOOM_ASSIGN(SocketComm * c, commOf(recvConn, SocketComm::Role::kRecv, "irecv"));
    return c->irecv(n, data, sizes, tags, request);
  }
  Status test(void* request, int* done, size_t* sizes) override {
    *done = 0;
    auto* r = static_cast<SocketRequest*>(request);
    if (r == nullptr || !r->inUse || r->comm == nullptr)
      return LOOM_ERROR(kInvalidArgument, "socket transport: test of an invalid request");
    return r->comm->test(r, done, sizes);
  }

  Status closeSend(void* sendConn) override {
    if (sendConn) delete static_cast<SocketComm*>(sendConn);
    return Status();
  }
  Status closeRecv(void* recvConn) override {
    if (recvConn) delete static_cast<SocketComm*>(recvConn);
    return Status();
  }
  Status closeListen(void* listener) override {
    delete static_cast<SocketListener*>(listener);
    return Status();
  }

  void waitActivity(void* const* requests, int n, void* listener, int timeoutMs) override;

 private:
  static Properties probe(const Interface& itf);
  Status checkDev(int dev) const {
    if (dev < 0 || dev >= devices())
      return LOOM_ERROR(kInvalidArgument, "socket transport: device {} out of range (0..{})", dev,
                        devices() - 1);
    return Status();
  }
  static Result<SocketComm*> commOf(void* comm, SocketComm::Role role, const char* what) {
    auto* c = static_cast<SocketComm*>(comm);
    if (c == nullptr)
      return LOOM_ERROR(kInvalidArgument, "socket transport: {} on a null comm", what);
    if (c->role() != role)
      return LOOM_ERROR(kInvalidUsage, "socket transport: {} on a comm of the other direction ({})",
                        what, c->peer());
    return c;
  }
  // Progresses one connect; true once every socket is connected and its Hello written.
  static Result<bool> progressConnect(PendingConnect* pc);
  static void acceptPending(SocketListener* l);
  static void readHellos(SocketListener* l);
  static Status admit(SocketListener* l, HalfOpen* h);
  static void expire(SocketListener* l);

  std::vector<Interface> ifs_;
  std::vector<Properties> props_;
  PendingConnects<PendingConnect> connecting_;
};

Properties SocketTransport::probe(const Interface& itf) {
  Properties p;
  p.name = itf.name;
  std::string sys = "/sys/class/net/" + itf.name;
  char real[PATH_MAX];
  if (::realpath((sys + "/device").c_str(), real) != nullptr) p.pciPath = real;
  p.speedMbps = kDefaultSpeedMbps;
  std::string speed = readSysfs(sys + "/speed");
  if (!speed.empty()) {
    char* end = nullptr;
    long v = std::strtol(speed.c_str(), &end, 10);
    if (*end == '\0' && v > 0 && v < INT_MAX) p.speedMbps = static_cast<int>(v);
  }
  p.guid = 0;
  p.ptrSupport = kPtrHost;
  p.port = 0;
  p.latencyUs = 0;
  p.maxComms = 65536;
  p.maxRecvs = kSocketMaxRecvs;
  p.maxP2pBytes = size_t(1) << 31;
  return p;
}

Status SocketTransport::listen(int dev, Handle* handle, void** listener) {
  *listener = nullptr;
  LOOM_TRY(checkDev(dev));
  if (handle == nullptr)
    return LOOM_ERROR(kInvalidArgument, "socket transport: listen with a null handle");
  auto l = std::make_unique<SocketListener>();
  l->dev = dev;
  l->ifname = ifs_[dev].name;
  SockAddr want = ifs_[dev].addr;
  want.setPort(0);
  auto fd = listenOn(want, &l->addr);
  if (!fd.isOk())
    return fd.status().withContext(fmt::format("socket transport: listen on {}", l->ifname));
  l->fd = std::move(fd).value();
  l->secret = randomU64();
  Status packed =
      writeListenHandle<SocketHandle>(kSocketHandleMagic, l->secret, l->addr, handle->bytes);
  if (!packed.isOk()) return packed.withContext("socket transport");
  LOOM_INFO(kSubNet, "socket transport: listening on {} {}", l->ifname, l->addr.toString());
  *listener = l.release();
  return Status();
}

Status SocketTransport::connect(int dev, const Handle& handle, void** sendConn) {
  *sendConn = nullptr;
  LOOM_TRY(checkDev(dev));
  SocketHandle h;
  SockAddr addr;
  Status valid = readListenHandle(kSocketHandleMagic, handle.bytes, &h, &addr);
  if (!valid.isOk())
    return valid.withContext("socket transport: connect with a handle that is not a listener's");
  std::unique_ptr<PendingConnect> pc = connecting_.take(handle.bytes, sizeof(h));
  if (!pc) {
    pc = std::make_unique<PendingConnect>();
    pc->addr = addr;
    pc->addrText = pc->addr.toString();
    const int nsocks = nsocksParam();
    const uint64_t connId = randomU64();
    for (int i = 0; i < nsocks; ++i) {
      auto fd = startConnect(pc->addr);
      if (!fd.isOk()) return fd.status().withContext("socket transport");
      pc->fds.push_back(std::move(fd).value());
      pc->hello.push_back(SocketHello{kSocketHelloMagic, h.secret, connId, kSocketWireVersion,
                                      static_cast<uint16_t>(i), static_cast<uint16_t>(nsocks)});
    }
    pc->sent.assign(nsocks, 0);
    pc->connected.assign(nsocks, false);
    pc->deadline = Deadline(defaultTimeoutMs());
  }
  LOOM_ASSIGN(bool connected, progressConnect(pc.get()));
  if (!connected) {
    connecting_.keep(handle.bytes, sizeof(h), std::move(pc));
    return Status();
  }
  LOOM_ASSIGN(auto comm, SocketComm::create(SocketComm::Role::kSend, std::move(pc->fds),
                                            pc->addrText, commOptions()));
  LOOM_INFO(kSubNet, "socket transport: connected to {} with {} socket(s)", pc->addrText,
            comm->nsocks());
  *sendConn = comm.release();
  return Status();
}

Result<bool> SocketTransport::progressConnect(PendingConnect* pc) {
  bool all = true;
  const int n = static_cast<int>(pc->fds.size());
  for (int i = 0; i < n; ++i) {
    if (!pc->connected[i]) {
      auto c = checkConnect(pc->fds[i].get());
      if (!c.isOk())
        return c.status().withContext(fmt::format(
            "socket transport: connect to {} failed (socket {} of {})", pc->addrText, i, n));
      if (!c.value()) {
        all = false;
        continue;
      }
      pc->connected[i] = true;
    }
    if (pc->sent[i] < sizeof(SocketHello)) {
      auto r = sendSome(pc->fds[i].get(), reinterpret_cast<char*>(&pc->hello[i]) + pc->sent[i],
                        sizeof(SocketHello) - pc->sent[i]);
      if (!r.isOk())
        return r.status().withContext(fmt::format(
            "socket transport: handshake with {} failed (socket {} of {})", pc->addrText, i, n));
      pc->sent[i] += r.value();
      if (pc->sent[i] < sizeof(SocketHello)) all = false;
    }
  }
  if (all) return true;
  if (pc->deadline.expired())
    return LOOM_ERROR(kTimeout,
                      "socket transport: connect to {} timed out after {} ms (LOOM_TIMEOUT)",
                      pc->addrText, pc->deadline.timeoutMs());
  return false;
}

Status SocketTransport::accept(void* listener, void** recvConn) {
  *recvConn = nullptr;
  auto* l = static_cast<SocketListener*>(listener);
  if (l == nullptr)
    return LOOM_ERROR(kInvalidArgument, "socket transport: accept on a null listener");
  acceptPending(l);
  readHellos(l);
  expire(l);
  if (!l->ready.empty()) {
    *recvConn = l->ready.front().release();
    l->ready.pop_front();
  }
  return Status();
}

void SocketTransport::acceptPending(SocketListener* l) {
  const int64_t deadline = nowNs() + listenerHandshakeTimeoutMs() * 1000000;
  for (int k = 0; k < kMaxAcceptsPerCall; ++k) {
    HalfOpen h;
    auto fd = tryAccept(l->fd.get(), &h.peer);
    if (!fd.isOk()) {
      // Out of fds and the like: leave the rest in the backlog and try again on the next call.
      LOOM_WARN("socket transport: accept on {} {}: {}", l->ifname, l->addr.toString(),
                fd.status().message());
      return;
    }
    if (!fd.value().valid()) return;
    h.fd = std::move(fd).value();
    h.deadlineNs = deadline;
    LOOM_TRACE(kSubNet, "socket transport: {} accepted a socket from {}", l->addr.toString(),
               h.peer.toString());
    l->halfOpen.push_back(std::move(h));
  }
}

void SocketTransport::readHellos(SocketListener* l) {
  const int64_t now = nowNs();
  auto& v = l->halfOpen;
  for (size_t k = 0; k < v.size();) {
    HalfOpen& h = v[k];
    auto r =
        recvSome(h.fd.get(), reinterpret_cast<char*>(&h.hello) + h.got, sizeof(h.hello) - h.got);
    Status drop;
    if (!r.isOk()) {
      drop = r.status();
    } else {
      h.got += r.value();
      if (h.got == sizeof(h.hello))
        drop = admit(l, &h);
      else if (now >= h.deadlineNs)
        drop = LOOM_ERROR(kTimeout, "no handshake within {} ms ({} of {} bytes)",
                          listenerHandshakeTimeoutMs(), h.got, sizeof(h.hello));
      else {
        ++k;
        continue;
      }
    }
    if (!drop.isOk())
      LOOM_WARN("socket transport: dropping connection from {} to {} {}: {}", h.peer.toString(),
                l->ifname, l->addr.toString(), drop.message());
    v[k] = std::move(v.back());
    v.pop_back();
  }
}

// Takes a socket whose Hello arrived: either into its connection's gathering (OK), or an error
// saying why it was dropped (its fd is then closed by the caller).
Status SocketTransport::admit(SocketListener* l, HalfOpen* h) {
  const SocketHello& m = h->hello;
  LOOM_TRY(checkHello(m, l->secret));
  auto it = l->gathering.find(m.connId);
  if (it == l->gathering.end()) {
    Gathering g;
    g.socks.resize(m.nsocks);
    g.peer = h->peer;
    g.deadlineNs = h->deadlineNs;
    it = l->gathering.emplace(m.connId, std::move(g)).first;
  }
  Gathering& g = it->second;
  if (static_cast<int>(g.socks.size()) != m.nsocks || g.socks[m.index].valid())
    return LOOM_ERROR(kRemote, "socket {} of {} does not fit connection {:#x} ({} sockets)",
                      m.index, m.nsocks, m.connId, g.socks.size());
  g.socks[m.index] = std::move(h->fd);
  if (m.index == 0) g.peer = h->peer;
  if (++g.arrived < m.nsocks) return Status();
  std::string peer = g.peer.toString();
  std::vector<Fd> socks = std::move(g.socks);
  l->gathering.erase(it);
  auto comm = SocketComm::create(SocketComm::Role::kRecv, std::move(socks), peer, commOptions());
  if (!comm.isOk()) {
    LOOM_WARN("socket transport: cannot set up the connection from {}: {}", peer,
              comm.status().message());
    return Status();
  }
  LOOM_INFO(kSubNet, "socket transport: accepted a connection from {} with {} socket(s) on {}",
            peer, m.nsocks, l->addr.toString());
  l->ready.push_back(std::move(comm).value());
  return Status();
}

void SocketTransport::expire(SocketListener* l) {
  const int64_t now = nowNs();
  for (auto it = l->gathering.begin(); it != l->gathering.end();) {
    if (now < it->second.deadlineNs) {
      ++it;
      continue;
    }
    LOOM_WARN(
        "socket transport: dropping connection from {} to {}: only {} of {} sockets arrived "
        "within {} ms",
        it->second.peer.toString(), l->addr.toString(), it->second.arrived, it->second.socks.size(),
        listenerHandshakeTimeoutMs());
    it = l->gathering.erase(it);
  }
}

Status SocketTransport::regMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  *mhandle = nullptr;
  if (type == kPtrCuda || type == kPtrDmabuf)
    return LOOM_ERROR(kInvalidArgument, "socket transport: device memory is not supported");
  if (type != kPtrHost)
    return LOOM_ERROR(kInvalidArgument, "socket transport: unknown memory type {}", type);
  if (data == nullptr && size > 0)
    return LOOM_ERROR(kInvalidArgument,
                      "socket transport: registration of {} bytes at a null pointer", size);
  *mhandle = new MemoryHandle{data, size};
  return Status();
}

Status SocketTransport::deregMr(void* comm, void* mhandle) {
  delete static_cast<MemoryHandle*>(mhandle);
  return Status();
}

void SocketTransport::waitActivity(void* const* requests, int n, void* listener, int timeoutMs) {
  std::vector<pollfd> fds;
  std::vector<SocketComm*> waiting;  // comms between beginWait and endWait
  bool ready = false;
  for (int k = 0; k < n && !ready; ++k) {
    auto* r = static_cast<SocketRequest*>(requests[k]);
    if (r == nullptr || !r->inUse) continue;
    SocketComm* c = r->comm;
    if (std::find(waiting.begin(), waiting.end(), c) == waiting.end()) {
      c->beginWait();
      waiting.push_back(c);
    }
    if (!c->addWaitFds(r, &fds)) ready = true;
  }
  if (listener != nullptr && !ready) {
    auto* l = static_cast<SocketListener*>(listener);
    if (!l->ready.empty()) ready = true;
    fds.push_back({l->fd.get(), POLLIN, 0});
    int64_t now = nowNs();
    for (const auto& h : l->halfOpen) {
      fds.push_back({h.fd.get(), POLLIN, 0});
      timeoutMs = static_cast<int>(
          std::min<int64_t>(timeoutMs, std::max<int64_t>(0, (h.deadlineNs - now) / 1000000 + 1)));
    }
    for (const auto& g : l->gathering)
      timeoutMs = static_cast<int>(std::min<int64_t>(
          timeoutMs, std::max<int64_t>(0, (g.second.deadlineNs - now) / 1000000 + 1)));
  }
  if (!ready && timeoutMs > 0) {
    // Several requests of one comm may name the same fd: merge so poll sees each fd once.
    std::sort(fds.begin(), fds.end(), [](const pollfd& a, const pollfd& b) { return a.fd < b.fd; });
    size_t m = 0;
    for (size_t k = 0; k < fds.size(); ++k) {
      if (m > 0 && fds[m - 1].fd == fds[k].fd)
        fds[m - 1].events |= fds[k].events;
      else
        fds[m++] = fds[k];
    }
    fds.resize(m);
    ::poll(fds.data(), fds.size(), timeoutMs);
  }
  for (SocketComm* c : waiting) c->endWait();
}

}  // namespace
}  // namespace net

std::unique_ptr<net::Transport> makeSocketTransport() {
  const std::string spec = params::kSocketIfname.str();
  const int family = socketFamilyParam();
  std::vector<Interface> ifs;
  for (auto& itf : findInterfaces(spec, family)) {
    bool seen = false;
    for (const auto& o : ifs) seen |= o.name == itf.name;
    if (!seen) ifs.push_back(itf);  // one device per interface, its first (IPv4) address
  }
  if (ifs.empty()) {
    LOOM_WARN(
        "socket transport: no usable network interface (LOOM_SOCKET_IFNAME='{}', "
        "LOOM_SOCKET_FAMILY='{}')",
        spec, params::kSocketFamily.str());
    return nullptr;
  }
  for (size_t d = 0; d < ifs.size(); ++d)
    LOOM_INFO(kSubNet, "socket transport: device {} is {} {}", d, ifs[d].name,
              ifs[d].addr.toString());
  return std::make_unique<net::SocketTransport>(std::move(ifs));
}

}  // namespace loom
