// The shared-memory transport on its own: two ranks of this process over one segment, through
// the eager slots and through single copy; errors for mismatched tags and sizes; geometry.
#include "transports/shm/shm_transport.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

namespace loom::shm {
namespace {

std::string uniqueName() {
  static std::atomic<int> n{0};
  return "/loom-test-" + std::to_string(getpid()) + "-" + std::to_string(n++);
}

struct Pair {
  std::unique_ptr<Transport> t[2];
  std::string name;
};

Pair makePair(Options opts) {
  Pair p;
  p.name = uniqueName();
  std::vector<LocalPeer> peers = {{0, getpid()}, {1, getpid()}};
  size_t bytes = segmentBytes(2, opts);
  auto seg0 = Segment::create(p.name, bytes);
  EXPECT_TRUE(seg0.isOk()) << seg0.status().message();
  Transport::format(seg0.value()->base(), 2, opts);
  auto seg1 = Segment::open(p.name, bytes);
  EXPECT_TRUE(seg1.isOk()) << seg1.status().message();
  seg0.value()->unlink();
  auto t0 = Transport::attach(std::move(seg0).value(), 0, peers, opts, nullptr);
  auto t1 = Transport::attach(std::move(seg1).value(), 1, peers, opts, nullptr);
  EXPECT_TRUE(t0.isOk() && t1.isOk());
  p.t[0] = std::move(t0).value();
  p.t[1] = std::move(t1).value();
  for (auto& t : p.t) t->publishProbe();
  for (auto& t : p.t) t->probePeers();
  return p;
}

// Drives a send on t0 and a receive on t1 to completion (one thread plays both ranks).
Status exchange(Pair& p, const void* src, size_t bytes, int sendTag, void* dst, size_t cap,
                int recvTag, size_t* got, bool reduce = false, const void* other = nullptr) {
  void *sreq = nullptr, *rreq = nullptr;
  LOOM_TRY(p.t[0]->isend(p.t[0]->sendComm(1), src, bytes, sendTag, nullptr, &sreq));
  if (reduce) {
    LOOM_TRY(p.t[1]->irecvReduce(p.t[1]->recvComm(0), dst, other, cap, recvTag, loomFloat32,
                                 loomSum, &rreq));
  } else {
    LOOM_TRY(p.t[1]->irecv(p.t[1]->recvComm(0), 1, &dst, &cap, &recvTag, nullptr, &rreq));
  }
  int sdone = 0, rdone = 0;
  for (int i = 0; i < 1000000 && !(sdone && rdone); ++i) {
    if (!sdone) LOOM_TRY(p.t[0]->test(sreq, &sdone, nullptr));
    if (!rdone) LOOM_TRY(p.t[1]->test(rreq, &rdone, got));
  }
  if (!(sdone && rdone)) return Status(Code::kTimeout, "exchange did not finish");
  return Status();
}

class ShmSizes : public ::testing::TestWithParam<std::tuple<bool, size_t>> {};

TEST_P(ShmSizes, BytesArriveIntactAndReduce) {
  auto [singleCopy, bytes] = GetParam();
  Options o;
  o.slotBytes = 4096;
  o.slots = 4;
  o.llBytes = 4096;
  o.rtsMin = 1;
  o.singleCopyThreads = singleCopy;
  Pair p = makePair(o);
  ASSERT_EQ(p.t[0]->receiverCanRead(1), singleCopy);
  std::vector<char> src(bytes), dst(bytes + 16, 0x55);
  std::mt19937 rng(static_cast<unsigned>(bytes));
  for (auto& c : src) c = static_cast<char>(rng());
  size_t got = 0;
  Status st = exchange(p, src.data(), bytes, 7, dst.data(), bytes + 16, 7, &got);
  ASSERT_TRUE(st.isOk()) << st.message();
  EXPECT_EQ(got, bytes);
  if (bytes) {
    EXPECT_EQ(std::memcmp(src.data(), dst.data(), bytes), 0);
  }
  EXPECT_EQ(dst[bytes], 0x55) << "wrote past the message";
  // Fused receive-reduce: out = mine + received.
  size_t n = bytes / 4;
  std::vector<float> a(n), b(n), out(n);
  std::iota(a.begin(), a.end(), 1.0f);
  std::iota(b.begin(), b.end(), 100.0f);
  st = exchange(p, a.data(), n * 4, 9, out.data(), n * 4, 9, &got, true, b.data());
  ASSERT_TRUE(st.isOk()) << st.message();
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], a[i] + b[i]) << i;
}

