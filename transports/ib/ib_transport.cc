#include "transports/ib/ib_transport.h"

#include <poll.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "src/core/clock.h"
#include "src/core/log.h"
#include "src/core/params.h"
#include "transports/ib/gdr.h"
#include "transports/ib/ib_comm.h"
#include "transports/ib/ib_device.h"
#include "transports/ib/ib_hca.h"
#include "transports/ib/ib_wire.h"
#include "transports/socket/socket_util.h"

namespace loom {
namespace ib {
namespace {

int qpsParam() {
  return static_cast<int>(std::clamp<int64_t>(params::kIbQpsPerConnection.asInt(), 1, kMaxQps));
}

// An incoming connection whose handshake is in progress.
struct Incoming {
  Fd fd;
  SockAddr peer;
  EndpointWire remote{};
  size_t got = 0;
  std::unique_ptr<Comm> comm;  // created once the connector's half arrived
  EndpointWire local{};
  size_t sent = 0;
  unsigned char ready = 0;
  bool complete = false;  // comm ready, waiting for an accept call to hand it out
  // Until the connector's half arrived and passed its checks (the peer knows the secret), the
  // connection is a stranger's: it has listenerHandshakeTimeoutMs() to get there. Then the whole
  // handshake has LOOM_TIMEOUT.
  Deadline strangerDeadline = Deadline::never();
  Deadline deadline = Deadline::never();
};

// Cap on the incoming connections whose handshake is in progress (each holds an fd).
constexpr size_t kMaxIncoming = 1024;

struct Listener {
  Port* port = nullptr;
  Fd fd;
  SockAddr addr;
  uint64_t secret = 0;
  std::vector<std::unique_ptr<Incoming>> incoming;
};

// A connect in progress (connect() is called again until it completes).
struct Outgoing {
  SockAddr addr;
  Fd fd;
  bool connected = false;
  std::unique_ptr<Comm> comm;
  EndpointWire local{};
  size_t sent = 0;
  EndpointWire remote{};
  size_t got = 0;
  bool readySent = false;
  Deadline deadline = Deadline::never();
};

class IbTransport final : public net::Transport {
 public:
  explicit IbTransport(std::vector<std::unique_ptr<Device>> devices)
      : devices_(std::move(devices)) {
    for (auto& d : devices_)
      for (auto& p : d->ports) ports_.push_back(p.get());
  }

  const char* name() const override { return "IB"; }
  int devices() const override { return static_cast<int>(ports_.size()); }
  Status getProperties(int dev, net::Properties* props) const override;

  Status listen(int dev, net::Handle* handle, void** listener) override;
  Status connect(int dev, const net::Handle& handle, void** sendConn) override;
  Status accept(void* listener, void** recvConn) override;

  Status regMr(void* comm, void* data, size_t size, int type, void** mhandle) override;
  Status regMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                     void** mhandle) override;
  Status deregMr(void* comm, void* mhandle) override;
  Status holdMemory(int dev, const void* data, size_t size, int type, void** hold) override;
  void releaseMemory(void* hold) override { (void)deregMr(nullptr, hold); }

  Status isend(void* sendConn, const void* data, size_t size, int tag, void* mhandle,
               void** request) override {
    *request = nullptr;
    if (sendConn == nullptr)
      return LOOM_ERROR(kInvalidArgument, "InfiniBand: isend on a null comm");
    return static_cast<Comm*>(sendConn)->isend(data, size, tag, static_cast<MemHandle*>(mhandle),
                                               request);
  }
  Status irecv(void* recvConn, int n, void** data, const size_t* sizes, const int* tags,
               void** mhandles, void** request) override {
    *request = nullptr;
    if (recvConn == nullptr)
      return LOOM_ERROR(kInvalidArgument, "InfiniBand: irecv on a null comm");
    if (data == nullptr || sizes == nullptr || tags == nullptr)
      return LOOM_ERROR(kInvalidArgument, "InfiniBand: irecv with null buffers, sizes or tags");
    return static_cast<Comm*>(recvConn)->irecv(n, data, sizes, tags,
                                               reinterpret_cast<MemHandle**>(mhandles), request);
  }
  Status iflush(void* recvConn, int n, void** data, const size_t* sizes, void** mhandles,
                void** request) override {
    *request = nullptr;
    if (recvConn == nullptr)
      return LOOM_ERROR(kInvalidArgument, "InfiniBand: iflush on a null comm");
    return static_cast<Comm*>(recvConn)->iflush(n, data, sizes,
                                                reinterpret_cast<MemHandle**>(mhandles), request);
  }
  Status test(void* request, int* done, size_t* sizes) override {
    *done = 0;
    auto* r = static_cast<Request*>(request);
    if (r == nullptr || !r->inUse)
      return LOOM_ERROR(kInvalidArgument, "InfiniBand: test of an invalid request");
    return r->comm->test(r, done, sizes);
  }

