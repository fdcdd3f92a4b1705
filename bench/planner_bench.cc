// The planner's choice at scale: Planner::choose for one call on communicators of 64 to 16,384
// ranks (8 per host, a GPU cluster's machine as loom-sim builds it), every registered algorithm of
// the collective priced. Above kSimulatedRanks the planner prices with the closed forms; at 64 it
// simulates every piece (the contrast is the point).
//   build/bench/loom-planner-bench --benchmark_filter=AllReduce
#include <benchmark/benchmark.h>

#include "algorithms/cluster.h"
#include "algorithms/planner.h"

namespace {

void choose(benchmark::State& state, loom::CollKind coll) {
  const int nodes = static_cast<int>(state.range(0)) / 8;
  loom::ClusterSpec c;
  c.node = loom::builtinNode("dgx-h100").value();
  c.nodes = nodes;
  c.fabric.tiers = 3;
  std::vector<int> hostOf;
  for (int r = 0; r < c.nranks(); ++r) hostOf.push_back(r / 8);
  loom::Planner planner(loom::clusterCostMachine(c, loom::TrafficPattern::kNeighbor),
                        loom::RankLayout::create(hostOf).value(), 512 << 10);
  loom::CollArgs args;
  args.coll = coll;
  args.nranks = c.nranks();
  args.count = static_cast<size_t>(state.range(1)) / 4;
  for (auto _ : state) {
    loom::Result<loom::Plan> plan = planner.choose(args, 4, loom::AlgoFilter());
    if (!plan.isOk()) state.SkipWithError(plan.status().message().c_str());
    benchmark::DoNotOptimize(plan);
  }
  state.SetLabel(std::to_string(c.nranks()) + " ranks");
}

void AllReduce(benchmark::State& s) { choose(s, loom::CollKind::kAllReduce); }
void AllGather(benchmark::State& s) { choose(s, loom::CollKind::kAllGather); }
void Broadcast(benchmark::State& s) { choose(s, loom::CollKind::kBroadcast); }

}  // namespace

BENCHMARK(AllReduce)
    ->ArgsProduct({{64, 128, 1024, 4096, 16384}, {1024, 64 << 20}})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(AllGather)->ArgsProduct({{4096}, {1024, 64 << 20}})->Unit(benchmark::kMillisecond);
BENCHMARK(Broadcast)->ArgsProduct({{4096}, {1024, 64 << 20}})->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
