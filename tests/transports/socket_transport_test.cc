// Socket transport over loopback, every test run for several (NSOCKS, NTHREADS) settings.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "tests/transports/socket_test_util.h"

namespace loom {
namespace {

using net::Transport;
using testing_util::checkPattern;
using testing_util::closePair;
using testing_util::connectPair;
using testing_util::drive;
using testing_util::fillPattern;
using testing_util::Pair;
using testing_util::Req;
using testing_util::ScopedEnv;

struct Config {
  int nsocks;
  int nthreads;
};

std::string configName(const ::testing::TestParamInfo<Config>& info) {
  return "Socks" + std::to_string(info.param.nsocks) + "Threads" +
         std::to_string(info.param.nthreads);
}

constexpr unsigned char kGuard = 0xab;
constexpr size_t kGuardBytes = 4096;

class SocketTransportTest : public ::testing::TestWithParam<Config> {
 protected:
  void SetUp() override {
    env_.set("LOOM_SOCKET_IFNAME", "=lo");
    env_.set("LOOM_SOCKET_NSOCKS", std::to_string(GetParam().nsocks));
    env_.set("LOOM_SOCKET_NTHREADS", std::to_string(GetParam().nthreads));
    t_ = makeSocketTransport();
    ASSERT_NE(t_, nullptr);
    Status st = connectPair(t_.get(), 0, &p_);
    ASSERT_TRUE(st.isOk()) << st.message();
  }
  void TearDown() override {
    if (t_) closePair(t_.get(), &p_);
  }

  Status isend(const void* data, size_t size, int tag, Req* r) {
    return t_->isend(p_.send, data, size, tag, nullptr, &r->handle);
  }
  Status irecv(void* data, size_t size, int tag, Req* r) {
    return t_->irecv(p_.recv, 1, &data, &size, &tag, nullptr, &r->handle);
  }

  // One message of `size` bytes (received into a buffer of `capacity`), content and guard checked.
  void roundTrip(size_t size, size_t capacity, int tag) {
    std::vector<unsigned char> src(size), dst(capacity + kGuardBytes, kGuard);
    fillPattern(src.data(), size, size + 7);
    Req s, r;
    ASSERT_TRUE(irecv(dst.data(), capacity, tag, &r).isOk());
    ASSERT_TRUE(isend(src.data(), size, tag, &s).isOk());
    ASSERT_NE(r.handle, nullptr);
    ASSERT_NE(s.handle, nullptr);
    ASSERT_TRUE(drive(t_.get(), {&s, &r})) << "size " << size << " did not complete";
    ASSERT_TRUE(s.status.isOk()) << s.status.message();
    ASSERT_TRUE(r.status.isOk()) << r.status.message();
    EXPECT_EQ(s.sizes[0], size);
    EXPECT_EQ(r.sizes[0], size);
    EXPECT_EQ(checkPattern(dst.data(), size, size + 7), -1) << "size " << size;
    for (size_t k = capacity; k < dst.size(); ++k)
      ASSERT_EQ(dst[k], kGuard) << "write past the buffer at " << k;
  }

