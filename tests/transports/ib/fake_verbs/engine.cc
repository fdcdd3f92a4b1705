// The engine: port addresses, links between engines, the requester and responder sides of the
// emulated RC protocol, the timer for retries, and the error state.
#include "tests/transports/ib/fake_verbs/engine.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace fakeverbs {
namespace {

constexpr uint32_t kMagic = 0x4c465642;
constexpr int kRnrDelayMs = 2;
constexpr int kMaxFds = 4096;
constexpr uint64_t kMaxPayload = uint64_t(1) << 33;

// fd + 1 of every fd the emulator owns; 0 is a free slot. Lock-free so that the fork handler,
// which runs with only the forking thread alive, can read it.
std::atomic<int> gFds[kMaxFds];

pthread_mutex_t gEngineMu = PTHREAD_MUTEX_INITIALIZER;
Engine* gEngine = nullptr;
// Engines abandoned in forked children, kept reachable (their threads do not exist there).
Engine* gRetired[64];
std::atomic<int> gRetiredCount{0};

void forkChild() {
  for (auto& slot : gFds) {
    int v = slot.exchange(0);
    if (v != 0) ::close(v - 1);
  }
  int n = gRetiredCount.fetch_add(1);
  if (n < 64) gRetired[n] = gEngine;
  gEngine = nullptr;
  pthread_mutex_init(&gEngineMu, nullptr);
}

bool readFull(int fd, void* buf, size_t n) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= size_t(r);
  }
  return true;
}

// Places data as adapters do in practice: in ascending address order, the last bytes last, so
// that a poller of a flag at the end of an entry (NCCL's FIFO idx) never sees the flag before
// the rest of the entry. Small writes (a FIFO entry, a flag) are placed entirely with atomic
// release stores, 8 bytes at a time where aligned, so that pollers that read them with atomic
// loads are race-free under ThreadSanitizer too; large ones are copied, then their last 64 bytes.
constexpr size_t kOrderedTail = 64;
constexpr size_t kOrderedAll = 4096;
void placeOrdered(char* dst, const char* src, size_t n) {
  size_t i = 0;
  while (i < n) {
    if ((reinterpret_cast<uintptr_t>(dst + i) & 7) == 0 && n - i >= 8) {
      uint64_t w;
      std::memcpy(&w, src + i, 8);
      __atomic_store_n(reinterpret_cast<uint64_t*>(dst + i), w, __ATOMIC_RELEASE);
      i += 8;
    } else {
      __atomic_store_n(dst + i, src[i], __ATOMIC_RELEASE);
      ++i;
    }
  }
}
size_t orderedHead(size_t n) { return n > kOrderedAll ? n - kOrderedTail : 0; }
void placeData(char* dst, const char* src, size_t n) {
  size_t head = orderedHead(n);
  if (head > 0) std::memcpy(dst, src, head);
  placeOrdered(dst + head, src + head, n - head);
}

// Writes the message from byte `offset` on; returns the offset reached (the whole message unless
// `nonblocking` and the socket is full), or -1 when the link broke.
ssize_t writeMsg(int fd, const Wire& hdr, const Buffer* payload, size_t offset, bool nonblocking) {
  size_t total = sizeof(hdr) + (payload != nullptr ? payload->size : 0);
  while (offset < total) {
    iovec iov[2];
    int n = 0;
    if (offset < sizeof(hdr)) {
      iov[n].iov_base = reinterpret_cast<char*>(const_cast<Wire*>(&hdr)) + offset;
      iov[n].iov_len = sizeof(hdr) - offset;
      ++n;
    }
    if (payload != nullptr && payload->size > 0) {
      size_t skip = offset > sizeof(hdr) ? offset - sizeof(hdr) : 0;
      iov[n].iov_base = payload->data.get() + skip;
      iov[n].iov_len = payload->size - skip;
      ++n;
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = size_t(n);
    ssize_t w = ::sendmsg(fd, &msg, MSG_NOSIGNAL | (nonblocking ? MSG_DONTWAIT : 0));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && nonblocking && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (w <= 0) return -1;
    offset += size_t(w);
  }
  return ssize_t(offset);
}

void socketName(uint16_t addr, sockaddr_un* sa, socklen_t* len) {
  std::memset(sa, 0, sizeof(*sa));
  sa->sun_family = AF_UNIX;
  int n = std::snprintf(sa->sun_path + 1, sizeof(sa->sun_path) - 1, "loomtest-fakeverbs/%04x",
                        unsigned(addr));
  *len = socklen_t(offsetof(sockaddr_un, sun_path) + 1 + size_t(n));
}

void tuneSocket(int fd) {
  int size = 4 << 20;
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
}

// Every GID of a port ends with the port's address; that is how a dgid finds its engine.
ibv_gid makeGid(GidKind kind, uint16_t addr) {
  ibv_gid g;
  std::memset(&g, 0, sizeof(g));
  switch (kind) {
    case GidKind::kLinkLocal: {
      const uint8_t id[8] = {0x02, 0x00, 0x5e, 0xff, 0xfe, 0x00, 0, 0};
      g.raw[0] = 0xfe;
      g.raw[1] = 0x80;
      std::memcpy(&g.raw[8], id, 6);
      break;
    }
    case GidKind::kIpv4:
      g.raw[10] = 0xff;
      g.raw[11] = 0xff;
      g.raw[12] = 10;
      g.raw[13] = 99;
      break;
    case GidKind::kIpv6: {
      const uint8_t prefix[6] = {0xfd, 0x00, 0x4c, 0x6f, 0x6f, 0x6d};
      std::memcpy(g.raw, prefix, 6);
      break;
    }
  }
  g.raw[14] = uint8_t(addr >> 8);
  g.raw[15] = uint8_t(addr);
  return g;
}

uint64_t portGuid(uint16_t addr) { return 0x02c903fffe000000ull | addr; }

ibv_gid ibGid(uint16_t addr) {
  ibv_gid g;
  std::memset(&g, 0, sizeof(g));
  g.raw[0] = 0xfe;
  g.raw[1] = 0x80;
  uint64_t guid = portGuid(addr);
  for (int i = 0; i < 8; ++i) g.raw[8 + i] = uint8_t(guid >> (56 - 8 * i));
  return g;
}

int retryDelayMs(uint8_t timeout) {
  // 4.096 us x 2^timeout compressed a hundred times, within [20 ms, 200 ms]: short for tests,
  // long enough that a peer still connecting on a loaded machine is not declared dead.
  double ms = 4.096e-3 * double(uint64_t(1) << (timeout & 31)) / 100.0;
  return ms < 20.0 ? 20 : (ms > 200.0 ? 200 : int(ms));
}

void readerMain(Engine* e, std::shared_ptr<Link> l);
void writerMain(std::shared_ptr<Link> l);

void startLink(Engine* e, const std::shared_ptr<Link>& l) {
  std::thread(readerMain, e, l).detach();
  std::thread(writerMain, l).detach();
}

void listenerMain(Engine* e) {
  std::vector<pollfd> fds;
  while (true) {
    fds.clear();
    fds.push_back({e->wakeFd, POLLIN, 0});
    {
      std::lock_guard<std::mutex> lock(e->mu);
      for (auto& d : e->devices) {
        for (auto& p : d->ports) fds.push_back({p->listenFd, POLLIN, 0});
      }
    }
    int r = ::poll(fds.data(), fds.size(), -1);
    if (r < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents & POLLIN) {
      uint64_t v;
      if (::read(e->wakeFd, &v, sizeof(v)) < 0) {
      }
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (!(fds[i].revents & POLLIN)) continue;
      int fd = ::accept4(fds[i].fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      registerFd(fd);
      tuneSocket(fd);
      auto l = std::make_shared<Link>();
      l->fd = fd;
      startLink(e, l);
    }
  }
}

void timerMain(Engine* e) {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(e->timerMu);
      e->timerCv.wait(lock, [e] { return e->timerWork; });
      e->timerWork = false;
    }
    bool more = true;
    while (more) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      more = tick(*e);
    }
  }
}

