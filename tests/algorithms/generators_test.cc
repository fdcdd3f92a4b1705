// Every registered generator, verified over rank counts, counts, in place or not, and roots.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "algorithms/schedule.h"
#include "tests/algorithms/schedule_test_util.h"
#include "tests/algorithms/shards.h"

namespace loom {
namespace {

std::vector<size_t> countsFor(int n) {
  std::set<size_t> s = {0,
                        1,
                        static_cast<size_t>(n - 1),
                        static_cast<size_t>(n),
                        static_cast<size_t>(n + 1),
                        static_cast<size_t>(3 * n + 1),
                        1000};
  return std::vector<size_t>(s.begin(), s.end());
}

// Every call of the proof; an empty count moves nothing.
void verifyAll(const AlgorithmInfo& algo, int n) {
  verifyCalls(algo, n, countsFor(n), nullptr, [](const CollArgs& a, const Schedule& s) {
    if (a.count == 0) {
      for (const RankSchedule& rs : s.ranks) EXPECT_TRUE(rs.steps.empty());
    }
  });
}

class GeneratorTest : public ::testing::TestWithParam<ShardParam> {};

TEST_P(GeneratorTest, VerifiesForAllRankCounts) { forEachShardRankCount(GetParam(), verifyAll); }

INSTANTIATE_TEST_SUITE_P(Registered, GeneratorTest, allShards(), shardName);

// Rank counts above the shards' 64, for the AllReduce named `name`.
void verifyLargeRankCounts(const char* name) {
  const AlgorithmInfo* algo = findAlgorithm(CollKind::kAllReduce, name);
  ASSERT_NE(algo, nullptr);
  for (int n : {65, 100, 127, 128}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    verifyAll(*algo, n);
  }
}

TEST(RingAllReduce, LargeRankCounts) { verifyLargeRankCounts("ring"); }

TEST(RecursiveDoublingAllReduce, LargeRankCounts) { verifyLargeRankCounts("rd"); }

// Shape checks: the ring allreduce does 2(n-1) sends per rank (non-empty blocks), the chain
// broadcast sends once per non-last rank, reduce never writes a non-root output.
TEST(RingAllReduce, StepCounts) {
  CollArgs a;
  a.nranks = 8;
  a.count = 80;
  const Schedule s = buildSchedule(*defaultAlgorithm(CollKind::kAllReduce), a);
  for (const RankSchedule& rs : s.ranks) {
    int sends = 0, recvs = 0;
    for (const Step& st : rs.steps) {
      sends += st.kind == StepKind::kSend;
      recvs += st.kind == StepKind::kRecv || st.kind == StepKind::kRecvReduce;
      if (st.kind != StepKind::kCopy) {
        EXPECT_EQ(st.count, 10u);
      }
    }
    EXPECT_EQ(sends, 14);
    EXPECT_EQ(recvs, 14);
  }
}

TEST(ChainReduce, NonRootOutputUntouched) {
  CollArgs a = callArgs(CollKind::kReduce, /*n=*/5, /*count=*/9, /*root=*/2);
  for (bool inPlace : {false, true}) {
    a.inPlace = inPlace;
    const Schedule s = buildSchedule(*defaultAlgorithm(CollKind::kReduce), a);
    for (int r = 0; r < a.nranks; ++r) {
      if (r == a.root) continue;
      for (const Step& st : s.ranks[r].steps) {
        if (st.kind == StepKind::kSend) continue;
        EXPECT_EQ(st.dst.buf, BufKind::kScratch);
      }
    }
  }
}

}  // namespace
}  // namespace loom
