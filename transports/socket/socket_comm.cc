#include "transports/socket/socket_comm.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "src/core/log.h"

namespace loom {
namespace net {

namespace {

// Bytes one socket moves per progress call before yielding to the others (fairness between the
// sockets of a comm and between comms driven by one thread).
constexpr size_t kStepBudget = size_t(8) << 20;
constexpr int kHelperPollMs = 1000;  // safety net only: helpers are woken through eventfds

void signalEventFd(int fd) {
  uint64_t one = 1;
  ssize_t rc = ::write(fd, &one, sizeof(one));
  (void)rc;  // EAGAIN: the counter is already nonzero, the reader will wake anyway
}

void drainEventFd(int fd) {
  uint64_t v;
  ssize_t rc = ::read(fd, &v, sizeof(v));
  (void)rc;
}

// Detects peers that vanish without a FIN or RST (host down, cable pulled) on idle connections.
void setKeepAlive(int fd) {
  int one = 1, idle = 30, interval = 10, count = 6;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
}

}  // namespace

SocketComm::SocketComm(Role role, std::vector<Fd> socks, std::string peer, const Options& options)
    : role_(role), peer_(std::move(peer)), opt_(options) {
  nsocks_ = static_cast<int>(socks.size());
  socks_.reset(new Sock[nsocks_]);
  for (int i = 0; i < nsocks_; ++i) socks_[i].fd = std::move(socks[i]);
  opt_.maxInflight = std::max(1, opt_.maxInflight);
  // Twice the frames the request pool can hold, so that a socket lagging over frames that carry
  // nothing for it rarely holds back a post.
  frameCap_ = uint64_t(2) * opt_.maxInflight * (role_ == Role::kSend ? 1 : kSocketMaxRecvs);
  frames_.reset(new Frame[frameCap_]);
  requests_.resize(opt_.maxInflight);
  for (int i = opt_.maxInflight - 1; i >= 0; --i) {
    requests_[i].comm = this;
    freeRequests_.push_back(i);
  }
}

Result<std::unique_ptr<SocketComm>> SocketComm::create(Role role, std::vector<Fd> socks,
                                                       std::string peer, const Options& options) {
  if (socks.empty() || socks.size() > size_t(kSocketMaxSocks))
    return LOOM_ERROR(kInternal, "socket transport: {} sockets for peer {}", socks.size(), peer);
  for (auto& fd : socks) {
    LOOM_TRY(setNonBlocking(fd.get()));
    setKeepAlive(fd.get());
  }
  std::unique_ptr<SocketComm> comm(
      new SocketComm(role, std::move(socks), std::move(peer), options));
  if (options.nthreads > 0) LOOM_TRY(comm->startHelpers(std::min(options.nthreads, comm->nsocks_)));
  return comm;
}

SocketComm::~SocketComm() { stopHelpers(); }

Status SocketComm::startHelpers(int nthreads) {
  notify_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!notify_.valid()) return systemError("socket transport: eventfd", errno);
  for (int t = 0; t < nthreads; ++t) {
    auto h = std::make_unique<Helper>();
    h->wake.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!h->wake.valid()) return systemError("socket transport: eventfd", errno);
    for (int i = t; i < nsocks_; i += nthreads) h->socks.push_back(i);
    helpers_.push_back(std::move(h));
  }
  for (auto& h : helpers_) {
    Helper* raw = h.get();
    raw->thread = std::thread([this, raw] { helperLoop(raw); });
  }
  helpersActive_ = true;
  return Status();
}

void SocketComm::stopHelpers() {
  if (!helpersActive_) return;
  stop_.store(true, std::memory_order_seq_cst);
  for (auto& h : helpers_) signalEventFd(h->wake.get());
  for (auto& h : helpers_)
    if (h->thread.joinable()) h->thread.join();
  helpersActive_ = false;  // the sockets now belong to the poster, which progresses them in test()
}

void SocketComm::wakeHelpers(int except) {
  for (size_t t = 0; t < helpers_.size(); ++t) {
    if (static_cast<int>(t) == except) continue;
    // seq_cst pairs with the helper's sleeping store and its reload of posted_/headers_.
    if (helpers_[t]->sleeping.load(std::memory_order_seq_cst))
      signalEventFd(helpers_[t]->wake.get());
  }
}

void SocketComm::notifyWaiter() {
  // seq_cst, like the completion or failure that precedes it and like the poster's beginWait and
  // recheck (addWaitFds): either the poster sees the completion or we see the waiter.
  if (waiters_.load(std::memory_order_seq_cst) > 0) signalEventFd(notify_.get());
}

void SocketComm::endWait() {
  if (notify_.valid()) drainEventFd(notify_.get());
  waiters_.fetch_sub(1, std::memory_order_relaxed);
}