void notifyTimer(Engine& e) {
  std::lock_guard<std::mutex> lock(e.timerMu);
  e.timerWork = true;
  e.timerCv.notify_one();
}

std::shared_ptr<Qp> findQp(Engine& e, uint32_t qpn) {
  std::lock_guard<std::mutex> lock(e.mu);
  auto it = e.qps.find(qpn);
  return it == e.qps.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<Qp>> allQps(Engine& e) {
  std::vector<std::shared_ptr<Qp>> out;
  std::lock_guard<std::mutex> lock(e.mu);
  for (auto& kv : e.qps) out.push_back(kv.second);
  return out;
}

// Queues cq's completion event on its channel (it was armed).
void notifyChannel(Cq* cq) {
  Channel* ch = cq->channel;
  std::lock_guard<std::mutex> lock(ch->mu);
  ch->events.push_back(cq);
  const uint64_t one = 1;
  // An eventfd's counter only fails to grow at 2^64 - 2 unread events.
  (void)!::write(ch->ch.fd, &one, sizeof(one));
}

void pushCqe(Cq* cq, const ibv_wc& wc, Qp& qp, bool send, uint32_t release) {
  Cqe c;
  c.wc = wc;
  c.qp = qp.weak_from_this();
  c.send = send;
  c.release = release;
  c.gen = qp.gen.load();
  bool notify = false;
  {
    std::lock_guard<std::mutex> lock(cq->mu);
    c.wc.qp_num = qp.h.qp.qp_num;
    cq->q.push_back(c);
    notify = cq->armed;  // one event per arming, as on hardware
    cq->armed = false;
  }
  if (notify) notifyChannel(cq);
}

ibv_wc_opcode sendWcOpcode(ibv_wr_opcode op) {
  switch (op) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      return IBV_WC_RDMA_WRITE;
    case IBV_WR_RDMA_READ:
      return IBV_WC_RDMA_READ;
    default:
      return IBV_WC_SEND;
  }
}

// Completes the head of the send queue (the caller pops it). Error completions are generated
// for unsignaled requests too.
void completeSend(Qp& qp, const Qp::SendWr& s, ibv_wc_status status, uint32_t byteLen) {
  if (status == IBV_WC_SUCCESS && !s.signaled) {
    ++qp.unsignaledDone;
    return;
  }
  ibv_wc wc;
  std::memset(&wc, 0, sizeof(wc));
  wc.wr_id = s.wrId;
  wc.status = status;
  wc.opcode = sendWcOpcode(s.op);
  wc.byte_len = byteLen;
  if (status != IBV_WC_SUCCESS && status != IBV_WC_WR_FLUSH_ERR) wc.vendor_err = 0x80 + status;
  pushCqe(qp.scq, wc, qp, true, 1 + qp.unsignaledDone);
  qp.unsignaledDone = 0;
}

void completeRecv(Qp& qp, const Qp::RecvWr& r, ibv_wc_status status, ibv_wc_opcode op,
                  uint32_t byteLen, const Wire* req) {
  ibv_wc wc;
  std::memset(&wc, 0, sizeof(wc));
  wc.wr_id = r.wrId;
  wc.status = status;
  wc.opcode = op;
  wc.byte_len = byteLen;
  if (req != nullptr) {
    wc.src_qp = req->srcQpn;
    wc.slid = qp.port != nullptr && !qp.port->cfg.roce ? req->srcAddr : 0;
    if (status == IBV_WC_SUCCESS &&
        (req->opcode == IBV_WR_RDMA_WRITE_WITH_IMM || req->opcode == IBV_WR_SEND_WITH_IMM)) {
      wc.wc_flags = IBV_WC_WITH_IMM;
      wc.imm_data = req->imm;
    }
    if (qp.port != nullptr && qp.port->cfg.roce) wc.wc_flags |= IBV_WC_GRH;
  }
  if (status != IBV_WC_SUCCESS && status != IBV_WC_WR_FLUSH_ERR) wc.vendor_err = 0x80 + status;
  pushCqe(qp.rcq, wc, qp, false, 1);
}

void answer(const std::shared_ptr<Link>& link, const Wire& req, MsgType type, NakKind nak,
            BufferPtr payload = nullptr) {
  if (!link) return;
  Wire w;
  w.magic = kMagic;
  w.type = type;
  w.nak = nak;
  w.srcQpn = req.dstQpn;
  w.dstQpn = req.srcQpn;
  w.srcAddr = req.dstAddr;
  w.dstAddr = req.srcAddr;
  w.psn = req.psn;
  w.opcode = req.opcode;
  w.payloadLen = payload ? payload->size : 0;
  link->send(w, std::move(payload));
}

