// The net::Transport contract (transports/net.h), written once and run over every backend
// (net_backends.h), Gloo's pattern: sockets in several (sockets, helper threads) settings,
// InfiniBand on the emulated verbs device (with one and four queue pairs per connection, and on a
// real device where one is ACTIVE), Loom's NCCL net plugin through the importer at each ABI
// version, and shared memory, eager and single copy, where the contract applies. A test of what a
// backend does not do skips and says why. Peers that die are processes: this binary started
// afresh (spawnSelf), never a fork of a process that runs transport threads.
// LOOM_TEST_NCCL_PLUGIN_PATH and LOOMTEST_FAKEVERBS_LIB are the built libraries (CMake).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <functional>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/quick.h"
#include "tests/transports/net_backends.h"

namespace loom {
namespace {

using namespace testing_util;  // NOLINT(build/namespaces): the suite's vocabulary

constexpr unsigned char kGuard = 0xab;
constexpr size_t kGuardBytes = 4096;

// Every backend, by the name its tests carry.
std::vector<std::function<std::unique_ptr<Backend>()>> factories() {
  std::vector<std::function<std::unique_ptr<Backend>()>> f;
  for (auto [socks, threads] : {std::pair{1, 0}, {2, 0}, {4, 0}, {1, 2}, {2, 2}, {4, 2}})
    f.push_back([s = socks, t = threads] { return std::make_unique<SocketBackend>(s, t); });
  f.push_back([] { return std::make_unique<IbBackend>("IbFake", LOOMTEST_FAKEVERBS_LIB); });
  f.push_back([] { return std::make_unique<IbBackend>("IbFakeQps4", LOOMTEST_FAKEVERBS_LIB, 4); });
  f.push_back([] { return std::make_unique<IbBackend>("IbReal", ""); });
  for (int v = 8; v <= 12; ++v)
    f.push_back([v] { return std::make_unique<NcclPluginBackend>(LOOM_TEST_NCCL_PLUGIN_PATH, v); });
  f.push_back([] { return std::make_unique<ShmBackend>("ShmEager", false); });
  f.push_back([] { return std::make_unique<ShmBackend>("ShmSingleCopy", true); });
  return f;
}

std::vector<std::string> backendNames() {
  std::vector<std::string> names;
  for (auto& make : factories()) names.push_back(make()->name());
  return names;
}

std::unique_ptr<Backend> makeBackend(const std::string& name) {
  for (auto& make : factories()) {
    auto b = make();
    if (b->name() == name) return b;
  }
  return nullptr;
}

// --- The peer process ---------------------------------------------------------------------------

// What the peer process does once connected.
enum PeerPlan : int {
  kSendMessages = 0,  // kPeerMessages messages of peerMessageSize(m) with tag m, then exits 0
  kSendOneThenWait,   // one 5000-byte message (pattern 77, tag 1), then waits to be killed
  kSendForever,       // 1 MiB messages with tags 0, 1, ... until killed
};
constexpr int kPeerMessages = 20;
size_t peerMessageSize(int m) { return m == 0 ? 0 : (size_t(1) << (m % 23)) + m; }

bool sendOne(const Link& l, const void* data, size_t size, int tag) {
  Req s;
  s.t = l.sendT;
  auto post = [&](void** req) { return l.sendT->isend(l.send, data, size, tag, nullptr, req); };
  return postRetry(l.sendT, post, &s.handle).isOk() && drive(l.sendT, {&s}) && s.status.isOk();
}

// The peer: connects to the handle read from fd and follows its plan. Returns the exit code.
int peerMain(const std::string& backend, int fd, int plan) {
  auto b = makeBackend(backend);
  if (!b) return 10;
  std::string skip;
  if (!b->setUp(&skip).isOk() || !skip.empty()) return 11;
  net::Handle handle;
  if (::read(fd, handle.bytes, sizeof(handle.bytes)) != ssize_t(sizeof(handle.bytes))) return 12;
  Link l;
  if (!b->connectToPeer(handle, &l).isOk()) return 13;
  if (plan == kSendMessages) {
    for (int m = 0; m < kPeerMessages; ++m) {
      std::vector<unsigned char> buf(peerMessageSize(m));
      fillPattern(buf.data(), buf.size(), m);
      if (!sendOne(l, buf.data(), buf.size(), m)) return 14;
    }
    return l.sendT->closeSend(l.send).isOk() ? 0 : 15;
  }
  if (plan == kSendOneThenWait) {
    std::vector<unsigned char> buf(5000);
    fillPattern(buf.data(), buf.size(), 77);
    if (!sendOne(l, buf.data(), buf.size(), 1)) return 16;
    while (true) ::pause();
  }
  std::vector<unsigned char> buf(1 << 20, 0x77);
  for (int m = 0;; ++m)
    if (!sendOne(l, buf.data(), buf.size(), m)) return 17;
}

// The peer is this binary started afresh with LOOMTEST_NET_PEER="<backend> <fd> <plan>": it runs
// peerMain before main (before gtest) and never returns.
const int kPeerRan = [] {
  const char* v = std::getenv("LOOMTEST_NET_PEER");
  if (v && *v) {
    std::istringstream in(v);
    std::string backend;
    int fd = -1, plan = -1;
    in >> backend >> fd >> plan;
    ::_exit(peerMain(backend, fd, plan));
  }
  return 0;
}();

// --- The fixture --------------------------------------------------------------------------------

// A connection of the backend, closed when it goes: declare it after the buffers its requests
// use, so that requests still in flight never outlive them.
struct OpenLink {
  explicit OpenLink(Backend* b) : b_(b) { status = b->open(&l); }
  ~OpenLink() { b_->close(&l); }
  Backend* b_;
  Status status;
  Link l;
};

void expectMentions(const Status& st, const std::vector<std::string>& parts) {
  for (const std::string& part : parts)
    EXPECT_NE(st.message().find(part), std::string::npos)
        << "'" << part << "' not in: " << st.message();
}

bool untouched(const std::vector<unsigned char>& buf) {
  return std::all_of(buf.begin(), buf.end(), [](unsigned char c) { return c == kGuard; });
}

class NetConformance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    b_ = makeBackend(GetParam());
    ASSERT_NE(b_, nullptr);
    std::string skip;
    Status st = b_->setUp(&skip);
    ASSERT_TRUE(st.isOk()) << st.message();
    if (!skip.empty()) GTEST_SKIP() << skip;
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    auto bug = caps().knownBugs.find(test.substr(0, test.find('/')));
    if (bug != caps().knownBugs.end()) GTEST_SKIP() << "known bug: " << bug->second;
  }
  void TearDown() override { b_.reset(); }

