// Recursive halving/doubling ("rhd") AllReduce, ReduceScatter and AllGather: registration, message
// counts and volumes per rank against the formulas. (generators_test verifies them with every
// registered generator.)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "algorithms/schedule.h"
#include "tests/algorithms/schedule_test_util.h"

namespace loom {
namespace {

struct Traffic {
  int sends = 0;
  int recvs = 0;  // Recv and RecvReduce
  size_t sent = 0;
  size_t received = 0;
};
Traffic traffic(const RankSchedule& rs) {
  Traffic t;
  for (const Step& st : rs.steps) {
    if (st.kind == StepKind::kSend) {
      ++t.sends;
      t.sent += st.count;
    } else if (st.kind == StepKind::kRecv || st.kind == StepKind::kRecvReduce) {
      ++t.recvs;
      t.received += st.count;
    }
  }
  return t;
}

const AlgorithmInfo& rhd(CollKind coll) {
  const AlgorithmInfo* a = findAlgorithm(coll, "rhd");
  EXPECT_NE(a, nullptr) << collName(coll);
  return a ? *a : *defaultAlgorithm(coll);
}

TEST(Rhd, RegisteredWithoutChangingTheDefaults) {
  for (CollKind c : {CollKind::kAllReduce, CollKind::kReduceScatter, CollKind::kAllGather}) {
    const AlgorithmInfo* a = findAlgorithm(c, "rhd");
    ASSERT_NE(a, nullptr) << collName(c);
    EXPECT_STREQ(defaultAlgorithm(c)->name, "ring") << collName(c);
  }
  EXPECT_EQ(findAlgorithm(CollKind::kBroadcast, "rhd"), nullptr);
}

// Power of two, count divisible by n: 2 log2 n messages each way, halving then doubling, so each
// rank sends and receives 2 (n-1)/n of the vector (the bandwidth optimum), with no scratch.
TEST(RhdAllReduce, PowerOfTwoMessagesAndVolume) {
  for (int n = 2; n <= 64; n *= 2) {
    for (bool inPlace : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << (inPlace ? " in place" : ""));
      CollArgs a;
      a.nranks = n;
      a.count = 64 * 5;
      a.inPlace = inPlace;
      const Schedule s = buildSchedule(rhd(CollKind::kAllReduce), a);
      for (const RankSchedule& rs : s.ranks) {
        const Traffic t = traffic(rs);
        EXPECT_EQ(t.sends, 2 * log2Floor(n));
        EXPECT_EQ(t.recvs, 2 * log2Floor(n));
        EXPECT_EQ(t.sent, 2 * (a.count - a.count / n));
        EXPECT_EQ(t.received, 2 * (a.count - a.count / n));
        EXPECT_EQ(rs.scratchCount, 0u);
        // The first exchange moves half the vector, the last of the halving phase 1/n of it.
        ASSERT_GE(rs.steps.size(), 2u);
        EXPECT_EQ(rs.steps[0].count, a.count / 2);
      }
    }
  }
}

// Otherwise, p = 2^floor(log2 n), e = n - p: the extra ranks 1, 3, .., 2e-1 send their vector and
// receive the result (one message each way), the ranks they fold into do one exchange more than the
// others, whose 2 log2 p exchanges each way are as for p ranks.
TEST(RhdAllReduce, NonPowerOfTwoFold) {
  for (int n : {3, 5, 6, 7, 12, 33, 63}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const int steps = log2Floor(n);
    const int extras = n - (1 << steps);
    CollArgs a;
    a.nranks = n;
    a.count = 1000;
    const Schedule s = buildSchedule(rhd(CollKind::kAllReduce), a);
    for (int r = 0; r < n; ++r) {
      const Traffic t = traffic(s.ranks[static_cast<size_t>(r)]);
      const bool extra = r < 2 * extras && r % 2 == 1;
      const bool fold = r < 2 * extras && r % 2 == 0;
      const int want = extra ? 1 : 2 * steps + (fold ? 1 : 0);
      EXPECT_EQ(t.sends, want) << "rank " << r;
      EXPECT_EQ(t.recvs, want) << "rank " << r;
      if (extra) {
        EXPECT_EQ(t.sent, a.count);
        EXPECT_EQ(t.received, a.count);
      }
    }
  }
}

// Recursive halving reduce-scatter, power of two: log2 n messages each way, (n-1) blocks in all,
// partial sums in at most half the input's size of scratch.
TEST(RhdReduceScatter, PowerOfTwoMessagesAndVolume) {
  for (int n = 2; n <= 64; n *= 2) {
    for (bool inPlace : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << (inPlace ? " in place" : ""));
      CollArgs a;
      a.coll = CollKind::kReduceScatter;
      a.nranks = n;
      a.count = 7;
      a.inPlace = inPlace;
      const Schedule s = buildSchedule(rhd(CollKind::kReduceScatter), a);
      for (const RankSchedule& rs : s.ranks) {
        const Traffic t = traffic(rs);
        EXPECT_EQ(t.sends, log2Floor(n));
        EXPECT_EQ(t.recvs, log2Floor(n));
        EXPECT_EQ(t.sent, static_cast<size_t>(n - 1) * a.count);
        EXPECT_EQ(t.received, static_cast<size_t>(n - 1) * a.count);
        EXPECT_LE(rs.scratchCount, static_cast<size_t>(n / 2) * a.count);
        if (n == 2) {
          EXPECT_EQ(rs.scratchCount, 0u);
        }
      }
    }
  }
}

