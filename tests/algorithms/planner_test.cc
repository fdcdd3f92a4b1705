// The planner: cheapest allowed algorithm by the cost model, LOOM_ALGO respected, tuning entries
// preferred, the same answer from the same inputs; and tuning files.
#include "algorithms/planner.h"

#include <gtest/gtest.h>

#include "algorithms/tuning.h"

namespace loom {
namespace {

CostMachine machine(int nranks, int perHost, double netBps) {
  CostMachine m = CostMachine::uniform(nranks, perHost);
  m.intra = LinkCost{2e-6, 8e9};
  m.inter = LinkCost{30e-6, netBps};
  m.nicBytesPerSec = netBps;
  m.memBytesPerSec = 8e9;
  m.copyBytesPerSec = 8e9;
  m.reduceBytesPerSec = 5e9;
  m.fuseIntraRecvReduce = true;
  return m;
}

std::shared_ptr<const RankLayout> layoutOf(int nranks, int perHost) {
  std::vector<int> hostOf;
  for (int r = 0; r < nranks; ++r) hostOf.push_back(r / perHost);
  Result<std::shared_ptr<const RankLayout>> l = RankLayout::create(hostOf);
  EXPECT_TRUE(l.isOk());
  return l.value();
}

CollArgs allReduce(int n, size_t count) {
  CollArgs a;
  a.coll = CollKind::kAllReduce;
  a.nranks = n;
  a.count = count;
  return a;
}

AlgoFilter filter(const std::string& spec) {
  Result<AlgoFilter> f = AlgoFilter::parse(spec);
  EXPECT_TRUE(f.isOk()) << f.status().message();
  return f.value();
}

TEST(Planner, PicksTheCheapestPricedCandidate) {
  Planner p(machine(4, 2, 125e6), layoutOf(4, 2), 512 << 10);
  Result<Plan> plan = p.choose(allReduce(4, 4 << 20), 4, filter(""));
  ASSERT_TRUE(plan.isOk()) << plan.status().message();
  double best = -1;
  for (const PlanCandidate& c : plan.value().candidates) {
    EXPECT_TRUE(c.allowed);
    EXPECT_GE(c.seconds, 0) << c.algorithm;
    if (best < 0 || c.seconds < best) best = c.seconds;
  }
  EXPECT_EQ(plan.value().predictedSec, best);
  EXPECT_STREQ(plan.value().source, "model");
  // On 2 hosts x 2 ranks with a 1 Gbit/s network the hierarchy sends half the bytes across.
  EXPECT_EQ(plan.value().algorithm, "hier");
}

TEST(Planner, SmallMessagesGoToFewSteps) {
  Planner p(machine(8, 8, 125e6), nullptr, 512 << 10);
  Result<Plan> plan = p.choose(allReduce(8, 2), 4, filter(""));
  ASSERT_TRUE(plan.isOk());
  // Latency-bound: not the ring's 2(n-1) steps.
  EXPECT_NE(plan.value().algorithm, "ring");
  EXPECT_NE(plan.value().algorithm, "hier");
}

TEST(Planner, RespectsLoomAlgo) {
  Planner p(machine(4, 2, 125e6), layoutOf(4, 2), 512 << 10);
  Result<Plan> plan = p.choose(allReduce(4, 4 << 20), 4, filter("allreduce:^hier"));
  ASSERT_TRUE(plan.isOk());
  EXPECT_NE(plan.value().algorithm, "hier");
  bool sawExcluded = false;
  for (const PlanCandidate& c : plan.value().candidates)
    if (c.algorithm == "hier") {
      EXPECT_FALSE(c.allowed);
      sawExcluded = true;
    }
  EXPECT_TRUE(sawExcluded);
  plan = p.choose(allReduce(4, 4 << 20), 4, filter("ring"));
  ASSERT_TRUE(plan.isOk());
  EXPECT_EQ(plan.value().algorithm, "ring");
}

TEST(Planner, SameInputsSameChoice) {
  for (size_t count : {size_t(1), size_t(1000), size_t(1) << 16, size_t(1) << 22}) {
    Planner a(machine(6, 3, 1e9), layoutOf(6, 3), 512 << 10);
    Planner b(machine(6, 3, 1e9), layoutOf(6, 3), 512 << 10);
    Result<Plan> pa = a.choose(allReduce(6, count), 4, filter(""));
    Result<Plan> pb = b.choose(allReduce(6, count), 4, filter(""));
    ASSERT_TRUE(pa.isOk() && pb.isOk());
    EXPECT_EQ(pa.value().algorithm, pb.value().algorithm);
    EXPECT_EQ(pa.value().predictedSec, pb.value().predictedSec);
  }
}

TEST(Planner, TuningEntriesWinWhereTheyApply) {
  Planner p(machine(4, 2, 125e6), layoutOf(4, 2), 512 << 10);
  TuningEntry t;
  t.coll = CollKind::kAllReduce;
  t.minBytes = 1 << 20;
  t.maxBytes = 8 << 20;
  t.algorithm = "ring";
  p.setTuning({t});
  Result<Plan> in = p.choose(allReduce(4, 1 << 20), 4, filter(""));  // 4 MiB
  ASSERT_TRUE(in.isOk());
  EXPECT_EQ(in.value().algorithm, "ring");
  EXPECT_STREQ(in.value().source, "tuning");
  EXPECT_GT(in.value().predictedSec, 0);
  Result<Plan> out = p.choose(allReduce(4, 8 << 20), 4, filter(""));  // 32 MiB
  ASSERT_TRUE(out.isOk());
  EXPECT_STREQ(out.value().source, "model");
  // A filter that leaves one algorithm: that is where the choice came from.
  Result<Plan> forced = p.choose(allReduce(4, 8 << 20), 4, filter("allreduce:tree"));
  ASSERT_TRUE(forced.isOk());
  EXPECT_EQ(forced.value().algorithm, "tree");
  EXPECT_STREQ(forced.value().source, "filter");
  // An entry LOOM_ALGO excludes does not apply.
  Result<Plan> excluded = p.choose(allReduce(4, 1 << 20), 4, filter("^ring"));
  ASSERT_TRUE(excluded.isOk());
  EXPECT_NE(excluded.value().algorithm, "ring");
}

TEST(Tuning, RoundTripsAndRejectsBadFiles) {
  TuningFile f;
  f.nranks = 4;
  f.ranksPerHost = {2, 2};
  TuningEntry t;
  t.coll = CollKind::kAllGather;
  t.minBytes = 0;
  t.maxBytes = 4096;
  t.algorithm = "bruck";
  t.measuredUs = 12.5;
  f.entries.push_back(t);
  Result<TuningFile> back = parseTuning(formatTuning(f), "mem");
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_EQ(back.value().nranks, 4);
  EXPECT_EQ(back.value().ranksPerHost, (std::vector<int>{2, 2}));
  ASSERT_EQ(back.value().entries.size(), 1u);
  EXPECT_EQ(back.value().entries[0].coll, CollKind::kAllGather);
  EXPECT_EQ(back.value().entries[0].algorithm, "bruck");
  EXPECT_EQ(back.value().entries[0].maxBytes, 4096u);

  struct Bad {
    const char* text;
    const char* says;
  };
  const Bad bad[] = {
      {"{", "not valid JSON"},
      {"{\"layout\":{}}", "loom_tuning"},
      {"{\"loom_tuning\":1,\"layout\":{\"nranks\":3,\"ranks_per_host\":[2,2]},\"entries\":[]}",
       "does not match"},
      {"{\"loom_tuning\":1,\"layout\":{\"nranks\":2,\"ranks_per_host\":[2]},\"entries\":[{"
       "\"collective\":\"allsmash\",\"min_bytes\":0,\"max_bytes\":1,\"algorithm\":\"ring\"}]}",
       "unknown collective 'allsmash'"},
      {"{\"loom_tuning\":1,\"layout\":{\"nranks\":2,\"ranks_per_host\":[2]},\"entries\":[{"
       "\"collective\":\"allreduce\",\"min_bytes\":0,\"max_bytes\":1,\"algorithm\":\"warp\"}]}",
       "no algorithm 'warp'"},
      {"{\"loom_tuning\":1,\"layout\":{\"nranks\":2,\"ranks_per_host\":[2]},\"entries\":[{"
       "\"collective\":\"allreduce\",\"min_bytes\":9,\"max_bytes\":1,\"algorithm\":\"ring\"}]}",
       "min_bytes 9 > max_bytes 1"},
      {"{\"loom_tuning\":1,\"layout\":{\"nranks\":2,\"ranks_per_host\":[2]},\"entries\":[{"
       "\"collective\":\"allreduce\",\"algorithm\":\"ring\"}]}",
       "min_bytes"},
      // Numbers that are not integers of the field's range are refused, not converted (3e20 to
      // an int is undefined) or wrapped (4294967298 would have read as 2).
      {"{\"loom_tuning\":1,\"layout\":{\"nranks\":2,\"ranks_per_host\":[3e20]},\"entries\":[]}",
       "\"ranks_per_host\" is 3e+20, not an integer"},
      {"{\"loom_tuning\":1,\"layout\":{\"nranks\":4294967298,\"ranks_per_host\":[2]},"
       "\"entries\":[]}",
       "\"nranks\" is 4294967298, not an integer from 1 to 2147483647"},
      {"{\"loom_tuning\":1,\"layout\":{\"nranks\":2.5,\"ranks_per_host\":[2]},\"entries\":[]}",
       "\"nranks\" is 2.5"},
      {"{\"loom_tuning\":1,\"layout\":{\"nranks\":2,\"ranks_per_host\":[2]},\"entries\":[{"
       "\"collective\":\"allreduce\",\"min_bytes\":-1,\"max_bytes\":1,\"algorithm\":\"ring\"}]}",
       "\"min_bytes\" is -1, not a byte count"},
      {"{\"loom_tuning\":1e300,\"layout\":{}}", "loom_tuning"},
  };
  for (const Bad& b : bad) {
    Result<TuningFile> r = parseTuning(b.text, "t.json");
    ASSERT_FALSE(r.isOk()) << b.text;
    EXPECT_NE(r.status().message().find(b.says), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("t.json"), std::string::npos) << r.status().message();
  }
  EXPECT_FALSE(loadTuning("/nonexistent/tuning.json").isOk());
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// hier AllReduce pipelines large buffers in parts: the parts' phases interleave across the
// schedule, and the verifier must still prove it (the generator tests use small counts).
TEST(HierParts, LargeCountsVerifyOnEvenAndUnevenHosts) {
  // Uneven hosts give a rank slices whose owners differ (its phase-2 units go to several peers).
  const std::vector<std::vector<int>> layouts = {
      {0, 0, 1, 1}, {0, 0, 0, 1}, {0, 0, 1, 1, 1, 2}, {0, 1, 1, 1}, {0, 0, 1, 1, 1, 2, 2, 2, 2}};
  for (const auto& hostOf : layouts) {
    Result<std::shared_ptr<const RankLayout>> l = RankLayout::create(hostOf);
    ASSERT_TRUE(l.isOk());
    for (bool inPlace : {false, true}) {
      CollArgs a;
      a.coll = CollKind::kAllReduce;
      a.nranks = static_cast<int>(hostOf.size());
      a.count = 8 * (32 << 10) + 5;
      a.inPlace = inPlace;
      a.layout = l.value();
      Schedule s = buildSchedule(*findAlgorithm(CollKind::kAllReduce, "hier"), a);
      Status st = verifySchedule(s);
      EXPECT_TRUE(st.isOk()) << st.message();
      // Parts: rank 0 sends each part's blocks.
      size_t sends = 0;
      for (const Step& step : s.ranks[0].steps) sends += step.kind == StepKind::kSend;
      EXPECT_GE(sends, 8u);
    }
  }
}

}  // namespace
}  // namespace loom