bool portUp(const Qp& qp) {
  return qp.port != nullptr && qp.port->active.load() && !qp.dev->fatal.load();
}

void startRetryLocked(Engine& e, Qp& qp) {
  if (qp.retrying || qp.state != IBV_QPS_RTS) return;
  qp.retrying = true;
  qp.retriesLeft = qp.retryCnt;
  qp.retryAt = Clock::now() + std::chrono::milliseconds(retryDelayMs(qp.timeout));
  notifyTimer(e);
}

std::shared_ptr<Link> getLink(Engine& e, uint16_t addr) {
  std::lock_guard<std::mutex> lock(e.linksMu);
  auto it = e.links.find(addr);
  if (it != e.links.end() && !it->second->dead()) return it->second;
  auto l = std::make_shared<Link>();
  l->outbound = true;
  l->remoteAddr = addr;
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un sa;
  socklen_t len;
  socketName(addr, &sa, &len);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&sa), len) == 0) {
    registerFd(fd);
    tuneSocket(fd);
    l->fd = fd;
    startLink(&e, l);
  } else {
    if (fd >= 0) ::close(fd);
    l->dead_ = true;
  }
  e.links[addr] = l;
  return l;
}

// Sends a request unless something makes it wait for a retry.
void transmitLocked(Engine& e, Qp& qp, const Qp::SendWr& s) {
  if (qp.retrying) return;
  if (!portUp(qp) || !qp.link || qp.link->dead()) {
    startRetryLocked(e, qp);
    return;
  }
  qp.link->send(s.hdr, s.payload);
}

void retransmitLocked(Engine& e, Qp& qp) {
  if (!portUp(qp)) return;
  if (!qp.link || qp.link->dead()) qp.link = getLink(e, qp.remoteAddr);
  if (qp.link->dead()) return;
  for (const auto& s : qp.sq) {
    if (s.localErr != IBV_WC_SUCCESS) break;
    qp.link->send(s.hdr, s.payload);
  }
}

void advanceHeadLocked(Engine& e, Qp& qp) {
  if (!qp.sq.empty() && qp.sq.front().localErr != IBV_WC_SUCCESS) {
    errorLocked(e, qp, qp.sq.front().localErr);
  }
}

// Scatters `len` bytes of data into local sges (lkeys need IBV_ACCESS_LOCAL_WRITE). False on a
// protection error; nothing is written then.
bool scatter(Engine& e, const Qp& qp, const std::vector<ibv_sge>& sges, const char* data,
             uint64_t len) {
  std::vector<std::pair<std::shared_ptr<Mr>, const ibv_sge*>> targets;
  uint64_t left = len;
  for (const auto& sge : sges) {
    if (left == 0) break;
    auto mr = findMr(e, sge.lkey);
    if (!mr || mr->pd != qp.pd || !(mr->access & IBV_ACCESS_LOCAL_WRITE) ||
        !mr->covers(sge.addr, sge.length)) {
      return false;
    }
    targets.emplace_back(mr, &sge);
    left -= std::min<uint64_t>(left, sge.length);
  }
  for (auto& t : targets) {
    uint64_t n = std::min<uint64_t>(len, t.second->length);
    if (n > 0) placeData(t.first->at(t.second->addr), data, n);
    data += n;
    len -= n;
  }
  return true;
}

enum class Outcome { kDone, kBlocked, kFatal, kFatalQpError };

// A zero-length request checks no key (as the IB spec says of zero-length DMA).
bool remoteOk(Engine& e, const Qp& qp, const Wire& h, int access, std::shared_ptr<Mr>* out) {
  if (!(qp.access & unsigned(access))) return false;
  if (h.length == 0) return true;
  auto mr = findMr(e, h.rkey);
  if (!mr || mr->pd != qp.pd || !(mr->access & access) || !mr->covers(h.remoteAddr, h.length)) {
    return false;
  }
  *out = mr;
  return true;
}

// A NIC's PCIe writes into GPU memory are not ordered with the completion the CPU polls: a kernel
// launched at once may read the old bytes. A read through the NIC from GPU memory (the flush of
// NCCL's plugins, iflush) lands every earlier one. Emulated where
// LOOMTEST_FAKEVERBS_GPU_WRITE_DELAY_MS is a positive number of milliseconds: a write into a
// dma-buf registration is held back that long, or until such a read.
int gpuWriteDelayMs() {
  static const int ms = [] {
    const char* v = std::getenv("LOOMTEST_FAKEVERBS_GPU_WRITE_DELAY_MS");
    return v != nullptr ? std::max(0, std::atoi(v)) : 0;
  }();
  return ms;
}

// Lands the held-back GPU writes that are due (all of them: a flush); true while some remain.
bool landGpuWrites(Engine& e, bool all) {
  std::lock_guard<std::mutex> lock(e.gpuMu);
  const auto now = Clock::now();
  while (!e.gpuWrites.empty() && (all || e.gpuWrites.front().due <= now)) {
    Engine::GpuWrite& w = e.gpuWrites.front();
    placeData(w.dst, w.payload->data.get(), w.len);
    e.gpuWrites.pop_front();
  }
  return !e.gpuWrites.empty();
}