// Recursive doubling allgather, power of two: log2 n messages each way carrying 1, 2, 4, ..
// blocks, (n-1) blocks in all, and no scratch.
TEST(RhdAllGather, PowerOfTwoMessagesAndVolume) {
  for (int n = 2; n <= 64; n *= 2) {
    for (bool inPlace : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << (inPlace ? " in place" : ""));
      CollArgs a;
      a.coll = CollKind::kAllGather;
      a.nranks = n;
      a.count = 5;
      a.inPlace = inPlace;
      const Schedule s = buildSchedule(rhd(CollKind::kAllGather), a);
      for (const RankSchedule& rs : s.ranks) {
        const Traffic t = traffic(rs);
        EXPECT_EQ(t.sends, log2Floor(n));
        EXPECT_EQ(t.recvs, log2Floor(n));
        EXPECT_EQ(t.sent, static_cast<size_t>(n - 1) * a.count);
        EXPECT_EQ(rs.scratchCount, 0u);
        size_t want = a.count;
        for (const Step& st : rs.steps) {
          if (st.kind != StepKind::kSend) continue;
          EXPECT_EQ(st.count, want);
          want *= 2;
        }
      }
    }
  }
}

// Non-powers of two: an extra rank sends its block once and receives the other n-1 blocks in two
// messages, those before its own and those after (never empty: an extra rank is at most 2e-1,
// which is below n-1 since n < 2p).
TEST(RhdAllGather, ExtraRanksSendOnce) {
  for (int n : {3, 5, 6, 7, 12, 33, 63}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const int extras = n - (1 << log2Floor(n));
    CollArgs a;
    a.coll = CollKind::kAllGather;
    a.nranks = n;
    a.count = 3;
    const Schedule s = buildSchedule(rhd(CollKind::kAllGather), a);
    for (int r = 1; r < 2 * extras; r += 2) {
      const Traffic t = traffic(s.ranks[static_cast<size_t>(r)]);
      EXPECT_EQ(t.sends, 1);
      EXPECT_EQ(t.sent, a.count);
      EXPECT_EQ(t.received, static_cast<size_t>(n - 1) * a.count);
      EXPECT_EQ(t.recvs, 2);
    }
  }
}

void verifyLarge(CollKind coll) {
  for (int n : {65, 100, 127, 128}) {
    for (size_t count : {size_t{1}, static_cast<size_t>(n + 1)}) {
      for (bool inPlace : {false, true}) {
        CollArgs a;
        a.coll = coll;
        a.nranks = n;
        a.count = count;
        a.inPlace = inPlace;
        const Status st = verifySchedule(buildSchedule(rhd(coll), a));
        ASSERT_TRUE(st.isOk()) << st.message();
      }
    }
  }
}

TEST(RhdAllReduce, LargeRankCounts) { verifyLarge(CollKind::kAllReduce); }
TEST(RhdReduceScatter, LargeRankCounts) { verifyLarge(CollKind::kReduceScatter); }
TEST(RhdAllGather, LargeRankCounts) { verifyLarge(CollKind::kAllGather); }

}  // namespace
}  // namespace loom
