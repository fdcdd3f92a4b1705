// Bruck's AllToAll: ceil(log2 n) messages each way per rank for any n, each packing the blocks
// whose distance has the round's bit set. (generators_test verifies it with every generator.)
#include <gtest/gtest.h>

#include <vector>

#include "algorithms/schedule.h"

namespace loom {
namespace {

TEST(BruckAllToAll, OneMessagePerRoundWithTheBlocksOfThatBit) {
  const AlgorithmInfo* bruck = findAlgorithm(CollKind::kAllToAll, "bruck");
  ASSERT_NE(bruck, nullptr);
  EXPECT_STREQ(defaultAlgorithm(CollKind::kAllToAll)->name, "pairwise");
  for (int n : {2, 3, 5, 8, 12, 31, 64}) {
    for (bool inPlace : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << (inPlace ? " in place" : ""));
      CollArgs a;
      a.coll = CollKind::kAllToAll;
      a.nranks = n;
      a.count = 3;
      a.inPlace = inPlace;
      const Schedule s = buildSchedule(*bruck, a);
      for (int r = 0; r < n; ++r) {
        std::vector<size_t> sent;
        for (const Step& st : s.ranks[static_cast<size_t>(r)].steps) {
          if (st.kind == StepKind::kSend) {
            EXPECT_EQ(st.peer, (r + (1 << sent.size())) % n);
            sent.push_back(st.count);
          }
        }
        int rounds = 0;
        while ((1 << rounds) < n) ++rounds;
        ASSERT_EQ(static_cast<int>(sent.size()), rounds);
        for (int k = 0; k < rounds; ++k) {
          size_t blocks = 0;
          for (int i = 1; i < n; ++i) blocks += (i >> k) & 1;
          EXPECT_EQ(sent[static_cast<size_t>(k)], blocks * a.count) << "round " << k;
        }
      }
    }
  }
}

TEST(BruckAllToAll, LargeRankCounts) {
  const AlgorithmInfo* bruck = findAlgorithm(CollKind::kAllToAll, "bruck");
  ASSERT_NE(bruck, nullptr);
  for (int n : {65, 100, 128}) {
    for (bool inPlace : {false, true}) {
      CollArgs a;
      a.coll = CollKind::kAllToAll;
      a.nranks = n;
      a.count = 2;
      a.inPlace = inPlace;
      const Status st = verifySchedule(buildSchedule(*bruck, a));
      ASSERT_TRUE(st.isOk()) << st.message();
    }
  }
}

}  // namespace
}  // namespace loom