Outcome executeLocked(Engine& e, Qp& qp, Qp::Pending& p) {
  auto link = p.link.lock();
  const Wire& h = p.hdr;
  switch (h.opcode) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM: {
      if (!p.dataDone) {
        std::shared_ptr<Mr> mr;
        if (!remoteOk(e, qp, h, IBV_ACCESS_REMOTE_WRITE, &mr)) {
          answer(link, h, kNak, kNakRemAccess);
          return Outcome::kFatal;
        }
        if (h.length > 0 && mr->map != nullptr && gpuWriteDelayMs() > 0) {
          {
            std::lock_guard<std::mutex> lock(e.gpuMu);
            e.gpuWrites.push_back({mr, mr->at(h.remoteAddr), p.payload, size_t(h.length),
                                   Clock::now() + std::chrono::milliseconds(gpuWriteDelayMs())});
          }
          notifyTimer(e);
        } else if (h.length > 0) {
          placeData(mr->at(h.remoteAddr), p.payload->data.get(), h.length);
        }
        p.dataDone = true;
      }
      if (h.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
        if (qp.rq.empty()) return Outcome::kBlocked;
        Qp::RecvWr r = std::move(qp.rq.front());
        qp.rq.pop_front();
        completeRecv(qp, r, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, uint32_t(h.length), &h);
      }
      answer(link, h, kAck, NakKind(0));
      return Outcome::kDone;
    }
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM: {
      if (qp.rq.empty()) return Outcome::kBlocked;
      Qp::RecvWr r = std::move(qp.rq.front());
      qp.rq.pop_front();
      uint64_t capacity = 0;
      for (const auto& sge : r.sges) capacity += sge.length;
      if (h.length > capacity) {
        completeRecv(qp, r, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV, 0, &h);
        answer(link, h, kNak, kNakRemInvReq);
        return Outcome::kFatalQpError;
      }
      if (!scatter(e, qp, r.sges, p.payload ? p.payload->data.get() : nullptr, h.length)) {
        completeRecv(qp, r, IBV_WC_LOC_PROT_ERR, IBV_WC_RECV, 0, &h);
        answer(link, h, kNak, kNakRemOp);
        return Outcome::kFatalQpError;
      }
      completeRecv(qp, r, IBV_WC_SUCCESS, IBV_WC_RECV, uint32_t(h.length), &h);
      answer(link, h, kAck, NakKind(0));
      return Outcome::kDone;
    }
    case IBV_WR_RDMA_READ: {
      std::shared_ptr<Mr> mr;
      if (!remoteOk(e, qp, h, IBV_ACCESS_REMOTE_READ, &mr)) {
        answer(link, h, kNak, kNakRemAccess);
        return Outcome::kFatal;
      }
      if (qp.maxDestRd == 0) {
        answer(link, h, kNak, kNakRemInvReq);
        return Outcome::kFatal;
      }
      if (mr != nullptr && mr->map != nullptr) landGpuWrites(e, true);  // a flush
      auto data = std::make_shared<Buffer>(h.length);
      if (h.length > 0) std::memcpy(data->data.get(), mr->at(h.remoteAddr), h.length);
      answer(link, h, kReadResp, NakKind(0), std::move(data));
      return Outcome::kDone;
    }
    default:
      answer(link, h, kNak, kNakRemInvReq);
      return Outcome::kFatal;
  }
}

void drainLocked(Engine& e, Qp& qp) {
  while (!qp.pending.empty()) {
    Qp::Pending& p = qp.pending.front();
    Outcome r = executeLocked(e, qp, p);
    if (r == Outcome::kBlocked) {
      if (!p.armed) {
        p.armed = true;
        if (p.hdr.rnrRetry == 0) {
          failRnrLocked(qp);
          return;
        }
        p.forever = p.hdr.rnrRetry == 7;
        p.deadline = Clock::now() + std::chrono::milliseconds(kRnrDelayMs * p.hdr.rnrRetry);
        if (!p.forever) notifyTimer(e);
      }
      return;
    }
    if (r == Outcome::kFatal || r == Outcome::kFatalQpError) {
      // Requests after the failed one are dropped (the requester flushes them): expect the
      // failed PSN again, which never comes.
      qp.rqPsn = p.hdr.psn;
      qp.pending.clear();
      if (r == Outcome::kFatalQpError) errorLocked(e, qp, IBV_WC_WR_FLUSH_ERR);
      return;
    }
    qp.pending.pop_front();
  }
}

bool acceptsLocked(const Qp& qp, const Wire& h) {
  if (qp.destroyed || (qp.state != IBV_QPS_RTR && qp.state != IBV_QPS_RTS)) return false;
  if (!portUp(qp) || h.dstAddr != qp.port->addr) return false;
  if (h.srcQpn != qp.remoteQpn || h.srcAddr != qp.remoteAddr) return false;
  if (qp.port->cfg.roce && h.gidType != qp.sgidType) return false;
  return true;
}

void onRequest(Engine& e, const std::shared_ptr<Link>& link, const Wire& h, BufferPtr payload) {
  auto qp = findQp(e, h.dstQpn);
  if (!qp) {
    answer(link, h, kNak, kNakDead);
    return;
  }
  std::lock_guard<std::mutex> lock(qp->mu);
  if (!acceptsLocked(*qp, h)) {
    answer(link, h, kNak, kNakDead);
    return;
  }
  if (h.psn < qp->rqPsn) {
    // A retransmission of something already accepted: answer again unless still waiting.
    if (!qp->pending.empty() && h.psn >= qp->pending.front().hdr.psn) return;
    if (h.opcode == IBV_WR_RDMA_READ) {
      Qp::Pending again;
      again.link = link;
      again.hdr = h;
      executeLocked(e, *qp, again);
    } else {
      answer(link, h, kAck, NakKind(0));
    }
    return;
  }
  if (h.psn > qp->rqPsn) {
    answer(link, h, kNak, kNakSeq);
    return;
  }
  ++qp->rqPsn;
  Qp::Pending p;
  p.link = link;
  p.hdr = h;
  p.payload = std::move(payload);
  qp->pending.push_back(std::move(p));
  drainLocked(e, *qp);
}

void onResponse(Engine& e, const Wire& h, const BufferPtr& payload) {
  auto qp = findQp(e, h.dstQpn);
  if (!qp) return;
  std::lock_guard<std::mutex> lock(qp->mu);
  if (qp->destroyed || qp->state != IBV_QPS_RTS || qp->sq.empty() || qp->sq.front().psn != h.psn) {
    return;
  }
  Qp::SendWr& s = qp->sq.front();
  if (h.type == kNak) {
    switch (h.nak) {
      case kNakDead:
      case kNakSeq:
        startRetryLocked(e, *qp);
        return;
      case kNakRemAccess:
        errorLocked(e, *qp, IBV_WC_REM_ACCESS_ERR);
        return;
      case kNakRemInvReq:
        errorLocked(e, *qp, IBV_WC_REM_INV_REQ_ERR);
        return;
      case kNakRemOp:
        errorLocked(e, *qp, IBV_WC_REM_OP_ERR);
        return;
      default:
        errorLocked(e, *qp, IBV_WC_RNR_RETRY_EXC_ERR);
        return;
    }
  }
  uint32_t byteLen = uint32_t(s.len);
  if (h.type == kReadResp) {
    uint64_t n = payload ? payload->size : 0;
    if (!scatter(e, *qp, s.readSges, n ? payload->data.get() : nullptr, n)) {
      errorLocked(e, *qp, IBV_WC_LOC_PROT_ERR);
      return;
    }
    byteLen = uint32_t(n);
  }
  completeSend(*qp, s, IBV_WC_SUCCESS, byteLen);
  qp->sq.pop_front();
  qp->retrying = false;
  advanceHeadLocked(e, *qp);
}