  const Capabilities& caps() const { return b_->caps(); }

  static Status isend(const Link& l, const void* data, size_t size, int tag, Req* r,
                      void* mh = nullptr) {
    r->t = l.sendT;
    return l.sendT->isend(l.send, data, size, tag, mh, &r->handle);
  }
  static Status irecv(const Link& l, void* data, size_t size, int tag, Req* r, void* mh = nullptr) {
    r->t = l.recvT;
    return l.recvT->irecv(l.recv, 1, &data, &size, &tag, mh ? &mh : nullptr, &r->handle);
  }
  static Status irecvGroup(const Link& l, int n, void** data, const size_t* sizes, const int* tags,
                           Req* r) {
    r->t = l.recvT;
    return l.recvT->irecv(l.recv, n, data, sizes, tags, nullptr, &r->handle);
  }

  // A connection with the backend's peer process, which goes (killed) with it.
  struct PeerLink {
    explicit PeerLink(Backend* b) : b_(b) {}
    ~PeerLink() {
      child.kill();
      b_->close(&l);
    }
    Backend* b_;
    Link l;  // l.recv receives what the peer sends
    ChildProcess child;
  };

  // Starts the backend's peer process following `plan` and connects to it.
  void startPeer(PeerPlan plan, PeerLink* peer) {
    net::Handle handle;
    Status st = b_->listenForPeer(&handle);
    ASSERT_TRUE(st.isOk()) << st.message();
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const std::string what = GetParam() + " " + std::to_string(fds[0]) + " " + std::to_string(plan);
    peer->child.pid = spawnSelf("LOOMTEST_NET_PEER", what, fds[1]);
    ::close(fds[0]);
    const ssize_t wrote = ::write(fds[1], handle.bytes, sizeof(handle.bytes));
    ::close(fds[1]);
    ASSERT_GT(peer->child.pid, 0);
    ASSERT_EQ(wrote, ssize_t(sizeof(handle.bytes)));
    Deadline deadline(kTestDeadlineMs);
    while (peer->l.recv == nullptr) {
      ASSERT_FALSE(deadline.expired()) << "the peer never connected";
      st = b_->acceptPeer(peer->child.pid, &peer->l);
      ASSERT_TRUE(st.isOk()) << st.message();
      // A peer that failed before it connected ends the wait at once; one that did its part
      // and exited may still be accepted.
      const bool failed = peer->child.exited() &&
                          !(WIFEXITED(peer->child.status) && WEXITSTATUS(peer->child.status) == 0);
      if (peer->l.recv == nullptr && failed)
        FAIL() << "the peer exited before connecting (status " << peer->child.status << ")";
    }
  }

  // The second end of a failed exchange: where the transport fails the send too, with the cause
  // and the same words as the receive.
  void expectSendMismatch(const Req& s, const char* what, const std::vector<std::string>& text) {
    if (!caps().senderSeesMismatch) return;
    ASSERT_TRUE(s.finished) << "the send of a " << what << " did not end";
    ASSERT_FALSE(s.status.isOk()) << "the send of a " << what << " succeeded";
    EXPECT_EQ(s.status.cause(), Cause::kMismatch) << s.status.message();
    expectMentions(s.status, text);
  }

  // After a truncation or a tag mismatch: the connection carries the next message, or, where it
  // is broken for good, later receives report the error too.
  void expectAfterMismatch(const Link& l) {
    if (caps().survivesMismatch) {
      roundTrip(l, 3000, 4096, 10, 11);
      return;
    }
    expectLaterReceiveFails(l);
  }

  // A receive posted on a failed comm reports the error: refused, or failing when tested.
  void expectLaterReceiveFails(const Link& l) {
    std::vector<unsigned char> buf(16);
    Req later;
    Status st = irecv(l, buf.data(), buf.size(), 4, &later);
    if (caps().failedCommRefusesPosts || !st.isOk()) {
      EXPECT_FALSE(st.isOk()) << "a receive on a failed comm was accepted";
      EXPECT_EQ(later.handle, nullptr);
      return;
    }
    ASSERT_NE(later.handle, nullptr);
    ASSERT_TRUE(drive(l.recvT, {&later})) << "a receive on a failed comm hangs";
    EXPECT_FALSE(later.status.isOk()) << "a receive on a failed comm succeeded";
  }

  std::unique_ptr<Backend> b_;
};

// --- The contract -------------------------------------------------------------------------------

TEST_P(NetConformance, DevicesAndProperties) {
  OpenLink link(b_.get());
  ASSERT_TRUE(link.status.isOk()) << link.status.message();
  for (net::Transport* t : {link.l.sendT, link.l.recvT}) {
    ASSERT_GE(t->devices(), 1);
    net::Properties p;
    ASSERT_TRUE(t->getProperties(0, &p).isOk());
    EXPECT_FALSE(p.name.empty());
    EXPECT_NE(p.ptrSupport & net::kPtrHost, 0);
    EXPECT_EQ(p.maxRecvs, caps().maxRecvs);
  }
}

TEST_P(NetConformance, MissingDeviceIsRefused) {
  OpenLink link(b_.get());
  ASSERT_TRUE(link.status.isOk()) << link.status.message();
  for (net::Transport* t : {link.l.sendT, link.l.recvT}) {
    net::Properties p;
    EXPECT_FALSE(t->getProperties(t->devices(), &p).isOk()) << "a device past the last one";
    EXPECT_FALSE(t->getProperties(-1, &p).isOk());
  }
}

TEST_P(NetConformance, SizesZeroToSixtyFourMiB) {
  OpenLink link(b_.get());
  ASSERT_TRUE(link.status.isOk()) << link.status.message();
  std::vector<size_t> sizes = {
      0, 1, 7, 4095, 4096, 65535, 65536, 65537, (1 << 20) + 3, size_t(16) << 20, size_t(64) << 20};
  // Under the sanitizers (LOOMTEST_QUICK=1) up to 16 MiB: a message of several chunks, every slot
  // reused, as 64 MiB, at a quarter of the instrumented copying and checking.
  if (loomtest::quick()) sizes.pop_back();
  int tag = 0;
  for (size_t size : sizes) {
    SCOPED_TRACE(size);
    roundTrip(link.l, size, size, tag, 100 + tag);
    ++tag;
  }
}