void SocketComm::helperLoop(Helper* h) {
  std::vector<pollfd> fds;
  while (!stop_.load(std::memory_order_acquire)) {
    size_t moved = 0;
    bool advanced = false;
    for (int i : h->socks) {
      Sock& s = socks_[i];
      if (s.dead) continue;
      uint64_t before = s.frame;
      auto r = step(i, kStepBudget);
      if (!r.isOk()) {
        s.dead = true;
        fail(r.status(), s.frame);
        continue;
      }
      moved += r.value();
      advanced |= s.frame != before;
    }
    if (moved > 0 || advanced) continue;
    // Announce the sleep before looking for work: a poster that publishes after our look sees
    // sleeping == true and signals the eventfd.
    h->sleeping.store(true, std::memory_order_seq_cst);
    fds.clear();
    fds.push_back({h->wake.get(), POLLIN, 0});
    for (int i : h->socks) {
      short ev = wantEvents(i);
      if (ev) fds.push_back({socks_[i].fd.get(), ev, 0});
    }
    if (!stop_.load(std::memory_order_seq_cst)) ::poll(fds.data(), fds.size(), kHelperPollMs);
    h->sleeping.store(false, std::memory_order_relaxed);
    if (fds[0].revents & POLLIN) drainEventFd(h->wake.get());
  }
}

bool SocketComm::canPost(int k) {
  advanceCompleted();
  uint64_t end = nextFrame_ + k;
  if (end > completed_ + frameCap_) return false;
  for (int i = 0; i < nsocks_; ++i)
    if (end > socks_[i].passed.load(std::memory_order_acquire) + frameCap_) return false;
  return true;
}

SocketRequest* SocketComm::allocRequest() {
  if (freeRequests_.empty()) return nullptr;
  SocketRequest* r = &requests_[freeRequests_.back()];
  freeRequests_.pop_back();
  r->inUse = true;
  return r;
}

void SocketComm::freeRequest(SocketRequest* r) {
  r->inUse = false;
  freeRequests_.push_back(static_cast<int>(r - requests_.data()));
}

int SocketComm::sharers(const Frame& f) const {
  int n = 1;  // socket 0 always carries the header
  for (int i = 1; i < nsocks_; ++i) {
    uint64_t b, e;
    framePart(f.size, f.split, nsocks_, i, &b, &e);
    if (e > b) ++n;
  }
  return n;
}

Status SocketComm::isend(const void* data, size_t size, int tag, void** request) {
  *request = nullptr;
  if (role_ != Role::kSend)
    return LOOM_ERROR(kInvalidUsage, "socket transport: isend on a receive comm");
  if (failed_.load(std::memory_order_acquire)) return failure();
  if (size > 0 && data == nullptr)
    return LOOM_ERROR(kInvalidArgument,
                      "socket transport: isend of {} bytes from a null pointer to {}", size, peer_);
  if (freeRequests_.empty() || !canPost(1)) return Status();
  SocketRequest* r = allocRequest();
  uint64_t n = nextFrame_;
  Frame& f = frame(n);
  f.data = static_cast<char*>(const_cast<void*>(data));
  f.size = size;
  f.split =
      nsocks_ > 1 && size > 0 && static_cast<int64_t>(size) >= std::max<int64_t>(opt_.minSplit, 1);
  f.header = FrameHeader{kSocketFrameMagic, static_cast<uint32_t>(n), size, tag,
                         f.split ? kFrameSplit : 0u};
  f.req = r;
  f.pending.store(sharers(f), std::memory_order_relaxed);
  r->firstFrame = n;
  r->n = 1;
  r->received[0] = size;
  nextFrame_ = n + 1;
  posted_.store(nextFrame_, std::memory_order_seq_cst);  // publishes f; see helperLoop
  wakeHelpers();
  *request = r;
  return Status();
}

Status SocketComm::irecv(int n, void** data, const size_t* sizes, const int* tags, void** request) {
  *request = nullptr;
  if (role_ != Role::kRecv)
    return LOOM_ERROR(kInvalidUsage, "socket transport: irecv on a send comm");
  if (failed_.load(std::memory_order_acquire)) return failure();
  if (n < 1 || n > kSocketMaxRecvs)
    return LOOM_ERROR(kInvalidArgument, "socket transport: irecv of {} buffers from {} (1 to {})",
                      n, peer_, kSocketMaxRecvs);
  if (data == nullptr || sizes == nullptr || tags == nullptr)
    return LOOM_ERROR(kInvalidArgument, "socket transport: irecv from {} with null arrays", peer_);
  for (int j = 0; j < n; ++j)
    if (sizes[j] > 0 && data[j] == nullptr)
      return LOOM_ERROR(kInvalidArgument,
                        "socket transport: irecv of {} bytes into a null pointer from {}", sizes[j],
                        peer_);
  if (freeRequests_.empty() || !canPost(n)) return Status();
  SocketRequest* r = allocRequest();
  r->firstFrame = nextFrame_;
  r->n = n;
  for (int j = 0; j < n; ++j) {
    r->data[j] = static_cast<char*>(data[j]);
    r->capacity[j] = sizes[j];
    r->tags[j] = tags[j];
    r->matched[j] = false;
    r->received[j] = 0;
  }
  for (int j = 0; j < n; ++j) {
    Frame& f = frame(nextFrame_ + j);
    f.req = r;
    f.data = nullptr;
    f.size = 0;
    f.split = false;
    f.pending.store(1, std::memory_order_relaxed);  // until its header says who carries it
  }
  nextFrame_ += n;
  posted_.store(nextFrame_, std::memory_order_seq_cst);
  wakeHelpers();
  *request = r;
  return Status();
}