void onLinkDead(Engine& e, Link* l) {
  for (auto& qp : allQps(e)) {
    std::lock_guard<std::mutex> lock(qp->mu);
    if (qp->link.get() == l && !qp->sq.empty()) startRetryLocked(e, *qp);
  }
}

// A write that can execute at once is read from the socket straight into the target memory
// (one copy less for large transfers). 1: done; 0: not possible, take the general path (which
// decides what to answer); -1: the link broke.
int receiveWriteDirect(Engine& e, const std::shared_ptr<Link>& link, const Wire& h) {
  if ((h.opcode != IBV_WR_RDMA_WRITE && h.opcode != IBV_WR_RDMA_WRITE_WITH_IMM) ||
      h.payloadLen != h.length || h.length == 0) {
    return 0;
  }
  auto qp = findQp(e, h.dstQpn);
  if (!qp) return 0;
  std::lock_guard<std::mutex> lock(qp->mu);
  std::shared_ptr<Mr> mr;
  if (!acceptsLocked(*qp, h) || h.psn != qp->rqPsn || !qp->pending.empty() ||
      !remoteOk(e, *qp, h, IBV_ACCESS_REMOTE_WRITE, &mr) || !mr ||
      (mr->map != nullptr && gpuWriteDelayMs() > 0)) {  // GPU writes held back: executeLocked
    return 0;
  }
  char* dst = mr->at(h.remoteAddr);
  size_t head = orderedHead(h.length);
  char tail[kOrderedAll];
  if (!readFull(link->fd, dst, head) || !readFull(link->fd, tail, h.length - head)) return -1;
  placeOrdered(dst + head, tail, h.length - head);
  ++qp->rqPsn;
  Qp::Pending p;
  p.link = link;
  p.hdr = h;
  p.dataDone = true;
  qp->pending.push_back(std::move(p));
  drainLocked(e, *qp);
  return 1;
}

void readerMain(Engine* e, std::shared_ptr<Link> l) {
  while (true) {
    Wire h;
    if (!readFull(l->fd, &h, sizeof(h)) || h.magic != kMagic || h.payloadLen > kMaxPayload) break;
    if (h.type == kReq) {
      int direct = receiveWriteDirect(*e, l, h);
      if (direct < 0) break;
      if (direct > 0) continue;
    }
    std::shared_ptr<Buffer> payload;
    if (h.payloadLen > 0) {
      payload = std::make_shared<Buffer>(h.payloadLen);
      if (!readFull(l->fd, payload->data.get(), h.payloadLen)) break;
    }
    if (h.type == kReq) {
      onRequest(*e, l, h, std::move(payload));
    } else {
      onResponse(*e, h, payload);
    }
  }
  {
    std::lock_guard<std::mutex> lock(l->mu);
    l->dead_ = true;
  }
  l->cv.notify_all();
  ::shutdown(l->fd, SHUT_RDWR);
  if (l->outbound) onLinkDead(*e, l.get());
}

void writerMain(std::shared_ptr<Link> l) {
  while (true) {
    Link::Out* m;
    {
      std::unique_lock<std::mutex> lock(l->mu);
      l->cv.wait(lock, [&] { return l->dead_ || !l->out.empty(); });
      if (l->dead_) return;
      m = &l->out.front();  // stays in the queue (and valid) until written: send() sees a writer
    }
    if (writeMsg(l->fd, m->hdr, m->payload.get(), m->sent, false) < 0) {
      ::shutdown(l->fd, SHUT_RDWR);
      return;
    }
    std::lock_guard<std::mutex> lock(l->mu);
    l->out.pop_front();
  }
}

}  // namespace

Link::~Link() {
  if (fd >= 0) closeFd(fd);
}

void Link::send(const Wire& hdr, BufferPtr payload) {
  Wire w = hdr;
  w.magic = kMagic;
  w.payloadLen = payload ? payload->size : 0;
  std::lock_guard<std::mutex> lock(mu);
  if (dead_) return;
  // Written at once when nothing is queued and the socket has room: an answer is then on its
  // way even if this process exits right after (as a NIC acknowledges at once). The writer
  // thread sends what does not fit, so this never blocks.
  size_t sent = 0;
  if (out.empty()) {
    ssize_t r = writeMsg(fd, w, payload.get(), 0, true);
    if (r < 0) return;  // the reader sees the broken link
    sent = size_t(r);
    if (sent == sizeof(w) + w.payloadLen) return;
  }
  out.push_back({w, std::move(payload), sent});
  cv.notify_one();
}

bool Link::dead() {
  std::lock_guard<std::mutex> lock(mu);
  return dead_;
}

Mr::~Mr() {
  if (map != nullptr) ::munmap(map, mapLen);
}

void registerFd(int fd) {
  for (auto& slot : gFds) {
    int expected = 0;
    if (slot.compare_exchange_strong(expected, fd + 1)) return;
  }
}

void closeFd(int fd) {
  for (auto& slot : gFds) {
    int expected = fd + 1;
    if (slot.compare_exchange_strong(expected, 0)) break;
  }
  ::close(fd);
}

Engine::Engine() {
  wakeFd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  registerFd(wakeFd);
  nextQpn = 0x100 + (uint32_t(::getpid()) & 0xff) * 0x1000;
  nextKey = 0x1000 + (uint32_t(::getpid()) & 0xffff) * 0x10000;
  std::thread(listenerMain, this).detach();
  std::thread(timerMain, this).detach();
}

