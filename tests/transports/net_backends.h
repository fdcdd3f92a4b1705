// The backends of the net::Transport conformance suite (net_conformance_test.cc): each brings its
// transport up, makes connections (in this process, and with a peer in another process) and says
// what it can do (Capabilities), so that one test body runs over all of them, Gloo's pattern. The
// backends' own test files build their fixtures on these classes too.
#pragma once

#include <dlfcn.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tests/transports/net_test_util.h"
#include "transports/ib/ib_transport.h"
#include "transports/ncclnet/ncclnet_transport.h"
#include "transports/shm/host_group.h"
#include "transports/socket/socket_transport.h"
#include "transports/socket/socket_util.h"

namespace loom {
namespace testing_util {

// One connection: what is sent on sendT/send arrives at recvT/recv. Both ends are on one transport
// where it connects to itself (sockets, IB, a plugin), on two (one per rank) for shared memory.
struct Link {
  net::Transport* sendT = nullptr;
  void* send = nullptr;
  net::Transport* recvT = nullptr;
  void* recv = nullptr;
  std::shared_ptr<void> owner;  // the ranks a link owns (shm), released by Backend::close
};

// What a backend does where net.h leaves room; the suite checks each claim, and skips (saying
// why) the tests of what a backend does not do.
struct Capabilities {
  // listen/connect/accept make connections; false: they exist once the transport is made (shm's
  // at attach).
  bool connects = true;
  int maxRecvs = kMaxGroup;  // the widest grouped receive, as getProperties says
  int maxInflight = 32;      // posts past this many per comm answer "not now"; 0: no limit
  // Which ends of a truncated or mismatched message fail with Cause::kMismatch. The receiver's
  // always fails; through the NCCL ABI it carries a result code, not a cause.
  bool receiverMismatchCause = true;
  bool senderSeesMismatch = false;  // the send fails too (IB: the sender matches the receive)
  bool survivesMismatch = false;    // the connection carries messages after one
  // A comm that failed (mismatch, peer gone) refuses later posts; false: it may accept them, and
  // then their test reports the error (shm, once its peer is gone).
  bool failedCommRefusesPosts = true;
  // Sends complete in posting order (receives always do); false: a send may complete before an
  // earlier one (shm single copy: an eager send is done once in the ring, a single-copy one once
  // the receiver read it).
  bool sendsCompleteInOrder = true;
  // Tests that find a known bug of this backend, by name, with the bug: they skip saying so.
  std::map<std::string, std::string> knownBugs;
  // Text an error of each kind contains (what happened, and the peer or plugin involved).
  std::vector<std::string> truncationText, tagMismatchText, peerGoneText;
};

class Backend {
 public:
  explicit Backend(std::string name) : name_(std::move(name)) {}
  virtual ~Backend() = default;
  const std::string& name() const { return name_; }
  const Capabilities& caps() const { return caps_; }

  // Brings the transport up (the environment it sets lives as long as the backend). Sets *skip
  // instead when what it needs is absent on this machine.
  virtual Status setUp(std::string* skip) = 0;
  // A new connection in this process.
  virtual Status open(Link* link) = 0;
  // Closes both ends, requests in flight or not.
  virtual void close(Link* link) = 0;
  // One end goes away as a rank that leaves would (the other end stays).
  virtual Status hangUp(Link* link, bool sendEnd) = 0;
  // The objects the transport holds on its device ("qp 2, mr 1"), empty where nobody counts them.
  virtual std::string liveObjects() const { return ""; }

  // A connection with a peer process: the parent fills *handle with what the child needs (sent
  // through a pipe), then calls acceptPeer until link->recv is set; the child, this binary
  // started afresh, calls connectToPeer with that handle and sends on link->send.
  virtual Status listenForPeer(net::Handle* handle) = 0;
  virtual Status acceptPeer(int pid, Link* link) = 0;
  virtual Status connectToPeer(const net::Handle& handle, Link* link) = 0;

 protected:
  std::string name_;
  Capabilities caps_;
  ScopedEnv env_;
};

// A transport that connects to itself: both ends of a link are on one instance.
class NetBackend : public Backend {
 public:
  using Backend::Backend;
  ~NetBackend() override {
    if (listen_) {
      EXPECT_TRUE(t_->closeListen(listen_).isOk());
    }
  }
  net::Transport* transport() const { return t_.get(); }

