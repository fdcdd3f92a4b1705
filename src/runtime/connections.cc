#include "src/runtime/connections.h"

#include <algorithm>
#include <cstring>

#include "src/core/log.h"

namespace loom {

namespace {

constexpr uint32_t kHelloMagic = 0x4c4d4831;  // "LMH1"
constexpr int kHelloTag = 0x7fff0000;
constexpr size_t kHelloBytes = 24;

void fillHello(unsigned char* out, int rank, int channel, uint64_t secret) {
  uint32_t magic = kHelloMagic, r = static_cast<uint32_t>(rank), c = static_cast<uint32_t>(channel);
  std::memcpy(out, &magic, 4);
  std::memcpy(out + 4, &r, 4);
  std::memcpy(out + 8, &c, 4);
  std::memset(out + 12, 0, 4);
  std::memcpy(out + 16, &secret, 8);
}

}  // namespace

Connections::~Connections() { close(true); }

Status Connections::listen(net::Transport* network, net::Handle* handle) {
  net_ = network;
  return net_->listen(0, handle, &listener_).withContext("opening the transport listener");
}

void Connections::setPeers(int rank, int nranks, uint64_t secret, std::vector<net::Handle> handles,
                           std::function<std::string(int)> describe) {
  rank_ = rank;
  nranks_ = nranks;
  secret_ = secret;
  handles_ = std::move(handles);
  describe_ = std::move(describe);
}

void Connections::buildTable(const std::vector<net::Transport*>& transports, int channels) {
  channels = std::max(1, channels);
  table_.assign(static_cast<size_t>(nranks_), std::vector<net::Transport*>(channels, net_));
  for (int peer = 0; peer < nranks_; ++peer)
    for (int ch = 0; ch < channels; ++ch) {
      net::Transport* best = nullptr;
      double bestUs = 0;
      for (net::Transport* t : transports) {
        if (!t) continue;
        net::Reach r = t->reach(peer, ch);
        if (r.reachable && (!best || r.latencyUs < bestUs)) {
          best = t;
          bestUs = r.latencyUs;
        }
      }
      if (best) table_[peer][ch] = best;
    }
}

MemKindSet Connections::acceptedKinds() const {
  MemKindSet kinds = static_cast<MemKindSet>(~0u);
  std::vector<net::Transport*> seen;
  for (const auto& row : table_)
    for (net::Transport* t : row) {
      if (!t || std::find(seen.begin(), seen.end(), t) != seen.end()) continue;
      seen.push_back(t);
      net::Properties props;
      MemKindSet k = 0;
      if (t->getProperties(0, &props).isOk()) {
        if (props.ptrSupport & net::kPtrHost) k |= kHostKinds;
        if (props.ptrSupport & net::kPtrCuda) k |= memKindBit(MemKind::kCudaDevice);
      }
      kinds &= k;
    }
  return seen.empty() ? kHostKinds : kinds;
}

net::Transport* Connections::transportFor(int peer, int channel) const {
  if (peer < 0 || peer >= static_cast<int>(table_.size())) return net_;
  const auto& row = table_[peer];
  return row[std::min(static_cast<size_t>(std::max(channel, 0)), row.size() - 1)];
}

Result<void*> Connections::sendConn(int peer, int channel) {
  net::Transport* t = transportFor(peer, channel);
  if (t != net_) return t->presetSendConn(peer);
  Connection& c = send_[{peer, channel}];
  if (c.ready) {
    if (c.helloReq) {
      int done = 0;
      Status st = net_->test(c.helloReq, &done, nullptr);
      if (!st.isOk()) {
        c.helloReq = nullptr;
        return st.withContext("sending hello to " + describe_(peer));
      }
      if (done) c.helloReq = nullptr;
    }
    return c.comm;
  }
  if (!c.comm) {
    LOOM_TRY(
        net_->connect(0, handles_[peer], &c.comm).withContext("connecting to " + describe_(peer)));
    if (!c.comm) return static_cast<void*>(nullptr);
    LOOM_TRACE(kSubNet, "connected to {} channel {}", describe_(peer), channel);
  }
  fillHello(c.hello, rank_, channel, secret_);
  void* req = nullptr;
  LOOM_TRY(net_->isend(c.comm, c.hello, kHelloBytes, kHelloTag, nullptr, &req));
  if (!req) return static_cast<void*>(nullptr);
  c.helloReq = req;
  c.ready = true;
  return c.comm;
}

Status Connections::acceptPending() {
  if (!listener_) return LOOM_ERROR(kRemote, "the communicator's listener is closed (it failed)");
  while (true) {
    void* rc = nullptr;
    LOOM_TRY(net_->accept(listener_, &rc).withContext("accepting a connection"));
    if (!rc) break;
    auto p = std::make_unique<Pending>();
    p->comm = rc;
    p->req = nullptr;
    pendingAccepts_.push_back(std::move(p));
  }
  for (size_t i = 0; i < pendingAccepts_.size();) {
    Pending& p = *pendingAccepts_[i];
    bool drop = false;
    if (!p.req) {
      void* buf = p.hello;
      size_t size = kHelloBytes;
      int tag = kHelloTag;
      Status st = net_->irecv(p.comm, 1, &buf, &size, &tag, nullptr, &p.req);
      if (!st.isOk()) drop = true;
    }
    if (!drop && p.req) {
      int done = 0;
      size_t got = 0;
      Status st = net_->test(p.req, &done, &got);
      if (!st.isOk()) {
        LOOM_WARN("dropping an incoming connection that failed before identifying itself: {}",
                  st.message());
        drop = true;
      } else if (done) {
        uint32_t magic, r, ch;
        uint64_t secret;
        std::memcpy(&magic, p.hello, 4);
        std::memcpy(&r, p.hello + 4, 4);
        std::memcpy(&ch, p.hello + 8, 4);
        std::memcpy(&secret, p.hello + 16, 8);
        if (got != kHelloBytes || magic != kHelloMagic || secret != secret_ ||
            static_cast<int>(r) >= nranks_ ||
            recv_.count({static_cast<int>(r), static_cast<int>(ch)})) {
          LOOM_WARN(
              "dropping an incoming connection with a bad hello (not a rank of this communicator)");
          drop = true;
        } else {
          Connection& c = recv_[{static_cast<int>(r), static_cast<int>(ch)}];
          c.comm = p.comm;
          c.ready = true;
          LOOM_TRACE(kSubNet, "accepted {} channel {}", describe_(static_cast<int>(r)), ch);
          pendingAccepts_.erase(pendingAccepts_.begin() + i);
          continue;
        }
      }
    }
    if (drop) {
      (void)net_->closeRecv(p.comm);
      pendingAccepts_.erase(pendingAccepts_.begin() + i);
      continue;
    }
    ++i;
  }
  return Status();
}

Result<void*> Connections::recvConn(int peer, int channel) {
  net::Transport* t = transportFor(peer, channel);
  if (t != net_) return t->presetRecvConn(peer);
  auto it = recv_.find({peer, channel});
  if (it != recv_.end() && it->second.ready) return it->second.comm;
  LOOM_TRY(acceptPending());
  it = recv_.find({peer, channel});
  if (it != recv_.end() && it->second.ready) return it->second.comm;
  return static_cast<void*>(nullptr);
}

void Connections::close(bool withListener) {
  if (!net_) return;
  for (auto& [k, c] : send_)
    if (c.comm) (void)net_->closeSend(c.comm);
  for (auto& [k, c] : recv_)
    if (c.comm) (void)net_->closeRecv(c.comm);
  for (auto& p : pendingAccepts_) (void)net_->closeRecv(p->comm);
  send_.clear();
  recv_.clear();
  pendingAccepts_.clear();
  if (withListener && listener_) {
    (void)net_->closeListen(listener_);
    listener_ = nullptr;
  }
}

}  // namespace loom