// A frame smaller than the posted buffer: test() reports the size received.
TEST_P(NetConformance, ShortSendsReportTheSizeReceived) {
  OpenLink link(b_.get());
  ASSERT_TRUE(link.status.isOk()) << link.status.message();
  const std::pair<size_t, size_t> cases[] = {
      {1000, 1 << 20}, {0, 100}, {100000, 300000}, {3000, 4096}, {5, 200000}};
  int tag = 1;
  for (auto [size, capacity] : cases) {
    SCOPED_TRACE(::testing::Message() << size << " bytes into " << capacity);
    roundTrip(link.l, size, capacity, tag, tag);
    ++tag;
  }
}

// A window of messages posted at once: message k has tag k and the pattern of seed + k.
struct Window {
  Window(const std::vector<size_t>& sizes, uint64_t first)
      : seed(first), src(sizes.size()), dst(sizes.size()), s(sizes.size()), r(sizes.size()) {
    for (size_t k = 0; k < sizes.size(); ++k) {
      src[k].resize(sizes[k]);
      fillPattern(src[k].data(), sizes[k], seed + k);
      dst[k].assign(sizes[k], 0);
    }
  }
  uint64_t seed;
  std::vector<std::vector<unsigned char>> src, dst;
  std::vector<Req> s, r;
};

// Posts every send of the window, then every receive: each accepted at once.
void postAll(const Link& l, Window* w) {
  for (size_t k = 0; k < w->s.size(); ++k) {
    w->s[k].t = l.sendT;
    Status st = l.sendT->isend(l.send, w->src[k].data(), w->src[k].size(), static_cast<int>(k),
                               nullptr, &w->s[k].handle);
    ASSERT_TRUE(st.isOk()) << st.message();
    ASSERT_NE(w->s[k].handle, nullptr) << "send " << k << " was refused";
  }
  for (size_t k = 0; k < w->r.size(); ++k) {
    w->r[k].t = l.recvT;
    void* data = w->dst[k].data();
    size_t size = w->dst[k].size();
    int tag = static_cast<int>(k);
    Status st = l.recvT->irecv(l.recv, 1, &data, &size, &tag, nullptr, &w->r[k].handle);
    ASSERT_TRUE(st.isOk()) << st.message();
    ASSERT_NE(w->r[k].handle, nullptr) << "receive " << k << " was refused";
  }
}

// Drives the window to completion: every message arrives whole.
void completeAll(const Link& l, Window* w) {
  std::vector<Req*> all;
  for (size_t k = 0; k < w->s.size(); ++k) all.push_back(&w->s[k]), all.push_back(&w->r[k]);
  ASSERT_TRUE(drive(l.recvT, all));
  for (size_t k = 0; k < w->s.size(); ++k) {
    ASSERT_TRUE(w->s[k].status.isOk()) << w->s[k].status.message();
    ASSERT_TRUE(w->r[k].status.isOk()) << w->r[k].status.message();
    EXPECT_EQ(w->r[k].sizes[0], w->src[k].size());
    EXPECT_EQ(checkPattern(w->dst[k].data(), w->src[k].size(), w->seed + k), -1) << "message " << k;
  }
}

// 32 sends posted before any receive (queued until they are matched), then 32 receives; then a
// second window of 32, to show the slots came back.
TEST_P(NetConformance, ThirtyTwoInFlight) {
  constexpr int kN = 32;
  std::vector<size_t> sizes(kN);
  for (int i = 0; i < kN; ++i) sizes[i] = size_t(4096) * (i + 1) + i;
  Window w(sizes, 500);
  OpenLink link(b_.get());
  ASSERT_TRUE(link.status.isOk()) << link.status.message();
  const Link& l = link.l;
  ASSERT_NO_FATAL_FAILURE(postAll(l, &w));
  ASSERT_NO_FATAL_FAILURE(completeAll(l, &w));
  // The second window: receives first this time, each larger than its message.
  std::vector<Req> s2(kN), r2(kN);
  std::vector<Req*> posted;
  for (int i = 0; i < kN; ++i) {
    void* buf = w.dst[i].data();
    size_t cap = 200;
    int tag = 1000 + i;
    r2[i].t = l.recvT;
    auto post = [&](void** req) {
      return l.recvT->irecv(l.recv, 1, &buf, &cap, &tag, nullptr, req);
    };
    ASSERT_TRUE(postRetry(l.recvT, post, &r2[i].handle, posted).isOk());
    posted.push_back(&r2[i]);
  }
  for (int i = 0; i < kN; ++i) {
    fillPattern(w.src[i].data(), 100 + i, 900 + i);
    s2[i].t = l.sendT;
    auto post = [&](void** req) {
      return l.sendT->isend(l.send, w.src[i].data(), 100 + i, 1000 + i, nullptr, req);
    };
    ASSERT_TRUE(postRetry(l.sendT, post, &s2[i].handle, posted).isOk());
    posted.push_back(&s2[i]);
  }
  ASSERT_TRUE(drive(l.recvT, posted));
  for (int i = 0; i < kN; ++i) {
    ASSERT_TRUE(s2[i].status.isOk()) << s2[i].status.message();
    ASSERT_TRUE(r2[i].status.isOk()) << r2[i].status.message();
    EXPECT_EQ(r2[i].sizes[0], size_t(100 + i));
    EXPECT_EQ(checkPattern(w.dst[i].data(), 100 + i, 900 + i), -1) << "message " << i;
  }
}

// Past the limit of requests in flight on a comm, a post answers "not now" (a null request, not
// an error), and posts again once requests completed.
TEST_P(NetConformance, PostPastTheInflightLimitAnswersNotNow) {
  if (caps().maxInflight == 0)
    GTEST_SKIP() << GetParam() << " queues every request it is given: it has no limit to reach";
  const int n = caps().maxInflight;
  Window w(std::vector<size_t>(n, 10000), 0);
  std::vector<unsigned char> extra(10000);
  OpenLink link(b_.get());
  ASSERT_TRUE(link.status.isOk()) << link.status.message();
  const Link& l = link.l;
  ASSERT_NO_FATAL_FAILURE(postAll(l, &w));
  Req s, r;
  ASSERT_TRUE(isend(l, extra.data(), extra.size(), n, &s).isOk());
  EXPECT_EQ(s.handle, nullptr) << "send " << n + 1 << " was accepted";
  ASSERT_TRUE(irecv(l, extra.data(), extra.size(), n, &r).isOk());
  EXPECT_EQ(r.handle, nullptr) << "receive " << n + 1 << " was accepted";
  ASSERT_NO_FATAL_FAILURE(completeAll(l, &w));
  roundTrip(l, 10, 10, 5, 5);  // the slots are free again
}