void SocketComm::finishShare(Frame& f) {
  // f may be reused as soon as pending reaches 0: touch nothing of it afterwards.
  if (f.pending.fetch_sub(1, std::memory_order_seq_cst) == 1 && !helpers_.empty()) notifyWaiter();
}

Result<size_t> SocketComm::stepSend(int i, size_t budget) {
  Sock& s = socks_[i];
  const uint64_t hdr = i == 0 ? sizeof(FrameHeader) : 0;
  const uint64_t avail = std::min(posted_.load(std::memory_order_acquire), failFrame());
  size_t moved = 0;
  while (s.frame < avail && moved < budget) {
    Frame& f = frame(s.frame);
    uint64_t b, e;
    framePart(f.size, f.split, nsocks_, i, &b, &e);
    const uint64_t total = hdr + (e - b);
    if (total > 0) {
      iovec iov[2];
      int cnt = 0;
      if (s.off < hdr) iov[cnt++] = {reinterpret_cast<char*>(&f.header) + s.off, hdr - s.off};
      uint64_t p = s.off > hdr ? s.off - hdr : 0;
      if (b + p < e) iov[cnt++] = {f.data + b + p, e - b - p};
      auto r = cnt == 1 ? sendSome(s.fd.get(), iov[0].iov_base, iov[0].iov_len)
                        : sendvSome(s.fd.get(), iov, cnt);
      if (!r.isOk()) return ioError(r.status(), i, "sending");
      s.off += r.value();
      moved += r.value();
      if (s.off < total) break;  // the socket's buffer is full
      finishShare(f);
    }
    ++s.frame;
    s.off = 0;
    s.passed.store(s.frame, std::memory_order_release);
  }
  return moved;
}

Result<size_t> SocketComm::stepRecv(int i, size_t budget) {
  Sock& s = socks_[i];
  const uint64_t hdr = i == 0 ? sizeof(FrameHeader) : 0;
  size_t moved = 0;
  while (moved < budget) {
    const uint64_t avail =
        std::min((i == 0 ? posted_ : headers_).load(std::memory_order_acquire), failFrame());
    if (s.frame >= avail) break;
    Frame& f = frame(s.frame);
    if (s.off < hdr) {
      auto r = recvSome(s.fd.get(), s.header + s.off, hdr - s.off);
      if (!r.isOk()) return ioError(r.status(), i, "receiving");
      s.off += r.value();
      moved += r.value();
      if (s.off < hdr) break;
      LOOM_TRY(acceptHeader(s.frame));
    }
    uint64_t b, e;
    framePart(f.size, f.split, nsocks_, i, &b, &e);
    const uint64_t total = hdr + (e - b);
    if (s.off < total) {
      uint64_t p = s.off - hdr;
      auto r = recvSome(s.fd.get(), f.data + b + p, e - b - p);
      if (!r.isOk()) return ioError(r.status(), i, "receiving");
      s.off += r.value();
      moved += r.value();
      if (s.off < total) break;  // drained what had arrived
    }
    if (total > 0) finishShare(f);
    ++s.frame;
    s.off = 0;
    s.passed.store(s.frame, std::memory_order_release);
  }
  return moved;
}