  // Sleeps on the completion channels of the requests' comms where every one of them waits for a
  // completion; naps (net::idleNapNs) where one waits for something that comes without one, or a
  // connection is being made.
  void waitActivity(void* const* requests, int n, void* listener, int timeoutMs) override {
    waitActivityIdle(requests, n, listener, timeoutMs, 0);
  }
  void waitActivityIdle(void* const* requests, int n, void* listener, int timeoutMs,
                        int64_t idleNs) override;

  Status closeSend(void* sendConn) override {
    delete static_cast<Comm*>(sendConn);
    return Status();
  }
  Status closeRecv(void* recvConn) override {
    delete static_cast<Comm*>(recvConn);
    return Status();
  }
  Status closeListen(void* listener) override {
    delete static_cast<Listener*>(listener);
    return Status();
  }

 private:
  // regMr's, regMrDmaBuf's and holdMemory's registration of [data, data + size) on d (GPU memory
  // through the caller's dma-buf where dmabufFd >= 0): *mhandle a MemHandle.
  Status registerOn(Device* d, void* data, size_t size, int type, void** mhandle, int dmabufFd = -1,
                    uint64_t dmabufOffset = 0);
  Status checkDev(int dev) const {
    if (dev < 0 || dev >= devices())
      return LOOM_ERROR(kInvalidArgument, "InfiniBand: device {} out of range (0..{})", dev,
                        devices() - 1);
    return Status();
  }
  Result<bool> progressConnect(Outgoing* o);
  Result<bool> progressIncoming(Listener* l, Incoming* in);