// n = 8 buffers with distinct tags; the frames arrive in another order than the buffers, some
// shorter than theirs: the tag chooses the buffer.
TEST_P(NetConformance, GroupedReceiveOfEight) {
  if (caps().maxRecvs < kMaxGroup)
    GTEST_SKIP() << GetParam() << " takes " << caps().maxRecvs << " buffer(s) per receive";
  constexpr int kN = kMaxGroup;
  const size_t capsOf[3][kN] = {{0, 1, 4095, 65536 + 5, 200000, 17, size_t(1) << 20, 3},
                                {1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000},
                                {201000, 202000, 203000, 204000, 205000, 206000, 207000, 208000}};
  const int orders[3][kN] = {
      {5, 2, 7, 0, 3, 6, 1, 4}, {7, 6, 5, 4, 3, 2, 1, 0}, {3, 7, 0, 5, 1, 6, 2, 4}};
  OpenLink link(b_.get());
  ASSERT_TRUE(link.status.isOk()) << link.status.message();
  const Link& l = link.l;
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    int tags[kN];
    size_t sent[kN];
    std::vector<std::vector<unsigned char>> src(kN), dst(kN);
    void* bufs[kN];
    for (int j = 0; j < kN; ++j) {
      tags[j] = 100 + j * 7 + round;
      sent[j] = capsOf[round][j] > 0 ? capsOf[round][j] - (round == 0 ? j % 2 : j) : 0;
      src[j].resize(sent[j]);
      fillPattern(src[j].data(), sent[j], tags[j]);
      dst[j].assign(capsOf[round][j] + kGuardBytes, kGuard);
      bufs[j] = dst[j].data();
    }
    Req r;
    ASSERT_TRUE(irecvGroup(l, kN, bufs, capsOf[round], tags, &r).isOk());
    ASSERT_NE(r.handle, nullptr);
    std::vector<Req> s(kN);
    std::vector<Req*> all{&r};
    for (int k = 0; k < kN; ++k) {
      int j = orders[round][k];
      ASSERT_TRUE(isend(l, src[j].data(), sent[j], tags[j], &s[k]).isOk());
      ASSERT_NE(s[k].handle, nullptr);
      all.push_back(&s[k]);
    }
    ASSERT_TRUE(drive(l.recvT, all));
    for (Req* q : all) ASSERT_TRUE(q->status.isOk()) << q->status.message();
    for (int j = 0; j < kN; ++j) {
      EXPECT_EQ(r.sizes[j], sent[j]) << "buffer " << j;
      EXPECT_EQ(checkPattern(dst[j].data(), sent[j], tags[j]), -1) << "buffer " << j;
      for (size_t k = capsOf[round][j]; k < dst[j].size(); ++k)
        ASSERT_EQ(dst[j][k], kGuard) << "buffer " << j << " overflowed";
    }
  }
}

// More buffers than a grouped receive takes: refused, nothing posted (shm: any n > 1).
TEST_P(NetConformance, GroupedReceiveWiderThanTheDeviceIsRefused) {
  OpenLink link(b_.get());
  ASSERT_TRUE(link.status.isOk()) << link.status.message();
  const int n = caps().maxRecvs + 1;
  std::vector<unsigned char> buf(16);
  std::vector<void*> bufs(n, buf.data());
  std::vector<size_t> sizes(n, 1);
  std::vector<int> tags(n);
  std::iota(tags.begin(), tags.end(), 1);
  Req r;
  Status st = irecvGroup(link.l, n, bufs.data(), sizes.data(), tags.data(), &r);
  EXPECT_FALSE(st.isOk());
  EXPECT_EQ(r.handle, nullptr);
  EXPECT_NE(st.message().find(std::to_string(n)), std::string::npos) << st.message();
  roundTrip(link.l, 100, 100, 1, 1);  // the comm is still usable
}

// A frame larger than its buffer fails the receive ("message truncated"), never overflows it:
// nothing is written.
TEST_P(NetConformance, TruncationIsAMismatchNotAnOverflow) {
  const std::pair<size_t, size_t> cases[] = {{3000, 1000}, {300000, 100000}, {1, 0}, {8192, 4096}};
  for (auto [sent, cap] : cases) {
    SCOPED_TRACE(::testing::Message() << sent << " bytes into " << cap);
    std::vector<unsigned char> src(sent, 0x11), dst(cap + kGuardBytes, kGuard);
    OpenLink link(b_.get());  // a fresh connection each time: a truncation may break it
    ASSERT_TRUE(link.status.isOk()) << link.status.message();
    Req s, r;
    ASSERT_TRUE(irecv(link.l, dst.data(), cap, 4, &r).isOk());
    ASSERT_TRUE(isend(link.l, src.data(), sent, 4, &s).isOk());
    std::vector<Req*> required{&r};
    if (caps().senderSeesMismatch) required.push_back(&s);
    ASSERT_TRUE(drive(link.l.recvT, required, kTestDeadlineMs, {&s}))
        << "a truncation must not hang either side";
    ASSERT_FALSE(r.status.isOk()) << "truncation not reported";
    if (caps().receiverMismatchCause) {
      EXPECT_EQ(r.status.cause(), Cause::kMismatch) << r.status.message();
    }
    expectMentions(r.status, caps().truncationText);
    expectMentions(r.status, {std::to_string(sent)});
    EXPECT_TRUE(untouched(dst)) << "bytes written into a buffer too small for the message";
    expectSendMismatch(s, "truncated message", caps().truncationText);
    expectAfterMismatch(link.l);
  }
}

TEST_P(NetConformance, TagMismatchIsAMismatch) {
  std::vector<unsigned char> src(100, 1), dst(100 + kGuardBytes, kGuard);
  OpenLink link(b_.get());
  ASSERT_TRUE(link.status.isOk()) << link.status.message();
  Req s, r;
  ASSERT_TRUE(irecv(link.l, dst.data(), 100, 5, &r).isOk());
  ASSERT_TRUE(isend(link.l, src.data(), src.size(), 6, &s).isOk());
  std::vector<Req*> required{&r};
  if (caps().senderSeesMismatch) required.push_back(&s);
  ASSERT_TRUE(drive(link.l.recvT, required, kTestDeadlineMs, {&s}));
  ASSERT_FALSE(r.status.isOk()) << "a message with another tag was received";
  if (caps().receiverMismatchCause) {
    EXPECT_EQ(r.status.cause(), Cause::kMismatch) << r.status.message();
  }
  expectMentions(r.status, caps().tagMismatchText);
  EXPECT_TRUE(untouched(dst)) << "a message with another tag was written";
  expectSendMismatch(s, "mismatched tag", caps().tagMismatchText);
  expectAfterMismatch(link.l);
}

