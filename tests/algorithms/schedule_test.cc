#include "algorithms/schedule.h"

#include <gtest/gtest.h>

namespace loom {
namespace {

TEST(Schedule, Names) {
  EXPECT_STREQ(collName(CollKind::kAllReduce), "AllReduce");
  EXPECT_STREQ(collName(CollKind::kAllToAll), "AllToAll");
  EXPECT_STREQ(stepKindName(StepKind::kRecvReduce), "RecvReduce");
}

TEST(Schedule, Registry) {
  const CollKind colls[] = {CollKind::kAllReduce, CollKind::kBroadcast,     CollKind::kReduce,
                            CollKind::kAllGather, CollKind::kReduceScatter, CollKind::kAllToAll};
  for (CollKind c : colls) {
    const AlgorithmInfo* a = defaultAlgorithm(c);
    ASSERT_NE(a, nullptr) << collName(c);
    EXPECT_EQ(a->coll, c);
    EXPECT_EQ(findAlgorithm(c, a->name), a);
  }
  EXPECT_EQ(defaultAlgorithm(CollKind::kSendRecv), nullptr);
  EXPECT_STREQ(defaultAlgorithm(CollKind::kAllReduce)->name, "ring");
  EXPECT_STREQ(defaultAlgorithm(CollKind::kBroadcast)->name, "chain");
  EXPECT_STREQ(defaultAlgorithm(CollKind::kAllToAll)->name, "pairwise");
  EXPECT_EQ(findAlgorithm(CollKind::kAllReduce, "nope"), nullptr);
}

TEST(Schedule, Layout) {
  CollArgs a;
  a.nranks = 4;
  a.count = 10;
  a.coll = CollKind::kAllGather;
  BufferLayout l = bufferLayout(a, 2);
  EXPECT_EQ(l.inputCount, 10u);
  EXPECT_EQ(l.outputCount, 40u);
  EXPECT_FALSE(l.inputInOutput);
  a.inPlace = true;
  l = bufferLayout(a, 2);
  EXPECT_TRUE(l.inputInOutput);
  EXPECT_EQ(l.inputOffsetInOutput, 20u);
  a.coll = CollKind::kReduceScatter;
  l = bufferLayout(a, 3);
  EXPECT_EQ(l.inputCount, 40u);
  EXPECT_EQ(l.outputCount, 10u);
  EXPECT_TRUE(l.outputInInput);
  EXPECT_EQ(l.outputOffsetInInput, 30u);
  a.coll = CollKind::kAllToAll;
  l = bufferLayout(a, 1);
  EXPECT_EQ(l.inputCount, 40u);
  EXPECT_EQ(l.outputCount, 40u);
  EXPECT_TRUE(l.inputInOutput);
  EXPECT_EQ(l.inputOffsetInOutput, 0u);
}

TEST(Schedule, BuildScheduleFillsEveryRank) {
  CollArgs a;
  a.nranks = 5;
  a.count = 7;
  Schedule s = buildSchedule(*defaultAlgorithm(CollKind::kAllReduce), a);
  EXPECT_EQ(s.ranks.size(), 5u);
  EXPECT_EQ(s.algorithm, "ring");
  for (const RankSchedule& rs : s.ranks) EXPECT_FALSE(rs.steps.empty());
  a.count = 0;
  s = buildSchedule(*defaultAlgorithm(CollKind::kAllReduce), a);
  for (const RankSchedule& rs : s.ranks) EXPECT_TRUE(rs.steps.empty());
}

}  // namespace
}  // namespace loom