  std::vector<std::unique_ptr<Device>> devices_;
  std::vector<Port*> ports_;
  PendingConnects<Outgoing> connecting_;
};

void IbTransport::waitActivityIdle(void* const* requests, int n, void* listener, int timeoutMs,
                                   int64_t idleNs) {
  std::vector<pollfd> fds;
  std::vector<Comm*> comms;
  bool nap = !connecting_.empty();
  for (int k = 0; k < n; ++k) {
    auto* r = static_cast<Request*>(requests[k]);
    if (r == nullptr || !r->inUse) continue;
    if (std::find(comms.begin(), comms.end(), r->comm) == comms.end()) {
      comms.push_back(r->comm);
      switch (r->comm->prepareWait(&fds)) {
        case Comm::WaitKind::kReady:
          return;
        case Comm::WaitKind::kNap:
          nap = true;
          break;
        case Comm::WaitKind::kSleep:
          break;
      }
    }
    if (r->done || !r->error.isOk()) return;  // test() finishes it now
  }
  if (listener != nullptr) {
    auto* l = static_cast<Listener*>(listener);
    fds.push_back({l->fd.get(), POLLIN, 0});
    nap = nap || !l->incoming.empty();
  }
  const int64_t limitNs = std::max(1, timeoutMs) * int64_t{1000000};
  const int64_t ns = nap ? net::idleNapNs(idleNs, limitNs) : limitNs;
  const timespec ts = timespecOfNs(ns);
  ::ppoll(fds.data(), fds.size(), &ts, nullptr);
}

Status IbTransport::getProperties(int dev, net::Properties* props) const {
  LOOM_TRY(checkDev(dev));
  const Port* p = ports_[dev];
  const Device* d = p->dev;
  net::Properties r;
  r.name = p->name();
  r.pciPath = d->pciPath();
  r.guid = d->guid();
  r.ptrSupport = net::kPtrHost;
  if (d->gdr().usable()) r.ptrSupport |= net::kPtrCuda;
  if (d->gdr().dmabuf) r.ptrSupport |= net::kPtrDmabuf;
  r.speedMbps = p->speedMbps;
  r.port = p->port;
  r.latencyUs = 0;  // not measured (NCCL reports 0 for IB too)
  const int qps = qpsParam() + 1;
  r.maxComms = d->attr().max_qp > 0 ? std::max(1, std::min(65536, d->attr().max_qp / qps)) : 65536;
  r.maxRecvs = kMaxRecvs;
  r.maxP2pBytes = size_t(1) << 31;
  *props = r;
  return Status();
}

Status IbTransport::listen(int dev, net::Handle* handle, void** listener) {
  *listener = nullptr;
  LOOM_TRY(checkDev(dev));
  if (handle == nullptr)
    return LOOM_ERROR(kInvalidArgument, "InfiniBand: listen with a null handle");
  LOOM_ASSIGN(Interface itf, defaultInterface());
  auto l = std::make_unique<Listener>();
  l->port = ports_[dev];
  SockAddr want = itf.addr;
  want.setPort(0);
  auto fd = listenOn(want, &l->addr);
  if (!fd.isOk()) return fd.status().withContext("InfiniBand: out-of-band listen");
  l->fd = std::move(fd).value();
  l->secret = randomU64();
  Status packed = writeListenHandle<IbHandle>(kIbHandleMagic, l->secret, l->addr, handle->bytes);
  if (!packed.isOk()) return packed.withContext("InfiniBand");
  LOOM_INFO(kSubNet, "InfiniBand: listening for {} on {}", l->port->name(), l->addr.toString());
  *listener = l.release();
  return Status();
}

Status IbTransport::connect(int dev, const net::Handle& handle, void** sendConn) {
  *sendConn = nullptr;
  LOOM_TRY(checkDev(dev));
  IbHandle h;
  SockAddr addr;
  Status valid = readListenHandle(kIbHandleMagic, handle.bytes, &h, &addr);
  if (!valid.isOk())
    return valid.withContext("InfiniBand: connect with a handle that is not a listener's");
  std::unique_ptr<Outgoing> o = connecting_.take(handle.bytes, sizeof(h));
  if (!o) {
    o = std::make_unique<Outgoing>();
    o->addr = addr;
    o->deadline = Deadline(defaultTimeoutMs());
    LOOM_ASSIGN(o->comm, Comm::create(Comm::Role::kSend, ports_[dev], qpsParam()));
    o->comm->describe(&o->local, h.secret);
    auto fd = startConnect(o->addr);
    if (!fd.isOk()) return fd.status().withContext("InfiniBand: out-of-band connect");
    o->fd = std::move(fd).value();
  }
  Result<bool> r = progressConnect(o.get());
  if (!r.isOk())
    return r.status().withContext(fmt::format("InfiniBand: connecting to {}", o->addr.toString()));
  if (!r.value()) {
    connecting_.keep(handle.bytes, sizeof(h), std::move(o));
    return Status();
  }
  *sendConn = o->comm.release();
  return Status();
}

Result<bool> IbTransport::progressConnect(Outgoing* o) {
  if (o->deadline.expired())
    return LOOM_ERROR(kTimeout, "handshake timed out after {} ms (LOOM_TIMEOUT)",
                      o->deadline.timeoutMs());
  if (!o->connected) {
    LOOM_ASSIGN(bool c, checkConnect(o->fd.get()));
    if (!c) return false;
    o->connected = true;
  }
  while (o->sent < sizeof(o->local)) {
    LOOM_ASSIGN(size_t n, sendSome(o->fd.get(), reinterpret_cast<char*>(&o->local) + o->sent,
                                   sizeof(o->local) - o->sent));
    if (n == 0) return false;
    o->sent += n;
  }
  while (o->got < sizeof(o->remote)) {
    LOOM_ASSIGN(size_t n, recvSome(o->fd.get(), reinterpret_cast<char*>(&o->remote) + o->got,
                                   sizeof(o->remote) - o->got));
    if (n == 0) return false;
    o->got += n;
    LOOM_TRY(checkEndpoint(o->remote, o->got, Side::kConnector, 0));
  }
  if (!o->readySent) {
    const EndpointWire& w = o->remote;
    LOOM_TRY(o->comm->connect(w, o->addr.toString()));
    unsigned char ready = 1;
    LOOM_TRY(sendAll(o->fd.get(), &ready, 1, o->deadline));
    o->readySent = true;
  }
  o->comm->attachSocket(std::move(o->fd));
  return true;
}

Status IbTransport::accept(void* listener, void** recvConn) {
  *recvConn = nullptr;
  auto* l = static_cast<Listener*>(listener);
  if (l == nullptr) return LOOM_ERROR(kInvalidArgument, "InfiniBand: accept on a null listener");
  for (int k = 0; k < 64; ++k) {
    SockAddr peer;
    auto fd = tryAccept(l->fd.get(), &peer);
    if (!fd.isOk()) {
      LOOM_WARN("InfiniBand: accept on {}: {}", l->addr.toString(), fd.status().message());
      break;
    }
    if (!fd.value().valid()) break;
    if (l->incoming.size() >= kMaxIncoming) {
      LOOM_WARN("InfiniBand: dropping the connection from {} on {}: {} handshakes already pending",
                peer.toString(), l->port->name(), l->incoming.size());
      continue;  // the Fd closes
    }
    auto in = std::make_unique<Incoming>();
    in->fd = std::move(fd).value();
    (void)setNonBlocking(in->fd.get());
    in->peer = peer;
    in->strangerDeadline = Deadline(listenerHandshakeTimeoutMs());
    in->deadline = Deadline(defaultTimeoutMs());
    l->incoming.push_back(std::move(in));
  }
  for (size_t i = 0; i < l->incoming.size();) {
    Incoming* in = l->incoming[i].get();
    Result<bool> r = progressIncoming(l, in);
    if (!r.isOk()) {
      LOOM_WARN("InfiniBand: dropping the connection from {} on {}: {}", in->peer.toString(),
                l->port->name(), r.status().message());
      l->incoming.erase(l->incoming.begin() + i);
      continue;
    }
    if (r.value() && *recvConn == nullptr) {
      *recvConn = in->comm.release();
      l->incoming.erase(l->incoming.begin() + i);
      continue;
    }
    ++i;
  }
  return Status();
}

Result<bool> IbTransport::progressIncoming(Listener* l, Incoming* in) {
  if (in->complete) return true;
  if (in->got < sizeof(in->remote) && in->strangerDeadline.expired())
    return LOOM_ERROR(kTimeout, "no handshake within {} ms ({} of {} bytes)",
                      in->strangerDeadline.timeoutMs(), in->got, sizeof(in->remote));
  if (in->deadline.expired())
    return LOOM_ERROR(kTimeout, "handshake not finished within {} ms (LOOM_TIMEOUT)",
                      in->deadline.timeoutMs());
  while (in->got < sizeof(in->remote)) {
    LOOM_ASSIGN(size_t n, recvSome(in->fd.get(), reinterpret_cast<char*>(&in->remote) + in->got,
                                   sizeof(in->remote) - in->got));
    if (n == 0) return false;
    in->got += n;
    LOOM_TRY(checkEndpoint(in->remote, in->got, Side::kAcceptor, l->secret));
  }
  if (!in->comm) {
    const EndpointWire& w = in->remote;
    auto comm = Comm::create(Comm::Role::kRecv, l->port, static_cast<int>(w.nqps));
    Status st = comm.status();
    if (st.isOk()) {
      in->comm = std::move(comm).value();
      in->comm->describe(&in->local, l->secret);
      st = in->comm->connect(w, in->peer.toString());
    }
    if (!st.isOk()) {
      // Tell the connector, so that it fails now instead of at its deadline.
      EndpointWire refuse{};
      refuse.magic = kIbWireMagic;
      refuse.version = kIbWireVersion;
      refuse.status = 1;
      (void)sendAll(in->fd.get(), &refuse, sizeof(refuse), Deadline(1000));
      return st;
    }
  }
  while (in->sent < sizeof(in->local)) {
    LOOM_ASSIGN(size_t n, sendSome(in->fd.get(), reinterpret_cast<char*>(&in->local) + in->sent,
                                   sizeof(in->local) - in->sent));
    if (n == 0) return false;
    in->sent += n;
  }
  // The connector's queue pairs are ready to receive our clear-to-send writes once it says so.
  LOOM_ASSIGN(size_t n, recvSome(in->fd.get(), &in->ready, 1));
  if (n == 0) return false;
  in->comm->attachSocket(std::move(in->fd));
  in->complete = true;
  return true;
}

Status IbTransport::regMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  *mhandle = nullptr;
  auto* c = static_cast<Comm*>(comm);
  if (c == nullptr) return LOOM_ERROR(kInvalidArgument, "InfiniBand: regMr on a null comm");
  return registerOn(c->dev(), data, size, type, mhandle);
}

Status IbTransport::regMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset,
                                int fd, void** mhandle) {
  *mhandle = nullptr;
  auto* c = static_cast<Comm*>(comm);
  if (c == nullptr) return LOOM_ERROR(kInvalidArgument, "InfiniBand: regMrDmaBuf on a null comm");
  if (type == net::kPtrHost) return registerOn(c->dev(), data, size, type, mhandle);
  if (fd < 0)
    return LOOM_ERROR(kInvalidArgument,
                      "InfiniBand: regMrDmaBuf of GPU memory without a dma-buf "
                      "(fd {})",
                      fd);
  return registerOn(c->dev(), data, size, type, mhandle, fd, offset);
}