// In a grouped receive, a second frame with the tag of a buffer already filled matches nothing.
TEST_P(NetConformance, GroupedTagMismatch) {
  if (caps().maxRecvs < 2) GTEST_SKIP() << GetParam() << " has no grouped receives";
  std::vector<unsigned char> a(10), b(10), src(10, 3);
  OpenLink link(b_.get());
  ASSERT_TRUE(link.status.isOk()) << link.status.message();
  void* bufs[2] = {a.data(), b.data()};
  size_t sizes[2] = {10, 10};
  int tags[2] = {1, 2};
  Req r, s1, s2;
  ASSERT_TRUE(irecvGroup(link.l, 2, bufs, sizes, tags, &r).isOk());
  ASSERT_TRUE(isend(link.l, src.data(), 10, 1, &s1).isOk());
  ASSERT_TRUE(isend(link.l, src.data(), 10, 1, &s2).isOk());  // tag 1 again: no buffer left
  std::vector<Req*> required{&r};
  if (caps().senderSeesMismatch) required.push_back(&s2);
  ASSERT_TRUE(drive(link.l.recvT, required, kTestDeadlineMs, {&s1, &s2}));
  ASSERT_FALSE(r.status.isOk());
  if (caps().receiverMismatchCause) {
    EXPECT_EQ(r.status.cause(), Cause::kMismatch) << r.status.message();
  }
  expectMentions(r.status, caps().tagMismatchText);
  expectSendMismatch(s2, "frame whose tag has no buffer left", caps().tagMismatchText);
}

// A mismatch is the callers' disagreement, not the peer's departure: whatever cause the error
// carries, it must not send the runtime looking for a dead peer.
TEST_P(NetConformance, MismatchIsNotBlamedOnThePeer) {
  std::vector<unsigned char> src(100, 1), dst(100);
  OpenLink link(b_.get());
  ASSERT_TRUE(link.status.isOk()) << link.status.message();
  Req s, r;
  ASSERT_TRUE(irecv(link.l, dst.data(), dst.size(), 5, &r).isOk());
  ASSERT_TRUE(isend(link.l, src.data(), src.size(), 6, &s).isOk());
  ASSERT_TRUE(drive(link.l.recvT, {&r}, kTestDeadlineMs, {&s}));
  ASSERT_FALSE(r.status.isOk());
  EXPECT_NE(r.status.cause(), Cause::kPeerGone) << r.status.message();
}

// Many messages of mixed sizes through a window of posted requests, with grouped receives of
// random width: exercises wrap-around of the transport's rings and completion in posting order
// (of sends too, where the backend claims it).
TEST_P(NetConformance, PipelinedMixedSizesCompleteInOrder) {
  // Under the sanitizers (LOOMTEST_QUICK=1) 200 messages: still many windows of 16 in flight.
  const int kMessages = loomtest::quick() ? 200 : 700;
  constexpr size_t kWindow = 16;
  const int maxGroup = caps().maxRecvs;
  std::mt19937 rng(static_cast<unsigned>(std::hash<std::string>()(GetParam())));
  std::vector<size_t> size(kMessages);
  for (auto& s : size) {
    int kind = rng() % 10;
    s = kind < 3 ? rng() % 65 : kind < 7 ? rng() % 65536 : 65536 + rng() % 400000;
  }
  struct Posted {
    Req req;
    int first, n;
    std::vector<std::vector<unsigned char>> bufs;
  };
  std::deque<Posted> sends, recvs;
  OpenLink link(b_.get());  // after the queues: closed before their buffers go
  ASSERT_TRUE(link.status.isOk()) << link.status.message();
  const Link& l = link.l;
  int nextSend = 0, nextRecv = 0, doneSend = 0, doneRecv = 0;
  Deadline deadline(kTestDeadlineMs);
  while (doneSend < kMessages || doneRecv < kMessages) {
    ASSERT_FALSE(deadline.expired()) << "sent " << doneSend << " received " << doneRecv;
    while (nextSend < kMessages && sends.size() < kWindow) {
      Posted p;
      p.first = nextSend;
      p.n = 1;
      p.bufs.emplace_back(size[nextSend]);
      fillPattern(p.bufs[0].data(), size[nextSend], nextSend);
      ASSERT_TRUE(isend(l, p.bufs[0].data(), size[nextSend], nextSend, &p.req).isOk());
      if (p.req.handle == nullptr) break;
      ++nextSend;
      sends.push_back(std::move(p));
    }
    while (nextRecv < kMessages && recvs.size() < kWindow) {
      Posted p;
      p.first = nextRecv;
      p.n = std::min<int>(1 + rng() % maxGroup, kMessages - nextRecv);
      void* ptrs[kMaxGroup];
      size_t caps[kMaxGroup];
      int tags[kMaxGroup];
      for (int j = 0; j < p.n; ++j) {
        int m = nextRecv + (p.n - 1 - j);  // buffers listed in reverse tag order
        caps[j] = size[m] + rng() % 100;
        tags[j] = m;
        p.bufs.emplace_back(caps[j]);
        ptrs[j] = p.bufs[j].data();
      }
      ASSERT_TRUE(irecvGroup(l, p.n, ptrs, caps, tags, &p.req).isOk());
      if (p.req.handle == nullptr) break;
      nextRecv += p.n;
      recvs.push_back(std::move(p));
    }
    bool progressed = false;
    // Test every posted request; completions must come in posting order. A request found
    // pending may complete while a later one is tested (that test drives the transport too):
    // when a later one is done, every earlier one must be done by now.
    for (auto* q : {&sends, &recvs}) {
      const bool inOrder = q == &recvs || caps().sendsCompleteInOrder;
      const char* what = q == &sends ? "send" : "receive";
      for (size_t i = 0; i < q->size(); ++i) {
        Posted& p = (*q)[i];
        if (p.req.finished) continue;
        int done = 0;
        Status st = p.req.t->test(p.req.handle, &done, p.req.sizes);
        ASSERT_TRUE(st.isOk()) << st.message();
        if (!done) continue;
        for (size_t k = 0; k < i && inOrder; ++k) {
          Posted& e = (*q)[k];
          if (e.req.finished) continue;
          int earlierDone = 0;
          ASSERT_TRUE(e.req.t->test(e.req.handle, &earlierDone, e.req.sizes).isOk());
          ASSERT_TRUE(earlierDone) << "the " << what << " of message " << p.first
                                   << " completed before that of message " << e.first;
          e.req.finished = true;
        }
        p.req.finished = true;
        progressed = true;
      }
    }
    while (!sends.empty() && sends.front().req.finished) {
      EXPECT_EQ(sends.front().req.sizes[0], size[sends.front().first]);
      sends.pop_front();
      ++doneSend;
    }
    while (!recvs.empty() && recvs.front().req.finished) {
      Posted& p = recvs.front();
      for (int j = 0; j < p.n; ++j) {
        int m = p.first + (p.n - 1 - j);
        ASSERT_EQ(p.req.sizes[j], size[m]) << "message " << m;
        ASSERT_EQ(checkPattern(p.bufs[j].data(), size[m], m), -1) << "message " << m;
      }
      doneRecv += p.n;
      recvs.pop_front();
    }
    if (!progressed) {
      std::vector<Req*> waiting;
      for (auto& p : sends) waiting.push_back(&p.req);
      for (auto& p : recvs) waiting.push_back(&p.req);
      nap(l.recvT, waiting, 1);
    }
  }
}

