// The planner: for one collective call (kind, count, datatype size, root, placement) on one
// machine, it prices every registered algorithm that LOOM_ALGO allows with the cost model and
// picks the cheapest; measured tuning entries, where they cover the call, win over the model.
// Every rank must derive the same choice: the inputs are the exchanged topology and rank 0's
// measured kernel speeds (never a rank's own clock), the candidates are tried in registry order,
// and a tie keeps the earlier one. A rank that disagreed anyway would fail on the operation's
// message tag (the algorithm is part of it) instead of hanging.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/algo_filter.h"
#include "algorithms/cost_model.h"
#include "algorithms/schedule.h"
#include "src/core/status.h"

namespace loom {

struct PlanCandidate {
  std::string algorithm;
  double seconds = 0;   // predicted (model) or measured (tuning); < 0: could not be priced
  bool allowed = true;  // by LOOM_ALGO
};

struct Plan {
  std::string algorithm;
  double predictedSec = 0;  // the model's prediction for the chosen algorithm
  // "model"; "filter" when the algorithm filter left the collective only this algorithm; "tuning"
  // when a measured entry decided.
  const char* source = "model";
  // How the model priced the candidates: "simulation" (every piece of every rank, cost_model.h)
  // or "formulas" (closed forms, cost_formulas.h, above kSimulatedRanks ranks).
  const char* pricing = "simulation";
  std::vector<PlanCandidate> candidates;  // every registered algorithm of the collective
};

// A measured choice: on this layout, calls of coll with bytes in [minBytes, maxBytes] run
// `algorithm` (measured microseconds, for the record).
struct TuningEntry {
  CollKind coll = CollKind::kAllReduce;
  size_t minBytes = 0, maxBytes = 0;
  std::string algorithm;
  double measuredUs = 0;
};

// Communicators of more ranks than this are priced with the closed forms: simulating every piece
// grows with ranks x steps.
inline constexpr int kSimulatedRanks = 64;

// The model's price of one algorithm for args on machine (seconds): above kSimulatedRanks ranks
// the closed forms (on the layout's envelope, hosts of its largest host's size, where hosts are
// uneven), the simulation otherwise; *formulas says which.
// pieceBytes: the executor's (large calls are priced in at most 32 pieces per step). Errors: the
// algorithm cannot be priced for this call.
Result<double> priceAlgorithm(const AlgorithmInfo& algorithm, const CollArgs& args,
                              const CostMachine& machine, size_t elemSize, size_t pieceBytes,
                              bool* formulas = nullptr);

class Planner {
 public:
  // machine: where schedules are priced; layout (may be null): handed to the generators;
  // pieceBytes: the executor's chunk size (LOOM_CHUNK_SIZE).
  Planner(CostMachine machine, std::shared_ptr<const RankLayout> layout, size_t pieceBytes);

  // Replaces the tuning entries (already checked to be for this layout).
  void setTuning(std::vector<TuningEntry> entries) { tuning_ = std::move(entries); }

  // The plan for one call. args.layout is set by the planner. Errors: the filter leaves no
  // algorithm, or none of the allowed ones could be priced.
  Result<Plan> choose(CollArgs args, size_t elemSize, const AlgoFilter& filter) const;

  const CostMachine& machine() const { return machine_; }
  const std::shared_ptr<const RankLayout>& layout() const { return layout_; }

 private:
  CostMachine machine_;
  std::shared_ptr<const RankLayout> layout_;
  size_t pieceBytes_;
  std::vector<TuningEntry> tuning_;
};

}  // namespace loom
