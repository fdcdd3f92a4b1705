// A rank's side of the bootstrap: the hello to the root, the ring join, and allGather over the
// ring. All sockets are nonblocking; every wait polls at most 100 ms at a time so that the abort
// flags are seen promptly even when no socket was shut down.
#include "src/bootstrap/bootstrap.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "src/bootstrap/wire.h"
#include "src/core/log.h"

namespace loom {

struct Bootstrap::Impl {
  int rank = -1;
  int nranks = 0;
  uint64_t secret = 0;
  std::vector<std::string> blobs;
  std::vector<SockAddr> listeners;
  SockAddr listenAddr;
  bool joined = false;
  bool prevLeft = false, nextLeft = false;  // neighbours that said goodbye (orderly destroy)

  std::mutex mu;  // guards the fds below against abort()'s shutdown() from another thread
  Fd listener, next, prev;

  std::atomic<bool> aborted{false};
  const std::atomic<bool>* extAbort = nullptr;  // the caller's flag, only during connect/joinRing
  Status broken;                                // first failure of a ring operation

  int nextRank() const { return (rank + 1) % nranks; }
  int prevRank() const { return (rank + nranks - 1) % nranks; }
  // What ends a blocking socket wait of this bootstrap early (socket_util's connectWithRetry,
  // sendAll, recvAll): abort() or the caller's flag.
  AbortFlags abortFlags() const { return AbortFlags(&aborted, extAbort); }
  bool isAborted() const { return abortFlags().raised(); }
  Status abortedError(const std::string& during) const {
    return LOOM_ERROR(kAborted, "bootstrap rank {}: aborted during {}", rank, during);
  }

  Status openListener(const SockAddr& at);
  void setFd(Fd* slot, Fd fd) {
    std::lock_guard<std::mutex> lk(mu);
    *slot = std::move(fd);
  }

  Status rendezvous(const UniqueIdInfo& id, const std::string& blob, const Deadline& deadline);
  Status joinRing(const Deadline& deadline);
  Status acceptPrev(const Deadline& deadline);

