// Every registered generator verified with rank layouts (hosts, ring orders, channels), and the
// properties the topology-aware generators exist for: the hierarchical AllReduce moves less data
// across hosts, rings follow the ring order, and without a layout nothing changes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "algorithms/schedule.h"
#include "tests/algorithms/shards.h"

namespace loom {
namespace {

std::shared_ptr<const RankLayout> makeLayout(std::vector<int> hostOf, std::vector<int> ring = {},
                                             int channels = 1) {
  Result<std::shared_ptr<const RankLayout>> l =
      RankLayout::create(std::move(hostOf), std::move(ring), channels);
  EXPECT_TRUE(l.isOk()) << l.status().message();
  return l.isOk() ? l.value() : nullptr;
}

// Hosts renumbered in order of their first rank, as RankLayout requires.
std::vector<int> canonical(const std::vector<int>& raw) {
  std::map<int, int> id;
  std::vector<int> out;
  for (int h : raw) {
    auto it = id.emplace(h, static_cast<int>(id.size())).first;
    out.push_back(it->second);
  }
  return out;
}

// The layouts every generator is verified with for n ranks: even hosts (contiguous and
// interleaved), uneven hosts (3,1,2,... and random, seeded), and channels 1..4 with shuffled ring
// orders over random hosts.
// LOOMTEST_QUICK=1 (tools/test.sh's sanitizer stage, after the full proof in the first stage):
// three of the layouts (even hosts, the 3,1,2 pattern, a shuffled ring order with 2 channels).
std::vector<std::shared_ptr<const RankLayout>> layoutsFor(int n) {
  std::vector<std::shared_ptr<const RankLayout>> out;
  if (loomtest::quick()) {
    std::vector<int> two(static_cast<size_t>(n)), sizes312, ring(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) two[static_cast<size_t>(r)] = n >= 2 ? r / ((n + 1) / 2) : 0;
    for (int r = 0, k = 0; r < n; ++k) {
      const int sz = std::min(n - r, (k % 3 == 0) ? 3 : (k % 3 == 1 ? 1 : 2));
      for (int i = 0; i < sz; ++i, ++r) sizes312.push_back(k);
    }
    std::iota(ring.begin(), ring.end(), 0);
    std::reverse(ring.begin(), ring.end());
    out.push_back(makeLayout(two));
    out.push_back(makeLayout(sizes312));
    out.push_back(makeLayout(two, ring, 2));
    return out;
  }
  std::mt19937 rng(static_cast<unsigned>(n) * 7919u + 17u);
  std::set<int> evenHosts;
  for (int h : {2, 4, n / 2}) {
    if (h >= 2 && h <= n && n % h == 0) evenHosts.insert(h);
  }
  for (int h : evenHosts) {
    std::vector<int> contiguous(static_cast<size_t>(n)), interleaved(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      contiguous[static_cast<size_t>(r)] = r / (n / h);
      interleaved[static_cast<size_t>(r)] = r % h;
    }
    out.push_back(makeLayout(contiguous));
    if (h == 2) out.push_back(makeLayout(interleaved));
  }
  if (n >= 2) {
    std::vector<int> sizes312;  // hosts of 3, 1, 2, 3, 1, 2, ... ranks
    for (int r = 0, k = 0; r < n; ++k) {
      const int sz = std::min(n - r, (k % 3 == 0) ? 3 : (k % 3 == 1 ? 1 : 2));
      for (int i = 0; i < sz; ++i, ++r) sizes312.push_back(k);
    }
    out.push_back(makeLayout(sizes312));
  }
  auto randomHosts = [&]() {
    std::uniform_int_distribution<int> nh(1, std::max(1, std::min(n, 6)));
    const int h = nh(rng);
    std::uniform_int_distribution<int> pick(0, h - 1);
    std::vector<int> raw(static_cast<size_t>(n));
    for (int& x : raw) x = pick(rng);
    return canonical(raw);
  };
  out.push_back(makeLayout(randomHosts()));
  for (int ch = 1; ch <= 4; ++ch) {
    std::vector<int> ring(static_cast<size_t>(n));
    std::iota(ring.begin(), ring.end(), 0);
    std::shuffle(ring.begin(), ring.end(), rng);
    out.push_back(makeLayout(randomHosts(), ring, ch));
  }
  // The default ring order (by host) with several channels.
  out.push_back(makeLayout(randomHosts(), {}, 3));
  return out;
}

std::vector<size_t> countsFor(int n) {
  std::set<size_t> s = {0, 1, static_cast<size_t>(n - 1), static_cast<size_t>(3 * n + 1)};
  return std::vector<size_t>(s.begin(), s.end());
}

void verifyWithLayouts(const AlgorithmInfo& algo, int n) {
  for (const auto& layout : layoutsFor(n)) {
    ASSERT_NE(layout, nullptr);
    verifyCalls(algo, n, countsFor(n), layout);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

class LayoutGeneratorTest : public ::testing::TestWithParam<ShardParam> {};

TEST_P(LayoutGeneratorTest, VerifiesWithLayouts) {
  forEachShardRankCount(GetParam(), verifyWithLayouts);
}

INSTANTIATE_TEST_SUITE_P(Registered, LayoutGeneratorTest, allShards(), shardName);

// Elements each rank sends to ranks of other hosts.
std::vector<size_t> crossHostSent(const Schedule& s, const RankLayout& l) {
  std::vector<size_t> sent(s.ranks.size(), 0);
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    for (const Step& st : s.ranks[r].steps) {
      if (st.kind == StepKind::kSend && l.hostOf(st.peer) != l.hostOf(static_cast<int>(r))) {
        sent[r] += st.count;
      }
    }
  }
  return sent;
}

size_t total(const std::vector<size_t>& v) {
  return std::accumulate(v.begin(), v.end(), size_t{0});
}

TEST(HierAllReduce, CrossHostTrafficIsPerSlice) {
  // 2 hosts x 4 ranks: each rank sends 2 (H-1)/H * count/4 = count/4 elements across hosts.
  const auto layout = makeLayout({0, 0, 0, 0, 1, 1, 1, 1});
  CollArgs a;
  a.nranks = 8;
  a.count = 8000;
  a.layout = layout;
  const Schedule hier = buildSchedule(*findAlgorithm(CollKind::kAllReduce, "hier"), a);
  ASSERT_TRUE(verifySchedule(hier).isOk());
  for (size_t sent : crossHostSent(hier, *layout)) EXPECT_EQ(sent, 2000u);

  // The flat ring over a ring order that alternates hosts crosses on every hop: 2 (n-1)/n * count
  // per rank.
  CollArgs bad = a;
  bad.layout = makeLayout({0, 0, 0, 0, 1, 1, 1, 1}, {0, 4, 1, 5, 2, 6, 3, 7});
  const Schedule ring = buildSchedule(*findAlgorithm(CollKind::kAllReduce, "ring"), bad);
  ASSERT_TRUE(verifySchedule(ring).isOk());
  for (size_t sent : crossHostSent(ring, *layout)) EXPECT_EQ(sent, 14000u);
  EXPECT_GT(total(crossHostSent(ring, *layout)), 4 * total(crossHostSent(hier, *layout)));

  // The default ring order (by host) crosses only at the two host boundaries.
  const Schedule byHost = buildSchedule(*findAlgorithm(CollKind::kAllReduce, "ring"), a);
  const std::vector<size_t> byHostSent = crossHostSent(byHost, *layout);
  EXPECT_EQ(std::count(byHostSent.begin(), byHostSent.end(), size_t{0}), 6);
}

TEST(HierAllReduce, UnevenHostsReduceEverySliceOnce) {
  // Hosts of 3, 1 and 2 ranks: three slices; the lone rank owns all of them and the two-rank host
  // splits them 2 + 1. Each slice crosses the network in a ring of the three owners.
  const auto layout = makeLayout({0, 0, 0, 1, 2, 2});
  CollArgs a;
  a.nranks = 6;
  a.count = 9 * 3;
  a.layout = layout;
  const Schedule s = buildSchedule(*findAlgorithm(CollKind::kAllReduce, "hier"), a);
  const Status st = verifySchedule(s);
  ASSERT_TRUE(st.isOk()) << st.message();
  const std::vector<size_t> sent = crossHostSent(s, *layout);
  // Per slice of 9 elements a ring of 3 sends 2 * 2/3 * 9 = 12 per owner.
  EXPECT_EQ(sent, (std::vector<size_t>{12, 12, 12, 36, 24, 12}));
}

TEST(HierBroadcast, EachHostReceivesOnceFromTheNetwork) {
  const auto layout = makeLayout({0, 1, 2, 0, 1, 2, 0, 1, 2, 0});
  for (int root = 0; root < 10; ++root) {
    CollArgs a;
    a.coll = CollKind::kBroadcast;
    a.nranks = 10;
    a.count = 100;
    a.root = root;
    a.layout = layout;
    const Schedule s = buildSchedule(*findAlgorithm(CollKind::kBroadcast, "hier"), a);
    ASSERT_TRUE(verifySchedule(s).isOk());
    EXPECT_EQ(total(crossHostSent(s, *layout)), 2 * a.count) << "root " << root;
  }
}

TEST(RingLayout, NullLayoutAndSingleHostBuildTheSameSchedules) {
  // A null layout and an explicit one-host, one-channel layout are the same thing to every
  // generator (the ring keeps today's schedules exactly).
  for (const AlgorithmInfo& algo : algorithms()) {
    for (int n : {1, 2, 5, 8}) {
      CollArgs a;
      a.coll = algo.coll;
      a.nranks = n;
      a.count = 3 * static_cast<size_t>(n) + 1;
      a.root = n / 2;
      const Schedule plain = buildSchedule(algo, a);
      a.layout = RankLayout::singleHost(n);
      const Schedule single = buildSchedule(algo, a);
      for (int r = 0; r < n; ++r) {
        const auto& x = plain.ranks[static_cast<size_t>(r)];
        const auto& y = single.ranks[static_cast<size_t>(r)];
        ASSERT_EQ(x.steps.size(), y.steps.size()) << algo.name << " " << collName(algo.coll);
        EXPECT_EQ(x.scratchCount, y.scratchCount);
        for (size_t i = 0; i < x.steps.size(); ++i) {
          const Step& p = x.steps[i];
          const Step& q = y.steps[i];
          EXPECT_TRUE(p.kind == q.kind && p.peer == q.peer && p.channel == q.channel &&
                      p.src.buf == q.src.buf && p.src.offset == q.src.offset &&
                      p.dst.buf == q.dst.buf && p.dst.offset == q.dst.offset && p.count == q.count)
              << algo.name << " " << collName(algo.coll) << " n=" << n << " rank " << r << " step "
              << i;
        }
      }
    }
  }
}

TEST(RingLayout, FollowsRingOrderAndAlternatesDirectionPerChannel) {
  const std::vector<int> order = {3, 0, 4, 1, 2};
  const auto layout = makeLayout({0, 0, 1, 1, 2}, order, 2);
  CollArgs a;
  a.nranks = 5;
  a.count = 100;
  a.layout = layout;
  const Schedule s = buildSchedule(*findAlgorithm(CollKind::kAllReduce, "ring"), a);
  ASSERT_TRUE(verifySchedule(s).isOk());
  for (int p = 0; p < 5; ++p) {
    const int r = order[static_cast<size_t>(p)];
    const int next = order[static_cast<size_t>((p + 1) % 5)];
    const int prev = order[static_cast<size_t>((p + 4) % 5)];
    size_t perChannel[2] = {0, 0};
    for (const Step& st : s.ranks[static_cast<size_t>(r)].steps) {
      if (st.kind != StepKind::kSend) continue;
      ASSERT_TRUE(st.channel == 0 || st.channel == 1);
      EXPECT_EQ(st.peer, st.channel == 0 ? next : prev) << "rank " << r;
      perChannel[st.channel] += st.count;
    }
    // Each channel carries half the data: 2 (n-1)/n * 50 elements.
    EXPECT_EQ(perChannel[0], 80u);
    EXPECT_EQ(perChannel[1], 80u);
  }
}

TEST(RankLayoutTest, Accessors) {
  const auto l = makeLayout({0, 1, 0, 2, 1});
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->nranks(), 5);
  EXPECT_EQ(l->nhosts(), 3);
  EXPECT_EQ(l->ranksOf(0), (std::vector<int>{0, 2}));
  EXPECT_EQ(l->ranksOf(1), (std::vector<int>{1, 4}));
  EXPECT_EQ(l->ranksOf(2), (std::vector<int>{3}));
  EXPECT_EQ(l->localIndex(4), 1);
  EXPECT_EQ(l->localSize(3), 1);
  EXPECT_EQ(l->maxLocal(), 2);
  EXPECT_EQ(l->ringOrder(), (std::vector<int>{0, 2, 1, 4, 3}));  // by host, then rank
  EXPECT_EQ(l->ringPosition(4), 3);
  EXPECT_EQ(l->channels(), 1);
  EXPECT_EQ(makeLayout({0, 1, 0, 2, 1})->hash(), l->hash());
  EXPECT_NE(makeLayout({0, 1, 0, 1, 1})->hash(), l->hash());
  EXPECT_NE(makeLayout({0, 1, 0, 2, 1}, {}, 2)->hash(), l->hash());
}

TEST(RankLayoutTest, RejectsInvalidLayouts) {
  EXPECT_EQ(RankLayout::create({}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(RankLayout::create({1, 0}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(RankLayout::create({0, 2, 1}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(RankLayout::create({0, 0}, {0, 0}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(RankLayout::create({0, 0}, {0}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(RankLayout::create({0, 0}, {0, 2}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(RankLayout::create({0, 0}, {}, 0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(RankLayout::create({0, 0}, {}, kMaxLayoutChannels + 1).status().code(),
            Code::kInvalidArgument);
  EXPECT_TRUE(RankLayout::create({0, 0}, {1, 0}, kMaxLayoutChannels).isOk());
}

TEST(RankLayoutTest, VerifierRejectsALayoutOfAnotherSize) {
  CollArgs a;
  a.nranks = 4;
  a.count = 8;
  a.layout = makeLayout({0, 0, 1});
  const Schedule s = buildSchedule(*findAlgorithm(CollKind::kAllReduce, "rd"), a);
  const Status st = verifySchedule(s);
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("rank layout of 3 ranks"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace loom