Engine& engine() {
  static std::atomic<bool> forkHandler{false};
  if (!forkHandler.exchange(true)) pthread_atfork(nullptr, nullptr, forkChild);
  pthread_mutex_lock(&gEngineMu);
  if (gEngine == nullptr) gEngine = new Engine();
  Engine* e = gEngine;
  pthread_mutex_unlock(&gEngineMu);
  return *e;
}

std::shared_ptr<Mr> findMr(Engine& e, uint32_t key) {
  std::lock_guard<std::mutex> lock(e.mrMu);
  auto it = e.mrs.find(key);
  return it == e.mrs.end() ? nullptr : it->second;
}

Device* createDevice(Engine& e, const DeviceConfig& cfg, std::string* error) {
  static std::atomic<uint32_t> counter{0};
  auto d = std::make_unique<Device>();
  d->name = cfg.name;
  d->spec = cfg.spec;
  uint32_t seed = uint32_t(::getpid()) * 2654435761u + counter.fetch_add(1) * 7919u;
  for (size_t i = 0; i < cfg.ports.size(); ++i) {
    auto p = std::make_unique<Port>();
    p->dev = d.get();
    p->num = int(i) + 1;
    p->cfg = cfg.ports[i];
    p->active = cfg.ports[i].active;
    for (uint32_t attempt = 0; attempt < 0xc000 && p->listenFd < 0; ++attempt) {
      uint16_t addr = uint16_t(1 + (seed + attempt) % 0xbffe);
      if ((addr & 0xff) == 0 || (addr & 0xff) == 0xff) continue;
      int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) break;
      sockaddr_un sa;
      socklen_t len;
      socketName(addr, &sa, &len);
      if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), len) == 0 && ::listen(fd, 256) == 0) {
        registerFd(fd);
        p->listenFd = fd;
        p->addr = addr;
      } else {
        ::close(fd);
      }
    }
    if (p->listenFd < 0) {
      *error = "cannot bind an address for " + cfg.name;
      return nullptr;
    }
    seed += 7919u;
    if (p->cfg.roce) {
      for (const GidSpec& g : p->cfg.gids) {
        p->gids.push_back(makeGid(g.kind, p->addr));
        p->gidTypes.push_back(g.type);
      }
    } else {
      p->gids.push_back(ibGid(p->addr));
      p->gidTypes.push_back(IBV_GID_TYPE_IB);
    }
    d->ports.push_back(std::move(p));
  }
  d->guid = 0x02c903000a000000ull | (d->ports.empty() ? 0 : d->ports[0]->addr);
  std::memset(&d->h, 0, sizeof(d->h));
  d->h.impl = d.get();
  d->h.dev.node_type = IBV_NODE_CA;
  d->h.dev.transport_type = IBV_TRANSPORT_IB;
  std::snprintf(d->h.dev.name, sizeof(d->h.dev.name), "%s", cfg.name.c_str());
  int idx = int(e.devices.size());
  std::snprintf(d->h.dev.dev_name, sizeof(d->h.dev.dev_name), "uverbs%d", idx);
  std::snprintf(d->h.dev.dev_path, sizeof(d->h.dev.dev_path),
                "/sys/class/infiniband_verbs/uverbs%d", idx);
  std::snprintf(d->h.dev.ibdev_path, sizeof(d->h.dev.ibdev_path), "/sys/class/infiniband/%s",
                cfg.name.c_str());
  Device* raw = d.get();
  e.devices.push_back(std::move(d));
  uint64_t one = 1;
  if (::write(e.wakeFd, &one, sizeof(one)) < 0) {
  }
  return raw;
}

void queueEvent(Context* ctx, const ibv_async_event& ev) {
  std::lock_guard<std::mutex> lock(ctx->mu);
  ctx->events.push_back(ev);
  char b = 1;
  if (::write(ctx->asyncWrite, &b, 1) < 0) {
  }
}

void errorLocked(Engine& e, Qp& qp, ibv_wc_status headStatus) {
  if (qp.state == IBV_QPS_ERR || qp.destroyed) return;
  // ibv_qp::state keeps the last state set by ibv_modify_qp, as with libibverbs: an error
  // completion does not change it.
  qp.state = IBV_QPS_ERR;
  bool first = true;
  for (const auto& s : qp.sq) {
    completeSend(qp, s, first ? headStatus : IBV_WC_WR_FLUSH_ERR, 0);
    first = false;
  }
  qp.sq.clear();
  for (const auto& r : qp.rq) completeRecv(qp, r, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0, nullptr);
  qp.rq.clear();
  if (!qp.pending.empty()) {
    answer(qp.pending.front().link.lock(), qp.pending.front().hdr, kNak, kNakDead);
    qp.pending.clear();
  }
  qp.sqBlocked = false;
  qp.retrying = false;
}

void failRnrLocked(Qp& qp) {
  Qp::Pending& head = qp.pending.front();
  answer(head.link.lock(), head.hdr, kNak, kNakRnrExc);
  qp.rqPsn = head.hdr.psn;
  qp.pending.clear();
}

bool tick(Engine& e) {
  bool more = false;
  auto now = Clock::now();
  for (auto& qp : allQps(e)) {
    std::lock_guard<std::mutex> lock(qp->mu);
    if (qp->destroyed) continue;
    if (qp->retrying && now >= qp->retryAt) {
      if (qp->retriesLeft <= 0) {
        errorLocked(e, *qp, IBV_WC_RETRY_EXC_ERR);
      } else {
        --qp->retriesLeft;
        qp->retryAt = now + std::chrono::milliseconds(retryDelayMs(qp->timeout));
        retransmitLocked(e, *qp);
      }
    }
    if (!qp->pending.empty()) {
      Qp::Pending& head = qp->pending.front();
      if (head.armed && !head.forever && now >= head.deadline) failRnrLocked(*qp);
    }
    if (qp->retrying) more = true;
    if (!qp->pending.empty() && qp->pending.front().armed && !qp->pending.front().forever) {
      more = true;
    }
  }
  if (landGpuWrites(e, false)) more = true;
  return more;
}

