// The root of a rendezvous: a detached thread that owns one listener, collects every rank's hello,
// answers each rank with the table of all hellos, and exits. It never blocks on one connection:
// every socket is nonblocking and served from one poll loop, so a stranger that is silent, slow
// or malicious only costs itself a slot until its handshake deadline.
//
// The thread touches no object with a static destructor (the registry below is leaked on
// purpose), so a process may exit while a root is still waiting.
#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "src/bootstrap/bootstrap.h"
#include "src/bootstrap/wire.h"
#include "src/core/log.h"

namespace loom {
namespace {

// Roots started in this process, by advertised address; the flag turns true when a root exits.
struct RootRegistry {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<std::atomic<bool>>> roots;
};

RootRegistry& registry() {
  static RootRegistry* r = new RootRegistry();  // leaked: root threads may outlive main()
  return *r;
}

// Cap on connections that have not completed a hello (each holds an fd).
constexpr size_t kMaxPending = 1024;

class Root {
 public:
  Root(Fd listener, SockAddr addr, uint64_t secret, int64_t timeoutMs,
       std::shared_ptr<std::atomic<bool>> done)
      : listener_(std::move(listener)),
        addr_(addr),
        name_(addr.toString()),
        secret_(secret),
        timeoutMs_(timeoutMs),
        done_(std::move(done)) {}

  // Serves one rendezvous; returns when every rank has its table or the deadline passed.
  void run();

 private:
  struct Conn {
    Fd fd;
    SockAddr peer;
    int64_t startNs = 0;
    std::string in;  // bytes received so far
    size_t want = wire::kHelloBytes;
    bool headerDone = false;
    int rank = -1;  // set when the hello passed the header checks
    int nranks = 0;
    SockAddr listener;
    bool checkedIn = false;
    bool dead = false;
    size_t sent = 0;  // bytes of the reply sent
  };

  void acceptAll();
  // Reads what is available; drops the connection or checks it in when the hello is complete.
  void progress(Conn& c);
  // Validates a complete hello header; on failure returns the reason (and whether the peer
  // speaks our protocol, in which case it gets an error reply).
  bool checkHeader(Conn& c, std::string* why, bool* tellPeer);
  void checkIn(Conn& c);
  void drop(Conn& c, const std::string& why, bool tellPeer);
  void sendError(Conn& c, Code code, const std::string& text);
  void sendTables();
  void failAll();
  int checkedIn() const;