// Close functions accept comms with requests in flight: no crash, no hang, nothing left behind,
// and the transport makes new connections that work.
TEST_P(NetConformance, CloseWithRequestsInFlight) {
  const std::string before = b_->liveObjects();
  std::vector<unsigned char> src(4 << 20), dst(4 << 20);
  {
    OpenLink link(b_.get());
    ASSERT_TRUE(link.status.isOk()) << link.status.message();
    std::vector<Req> s(4), r(4);
    for (int k = 0; k < 4; ++k) {
      ASSERT_TRUE(irecv(link.l, dst.data(), dst.size(), k, &r[k]).isOk());
      ASSERT_TRUE(isend(link.l, src.data(), src.size(), k, &s[k]).isOk());
    }
    int done = 0;
    EXPECT_TRUE(s[0].t->test(s[0].handle, &done, nullptr).isOk());
    EXPECT_TRUE(r[0].t->test(r[0].handle, &done, nullptr).isOk());
  }  // closes the send end, then the receive end
  {
    OpenLink link(b_.get());
    ASSERT_TRUE(link.status.isOk()) << link.status.message();
    std::vector<Req> s(4), r(4);
    for (int k = 0; k < 4; ++k) {  // the other order, nothing tested at all
      ASSERT_TRUE(isend(link.l, src.data(), src.size(), k, &s[k]).isOk());
      ASSERT_TRUE(irecv(link.l, dst.data(), dst.size(), k, &r[k]).isOk());
    }
    ASSERT_TRUE(b_->hangUp(&link.l, /*sendEnd=*/false).isOk());  // the receive end first
  }
  {
    OpenLink link(b_.get());
    ASSERT_TRUE(link.status.isOk()) << link.status.message();
    Req r, s1, s2;
    ASSERT_TRUE(irecv(link.l, dst.data(), 1 << 20, 0, &r).isOk());
    ASSERT_TRUE(isend(link.l, src.data(), 100, 5, &s1).isOk());  // tags that match nothing
    ASSERT_TRUE(isend(link.l, src.data(), 100, 5, &s2).isOk());
  }
  {
    OpenLink link(b_.get());
    ASSERT_TRUE(link.status.isOk()) << link.status.message();
    roundTrip(link.l, 1000, 1000, 1, 1);
  }
  EXPECT_EQ(b_->liveObjects(), before) << "objects left on the device";
}

// The sender goes away: a message it finished arrives, the next receive fails with kPeerGone.
TEST_P(NetConformance, PeerClosedFailsPendingReceive) {
  std::vector<unsigned char> src(300000), dst1(1 << 20), dst2(1 << 20);
  fillPattern(src.data(), src.size(), 3);
  OpenLink link(b_.get());
  ASSERT_TRUE(link.status.isOk()) << link.status.message();
  Req r1, r2, s;
  ASSERT_TRUE(irecv(link.l, dst1.data(), dst1.size(), 1, &r1).isOk());
  ASSERT_TRUE(irecv(link.l, dst2.data(), dst2.size(), 1, &r2).isOk());
  ASSERT_TRUE(isend(link.l, src.data(), src.size(), 1, &s).isOk());
  ASSERT_TRUE(drive(link.l.sendT, {&s}, kTestDeadlineMs, {&r1}));
  ASSERT_TRUE(s.status.isOk()) << s.status.message();
  ASSERT_TRUE(b_->hangUp(&link.l, /*sendEnd=*/true).isOk());
  ASSERT_TRUE(drive(link.l.recvT, {&r1, &r2})) << "a closed peer must not hang the receiver";
  EXPECT_TRUE(r1.status.isOk()) << r1.status.message();
  EXPECT_EQ(r1.sizes[0], src.size());
  EXPECT_EQ(checkPattern(dst1.data(), src.size(), 3), -1);
  ASSERT_FALSE(r2.status.isOk());
  EXPECT_EQ(r2.status.code(), Code::kRemote) << r2.status.message();
  EXPECT_EQ(r2.status.cause(), Cause::kPeerGone) << r2.status.message();
  expectMentions(r2.status, caps().peerGoneText);
  expectLaterReceiveFails(link.l);
}

// The receiver goes away during a send too large to be buffered: the send fails with kPeerGone.
TEST_P(NetConformance, PeerClosedFailsPendingSend) {
  std::vector<unsigned char> src(size_t(64) << 20);
  OpenLink link(b_.get());
  ASSERT_TRUE(link.status.isOk()) << link.status.message();
  Req s;
  ASSERT_TRUE(isend(link.l, src.data(), src.size(), 1, &s).isOk());
  for (int k = 0; k < 100 && !s.finished; ++k) {  // let some bytes go
    int done = 0;
    s.status = s.t->test(s.handle, &done, s.sizes);
    s.finished = done || !s.status.isOk();
  }
  ASSERT_FALSE(s.finished) << "a 64 MiB send finished without a receiver: " << s.status.message();
  ASSERT_TRUE(b_->hangUp(&link.l, /*sendEnd=*/false).isOk());
  ASSERT_TRUE(drive(link.l.sendT, {&s})) << "a closed peer must not hang the sender";
  ASSERT_FALSE(s.status.isOk()) << "a 64 MiB send to a closed peer completed";
  EXPECT_EQ(s.status.code(), Code::kRemote) << s.status.message();
  EXPECT_EQ(s.status.cause(), Cause::kPeerGone) << s.status.message();
  expectMentions(s.status, caps().peerGoneText);
}

