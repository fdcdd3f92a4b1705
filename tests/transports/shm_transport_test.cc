// The shared-memory transport's own tests (what it does of the net::Transport contract is in
// net_conformance_test.cc, eager and single copy): a failed peer's state reported to waiters, and
// the segment's geometry (host_area.h).
#include "transports/shm/shm_transport.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <vector>

#include "tests/transports/net_backends.h"
#include "transports/shm/host_area.h"
#include "transports/shm/host_group.h"

namespace loom::shm {
namespace {

using testing_util::uniqueShmName;

TEST(Shm, PeerStateIsReportedToWaiters) {
  Options o;
  o.slotBytes = 4096;
  o.slots = 4;
  o.llBytes = 4096;
  auto p = testing_util::makeShmRanks(o);
  ASSERT_TRUE(p.isOk()) << p.status().message();
  Transport* const* t = p.value()->t;
  std::vector<char> dst(16);
  void* rreq = nullptr;
  size_t cap = 16;
  int tag = 3;
  void* d = dst.data();
  ASSERT_TRUE(t[1]->irecv(t[1]->recvConn(0), 1, &d, &cap, &tag, nullptr, &rreq).isOk());
  p.value()->g[0]->setState(PeerState::kFailed);
  Status st;
  int done = 0;
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (st.isOk() && !done && std::chrono::steady_clock::now() < end)
    st = t[1]->test(rreq, &done, nullptr);
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("rank 0"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("failed"), std::string::npos) << st.message();
  EXPECT_EQ(st.cause(), Cause::kPeerGone);
}

// Between threads of one process the receiver reads the sender's memory exactly when single copy
// is on.
TEST(Shm, SingleCopyBetweenThreadsIsProbed) {
  for (bool singleCopy : {false, true}) {
    Options o;
    o.slotBytes = 4096;
    o.slots = 4;
    o.llBytes = 4096;
    o.singleCopyThreads = singleCopy;
    auto p = testing_util::makeShmRanks(o);
    ASSERT_TRUE(p.isOk()) << p.status().message();
    EXPECT_EQ(p.value()->t[0]->receiverCanRead(1), singleCopy);
    EXPECT_EQ(p.value()->t[1]->receiverCanRead(0), singleCopy);
  }
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
  std::string name = uniqueShmName();
  size_t bytes = segmentBytes(2, o);
  auto a = Segment::create(name, bytes);
  ASSERT_TRUE(a.isOk()) << a.status().message();
  EXPECT_FALSE(Segment::create(name, bytes).isOk());  // O_EXCL
  EXPECT_FALSE(Segment::open(name, bytes + 4096).isOk());
  HostArea::format(a.value()->base(), 2, o);
  Options other = o;
  other.slots = 4;
  auto b = Segment::open(name, bytes);
  ASSERT_TRUE(b.isOk());
  std::vector<LocalPeer> peers = {{0, getpid()}, {1, getpid()}};
  auto t = HostArea::attach(std::move(b).value(), 1, peers, other, nullptr);
  EXPECT_FALSE(t.isOk());
  a.value()->unlink();
  EXPECT_FALSE(Segment::open(name, bytes).isOk());  // unlinked: gone from /dev/shm
}

}  // namespace
}  // namespace loom::shm