  Status open(Link* link) override {
    Pair p;
    LOOM_TRY(connectPair(t_.get(), 0, &p));
    *link = Link{t_.get(), p.send, t_.get(), p.recv, nullptr};
    return Status();
  }
  void close(Link* link) override {
    Pair p{link->send, link->recv};
    closePair(t_.get(), &p);
    *link = Link();
  }
  Status hangUp(Link* link, bool sendEnd) override {
    void** end = sendEnd ? &link->send : &link->recv;
    Status st = sendEnd ? t_->closeSend(*end) : t_->closeRecv(*end);
    *end = nullptr;
    return st;
  }
  Status listenForPeer(net::Handle* handle) override { return t_->listen(0, handle, &listen_); }
  Status acceptPeer(int, Link* link) override {
    link->recvT = t_.get();
    LOOM_TRY(t_->accept(listen_, &link->recv));
    if (link->recv == nullptr) t_->waitActivity(nullptr, 0, listen_, 10);
    return Status();
  }
  Status connectToPeer(const net::Handle& handle, Link* link) override {
    link->sendT = t_.get();
    Deadline deadline(kTestDeadlineMs);
    while (link->send == nullptr) {
      LOOM_TRY(t_->connect(0, handle, &link->send));
      if (deadline.expired()) return LOOM_ERROR(kTimeout, "test: no connection to the parent");
    }
    return Status();
  }

 protected:
  std::unique_ptr<net::Transport> t_;
  void* listen_ = nullptr;
};

// TCP over loopback, with nsocks sockets per connection and nthreads helper threads.
class SocketBackend : public NetBackend {
 public:
  SocketBackend(int nsocks, int nthreads)
      : NetBackend("SocketSocks" + std::to_string(nsocks) + "Threads" + std::to_string(nthreads)),
        nsocks_(nsocks),
        nthreads_(nthreads) {
    caps_.truncationText = {"message truncated", "127.0.0.1"};
    caps_.tagMismatchText = {"tag mismatch", "127.0.0.1"};
    caps_.peerGoneText = {"connection closed by peer 127.0.0.1:"};
  }
  Status setUp(std::string*) override {
    env_.set("LOOM_SOCKET_IFNAME", "=lo");
    env_.set("LOOM_SOCKET_NSOCKS", std::to_string(nsocks_));
    env_.set("LOOM_SOCKET_NTHREADS", std::to_string(nthreads_));
    t_ = makeSocketTransport();
    if (!t_) return LOOM_ERROR(kSystem, "test: no socket transport on loopback");
    return Status();
  }

 private:
  int nsocks_, nthreads_;
};

// InfiniBand verbs: on the emulated device (fakeVerbsLib, tests/transports/ib/fake_verbs) or, with
// an empty fakeVerbsLib, on the real libibverbs where it lists an ACTIVE port (else it skips).
class IbBackend : public NetBackend {
 public:
  IbBackend(std::string name, std::string fakeVerbsLib, int qps = 1)
      : NetBackend(std::move(name)), fake_(std::move(fakeVerbsLib)), qps_(qps) {
    caps_.senderSeesMismatch = true;
    caps_.survivesMismatch = true;
    caps_.truncationText = {"truncated"};
    caps_.tagMismatchText = {"tag mismatch"};
    caps_.peerGoneText = {"127.0.0.1"};
  }
  bool fake() const { return !fake_.empty(); }
  const std::string& why() const { return why_; }

  Status setUp(std::string* skip) override {
    env_.set("LOOM_SOCKET_IFNAME", "=lo");
    env_.set("LOOM_TIMEOUT", "60");
    if (qps_ != 1) env_.set("LOOM_IB_QPS_PER_CONNECTION", std::to_string(qps_));
    if (fake()) {
      env_.set("LOOM_IBVERBS_LIB", fake_);
      env_.set("LOOMTEST_FAKEVERBS_DEVICES", "mlx5_0");
    } else {
      env_.set("LOOM_IBVERBS_LIB", "libibverbs.so.1");
    }
    t_ = makeIbTransport(&why_);
    if (t_) return Status();
    if (fake()) return LOOM_ERROR(kSystem, "the emulated device did not come up: {}", why_);
    *skip = "no real RDMA device with an ACTIVE port here: " + why_;
    return Status();
  }

  // A loomtest_fakeverbs_* control of the emulated device (null on real hardware).
  template <typename Fn>
  Fn control(const char* symbol) const {
    if (!fake()) return nullptr;
    void* h = dlopen(fake_.c_str(), RTLD_NOW | RTLD_LOCAL);
    return h ? reinterpret_cast<Fn>(dlsym(h, symbol)) : nullptr;
  }
  // Live objects of one kind ("qp", "mr", ...) on the emulated device, -1 on real hardware.
  int count(const char* kind) const {
    auto fn = control<int (*)(const char*)>("loomtest_fakeverbs_count");
    return fn ? fn(kind) : -1;
  }
  std::string liveObjects() const override {
    if (!fake()) return "";
    return "qp " + std::to_string(count("qp")) + ", mr " + std::to_string(count("mr"));
  }

