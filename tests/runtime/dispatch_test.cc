// Dispatch's decisions, without ranks: which path, which algorithm, from where, at what price, over
// representative layouts; the cases that once made ranks disagree (a Broadcast root in place, a
// rank alone on its host); the one pass and its fallback; memory kinds; the filter, the tuning
// table and the fixed rule.
#include "src/runtime/dispatch.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "algorithms/planner.h"

namespace loom {
namespace {

CostMachine machineOf(int nranks, int perHost) {
  CostMachine m = CostMachine::uniform(nranks, perHost);
  m.intra = LinkCost{2e-6, 8e9};
  m.inter = LinkCost{30e-6, 1.25e9};
  m.nicBytesPerSec = 1.25e9;
  m.memBytesPerSec = 8e9;
  m.copyBytesPerSec = 8e9;
  m.reduceBytesPerSec = 5e9;
  m.fuseIntraRecvReduce = true;
  return m;
}

std::shared_ptr<const RankLayout> layoutOf(const std::vector<int>& hostOf) {
  Result<std::shared_ptr<const RankLayout>> l = RankLayout::create(hostOf);
  EXPECT_TRUE(l.isOk()) << l.status().message();
  return l.value();
}

AlgoFilter filterOf(const std::string& spec) {
  Result<AlgoFilter> f = AlgoFilter::parse(spec);
  EXPECT_TRUE(f.isOk()) << f.status().message();
  return f.value();
}

// A communicator as dispatch sees it: a planner over a layout, the filter, the facts.
struct World {
  std::unique_ptr<Planner> planner;
  AlgoFilter filter;
  DispatchFacts facts;

  // hostOf: rank -> host. Every rank shares one host when all entries are equal.
  World(std::vector<int> hostOf, const std::string& spec = "", bool model = true)
      : filter(filterOf(spec)) {
    const int n = static_cast<int>(hostOf.size());
    CostMachine m = machineOf(n, 1);
    m.hostOf = hostOf;
    planner = std::make_unique<Planner>(m, layoutOf(hostOf), 512 << 10);
    bool oneHost = true;
    for (int h : hostOf) oneHost &= h == hostOf[0];
    facts.nranks = n;
    facts.allLocal = oneHost && n > 1;
    facts.llMaxBytes = facts.allLocal ? 64 << 10 : 0;
    facts.onePassOn = facts.allLocal;
    facts.onePassReach = facts.allLocal;
    facts.oneProcess = false;
    facts.singleCopy = true;
    facts.directMaxBytes = size_t(1) << 30;
    facts.rdMaxBytes = 64 << 10;
    facts.filter = &filter;
    facts.machine = &planner->machine();
    if (model)
      facts.plan = [this](const CollArgs& a, size_t es,
                          const AlgoFilter& f) -> Result<std::shared_ptr<const Plan>> {
        LOOM_ASSIGN(Plan p, planner->choose(a, es, f));
        return std::make_shared<const Plan>(std::move(p));
      };
  }