INSTANTIATE_TEST_SUITE_P(Shm, ShmSizes,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values(0, 4, 4096, 4100, 65536 + 12,
                                                              size_t(1) << 20)),
                         [](const auto& p) {
                           return std::string(std::get<0>(p.param) ? "SingleCopy" : "Eager") + "_" +
                                  std::to_string(std::get<1>(p.param));
                         });

TEST(Shm, WrongTagAndTruncationAreErrorsNotCorruption) {
  Options o;
  o.slotBytes = 4096;
  o.slots = 4;
  o.llBytes = 4096;
  for (bool single : {false, true}) {
    o.singleCopyThreads = single;
    o.rtsMin = 1;
    {
      Pair p = makePair(o);
      std::vector<char> src(100, 1), dst(100, 0);
      size_t got = 0;
      Status st = exchange(p, src.data(), 100, 1, dst.data(), 100, 2, &got);
      EXPECT_FALSE(st.isOk());
      EXPECT_NE(st.message().find("tag"), std::string::npos) << st.message();
      EXPECT_EQ(st.cause(), Cause::kMismatch);
      EXPECT_EQ(dst[0], 0);
    }
    {
      Pair p = makePair(o);
      std::vector<char> src(100, 1), dst(64, 0);
      size_t got = 0;
      Status st = exchange(p, src.data(), 100, 1, dst.data(), 50, 1, &got);
      EXPECT_FALSE(st.isOk());
      EXPECT_NE(st.message().find("truncated"), std::string::npos) << st.message();
      EXPECT_EQ(st.cause(), Cause::kMismatch);
      EXPECT_EQ(dst[50], 0);
    }
  }
}

TEST(Shm, PeerStateIsReportedToWaiters) {
  Options o;
  o.slotBytes = 4096;
  o.slots = 4;
  o.llBytes = 4096;
  Pair p = makePair(o);
  std::vector<char> dst(16);
  void* rreq = nullptr;
  size_t cap = 16;
  int tag = 3;
  void* d = dst.data();
  ASSERT_TRUE(p.t[1]->irecv(p.t[1]->recvComm(0), 1, &d, &cap, &tag, nullptr, &rreq).isOk());
  p.t[0]->setState(PeerState::kFailed);
  Status st;
  int done = 0;
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (st.isOk() && !done && std::chrono::steady_clock::now() < end)
    st = p.t[1]->test(rreq, &done, nullptr);
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("rank 0"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("failed"), std::string::npos) << st.message();
}

TEST(Shm, RingsShrinkToFitManyLocalRanks) {
  Options o;  // 64 KiB x 8 slots per ring by default
  Options small = fitOptions(2, o);
  EXPECT_EQ(small.slotBytes, o.slotBytes);
  EXPECT_EQ(small.slots, o.slots);
  Options many = fitOptions(64, o);
  EXPECT_LE(64u * 64u * many.slots * (many.slotBytes + 64), o.budgetBytes);
  EXPECT_GE(many.slots, 2);
  EXPECT_GE(many.slotBytes, 4096u);
  EXPECT_GT(segmentBytes(64, many), 0u);
}

TEST(Shm, SegmentNamesAreExclusiveAndAttachChecksGeometry) {
  Options o;
  o.slotBytes = 4096;
  o.slots = 2;
  o.llBytes = 1024;
  std::string name = uniqueName();
  size_t bytes = segmentBytes(2, o);
  auto a = Segment::create(name, bytes);
  ASSERT_TRUE(a.isOk()) << a.status().message();
  EXPECT_FALSE(Segment::create(name, bytes).isOk());  // O_EXCL
  EXPECT_FALSE(Segment::open(name, bytes + 4096).isOk());
  Transport::format(a.value()->base(), 2, o);
  Options other = o;
  other.slots = 4;
  auto b = Segment::open(name, bytes);
  ASSERT_TRUE(b.isOk());
  std::vector<LocalPeer> peers = {{0, getpid()}, {1, getpid()}};
  auto t = Transport::attach(std::move(b).value(), 1, peers, other, nullptr);
  EXPECT_FALSE(t.isOk());
  a.value()->unlink();
  EXPECT_FALSE(Segment::open(name, bytes).isOk());  // unlinked: gone from /dev/shm
}

}  // namespace
}  // namespace loom::shm
