// The closed-form costs against the simulation they stand in for, wherever both run: every
// registered algorithm on two machines (CPU hosts as the runtime prices them, and DGX H100 nodes
// as loom-sim builds them), nine layouts from one to twelve hosts with odd sizes, three call
// sizes. What the planner needs from them is its choice: the algorithm the formulas pick must cost,
// in the simulation, close to the simulation's own best.
#include "algorithms/cost_formulas.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "algorithms/cluster.h"
#include "algorithms/planner.h"

namespace loom {
namespace {

// The machines the planner prices on: the runtime's for CPU hosts (hostCostMachine, a VM's rates)
// and loom-sim's for DGX H100 nodes (clusterCostMachine), with `perHost` ranks on each of `hosts`.
CostMachine cpuMachine(int hosts, int perHost) {
  HostCluster h;
  for (int r = 0; r < hosts * perHost; ++r) h.hostOf.push_back(r / perHost);
  h.netBytesPerSec = 1.25e9;
  h.netAlphaSec = 20e-6;
  return hostCostMachine(h);
}

CostMachine gpuMachine(int hosts, int perHost) {
  ClusterSpec c;
  c.node = builtinNode("dgx-h100").value();
  c.node.gpus = perHost;
  c.nodes = hosts;
  return clusterCostMachine(c, TrafficPattern::kNeighbor);
}

struct Layout {
  int hosts, perHost;
};
constexpr Layout kLayouts[] = {{2, 2}, {1, 8},  {2, 8}, {4, 8}, {3, 8},
                               {8, 8}, {12, 1}, {4, 4}, {5, 3}};
constexpr size_t kSizes[] = {4096, 1 << 20, 64 << 20};

std::shared_ptr<const RankLayout> layoutOf(int hosts, int perHost) {
  std::vector<int> hostOf;
  for (int r = 0; r < hosts * perHost; ++r) hostOf.push_back(r / perHost);
  return RankLayout::create(hostOf).value();
}

CollArgs callOf(CollKind coll, int n, size_t bytes, std::shared_ptr<const RankLayout> layout) {
  CollArgs a;
  a.coll = coll;
  a.nranks = n;
  a.layout = std::move(layout);
  const size_t elems = bytes / 4;
  const bool perRank =
      coll == CollKind::kAllReduce || coll == CollKind::kBroadcast || coll == CollKind::kReduce;
  a.count = perRank ? elems : std::max<size_t>(1, elems / static_cast<size_t>(n));
  return a;
}

struct Stats {
  double logSum = 0, lo = 1e300, hi = 0;
  int n = 0;
  void add(double r) {
    logSum += std::log(r);
    lo = std::min(lo, r);
    hi = std::max(hi, r);
    ++n;
  }
  double geo() const { return std::exp(logSum / n); }
};

TEST(CostFormulas, TrackTheSimulationAndChooseAsWell) {
  std::map<std::string, Stats> perAlgo;
  Stats choiceLoss;
  for (int gpu = 0; gpu < 2; ++gpu) {
    for (const Layout& l : kLayouts) {
      const int n = l.hosts * l.perHost;
      CostMachine m = gpu ? gpuMachine(l.hosts, l.perHost) : cpuMachine(l.hosts, l.perHost);
      auto layout = layoutOf(l.hosts, l.perHost);
      for (size_t bytes : kSizes) {
        for (CollKind coll : kCollectives) {
          double simBest = -1, formulaBest = -1, simOfFormulaBest = -1;
          for (const AlgorithmInfo& a : algorithms()) {
            if (a.coll != coll) continue;
            CollArgs args = callOf(coll, n, bytes, layout);
            const size_t piece = std::max<size_t>(512 << 10, bytes / 32);
            Result<CostEstimate> sim = estimateCost(buildSchedule(a, args), m, 4, piece);
            Result<double> f = formulaCost(a.name, args, m, 4, piece);
            ASSERT_TRUE(sim.isOk()) << sim.status().message();
            ASSERT_TRUE(f.isOk()) << f.status().message();
            const double s = sim.value().seconds;
            ASSERT_GT(s, 0);
            ASSERT_GT(f.value(), 0) << a.name;
            const double ratio = f.value() / s;
            // No single price strays by more than 3.5x either way...
            EXPECT_GT(ratio, 1 / 3.5) << collName(coll) << " " << a.name << " on " << l.hosts << "x"
                                      << l.perHost << " " << bytes << " B, gpu " << gpu;
            EXPECT_LT(ratio, 3.5) << collName(coll) << " " << a.name << " on " << l.hosts << "x"
                                  << l.perHost << " " << bytes << " B, gpu " << gpu;
            perAlgo[std::string(collName(coll)) + "/" + a.name].add(ratio);
            if (simBest < 0 || s < simBest) simBest = s;
            if (formulaBest < 0 || f.value() < formulaBest) {
              formulaBest = f.value();
              simOfFormulaBest = s;
            }
          }
          choiceLoss.add(simOfFormulaBest / simBest);
          EXPECT_LT(simOfFormulaBest / simBest, 1.5)
              << collName(coll) << " on " << l.hosts << "x" << l.perHost << " " << bytes
              << " B, gpu " << gpu;
        }
      }
    }
  }
  // ...and each algorithm's prices are right on average (geometric mean of formula / simulation).
  for (const auto& [name, s] : perAlgo) {
    EXPECT_GT(s.geo(), 0.75) << name;
    EXPECT_LT(s.geo(), 1.4) << name;
  }
  EXPECT_LT(choiceLoss.geo(), 1.05);
}

TEST(CostFormulas, ApplyOnlyToEvenConsecutiveHosts) {
  CollArgs a = callOf(CollKind::kAllReduce, 6, 1 << 20, layoutOf(2, 3));
  CostMachine m = cpuMachine(2, 3);
  EXPECT_TRUE(costFormulasApply(a, m));
  // Uneven hosts.
  a.layout = RankLayout::create({0, 0, 0, 0, 1, 1}).value();
  m.hostOf = {0, 0, 0, 0, 1, 1};
  EXPECT_FALSE(costFormulasApply(a, m));
  Result<double> f = formulaCost("ring", a, m, 4, 0);
  ASSERT_FALSE(f.isOk());
  EXPECT_NE(f.status().message().find("equal size"), std::string::npos) << f.status().message();
  // A ring order other than the default.
  a.layout = RankLayout::create({0, 0, 0, 1, 1, 1}, {0, 2, 1, 3, 4, 5}).value();
  m.hostOf = {0, 0, 0, 1, 1, 1};
  EXPECT_FALSE(costFormulasApply(a, m));
  // The machine's hosts disagree with the layout's.
  a.layout = layoutOf(2, 3);
  m.hostOf = {0, 0, 1, 1, 1, 1};
  EXPECT_FALSE(costFormulasApply(a, m));
}

TEST(CostFormulas, UnknownAlgorithmIsAnError) {
  CollArgs a = callOf(CollKind::kAllReduce, 4, 1 << 20, layoutOf(2, 2));
  CostMachine m = cpuMachine(2, 2);
  Result<double> f = formulaCost("bruck", a, m, 4, 0);  // Bruck is an AllGather, not AllReduce
  ASSERT_FALSE(f.isOk());
  EXPECT_NE(f.status().message().find("no closed-form cost for AllReduce bruck"), std::string::npos)
      << f.status().message();
  EXPECT_FALSE(formulaCost("ring", a, m, 0, 0).isOk());
}

// Above kSimulatedRanks the planner prices with the formulas, and still answers every collective
// at thousands of ranks (the figure of its speed is in the closing note, not a threshold here).
TEST(CostFormulas, PlannerUsesThemAtScale) {
  const int hosts = 512, per = 8, n = hosts * per;
  Planner p(gpuMachine(hosts, per), layoutOf(hosts, per), 512 << 10);
  for (CollKind coll : kCollectives) {
    for (size_t bytes : {size_t{8}, size_t{64} << 20}) {
      Result<Plan> plan = p.choose(callOf(coll, n, bytes, nullptr), 4, AlgoFilter());
      ASSERT_TRUE(plan.isOk()) << plan.status().message();
      EXPECT_STREQ(plan.value().pricing, "formulas");
      EXPECT_GT(plan.value().predictedSec, 0) << collName(coll);
      for (const PlanCandidate& c : plan.value().candidates)
        EXPECT_GT(c.seconds, 0) << collName(coll) << " " << c.algorithm;
    }
  }
  // Uneven hosts at scale: priced on their envelope (as many hosts, each as large as the
  // largest), still by formulas.
  std::vector<int> uneven;
  for (int r = 0; r < n - 4; ++r) uneven.push_back(r / per);
  CostMachine mu = gpuMachine(hosts, per);
  mu.hostOf = uneven;
  Planner pu2(mu, RankLayout::create(uneven).value(), 512 << 10);
  Result<Plan> up =
      pu2.choose(callOf(CollKind::kAllReduce, n - 4, 64 << 20, nullptr), 4, AlgoFilter());
  ASSERT_TRUE(up.isOk()) << up.status().message();
  EXPECT_STREQ(up.value().pricing, "formulas");
  EXPECT_GT(up.value().predictedSec, 0);
  // At the simulated sizes the planner simulates.
  Planner p8(gpuMachine(1, 8), layoutOf(1, 8), 512 << 10);
  Result<Plan> plan = p8.choose(callOf(CollKind::kAllReduce, 8, 1 << 20, nullptr), 4, AlgoFilter());
  ASSERT_TRUE(plan.isOk());
  EXPECT_STREQ(plan.value().pricing, "simulation");
}

}  // namespace
}  // namespace loom