  Decision decide(const CallShape& c) const {
    Result<Decision> d = dispatch(c, facts);
    EXPECT_TRUE(d.isOk()) << d.status().message();
    return d.isOk() ? d.value() : Decision();
  }
};

CallShape call(CollKind coll, size_t count, loomDataType_t dt = loomFloat32) {
  CallShape c;
  c.coll = coll;
  c.count = count;
  c.dtype = dt;
  return c;
}

// What every rank must agree on.
void expectSame(const Decision& a, const Decision& b, const std::string& what) {
  EXPECT_EQ(a.path, b.path) << what;
  EXPECT_EQ(a.algorithm, b.algorithm) << what;
  EXPECT_EQ(a.onePassLimitSec, b.onePassLimitSec) << what;
}

const std::vector<size_t> kCounts = {
    1, 1000, 16384, 16385, 100000, size_t(1) << 20, size_t(1) << 24};

TEST(Dispatch, SmallCallsOfOneHostTakeTheLowLatencyExchange) {
  World w({0, 0, 0, 0});
  Decision d = w.decide(call(CollKind::kAllReduce, 1000));
  EXPECT_EQ(d.path, Path::kLowLatency);
  EXPECT_EQ(d.algorithm, "");  // no schedule computed for a call that takes the exchange
  // 64 KiB per rank is the bound (the root's size decides for a Broadcast).
  EXPECT_EQ(w.decide(call(CollKind::kBroadcast, 16384)).path, Path::kLowLatency);
  EXPECT_NE(w.decide(call(CollKind::kBroadcast, 16385)).path, Path::kLowLatency);
  // AllGather publishes its input: 4 ranks x 16 Ki floats is still within.
  EXPECT_EQ(w.decide(call(CollKind::kAllGather, 16384)).path, Path::kLowLatency);
  // ReduceScatter publishes its whole input (count x ranks).
  EXPECT_NE(w.decide(call(CollKind::kReduceScatter, 16384)).path, Path::kLowLatency);
  // Not for empty calls, point-to-point, or one of several calls of a group.
  EXPECT_NE(w.decide(call(CollKind::kAllReduce, 0)).path, Path::kLowLatency);
  CallShape p2p = call(CollKind::kSendRecv, 10);
  Decision dp = w.decide(p2p);
  EXPECT_EQ(dp.path, Path::kSchedule);
  EXPECT_EQ(dp.algorithm, "p2p");
  CallShape g = call(CollKind::kAllReduce, 1000);
  g.grouped = true;
  Decision dg = w.decide(g);
  EXPECT_EQ(dg.path, Path::kSchedule);
  EXPECT_FALSE(dg.algorithm.empty());
  // Without shared memory among all ranks: never.
  World two({0, 0, 1, 1});
  EXPECT_EQ(two.decide(call(CollKind::kAllReduce, 8)).path, Path::kSchedule);
}

TEST(Dispatch, ExplainPricesTheScheduleBehindTheExchange) {
  World w({0, 0, 0});
  w.facts.explain = true;
  Decision d = w.decide(call(CollKind::kAllReduce, 100));
  EXPECT_EQ(d.path, Path::kLowLatency);
  EXPECT_FALSE(d.algorithm.empty());
  ASSERT_TRUE(d.plan);
  EXPECT_GE(d.scheduleSec, 0);
  ASSERT_EQ(d.offers.size(), 3u);
  EXPECT_TRUE(d.offers[0].eligible);
  EXPECT_TRUE(d.offers[2].eligible);  // the schedule always offers
  EXPECT_NE(describeDecision(d).find("low-latency"), std::string::npos) << describeDecision(d);
}

// A Broadcast or Reduce is in place on its root only: the root and the others must decide alike.
TEST(Dispatch, BroadcastRootInPlaceDecidesAsTheOtherRanks) {
  for (auto hosts : {std::vector<int>{0, 0, 0, 0}, std::vector<int>{0, 0, 1, 1}}) {
    World w(hosts);
    for (CollKind coll : {CollKind::kBroadcast, CollKind::kReduce})
      for (size_t count : kCounts) {
        CallShape root = call(coll, count), other = call(coll, count);
        root.inPlace = true;
        expectSame(w.decide(root), w.decide(other),
                   std::string(collName(coll)) + " " + std::to_string(count));
      }
  }
}

// A rank alone on its host has no shared memory (no low-latency exchange, no one pass, its own
// facts differ from its peers'); its peers share a host among themselves. Every rank must still
// reach the same decision.
TEST(Dispatch, RankAloneOnItsHostDecidesAsItsPeers) {
  World peers({0, 0, 0, 1});  // what ranks 0-2 see: a host of 3, with the exchange and probes
  World alone({0, 0, 0, 1});  // what rank 3 sees: nothing local
  peers.facts.llMaxBytes = 64 << 10;
  peers.facts.onePassOn = true;
  peers.facts.onePassReach = true;
  peers.facts.oneProcess = true;
  alone.facts.llMaxBytes = 0;
  alone.facts.onePassOn = false;
  alone.facts.onePassReach = false;
  for (CollKind coll : kCollectives)
    for (size_t count : kCounts) {
      std::string what = std::string(collName(coll)) + " " + std::to_string(count);
      Decision a = peers.decide(call(coll, count)), b = alone.decide(call(coll, count));
      expectSame(a, b, what);
      EXPECT_EQ(a.path, Path::kSchedule) << what;
    }
}

// Peers' plain buffers through process_vm_readv/writev: the share of the traffic that is the
// peers' ((n-1)/n) moves at the slowdown measured at init, more ranks contend for the pinned pages.
TEST(Dispatch, OnePassThroughSystemCallsIsPricedAtTheMeasuredSlowdown) {
  CostMachine m;
  m.memBytesPerSec = 1e10;
  m.intra.alphaSec = 0;
  const CallShape ar = call(CollKind::kAllReduce, 1 << 22);
  const double plain2 = onePassSeconds(m, ar, 2, false);
  ASSERT_GT(plain2, 0);
  m.cmaSlowdown = 5;
  EXPECT_NEAR(onePassSeconds(m, ar, 2, true) / plain2, 3.0, 1e-9);  // half the traffic 5x slower
  m.cmaSlowdown = 1;
  EXPECT_NEAR(onePassSeconds(m, ar, 2, true) / plain2, 1.0, 1e-9);
  EXPECT_NEAR(onePassSeconds(m, ar, 4, true) / onePassSeconds(m, ar, 4, false), 1 + 0.69 * 2, 1e-9);
  m.cmaSlowdown = 0;  // not measured: the calibration of a 2-core Xeon VM (1.6 at 2 ranks)
  EXPECT_NEAR(onePassSeconds(m, ar, 2, true) / plain2, 1.6, 1e-9);
}

TEST(Dispatch, OnePassWhereThePlannerChoseDirectOrItIsCheaper) {
  World w({0, 0, 0, 0});
  for (CollKind coll : kCollectives)
    for (size_t count : {size_t(100000), size_t(1) << 20, size_t(1) << 24}) {
      std::string what = std::string(collName(coll)) + " " + std::to_string(count);
      Decision d = w.decide(call(coll, count));
      ASSERT_FALSE(d.algorithm.empty()) << what;
      const double one = onePassSeconds(w.planner->machine(), call(coll, count), 4, false);
      const bool expectOnePass = d.algorithm == "direct" || (one >= 0 && one < d.scheduleSec);
      EXPECT_EQ(d.path == Path::kOnePass, expectOnePass) << what << ": " << describeDecision(d);
      if (d.path != Path::kOnePass) continue;
      // The fallback is the schedule, and the one pass runs only below its price where it must
      // reach buffers with process_vm_readv/writev.
      EXPECT_EQ(d.onePassLimitSec, d.scheduleSec) << what;
      EXPECT_GT(d.onePassPlainSec, one) << what;  // system calls cost more than a mapping
      EXPECT_EQ(d.onePassPlain, d.onePassPlainSec < d.onePassLimitSec) << what;
    }
  // An AllToAll in place never (its blocks would be overwritten before their owner sent them).
  CallShape a2a = call(CollKind::kAllToAll, 1 << 20);
  a2a.inPlace = true;
  EXPECT_NE(w.decide(a2a).path, Path::kOnePass);
}

TEST(Dispatch, OnePassFallsBackWhereItCannotRun) {
  World w({0, 0, 0, 0}, "^direct");  // the model cannot pick direct, so only "cheaper" counts
  CallShape c = call(CollKind::kAllReduce, 1 << 20);
  // The filter excludes direct: no one pass.
  EXPECT_NE(w.decide(c).path, Path::kOnePass);
  World open({0, 0, 0, 0}, "allreduce:ring");  // ring is dearer than one pass on one host
  Decision d = open.decide(c);
  EXPECT_EQ(d.algorithm, "ring");
  EXPECT_STREQ(d.source, "filter");
  EXPECT_EQ(d.path, Path::kSchedule) << describeDecision(d);  // the filter excludes direct too
  World allowed({0, 0, 0, 0}, "allreduce:ring,direct");
  allowed.facts.plan = [&](const CollArgs& a, size_t es,
                           const AlgoFilter&) -> Result<std::shared_ptr<const Plan>> {
    // The planner as if it had chosen ring (a tuning entry, say, priced by the model).
    LOOM_ASSIGN(Plan p, allowed.planner->choose(a, es, filterOf("allreduce:ring")));
    return std::make_shared<const Plan>(std::move(p));
  };
  Decision cheaper = allowed.decide(c);
  EXPECT_EQ(cheaper.algorithm, "ring");
  EXPECT_EQ(cheaper.path, Path::kOnePass) << describeDecision(cheaper);
  EXPECT_EQ(cheaper.onePassLimitSec, cheaper.scheduleSec);
  // Some process cannot reach another's buffers: only a planned direct tries (and falls back).
  allowed.facts.onePassReach = false;
  EXPECT_EQ(allowed.decide(c).path, Path::kSchedule);
  // LOOM_SHM_MAPPED=0, or single copy off.
  allowed.facts.onePassReach = true;
  allowed.facts.singleCopy = false;
  EXPECT_EQ(allowed.decide(c).path, Path::kSchedule);
  allowed.facts.singleCopy = true;
  allowed.facts.onePassOn = false;
  EXPECT_EQ(allowed.decide(c).path, Path::kSchedule);
}

TEST(Dispatch, MemoryKindsThatNoPathTakesAreRefused) {
  World w({0, 0, 0, 0});
  CallShape host = call(CollKind::kAllReduce, 1 << 20), shared = host, dev = host;
  shared.sendKind = MemKind::kHostShared;
  shared.recvKind = MemKind::kHostShared;
  // loomMemAlloc buffers on one rank and plain ones on another: the same decision.
  expectSame(w.decide(host), w.decide(shared), "host vs loomMemAlloc");
  dev.recvKind = MemKind::kCudaDevice;
  Result<Decision> d = dispatch(dev, w.facts);
  ASSERT_FALSE(d.isOk());
  EXPECT_EQ(d.status().code(), Code::kInvalidArgument);
  EXPECT_NE(d.status().message().find("CUDA device"), std::string::npos) << d.status().message();
  // Small device calls are refused too (the exchange copies with the CPU).
  dev.count = 16;
  EXPECT_FALSE(dispatch(dev, w.facts).isOk());
  for (Path p : {Path::kLowLatency, Path::kOnePass}) {
    EXPECT_TRUE(accepts(pathAccepts(p), MemKind::kHost)) << pathName(p);
    EXPECT_TRUE(accepts(pathAccepts(p), MemKind::kHostShared)) << pathName(p);
    EXPECT_FALSE(accepts(pathAccepts(p), MemKind::kCudaDevice)) << pathName(p);
  }
  // Where the transports and the executor take device memory (the CUDA build), the schedule path
  // takes it and the host-only paths step aside, even for a small call.
  w.facts.scheduleKinds = kHostKinds | memKindBit(MemKind::kCudaDevice);
  Result<Decision> small = dispatch(dev, w.facts);
  ASSERT_TRUE(small.isOk()) << small.status().message();
  EXPECT_EQ(small.value().path, Path::kSchedule);
  EXPECT_FALSE(lowLatencyTakes(dev, w.facts));
  dev.count = 1 << 20;
  Result<Decision> large = dispatch(dev, w.facts);
  ASSERT_TRUE(large.isOk());
  EXPECT_EQ(large.value().path, Path::kSchedule);
}

TEST(Dispatch, SourcesModelFilterTuningAndRule) {
  World model({0, 0, 1, 1});
  Decision d = model.decide(call(CollKind::kAllReduce, 1 << 20));
  EXPECT_STREQ(d.source, "model");
  EXPECT_EQ(d.path, Path::kSchedule);
  EXPECT_GE(d.predictedSec, 0);
  EXPECT_EQ(d.predictedSec, d.scheduleSec);

  World forced({0, 0, 1, 1}, "allreduce:tree");
  EXPECT_EQ(forced.decide(call(CollKind::kAllReduce, 1 << 20)).algorithm, "tree");
  EXPECT_STREQ(forced.decide(call(CollKind::kAllReduce, 1 << 20)).source, "filter");
  // Not restricted by it: the model.
  EXPECT_STREQ(forced.decide(call(CollKind::kBroadcast, 1 << 20)).source, "model");

  World tuned({0, 0, 1, 1});
  TuningEntry t;
  t.coll = CollKind::kAllReduce;
  t.minBytes = 0;
  t.maxBytes = size_t(1) << 40;
  t.algorithm = "rhd";
  tuned.planner->setTuning({t});
  Decision dt = tuned.decide(call(CollKind::kAllReduce, 1 << 20));
  EXPECT_EQ(dt.algorithm, "rhd");
  EXPECT_STREQ(dt.source, "tuning");

  // LOOM_PLANNER=0: the fixed rule (direct on one host up to LOOM_SHM_DIRECT_MAX, rd for small
  // AllReduces elsewhere, else the first registered), filtered.
  World rule({0, 0, 1, 1}, "", /*model=*/false);
  Decision dr = rule.decide(call(CollKind::kAllReduce, 100));
  EXPECT_EQ(dr.algorithm, "rd");
  EXPECT_STREQ(dr.source, "rule");
  EXPECT_LT(dr.predictedSec, 0);
  EXPECT_EQ(rule.decide(call(CollKind::kAllReduce, 1 << 20)).algorithm, "ring");
  World ruleLocal({0, 0, 0}, "", /*model=*/false);
  ruleLocal.facts.directMaxBytes = 1 << 20;
  Decision dl = ruleLocal.decide(call(CollKind::kAllGather, 1 << 18));
  EXPECT_EQ(dl.algorithm, "direct");
  EXPECT_EQ(dl.path, Path::kOnePass);  // the messageless form of direct, unpriced: no limit
  EXPECT_LT(dl.onePassLimitSec, 0);
  EXPECT_TRUE(dl.onePassPlain);
  EXPECT_EQ(ruleLocal.decide(call(CollKind::kAllGather, 1 << 19)).algorithm, "ring");
}

TEST(Dispatch, AnExclusionLeavesTheOtherAlgorithms) {
  World w({0, 0, 1, 1}, "^pairwise");  // AllToAll keeps bruck
  EXPECT_EQ(w.decide(call(CollKind::kAllToAll, 100, loomInt32)).algorithm, "bruck");
}

TEST(Dispatch, PathNames) {
  EXPECT_STREQ(pathName(Path::kLowLatency), "low-latency");
  EXPECT_STREQ(pathName(Path::kOnePass), "one-pass");
  EXPECT_STREQ(pathName(Path::kSchedule), "schedule");
}

}  // namespace
}  // namespace loom