int postSendOne(Engine& e, Qp& qp, const ibv_send_wr* wr) {
  switch (wr->opcode) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM:
    case IBV_WR_RDMA_READ:
      break;
    default:
      return EINVAL;
  }
  if (wr->num_sge < 0 || uint32_t(wr->num_sge) > qp.maxSendSge) return EINVAL;
  bool inl = (wr->send_flags & IBV_SEND_INLINE) != 0;
  if (inl && wr->opcode == IBV_WR_RDMA_READ) return EINVAL;
  uint64_t total = 0;
  for (int i = 0; i < wr->num_sge; ++i) total += wr->sg_list[i].length;
  if (inl && total > qp.maxInline) return EINVAL;

  Qp::SendWr s;
  s.wrId = wr->wr_id;
  s.op = wr->opcode;
  s.signaled = qp.sigAll || (wr->send_flags & IBV_SEND_SIGNALED) != 0;
  s.len = total;
  if (total > (uint64_t(1) << 31)) s.localErr = IBV_WC_LOC_LEN_ERR;
  if (wr->opcode == IBV_WR_RDMA_READ) {
    for (int i = 0; i < wr->num_sge; ++i) {
      const ibv_sge& sge = wr->sg_list[i];
      auto mr = findMr(e, sge.lkey);
      if (!mr || mr->pd != qp.pd || !(mr->access & IBV_ACCESS_LOCAL_WRITE) ||
          !mr->covers(sge.addr, sge.length)) {
        s.localErr = IBV_WC_LOC_PROT_ERR;
      }
      s.readSges.push_back(sge);
    }
  } else if (s.localErr == IBV_WC_SUCCESS) {
    auto buf = std::make_shared<Buffer>(total);
    char* dst = buf->data.get();
    for (int i = 0; i < wr->num_sge && s.localErr == IBV_WC_SUCCESS; ++i) {
      const ibv_sge& sge = wr->sg_list[i];
      const char* src = reinterpret_cast<const char*>(uintptr_t(sge.addr));
      if (!inl) {
        auto mr = findMr(e, sge.lkey);
        if (!mr || mr->pd != qp.pd || !mr->covers(sge.addr, sge.length)) {
          s.localErr = IBV_WC_LOC_PROT_ERR;
          break;
        }
        src = mr->at(sge.addr);
      }
      if (sge.length > 0) std::memcpy(dst, src, sge.length);
      dst += sge.length;
    }
    s.payload = std::move(buf);
  }

  std::lock_guard<std::mutex> lock(qp.mu);
  if (qp.destroyed) return EINVAL;
  if (qp.state == IBV_QPS_ERR) {
    qp.sqUsed.fetch_add(1);
    completeSend(qp, s, IBV_WC_WR_FLUSH_ERR, 0);
    return 0;
  }
  if (qp.state != IBV_QPS_RTS) return EINVAL;
  if (qp.sqUsed.load() >= int(qp.maxSend)) return ENOMEM;
  qp.sqUsed.fetch_add(1);
  s.psn = qp.sqPsn++;
  Wire& h = s.hdr;
  h.magic = kMagic;
  h.type = kReq;
  h.opcode = uint8_t(wr->opcode);
  h.rnrRetry = qp.rnrRetry;
  h.srcQpn = qp.h.qp.qp_num;
  h.dstQpn = qp.remoteQpn;
  h.srcAddr = qp.port->addr;
  h.dstAddr = qp.remoteAddr;
  h.gidType = qp.sgidType;
  h.psn = s.psn;
  h.length = total;
  if (wr->opcode != IBV_WR_SEND) {
    h.remoteAddr = wr->wr.rdma.remote_addr;
    h.rkey = wr->wr.rdma.rkey;
  }
  if (wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM || wr->opcode == IBV_WR_SEND_WITH_IMM) {
    h.imm = wr->imm_data;
  }
  if (wr->opcode == IBV_WR_SEND || wr->opcode == IBV_WR_SEND_WITH_IMM) h.remoteAddr = 0;
  h.payloadLen = s.payload ? s.payload->size : 0;
  bool blocked = qp.sqBlocked;
  if (s.localErr != IBV_WC_SUCCESS) qp.sqBlocked = true;
  qp.sq.push_back(std::move(s));
  if (qp.sq.size() == 1) {
    advanceHeadLocked(e, qp);
    if (qp.state == IBV_QPS_ERR) return 0;
  }
  if (!blocked && qp.sq.back().localErr == IBV_WC_SUCCESS) transmitLocked(e, qp, qp.sq.back());
  return 0;
}

int postRecvOne(Engine& e, Qp& qp, const ibv_recv_wr* wr) {
  if (wr->num_sge < 0 || uint32_t(wr->num_sge) > qp.maxRecvSge) return EINVAL;
  Qp::RecvWr r;
  r.wrId = wr->wr_id;
  r.sges.assign(wr->sg_list, wr->sg_list + wr->num_sge);
  std::lock_guard<std::mutex> lock(qp.mu);
  if (qp.destroyed || qp.state == IBV_QPS_RESET) return EINVAL;
  if (qp.rqUsed.load() >= int(qp.maxRecv)) return ENOMEM;
  qp.rqUsed.fetch_add(1);
  if (qp.state == IBV_QPS_ERR) {
    completeRecv(qp, r, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0, nullptr);
    return 0;
  }
  qp.rq.push_back(std::move(r));
  drainLocked(e, qp);
  return 0;
}