// Registered buffers: regMr of whole buffers, sends and receives with the handles (messages
// shorter than the buffers too), a flush of host memory (nothing to wait for, or a request that
// completes), deregMr.
TEST_P(NetConformance, RegisteredBuffers) {
  OpenLink link(b_.get());
  ASSERT_TRUE(link.status.isOk()) << link.status.message();
  const Link& l = link.l;
  const std::pair<size_t, size_t> cases[] = {{0, 64},
                                             {4096, 4096},
                                             {100000, 300000},
                                             {(1 << 20) + 3, (1 << 20) + 3},
                                             {size_t(16) << 20, size_t(16) << 20}};
  int tag = 0;
  for (auto [size, cap] : cases) {
    SCOPED_TRACE(::testing::Message() << size << " bytes from and into buffers of " << cap);
    std::vector<unsigned char> src(cap), dst(cap);
    fillPattern(src.data(), size, 40 + tag);
    void *smh = nullptr, *rmh = nullptr;
    Status st = l.sendT->regMr(l.send, src.data(), cap, net::kPtrHost, &smh);
    ASSERT_TRUE(st.isOk()) << st.message();
    st = l.recvT->regMr(l.recv, dst.data(), cap, net::kPtrHost, &rmh);
    ASSERT_TRUE(st.isOk()) << st.message();
    Req s, r;
    ASSERT_TRUE(irecv(l, dst.data(), cap, tag, &r, rmh).isOk());
    ASSERT_TRUE(isend(l, src.data(), size, tag, &s, smh).isOk());
    ASSERT_NE(r.handle, nullptr);
    ASSERT_NE(s.handle, nullptr);
    ASSERT_TRUE(drive(l.recvT, {&s, &r}));
    ASSERT_TRUE(s.status.isOk()) << s.status.message();
    ASSERT_TRUE(r.status.isOk()) << r.status.message();
    EXPECT_EQ(r.sizes[0], size);
    EXPECT_EQ(checkPattern(dst.data(), size, 40 + tag), -1);
    Req f;
    f.t = l.recvT;
    void* data = dst.data();
    size_t got = size;
    st = l.recvT->iflush(l.recv, 1, &data, &got, &rmh, &f.handle);
    ASSERT_TRUE(st.isOk()) << st.message();
    if (f.handle != nullptr) {
      ASSERT_TRUE(drive(l.recvT, {&f}));
      EXPECT_TRUE(f.status.isOk()) << f.status.message();
    }
    EXPECT_TRUE(l.sendT->deregMr(l.send, smh).isOk());
    EXPECT_TRUE(l.recvT->deregMr(l.recv, rmh).isOk());
    ++tag;
  }
}

// waitActivity returns after its timeout when nothing happens, and the requests it waits for
// complete.
TEST_P(NetConformance, WaitActivityAndDataArrives) {
  std::vector<unsigned char> src(100000), dst(100000);
  fillPattern(src.data(), src.size(), 9);
  OpenLink link(b_.get());
  ASSERT_TRUE(link.status.isOk()) << link.status.message();
  Req r, s;
  ASSERT_TRUE(irecv(link.l, dst.data(), dst.size(), 0, &r).isOk());
  link.l.recvT->waitActivity(&r.handle, 1, nullptr, 20);  // nothing sent: returns
  ASSERT_TRUE(isend(link.l, src.data(), src.size(), 0, &s).isOk());
  Deadline deadline(kTestDeadlineMs);
  while (!(s.finished && r.finished) && !deadline.expired()) {
    std::vector<Req*> waiting;
    for (Req* q : {&s, &r}) {
      if (q->finished) continue;
      int done = 0;
      ASSERT_TRUE(q->t->test(q->handle, &done, q->sizes).isOk());
      q->finished = done != 0;
      if (!done) waiting.push_back(q);
    }
    if (!waiting.empty()) nap(link.l.recvT, waiting, 1000);
  }
  ASSERT_TRUE(s.finished && r.finished);
  EXPECT_EQ(checkPattern(dst.data(), dst.size(), 9), -1);
}

// Loom's runtime accepts every peer on one listen comm (NCCL accepts once per listener), with
// connect and accept alternated in one thread.
TEST_P(NetConformance, SeveralConnectionsOnOneListener) {
  if (!caps().connects)
    GTEST_SKIP() << GetParam() << " has no listen/connect/accept: its connections exist at attach";
  net::Transport* t = static_cast<NetBackend*>(b_.get())->transport();
  net::Handle h;
  void* lc = nullptr;
  ASSERT_TRUE(t->listen(0, &h, &lc).isOk());
  ASSERT_NE(lc, nullptr);
  void* sends[2] = {};
  void* recvs[2] = {};
  int accepted = 0;
  Deadline deadline(kTestDeadlineMs);
  while ((sends[1] == nullptr || accepted < 2) && !deadline.expired()) {
    void** next = sends[0] == nullptr ? &sends[0] : &sends[1];
    if (*next == nullptr) {
      ASSERT_TRUE(t->connect(0, h, next).isOk());
    }
    if (accepted < 2) {
      void* rc = nullptr;
      ASSERT_TRUE(t->accept(lc, &rc).isOk());
      if (rc != nullptr) recvs[accepted++] = rc;
    }
  }
  ASSERT_FALSE(deadline.expired());
  EXPECT_TRUE(t->closeListen(lc).isOk());
  // Which recv comm belongs to which send is the order of accept: tell them apart by payload.
  int payload[2] = {1001, 2002}, got[2] = {0, 0};
  std::vector<Req> s(2), r(2);
  for (int k = 0; k < 2; ++k) {
    void* data = &got[k];
    size_t size = sizeof(int);
    int tag = 0;
    ASSERT_TRUE(t->irecv(recvs[k], 1, &data, &size, &tag, nullptr, &r[k].handle).isOk());
    ASSERT_TRUE(t->isend(sends[k], &payload[k], sizeof(int), 0, nullptr, &s[k].handle).isOk());
  }
  ASSERT_TRUE(drive(t, {&s[0], &s[1], &r[0], &r[1]}));
  for (Req& q : r) ASSERT_TRUE(q.status.isOk()) << q.status.message();
  EXPECT_EQ(got[0] + got[1], 3003);
  EXPECT_TRUE(got[0] == 1001 || got[0] == 2002) << got[0];
  // sends[k] sent payload[k]: its recv comm is the one that got it.
  const bool inOrder = got[0] == payload[0];
  const Link first{t, sends[0], t, recvs[inOrder ? 0 : 1], nullptr};
  const Link second{t, sends[1], t, recvs[inOrder ? 1 : 0], nullptr};
  roundTrip(second, 100, 100, 2, 2);  // both still carry messages, in either order
  roundTrip(first, 12345, 12345, 3, 3);
  for (int k = 0; k < 2; ++k) {
    EXPECT_TRUE(t->closeSend(sends[k]).isOk());
    EXPECT_TRUE(t->closeRecv(recvs[k]).isOk());
  }
}