  ScopedEnv env_;
  std::unique_ptr<Transport> t_;
  Pair p_;
};

TEST_P(SocketTransportTest, Sizes) {
  for (size_t size : {size_t(0), size_t(1), size_t(4095), size_t(65535), size_t(65536),
                      size_t(1 << 20) + 3, size_t(64) << 20}) {
    SCOPED_TRACE(size);
    roundTrip(size, size, 3);
  }
}

TEST_P(SocketTransportTest, SmallerSendReportsActualSize) {
  roundTrip(1000, 1 << 20, 1);
  roundTrip(0, 100, 2);
  roundTrip(100000, 300000, 3);  // split on the wire, smaller than the buffer
}

TEST_P(SocketTransportTest, InflightLimitBothWays) {
  constexpr int kMax = 32;  // LOOM_MAX_INFLIGHT default
  constexpr size_t kSize = 10000;
  std::vector<std::vector<unsigned char>> src(kMax), dst(kMax);
  std::vector<Req> sends(kMax), recvs(kMax);
  for (int k = 0; k < kMax; ++k) {
    src[k].resize(kSize);
    dst[k].resize(kSize);
    fillPattern(src[k].data(), kSize, k);
    ASSERT_TRUE(isend(src[k].data(), kSize, k, &sends[k]).isOk());
    ASSERT_NE(sends[k].handle, nullptr) << "send " << k;
  }
  for (int k = 0; k < kMax; ++k) {
    ASSERT_TRUE(irecv(dst[k].data(), kSize, k, &recvs[k]).isOk());
    ASSERT_NE(recvs[k].handle, nullptr) << "recv " << k;
  }
  Req extraSend, extraRecv;
  std::vector<unsigned char> extra(kSize);
  ASSERT_TRUE(isend(extra.data(), kSize, 99, &extraSend).isOk());
  EXPECT_EQ(extraSend.handle, nullptr) << "33rd send was accepted";
  ASSERT_TRUE(irecv(extra.data(), kSize, 99, &extraRecv).isOk());
  EXPECT_EQ(extraRecv.handle, nullptr) << "33rd receive was accepted";

  std::vector<Req*> all;
  for (int k = 0; k < kMax; ++k) all.push_back(&sends[k]), all.push_back(&recvs[k]);
  ASSERT_TRUE(drive(t_.get(), all));
  for (int k = 0; k < kMax; ++k) {
    ASSERT_TRUE(sends[k].status.isOk()) << sends[k].status.message();
    ASSERT_TRUE(recvs[k].status.isOk()) << recvs[k].status.message();
    EXPECT_EQ(checkPattern(dst[k].data(), kSize, k), -1) << "message " << k;
  }
  // Slots are free again.
  roundTrip(10, 10, 5);
}

TEST_P(SocketTransportTest, GroupedReceiveOfEight) {
  constexpr int kN = 8;
  const size_t caps[kN] = {0, 1, 4095, 65536 + 5, 200000, 17, size_t(1) << 20, 3};
  int tags[kN];
  size_t sent[kN];
  std::vector<std::vector<unsigned char>> src(kN), dst(kN);
  void* bufs[kN];
  for (int j = 0; j < kN; ++j) {
    tags[j] = 100 + j * 7;
    sent[j] = caps[j] - ((j % 2 && caps[j] > 0) ? 1 : 0);  // some frames shorter than the buffer
    src[j].resize(sent[j]);
    fillPattern(src[j].data(), sent[j], tags[j]);
    dst[j].assign(caps[j] + kGuardBytes, kGuard);
    bufs[j] = dst[j].data();
  }
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round);
    Req r;
    ASSERT_TRUE(t_->irecv(p_.recv, kN, bufs, caps, tags, nullptr, &r.handle).isOk());
    ASSERT_NE(r.handle, nullptr);
    const int order[kN] = {5, 2, 7, 0, 3, 6, 1, 4};
    std::vector<Req> s(kN);
    std::vector<Req*> all{&r};
    for (int k = 0; k < kN; ++k) {
      int j = round == 0 ? order[k] : kN - 1 - k;
      ASSERT_TRUE(isend(src[j].data(), sent[j], tags[j], &s[k]).isOk());
      ASSERT_NE(s[k].handle, nullptr);
      all.push_back(&s[k]);
    }
    ASSERT_TRUE(drive(t_.get(), all));
    for (Req* q : all) ASSERT_TRUE(q->status.isOk()) << q->status.message();
    for (int j = 0; j < kN; ++j) {
      EXPECT_EQ(r.sizes[j], sent[j]) << "buffer " << j;
      EXPECT_EQ(checkPattern(dst[j].data(), sent[j], tags[j]), -1) << "buffer " << j;
      for (size_t k = caps[j]; k < dst[j].size(); ++k) ASSERT_EQ(dst[j][k], kGuard);
    }
  }
}