 private:
  std::string fake_;
  int qps_;
  std::string why_;
};

// An NCCL net plugin through the importer (loadNcclNetPlugin), driving one ABI version: Loom's
// own libnccl-net-loom.so, whose Loom uses sockets on loopback.
class NcclPluginBackend : public NetBackend {
 public:
  NcclPluginBackend(std::string path, int version)
      : NetBackend("NcclPluginV" + std::to_string(version)),
        path_(std::move(path)),
        version_(version) {
    // NCCL's ABI has result codes, no causes: Loom's plugin returns ncclInvalidUsage for a
    // message that does not fit its receive, which the importer reads as Cause::kMismatch (any
    // other plugin may say ncclRemoteError or ncclInternalError instead).
    const std::string plugin = "NCCL net plugin " + path_;
    const std::string abi = "ABI v" + std::to_string(version_);
    caps_.truncationText = {"message truncated", plugin, abi, "test failed"};
    caps_.tagMismatchText = {"tag mismatch", plugin, abi};
    caps_.peerGoneText = {plugin, abi, "ncclRemoteError"};
  }
  // The environment the plugin's own Loom reads when it first initialises (it keeps its choice
  // for the life of the process): sockets on loopback.
  static void pluginEnv(ScopedEnv* env) {
    env->set("LOOM_SOCKET_IFNAME", "=lo");
    env->set("LOOM_NET", "");
    ::unsetenv("LOOM_NET");
    reloadParams();
  }
  Status setUp(std::string*) override {
    pluginEnv(&env_);
    auto t = loadNcclNetPlugin(path_, version_);
    if (!t.isOk()) return t.status();
    t_ = std::move(t).value();
    return Status();
  }
  int version() const { return version_; }

 private:
  std::string path_;
  int version_;
};

// Two ranks of one shared-memory segment, each with its own shm::HostGroup (t[i]: its rings).
struct ShmRanks {
  std::unique_ptr<shm::HostGroup> g[2];
  shm::Transport* t[2] = {nullptr, nullptr};
};

inline std::string uniqueShmName() {
  static std::atomic<int> n{0};
  return "/loom-test-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
}

// Both ranks in this process, with single copy probed as the runtime does.
inline Result<std::shared_ptr<ShmRanks>> makeShmRanks(const shm::Options& opts) {
  const std::string name = uniqueShmName();
  std::vector<shm::LocalPeer> peers = {{0, ::getpid()}, {1, ::getpid()}};
  const size_t bytes = shm::segmentBytes(2, opts);
  LOOM_ASSIGN(auto seg0, shm::Segment::create(name, bytes));
  shm::HostArea::format(seg0->base(), 2, opts);
  LOOM_ASSIGN(auto seg1, shm::Segment::open(name, bytes));
  seg0->unlink();
  auto ranks = std::make_shared<ShmRanks>();
  LOOM_ASSIGN(ranks->g[0], shm::HostGroup::attach(std::move(seg0), 0, peers, opts, nullptr));
  LOOM_ASSIGN(ranks->g[1], shm::HostGroup::attach(std::move(seg1), 1, peers, opts, nullptr));
  for (int i = 0; i < 2; ++i) ranks->t[i] = &ranks->g[i]->rings();
  for (auto& t : ranks->t) t->publishProbe();
  for (auto& t : ranks->t) t->probePeers();
  return ranks;
}

// The shared-memory transport: rank 0 sends, rank 1 receives. Eager (copies through the slots)
// or, with singleCopy, every message read from the sender's buffer by the receiver.
class ShmBackend : public Backend {
 public:
  ShmBackend(std::string name, bool singleCopy) : Backend(std::move(name)) {
    opts_.slotBytes = 4096;  // messages of more than a few KiB take several slots and laps
    opts_.slots = 4;
    opts_.llBytes = 4096;
    opts_.rtsMin = 1;
    opts_.singleCopyThreads = singleCopy;
    caps_.connects = false;
    caps_.maxRecvs = 1;
    caps_.maxInflight = 0;
    caps_.failedCommRefusesPosts = false;
    caps_.sendsCompleteInOrder = !singleCopy;
    caps_.truncationText = {"message truncated"};
    caps_.tagMismatchText = {"does not match the posted receive's tag"};
    caps_.peerGoneText = {"connection closed: rank"};
  }
  const shm::Options& options() const { return opts_; }

  Status setUp(std::string*) override { return Status(); }
  Status open(Link* link) override {
    LOOM_ASSIGN(auto ranks, makeShmRanks(opts_));
    *link =
        Link{ranks->t[0], ranks->t[0]->sendConn(1), ranks->t[1], ranks->t[1]->recvConn(0), ranks};
    return Status();
  }
  void close(Link* link) override {
    if (link->send) {
      EXPECT_TRUE(link->sendT->closeSend(link->send).isOk());
    }
    if (link->recv) {
      EXPECT_TRUE(link->recvT->closeRecv(link->recv).isOk());
    }
    *link = Link();  // the ranks go, requests in flight with them
  }
  // A rank that leaves sets its state word (closeSend and closeRecv do nothing on shm). The
  // sending end is rank 0 of the link's ShmRanks, the receiving end rank 1.
  Status hangUp(Link* link, bool sendEnd) override {
    static_cast<ShmRanks*>(link->owner.get())
        ->g[sendEnd ? 0 : 1]
        ->setState(shm::PeerState::kClosed);
    (sendEnd ? link->send : link->recv) = nullptr;
    return Status();
  }