Status SocketComm::acceptHeader(uint64_t n) {
  Frame& f = frame(n);
  FrameHeader h;
  std::memcpy(&h, socks_[0].header, sizeof(h));
  Status valid = checkFrameHeader(h, n);
  if (!valid.isOk()) return valid.withContext(fmt::format("socket transport: from peer {}", peer_));
  SocketRequest* r = f.req;
  int slot = -1;
  for (int j = 0; j < r->n; ++j)
    if (!r->matched[j] && r->tags[j] == h.tag) {
      slot = j;
      break;
    }
  if (slot < 0) {
    std::string posted;
    for (int j = 0; j < r->n; ++j)
      if (!r->matched[j]) posted += (posted.empty() ? "" : ",") + std::to_string(r->tags[j]);
    return LOOM_ERROR(kRemote,
                      "socket transport: tag mismatch: peer {} sent a {}-byte message with tag {}, "
                      "the receive is posted for tag(s) {}",
                      peer_, h.size, h.tag, posted)
        .withCause(Cause::kMismatch);
  }
  if (h.size > r->capacity[slot])
    return LOOM_ERROR(kRemote,
                      "socket transport: message truncated: peer {} sent {} bytes, receive posted "
                      "for {} (tag {})",
                      peer_, h.size, r->capacity[slot], h.tag)
        .withCause(Cause::kMismatch);
  r->matched[slot] = true;
  r->received[slot] = h.size;
  f.data = r->data[slot];
  f.size = h.size;
  f.split = (h.flags & kFrameSplit) != 0;
  f.pending.store(sharers(f), std::memory_order_relaxed);
  headers_.store(n + 1, std::memory_order_seq_cst);  // publishes f to the other sockets
  if (helpers_.size() > 1) wakeHelpers(0);           // helper 0 owns socket 0: that is us
  return Status();
}

short SocketComm::wantEvents(int i) const {
  const Sock& s = socks_[i];
  if (s.dead || s.frame >= failFrame_.load(std::memory_order_seq_cst)) return 0;
  if (role_ == Role::kSend) return s.frame < posted_.load(std::memory_order_seq_cst) ? POLLOUT : 0;
  const auto& avail = i == 0 ? posted_ : headers_;
  return s.frame < avail.load(std::memory_order_seq_cst) ? POLLIN : 0;
}

void SocketComm::progressAll() {
  for (int i = 0; i < nsocks_; ++i) {
    Sock& s = socks_[i];
    if (s.dead) continue;
    auto r = step(i, kStepBudget);
    if (!r.isOk()) {
      s.dead = true;
      fail(r.status(), s.frame);
    }
  }
}

void SocketComm::advanceCompleted(std::memory_order order) {
  while (completed_ < nextFrame_ && frame(completed_).pending.load(order) == 0) ++completed_;
}

Status SocketComm::test(SocketRequest* req, int* done, size_t* sizes) {
  *done = 0;
  if (!helpersActive_) progressAll();
  advanceCompleted();
  if (req->firstFrame + req->n <= completed_) {
    *done = 1;
    if (sizes)
      for (int j = 0; j < req->n; ++j) sizes[j] = req->received[j];
    freeRequest(req);
    return Status();
  }
  if (breaks(req)) {
    // Helpers may still be writing into this request's buffers: stop them before the caller
    // reclaims the memory. Earlier requests then progress in test().
    stopHelpers();
    freeRequest(req);
    return failure();
  }
  return Status();
}

bool SocketComm::addWaitFds(const SocketRequest* req, std::vector<pollfd>* fds) {
  if (helpersActive_) {
    advanceCompleted(std::memory_order_seq_cst);  // after beginWait; see notifyWaiter
    if (req->firstFrame + req->n <= completed_) return false;
    if (failed_.load(std::memory_order_seq_cst) && req->firstFrame + req->n > failFrame())
      return false;
    fds->push_back({notify_.get(), POLLIN, 0});
    return true;
  }
  advanceCompleted();
  if (req->firstFrame + req->n <= completed_ || breaks(req)) return false;
  for (int i = 0; i < nsocks_; ++i) {
    short ev = wantEvents(i);
    if (ev) fds->push_back({socks_[i].fd.get(), ev, 0});
  }
  return true;
}

Status SocketComm::ioError(const Status& st, int i, const char* what) const {
  if (st.code() == Code::kRemote)
    return st.rewritten(
        Code::kRemote,
        fmt::format("socket transport: connection closed by peer {} while {} (socket {} of {}: {})",
                    peer_, what, i, nsocks_, st.message()));
  return st.rewritten(st.code(),
                      fmt::format("socket transport: {} while {} with peer {} (socket {} of {})",
                                  st.message(), what, peer_, i, nsocks_));
}

void SocketComm::fail(const Status& st, uint64_t frame) {
  bool first;
  {
    std::lock_guard<std::mutex> lk(failMu_);
    first = failure_.isOk();
    if (!first && frame >= failFrame_.load(std::memory_order_relaxed)) return;
    failure_ = st;
    failFrame_.store(frame, std::memory_order_seq_cst);
  }
  if (first) LOOM_WARN("{}", st.message());
  failed_.store(true, std::memory_order_seq_cst);
  for (auto& h : helpers_) signalEventFd(h->wake.get());
  if (!helpers_.empty()) notifyWaiter();
}

Status SocketComm::failure() const {
  std::lock_guard<std::mutex> lk(failMu_);
  return failure_;
}

}  // namespace net
}  // namespace loom
