// LOOM_ALGO's grammar (NCCL_ALGO's): lists, exclusions, per-collective rules, errors.
#include "algorithms/algo_filter.h"

#include <gtest/gtest.h>

namespace loom {
namespace {

AlgoFilter parseOk(const std::string& spec) {
  auto f = AlgoFilter::parse(spec);
  EXPECT_TRUE(f.isOk()) << spec << ": " << f.status().message();
  return f.isOk() ? std::move(f).value() : AlgoFilter();
}

TEST(AlgoFilter, EmptyAllowsEverything) {
  AlgoFilter f = parseOk("");
  for (const AlgorithmInfo& a : algorithms()) EXPECT_TRUE(f.allows(a.coll, a.name)) << a.name;
  EXPECT_EQ(f.choose(CollKind::kAllReduce, "direct").value(), "direct");
}

TEST(AlgoFilter, ListExclusionAndPerCollectiveRules) {
  AlgoFilter only = parseOk("Ring, RD");
  EXPECT_TRUE(only.allows(CollKind::kAllReduce, "ring"));
  EXPECT_TRUE(only.allows(CollKind::kAllReduce, "rd"));
  EXPECT_FALSE(only.allows(CollKind::kAllReduce, "direct"));
  EXPECT_EQ(only.choose(CollKind::kAllReduce, "direct").value(), "ring");
  EXPECT_EQ(only.choose(CollKind::kAllReduce, "rd").value(), "rd");

  AlgoFilter notDirect = parseOk("^direct");
  EXPECT_FALSE(notDirect.allows(CollKind::kAllGather, "direct"));
  EXPECT_TRUE(notDirect.allows(CollKind::kAllGather, "ring"));
  EXPECT_EQ(notDirect.choose(CollKind::kBroadcast, "direct").value(), "chain");

  AlgoFilter per = parseOk("allreduce:rd;allgather:^ring");
  EXPECT_EQ(per.choose(CollKind::kAllReduce, "ring").value(), "rd");
  EXPECT_EQ(per.choose(CollKind::kAllGather, "ring").value(), "direct");
  EXPECT_TRUE(per.allows(CollKind::kBroadcast, "chain"));  // not named: unrestricted
  EXPECT_TRUE(per.allows(CollKind::kBroadcast, "direct"));

  // A per-collective rule wins over a global one.
  AlgoFilter both = parseOk("ring;allreduce:rd");
  EXPECT_EQ(both.choose(CollKind::kAllReduce, "ring").value(), "rd");
  EXPECT_EQ(both.choose(CollKind::kAllGather, "direct").value(), "ring");
}

TEST(AlgoFilter, ErrorsNameTheValidChoices) {
  auto bad = AlgoFilter::parse("ring,treee");
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("unknown algorithm 'treee'"), std::string::npos);
  EXPECT_NE(bad.status().message().find("ring"), std::string::npos);
  auto coll = AlgoFilter::parse("allreduse:ring");
  ASSERT_FALSE(coll.isOk());
  EXPECT_NE(coll.status().message().find("unknown collective 'allreduse'"), std::string::npos);
  EXPECT_NE(coll.status().message().find("allreduce"), std::string::npos);
  EXPECT_FALSE(AlgoFilter::parse("ring,,rd").isOk());
  // Nothing left for a collective: an error at choice time, naming what it has.
  AlgoFilter none = parseOk("alltoall:^pairwise,bruck");
  auto r = none.choose(CollKind::kAllToAll, "pairwise");
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("pairwise"), std::string::npos);
  EXPECT_NE(r.status().message().find("bruck"), std::string::npos);
}

}  // namespace
}  // namespace loom
