#include "algorithms/planner.h"

#include <algorithm>

#include "algorithms/cost_formulas.h"

namespace loom {

namespace {

// Bytes one rank contributes or receives, the size tuning entries and logs speak of (nccl-tests'
// "size" column: the whole buffer for AllGather / ReduceScatter / AllToAll).
size_t callBytes(const CollArgs& a, size_t elemSize) {
  return collCallCount(a.coll, a.count, a.nranks) * elemSize;
}

// At most this many pieces per step are simulated: beyond it pipelining changes the prediction
// little and pricing time grows with the piece count.
constexpr size_t kMaxPricedPiecesPerStep = 32;

}  // namespace

namespace {

// An uneven layout too large to simulate, priced on its envelope: as many hosts, each holding as
// many ranks as its largest, consecutive, the machine's rates those of host 0.
Result<double> envelopeCost(const AlgorithmInfo& algorithm, const CollArgs& args,
                            const CostMachine& machine, size_t elemSize, size_t piece) {
  std::shared_ptr<const RankLayout> layout = effectiveLayout(args);
  const int hosts = layout->nhosts(), per = layout->maxLocal();
  std::vector<int> hostOf;
  for (int r = 0; r < hosts * per; ++r) hostOf.push_back(r / per);
  CollArgs env = args;
  env.nranks = hosts * per;
  LOOM_ASSIGN(env.layout, RankLayout::create(hostOf, {}, layout->channels()));
  CostMachine m = machine;
  m.hostOf = hostOf;
  m.hostMemBytesPerSec.assign(static_cast<size_t>(hosts), machine.hostMemBytesPerSec.empty()
                                                              ? 0
                                                              : machine.hostMemBytesPerSec[0]);
  m.hostRankMemBytesPerSec.assign(
      static_cast<size_t>(hosts),
      machine.hostRankMemBytesPerSec.empty() ? 0 : machine.hostRankMemBytesPerSec[0]);
  return formulaCost(algorithm.name, env, m, elemSize, piece);
}

}  // namespace

Result<double> priceAlgorithm(const AlgorithmInfo& algorithm, const CollArgs& args,
                              const CostMachine& machine, size_t elemSize, size_t pieceBytes,
                              bool* formulas) {
  const size_t piece = std::max(pieceBytes, callBytes(args, elemSize) / kMaxPricedPiecesPerStep);
  const bool closed = args.nranks > kSimulatedRanks;
  if (formulas) *formulas = closed;
  if (closed)
    return costFormulasApply(args, machine)
               ? formulaCost(algorithm.name, args, machine, elemSize, piece)
               : envelopeCost(algorithm, args, machine, elemSize, piece);
  Schedule s = buildSchedule(algorithm, args);
  LOOM_ASSIGN(CostEstimate e, estimateCost(s, machine, elemSize, piece));
  return e.seconds;
}

Planner::Planner(CostMachine machine, std::shared_ptr<const RankLayout> layout, size_t pieceBytes)
    : machine_(std::move(machine)), layout_(std::move(layout)), pieceBytes_(pieceBytes) {}

Result<Plan> Planner::choose(CollArgs args, size_t elemSize, const AlgoFilter& filter) const {
  args.layout = layout_;
  Plan plan;
  const size_t bytes = callBytes(args, elemSize);
  double best = -1;
  for (const AlgorithmInfo& a : algorithms()) {
    if (a.coll != args.coll) continue;
    PlanCandidate c;
    c.algorithm = a.name;
    c.allowed = filter.allows(args.coll, a.name);
    c.seconds = -1;
    if (c.allowed) {
      bool formulas = false;
      Result<double> p = priceAlgorithm(a, args, machine_, elemSize, pieceBytes_, &formulas);
      if (p.isOk()) c.seconds = p.value();
      if (formulas) plan.pricing = "formulas";
      if (c.seconds >= 0 && (best < 0 || c.seconds < best)) {
        best = c.seconds;
        plan.algorithm = c.algorithm;
        plan.predictedSec = c.seconds;
      }
    }
    plan.candidates.push_back(std::move(c));
  }
  if (plan.candidates.empty())
    return LOOM_ERROR(kInternal, "no algorithm is registered for {}", collName(args.coll));
  int allowed = 0;
  for (const PlanCandidate& c : plan.candidates) allowed += c.allowed ? 1 : 0;
  if (allowed == 1) plan.source = "filter";
  if (plan.algorithm.empty()) {
    // Nothing allowed could be priced: the filter's own choice (or its error naming the valid
    // algorithms).
    LOOM_ASSIGN(plan.algorithm, filter.choose(args.coll, plan.candidates.front().algorithm));
    plan.predictedSec = -1;
  }
  for (const TuningEntry& t : tuning_) {
    if (t.coll != args.coll || bytes < t.minBytes || bytes > t.maxBytes) continue;
    if (!filter.allows(args.coll, t.algorithm) || !findAlgorithm(args.coll, t.algorithm)) continue;
    plan.algorithm = t.algorithm;
    plan.source = "tuning";
    for (const PlanCandidate& c : plan.candidates)
      if (c.algorithm == t.algorithm) plan.predictedSec = c.seconds;
    break;
  }
  return plan;
}

}  // namespace loom