Status IbTransport::holdMemory(int dev, const void* data, size_t size, int type, void** hold) {
  *hold = nullptr;
  LOOM_TRY(checkDev(dev));
  // The registration cache is the device's: requests of every connection on it find the range
  // (a GPU allocation is registered whole, so any part of it).
  return registerOn(ports_[dev]->dev, const_cast<void*>(data), size, type, hold);
}

Status IbTransport::registerOn(Device* d, void* data, size_t size, int type, void** mhandle,
                               int dmabufFd, uint64_t dmabufOffset) {
  Result<CachedMr*> mr = Status();
  if (type == net::kPtrHost) {
    mr = d->regHost(data, size);
  } else if (type == net::kPtrCuda || type == net::kPtrDmabuf) {
    if (!d->gdr().usable())
      return LOOM_ERROR(kInvalidUsage, "InfiniBand: cannot register GPU memory on {}: {}",
                        d->name(), d->gdr().summary);
    mr = d->regGpu(data, size, dmabufFd, dmabufOffset);
  } else {
    return LOOM_ERROR(kInvalidArgument, "InfiniBand: unknown memory type {}", type);
  }
  if (!mr.isOk()) return mr.status();
  *mhandle = new MemHandle{d, mr.value()};
  return Status();
}

Status IbTransport::deregMr(void* comm, void* mhandle) {
  auto* m = static_cast<MemHandle*>(mhandle);
  if (m == nullptr) return Status();
  m->dev->deregister(m->mr);
  delete m;
  return Status();
}

}  // namespace
}  // namespace ib

std::unique_ptr<net::Transport> makeIbTransport(std::string* whyNot) {
  std::string why;
  auto api = ib::loadVerbs(nullptr);
  if (!api.isOk()) {
    *whyNot = api.status().message();
    return nullptr;
  }
  ib::HcaSpec spec = ib::HcaSpec::parse(params::kIbHca.str());
  auto devs = ib::openDevices(api.value(), spec, &why);
  if (!devs.isOk()) {
    *whyNot = devs.status().message();
    return nullptr;
  }
  if (devs.value().empty()) {
    *whyNot = why;
    return nullptr;
  }
  whyNot->clear();
  return std::make_unique<ib::IbTransport>(std::move(devs).value());
}

}  // namespace loom