  // The peer process opens the segment the parent created, named in the handle.
  Status listenForPeer(net::Handle* handle) override {
    const std::string name = uniqueShmName();
    LOOM_ASSIGN(seg_, shm::Segment::create(name, shm::segmentBytes(2, opts_)));
    shm::HostArea::format(seg_->base(), 2, opts_);
    std::memset(handle->bytes, 0, sizeof(handle->bytes));
    std::memcpy(handle->bytes, name.data(), std::min(name.size(), sizeof(handle->bytes) - 1));
    return Status();
  }
  Status acceptPeer(int pid, Link* link) override {
    if (!parent_) {
      std::vector<shm::LocalPeer> peers = {{0, ::getpid()}, {1, pid}};
      LOOM_ASSIGN(parent_, shm::HostGroup::attach(std::move(seg_), 0, peers, opts_, nullptr));
    }
    link->recvT = &parent_->rings();
    link->recv = parent_->rings().recvConn(1);
    return Status();
  }
  Status connectToPeer(const net::Handle& handle, Link* link) override {
    const std::string name(reinterpret_cast<const char*>(handle.bytes));
    LOOM_ASSIGN(auto seg, shm::Segment::open(name, shm::segmentBytes(2, opts_)));
    std::vector<shm::LocalPeer> peers = {{0, ::getppid()}, {1, ::getpid()}};
    LOOM_ASSIGN(child_, shm::HostGroup::attach(std::move(seg), 1, peers, opts_, nullptr));
    link->sendT = &child_->rings();
    link->send = child_->rings().sendConn(0);
    return Status();
  }

 private:
  shm::Options opts_;
  std::unique_ptr<shm::Segment> seg_;               // created, until the parent attaches
  std::unique_ptr<shm::HostGroup> parent_, child_;  // the ends of a link with a peer process
};

// A raw TCP client of a listener at addr, playing a stranger.
inline Fd strangerConnect(const SockAddr& addr) {
  auto fd = connectWithRetry(addr, Deadline(10000));
  EXPECT_TRUE(fd.isOk()) << fd.status().message();
  return fd.isOk() ? std::move(fd).value() : Fd();
}

// The local address of a connected socket, as the listener's warnings name the peer.
inline std::string localName(const Fd& fd) {
  sockaddr_storage ss;
  socklen_t len = sizeof(ss);
  EXPECT_EQ(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len), 0);
  SockAddr a;
  std::memcpy(&a.ss, &ss, len);
  a.len = len;
  return a.toString();
}

// One message of `size` bytes with `tag` into a buffer of `capacity` (a frame smaller than its
// buffer is fine): sizes, content and the bytes past the buffer checked. Posts retry while the
// transport answers "not now".
inline void roundTrip(const Link& l, size_t size, size_t capacity, int tag, uint64_t seed) {
  constexpr unsigned char kGuard = 0xab;
  constexpr size_t kGuardBytes = 4096;
  std::vector<unsigned char> src(size), dst(capacity + kGuardBytes, kGuard);
  fillPattern(src.data(), size, seed);
  Req s, r;
  s.t = l.sendT;
  r.t = l.recvT;
  void* buf = dst.data();
  Status st = postRetry(
      l.recvT,
      [&](void** req) { return l.recvT->irecv(l.recv, 1, &buf, &capacity, &tag, nullptr, req); },
      &r.handle);
  ASSERT_TRUE(st.isOk()) << st.message();
  st = postRetry(
      l.sendT,
      [&](void** req) { return l.sendT->isend(l.send, src.data(), size, tag, nullptr, req); },
      &s.handle, {&r});
  ASSERT_TRUE(st.isOk()) << st.message();
  ASSERT_TRUE(drive(l.recvT, {&s, &r})) << "size " << size << " did not complete";
  ASSERT_TRUE(s.status.isOk()) << s.status.message();
  ASSERT_TRUE(r.status.isOk()) << r.status.message();
  EXPECT_EQ(s.sizes[0], size);
  EXPECT_EQ(r.sizes[0], size);
  EXPECT_EQ(checkPattern(dst.data(), size, seed), -1) << "size " << size;
  for (size_t k = capacity; k < dst.size(); ++k)
    ASSERT_EQ(dst[k], kGuard) << "write past the buffer at " << k;
}

}  // namespace testing_util
}  // namespace loom
