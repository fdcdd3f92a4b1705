// Cost model: the simulation against the alpha-beta-gamma closed forms it should reproduce, the
// sharing of NICs and memory, traffic accounting, and error cases (deadlock, mismatches).
#include "algorithms/cost_model.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "algorithms/builder.h"
#include "algorithms/schedule.h"
#include "tests/algorithms/schedule_test_util.h"

namespace loom {
namespace {

constexpr double kAlpha = 5e-6;  // seconds per message
constexpr double kBw = 10e9;     // link bytes per second (beta = 1 / kBw)
constexpr double kRed = 4e9;     // bytes reduced per second (gamma = 1 / kRed)
constexpr size_t kEs = 4;        // element size (float)

Schedule generated(CollKind coll, const char* name, int n, size_t count, bool inPlace = false,
                   int root = 0) {
  const AlgorithmInfo* algo = findAlgorithm(coll, name);
  EXPECT_NE(algo, nullptr) << name;
  return buildSchedule(*algo, callArgs(coll, n, count, root, inPlace));
}

// Every rank on one host, links at kAlpha / kBw, reductions at kRed, copies and memory free.
CostMachine oneHost(int n) {
  CostMachine m = CostMachine::uniform(n, n);
  m.intra = {kAlpha, kBw};
  m.inter = {kAlpha, kBw};
  m.reduceBytesPerSec = kRed;
  return m;
}

// One rank per host: every transfer crosses the network.
CostMachine oneRankPerHost(int n) {
  CostMachine m = CostMachine::uniform(n, 1);
  m.intra = {kAlpha, kBw};
  m.inter = {kAlpha, kBw};
  m.reduceBytesPerSec = kRed;
  return m;
}

CostEstimate price(const Schedule& s, const CostMachine& m, size_t pieceBytes) {
  Result<CostEstimate> r = estimateCost(s, m, kEs, pieceBytes);
  EXPECT_TRUE(r.isOk()) << r.status().message();
  return r.isOk() ? r.value() : CostEstimate{};
}

#define EXPECT_REL(actual, expected)                                                 \
  EXPECT_NEAR((actual), (expected), 1e-9 * std::fabs(static_cast<double>(expected))) \
      << "relative error " << ((actual) / (expected)-1)

TEST(CostModel, UniformMachine) {
  CostMachine m = CostMachine::uniform(5, 2);
  EXPECT_EQ(m.hostOf, (std::vector<int>{0, 0, 1, 1, 2}));
}

// Unsplit steps: reduce-scatter steps cost alpha + m/n beta + m/n gamma (receive, then reduce),
// allgather steps alpha + m/n beta: 2(n-1) alpha + 2 (n-1)/n m beta + (n-1)/n m gamma.
TEST(CostModel, RingAllReduceOneHostMatchesClosedForm) {
  for (int n : {2, 3, 4, 8}) {
    const size_t count = 3 * 4096 * static_cast<size_t>(n);
    const double m = static_cast<double>(count * kEs);
    const CostEstimate e = price(generated(CollKind::kAllReduce, "ring", n, count), oneHost(n), 0);
    const double want =
        2 * (n - 1) * kAlpha + 2.0 * (n - 1) / n * m / kBw + 1.0 * (n - 1) / n * m / kRed;
    EXPECT_REL(e.seconds, want) << "n=" << n;
    EXPECT_REL(e.bytesIntra, 2.0 * (n - 1) * m);
    EXPECT_EQ(e.bytesInter, 0);
    EXPECT_EQ(e.messagesIntra, static_cast<size_t>(2 * (n - 1) * n));
    EXPECT_REL(e.bytesReduced, (n - 1) * m);
    EXPECT_EQ(e.maxSteps, 4 * (n - 1));
    ASSERT_EQ(e.rankSeconds.size(), static_cast<size_t>(n));
    for (double t : e.rankSeconds) EXPECT_REL(t, want);
  }
}

// k pieces per ring block of p bytes: each connection carries 2(n-1)k back-to-back pieces of
// alpha + p beta, and never waits as long as one piece's reduction (p gamma) fits in the k-1
// pieces sent before the one that forwards it: 2(n-1)k (alpha + p beta), gamma hidden.
TEST(CostModel, RingAllReducePipelinedHidesReductions) {
  const int n = 4, k = 8;
  const size_t pieceBytes = 64 * 1024;
  const size_t count = static_cast<size_t>(n * k) * pieceBytes / kEs;
  const double p = static_cast<double>(pieceBytes);
  ASSERT_LE(p / kRed, (k - 1) * (kAlpha + p / kBw));
  const CostEstimate e =
      price(generated(CollKind::kAllReduce, "ring", n, count), oneHost(n), pieceBytes);
  EXPECT_REL(e.seconds, 2.0 * (n - 1) * k * (kAlpha + p / kBw));
  EXPECT_EQ(e.maxPieces, static_cast<size_t>(4 * (n - 1) * k));
}

// With the shared-memory transport's fused receive-reduce, a reduce-scatter step moves at the
// slower of the link and the reduction and pays no separate reduction.
TEST(CostModel, RingAllReduceFusedReceiveReduce) {
  const int n = 4;
  const size_t count = 1 << 20;
  const double m = static_cast<double>(count * kEs);
  CostMachine mach = oneHost(n);
  mach.fuseIntraRecvReduce = true;
  const CostEstimate e = price(generated(CollKind::kAllReduce, "ring", n, count), mach, 0);
  EXPECT_REL(e.seconds, 2 * (n - 1) * kAlpha + (n - 1.0) / n * m / std::min(kBw, kRed) +
                            (n - 1.0) / n * m / kBw);
}

// Each rank's memory is shared by the transfer it sends and the one it receives (both intra-host)
// during a ring step; its reduction runs alone afterwards.
TEST(CostModel, RingAllReduceMemoryBound) {
  const int n = 4;
  const size_t count = 1 << 20;
  const double m = static_cast<double>(count * kEs), c = m / n;
  CostMachine mach = oneHost(n);
  mach.memBytesPerSec = kBw;  // two transfers per rank: kBw / 2 each
  const CostEstimate e = price(generated(CollKind::kAllReduce, "ring", n, count), mach, 0);
  EXPECT_REL(e.seconds, 2 * (n - 1) * (kAlpha + c / (kBw / 2)) + (n - 1) * c / kRed);
}

// Pipelined chain broadcast in k pieces: (n-2+k)(alpha + m/k beta).
TEST(CostModel, ChainBroadcastPipelining) {
  for (int n : {2, 3, 5, 8}) {
    for (int k : {1, 4, 16}) {
      const size_t pieceBytes = 256 * 1024;
      const size_t count = static_cast<size_t>(k) * pieceBytes / kEs;
      const double m = static_cast<double>(count * kEs);
      const CostEstimate e = price(generated(CollKind::kBroadcast, "chain", n, count, true, 0),
                                   oneRankPerHost(n), pieceBytes);
      EXPECT_REL(e.seconds, (n - 2 + k) * (kAlpha + m / k / kBw)) << "n=" << n << " k=" << k;
      EXPECT_REL(e.bytesInter, (n - 1) * m);
      EXPECT_EQ(e.messagesInter, static_cast<size_t>((n - 1) * k));
    }
  }
}

// Recursive doubling for a power of two: log2 n (alpha + m beta + m gamma), both with RecvReduce
// (the lower rank) and with Recv then Reduce (the higher).
TEST(CostModel, RecursiveDoublingAllReduce) {
  for (int n : {2, 4, 8, 16}) {
    const size_t count = 1000;
    const double m = static_cast<double>(count * kEs);
    const CostEstimate e =
        price(generated(CollKind::kAllReduce, "rd", n, count), oneRankPerHost(n), 0);
    const double lg = std::log2(n);
    EXPECT_REL(e.seconds, lg * (kAlpha + m / kBw + m / kRed)) << "n=" << n;
    EXPECT_REL(e.bytesInter, n * lg * m);
  }
}

// Pairwise AllToAll posts every exchange at once: with per-connection rates only, one message
// time (alpha + m/n beta); behind one NIC port per rank of the link's speed, the n-1 outgoing
// flows share it: alpha + (n-1)/n m beta (the bandwidth term of the (n-1) alpha + m beta
// sequential form; the alphas overlap here).
TEST(CostModel, PairwiseAllToAll) {
  for (int n : {3, 4, 7}) {
    const size_t count = 5000;  // elements per peer
    const double block = static_cast<double>(count * kEs), m = n * block;
    CostMachine mach = oneRankPerHost(n);
    CostEstimate e = price(generated(CollKind::kAllToAll, "pairwise", n, count), mach, 0);
    EXPECT_REL(e.seconds, kAlpha + block / kBw) << "n=" << n;
    EXPECT_REL(e.bytesInter, n * (n - 1) * block);
    mach.nicBytesPerSec = kBw;
    e = price(generated(CollKind::kAllToAll, "pairwise", n, count), mach, 0);
    EXPECT_REL(e.seconds, kAlpha + (n - 1.0) / n * m / kBw) << "n=" << n;
    EXPECT_REL(e.maxNicBytes, (n - 1) * block);
  }
}

Schedule handMade(CollKind coll, int n, size_t count, std::vector<StepList>& lists) {
  Schedule s;
  s.args.coll = coll;
  s.args.nranks = n;
  s.args.count = count;
  s.algorithm = "hand";
  for (StepList& l : lists) s.ranks.push_back(l.finish());
  return s;
}

// Two flows leaving one host share its NIC: C/2 each (and two entering one host likewise).
TEST(CostModel, NicSharedByFlowsLeavingAHost) {
  const size_t count = 1 << 18;
  const double bytes = static_cast<double>(count * kEs);
  const double nic = 2e9;
  for (bool sameDestHost : {false, true}) {
    std::vector<StepList> l(4);
    l[0].send(2, inputAt(0), count);
    l[1].send(3, inputAt(0), count);
    l[2].recv(0, outputAt(0), count);
    l[3].recv(1, outputAt(0), count);
    const Schedule s = handMade(CollKind::kSendRecv, 4, count, l);
    CostMachine m;
    m.hostOf = sameDestHost ? std::vector<int>{0, 0, 1, 1} : std::vector<int>{0, 0, 1, 2};
    m.inter = {kAlpha, 0};  // unlimited per flow: the NIC decides
    m.nicBytesPerSec = nic;
    const CostEstimate e = price(s, m, 0);
    EXPECT_REL(e.seconds, kAlpha + bytes / (nic / 2));
    EXPECT_REL(e.maxNicBytes, 2 * bytes);
  }
  // One flow alone gets the whole port (capped by the per-flow rate when that is lower).
  std::vector<StepList> l(2);
  l[0].send(1, inputAt(0), count);
  l[1].recv(0, outputAt(0), count);
  CostMachine m = CostMachine::uniform(2, 1);
  m.inter = {kAlpha, nic / 4};
  m.nicBytesPerSec = nic;
  EXPECT_REL(price(handMade(CollKind::kSendRecv, 2, count, l), m, 0).seconds,
             kAlpha + bytes / (nic / 4));
}

// Unrelated transfers of different sizes and link classes each finish at their own time.
TEST(CostModel, IndependentTransfersFinishAtTheirOwnTimes) {
  const size_t count = 1 << 16;
  const double bytes = static_cast<double>(count * kEs);
  std::vector<StepList> l(6);
  l[0].send(1, inputAt(0), count);  // intra-host
  l[1].recv(0, outputAt(0), count);
  l[2].send(4, inputAt(0), 2 * count);  // inter-host, twice the bytes
  l[4].recv(2, outputAt(0), 2 * count);
  l[3].copy(inputAt(0), outputAt(0), 3 * count);
  const Schedule s = handMade(CollKind::kSendRecv, 6, 3 * count, l);
  CostMachine m;
  m.hostOf = {0, 0, 0, 0, 1, 1};
  m.intra = {1e-6, 20e9};
  m.inter = {kAlpha, kBw};
  m.copyBytesPerSec = 30e9;
  const CostEstimate e = price(s, m, 0);
  EXPECT_REL(e.rankSeconds[0], 1e-6 + bytes / 20e9);
  EXPECT_REL(e.rankSeconds[1], 1e-6 + bytes / 20e9);
  EXPECT_REL(e.rankSeconds[2], kAlpha + 2 * bytes / kBw);
  EXPECT_REL(e.rankSeconds[3], 3 * bytes / 30e9);
  EXPECT_REL(e.rankSeconds[4], kAlpha + 2 * bytes / kBw);
  EXPECT_EQ(e.rankSeconds[5], 0);
  EXPECT_REL(e.seconds, kAlpha + 2 * bytes / kBw);
  EXPECT_REL(e.bytesIntra, bytes);
  EXPECT_REL(e.bytesInter, 2 * bytes);
}

// The transfers of one connection are served in order; a second channel is a second connection
// whose transfers proceed concurrently (what channels buy when one flow cannot fill the NIC).
TEST(CostModel, ChannelsAreConcurrentConnections) {
  const size_t count = 1 << 18, half = count / 2;
  const double bytes = static_cast<double>(count * kEs);
  CostMachine m = CostMachine::uniform(2, 1);
  m.inter = {kAlpha, kBw};
  m.nicBytesPerSec = 2 * kBw;
  for (int channels : {1, 2}) {
    std::vector<StepList> l(2);
    for (int k = 0; k < 2; ++k) {
      l[0].send(1, inputAt(static_cast<size_t>(k) * half), half, channels == 2 ? k : 0);
      l[1].recv(0, outputAt(static_cast<size_t>(k) * half), half, channels == 2 ? k : 0);
    }
    const CostEstimate e = price(handMade(CollKind::kSendRecv, 2, count, l), m, 0);
    if (channels == 1) {
      EXPECT_REL(e.seconds, 2 * kAlpha + bytes / kBw);
    } else {
      EXPECT_REL(e.seconds, kAlpha + bytes / 2 / kBw);
    }
  }
}

// Max-min fairness: a copy capped at a quarter of the rank's memory bandwidth leaves the other
// three quarters to a concurrent intra-host send (equal sharing would give it half).
TEST(CostModel, MaxMinFairMemorySharing) {
  const double mem = 8e9, t = 1e-3;
  const size_t copyCount = static_cast<size_t>(mem / 4 * t) / kEs;
  const size_t sendCount = static_cast<size_t>(mem * 3 / 4 * t) / kEs;
  std::vector<StepList> l(2);
  l[0].copy(inputAt(0), outputAt(0), copyCount);
  l[0].send(1, inputAt(0), sendCount);
  l[1].recv(0, outputAt(0), sendCount);
  const Schedule s = handMade(CollKind::kSendRecv, 2, sendCount, l);
  CostMachine m = CostMachine::uniform(2, 2);
  m.memBytesPerSec = mem;
  m.copyBytesPerSec = mem / 4;
  m.intra = {0, 0};
  const CostEstimate e = price(s, m, 0);
  EXPECT_REL(e.rankSeconds[0], t);
  EXPECT_REL(e.rankSeconds[1], t);
  EXPECT_REL(e.bytesCopied, static_cast<double>(copyCount * kEs));
}

// Four ranks on a host whose cores copy 2 x mem in all: four copies at once share the cores, two
// run at their own speed, and a rank that waits leaves its share to the busy ones. An intra-host
// transfer costs the cores twice (the sender copies in, the receiver copies out).
TEST(CostModel, OversubscribedHostSharesItsCores) {
  const double mem = 8e9;
  const size_t count = 1 << 20;
  const double bytes = static_cast<double>(count * kEs);
  CostMachine m = CostMachine::uniform(4, 4);
  m.memBytesPerSec = m.copyBytesPerSec = mem;
  m.intra = {0, 0};
  m.hostMemBytesPerSec = {2 * mem};
  for (int busy : {1, 2, 3, 4}) {
    std::vector<StepList> l(4);
    for (int r = 0; r < busy; ++r) l[static_cast<size_t>(r)].copy(inputAt(0), outputAt(0), count);
    const CostEstimate e = price(handMade(CollKind::kSendRecv, 4, count, l), m, 0);
    EXPECT_REL(e.seconds, bytes / std::min(mem, 2 * mem / busy)) << busy << " busy ranks";
  }
  // Two transfers (0 -> 1, 2 -> 3) need four copies: each gets half a core's speed.
  std::vector<StepList> l(4);
  l[0].send(1, inputAt(0), count);
  l[1].recv(0, outputAt(0), count);
  l[2].send(3, inputAt(0), count);
  l[3].recv(2, outputAt(0), count);
  const Schedule s = handMade(CollKind::kSendRecv, 4, count, l);
  EXPECT_REL(price(s, m, 0).seconds, bytes / (mem / 2));
  // Without the host limit each transfer runs at a core's speed.
  m.hostMemBytesPerSec.clear();
  EXPECT_REL(price(s, m, 0).seconds, bytes / mem);
  // A negative or infinite host rate is an error.
  m.hostMemBytesPerSec = {-1};
  EXPECT_FALSE(estimateCost(s, m, kEs, 0).isOk());
}

// A rank of an oversubscribed host is capped at its share (hostRankMemBytesPerSec) even while
// its peers wait: a root sending to three peers at once is slower than three ranks each sending
// to one, though the host moves the same bytes.
TEST(CostModel, OversubscribedRankCapSlowsAConcentratedSender) {
  const double mem = 8e9, rankCap = mem / 2;
  const size_t count = 1 << 20;
  const double bytes = static_cast<double>(count * kEs);
  CostMachine m = CostMachine::uniform(6, 6);
  m.memBytesPerSec = m.copyBytesPerSec = mem;
  m.intra = {0, 0};
  m.hostMemBytesPerSec = {4 * mem};
  m.hostRankMemBytesPerSec = {rankCap};
  std::vector<StepList> root(6);  // 0 -> 1, 2, 3
  for (int p = 1; p < 4; ++p) {
    root[0].send(p, inputAt(0), count);
    root[static_cast<size_t>(p)].recv(0, outputAt(0), count);
  }
  const Schedule concentrated = handMade(CollKind::kSendRecv, 6, count, root);
  EXPECT_REL(price(concentrated, m, 0).seconds, 3 * bytes / rankCap);
  std::vector<StepList> spread(6);  // 0 -> 1, 2 -> 3, 4 -> 5
  for (int p = 0; p < 6; p += 2) {
    spread[static_cast<size_t>(p)].send(p + 1, inputAt(0), count);
    spread[static_cast<size_t>(p + 1)].recv(p, outputAt(0), count);
  }
  const Schedule s = handMade(CollKind::kSendRecv, 6, count, spread);
  EXPECT_REL(price(s, m, 0).seconds, bytes / rankCap);
  // Without the cap the root runs at a core's speed.
  m.hostRankMemBytesPerSec.clear();
  EXPECT_REL(price(concentrated, m, 0).seconds, 3 * bytes / mem);
  m.hostRankMemBytesPerSec = {-1};
  EXPECT_FALSE(estimateCost(s, m, kEs, 0).isOk());
}

// A rank sending to three other hosts at once: by default each connection pays its alpha in
// parallel; with serialInterAlphaPerRank the sender pays them one after another.
TEST(CostModel, InterHostAlphaSerialPerSender) {
  const size_t count = 16;
  std::vector<StepList> l(4);
  for (int p = 1; p < 4; ++p) {
    l[0].send(p, inputAt(0), count);
    l[static_cast<size_t>(p)].recv(0, outputAt(0), count);
  }
  const Schedule s = handMade(CollKind::kSendRecv, 4, count, l);
  CostMachine m = CostMachine::uniform(4, 1);
  m.inter = {kAlpha, 0};
  EXPECT_REL(price(s, m, 0).seconds, kAlpha);
  m.serialInterAlphaPerRank = true;
  const CostEstimate e = price(s, m, 0);
  EXPECT_REL(e.seconds, 3 * kAlpha);
  EXPECT_REL(e.rankSeconds[1], kAlpha);  // the first message is not delayed
}

// Two-level AllReduce on 2 hosts x 2 ranks: intra reduce-scatter, inter exchange of each half,
// intra allgather. Rank r owns half r&1; its host peer is r^1, its network peer r^2.
Schedule hierarchicalAllReduce(size_t count) {
  const size_t h = count / 2;
  std::vector<StepList> l(4);
  for (int r = 0; r < 4; ++r) {
    StepList& b = l[static_cast<size_t>(r)];
    const size_t mine = static_cast<size_t>(r & 1) * h, other = h - mine;
    b.needScratch(h);
    b.send(r ^ 1, inputAt(other), h);
    b.recvReduce(r ^ 1, inputAt(mine), outputAt(mine), h);
    b.send(r ^ 2, outputAt(mine), h);
    b.recvReduce(r ^ 2, outputAt(mine), scratchAt(0), h);
    b.send(r ^ 1, scratchAt(0), h);
    b.copy(scratchAt(0), outputAt(mine), h);
    b.recv(r ^ 1, outputAt(other), h);
  }
  return handMade(CollKind::kAllReduce, 4, count, l);
}

TEST(CostModel, HierarchicalSendsFewerInterHostBytesThanRing) {
  const size_t count = 1 << 18;
  const double m = static_cast<double>(count * kEs);
  const Schedule hier = hierarchicalAllReduce(count);
  ASSERT_TRUE(verifySchedule(hier).isOk()) << verifySchedule(hier).message();
  CostMachine mach = CostMachine::uniform(4, 2);
  mach.intra = {1e-6, 50e9};
  mach.inter = {10e-6, 5e9};
  mach.nicBytesPerSec = 5e9;
  mach.reduceBytesPerSec = kRed;
  const CostEstimate ring =
      price(generated(CollKind::kAllReduce, "ring", 4, count), mach, 128 * 1024);
  const CostEstimate two = price(hier, mach, 128 * 1024);
  // Ring 0-1-2-3: connections 1->2 and 3->0 cross hosts, each carrying 2(n-1) blocks of m/4.
  EXPECT_REL(ring.bytesInter, 2 * 6 * m / 4);
  EXPECT_REL(two.bytesInter, 4 * m / 2);
  EXPECT_LT(two.bytesInter, ring.bytesInter);
  EXPECT_LT(two.seconds, ring.seconds);
}

TEST(CostModel, DeadlockIsAnErrorNotAHang) {
  // Each rank forwards what it has not yet received: the send waits for the receive, whose match
  // is the peer's send.
  std::vector<StepList> l(2);
  for (int r = 0; r < 2; ++r) {
    l[static_cast<size_t>(r)].recv(1 - r, outputAt(0), 16);
    l[static_cast<size_t>(r)].send(1 - r, outputAt(0), 16);
  }
  Result<CostEstimate> e =
      estimateCost(handMade(CollKind::kSendRecv, 2, 16, l), CostMachine::uniform(2, 1), kEs, 0);
  ASSERT_FALSE(e.isOk());
  EXPECT_NE(e.status().message().find("deadlock"), std::string::npos) << e.status().message();
}

TEST(CostModel, UnmatchedAndMismatchedTransfersAreErrors) {
  {
    std::vector<StepList> l(2);
    l[0].send(1, inputAt(0), 16);
    Result<CostEstimate> e =
        estimateCost(handMade(CollKind::kSendRecv, 2, 16, l), CostMachine::uniform(2, 1), kEs, 0);
    ASSERT_FALSE(e.isOk());
    EXPECT_NE(e.status().message().find("never matched"), std::string::npos)
        << e.status().message();
  }
  {
    std::vector<StepList> l(2);
    l[0].send(1, inputAt(0), 16);
    l[1].recv(0, outputAt(0), 8);
    Result<CostEstimate> e =
        estimateCost(handMade(CollKind::kSendRecv, 2, 16, l), CostMachine::uniform(2, 1), kEs, 0);
    ASSERT_FALSE(e.isOk());
    EXPECT_NE(e.status().message().find("receives 8"), std::string::npos) << e.status().message();
  }
}

TEST(CostModel, InvalidArguments) {
  const Schedule s = generated(CollKind::kAllReduce, "ring", 4, 1024);
  EXPECT_FALSE(estimateCost(s, CostMachine::uniform(3, 1), kEs, 0).isOk());  // hostOf size
  EXPECT_FALSE(estimateCost(s, CostMachine::uniform(4, 1), 0, 0).isOk());    // element size
  CostMachine m = CostMachine::uniform(4, 1);
  m.inter.bytesPerSec = -1;
  EXPECT_FALSE(estimateCost(s, m, kEs, 0).isOk());
  m = CostMachine::uniform(4, 1);
  m.hostOf[2] = -1;
  EXPECT_FALSE(estimateCost(s, m, kEs, 0).isOk());
}

// Every registered generator prices without error on a two-level machine (a verified schedule
// cannot deadlock), and a larger piece never means more messages.
TEST(CostModel, PricesEveryGenerator) {
  for (const AlgorithmInfo& a : algorithms()) {
    for (int n : {1, 2, 5, 8}) {
      for (bool inPlace : {false, true}) {
        CollArgs args;
        args.coll = a.coll;
        args.nranks = n;
        args.count = 12345;
        args.root = n / 2;
        args.inPlace = inPlace;
        const Schedule s = buildSchedule(a, args);
        CostMachine m = CostMachine::uniform(n, 2);
        m.intra = {1e-6, 20e9};
        m.inter = {5e-6, 10e9};
        m.nicBytesPerSec = 12e9;
        m.memBytesPerSec = 30e9;
        m.reduceBytesPerSec = 8e9;
        m.copyBytesPerSec = 15e9;
        m.fuseIntraRecvReduce = n % 2 == 0;
        Result<CostEstimate> small = estimateCost(s, m, kEs, 4096);
        Result<CostEstimate> whole = estimateCost(s, m, kEs, 0);
        ASSERT_TRUE(small.isOk()) << a.name << " " << collName(a.coll) << " n=" << n << ": "
                                  << small.status().message();
        ASSERT_TRUE(whole.isOk()) << whole.status().message();
        EXPECT_GE(small.value().messagesInter, whole.value().messagesInter);
        EXPECT_REL(small.value().bytesInter + small.value().bytesIntra,
                   whole.value().bytesInter + whole.value().bytesIntra);
        if (n > 1) {
          EXPECT_GT(whole.value().seconds, 0) << a.name;
        }
      }
    }
  }
}

// Not a pass/fail test: how long pricing takes (ring AllReduce of 64 MiB, pieces of the default
// LOOM_CHUNK_SIZE of 512 KiB and of 4 MiB), printed for the planner's budget.
TEST(CostModel, PricingSpeed) {
  for (int n : {4, 8, 16, 64}) {
    for (size_t piece : {size_t{512} << 10, size_t{4} << 20}) {
      const size_t count = (size_t{64} << 20) / kEs;
      const Schedule s = generated(CollKind::kAllReduce, "ring", n, count);
      CostMachine m = CostMachine::uniform(n, 8);
      m.intra = {1e-6, 20e9};
      m.inter = {5e-6, 12e9};
      m.nicBytesPerSec = 25e9;
      m.memBytesPerSec = 30e9;
      m.reduceBytesPerSec = 8e9;
      const auto t0 = std::chrono::steady_clock::now();
      Result<CostEstimate> e = estimateCost(s, m, kEs, piece);
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      ASSERT_TRUE(e.isOk()) << e.status().message();
      std::printf(
          "pricing ring allreduce 64 MiB n=%d piece=%zu KiB: %.2f ms (%zu events, "
          "predicted %.3f ms)\n",
          n, piece >> 10, ms, e.value().events, e.value().seconds * 1e3);
      EXPECT_GT(e.value().seconds, 0);
    }
  }
}

}  // namespace
}  // namespace loom