TEST_P(SocketTransportTest, TruncatedReceiveFailsWithoutOverflow) {
  for (auto sizes : {std::pair<size_t, size_t>{3000, 1000}, {300000, 100000}, {1, 0}}) {
    // A fresh connection each time: a truncated frame breaks the stream.
    if (p_.send) closePair(t_.get(), &p_);
    ASSERT_TRUE(connectPair(t_.get(), 0, &p_).isOk());
    const size_t sent = sizes.first, cap = sizes.second;
    std::vector<unsigned char> src(sent, 0x11), dst(cap + kGuardBytes, kGuard);
    Req s, r;
    ASSERT_TRUE(irecv(dst.data(), cap, 4, &r).isOk());
    ASSERT_TRUE(isend(src.data(), sent, 4, &s).isOk());
    ASSERT_TRUE(drive(t_.get(), {&r}, testing_util::kTestDeadlineMs, {&s}));
    ASSERT_FALSE(r.status.isOk()) << "truncation not reported";
    EXPECT_NE(r.status.message().find("message truncated"), std::string::npos)
        << r.status.message();
    EXPECT_EQ(r.status.cause(), Cause::kMismatch);
    EXPECT_NE(r.status.message().find(std::to_string(sent)), std::string::npos)
        << r.status.message();
    EXPECT_NE(r.status.message().find("127.0.0.1"), std::string::npos) << r.status.message();
    for (size_t k = cap; k < dst.size(); ++k) ASSERT_EQ(dst[k], kGuard) << "overflow at " << k;
    // The comm stays failed: later receives report the error too.
    Req later;
    Status st = irecv(dst.data(), cap, 4, &later);
    EXPECT_FALSE(st.isOk());
    closePair(t_.get(), &p_);  // before src goes: the send may still be in flight
  }
}

TEST_P(SocketTransportTest, TagMismatch) {
  std::vector<unsigned char> src(100, 1), dst(100);
  Req s, r;
  ASSERT_TRUE(irecv(dst.data(), dst.size(), 5, &r).isOk());
  ASSERT_TRUE(isend(src.data(), src.size(), 6, &s).isOk());
  ASSERT_TRUE(drive(t_.get(), {&r}, testing_util::kTestDeadlineMs, {&s}));
  ASSERT_FALSE(r.status.isOk());
  EXPECT_NE(r.status.message().find("tag mismatch"), std::string::npos) << r.status.message();
  EXPECT_EQ(r.status.cause(), Cause::kMismatch);
  EXPECT_NE(r.status.message().find("127.0.0.1"), std::string::npos) << r.status.message();
  closePair(t_.get(), &p_);  // before src goes: the send may still be in flight
}

TEST_P(SocketTransportTest, GroupedTagMismatch) {
  std::vector<unsigned char> a(10), b(10);
  void* bufs[2] = {a.data(), b.data()};
  size_t caps[2] = {10, 10};
  int tags[2] = {1, 2};
  Req r, s1, s2;
  ASSERT_TRUE(t_->irecv(p_.recv, 2, bufs, caps, tags, nullptr, &r.handle).isOk());
  std::vector<unsigned char> src(10, 3);
  ASSERT_TRUE(isend(src.data(), 10, 1, &s1).isOk());
  ASSERT_TRUE(isend(src.data(), 10, 1, &s2).isOk());  // tag 1 again: no buffer left for it
  ASSERT_TRUE(drive(t_.get(), {&r}, testing_util::kTestDeadlineMs, {&s1, &s2}));
  ASSERT_FALSE(r.status.isOk());
  EXPECT_NE(r.status.message().find("tag mismatch"), std::string::npos) << r.status.message();
  EXPECT_EQ(r.status.cause(), Cause::kMismatch);
  closePair(t_.get(), &p_);
}