int modifyQp(Engine& e, Qp& qp, const ibv_qp_attr* a, int mask) {
  std::lock_guard<std::mutex> lock(qp.mu);
  if (qp.destroyed) return EINVAL;
  ibv_qp_state cur = qp.state;
  ibv_qp_state next = (mask & IBV_QP_STATE) ? a->qp_state : cur;
  auto need = [mask](int required) { return (mask & required) == required; };
  bool ok = true;
  if (next == IBV_QPS_RESET || next == IBV_QPS_ERR) {
    ok = true;
  } else if (cur == IBV_QPS_RESET && next == IBV_QPS_INIT) {
    ok = need(IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  } else if (cur == IBV_QPS_INIT && next == IBV_QPS_RTR) {
    ok = need(IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
              IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  } else if (cur == IBV_QPS_RTR && next == IBV_QPS_RTS) {
    ok = need(IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
              IBV_QP_MAX_QP_RD_ATOMIC);
  } else if (cur == next && (cur == IBV_QPS_INIT || cur == IBV_QPS_RTS)) {
    ok = true;
  } else {
    ok = false;
  }
  if (!ok) return EINVAL;

  Port* port = qp.port;
  if (mask & IBV_QP_PORT) {
    if (a->port_num < 1 || a->port_num > qp.dev->ports.size()) return EINVAL;
    port = qp.dev->ports[a->port_num - 1].get();
  }
  if (port == nullptr && next != IBV_QPS_RESET && next != IBV_QPS_ERR) return EINVAL;
  uint16_t remoteAddr = qp.remoteAddr;
  int sgidType = qp.sgidType;
  if ((mask & IBV_QP_AV) && port == nullptr) return EINVAL;
  if (mask & IBV_QP_AV) {
    const ibv_ah_attr& ah = a->ah_attr;
    if (port->cfg.roce) {
      if (!ah.is_global || ah.grh.sgid_index >= port->gids.size()) return EINVAL;
      remoteAddr = uint16_t((ah.grh.dgid.raw[14] << 8) | ah.grh.dgid.raw[15]);
      sgidType = port->gidTypes[ah.grh.sgid_index];
    } else {
      remoteAddr = ah.dlid;
      if (remoteAddr == 0 && ah.is_global) {
        remoteAddr = uint16_t((ah.grh.dgid.raw[14] << 8) | ah.grh.dgid.raw[15]);
      }
      sgidType = -1;
    }
  }

  qp.port = port;
  qp.remoteAddr = remoteAddr;
  qp.sgidType = sgidType;
  if (mask & IBV_QP_ACCESS_FLAGS) qp.access = a->qp_access_flags;
  if (mask & IBV_QP_DEST_QPN) qp.remoteQpn = a->dest_qp_num;
  if (mask & IBV_QP_TIMEOUT) qp.timeout = a->timeout;
  if (mask & IBV_QP_RETRY_CNT) qp.retryCnt = a->retry_cnt & 7;
  if (mask & IBV_QP_RNR_RETRY) qp.rnrRetry = a->rnr_retry & 7;
  if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) qp.maxDestRd = a->max_dest_rd_atomic;
  if (mask & IBV_QP_MAX_QP_RD_ATOMIC) qp.maxRd = a->max_rd_atomic;
  if (mask & IBV_QP_RQ_PSN) qp.rqPsn = a->rq_psn & 0xffffff;
  if (mask & IBV_QP_SQ_PSN) qp.sqPsn = a->sq_psn & 0xffffff;

  if (next == IBV_QPS_ERR && cur != IBV_QPS_ERR) {
    errorLocked(e, qp, IBV_WC_WR_FLUSH_ERR);
    qp.state = IBV_QPS_ERR;
  } else if (next == IBV_QPS_RESET) {
    if (!qp.pending.empty()) {
      answer(qp.pending.front().link.lock(), qp.pending.front().hdr, kNak, kNakDead);
    }
    qp.sq.clear();
    qp.rq.clear();
    qp.pending.clear();
    qp.sqBlocked = false;
    qp.retrying = false;
    qp.unsignaledDone = 0;
    qp.gen.fetch_add(1);
    qp.sqUsed = 0;
    qp.rqUsed = 0;
    qp.link.reset();
    qp.state = IBV_QPS_RESET;
  } else {
    if (next == IBV_QPS_RTR && cur == IBV_QPS_INIT) qp.link = getLink(e, remoteAddr);
    qp.state = next;
  }
  qp.h.qp.state = qp.state;
  return 0;
}

void destroyQpLocked(Engine& e, Qp& qp) {
  if (!qp.pending.empty()) {
    answer(qp.pending.front().link.lock(), qp.pending.front().hdr, kNak, kNakDead);
  }
  qp.pending.clear();
  qp.sq.clear();
  qp.rq.clear();
  qp.destroyed = true;
  qp.retrying = false;
}

int setPortState(Engine& e, const char* dev, int portNum, bool active) {
  std::vector<Port*> ports;
  std::vector<Context*> contexts;
  {
    std::lock_guard<std::mutex> lock(e.mu);
    for (auto& d : e.devices) {
      if (d->retired || d->name != dev || portNum < 1 || size_t(portNum) > d->ports.size()) {
        continue;
      }
      ports.push_back(d->ports[size_t(portNum) - 1].get());
      for (Context* c : d->contexts) contexts.push_back(c);
    }
    if (ports.empty()) return -1;
    for (Port* p : ports) p->active = active;
    ibv_async_event ev;
    std::memset(&ev, 0, sizeof(ev));
    ev.event_type = active ? IBV_EVENT_PORT_ACTIVE : IBV_EVENT_PORT_ERR;
    ev.element.port_num = portNum;
    for (Context* c : contexts) queueEvent(c, ev);
  }
  if (!active) {
    for (auto& qp : allQps(e)) {
      std::lock_guard<std::mutex> lock(qp->mu);
      for (Port* p : ports) {
        if (qp->port == p && (qp->state == IBV_QPS_RTR || qp->state == IBV_QPS_RTS)) {
          errorLocked(e, *qp, IBV_WC_RETRY_EXC_ERR);
        }
      }
    }
  }
  return 0;
}

int deviceFatal(Engine& e, const char* dev) {
  std::vector<Device*> devs;
  {
    std::lock_guard<std::mutex> lock(e.mu);
    for (auto& d : e.devices) {
      if (d->retired || d->name != dev) continue;
      devs.push_back(d.get());
      d->retired = true;
      d->fatal = true;
      for (auto& p : d->ports) p->active = false;
      ibv_async_event ev;
      std::memset(&ev, 0, sizeof(ev));
      ev.event_type = IBV_EVENT_DEVICE_FATAL;
      for (Context* c : d->contexts) queueEvent(c, ev);
    }
  }
  if (devs.empty()) return -1;
  for (auto& qp : allQps(e)) {
    std::lock_guard<std::mutex> lock(qp->mu);
    for (Device* d : devs) {
      if (qp->dev == d) errorLocked(e, *qp, IBV_WC_WR_FLUSH_ERR);
    }
  }
  return 0;
}

}  // namespace fakeverbs
