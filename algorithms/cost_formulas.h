// Closed-form prices of the registered algorithms, for communicators too large to simulate: the
// cost model (cost_model.h) simulates every piece of every rank, which is exact to the schedule but
// grows with ranks x steps (a ring AllReduce of 4,096 ranks has 33 million pieces). These formulas
// price the same schedules on the same machine from their structure: steps, bytes per step, which
// steps cross hosts, and the resources they share (a host's NIC among its ranks' inter-host flows,
// a rank's memory among its intra-host transfers, copies and reductions), with the executor's
// pieces (alpha per piece, pieces of a step pipelined). They hold for layouts whose hosts all
// carry the same number of ranks, in the default ring order; tests compare them with the
// simulation wherever both run.
//
// What they approximate: pipelining between steps (a step starts when the previous one ends,
// except along rings and chains, which run at their slowest link), the placement of tree edges
// (a fixed share of them cross hosts), and Bruck's and the hierarchical algorithms' local copies.
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <string>

#include "algorithms/cost_model.h"
#include "algorithms/schedule.h"
#include "src/core/status.h"

namespace loom {

// Whether the formulas apply: args.layout (or the single host a null layout means) has hosts of
// equal size with consecutive ranks in the default ring order, and machine.hostOf agrees with it.
bool costFormulasApply(const CollArgs& args, const CostMachine& machine);

// The predicted seconds of `algorithm` for args on machine, elemSize bytes per element, the
// executor's pieces of pieceBytes (0: steps are not split). Errors: an unknown algorithm or one
// the formulas do not cover, a layout costFormulasApply rejects.
Result<double> formulaCost(const std::string& algorithm, const CollArgs& args,
                           const CostMachine& machine, size_t elemSize, size_t pieceBytes);

}  // namespace loom