  Fd listener_;
  SockAddr addr_;
  std::string name_;
  uint64_t secret_;
  int64_t timeoutMs_;
  std::shared_ptr<std::atomic<bool>> done_;
  std::vector<std::unique_ptr<Conn>> conns_;
  std::vector<Conn*> byRank_;  // sized nranks_ once the first hello checked in
  int nranks_ = 0;
};

int Root::checkedIn() const {
  int n = 0;
  for (const Conn* c : byRank_) n += c != nullptr;
  return n;
}

void Root::acceptAll() {
  while (true) {
    SockAddr peer;
    auto r = tryAccept(listener_.get(), &peer);
    if (!r.isOk()) {
      LOOM_WARN("bootstrap root {}: accept failed: {}", name_, r.status().message());
      return;
    }
    if (!r.value().valid()) return;
    size_t pending = 0;
    for (auto& c : conns_) pending += !c->checkedIn;
    if (pending >= kMaxPending) {
      LOOM_WARN("bootstrap root {}: dropped connection from {}: {} handshakes already pending",
                name_, peer.toString(), pending);
      continue;  // the Fd closes
    }
    auto c = std::make_unique<Conn>();
    c->fd = std::move(r).value();
    c->peer = peer;
    c->startNs = nowNs();
    LOOM_TRACE(kSubBootstrap, "bootstrap root {}: connection from {}", name_, peer.toString());
    conns_.push_back(std::move(c));
  }
}

bool Root::checkHeader(Conn& c, std::string* why, bool* tellPeer) {
  bool foreign = false;
  auto h = wire::decodeHello(c.in.data(), c.in.size(), secret_, nranks_, &foreign);
  *tellPeer = !foreign;
  if (!h.isOk()) {
    *why = h.status().message();
    return false;
  }
  c.rank = h.value().rank;
  c.nranks = h.value().nranks;
  c.listener = h.value().listener;
  c.want = wire::kHelloBytes + h.value().blobLen;
  return true;
}

void Root::sendError(Conn& c, Code code, const std::string& text) {
  std::string out = wire::encodeReplyError(code, text);
  // Best effort and nonblocking: a short message fits in any socket buffer.
  (void)sendSome(c.fd.get(), out.data(), out.size());
}

void Root::drop(Conn& c, const std::string& why, bool tellPeer) {
  LOOM_WARN("bootstrap root {}: dropped connection from {}: {}", name_, c.peer.toString(), why);
  if (tellPeer)
    sendError(c, Code::kInvalidArgument, "bootstrap root " + name_ + " rejected: " + why);
  if (c.checkedIn && c.rank >= 0 && c.rank < nranks_ && byRank_[c.rank] == &c)
    byRank_[c.rank] = nullptr;
  c.checkedIn = false;
  c.dead = true;
  c.fd.reset();
}

void Root::checkIn(Conn& c) {
  if (nranks_ != 0 && c.nranks != nranks_) {
    drop(c,
         fmt::format("rank {} says nranks {}, the first rank said {}", c.rank, c.nranks, nranks_),
         true);
    return;
  }
  if (nranks_ == 0) {
    nranks_ = c.nranks;
    byRank_.assign(nranks_, nullptr);
  }
  if (Conn* other = byRank_[c.rank]) {
    drop(c, fmt::format("rank {} already checked in from {}", c.rank, other->peer.toString()),
         true);
    return;
  }
  // The acknowledgement tells the rank at once that a Loom root holds this address (24 bytes on a
  // fresh connection: the socket's buffer takes them whole).
  const std::string ack =
      wire::encodeReplyHeader(wire::kReplyAck, static_cast<uint32_t>(c.rank), 0);
  Status sent = sendAll(c.fd.get(), ack.data(), ack.size(), Deadline(wire::handshakeTimeoutMs()));
  if (!sent.isOk()) {
    drop(c, fmt::format("rank {}: could not acknowledge its hello: {}", c.rank, sent.message()),
         false);
    return;
  }
  c.checkedIn = true;
  byRank_[c.rank] = &c;
  LOOM_INFO(kSubBootstrap, "bootstrap root {}: rank {} of {} checked in from {} ({} of {})", name_,
            c.rank, nranks_, c.peer.toString(), checkedIn(), nranks_);
}

void Root::progress(Conn& c) {
  if (c.checkedIn) {
    // A checked-in rank sends nothing more; readable means it hung up (or misbehaves).
    char b;
    auto r = recvSome(c.fd.get(), &b, 1);
    if (!r.isOk() || r.value() > 0)
      drop(c,
           fmt::format("rank {} {} before the rendezvous completed", c.rank,
                       r.isOk() ? "sent unexpected bytes" : "disconnected"),
           false);
    return;
  }
  while (c.in.size() < c.want) {
    size_t have = c.in.size();
    c.in.resize(c.want);
    auto r = recvSome(c.fd.get(), &c.in[have], c.want - have);
    c.in.resize(have + (r.isOk() ? r.value() : 0));
    if (!r.isOk()) {
      drop(c,
           fmt::format("{} after {} of {} hello bytes", r.status().message(), c.in.size(),
                       c.headerDone ? c.want : wire::kHelloBytes),
           false);
      return;
    }
    if (r.value() == 0) return;  // would block
    if (!c.headerDone && c.in.size() == wire::kHelloBytes) {
      std::string why;
      bool tell = false;
      if (!checkHeader(c, &why, &tell)) {
        drop(c, why, tell);
        return;
      }
      c.headerDone = true;
    }
  }
  checkIn(c);
}

void Root::sendTables() {
  std::string payload;
  for (int r = 0; r < nranks_; ++r) {
    const Conn& c = *byRank_[r];
    wire::appendTableEntry(&payload, c.listener, c.in.data() + wire::kHelloBytes,
                           c.in.size() - wire::kHelloBytes);
  }
  std::string msg =
      wire::encodeReplyHeader(wire::kReplyTable, static_cast<uint32_t>(nranks_), payload.size());
  msg += payload;
  // Every rank is waiting for its table: send to all of them at once so that one slow reader
  // does not hold up the others.
  int64_t sendMs = std::max<int64_t>(wire::handshakeTimeoutMs(), timeoutMs_);
  Deadline deadline(timeoutMs_ > 0 ? sendMs : 0);
  std::vector<Conn*> left(byRank_.begin(), byRank_.end());
  while (!left.empty()) {
    std::vector<pollfd> pfds;
    for (Conn* c : left) pfds.push_back({c->fd.get(), POLLOUT, 0});
    ::poll(pfds.data(), pfds.size(), deadline.remainingMs(100));
    for (size_t i = 0; i < left.size(); ++i) {
      Conn* c = left[i];
      auto r = sendSome(c->fd.get(), msg.data() + c->sent, msg.size() - c->sent);
      if (!r.isOk()) {
        LOOM_WARN("bootstrap root {}: could not send the table to rank {} at {}: {}", name_,
                  c->rank, c->peer.toString(), r.status().message());
        c->sent = msg.size();
      } else {
        c->sent += r.value();
      }
    }
    left.erase(
        std::remove_if(left.begin(), left.end(), [&](Conn* c) { return c->sent == msg.size(); }),
        left.end());
    if (!left.empty() && deadline.expired()) {
      for (Conn* c : left)
        LOOM_WARN("bootstrap root {}: timed out sending the table to rank {} at {}", name_, c->rank,
                  c->peer.toString());
      break;
    }
  }
  LOOM_INFO(kSubBootstrap, "bootstrap root {}: rendezvous of {} ranks complete", name_, nranks_);
}

void Root::failAll() {
  std::string text;
  if (nranks_ == 0) {
    text = fmt::format("rendezvous at {} timed out after {} ms: no rank checked in", name_,
                       timeoutMs_);
  } else {
    std::vector<int> missing;
    for (int r = 0; r < nranks_; ++r)
      if (!byRank_[r]) missing.push_back(r);
    text = fmt::format(
        "rendezvous at {} timed out after {} ms: {} of {} ranks checked in; "
        "missing ranks {}",
        name_, timeoutMs_, checkedIn(), nranks_, wire::formatRanks(missing.data(), missing.size()));
  }
  LOOM_WARN("bootstrap root: {}", text);
  for (Conn* c : byRank_)
    if (c) sendError(*c, Code::kTimeout, text);
}

void Root::run() {
  Deadline deadline(timeoutMs_);
  const int64_t startNs = nowNs();
  ProgressNotice notice(timeoutMs_);
  const int64_t handshakeNs = wire::handshakeTimeoutMs() * 1000000;
  LOOM_INFO(kSubBootstrap, "bootstrap root listening at {}", name_);
  while (true) {
    if (nranks_ > 0 && checkedIn() == nranks_) {
      sendTables();
      break;
    }
    if (deadline.expired()) {
      failAll();
      break;
    }
    const int64_t waitedMs = (nowNs() - startNs) / 1000000;
    if (notice.due(waitedMs)) {
      std::string timeout =
          timeoutMs_ > 0 ? fmt::format(" of {} (LOOM_TIMEOUT)", timeoutMs_ / 1000) : "";
      if (nranks_ == 0) {
        LOOM_WARN("bootstrap root {}: no rank checked in yet: {} s{}", name_, waitedMs / 1000,
                  timeout);
      } else {
        std::vector<int> missing;
        for (int r = 0; r < nranks_; ++r)
          if (!byRank_[r]) missing.push_back(r);
        LOOM_WARN("bootstrap root {}: waiting for ranks {} ({} of {} checked in): {} s{}", name_,
                  wire::formatRanks(missing.data(), missing.size()), checkedIn(), nranks_,
                  waitedMs / 1000, timeout);
      }
    }
    std::vector<pollfd> pfds;
    pfds.push_back({listener_.get(), POLLIN, 0});
    int64_t now = nowNs();
    int waitMs = deadline.remainingMs(100);
    for (auto& c : conns_) {
      pfds.push_back({c->fd.get(), POLLIN, 0});
      if (!c->checkedIn) {
        int64_t leftMs = (c->startNs + handshakeNs - now) / 1000000;
        waitMs = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(waitMs, leftMs + 1)));
      }
    }
    int rc = ::poll(pfds.data(), pfds.size(), waitMs);
    if (rc < 0 && errno != EINTR) {
      LOOM_WARN("bootstrap root {}: poll failed: {}", name_, strerror(errno));
      break;
    }
    now = nowNs();
    size_t count = conns_.size();  // acceptAll appends; new connections are polled next round
    for (size_t i = 0; i < count; ++i) {
      Conn& c = *conns_[i];
      if (pfds[i + 1].revents & (POLLIN | POLLHUP | POLLERR)) progress(c);
      if (!c.dead && !c.checkedIn && now - c.startNs > handshakeNs)
        drop(c,
             fmt::format("no complete hello within {} ms ({} bytes received)",
                         handshakeNs / 1000000, c.in.size()),
             false);
    }
    if (pfds[0].revents & POLLIN) acceptAll();
    conns_.erase(std::remove_if(conns_.begin(), conns_.end(),
                                [](const std::unique_ptr<Conn>& c) { return c->dead; }),
                 conns_.end());
  }
  for (auto& c : conns_)
    if (!c->checkedIn)
      LOOM_INFO(kSubBootstrap, "bootstrap root {}: closing unfinished connection from {}", name_,
                c->peer.toString());
}