  Status allGather(const void* mine, size_t bytes, void* all, const Deadline& deadline);
  // Records st as the bootstrap's failure and passes it to both neighbours (best effort).
  Status fail(Status st, int sendFd, bool sendAtBoundary, int failedRank);
};

namespace {

// Clears the caller's abort pointer when connect/joinRing returns: it may not outlive the call.
struct ExtAbortScope {
  Bootstrap::Impl* impl;
  ExtAbortScope(Bootstrap::Impl* i, const std::atomic<bool>* flag) : impl(i) {
    impl->extAbort = flag;
  }
  ~ExtAbortScope() { impl->extAbort = nullptr; }
};

}  // namespace

Status Bootstrap::Impl::openListener(const SockAddr& at) {
  SockAddr bound;
  LOOM_ASSIGN(Fd fd, listenOn(at, &bound));
  listenAddr = bound;
  setFd(&listener, std::move(fd));
  return Status();
}

Status Bootstrap::Impl::rendezvous(const UniqueIdInfo& id, const std::string& blob,
                                   const Deadline& deadline) {
  const std::string rootName = id.root.toString();
  wire::Hello mine;
  mine.secret = id.secret;
  mine.rank = rank;
  mine.nranks = nranks;
  mine.listener = listenAddr;
  std::string hello = wire::encodeHello(mine, blob);

  auto context = [&](const Status& st, const char* what) {
    if (st.code() == Code::kAborted) return abortedError("the rendezvous");
    if (st.code() == Code::kTimeout)
      return LOOM_ERROR(kTimeout, "bootstrap rank {} of {}: {} the root at {}: {}", rank, nranks,
                        what, rootName, st.message());
    return Status(st.code() == Code::kSystem ? Code::kSystem : Code::kRemote,
                  fmt::format("bootstrap rank {} of {}: {} the root at {}: {}", rank, nranks, what,
                              rootName, st.message()));
  };

  auto fdr = connectWithRetry(id.root, deadline, abortFlags());
  if (!fdr.isOk()) return context(fdr.status(), "cannot connect to");
  Fd root = std::move(fdr).value();
  // A Loom root acknowledges the hello at once. Silence, a hang-up or another protocol's bytes
  // instead mean that something else holds the root's port (rank 0 could not start the root
  // there): every rank says so within the handshake deadline instead of waiting for a table that
  // cannot come.
  const std::string heldBy =
      "(is the port in use by another program? rank 0 starts the root there and says why it could "
      "not)";
  auto hungUp = [&] {
    return LOOM_ERROR(kSystem,
                      "bootstrap rank {} of {}: what listens at {} closed the connection before "
                      "acknowledging this rank's hello: the root ended, or that is not a Loom root "
                      "{}",
                      rank, nranks, rootName, heldBy);
  };
  Status st = sendAll(root.get(), hello.data(), hello.size(), deadline, abortFlags());
  if (st.code() == Code::kRemote) return hungUp();
  if (!st.isOk()) return context(st, "cannot send the hello to");

  uint8_t head[wire::kReplyBytes];
  const int64_t ackMs = wire::handshakeTimeoutMs();
  const Deadline ackBy(
      deadline.timeoutMs() > 0 ? std::min<int64_t>(ackMs, deadline.remainingMs(INT32_MAX)) : ackMs);
  st = recvAll(root.get(), head, sizeof(head), ackBy, abortFlags());
  if (st.code() == Code::kTimeout)
    return LOOM_ERROR(
        kSystem,
        "bootstrap rank {} of {}: nothing acknowledged this rank's hello at {} within "
        "{} ms: what listens there is not a Loom root {}",
        rank, nranks, rootName, ackBy.timeoutMs(), heldBy);
  if (st.code() == Code::kRemote || st.code() == Code::kSystem) return hungUp();
  if (!st.isOk()) return context(st, "no acknowledgement from");
  auto reply = wire::decodeReplyHeader(head, sizeof(head), rank, nranks);
  if (!reply.isOk())
    return LOOM_ERROR(kSystem, "bootstrap rank {} of {}: what listens at {} answered: {} {}", rank,
                      nranks, rootName, reply.status().message(), heldBy);
  if (reply.value().kind == wire::kReplyAck) {
    LOOM_INFO(kSubBootstrap, "bootstrap rank {} of {}: checked in with the root at {}", rank,
              nranks, rootName);
    st = recvAll(root.get(), head, sizeof(head), deadline, abortFlags());
    if (st.code() == Code::kTimeout)
      return LOOM_ERROR(kTimeout,
                        "bootstrap rank {} of {}: no table from the root at {} within {} ms (have "
                        "all ranks started, with the same unique id?)",
                        rank, nranks, rootName, deadline.timeoutMs());
    if (!st.isOk()) return context(st, "no table from");
    reply = wire::decodeReplyHeader(head, sizeof(head), rank, nranks);
    if (!reply.isOk() || reply.value().kind == wire::kReplyAck)
      return LOOM_ERROR(kRemote, "bootstrap rank {}: the root at {}: {}", rank, rootName,
                        reply.isOk() ? "a second acknowledgement" : reply.status().message());
  }
  if (reply.value().kind == wire::kReplyError) {
    std::string text(std::min<uint64_t>(reply.value().payloadBytes, wire::kMaxErrorText), '\0');
    (void)recvAll(root.get(), &text[0], text.size(), Deadline(1000), abortFlags());
    return Status(wire::replyErrorCode(reply.value().code),
                  fmt::format("bootstrap rank {} of {}: {}", rank, nranks, text));
  }
  std::string payload(reply.value().payloadBytes, '\0');
  st = recvAll(root.get(), &payload[0], payload.size(), deadline, abortFlags());
  if (!st.isOk()) return context(st, "incomplete table from");
  root.reset();

  st = wire::decodeTable(payload.data(), payload.size(), nranks, &listeners, &blobs);
  if (!st.isOk())
    return LOOM_ERROR(kRemote, "bootstrap rank {}: the root at {}: {}", rank, rootName,
                      st.message());
  LOOM_INFO(kSubBootstrap, "bootstrap rank {} of {}: table received from {}", rank, nranks,
            rootName);
  return Status();
}

Status Bootstrap::Impl::acceptPrev(const Deadline& deadline) {
  struct Pending {
    Fd fd;
    SockAddr peer;
    int64_t startNs = 0;
    uint8_t buf[wire::kRingBytes];
    size_t got = 0;
  };
  std::vector<Pending> pending;
  const int from = prevRank();
  const int64_t handshakeNs = wire::handshakeTimeoutMs() * 1000000;
  auto dropped = [&](const Pending& p, const std::string& why) {
    LOOM_WARN("bootstrap rank {}: dropped connection from {} to the ring listener {}: {}", rank,
              p.peer.toString(), listenAddr.toString(), why);
  };
  while (true) {
    if (isAborted()) return abortedError("the ring join");
    if (deadline.expired())
      return LOOM_ERROR(kTimeout,
                        "bootstrap rank {} of {}: rank {} did not join the ring within {} ms", rank,
                        nranks, from, deadline.timeoutMs());
    std::vector<pollfd> pfds;
    pfds.push_back({listener.get(), POLLIN, 0});
    for (auto& p : pending) pfds.push_back({p.fd.get(), POLLIN, 0});
    ::poll(pfds.data(), pfds.size(), deadline.remainingMs(100));
    int64_t now = nowNs();
    for (size_t i = 0; i < pending.size(); ++i) {
      Pending& p = pending[i];
      if (pfds[i + 1].revents) {
        auto r = recvSome(p.fd.get(), p.buf + p.got, sizeof(p.buf) - p.got);
        if (!r.isOk()) {
          dropped(p, fmt::format("{} after {} handshake bytes", r.status().message(), p.got));
          p.fd.reset();
          continue;
        }
        p.got += r.value();
        if (p.got == sizeof(p.buf)) {
          Status why =
              wire::checkRing(p.buf, sizeof(p.buf), wire::kRingMagic, secret, from, rank, nranks);
          if (!why.isOk()) {
            dropped(p, why.message());
            p.fd.reset();
            continue;
          }
          std::string ack = wire::encodeRing(wire::kAckMagic, secret, rank, from, nranks);
          Status st = sendAll(p.fd.get(), ack.data(), ack.size(), deadline, abortFlags());
          if (!st.isOk()) {
            if (st.code() == Code::kAborted) return abortedError("the ring join");
            return Status(
                st.code() == Code::kTimeout ? Code::kTimeout : Code::kRemote,
                fmt::format("bootstrap rank {}: cannot answer rank {}'s ring handshake: {}", rank,
                            from, st.message()));
          }
          setFd(&prev, std::move(p.fd));
          return Status();
        }
      }
      if (p.fd.valid() && now - p.startNs > handshakeNs) {
        dropped(p, fmt::format("no handshake within {} ms", handshakeNs / 1000000));
        p.fd.reset();
      }
    }
    pending.erase(std::remove_if(pending.begin(), pending.end(),
                                 [](const Pending& p) { return !p.fd.valid(); }),
                  pending.end());
    if (pfds[0].revents & POLLIN) {
      while (true) {
        Pending p;
        auto r = tryAccept(listener.get(), &p.peer);
        if (!r.isOk()) {
          if (isAborted()) return abortedError("the ring join");
          return r.status().withContext(fmt::format("bootstrap rank {}: ring listener", rank));
        }
        if (!r.value().valid()) break;
        p.fd = std::move(r).value();
        p.startNs = now;
        pending.push_back(std::move(p));
      }
    }
  }
}

Status Bootstrap::Impl::joinRing(const Deadline& deadline) {
  if (nranks > 1) {
    const int to = nextRank();
    const std::string nextName = listeners[to].toString();
    auto ctx = [&](const Status& st, const std::string& what) {
      if (st.code() == Code::kAborted) return abortedError("the ring join");
      return Status(st.code() == Code::kTimeout ? Code::kTimeout : Code::kRemote,
                    fmt::format("bootstrap rank {} of {}: {} rank {} at {}: {}", rank, nranks, what,
                                to, nextName, st.message()));
    };
    // Connect and send our handshake first: the kernel completes the connection and buffers the
    // handshake without the successor's help, so every rank reaches acceptPrev and none waits in
    // a cycle.
    auto fdr = connectWithRetry(listeners[to], deadline, abortFlags());
    if (!fdr.isOk()) return ctx(fdr.status(), "cannot connect to");
    Fd fd = std::move(fdr).value();
    std::string hs = wire::encodeRing(wire::kRingMagic, secret, rank, to, nranks);
    Status st = sendAll(fd.get(), hs.data(), hs.size(), deadline, abortFlags());
    if (!st.isOk()) return ctx(st, "cannot send the ring handshake to");
    LOOM_TRY(acceptPrev(deadline));
    uint8_t ack[wire::kRingBytes];
    st = recvAll(fd.get(), ack, sizeof(ack), deadline, abortFlags());
    if (!st.isOk())
      return ctx(st, st.code() == Code::kTimeout ? "no ring handshake answer from"
                                                 : "ring handshake refused (see its log) by");
    Status why = wire::checkRing(ack, sizeof(ack), wire::kAckMagic, secret, to, rank, nranks);
    if (!why.isOk())
      return ctx(Status(Code::kRemote, why.message()), "bad ring handshake answer from");
    setFd(&next, std::move(fd));
  }
  setFd(&listener, Fd());  // no one else may connect now
  joined = true;
  LOOM_INFO(kSubBootstrap, "bootstrap rank {} of {}: ring joined", rank, nranks);
  return Status();
}

Status Bootstrap::Impl::fail(Status st, int sendFd, bool sendAtBoundary, int failedRank) {
  broken = st;
  if (st.code() == Code::kAborted) return st;
  std::string frame = wire::encodeErrorFrame(st.code(), st.message());
  // Best effort, briefly: the neighbours may be gone too. Data never flows towards prev, so a
  // frame there always starts at a frame boundary; towards next only if no data frame was cut.
  Deadline brief(1000);
  if (prev.valid() && failedRank != prevRank()) {
    (void)sendAll(prev.get(), frame.data(), frame.size(), brief, abortFlags());
  }
  if (next.valid() && failedRank != nextRank() && sendAtBoundary && sendFd >= 0) {
    (void)sendAll(next.get(), frame.data(), frame.size(), brief, abortFlags());
  }
  std::lock_guard<std::mutex> lk(mu);
  if (prev.valid()) ::shutdown(prev.get(), SHUT_WR);
  if (next.valid()) ::shutdown(next.get(), SHUT_WR);
  return st;
}

Status Bootstrap::Impl::allGather(const void* mine, size_t bytes, void* all,
                                  const Deadline& deadline) {
  if (!joined) return LOOM_ERROR(kInvalidUsage, "bootstrap: allGather before the ring is joined");
  if (!broken.isOk()) return broken;
  if (isAborted()) return abortedError("allGather");
  char* out = static_cast<char*>(all);
  if (mine != out + static_cast<size_t>(rank) * bytes)
    std::memmove(out + static_cast<size_t>(rank) * bytes, mine, bytes);
  if (nranks == 1) return Status();

  const int steps = nranks - 1;
  const int nextR = nextRank(), prevR = prevRank();
  const int nfd = next.get(), pfd = prev.get();
  auto chunk = [&](int c) {
    return out + static_cast<size_t>((c % nranks + nranks) % nranks) * bytes;
  };
  int sendStep = 0, recvStep = 0;
  // Outgoing frame of sendStep: header then the chunk; offset over both.
  uint8_t sendHdr[wire::kFrameBytes];
  size_t sendOff = 0;
  {
    std::string h = wire::encodeFrameHeader(wire::kFrameData, bytes);
    std::memcpy(sendHdr, h.data(), sizeof(sendHdr));
  }
  uint8_t recvHdr[wire::kFrameBytes];
  size_t recvOff = 0;
  uint8_t backHdr[wire::kFrameBytes];
  size_t backOff = 0;
  const size_t frameBytes = wire::kFrameBytes + bytes;

  auto closed = [&](int peer, const Status& st) {
    if (isAborted()) return abortedError("allGather");
    if (st.code() == Code::kRemote)
      return LOOM_ERROR(kRemote, "bootstrap: rank {} closed its connection (seen by rank {})", peer,
                        rank);
    return LOOM_ERROR(kRemote, "bootstrap: connection between ranks {} and {} failed: {}", rank,
                      peer, st.message());
  };
  // Reads the body of an error frame (header decoded: its length is in range) and turns it into
  // the Status it reports.
  auto errorFrame = [&](int fd, const wire::Frame& f, int peer) {
    std::string body(f.bytes, '\0');
    Status st = recvAll(fd, &body[0], body.size(), Deadline(2000), abortFlags());
    if (!st.isOk()) return closed(peer, st);
    auto e = wire::decodeErrorBody(body.data(), body.size());
    if (!e.isOk())
      return LOOM_ERROR(kRemote, "bootstrap rank {}: rank {}: {}", rank, peer,
                        e.status().message());
    Code code = static_cast<Code>(e.value().code);
    if (code != Code::kTimeout) code = Code::kRemote;
    return Status(code, e.value().text);
  };
  // The back channel carries error frames only: anything else is garbage.
  auto backFrame = [&]() -> Result<wire::Frame> {
    auto f = wire::decodeFrameHeader(backHdr, sizeof(backHdr));
    if (f.isOk() && f.value().kind != wire::kFrameError)
      return LOOM_ERROR(kInvalidArgument, "a frame of kind {} towards the predecessor",
                        f.value().kind);
    return f;
  };

  // The successor may have reported a failure just before its sockets went away (an error frame
  // sits unread on the back channel while the send to it already failed): that report names
  // the cause, so it is preferred to "closed".
  auto reportedBy = [&](int peer, Status local) {
    size_t need = sizeof(backHdr) - backOff;
    while (need > 0) {
      auto r = recvSome(nfd, backHdr + backOff, need);
      if (!r.isOk() || r.value() == 0) break;
      backOff += r.value();
      need -= r.value();
    }
    if (backOff < sizeof(backHdr)) return local;
    auto f = backFrame();
    if (!f.isOk()) return local;
    Status reported = errorFrame(nfd, f.value(), peer);
    return reported.message().find("closed its connection (seen by rank " + std::to_string(rank)) !=
                   std::string::npos
               ? local
               : reported;
  };
  while (sendStep < steps || recvStep < steps) {
    if (isAborted()) return fail(abortedError("allGather"), nfd, false, -1);
    bool progressed = false;
    // Send the chunk of sendStep once it is here: step 0 sends mine, step s what step s-1 got.
    if (sendStep < steps && sendStep <= recvStep) {
      const char* data = chunk(rank - sendStep);
      while (sendOff < frameBytes) {
        Result<size_t> r =
            sendOff < wire::kFrameBytes
                ? sendSome(nfd, sendHdr + sendOff, wire::kFrameBytes - sendOff)
                : sendSome(nfd, data + (sendOff - wire::kFrameBytes), frameBytes - sendOff);
        if (!r.isOk()) return fail(reportedBy(nextR, closed(nextR, r.status())), nfd, false, nextR);
        if (r.value() == 0) break;
        sendOff += r.value();
        progressed = true;
      }
      if (sendOff == frameBytes) {
        ++sendStep;
        sendOff = 0;
      }
    }
    // Receive the chunk of recvStep.
    while (recvStep < steps) {
      char* data = chunk(rank - recvStep - 1);
      Result<size_t> r =
          recvOff < wire::kFrameBytes
              ? recvSome(pfd, recvHdr + recvOff, wire::kFrameBytes - recvOff)
              : recvSome(pfd, data + (recvOff - wire::kFrameBytes), frameBytes - recvOff);
      if (!r.isOk()) return fail(closed(prevR, r.status()), nfd, sendOff == 0, prevR);
      if (r.value() == 0) break;
      progressed = true;
      bool headerNow = recvOff < wire::kFrameBytes && recvOff + r.value() == wire::kFrameBytes;
      recvOff += r.value();
      if (headerNow) {
        auto f = wire::decodeFrameHeader(recvHdr, sizeof(recvHdr));
        if (!f.isOk())
          return fail(LOOM_ERROR(kRemote, "bootstrap rank {}: garbage from rank {}: {}", rank,
                                 prevR, f.status().message()),
                      nfd, sendOff == 0, prevR);
        const uint32_t kind = f.value().kind;
        const uint64_t len = f.value().bytes;
        if (kind == wire::kFrameError)
          return fail(errorFrame(pfd, f.value(), prevR), nfd, sendOff == 0, -1);
        if (kind == wire::kFrameBye)
          return fail(LOOM_ERROR(kInvalidUsage,
                                 "bootstrap rank {}: rank {} destroyed the communicator during a "
                                 "collective bootstrap call (split)",
                                 rank, prevR),
                      nfd, sendOff == 0, prevR);
        if (len != bytes)
          return fail(LOOM_ERROR(kInvalidUsage,
                                 "bootstrap rank {}: rank {} sent {} bytes per rank, this rank "
                                 "expects {} (mismatched bootstrap calls)",
                                 rank, prevR, len, bytes),
                      nfd, sendOff == 0, -1);
      }
      if (recvOff == frameBytes) {
        ++recvStep;
        recvOff = 0;
      }
    }
    // The successor sends nothing back unless it failed; watch for that while we still owe it.
    if (sendStep < steps) {
      auto r = recvSome(nfd, backHdr + backOff, sizeof(backHdr) - backOff);
      if (!r.isOk()) return fail(reportedBy(nextR, closed(nextR, r.status())), nfd, false, nextR);
      backOff += r.value();
      if (backOff == sizeof(backHdr)) {
        auto f = backFrame();
        if (!f.isOk())
          return fail(LOOM_ERROR(kRemote, "bootstrap rank {}: garbage from rank {}: {}", rank,
                                 nextR, f.status().message()),
                      nfd, false, nextR);
        return fail(errorFrame(nfd, f.value(), nextR), nfd, false, -1);
      }
    }
    if (progressed) continue;
    if (deadline.expired()) {
      std::string waiting = recvStep < steps && (sendStep > recvStep || sendStep == steps)
                                ? fmt::format("data from rank {}", prevR)
                                : fmt::format("rank {} to take data", nextR);
      return fail(LOOM_ERROR(kTimeout,
                             "bootstrap rank {} of {}: allGather timed out after {} ms at step {} "
                             "of {}, waiting for {}",
                             rank, nranks, deadline.timeoutMs(), std::min(sendStep, recvStep) + 1,
                             steps, waiting),
                  nfd, sendOff == 0, -1);
    }
    pollfd pfds[2];
    int np = 0;
    if (recvStep < steps) pfds[np++] = {pfd, POLLIN, 0};
    if (sendStep < steps)
      pfds[np++] = {nfd, static_cast<short>(POLLIN | (sendStep <= recvStep ? POLLOUT : 0)), 0};
    ::poll(pfds, np, deadline.remainingMs(100));
  }
  return Status();
}

Bootstrap::Bootstrap(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Bootstrap::~Bootstrap() {
  // An orderly goodbye, so that neighbours still finishing their last operation do not take the
  // closed sockets for this rank's death. Not after a failure or an abort: those must be seen.
  Impl& s = *impl_;
  if (!s.joined || s.nranks == 1 || !s.broken.isOk() || s.isAborted()) return;
  std::string frame = wire::encodeFrameHeader(wire::kFrameBye, 0);
  Deadline brief(200);
  for (Fd* fd : {&s.prev, &s.next})
    if (fd->valid()) (void)sendAll(fd->get(), frame.data(), frame.size(), brief, s.abortFlags());
}

Result<std::unique_ptr<Bootstrap>> Bootstrap::connect(const UniqueIdInfo& id, int rank, int nranks,
                                                      const std::string& blob,
                                                      const Deadline& deadline,
                                                      const std::atomic<bool>* abort) {
  if (nranks < 1 || nranks > wire::kMaxRanks)
    return LOOM_ERROR(kInvalidArgument, "bootstrap: nranks {} out of range [1, {}]", nranks,
                      wire::kMaxRanks);
  if (rank < 0 || rank >= nranks)
    return LOOM_ERROR(kInvalidArgument, "bootstrap: rank {} out of range for nranks {}", rank,
                      nranks);
  if (blob.size() > wire::kMaxBlob)
    return LOOM_ERROR(kInvalidArgument, "bootstrap: blob of {} bytes exceeds the {} byte limit",
                      blob.size(), wire::kMaxBlob);
  if (id.root.family() != AF_INET && id.root.family() != AF_INET6)
    return LOOM_ERROR(kInvalidArgument, "bootstrap: the root address is not set");
  auto impl = std::make_unique<Impl>();
  ExtAbortScope scope(impl.get(), abort);
  impl->rank = rank;
  impl->nranks = nranks;
  impl->secret = id.secret;
  LOOM_ASSIGN(Interface itf, interfaceFor(id.root));
  SockAddr at = itf.addr;
  at.setPort(0);
  LOOM_TRY(impl->openListener(at).withContext(
      fmt::format("bootstrap rank {}: cannot open a listener on {}", rank, itf.name)));
  LOOM_TRY(impl->rendezvous(id, blob, deadline));
  LOOM_TRY(impl->joinRing(deadline));
  return std::unique_ptr<Bootstrap>(new Bootstrap(std::move(impl)));
}

Result<std::unique_ptr<Bootstrap>> Bootstrap::prepare(uint64_t secret, const SockAddr* near) {
  auto impl = std::make_unique<Impl>();
  impl->secret = secret;
  Interface itf;
  if (near) {
    LOOM_ASSIGN(itf, interfaceFor(*near));
  } else {
    LOOM_ASSIGN(itf, defaultInterface());
  }
  SockAddr at = itf.addr;
  at.setPort(0);
  LOOM_TRY(impl->openListener(at).withContext(
      fmt::format("bootstrap: cannot open a listener on {}", itf.name)));
  return std::unique_ptr<Bootstrap>(new Bootstrap(std::move(impl)));
}

const SockAddr& Bootstrap::listenAddress() const { return impl_->listenAddr; }

Status Bootstrap::joinRing(int rank, std::vector<Member> members, const Deadline& deadline,
                           const std::atomic<bool>* abort) {
  Impl& s = *impl_;
  if (s.joined || !s.listener.valid())
    return LOOM_ERROR(kInvalidUsage, "bootstrap: joinRing needs a fresh prepare()");
  int n = static_cast<int>(members.size());
  if (n < 1 || n > wire::kMaxRanks)
    return LOOM_ERROR(kInvalidArgument, "bootstrap: joinRing with {} members", n);
  if (rank < 0 || rank >= n)
    return LOOM_ERROR(kInvalidArgument, "bootstrap: joinRing rank {} out of range for {} members",
                      rank, n);
  for (int i = 0; i < n; ++i)
    if (members[i].listener.family() != AF_INET && members[i].listener.family() != AF_INET6)
      return LOOM_ERROR(kInvalidArgument, "bootstrap: joinRing member {} has no address", i);
  ExtAbortScope scope(&s, abort);
  s.rank = rank;
  s.nranks = n;
  s.listeners.clear();
  s.blobs.clear();
  for (auto& m : members) {
    s.listeners.push_back(m.listener);
    s.blobs.push_back(std::move(m.blob));
  }
  return s.joinRing(deadline);
}

int Bootstrap::rank() const { return impl_->rank; }
int Bootstrap::nranks() const { return impl_->nranks; }
uint64_t Bootstrap::secret() const { return impl_->secret; }

const std::string& Bootstrap::blob(int rank) const {
  static const std::string* empty = new std::string();
  if (rank < 0 || rank >= static_cast<int>(impl_->blobs.size())) return *empty;
  return impl_->blobs[rank];
}

Status Bootstrap::allGather(const void* mine, size_t bytes, void* all, const Deadline& deadline) {
  return impl_->allGather(mine, bytes, all, deadline);
}

Status Bootstrap::barrier(const Deadline& deadline) {
  char mine = 0;
  std::vector<char> all(impl_->nranks > 0 ? impl_->nranks : 1);
  return impl_->allGather(&mine, 1, all.data(), deadline);
}

void Bootstrap::reportFailure(const Status& st) {
  Impl& s = *impl_;
  if (!s.joined || s.nranks == 1 || !s.broken.isOk()) return;
  (void)s.fail(st, s.next.get(), true, -1);
}

Status Bootstrap::pollFailure() {
  Impl& s = *impl_;
  if (!s.joined || s.nranks == 1) return Status();
  if (!s.broken.isOk()) return s.broken;
  const int peers[2] = {s.prevRank(), s.nextRank()};
  const int fds[2] = {s.prev.get(), s.next.get()};
  bool* left[2] = {&s.prevLeft, &s.nextLeft};
  for (int k = 0; k < 2; ++k) {
    if (fds[k] < 0 || *left[k]) continue;
    uint8_t hdr[wire::kFrameBytes];
    ssize_t n = ::recv(fds[k], hdr, sizeof(hdr), MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
    if (n == 0 || n < 0) {
      return s.fail(
          LOOM_ERROR(kRemote, "rank {} closed its bootstrap connection (it failed or was killed)",
                     peers[k]),
          s.next.get(), true, peers[k]);
    }
    if (static_cast<size_t>(n) < sizeof(hdr)) continue;  // the rest of the header is on its way
    auto f = wire::decodeFrameHeader(hdr, sizeof(hdr));
    if (f.isOk() && f.value().kind == wire::kFrameBye) {
      (void)::recv(fds[k], hdr, sizeof(hdr), MSG_DONTWAIT);
      *left[k] = true;
      LOOM_INFO(kSubBootstrap, "bootstrap rank {}: rank {} left the communicator", s.rank,
                peers[k]);
      continue;
    }
    // Data from the predecessor may arrive early (it entered the next bootstrap allGather
    // first): leave it for that call. Only (well-formed) error frames are failures.
    if (!f.isOk() || f.value().kind != wire::kFrameError) continue;
    std::string frame(sizeof(hdr) + f.value().bytes, '\0');
    if (!recvAll(fds[k], &frame[0], frame.size(), Deadline(2000), s.abortFlags()).isOk()) continue;
    auto e = wire::decodeErrorBody(frame.data() + sizeof(hdr), f.value().bytes);
    if (!e.isOk()) continue;
    Code code = static_cast<Code>(e.value().code);
    // Calls that differ between ranks keep their code on every rank (loomInvalidUsage).
    if (code != Code::kTimeout && code != Code::kAborted && code != Code::kInvalidUsage)
      code = Code::kRemote;
    return s.fail(Status(code, e.value().text), s.next.get(), true, -1);
  }
  return Status();
}

void Bootstrap::abort() {
  Impl& s = *impl_;
  s.aborted.store(true, std::memory_order_release);
  std::lock_guard<std::mutex> lk(s.mu);
  for (Fd* fd : {&s.listener, &s.next, &s.prev})
    if (fd->valid()) ::shutdown(fd->get(), SHUT_RDWR);
}

}  // namespace loom
