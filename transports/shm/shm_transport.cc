#include "transports/shm/shm_transport.h"

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>

#include "src/core/clock.h"
#include "src/core/dtype.h"
#include "src/reduce/reduce.h"
#include "transports/shm/shared_alloc.h"
#include "transports/shm/slot_header.h"

namespace loom::shm {

namespace {

constexpr size_t kBounceBytes = 256 << 10;

size_t roundUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

}  // namespace

struct Transport::Request {
  bool isSend = false;
  bool done = false;
  bool reduce = false;
  bool rts = false;
  bool started = false;    // receive: the first slot of its message was taken
  bool streaming = false;  // receive: store around the caches (setStreamingStores)
  int local = 0;
  int tag = 0;
  char* data = nullptr;       // send: source; receive: destination
  const char* src = nullptr;  // reduce: the other operand
  size_t size = 0;            // send: bytes; receive: capacity
  size_t moved = 0;           // bytes posted (send) or received (receive)
  size_t msgBytes = 0;        // receive: the incoming message's size
  uint64_t rtsIndex = 0;
  SharedRef shared;  // send by single copy from a shared allocation (serial 0: not one)
  loomDataType_t dt = loomFloat32;
  loomRedOp_t op = loomSum;
  Status error;
  int64_t lastCheckNs = 0;
};

struct Transport::SendComm {
  int local = 0;
  Ring* ring = nullptr;
  uint64_t head = 0;  // our copy of ring->head
  uint64_t rtsPosted = 0;
  bool useRts = false;           // the receiver reads any of our memory (threads, process_vm_readv)
  bool useMapped = false;        // the receiver maps our shared allocations
  std::deque<Request*> posting;  // not fully in the ring yet, in order
  std::vector<Request*> awaitingAck;
  Status broken;
};

struct Transport::RecvComm {
  int local = 0;
  Ring* ring = nullptr;
  uint64_t tail = 0;  // our copy of ring->tail
  uint64_t acked = 0;
  bool streaming = false;  // what receives posted now get
  std::deque<Request*> posted;
  Status broken;
};

Transport::Transport(HostArea& area) : area_(area), opts_(area.options()), me_(area.localIndex()) {
  for (int i = 0; i < area_.nlocal(); ++i) {
    auto s = std::make_unique<SendComm>();
    s->local = i;
    s->ring = area_.ring(me_, i);
    s->head = s->ring->head.load(std::memory_order_acquire);
    sends_.push_back(std::move(s));
    auto r = std::make_unique<RecvComm>();
    r->local = i;
    r->ring = area_.ring(i, me_);
    r->tail = r->ring->tail.load(std::memory_order_acquire);
    r->acked = r->ring->acked.load(std::memory_order_acquire);
    recvs_.push_back(std::move(r));
    peerMaps_.push_back(std::make_unique<PeerMappings>());
  }
  bounce_.reset(new char[kBounceBytes + kLine]);
  bounceAligned_ =
      reinterpret_cast<char*>(roundUp(reinterpret_cast<uintptr_t>(bounce_.get()), kLine));
}

Transport::~Transport() = default;  // requests in flight are dropped (owned_ frees them)

void* Transport::sendConn(int local) {
  SendComm* c = sends_[local].get();
  uint8_t can = *area_.canRead(local, me_);
  c->useRts = (can & kReadsAny) != 0;
  c->useMapped = (can & kMapsShared) != 0 && area_.peer(local).pid != area_.myPid();
  return c;
}

void* Transport::recvConn(int local) { return recvs_[local].get(); }

void Transport::setStreamingStores(void* recvConn, bool on) {
  static_cast<RecvComm*>(recvConn)->streaming = on;
}

int Transport::localOf(int rank) const {
  for (int i = 0; i < area_.nlocal(); ++i)
    if (area_.peer(i).rank == rank) return i;
  return -1;
}

void* Transport::presetSendConn(int rank) {
  int i = localOf(rank);
  return i < 0 ? nullptr : sendConn(i);
}

void* Transport::presetRecvConn(int rank) {
  int i = localOf(rank);
  return i < 0 ? nullptr : recvConn(i);
}

net::Reach Transport::reach(int rank, int channel) const {
  net::Reach r;
  r.reachable = channel == 0 && localOf(rank) >= 0;
  r.latencyUs = 0.2;
  return r;
}

// ---- leaving ---------------------------------------------------------------------------------

void Transport::awaitReaders() {
  // A receiver that began reading one of our unacknowledged single-copy messages before it saw
  // this rank's state finishes first (pull() checks the state after raising `pulling`, with both
  // seq_cst: one of the two sees the other). Bounded: 5 s.
  const int64_t deadline = nowNs() + 5 * int64_t{1000000000};
  for (int i = 0; i < area_.nlocal(); ++i)
    if (i != me_ && !sends_[i]->awaitingAck.empty())
      area_.awaitDrop(sends_[i]->ring->pulling, i, deadline);
}

// ---- peer checks ------------------------------------------------------------------------------

Status Transport::checkPeer(int local, int64_t* lastCheckNs) {
  if ((++polls_ & 127) != 0 && *lastCheckNs != 0) return Status();  // the clock is not free
  int64_t now = nowNs();
  if (*lastCheckNs == 0) {
    *lastCheckNs = now;
    return Status();
  }
  if (now - *lastCheckNs < kPeerCheckNs) return Status();
  *lastCheckNs = now;
  area_.atCheck(local, CheckPoint::kRequestWait);
  // A peer waiting in a low-latency collective this rank did not enter (so it will never send
  // what this rank waits for): the ranks disagree about the operation. This is only evidence: the
  // caller progresses the request again before it judges (Transport::test), because the peer may
  // have finished this operation (and sent or taken what this rank waits for) after this rank
  // last looked at the ring, then entered the next call.
  uint64_t peerSeq = area_.peerLlSeq(local);
  if (peerSeq > area_.peerLlSeq(me_))
    return LOOM_ERROR(kInvalidUsage,
                      "rank {} runs a small collective this rank is not running (it waits for "
                      "this rank's low-latency contribution {} while this rank waits for a "
                      "message): the ranks called different collectives, counts or datatypes",
                      area_.peer(local).rank, peerSeq);
  return area_.peerGone(local);
}

// ---- data path ----------------------------------------------------------------------------

Transport::Request* Transport::newRequest() {
  if (free_.empty()) {
    owned_.push_back(std::make_unique<Request>());
    return owned_.back().get();
  }
  Request* r = free_.back();
  free_.pop_back();
  *r = Request();
  return r;
}

void Transport::freeRequest(Request* r) { free_.push_back(r); }

Status Transport::isend(void* sendConn, const void* data, size_t size, int tag, void*,
                        void** request) {
  auto* c = static_cast<SendComm*>(sendConn);
  *request = nullptr;
  if (!c->broken.isOk()) return c->broken;
  Request* r = newRequest();
  r->isSend = true;
  r->local = c->local;
  r->tag = tag;
  r->data = const_cast<char*>(static_cast<const char*>(data));
  r->size = size;
  r->shared = SharedRef();
  bool big = size >= opts_.rtsMin && size > 0;
  // A mapped read is cheaper than process_vm_readv (no page pinning): preferred where both work.
  bool mapped = big && c->useMapped && findShared(data, size, &r->shared);
  r->rts = mapped || (big && c->useRts);
  c->posting.push_back(r);
  *request = r;
  return progressSend(c);
}

Status Transport::irecv(void* recvConn, int n, void** data, const size_t* sizes, const int* tags,
                        void**, void** request) {
  *request = nullptr;
  if (n != 1) return LOOM_ERROR(kInternal, "shm: grouped receives (n={}) are not supported", n);
  auto* c = static_cast<RecvComm*>(recvConn);
  if (!c->broken.isOk()) return c->broken;
  Request* r = newRequest();
  r->local = c->local;
  r->tag = tags[0];
  r->data = static_cast<char*>(data[0]);
  r->size = sizes[0];
  r->streaming = c->streaming;
  c->posted.push_back(r);
  *request = r;
  return progressRecv(c);
}

Status Transport::irecvReduce(void* recvConn, void* dst, const void* src, size_t size, int tag,
                              loomDataType_t dt, loomRedOp_t op, void** request) {
  *request = nullptr;
  auto* c = static_cast<RecvComm*>(recvConn);
  if (!c->broken.isOk()) return c->broken;
  Request* r = newRequest();
  r->local = c->local;
  r->tag = tag;
  r->data = static_cast<char*>(dst);
  r->src = static_cast<const char*>(src);
  r->size = size;
  r->reduce = true;
  r->streaming = c->streaming;
  r->dt = dt;
  r->op = op == loomAvg ? loomSum : op;
  c->posted.push_back(r);
  *request = r;
  return progressRecv(c);
}

Status Transport::progressSend(SendComm* c) {
  Ring* rg = c->ring;
  bool posted = false;
  while (!c->posting.empty()) {
    Request* r = c->posting.front();
    uint64_t tail = rg->tail.load(std::memory_order_acquire);
    if (c->head - tail >= static_cast<uint64_t>(opts_.slots)) break;  // ring full
    char* slot = rg->slots + (c->head % opts_.slots) * (kLine + opts_.slotBytes);
    auto* h = reinterpret_cast<SlotHdr*>(slot);
    h->tag = r->tag;
    h->msgBytes = r->size;
    if (r->rts) {
      h->kind = kRts;
      h->addr = reinterpret_cast<uint64_t>(r->data);
      h->serial = r->shared.serial;
      h->fd = static_cast<uint64_t>(r->shared.fd);
      h->allocOff = r->shared.offset;
      r->moved = r->size;
      r->rtsIndex = ++c->rtsPosted;
    } else {
      size_t chunk = std::min(opts_.slotBytes, r->size - r->moved);
      h->kind = kData;
      h->offset = r->moved;
      h->chunk = chunk;
      if (chunk) std::memcpy(slot + kLine, r->data + r->moved, chunk);
      r->moved += chunk;
    }
    ++c->head;
    rg->head.store(c->head, std::memory_order_release);
    posted = true;
    if (r->moved == r->size) {
      c->posting.pop_front();
      if (r->rts)
        c->awaitingAck.push_back(r);
      else
        r->done = true;
    }
  }
  if (posted) area_.wake(c->local);
  if (!c->awaitingAck.empty()) {
    uint64_t acked = rg->acked.load(std::memory_order_acquire);
    for (size_t i = 0; i < c->awaitingAck.size();) {
      if (c->awaitingAck[i]->rtsIndex <= acked) {
        c->awaitingAck[i]->done = true;
        c->awaitingAck[i] = c->awaitingAck.back();
        c->awaitingAck.pop_back();
      } else {
        ++i;
      }
    }
  }
  return Status();
}

void Transport::store(const Request* r, char* dst, const char* src, const char* in, size_t bytes) {
  if (r->reduce) {
    size_t count = bytes / dataTypeSize(r->dt);
    if (r->streaming)
      reduceBuffersStreaming(dst, src, in, count, r->dt, r->op);
    else
      reduceBuffers(dst, src, in, count, r->dt, r->op);
  } else if (r->streaming) {
    copyStreaming(dst, in, bytes);
  } else {
    std::memcpy(dst, in, bytes);
  }
}

Status Transport::pull(RecvComm* c, Request* r, const void* slotHdr) {
  const auto* h = static_cast<const SlotHdr*>(slotHdr);
  const size_t bytes = h->msgBytes;
  const LocalPeer& p = area_.peer(c->local);
  // Announce the read, then make sure the sender has not given up on the message (its caller
  // may free the buffer once it has): see awaitReaders.
  std::atomic<uint32_t>& pulling = c->ring->pulling;
  pulling.store(1, std::memory_order_seq_cst);
  struct Lower {
    std::atomic<uint32_t>& flag;
    ~Lower() { flag.store(0, std::memory_order_release); }
  } lower{pulling};
  if (area_.rankArea(c->local)->state.load(std::memory_order_seq_cst) !=
      static_cast<uint32_t>(PeerState::kAlive))
    return area_.peerGone(c->local);
  const char* remote = reinterpret_cast<const char*>(h->addr);
  bool direct = p.pid == area_.myPid();  // threads of one process: read the peer's buffer directly
  if (!direct && h->serial != 0) {  // a shared allocation of the peer: read it through our mapping
    Result<const char*> m =
        peerMaps_[c->local]->map(p.pid, static_cast<int>(h->fd), h->serial, h->allocOff, bytes);
    if (!m.isOk()) {
      Status gone = area_.peerGone(c->local);
      if (!gone.isOk()) return gone;
      return m.status().withContext(fmt::format("single copy from rank {}", p.rank));
    }
    remote = m.value();
    direct = true;
  }
  if (direct) {
    store(r, r->data, r->src, remote, bytes);
    return Status();
  }
  size_t done = 0;
  while (done < bytes) {
    char* into = r->reduce ? bounceAligned_ : r->data + done;
    size_t want = r->reduce ? std::min(kBounceBytes, bytes - done) : bytes - done;
    size_t got = 0;
    while (got < want) {
      iovec l{into + got, want - got};
      iovec rem{const_cast<char*>(remote + done + got), want - got};
      ssize_t n = process_vm_readv(p.pid, &l, 1, &rem, 1, 0);
      if (n <= 0) {
        int e = errno;
        Status gone = area_.peerGone(c->local);
        if (!gone.isOk()) return gone;
        return LOOM_ERROR(kSystem, "process_vm_readv of {} bytes from rank {} (pid {}): {}",
                          want - got, p.rank, p.pid, n < 0 ? std::strerror(e) : "no progress");
      }
      got += static_cast<size_t>(n);
    }
    if (r->reduce) store(r, r->data + done, r->src + done, bounceAligned_, want);
    done += want;
  }
  return Status();
}

Status Transport::deliver(RecvComm* c, Request* r, const char* slot) {
  // The header is read once: what is checked is what is used, whatever the peer's process writes
  // into the segment meanwhile.
  SlotHdr copy;
  std::memcpy(&copy, slot, sizeof(copy));
  const SlotHdr* h = &copy;
  SlotExpect e;
  e.tag = r->tag;
  e.capacity = r->size;
  e.reduce = r->reduce;
  e.started = r->started;
  e.msgBytes = r->msgBytes;
  e.moved = r->moved;
  e.slotBytes = opts_.slotBytes;
  LOOM_TRY(checkSlot(*h, e));
  if (!r->started) {
    r->started = true;
    r->msgBytes = h->msgBytes;
  }
  if (h->kind == kRts) {
    LOOM_TRY(pull(c, r, h));
    r->moved = h->msgBytes;
    return Status();
  }
  // src is the reduce input: null for a plain receive (no offset into it then).
  const char* src = r->src != nullptr ? r->src + h->offset : nullptr;
  if (h->chunk) store(r, r->data + h->offset, src, slot + kLine, h->chunk);
  r->moved += h->chunk;
  return Status();
}

Status Transport::progressRecv(RecvComm* c) {
  Ring* rg = c->ring;
  bool consumed = false;
  Status st;
  while (!c->posted.empty()) {
    Request* r = c->posted.front();
    uint64_t head = rg->head.load(std::memory_order_acquire);
    if (c->tail == head) break;
    const char* slot = rg->slots + (c->tail % opts_.slots) * (kLine + opts_.slotBytes);
    bool rts = reinterpret_cast<const SlotHdr*>(slot)->kind == kRts;
    st = deliver(c, r, slot);
    if (!st.isOk()) break;
    ++c->tail;
    rg->tail.store(c->tail, std::memory_order_release);
    if (rts) rg->acked.store(++c->acked, std::memory_order_release);
    consumed = true;
    if (r->moved == r->msgBytes) {
      r->done = true;
      c->posted.pop_front();
    }
  }
  if (consumed) area_.wake(c->local);
  if (!st.isOk()) {
    c->broken = st;
    return st;
  }
  return Status();
}

Status Transport::test(void* request, int* done, size_t* sizes) {
  auto* r = static_cast<Request*>(request);
  *done = 0;
  if (!r->done) {
    auto progress = [&] {
      return r->isSend ? progressSend(sends_[r->local].get())
                       : progressRecv(recvs_[r->local].get());
    };
    Status st = progress();
    if (st.isOk() && !r->done) {
      st = checkPeer(r->local, &r->lastCheckNs);
      if (!st.isOk()) {
        // checkPeer read its evidence (the peer's state, its low-latency sequence) after the
        // progress above: whatever the peer did for this request before that evidence (post the
        // message, take ours) is visible now. Judge only if the request still cannot finish.
        Status again = progress();
        if (!again.isOk())
          st = again;
        else if (r->done)
          st = Status();
      }
    }
    if (!st.isOk()) {
      // The request stays queued in its comm (which is now broken); the caller drops it.
      return st;
    }
    if (!r->done) return Status();
  }
  *done = 1;
  if (sizes) *sizes = r->isSend ? r->size : r->msgBytes;
  freeRequest(r);
  return Status();
}

bool Transport::anythingReady() {
  for (auto& c : recvs_)
    if (!c->posted.empty() && c->ring->head.load(std::memory_order_acquire) != c->tail) return true;
  for (auto& c : sends_) {
    if (!c->posting.empty() && c->head - c->ring->tail.load(std::memory_order_acquire) <
                                   static_cast<uint64_t>(opts_.slots))
      return true;
    if (!c->awaitingAck.empty() &&
        c->ring->acked.load(std::memory_order_acquire) >= c->awaitingAck.front()->rtsIndex)
      return true;
  }
  for (int i = 0; i < area_.nlocal(); ++i)
    if (i != me_ && area_.rankArea(i)->state.load(std::memory_order_acquire) != 0) return true;
  return false;
}

void Transport::waitActivity(void* const*, int, void*, int timeoutMs) {
  waitActivityUs(std::max(1, timeoutMs) * int64_t{1000});
}

void Transport::waitActivityUs(int64_t timeoutUs) {
  const std::atomic<bool>* abort = area_.abortFlag();
  area_.sleepOnBellUs(timeoutUs, [this, abort] {
    return anythingReady() || (abort && abort->load(std::memory_order_acquire));
  });
}

Status Transport::closeSend(void*) { return Status(); }
Status Transport::closeRecv(void*) { return Status(); }
Status Transport::closeListen(void*) { return Status(); }

Status Transport::getProperties(int dev, net::Properties* props) const {
  if (dev != 0) return LOOM_ERROR(kInvalidArgument, "shm: device {} of 1", dev);
  props->name = "shm";
  props->ptrSupport = net::kPtrHost;
  props->latencyUs = 0.2f;
  return Status();
}

Status Transport::listen(int, net::Handle*, void**) {
  return LOOM_ERROR(kInternal, "shm: connections are made at communicator init, not by listen");
}
Status Transport::connect(int, const net::Handle&, void**) {
  return LOOM_ERROR(kInternal, "shm: connections are made at communicator init, not by connect");
}
Status Transport::accept(void*, void**) {
  return LOOM_ERROR(kInternal, "shm: connections are made at communicator init, not by accept");
}
Status Transport::regMr(void*, void*, size_t, int, void** mhandle) {
  *mhandle = nullptr;
  return Status();
}
Status Transport::deregMr(void*, void*) { return Status(); }

}  // namespace loom::shm