bool isLocalAddress(const SockAddr& a) {
  if (a.isLoopback()) return true;
  for (const Interface& itf : findInterfaces("^", AF_UNSPEC)) {
    if (itf.addr.family() != a.family()) continue;
    if (a.family() == AF_INET &&
        std::memcmp(&reinterpret_cast<const sockaddr_in*>(&itf.addr.ss)->sin_addr,
                    &reinterpret_cast<const sockaddr_in*>(&a.ss)->sin_addr, 4) == 0)
      return true;
    if (a.family() == AF_INET6 &&
        std::memcmp(&reinterpret_cast<const sockaddr_in6*>(&itf.addr.ss)->sin6_addr,
                    &reinterpret_cast<const sockaddr_in6*>(&a.ss)->sin6_addr, 16) == 0)
      return true;
  }
  return false;
}

bool isWildcard(const SockAddr& a) {
  if (a.family() == AF_INET)
    return reinterpret_cast<const sockaddr_in*>(&a.ss)->sin_addr.s_addr == htonl(INADDR_ANY);
  if (a.family() == AF_INET6)
    return IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(&a.ss)->sin6_addr);
  return false;
}

SockAddr wildcardOf(const SockAddr& a) {
  SockAddr w;
  w.ss.ss_family = static_cast<sa_family_t>(a.family());
  w.len = a.family() == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  w.setPort(a.port());
  return w;
}