// Many messages of mixed sizes through a window of posted requests, with grouped receives of
// random width: exercises wrap-around of the frame ring and in-order completion.
TEST_P(SocketTransportTest, PipelinedMixedSizes) {
  constexpr int kMessages = 700;
  constexpr int kWindow = 16;
  std::mt19937 rng(1234 + GetParam().nsocks * 10 + GetParam().nthreads);
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
  int nextSend = 0, nextRecv = 0, doneSend = 0, doneRecv = 0;
  Deadline deadline(testing_util::kTestDeadlineMs);
  while (doneSend < kMessages || doneRecv < kMessages) {
    ASSERT_FALSE(deadline.expired()) << "sent " << doneSend << " received " << doneRecv;
    while (nextSend < kMessages && sends.size() < kWindow) {
      Posted p;
      p.first = nextSend;
      p.n = 1;
      p.bufs.emplace_back(size[nextSend]);
      fillPattern(p.bufs[0].data(), size[nextSend], nextSend);
      ASSERT_TRUE(isend(p.bufs[0].data(), size[nextSend], nextSend, &p.req).isOk());
      if (p.req.handle == nullptr) break;
      ++nextSend;
      sends.push_back(std::move(p));
    }
    while (nextRecv < kMessages && recvs.size() < kWindow) {
      Posted p;
      p.first = nextRecv;
      p.n = std::min<int>(1 + rng() % net::kSocketMaxRecvs, kMessages - nextRecv);
      void* ptrs[net::kSocketMaxRecvs];
      size_t caps[net::kSocketMaxRecvs];
      int tags[net::kSocketMaxRecvs];
      for (int j = 0; j < p.n; ++j) {
        int m = nextRecv + (p.n - 1 - j);  // buffers listed in reverse tag order
        caps[j] = size[m] + rng() % 100;
        tags[j] = m;
        p.bufs.emplace_back(caps[j]);
        ptrs[j] = p.bufs[j].data();
      }
      ASSERT_TRUE(t_->irecv(p_.recv, p.n, ptrs, caps, tags, nullptr, &p.req.handle).isOk());
      if (p.req.handle == nullptr) break;
      nextRecv += p.n;
      recvs.push_back(std::move(p));
    }
    bool progressed = false;
    // Test every posted request; completions must come in posting order. A request found
    // pending may complete while a later one is tested (that test drives the socket too): when a
    // later one is done, every earlier one must be done by now.
    for (auto* q : {&sends, &recvs}) {
      for (size_t i = 0; i < q->size(); ++i) {
        Posted& p = (*q)[i];
        if (p.req.finished) continue;
        int done = 0;
        Status st = t_->test(p.req.handle, &done, p.req.sizes);
        ASSERT_TRUE(st.isOk()) << st.message();
        if (!done) continue;
        for (size_t k = 0; k < i; ++k) {
          Posted& e = (*q)[k];
          if (e.req.finished) continue;
          int earlierDone = 0;
          ASSERT_TRUE(t_->test(e.req.handle, &earlierDone, e.req.sizes).isOk());
          ASSERT_TRUE(earlierDone) << "request of message " << p.first
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
      std::vector<void*> waiting;
      for (auto& p : sends) waiting.push_back(p.req.handle);
      for (auto& p : recvs) waiting.push_back(p.req.handle);
      t_->waitActivity(waiting.data(), static_cast<int>(waiting.size()), nullptr, 1);
    }
  }
}

TEST_P(SocketTransportTest, PeerCloseFailsPendingReceive) {
  std::vector<unsigned char> dst(1 << 20);
  Req r1, r2;
  ASSERT_TRUE(irecv(dst.data(), dst.size(), 1, &r1).isOk());
  ASSERT_TRUE(irecv(dst.data(), dst.size(), 1, &r2).isOk());
  // Half a message, then the sender goes away.
  std::vector<unsigned char> src(300000);
  Req s;
  ASSERT_TRUE(isend(src.data(), src.size(), 1, &s).isOk());
  ASSERT_TRUE(drive(t_.get(), {&s}));
  ASSERT_TRUE(t_->closeSend(p_.send).isOk());
  p_.send = nullptr;
  ASSERT_TRUE(drive(t_.get(), {&r1, &r2}));
  EXPECT_TRUE(r1.status.isOk()) << r1.status.message();
  ASSERT_FALSE(r2.status.isOk());
  EXPECT_EQ(r2.status.code(), Code::kRemote);
  EXPECT_NE(r2.status.message().find("connection closed by peer 127.0.0.1:"), std::string::npos)
      << r2.status.message();
  EXPECT_EQ(r2.status.cause(), Cause::kPeerGone);  // what makes the runtime ask for the cause
  Req later;
  EXPECT_FALSE(irecv(dst.data(), dst.size(), 1, &later).isOk());
}

TEST_P(SocketTransportTest, PeerCloseFailsPendingSend) {
  std::vector<unsigned char> src(size_t(64) << 20);
  Req s;
  ASSERT_TRUE(isend(src.data(), src.size(), 1, &s).isOk());
  drive(t_.get(), {&s}, 50);  // let some bytes go
  ASSERT_TRUE(t_->closeRecv(p_.recv).isOk());
  p_.recv = nullptr;
  ASSERT_TRUE(drive(t_.get(), {&s}));
  ASSERT_FALSE(s.status.isOk()) << "64 MiB send to a closed peer completed";
  EXPECT_EQ(s.status.code(), Code::kRemote) << s.status.message();
  EXPECT_NE(s.status.message().find("127.0.0.1:"), std::string::npos) << s.status.message();
}

TEST_P(SocketTransportTest, CloseWithRequestsInFlight) {
  std::vector<unsigned char> src(4 << 20), dst(4 << 20);
  std::vector<Req> s(4), r(4);
  for (int k = 0; k < 4; ++k) {
    ASSERT_TRUE(irecv(dst.data(), dst.size(), k, &r[k]).isOk());
    ASSERT_TRUE(isend(src.data(), src.size(), k, &s[k]).isOk());
  }
  int done = 0;
  EXPECT_TRUE(t_->test(s[0].handle, &done, nullptr).isOk());
  EXPECT_TRUE(t_->test(r[0].handle, &done, nullptr).isOk());
  closePair(t_.get(), &p_);
  // And the other order, with nothing tested at all.
  ASSERT_TRUE(connectPair(t_.get(), 0, &p_).isOk());
  for (int k = 0; k < 4; ++k) {
    ASSERT_TRUE(isend(src.data(), src.size(), k, &s[k]).isOk());
    ASSERT_TRUE(irecv(dst.data(), dst.size(), k, &r[k]).isOk());
  }
  EXPECT_TRUE(t_->closeRecv(p_.recv).isOk());
  p_.recv = nullptr;
  EXPECT_TRUE(t_->closeSend(p_.send).isOk());
  p_.send = nullptr;
}

TEST_P(SocketTransportTest, WaitActivityWakesForData) {
  std::vector<unsigned char> src(100000), dst(100000);
  fillPattern(src.data(), src.size(), 9);
  Req r;
  ASSERT_TRUE(irecv(dst.data(), dst.size(), 0, &r).isOk());
  // Nothing sent yet: waitActivity sleeps at most its timeout and returns.
  t_->waitActivity(&r.handle, 1, nullptr, 20);
  Req s;
  ASSERT_TRUE(isend(src.data(), src.size(), 0, &s).isOk());
  Deadline deadline(testing_util::kTestDeadlineMs);
  int sdone = 0, rdone = 0;
  while (!(sdone && rdone) && !deadline.expired()) {
    if (!sdone) {
      ASSERT_TRUE(t_->test(s.handle, &sdone, nullptr).isOk());
    }
    if (!rdone) {
      ASSERT_TRUE(t_->test(r.handle, &rdone, nullptr).isOk());
    }
    void* w[2] = {sdone ? nullptr : s.handle, rdone ? nullptr : r.handle};
    if (!(sdone && rdone)) t_->waitActivity(w, 2, nullptr, 1000);
  }
  ASSERT_TRUE(sdone && rdone);
  EXPECT_EQ(checkPattern(dst.data(), dst.size(), 9), -1);
}

TEST_P(SocketTransportTest, InvalidArguments) {
  Req r;
  EXPECT_EQ(isend(nullptr, 10, 0, &r).code(), Code::kInvalidArgument);
  EXPECT_EQ(r.handle, nullptr);
  EXPECT_EQ(irecv(nullptr, 10, 0, &r).code(), Code::kInvalidArgument);
  void* bufs[9] = {};
  size_t sizes[9] = {};
  int tags[9] = {};
  EXPECT_EQ(t_->irecv(p_.recv, 9, bufs, sizes, tags, nullptr, &r.handle).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(t_->irecv(p_.recv, 0, bufs, sizes, tags, nullptr, &r.handle).code(),
            Code::kInvalidArgument);
  // Wrong direction.
  EXPECT_FALSE(t_->isend(p_.recv, bufs, 0, 0, nullptr, &r.handle).isOk());
  // Zero-size with a null pointer is fine.
  roundTrip(0, 0, 0);
}

INSTANTIATE_TEST_SUITE_P(Configs, SocketTransportTest,
                         ::testing::Values(Config{1, 0}, Config{2, 0}, Config{4, 0}, Config{1, 2},
                                           Config{2, 2}, Config{4, 2}),
                         configName);

}  // namespace
}  // namespace loom
