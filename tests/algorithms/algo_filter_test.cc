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
  // A rule for one collective that leaves it nothing: an error at parse time, naming what it has.
  auto none = AlgoFilter::parse("alltoall:^pairwise,bruck");
  ASSERT_FALSE(none.isOk());
  EXPECT_EQ(none.status().code(), Code::kInvalidArgument);
  EXPECT_NE(none.status().message().find("leaves no algorithm for alltoall"), std::string::npos)
      << none.status().message();
  EXPECT_NE(none.status().message().find("pairwise, bruck"), std::string::npos);
  EXPECT_FALSE(AlgoFilter::parse("reduce:ring").isOk());
}

// A bare name (a rule for every collective) restricts the collectives that have that algorithm;
// the others keep the automatic choice, and note() names them (issue 21: LOOM_ALGO=ring failed
// every Reduce, hier every AllToAll, while small calls passed).
TEST(AlgoFilter, BareNameRestrictsOnlyTheCollectivesThatHaveIt) {
  AlgoFilter ring = parseOk("ring");
  EXPECT_EQ(ring.choose(CollKind::kAllReduce, "direct").value(), "ring");
  EXPECT_EQ(ring.choose(CollKind::kAllGather, "bruck").value(), "ring");
  EXPECT_EQ(ring.choose(CollKind::kReduceScatter, "rhd").value(), "ring");
  for (const char* a : {"chain", "binomial", "direct", "hier"}) {
    EXPECT_TRUE(ring.allows(CollKind::kBroadcast, a)) << a;
    EXPECT_TRUE(ring.allows(CollKind::kReduce, a)) << a;
  }
  EXPECT_TRUE(ring.allows(CollKind::kAllToAll, "bruck"));
  EXPECT_EQ(ring.choose(CollKind::kReduce, "binomial").value(), "binomial");
  EXPECT_NE(ring.note().find("broadcast, reduce, alltoall have no such algorithm"),
            std::string::npos)
      << ring.note();
  EXPECT_NE(ring.note().find("LOOM_ALGO=ring"), std::string::npos) << ring.note();

  AlgoFilter hier = parseOk("hier");
  EXPECT_FALSE(hier.allows(CollKind::kAllReduce, "ring"));
  EXPECT_TRUE(hier.allows(CollKind::kAllToAll, "pairwise"));
  EXPECT_NE(hier.note().find("alltoall has no such algorithm and keeps"), std::string::npos)
      << hier.note();

  // An algorithm every collective has: nothing to note.
  EXPECT_EQ(parseOk("direct,pairwise").note(), "");
  EXPECT_EQ(parseOk("allreduce:ring").note(), "");
  // An exclusion that empties a collective leaves it unrestricted too.
  AlgoFilter ex = parseOk("^pairwise,bruck");
  EXPECT_TRUE(ex.allows(CollKind::kAllToAll, "pairwise"));
  EXPECT_FALSE(ex.allows(CollKind::kAllGather, "bruck"));
  // A per-collective rule still wins over the bare one.
  AlgoFilter both = parseOk("ring;reduce:binomial");
  EXPECT_FALSE(both.allows(CollKind::kReduce, "chain"));
  EXPECT_TRUE(both.allows(CollKind::kBroadcast, "chain"));
}

}  // namespace
}  // namespace loom