// Binds bindAt, starts the root thread and registers it. *advertised gets the address ranks
// must connect to. Caller holds registry().mu.
Status launchRoot(const SockAddr& bindAt, uint64_t secret, SockAddr* advertised) {
  SockAddr bound;
  LOOM_ASSIGN(Fd listener, listenOn(bindAt, &bound));
  if (isWildcard(bound)) {
    LOOM_ASSIGN(Interface itf, defaultInterface());
    SockAddr a = itf.addr;
    a.setPort(bound.port());
    bound = a;
  }
  auto done = std::make_shared<std::atomic<bool>>(false);
  auto root = std::make_unique<Root>(std::move(listener), bound, secret, defaultTimeoutMs(), done);
  try {
    std::thread([r = std::move(root), done]() mutable {
      try {
        r->run();
      } catch (...) {
        // Allocation failure: the ranks see the connection close and report it.
      }
      r.reset();  // closes every socket before the flag says the address is free
      done->store(true, std::memory_order_release);
    }).detach();
  } catch (const std::exception& e) {
    return LOOM_ERROR(kSystem, "cannot start the bootstrap root thread: {}", e.what());
  }
  registry().roots[bound.toString()] = done;
  *advertised = bound;
  return Status();
}

}  // namespace

Status createRootAndId(loomUniqueId* id, const SockAddr* at, uint64_t secret) {
  if (id == nullptr) return LOOM_ERROR(kInvalidArgument, "createRootAndId: id is null");
  SockAddr bindAt;
  if (at) {
    bindAt = *at;
  } else {
    LOOM_ASSIGN(Interface itf, defaultInterface());
    bindAt = itf.addr;
    bindAt.setPort(0);
  }
  UniqueIdInfo info;
  info.secret = secret != 0 ? secret : randomU64();
  std::lock_guard<std::mutex> lk(registry().mu);
  LOOM_TRY(launchRoot(bindAt, info.secret, &info.root)
               .withContext("bootstrap: cannot open the root listener at " + bindAt.toString()));
  packUniqueId(info, id);
  return Status();
}

Status startRootAt(const UniqueIdInfo& info) {
  RootRegistry& reg = registry();
  std::lock_guard<std::mutex> lk(reg.mu);
  auto it = reg.roots.find(info.root.toString());
  if (it != reg.roots.end() && !it->second->load(std::memory_order_acquire)) {
    LOOM_INFO(kSubBootstrap, "bootstrap root at {} already running in this process",
              info.root.toString());
    return Status();
  }
  SockAddr bindAt = info.root;
  if (!isLocalAddress(bindAt)) {
    // A name that resolves to an address this host does not own (a service VIP, NAT): listen on
    // every interface at that port so that traffic forwarded to this host still reaches us.
    LOOM_INFO(kSubBootstrap,
              "bootstrap root address {} is not local; listening on all interfaces at port {}",
              bindAt.toString(), bindAt.port());
    bindAt = wildcardOf(bindAt);
  }
  SockAddr advertised;
  LOOM_TRY(launchRoot(bindAt, info.secret, &advertised)
               .withContext("bootstrap: cannot start the root at " + info.root.toString()));
  reg.roots[info.root.toString()] = reg.roots[advertised.toString()];
  return Status();
}

}  // namespace loom