// A receive that combines: dst = src (op) received, in place too (dst == src).
TEST_P(NetConformance, RecvReduce) {
  OpenLink link(b_.get());
  ASSERT_TRUE(link.status.isOk()) << link.status.message();
  const Link& l = link.l;
  if (!l.recvT->supportsRecvReduce())
    GTEST_SKIP() << GetParam() << " has no fused receive-reduce (supportsRecvReduce is false)";
  int tag = 0;
  for (size_t bytes :
       {size_t(0), size_t(4), size_t(4096), size_t(4100), size_t(65536 + 12), size_t(1) << 20}) {
    SCOPED_TRACE(bytes);
    for (bool inPlace : {false, true}) {
      const size_t n = bytes / 4;
      std::vector<float> a(n), b(n), out(n, -1.0f);
      std::iota(a.begin(), a.end(), 1.0f);
      std::iota(b.begin(), b.end(), 100.0f);
      float* dst = inPlace ? b.data() : out.data();
      const std::vector<float> mine = b;
      Req s, r;
      r.t = l.recvT;
      ASSERT_TRUE(
          l.recvT->irecvReduce(l.recv, dst, b.data(), bytes, tag, loomFloat32, loomSum, &r.handle)
              .isOk());
      ASSERT_TRUE(isend(l, a.data(), bytes, tag, &s).isOk());
      ASSERT_TRUE(drive(l.recvT, {&s, &r}));
      ASSERT_TRUE(s.status.isOk()) << s.status.message();
      ASSERT_TRUE(r.status.isOk()) << r.status.message();
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(dst[i], mine[i] + a[i]) << i;
      ++tag;
    }
  }
}

// --- Peers in another process -------------------------------------------------------------------

TEST_P(NetConformance, PeerProcessSendsAndCloses) {
  PeerLink peer(b_.get());
  ASSERT_NO_FATAL_FAILURE(startPeer(kSendMessages, &peer));
  const Link& link = peer.l;
  for (int m = 0; m < kPeerMessages; ++m) {
    const size_t size = peerMessageSize(m);
    std::vector<unsigned char> buf(size + 1);
    Req r;
    ASSERT_TRUE(irecv(link, buf.data(), buf.size(), m, &r).isOk());
    ASSERT_TRUE(drive(link.recvT, {&r}));
    ASSERT_TRUE(r.status.isOk()) << r.status.message();
    ASSERT_EQ(r.sizes[0], size);
    ASSERT_EQ(checkPattern(buf.data(), size, m), -1) << "message " << m;
  }
  const int status = peer.child.reap(kTestDeadlineMs);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "peer status " << status;
}

// The peer is killed while this side waits for a message it will never send.
TEST_P(NetConformance, PeerProcessKilledIsAnErrorNotAHang) {
  PeerLink peer(b_.get());
  ASSERT_NO_FATAL_FAILURE(startPeer(kSendOneThenWait, &peer));
  const Link& link = peer.l;
  std::vector<unsigned char> dst(5000);
  Req r1, r2;
  ASSERT_TRUE(irecv(link, dst.data(), dst.size(), 1, &r1).isOk());
  ASSERT_TRUE(drive(link.recvT, {&r1}));
  ASSERT_TRUE(r1.status.isOk()) << r1.status.message();
  EXPECT_EQ(checkPattern(dst.data(), dst.size(), 77), -1);
  ASSERT_TRUE(irecv(link, dst.data(), dst.size(), 1, &r2).isOk());
  const int status = peer.child.kill();
  EXPECT_TRUE(WIFSIGNALED(status)) << "the peer exited early with " << WEXITSTATUS(status);
  ASSERT_TRUE(drive(link.recvT, {&r2})) << "a dead peer must not hang the receiver";
  ASSERT_FALSE(r2.status.isOk());
  EXPECT_EQ(r2.status.code(), Code::kRemote) << r2.status.message();
  EXPECT_EQ(r2.status.cause(), Cause::kPeerGone) << r2.status.message();
  expectMentions(r2.status, caps().peerGoneText);
}

// The peer is killed while messages stream in: what it sent before may still arrive, then the
// loss is reported.
TEST_P(NetConformance, PeerProcessKilledMidTransfer) {
  PeerLink peer(b_.get());
  ASSERT_NO_FATAL_FAILURE(startPeer(kSendForever, &peer));
  const Link& link = peer.l;
  const size_t cap = 1 << 20;
  std::vector<std::vector<unsigned char>> bufs(4, std::vector<unsigned char>(cap));
  for (int m = 0; m < 3; ++m) {
    Req r;
    ASSERT_TRUE(irecv(link, bufs[0].data(), cap, m, &r).isOk());
    ASSERT_TRUE(drive(link.recvT, {&r}));
    ASSERT_TRUE(r.status.isOk()) << r.status.message();
  }
  // Distinct buffers: helper threads may fill several at once.
  std::vector<Req> pending(4);
  std::vector<Req*> all;
  int nextTag = 3;
  for (size_t k = 0; k < pending.size(); ++k) {
    ASSERT_TRUE(irecv(link, bufs[k].data(), cap, nextTag++, &pending[k]).isOk());
    all.push_back(&pending[k]);
  }
  const int status = peer.child.kill();
  EXPECT_TRUE(WIFSIGNALED(status)) << "the peer exited early with " << WEXITSTATUS(status);
  Status last;
  Deadline deadline(kTestDeadlineMs);
  while (last.isOk() && !deadline.expired()) {
    ASSERT_TRUE(drive(link.recvT, all));
    for (Req* r : all)
      if (!r->status.isOk()) last = r->status;
    if (!last.isOk()) break;
    // Everything buffered arrived: post more until the loss shows.
    for (size_t k = 0; k < all.size() && last.isOk(); ++k) {
      *all[k] = Req();
      last = irecv(link, bufs[k].data(), cap, nextTag++, all[k]);
    }
  }
  ASSERT_FALSE(last.isOk()) << "the dead sender was not noticed";
  EXPECT_EQ(last.code(), Code::kRemote) << last.message();
  EXPECT_EQ(last.cause(), Cause::kPeerGone) << last.message();
  expectMentions(last, caps().peerGoneText);
}

INSTANTIATE_TEST_SUITE_P(Backends, NetConformance, ::testing::ValuesIn(backendNames()),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

}  // namespace
}  // namespace loom
